//! Live topology (ADR-0049): every endpoint is polled; endpoints are grouped by broker node ID
//! into logical nodes; a logical node's target is whichever endpoint is active *now*. Liveness
//! comes from the poll (the endpoint answers and is active) and `listNetworkTopology`, never
//! from configuration alone.
//!
//! Between polls, a node's liveness also follows the per-node budget's judgement
//! (`broker::budget::Health`): a node whose calls go unanswered is not live within seconds,
//! not at the next poll, and live again as soon as it answers anything.

pub mod access;
pub mod answers;
pub mod by_change;
pub mod divert_watch;
pub mod inventory;
pub mod queue_map;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use imbl::OrdMap;
use imbl::ordmap::DiffItem;
use tokio::sync::Mutex;

use crate::broker::error::NotAnswering;
use crate::broker::{BrokerError, BrokerManagement, Credentials, JolokiaClient, NodeIdentity};

/// How long a poll waits for a node judged not answering: a node that came back answers its
/// probe in milliseconds; one that did not is not waited on — its probe stays on the wire and
/// clears the judgement when the node answers, and the next poll finds it live.
pub const PROBE_GRACE: Duration = Duration::from_secs(1);

/// How to reach one cluster's endpoints.
#[derive(Clone, Debug)]
pub struct ClusterAccess {
    pub http: crate::broker::jolokia::HttpClient,
    pub endpoints: Vec<String>,
    pub origin: Option<String>,
    pub credentials: Credentials,
    pub request_timeout: Duration,
    /// A poll's reads of one node (identity, inventory).
    pub poll_timeout: Duration,
    /// The Secrets this access was read from (name → resourceVersion): a command compares them
    /// with the Secrets as they are now and never sends with credentials or trust roots the
    /// Secret no longer holds.
    pub secret_versions: BTreeMap<String, String>,
    /// The CA `spec.tls` names (PEM), when it names one: the capture drains' AMQPS trusts it
    /// alone, as the Jolokia client does.
    pub ca: Option<Arc<Vec<u8>>>,
    /// How long a node's inventory may stand on its counts alone (`spec.fullReadIntervalSeconds`,
    /// issue 45): a full read at least this often.
    pub full_read_interval: Duration,
}

/// One logical node: a broker node ID, with its endpoints.
#[derive(Clone, Debug, Default)]
pub struct LogicalNode {
    pub node_id: String,
    /// The endpoint commands go to now; None when no endpoint of this node is active.
    pub active: Option<BrokerManagement>,
    /// Endpoints of this node that answered but are not active (a replicating backup).
    pub standby: Vec<String>,
    /// The active endpoint is configured as a backup (the pair failed over).
    pub failed_over: bool,
    /// Why the node is not live, when it is not.
    pub not_live_reason: Option<String>,
    /// What the active endpoint held at the poll (None when not live or the scrape failed).
    pub inventory: Option<Arc<inventory::NodeInventory>>,
    /// Why the scrape failed, when it did.
    pub inventory_error: Option<BrokerError>,
    /// Came back at the last poll and is being sent what it missed (issue 41): published not
    /// live until that is on it (`Topology::catching_up`).
    pub catching_up: bool,
}

impl LogicalNode {
    /// An endpoint is active and answers: the poll found it active, and the budget has not
    /// judged it not answering since (evaluated now, not at the poll).
    pub fn is_live(&self) -> bool {
        self.active.is_some() && self.not_answering().is_none()
    }
    /// The active endpoint's node is judged not answering now: the evidence.
    pub fn not_answering(&self) -> Option<NotAnswering> {
        self.active.as_ref()?.client().not_answering()
    }
    pub fn active_endpoint(&self) -> Option<&str> {
        self.active.as_ref().map(|m| m.client().url())
    }
    pub fn role(&self) -> &'static str {
        match (&self.active, self.failed_over) {
            (None, _) => "unknown",
            (Some(_), false) => "primary",
            (Some(_), true) => "backup",
        }
    }
}

/// The polled state of one cluster.
#[derive(Clone, Debug)]
pub struct Topology {
    pub polled_at: Instant,
    pub polled_at_utc: chrono::DateTime<chrono::Utc>,
    /// Sorted by node ID.
    pub nodes: Vec<LogicalNode>,
    /// Endpoints that did not answer, with the error.
    pub unreachable: Vec<(String, BrokerError)>,
    /// Fresh reads laid over this snapshot since its poll (when, node ID, what was read): a
    /// poll that started before one of them carries it over instead of forgetting it. A
    /// persistent vector (issue 45): every command clones the snapshot, and in a burst this
    /// holds thousands of reads between two polls — a clone must not copy them.
    pub fresh_reads: FreshReads,
    /// The Secrets the access this snapshot was polled with was read from (name →
    /// resourceVersion): its nodes' clients write with those credentials and trust roots, so a
    /// command compares these, not the runtime's, with the Secrets as they are now.
    pub secret_versions: BTreeMap<String, String>,
}

/// The fresh reads a snapshot carries (when, node ID, what was read).
pub type FreshReads = imbl::Vector<(Instant, String, Arc<inventory::NodeInventory>)>;

impl Topology {
    pub fn live_nodes(&self) -> impl Iterator<Item = &LogicalNode> {
        self.nodes.iter().filter(|n| n.is_live())
    }
    pub fn age(&self) -> Duration {
        self.polled_at.elapsed()
    }
    /// The same snapshot with only these logical nodes (the ones a command writes to).
    pub fn restricted_to(&self, node_ids: &std::collections::BTreeSet<String>) -> Topology {
        Topology {
            nodes: self
                .nodes
                .iter()
                .filter(|n| node_ids.contains(&n.node_id))
                .cloned()
                .collect(),
            ..self.clone()
        }
    }

    /// The same snapshot with newer scoped reads laid over nodes' inventories (by node ID).
    pub fn overlaid(&self, reads: &BTreeMap<String, Arc<inventory::NodeInventory>>) -> Topology {
        let mut t = self.clone();
        let now = Instant::now();
        t.lay(reads.iter().map(|(node, inv)| (now, node.clone(), inv.clone())));
        t
    }

    fn lay(&mut self, reads: impl IntoIterator<Item = (Instant, String, Arc<inventory::NodeInventory>)>) {
        for (at, node, fresh) in reads {
            if let Some(n) = self.nodes.iter_mut().find(|n| n.node_id == node)
                && let Some(inv) = &n.inventory
            {
                let mut merged = (**inv).clone();
                merged.overlay(&fresh);
                n.inventory = Some(Arc::new(merged));
                self.fresh_reads.push_back((at, node, fresh));
            }
        }
    }

    /// This new poll (started at `started`) with the fresh reads the previous snapshot got
    /// after that moment laid over it: they are newer than what the poll read.
    pub fn carrying_reads(mut self, previous: Option<&Topology>, started: Instant) -> Topology {
        if let Some(p) = previous {
            let newer: Vec<_> = p
                .fresh_reads
                .iter()
                .filter(|(at, _, _)| *at > started)
                .cloned()
                .collect();
            self.lay(newer);
        }
        self
    }

    /// A live node whose inventory this poll could not read keeps the one read before (same node,
    /// same endpoint), with `inventory_error` saying it is stale: a timed-out scrape never turns
    /// objects that were Ready into not-Ready (issue 23).
    pub fn keeping_stale_inventories(mut self, previous: Option<&Topology>) -> Topology {
        let Some(p) = previous else { return self };
        for n in self
            .nodes
            .iter_mut()
            .filter(|n| n.is_live() && n.inventory.is_none())
        {
            if let Some(old) = p
                .nodes
                .iter()
                .find(|o| o.node_id == n.node_id && o.active_endpoint() == n.active_endpoint())
            {
                n.inventory = old.inventory.clone();
            }
        }
        self
    }

    /// This snapshot with the nodes that came back (`returned`) not live yet: they are being
    /// sent what they missed (issue 41), and no pass plans for them before it is on them.
    pub fn catching_up(&self, returned: &[String]) -> Topology {
        let mut t = self.clone();
        for n in t.nodes.iter_mut().filter(|n| returned.contains(&n.node_id)) {
            n.active = None;
            n.inventory = None;
            n.not_live_reason = Some(CATCHING_UP.to_string());
            n.catching_up = true;
        }
        t
    }

    /// This snapshot with the nodes of `caught_up` (as polled, with what was sent to them since
    /// laid over their inventories) live again.
    pub fn caught_up(&self, caught_up: &[LogicalNode]) -> Topology {
        let mut t = self.clone();
        for n in t.nodes.iter_mut() {
            if let Some(c) = caught_up.iter().find(|c| c.node_id == n.node_id) {
                *n = c.clone();
            }
        }
        t
    }

    /// A node by node ID, or by one of its endpoint URLs.
    pub fn find(&self, node: &str) -> Option<&LogicalNode> {
        self.nodes.iter().find(|n| {
            n.node_id == node || n.active_endpoint() == Some(node) || n.standby.iter().any(|s| s == node)
        })
    }
}

/// Why a node that came back is not live yet.
pub const CATCHING_UP: &str = "answering again since the last poll: what it missed is being sent to it in bulk, and it is live once that is on it";

/// Per-cluster memory across polls: broker names (resolved once per endpoint) and the node ID
/// each endpoint last reported, so a node that stops answering is still named as not live.
#[derive(Default, Debug)]
pub struct TopologyMemory {
    broker_names: HashMap<String, String>,
    last_node_of: HashMap<String, String>,
    /// Silences the budget had judged of each endpoint at the last look.
    silences_seen: HashMap<String, u64>,
    /// When each endpoint was last read in full (issue 45: between full reads, by change).
    full_reads: HashMap<String, Instant>,
    /// The page of queues each endpoint's next poll by change reads.
    next_pages: HashMap<String, u64>,
}

impl TopologyMemory {
    /// The endpoints judged not answering since the last look (the counts are remembered). A
    /// silence that came and went between two polls leaves no trace in either topology, yet
    /// objects were skipped on that node meanwhile: they need a pass, and the node what it missed.
    pub fn silenced_since_last_look(&mut self, access: &ClusterAccess) -> Vec<String> {
        access
            .endpoints
            .iter()
            .filter(|url| {
                let now = access.http.registry().budget_for(url).silences();
                let before = self.silences_seen.insert(url.to_string(), now);
                before.is_some_and(|b| b < now)
            })
            .cloned()
            .collect()
    }
}

/// Poll every endpoint concurrently and group the answers into logical nodes. The poll's reads
/// are the budget's probes: a node judged not answering is asked once (when nothing else is on
/// the wire) and waited on for [`PROBE_GRACE`] at most. Every node is read in full.
pub async fn poll(access: &ClusterAccess, memory: &Mutex<TopologyMemory>) -> Topology {
    poll_since(access, memory, None).await
}

/// A poll after `previous` (the cluster's last snapshot, writes laid over it): a node whose
/// counts show nothing changed since is not read in full ([`by_change`]).
pub async fn poll_since(
    access: &ClusterAccess,
    memory: &Mutex<TopologyMemory>,
    previous: Option<&Topology>,
) -> Topology {
    let (known, full_reads, pages) = {
        let mem = memory.lock().await;
        (
            mem.broker_names.clone(),
            mem.full_reads.clone(),
            mem.next_pages.clone(),
        )
    };
    let baseline = |url: &str| {
        let previous = previous?;
        let node = previous
            .nodes
            .iter()
            .find(|n| n.active_endpoint() == Some(url) && n.inventory_error.is_none() && !n.catching_up)?;
        Some(by_change::Baseline {
            inventory: node.inventory.clone()?,
            full_read_at: *full_reads.get(url)?,
            page: pages.get(url).copied().unwrap_or(1),
            written_since_poll: previous.fresh_reads.iter().any(|(_, id, _)| *id == node.node_id),
        })
    };
    let observations = join_all(access.endpoints.iter().map(|url| {
        let client = probing_client(access, url);
        observe(
            client,
            known.get(url).cloned(),
            baseline(url),
            access.full_read_interval,
        )
    }))
    .await;

    let mut mem = memory.lock().await;
    let mut answered = Vec::new();
    let mut unreachable = Vec::new();
    for (url, obs) in access.endpoints.iter().zip(observations) {
        match obs {
            Ok((m, identity, inv)) => {
                match &inv {
                    Some(Ok(by_change::Read::Full(_))) => {
                        mem.full_reads.insert(url.clone(), Instant::now());
                        mem.next_pages.insert(url.clone(), 1);
                    }
                    Some(Ok(by_change::Read::ByChange { next_page, .. })) => {
                        mem.next_pages.insert(url.clone(), *next_page);
                    }
                    _ => {}
                }
                mem.broker_names.insert(url.clone(), identity.broker_name.clone());
                mem.last_node_of.insert(url.clone(), identity.node_id.clone());
                answered.push((m, identity, inv));
            }
            Err(e) => {
                // A wrong broker name (the endpoint now serves another broker) is re-resolved;
                // a node that does not answer says nothing about its name.
                if !matches!(e, BrokerError::NotAnswering(_)) {
                    mem.broker_names.remove(url);
                }
                unreachable.push((url.clone(), e));
            }
        }
    }
    let nodes = group(&answered, &unreachable, &mem.last_node_of);
    let now = chrono::Utc::now();
    Topology {
        polled_at: Instant::now(),
        polled_at_utc: now,
        nodes,
        unreachable,
        fresh_reads: FreshReads::new(),
        secret_versions: access.secret_versions.clone(),
    }
}

/// Whether any of these endpoints (away at the last poll) answers now as an active broker: a
/// look between polls at the identity only, so a node that comes back is polled — and sent what
/// it missed — within seconds rather than at the next poll. Costs one read per endpoint away
/// (none while the budget judges it not answering: the poll's probe is on the wire).
pub async fn any_back(access: &ClusterAccess, memory: &Mutex<TopologyMemory>, urls: &[String]) -> bool {
    let known: HashMap<String, String> = memory.lock().await.broker_names.clone();
    let answers = join_all(urls.iter().map(|url| {
        let client = probing_client(access, url);
        let known_name = known.get(url).cloned();
        // A node judged not answering, or with anything on the wire, has its answer coming (it
        // ends the judgement, and the look after that asks): a look never adds a POST to it.
        let budget = access.http.registry().budget_for(url);
        let silent = budget.not_answering().is_some() || budget.stats().in_flight > 0;
        async move {
            if silent {
                return false;
            }
            let identified = unless_silent(&client, identify(&client, known_name)).await;
            identified.is_ok_and(|(_, i)| i.active)
        }
    }))
    .await;
    answers.into_iter().any(|back| back)
}

/// One endpoint's identity and (when active) inventory, read with the probing client; the
/// management it returns is for work (commands fail fast on a node judged not answering).
async fn observe(
    client: JolokiaClient,
    known_name: Option<String>,
    baseline: Option<by_change::Baseline>,
    full_read_interval: Duration,
) -> Result<Answer, BrokerError> {
    let (management, identity) = unless_silent(&client, identify(&client, known_name)).await?;
    // The inventory comes from the endpoint serving clients; a standby has none.
    let inv = if identity.active {
        Some(by_change::read(&management, baseline, full_read_interval).await)
    } else {
        None
    };
    let work = management.with_client(management.client().working());
    Ok((work, identity, inv))
}

/// A poll's client for one endpoint: its reads are the budget's probes.
fn probing_client(access: &ClusterAccess, url: &str) -> JolokiaClient {
    JolokiaClient::new(
        access.http.clone(),
        url.to_string(),
        access.origin.clone(),
        access.credentials.clone(),
        access.poll_timeout,
    )
    .probing()
}

/// The endpoint's management (by the broker name known for it, else searched) and identity.
async fn identify(
    client: &JolokiaClient,
    known_name: Option<String>,
) -> Result<(BrokerManagement, NodeIdentity), BrokerError> {
    let management = match known_name {
        Some(name) => BrokerManagement::with_name(client.clone(), name),
        None => BrokerManagement::connect(client.clone()).await?,
    };
    let identity = management.identity().await?;
    Ok((management, identity))
}

/// `call`, unless the node is judged not answering for [`PROBE_GRACE`] first: then the
/// evidence. The call's POST, if it went out, stays on the wire as the node's probe.
async fn unless_silent<T>(
    client: &JolokiaClient,
    call: impl std::future::Future<Output = Result<T, BrokerError>>,
) -> Result<T, BrokerError> {
    let silent = async {
        client.until_not_answering().await;
        tokio::time::sleep(PROBE_GRACE).await;
        client.until_not_answering().await
    };
    tokio::select! {
        biased;
        r = call => r,
        e = silent => Err(BrokerError::NotAnswering(NotAnswering { sent: true, ..e })),
    }
}

/// What an endpoint that answered the poll reported: its management client, identity, and
/// inventory (scraped only when active).
type Answer = (
    BrokerManagement,
    NodeIdentity,
    Option<Result<by_change::Read, BrokerError>>,
);

/// Pure grouping: endpoints → logical nodes.
fn group(
    answered: &[Answer],
    unreachable: &[(String, BrokerError)],
    last_node_of: &HashMap<String, String>,
) -> Vec<LogicalNode> {
    let mut nodes: BTreeMap<String, LogicalNode> = BTreeMap::new();
    place_answers(&mut nodes, answered);
    add_members_no_endpoint_answers_for(&mut nodes, answered);
    add_unreachable(&mut nodes, unreachable, last_node_of);
    for n in nodes.values_mut() {
        if n.active.is_none() && n.not_live_reason.is_none() {
            n.not_live_reason = Some(format!(
                "no endpoint is active (standby: {})",
                n.standby.join(", ")
            ));
        }
    }
    nodes.into_values().collect()
}

/// The logical node with this ID, added (with no endpoint yet) if it is not there.
fn node_entry<'a>(nodes: &'a mut BTreeMap<String, LogicalNode>, id: &str) -> &'a mut LogicalNode {
    nodes.entry(id.to_string()).or_insert_with(|| LogicalNode {
        node_id: id.to_string(),
        ..Default::default()
    })
}

/// Each answering endpoint under its node: the first active one is the node's target (with its
/// inventory), every other is a standby.
fn place_answers(nodes: &mut BTreeMap<String, LogicalNode>, answered: &[Answer]) {
    for (m, identity, inv) in answered {
        let node = node_entry(nodes, &identity.node_id);
        if identity.active && node.active.is_none() {
            node.active = Some(m.clone());
            node.failed_over = identity.configured_backup;
            match inv {
                Some(Ok(read)) => node.inventory = Some(read.inventory().clone()),
                Some(Err(e)) => node.inventory_error = Some(e.clone()),
                None => {}
            }
        } else {
            node.standby.push(m.client().url().to_string());
        }
    }
}

/// Members other nodes see that no endpoint of ours answers for.
fn add_members_no_endpoint_answers_for(nodes: &mut BTreeMap<String, LogicalNode>, answered: &[Answer]) {
    // The connector address each answering node claims for itself. A topology entry for another
    // node ID at one of these addresses is stale (e.g. a promoted backup's pre-sync ID).
    let claimed: HashMap<&str, &str> = answered
        .iter()
        .flat_map(|(_, identity, _)| {
            identity
                .topology
                .iter()
                .filter(|m| m.node_id == identity.node_id)
                .filter_map(|m| m.live.as_deref().map(|addr| (addr, identity.node_id.as_str())))
        })
        .collect();
    for (_, identity, _) in answered {
        for member in &identity.topology {
            let stale = member
                .live
                .as_deref()
                .and_then(|addr| claimed.get(addr))
                .is_some_and(|owner| *owner != member.node_id);
            if !stale && !nodes.contains_key(&member.node_id) {
                node_entry(nodes, &member.node_id).not_live_reason = Some(format!(
                    "in the cluster topology (at {}) but no configured endpoint answers for it",
                    member.live.as_deref().unwrap_or("?")
                ));
            }
        }
    }
}

/// Endpoints that stopped answering: their last node ID, if no other endpoint serves it.
fn add_unreachable(
    nodes: &mut BTreeMap<String, LogicalNode>,
    unreachable: &[(String, BrokerError)],
    last_node_of: &HashMap<String, String>,
) {
    for (url, e) in unreachable {
        if let Some(id) = last_node_of.get(url) {
            let node = node_entry(nodes, id);
            if node.active.is_none() {
                node.not_live_reason = Some(match e {
                    BrokerError::NotAnswering(n) => format!(
                        "{url} is not answering ({}); each poll probes it, and it gets what it missed when it answers again",
                        n.evidence()
                    ),
                    e => format!("{url} does not answer: {e}"),
                });
            }
        }
    }
}

/// Shared state kept per cluster (`namespace/name`): the latest topology, the cluster's runtime.
pub struct ByCluster<T> {
    inner: Arc<std::sync::RwLock<HashMap<String, Arc<T>>>>,
}

impl<T> Default for ByCluster<T> {
    fn default() -> Self {
        ByCluster {
            inner: Default::default(),
        }
    }
}

impl<T> Clone for ByCluster<T> {
    fn clone(&self) -> Self {
        ByCluster {
            inner: self.inner.clone(),
        }
    }
}

impl<T> ByCluster<T> {
    pub fn get(&self, cluster: &str) -> Option<Arc<T>> {
        self.inner.read().ok()?.get(cluster).cloned()
    }
    pub fn put(&self, cluster: &str, value: T) -> Arc<T> {
        let v = Arc::new(value);
        if let Ok(mut m) = self.inner.write() {
            m.insert(cluster.to_string(), v.clone());
        }
        v
    }
    /// Replace the value with what `f` makes of it, atomically (no concurrent update is lost);
    /// None when there is no value.
    pub fn update<R>(&self, cluster: &str, f: impl FnOnce(&T) -> (T, R)) -> Option<R> {
        let mut m = self.inner.write().ok()?;
        let (next, r) = f(m.get(cluster)?);
        m.insert(cluster.to_string(), Arc::new(next));
        Some(r)
    }
    /// Put the value `f` makes of the current one (if any), atomically; returns what `f` also
    /// returned.
    pub fn put_with<R>(&self, cluster: &str, f: impl FnOnce(Option<&T>) -> (T, R)) -> Option<R> {
        let mut m = self.inner.write().ok()?;
        let (v, r) = f(m.get(cluster).map(|v| v.as_ref()));
        m.insert(cluster.to_string(), Arc::new(v));
        Some(r)
    }
    pub fn remove(&self, cluster: &str) {
        if let Ok(mut m) = self.inner.write() {
            m.remove(cluster);
        }
    }
}

/// The latest topology of each cluster with its age; commands read it instead of polling.
pub type TopologyCache = ByCluster<Topology>;

/// What changed between two polls of one cluster, for the objects that depend on it: a change
/// of the live nodes (or of what could be read of them) concerns every object; otherwise only
/// the broker objects whose configuration changed (message and consumer counts are not
/// configuration: they move all the time and never trigger anything).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyChange {
    pub everything: bool,
    pub queues: std::collections::BTreeSet<String>,
    pub addresses: std::collections::BTreeSet<String>,
    pub diverts: std::collections::BTreeSet<String>,
    /// Addresses at either end of a divert that changed: they concern the queues there (their
    /// delete previews), not the other diverts at that address — 2,000 diverts into one queue
    /// must not each re-judge the other 1,999 when one is created.
    pub divert_ends: std::collections::BTreeSet<String>,
}

impl TopologyChange {
    /// A change that concerns every object of the cluster (nodes, access or the cluster itself).
    pub fn everything() -> Self {
        TopologyChange {
            everything: true,
            ..Default::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.everything
            && self.queues.is_empty()
            && self.addresses.is_empty()
            && self.diverts.is_empty()
            && self.divert_ends.is_empty()
    }

    /// The key under which an object that looks at queue `name` is indexed.
    pub fn queue_key(name: &str) -> String {
        format!("queue {name}")
    }
    pub fn address_key(name: &str) -> String {
        format!("address {name}")
    }
    pub fn divert_key(name: &str) -> String {
        format!("divert {name}")
    }
    /// The key under which a queue at `address` hears of the diverts that start or end there
    /// (see `divert_ends`).
    pub fn divert_end_key(address: &str) -> String {
        format!("divert end {address}")
    }

    /// The keys of every broker name this change touched (`everything` aside).
    pub fn keys(&self) -> Vec<String> {
        let queues = self.queues.iter().map(|q| Self::queue_key(q));
        let addresses = self.addresses.iter().map(|a| Self::address_key(a));
        let diverts = self.diverts.iter().map(|d| Self::divert_key(d));
        let ends = self.divert_ends.iter().map(|a| Self::divert_end_key(a));
        queues.chain(addresses).chain(diverts).chain(ends).collect()
    }
}

/// The keys whose values differ (added, removed, or not `same`). Maps that share structure (a
/// snapshot and the same snapshot with a command's fresh read laid over it) are compared without
/// visiting what they share: the cost follows the change, not the node's size.
fn changed_keys<V: PartialEq + Clone>(
    a: &OrdMap<String, V>,
    b: &OrdMap<String, V>,
    same: impl Fn(&V, &V) -> bool,
) -> Vec<String> {
    a.diff(b)
        .filter_map(|d| match d {
            DiffItem::Add(k, _) | DiffItem::Remove(k, _) => Some(k.clone()),
            DiffItem::Update {
                old: (k, v),
                new: (_, w),
            } => (!same(v, w)).then(|| k.clone()),
        })
        .collect()
}

fn same_queue_config(a: &inventory::QueueInfo, b: &inventory::QueueInfo) -> bool {
    // Counts by order of magnitude only (they move all the time on a busy queue): 0, 1-9,
    // 10-99… A change of magnitude, or consumers attaching to an idle queue, is a change the
    // delete preview shows.
    let counts_aside = |q: &inventory::QueueInfo| inventory::QueueInfo {
        message_count: crate::api::queue::magnitude(q.message_count),
        consumer_count: crate::api::queue::magnitude(q.consumer_count),
        delivering_count: 0,
        ..q.clone()
    };
    counts_aside(a) == counts_aside(b)
}

/// The change from `old` (None: never polled) to `new`.
pub fn changes(old: Option<&Topology>, new: &Topology) -> TopologyChange {
    let Some(old) = old else {
        return TopologyChange::everything();
    };
    let shape = |t: &Topology| -> Vec<(String, Option<String>, bool)> {
        t.nodes
            .iter()
            .map(|n| {
                (
                    n.node_id.clone(),
                    n.active_endpoint().map(str::to_string),
                    n.inventory.is_some(),
                )
            })
            .collect()
    };
    if shape(old) != shape(new) {
        return TopologyChange::everything();
    }
    let mut c = TopologyChange::default();
    for (o, n) in old.nodes.iter().zip(&new.nodes) {
        let (Some(oi), Some(ni)) = (&o.inventory, &n.inventory) else {
            continue;
        };
        if Arc::ptr_eq(oi, ni) {
            continue;
        }
        c.queues.extend(changed_keys(
            oi.queues.by_name(),
            ni.queues.by_name(),
            same_queue_config,
        ));
        c.queues.extend(changed_keys(
            &oi.unreadable_queues,
            &ni.unreadable_queues,
            |a, b| a == b,
        ));
        c.addresses
            .extend(changed_keys(&oi.addresses, &ni.addresses, |a, b| a == b));
        let diverts = changed_keys(&oi.diverts, &ni.diverts, |a, b| a == b);
        // A divert changing concerns the queues at both its ends (their delete previews).
        for name in &diverts {
            for d in [oi.diverts.get(name), ni.diverts.get(name)].into_iter().flatten() {
                c.divert_ends.insert(d.address.clone());
                c.divert_ends.insert(d.forwarding_address.clone());
            }
        }
        c.diverts.extend(diverts);
    }
    c
}

/// The logical nodes active at the poll of `new` that were not at the poll of `old` (absent,
/// or no endpoint active): nodes that came back. What they missed must go out now — every
/// object of the cluster is looked at again, and a node's failures while it was away are not a
/// reason to wait (ADR-0049: a node going live concerns every object).
pub fn returned(old: Option<&Topology>, new: &Topology) -> Vec<String> {
    let Some(old) = old else { return vec![] };
    new.nodes
        .iter()
        .filter(|n| n.active.is_some())
        .filter(|n| {
            old.nodes
                .iter()
                .find(|o| o.node_id == n.node_id)
                .is_none_or(|o| o.active.is_none())
        })
        .map(|n| n.node_id.clone())
        .collect()
}

#[cfg(test)]
mod change_tests {
    use super::*;

    fn topology(queues: &[(&str, u64)]) -> Topology {
        let mut inv = inventory::NodeInventory::default();
        for (name, count) in queues {
            inv.queues.insert(
                name.to_string(),
                inventory::QueueInfo {
                    name: name.to_string(),
                    message_count: *count,
                    ..Default::default()
                },
            );
        }
        Topology {
            polled_at: Instant::now(),
            polled_at_utc: chrono::Utc::now(),
            nodes: vec![LogicalNode {
                node_id: "n1".into(),
                inventory: Some(Arc::new(inv)),
                ..Default::default()
            }],
            unreachable: vec![],
            fresh_reads: FreshReads::new(),
            secret_versions: BTreeMap::new(),
        }
    }

    /// Issue 45: in a burst every command lays its answers over the snapshot (thousands of
    /// fresh reads between two polls) and clones it; a clone shares those reads, it does not
    /// copy them one by one.
    #[test]
    fn a_snapshot_clone_shares_its_fresh_reads() {
        let fresh = Arc::new(inventory::NodeInventory::default());
        let reads = BTreeMap::from([("n1".to_string(), fresh.clone())]);
        let mut t = topology(&[("q1", 0)]);
        for _ in 0..1000 {
            t = t.overlaid(&reads);
        }
        let held = Arc::strong_count(&fresh);
        assert_eq!(held, 2 + 1000, "here, in `reads`, and once per read laid over");
        let copies = [
            t.clone(),
            t.restricted_to(&["n1".to_string()].into()),
            t.overlaid(&BTreeMap::new()),
        ];
        assert_eq!(Arc::strong_count(&fresh), held, "three clones copied no read");
        drop(copies);
    }

    #[test]
    fn counts_moving_change_nothing_and_a_removed_queue_is_named() {
        let a = topology(&[("q1", 1), ("q2", 5)]);
        assert!(changes(Some(&a), &topology(&[("q1", 9), ("q2", 7)])).is_empty());
        assert!(
            changes(Some(&a), &topology(&[("q1", 1), ("q2", 50)]))
                .queues
                .contains("q2")
        );
        let c = changes(Some(&a), &topology(&[("q1", 1)]));
        assert!(!c.everything);
        assert_eq!(c.queues.iter().collect::<Vec<_>>(), ["q2"]);
        assert!(changes(None, &a).everything);
    }

    #[test]
    fn a_divert_created_concerns_the_queues_at_its_ends_not_the_diverts_there() {
        let before = topology(&[("sink", 0)]);
        let mut after = before.clone();
        let mut inv = (**after.nodes[0].inventory.as_ref().expect("an inventory")).clone();
        inv.diverts.insert(
            "d1".into(),
            inventory::DivertInfo {
                name: "d1".into(),
                address: "src".into(),
                forwarding_address: "sink".into(),
                ..Default::default()
            },
        );
        after.nodes[0].inventory = Some(Arc::new(inv));
        let c = changes(Some(&before), &after);
        assert_eq!(c.diverts.iter().collect::<Vec<_>>(), ["d1"]);
        assert_eq!(c.divert_ends.iter().collect::<Vec<_>>(), ["sink", "src"]);
        assert!(c.addresses.is_empty(), "no address changed: {c:?}");
        let keys = c.keys();
        assert!(keys.contains(&TopologyChange::divert_end_key("sink")));
        assert!(!keys.contains(&TopologyChange::address_key("sink")));
    }

    fn live(t: Topology, url: &str) -> Topology {
        let http = crate::broker::jolokia::http_client(&crate::broker::Registry::standalone(), None)
            .expect("an HTTP client");
        let client = JolokiaClient::new(
            http,
            url,
            None,
            Credentials {
                username: "u".into(),
                password: "p".into(),
            },
            std::time::Duration::from_secs(1),
        );
        let mut t = t;
        for n in &mut t.nodes {
            n.active = Some(BrokerManagement::with_name(client.clone(), "b".into()));
        }
        t
    }

    #[test]
    fn a_node_active_again_has_returned_and_one_that_stayed_or_left_has_not() {
        let url = "http://n1:8161/console/jolokia";
        let down = topology(&[]);
        let up = live(topology(&[]), url);
        assert_eq!(returned(Some(&down), &up), ["n1"]);
        assert!(returned(Some(&up), &up).is_empty(), "stayed");
        assert!(returned(Some(&up), &down).is_empty(), "left");
        assert!(returned(None, &up).is_empty(), "a first poll is no return");
    }

    #[test]
    fn a_returned_node_is_published_not_live_until_caught_up_then_as_polled_with_what_was_sent() {
        let polled = live(topology(&[("q1", 0)]), "http://n1:8161/console/jolokia");
        let hidden = polled.catching_up(&["n1".to_string()]);
        let n = &hidden.nodes[0];
        assert!(!n.is_live() && n.inventory.is_none());
        assert_eq!(n.not_live_reason.as_deref(), Some(CATCHING_UP));
        assert!(n.catching_up);
        assert!(
            polled.catching_up(&[]).nodes[0].is_live(),
            "only the returned nodes"
        );
        let mut sent = polled.nodes[0].clone();
        let mut inv = (**sent.inventory.as_ref().expect("polled inventory")).clone();
        inv.queues.insert("q2".into(), Default::default());
        sent.inventory = Some(Arc::new(inv));
        let back = hidden.caught_up(&[sent]);
        assert!(back.nodes[0].is_live() && !back.nodes[0].catching_up);
        let queues = &back.nodes[0].inventory.as_ref().expect("inventory").queues;
        assert!(queues.contains_key("q1") && queues.contains_key("q2"));
    }

    #[test]
    fn a_scrape_that_failed_keeps_the_last_inventory_marked_stale() {
        let before = live(topology(&[("q1", 1)]), "http://n1:8161/console/jolokia");
        let mut failed = live(topology(&[]), "http://n1:8161/console/jolokia");
        failed.nodes[0].inventory = None;
        failed.nodes[0].inventory_error = Some(BrokerError::Timeout(30));
        let kept = failed.keeping_stale_inventories(Some(&before));
        let n = &kept.nodes[0];
        assert!(n.inventory.as_ref().is_some_and(|i| i.queues.contains_key("q1")));
        assert!(n.inventory_error.is_some(), "still marked stale");
        assert!(
            changes(Some(&before), &kept).is_empty(),
            "nothing changed for any object"
        );

        // Another endpoint serving the node now (a failover): the old inventory is not its own.
        let mut moved = live(topology(&[]), "http://n1b:8161/console/jolokia");
        moved.nodes[0].inventory = None;
        moved.nodes[0].inventory_error = Some(BrokerError::Timeout(30));
        assert!(
            moved.keeping_stale_inventories(Some(&before)).nodes[0]
                .inventory
                .is_none()
        );
    }
}
