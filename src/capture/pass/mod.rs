//! One capture pass over one cluster (ADR-0062 D6): desired = the subscriptions, actual = our
//! objects per node; converge them. The same pass is the install, the crash recovery, the
//! failover repair and the new-queue path; its orphan sweep is the only thing that removes a
//! tap. Runs only while this process holds the cluster's advisory lock (see `super::worker`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use serde_json::json;
use tokio::sync::Mutex;

use super::arming::{self, Arming};
use super::connection::LinkKey;
use super::drain::{DrainHealth, DrainKey};
use super::names::TapName;
use super::plan::{self, Part, Subscription, TapSpec, Verdict};
use super::status::{ARMED, not_drained, same_status, set_tap_conditions, set_taps};
use crate::api::capture::{
    ArtemisCaptureSubscription, ArtemisCaptureSubscriptionStatus, CaptureArming, CaptureMode, CapturePreview,
    TapState, TapStatus,
};
use crate::api::{ArtemisCluster, NodeOutcome, Outcome, RefusalKind};
use crate::broker::{BrokerError, BrokerManagement};
use crate::controllers::access::AccessProblem;
use crate::controllers::pipeline::DereferenceError;
use crate::controllers::{Context, ReconcileError, command, conditions, key};
use crate::fanout::{NodeFailure, NodeReport, Target};
use crate::store::capture::{TapInstall, TapKey};
use crate::store::captured::{QueueCounters, TapTotals};
use crate::store::{AuditIntent, StoreError};
use crate::topology::{self, Topology, TopologyMemory};

/// Why a pass stopped before its end: what failed — reading the cluster, a command, Postgres,
/// or the Kubernetes API. The log and `capture_pass.result` say it as it displays; a
/// [`PassError::Store`] is also reported as an outage in status (`capture::outage`).
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The cluster's access (its Secrets, its endpoints) could not be resolved.
    #[error("cluster access: {}", .0.message)]
    Access(AccessProblem),
    /// The shared write gate refused: the Secrets, re-read right before a broker write, are
    /// missing or changed.
    #[error("cluster access: {0}")]
    Credentials(#[source] DereferenceError),
    /// An audited command could not be run or recorded (Postgres and the Kubernetes API are
    /// their own variants).
    #[error("{0}")]
    Command(#[source] ReconcileError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl From<ReconcileError> for PassError {
    fn from(e: ReconcileError) -> Self {
        match e {
            // Postgres stays Postgres: the worker reports an outage from it.
            ReconcileError::Store(e) => PassError::Store(e),
            ReconcileError::Kube(e) => PassError::Kube(e),
            other => PassError::Command(other),
        }
    }
}

/// What a process keeps per cluster it serves.
#[derive(Default)]
pub struct ClusterState {
    pub memory: Arc<Mutex<TopologyMemory>>,
    /// Jolokia endpoint → `amqp://host:port` of its broker's AMQP acceptor (read once).
    pub amqp: Mutex<BTreeMap<String, String>>,
    /// The drains of this cluster (they run only while its lock is held).
    pub drains: Mutex<BTreeMap<DrainKey, super::drain::DrainHandle>>,
    /// The last counters of each capture queue (node, queue), as saved in Postgres: a pass
    /// writes only what changed, so an idle tap costs one bulk read per node and no writes.
    pub counters: Mutex<BTreeMap<(String, String), QueueCounters>>,
    /// Per (node, source address): the source's RoutedMessageCount when the capture queue was
    /// last seen there — the baseline of a failover-window estimate.
    pub source_marks: Mutex<BTreeMap<(String, String), SourceMark>>,
    /// Mode Sample: the latest topology, when each subscription was sampled, browse outcomes.
    pub sample: Mutex<super::sample::SampleState>,
    /// Per (node, tap): the last read of the tap's source and capture sides (`reconcile`).
    pub sides: Mutex<BTreeMap<(String, TapName), super::reconcile::Sides>>,
    /// When a pass last wrote to a broker: the next pass judges from a topology polled after it.
    pub wrote_at: Mutex<Option<std::time::Instant>>,
    /// The subscriptions the last pass judged: a pass over others judges from a topology
    /// polled for it.
    pub judged_subs: Mutex<Vec<JudgedSub>>,
}

/// A subscription as a pass judged it: what asks for a pass (spec, annotations, deletion).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct JudgedSub {
    name: String,
    generation: Option<i64>,
    deleting: bool,
    annotations: BTreeMap<String, String>,
}

pub use super::window::SourceMark;

mod accounting;
mod install;
mod report;
mod sweep;

/// A pass's time budget (issue 42): twice the pass interval, at least 30 s. Status is written
/// at the end of every pass, so it is never older than a budget and an interval.
pub fn budget(pass_interval: Duration) -> Duration {
    (pass_interval * 2).max(Duration::from_secs(30))
}

/// The part of a pass's budget in which it starts installs and removals; what is left of them
/// then waits for the next pass, and the rest of the budget is for the writes in flight, the
/// loss counters, the drains and status.
fn write_window(budget: Duration) -> Duration {
    budget / 2
}

/// Whether a tap's install or removal may start now, or must wait for the next pass.
fn may_start(until: std::time::Instant) -> bool {
    std::time::Instant::now() < until
}

/// What one pass did.
#[derive(Default)]
pub struct PassSummary {
    /// Audited broker commands (install and remove).
    pub commands: i32,
    /// Taps whose install or removal was left for the next pass (the budget's time for writes
    /// was spent).
    pub deferred: i32,
    /// The drains that should run now: one per installed capture queue per live node.
    pub drains: Vec<DrainTarget>,
    /// What the pass judged, for [`report`] once those drains run.
    pub judgement: Option<Judgement>,
}

/// What a pass judged, written to the subscriptions' status by [`report`] once the drains it
/// wants run: a tap found installed is judged by its drain then, not a moment before its drain
/// could connect (issue 26: a restarted process, or one that took the cluster over, reported
/// every tap DEGRADED for one pass).
pub struct Judgement {
    cluster_key: String,
    seen: Survey,
    found: BTreeMap<(TapName, String), Found>,
    /// (tap, node) found installed: HEALTHY or DEGRADED by their drain, at report time.
    installed: Vec<(TapName, String)>,
    /// The paused subscriptions whose installs or removals the pass held.
    held: BTreeSet<String>,
}

/// The longest a report waits for the drains its pass started to connect (or fail).
const DRAIN_SETTLE: Duration = Duration::from_secs(5);

/// Write the subscriptions' status from a pass's judgement; `started`: the drains started for
/// it, each judged once it connected or failed (at most [`DRAIN_SETTLE`]).
pub async fn report(
    ctx: &Context,
    state: &ClusterState,
    subs: &[Arc<ArtemisCaptureSubscription>],
    j: Judgement,
    drains: &DrainView<'_>,
    started: &[DrainKey],
) -> Result<(), PassError> {
    let deadline = std::time::Instant::now() + DRAIN_SETTLE;
    while started.iter().any(|k| !drains.health.settled(k)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut found = j.found;
    for (name, node) in &j.installed {
        let key = DrainKey {
            cluster: j.cluster_key.clone(),
            node: node.clone(),
            capture_queue: name.capture_queue(),
        };
        let why = drains.health.draining(&key, drains.within).err();
        found.insert(
            (name.clone(), node.clone()),
            found_installed(why.map(|e| e.to_string())),
        );
    }
    report::write_statuses(ctx, state, &j.cluster_key, subs, &j.seen, &found, &j.held).await
}

/// A tap on one node (by node ID).
type TapOnNode = (TapName, String);

/// A capture queue on a live node that a drain should consume.
#[derive(Clone)]
pub struct DrainTarget {
    pub key: DrainKey,
    pub tap: TapName,
    /// The node's AMQP URL and the credentials its drain connects with.
    pub link: LinkKey,
    pub max_body_bytes: usize,
    pub max_ingest_per_second: u32,
    /// This pass (re)created the capture queue (a broker restart or failover lost it): a drain
    /// still waiting out its reconnect backoff starts over now, not up to 30 s later.
    pub fresh_queue: bool,
}

/// What the pass knows of this process's drains.
pub struct DrainView<'a> {
    pub health: &'a DrainHealth,
    /// A drain silent longer than this is not draining.
    pub within: Duration,
}

/// What the pass found for one tap on one node, for status.
#[derive(Clone, Debug)]
struct Found {
    state: TapState,
    refusal: Option<RefusalKind>,
    message: String,
}

fn view(
    s: &ArtemisCaptureSubscription,
    arms: &BTreeMap<String, ArmState>,
    records: &[crate::store::capture::TapRecord],
) -> Subscription {
    let name = s.name_any();
    Subscription {
        armed: arms.get(&name).is_some_and(|a| a.armed().is_some()),
        max_taps: s.spec.max_taps,
        installed: records
            .iter()
            .filter(|r| r.subscription == name)
            .map(|r| r.source_address.clone())
            .collect(),
        name,
        pattern: s.spec.queues.clone(),
        filter: s.spec.filter.clone().filter(|f| !f.trim().is_empty()),
        ring_size: s.spec.ring_size,
        expiry_delay_ms: s.spec.expiry_delay_seconds.saturating_mul(1000),
        max_buffer_bytes: s.spec.max_buffer_bytes,
        deleting: s.metadata.deletion_timestamp.is_some(),
    }
}

/// A subscription's blast radius now and whether it is armed (issue 25 item 5).
pub struct ArmState {
    pub preview: CapturePreview,
    pub arming: Arming,
}

impl ArmState {
    pub fn armed(&self) -> Option<&CaptureArming> {
        match &self.arming {
            Arming::Armed(a) => Some(a),
            Arming::Not { .. } => None,
        }
    }
}

fn without_review(s: &ArtemisCaptureSubscription) -> bool {
    s.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// The preview and the arming verdict of every capturing subscription, on the live nodes'
/// inventories of this pass.
fn arm_all(subs: &[Arc<ArtemisCaptureSubscription>], topology: &Topology) -> BTreeMap<String, ArmState> {
    let live: BTreeMap<String, &crate::topology::inventory::NodeInventory> = topology
        .live_nodes()
        .filter_map(|n| n.inventory.as_deref().map(|i| (n.node_id.clone(), i)))
        .collect();
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    subs.iter()
        .filter(|s| !super::sample::is_sampling(s) && s.metadata.deletion_timestamp.is_none())
        .map(|s| {
            let (capturable, never) = plan::matched_addresses(&s.spec.queues, live.values().copied());
            let resolved = arming::Resolved {
                queues: &s.spec.queues,
                max_taps: s.spec.max_taps,
                capturable: &capturable,
                never: &never,
                live: &live,
            };
            let preview = arming::preview(&resolved, s.metadata.generation);
            let old = s.status.as_ref();
            let request = arming::Request {
                queues: &s.spec.queues,
                confirm: s.spec.confirm.as_deref(),
                generation: s.metadata.generation,
                without_review: without_review(s),
                armed: old.and_then(|o| o.armed.as_ref()),
                shown: old.and_then(|o| o.preview.as_ref()),
            };
            let arming = arming::decide(&request, &preview, &at);
            (s.name_any(), ArmState { preview, arming })
        })
        .collect()
}

/// ADR-0062 D7 across the ArtemisClusters of one installation: a tap's name carries the
/// instance and the subscription's name, not its cluster, so a tap under our prefix whose
/// subscription is not one of this cluster's may belong to another ArtemisCluster on the same
/// brokers — that cluster's pass sweeps it, never this one's. Returns subscription name → the
/// other claimant (`namespace/name on cluster namespace/name`). Brokers count as shared when the
/// two specs share an endpoint URL or either discovers pods, or when both topologies are known
/// and share a node ID; when that cannot be told, they count as shared.
pub fn claimed_elsewhere(
    ctx: &Context,
    cluster_key: &str,
    cluster: &ArtemisCluster,
    all_subs: &[Arc<ArtemisCaptureSubscription>],
    all_clusters: &BTreeMap<String, Arc<ArtemisCluster>>,
) -> BTreeMap<String, String> {
    let urls: BTreeSet<&str> = cluster.spec.brokers.iter().map(|b| b.url.as_str()).collect();
    let shares = |other_key: &str, other: &ArtemisCluster| {
        let same_url = other.spec.brokers.iter().any(|b| urls.contains(b.url.as_str()));
        let discovered = cluster.spec.discovery.is_some() || other.spec.discovery.is_some();
        same_url
            || discovered
            || crate::controllers::pipeline::same_brokers(ctx, cluster_key, other_key).unwrap_or(true)
    };
    all_subs
        .iter()
        .filter_map(|s| {
            let ns = s.namespace().unwrap_or_default();
            let other_key = key(&ns, &s.spec.cluster_ref.name);
            let other = all_clusters.get(&other_key)?;
            (other_key != cluster_key && shares(&other_key, other)).then(|| {
                (
                    s.name_any(),
                    format!("{ns}/{} on cluster {other_key}", s.name_any()),
                )
            })
        })
        .collect()
}

/// Run one pass over `cluster` with the subscriptions that name it.
pub async fn run(
    ctx: &Context,
    state: &ClusterState,
    cluster: &ArtemisCluster,
    subs: &[Arc<ArtemisCaptureSubscription>],
    holder: &str,
    drains: &DrainView<'_>,
    elsewhere: &BTreeMap<String, String>,
) -> Result<PassSummary, PassError> {
    let budget = budget(ctx.capture_pass_interval);
    let writes_until = std::time::Instant::now() + write_window(budget);
    let ns = cluster.namespace().unwrap_or_default();
    let cluster_key = key(&ns, &cluster.name_any());
    let instance = ctx.instance_id.as_str();
    let mut summary = PassSummary::default();
    let seen = survey(ctx, state, cluster, subs, &cluster_key, elsewhere).await?;
    let mut judged = Judged::default();
    for node in &seen.topology.nodes {
        judge_node(&seen, node, instance, &cluster_key, drains, &mut judged).await;
    }
    let subs_by_name: BTreeMap<String, &Arc<ArtemisCaptureSubscription>> =
        subs.iter().map(|s| (s.name_any(), s)).collect();
    record_unrecorded(ctx, &cluster_key, instance, &seen, &subs_by_name, &judged).await?;
    let scope = PassScope {
        ctx,
        cluster_key: &cluster_key,
        ns: &ns,
        holder,
        topology: &seen.topology,
        timeout: seen.access.request_timeout,
        arms: &seen.arms,
        writes_until,
        budget,
    };
    let divert_missing = divert_missing(&judged.installs);
    let held = hold_paused(&mut judged, subs);
    // Issue 42: status is true while the pass runs. The taps it is about to install say so
    // before the installs (a tap the last pass found HEALTHY may have lost its ring since: a
    // failover, a restart), not only once the whole pass ends.
    if !judged.installs.is_empty() {
        let interim = installing(&judged);
        let written = report::write_statuses(ctx, state, &cluster_key, subs, &seen, &interim, &held).await;
        if let Err(e) = written {
            tracing::warn!(cluster = %cluster_key, error = %e, "capture: the status before this pass's installs not written");
        }
    }
    // Before a capture queue is re-created under an existing divert: the window opens.
    let windows = super::window::open(&state.source_marks, &seen.topology, &judged.installs).await;
    let writes = !(judged.installs.is_empty() && judged.sweeps.is_empty());
    if seen.from_runtime && writes {
        // The shared write gate: the Secrets re-read right before a broker write.
        crate::controllers::pipeline::ensure_credentials(ctx, &ns, &cluster.name_any())
            .await
            .map_err(PassError::Credentials)?;
    }
    let installed = install::install_all(&scope, &seen, &subs_by_name, &mut judged).await;
    let sweeps = std::mem::take(&mut judged.sweeps);
    let swept = match &installed {
        Ok(_) => sweep::sweep_all(&scope, state, sweeps, &subs_by_name, elsewhere).await,
        Err(_) => Ok((0, 0)),
    };
    if writes {
        // Done or not, the next pass judges from a topology polled after these writes.
        *state.wrote_at.lock().await = Some(std::time::Instant::now());
    }
    let ((installed, deferred_installs), (swept, deferred_sweeps)) = (installed?, swept?);
    (summary.commands, summary.deferred) = (installed + swept, deferred_installs + deferred_sweeps);
    // Loss counters of every capture queue that existed, and the drains that should run.
    let judgement = (&seen, &judged);
    accounting::count_loss(ctx, state, &cluster_key, judgement, &divert_missing, windows).await;
    let drain_targets = (judged.drain_targets.as_slice(), &judged.fresh_queues);
    summary.drains = drains_to_run(state, &cluster_key, &seen, &subs_by_name, drain_targets).await;
    // Mode Sample: browse what is due, on this pass's fresh topology.
    super::sample::sample_due(ctx, &state.sample, &cluster_key, subs).await;
    summary.judgement = Some(Judgement {
        cluster_key,
        seen,
        found: judged.found,
        installed: judged.installed,
        held,
    });
    Ok(summary)
}

/// The pause rule every kind keeps (`artemis-studio.io/paused: "true"`): a paused
/// subscription's taps are neither installed, changed nor removed — also while it is deleted,
/// whose finalizer then waits for the annotation to go; its drains go on. Returns the
/// subscriptions whose writes this pass held.
fn hold_paused(judged: &mut Judged, subs: &[Arc<ArtemisCaptureSubscription>]) -> BTreeSet<String> {
    let paused: BTreeSet<String> = subs
        .iter()
        .filter(|s| crate::controllers::is_paused(&s.metadata))
        .map(|s| s.name_any())
        .collect();
    let mut held = BTreeSet::new();
    let mut writes = |t: &TapName| {
        let hold = paused.contains(&t.subscription);
        if hold {
            held.insert(t.subscription.clone());
        }
        !hold
    };
    judged.installs.retain(|t, _| writes(t));
    judged.sweeps.retain(|t, _| writes(t));
    held
}

/// What a pass starts from: the cluster's access and a fresh topology, the open tap records,
/// how each subscription is armed, and the taps wanted (and those past a subscription's cap).
struct Survey {
    access: topology::ClusterAccess,
    topology: Topology,
    /// The access and topology are the cluster runtime's (not read by this pass).
    from_runtime: bool,
    records: Vec<crate::store::capture::TapRecord>,
    arms: BTreeMap<String, ArmState>,
    desired: BTreeMap<TapName, TapSpec>,
    past_cap: BTreeMap<String, Vec<String>>,
}

async fn survey(
    ctx: &Context,
    state: &ClusterState,
    cluster: &ArtemisCluster,
    subs: &[Arc<ArtemisCaptureSubscription>],
    cluster_key: &str,
    elsewhere: &BTreeMap<String, String>,
) -> Result<Survey, PassError> {
    let instance = ctx.instance_id.as_str();
    // Finalizers first: a subscription never has a tap on a broker without one.
    for s in subs.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        super::status::set_finalizer(&ctx.client, s, true).await?;
    }
    let (access, topology, from_runtime) = cluster_view(ctx, state, cluster, subs, cluster_key).await?;
    // Sampling browses on this snapshot until the next pass.
    state.sample.lock().await.topology = Some(topology.clone());
    // The reading commands label a tail by capture_subscription.mode: kept current here.
    for s in subs.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        let interval = (s.spec.mode == CaptureMode::Sample)
            .then(|| i32::try_from(s.spec.sample_interval_seconds).unwrap_or(i32::MAX));
        ctx.store
            .record_subscription_mode(cluster_key, &s.name_any(), s.spec.mode.as_db(), interval)
            .await?;
    }
    let records = ctx.store.open_taps(cluster_key, instance).await?;
    // Before anything new is installed: the blast radius shown, then armed (issue 25 item 5).
    let arms = arm_all(subs, &topology);
    // A subscription in mode Sample wants no tap: the sweep removes any it had (ADR-0062 D6).
    let views: Vec<Subscription> = subs
        .iter()
        .filter(|s| !super::sample::is_sampling(s))
        .map(|s| view(s, &arms, &records))
        .collect();
    let inventories: Vec<&crate::topology::inventory::NodeInventory> = topology
        .live_nodes()
        .filter_map(|n| n.inventory.as_deref())
        .collect();
    let role = cluster.spec.capture_role.clone();
    let ns = cluster.namespace().unwrap_or_default();
    let legacy = legacy_taps(instance, &records, &inventories, elsewhere);
    let naming = plan::Naming {
        instance,
        namespace: &ns,
        legacy: &legacy,
    };
    let (desired, past_cap) = plan::desired_taps(&naming, &role, &views, inventories.iter().copied());
    Ok(Survey {
        access,
        topology,
        from_runtime,
        records,
        arms,
        desired,
        past_cap,
    })
}

/// The (subscription, address) of this instance's taps named before names carried the
/// namespace — from the open records and the nodes' inventories — that keep that name: renaming
/// a live tap would drop what its ring holds. Not where another cluster on these brokers has a
/// subscription of the same name (the name would be both's): those are installed under the new
/// name, and the old one swept.
fn legacy_taps(
    instance: &str,
    records: &[crate::store::capture::TapRecord],
    inventories: &[&crate::topology::inventory::NodeInventory],
    elsewhere: &BTreeMap<String, String>,
) -> BTreeSet<(String, String)> {
    let recorded = records
        .iter()
        .filter_map(|r| TapName::parse(instance, &r.capture_queue).map(|(t, _)| t));
    let on_brokers = inventories
        .iter()
        .flat_map(|inv| plan::our_objects(instance, inv).into_keys());
    recorded
        .chain(on_brokers)
        .filter(|t| t.is_legacy() && !elsewhere.contains_key(&t.subscription))
        .map(|t| (t.subscription, t.address))
        .collect()
}

/// The cluster's access and a topology to judge from (issue 24: capture reads the cluster's
/// snapshot instead of polling again). Where this process runs the cluster's controller and the
/// Secrets are as its runtime read them (the watch says so, and `ensure_credentials` re-reads
/// them before any write), its latest topology — polled inline if older than a pass interval,
/// or than this cluster's last capture write (a pass never judges from a snapshot that
/// predates its own installs), or whenever the subscriptions changed since the last pass (a new
/// pattern is previewed and judged on what the brokers hold now). Otherwise (a replica that
/// serves capture without leading, a runtime of another generation, changed Secrets) this pass
/// reads both itself.
async fn cluster_view(
    ctx: &Context,
    state: &ClusterState,
    cluster: &ArtemisCluster,
    subs: &[Arc<ArtemisCaptureSubscription>],
    cluster_key: &str,
) -> Result<(topology::ClusterAccess, Topology, bool), PassError> {
    let ns = cluster.namespace().unwrap_or_default();
    let usable = ctx.clusters.get(cluster_key).filter(|rt| {
        rt.generation == cluster.metadata.generation
            && crate::controllers::runtime::access_is_current(ctx, &ns, rt)
    });
    let mut judged: Vec<JudgedSub> = subs
        .iter()
        .map(|s| JudgedSub {
            name: s.name_any(),
            generation: s.metadata.generation,
            deleting: s.metadata.deletion_timestamp.is_some(),
            annotations: s.annotations().clone(),
        })
        .collect();
    judged.sort();
    let same_subs = *state.judged_subs.lock().await == judged;
    *state.judged_subs.lock().await = judged;
    if usable.is_some() {
        let wrote = state.wrote_at.lock().await.map(|t| t.elapsed());
        let mut max_age = wrote.map_or(ctx.capture_pass_interval, |w| w.min(ctx.capture_pass_interval));
        if !same_subs {
            max_age = Duration::ZERO;
        }
        let current =
            crate::controllers::runtime::current_topology(ctx, &ns, &cluster.name_any(), Some(max_age)).await;
        if let Ok((rt, t)) = current {
            return Ok((rt.access.clone(), (*t).clone(), true));
        }
    }
    let access = crate::controllers::cluster::resolve_access(&ctx.client, &ns, &cluster.spec)
        .await
        .map_err(PassError::Access)?;
    let topology = topology::poll(&access, &state.memory).await;
    Ok((access, topology, false))
}

/// What the pass judged of every desired tap on every node, and the writes it will make.
#[derive(Default)]
struct Judged {
    found: BTreeMap<(TapName, String), Found>,
    installs: BTreeMap<TapName, BTreeMap<String, Vec<Part>>>,
    sweeps: BTreeMap<TapName, BTreeMap<String, (bool, bool)>>,
    installed_unrecorded: Vec<(TapName, String, Option<String>)>,
    /// (tap, node) whose capture queue exists: drained, and their loss counters read.
    drain_targets: Vec<(TapName, String)>,
    /// (tap, node) found installed (judged again by their drain at report time).
    installed: Vec<(TapName, String)>,
    /// (tap, node) whose capture queue this pass created.
    fresh_queues: BTreeSet<(TapName, String)>,
}

/// Judge every desired tap on one node; collect its writes and its orphans.
async fn judge_node(
    seen: &Survey,
    node: &crate::topology::LogicalNode,
    instance: &str,
    cluster_key: &str,
    drains: &DrainView<'_>,
    judged: &mut Judged,
) {
    let (Some(m), Some(inv)) = (&node.active, &node.inventory) else {
        not_served(&seen.desired, node, judged);
        return;
    };
    let drain_key = |n: &TapName| DrainKey {
        cluster: cluster_key.to_string(),
        node: node.node_id.clone(),
        capture_queue: n.capture_queue(),
    };
    let drain_of = |n: &TapName| drains.health.draining(&drain_key(n), drains.within);
    let (verdicts, node_problem) = verdicts_on(&seen.desired, m, inv, &drain_of).await;
    for (name, verdict) in verdicts {
        let k = (name.clone(), node.node_id.clone());
        let f = match (verdict, &node_problem) {
            (Verdict::Missing(parts), None) => {
                judged
                    .installs
                    .entry(name.clone())
                    .or_default()
                    .insert(node.node_id.clone(), parts);
                continue;
            }
            (Verdict::Installed { drained }, _) => {
                installed(seen, node, name, judged);
                judged.installed.push((name.clone(), node.node_id.clone()));
                let why = (!drained).then(|| drain_of(name).err().map(|e| e.to_string()).unwrap_or_default());
                found_installed(why)
            }
            (verdict, problem) => found_elsewise(name, verdict, problem.as_ref()),
        };
        judged.found.insert(k, f);
    }
    orphans_on(seen, node, (instance, cluster_key), inv, judged);
}

/// What status says while this pass installs: every tap as judged, each one about to be
/// installed PENDING.
fn installing(judged: &Judged) -> BTreeMap<(TapName, String), Found> {
    let mut found = judged.found.clone();
    for (tap, nodes) in &judged.installs {
        for node in nodes.keys() {
            let pending = Found {
                state: TapState::Pending,
                refusal: None,
                message: "not installed on this node: the pass running now installs it".into(),
            };
            found.insert((tap.clone(), node.clone()), pending);
        }
    }
    found
}

/// A node not served now: every desired tap waits for it.
fn not_served(
    desired: &BTreeMap<TapName, TapSpec>,
    node: &crate::topology::LogicalNode,
    judged: &mut Judged,
) {
    let why = node
        .not_live_reason
        .clone()
        .or_else(|| {
            node.inventory_error
                .as_ref()
                .map(|e| format!("inventory unreadable: {e}"))
        })
        .unwrap_or_else(|| "not live".into());
    for tap in desired.keys() {
        let found = Found {
            state: TapState::Pending,
            refusal: None,
            message: format!("node not served now ({why}): the tap is checked at the first pass after it is"),
        };
        judged.found.insert((tap.clone(), node.node_id.clone()), found);
    }
}

/// Each desired tap's verdict on a live node, and a problem that stops any write there.
async fn verdicts_on<'d>(
    desired: &'d BTreeMap<TapName, TapSpec>,
    m: &BrokerManagement,
    inv: &crate::topology::inventory::NodeInventory,
    drain_of: &impl Fn(&TapName) -> Result<(), super::drain::NotDraining>,
) -> (BTreeMap<&'d TapName, Verdict>, Option<(RefusalKind, String)>) {
    let mut verdicts: BTreeMap<&TapName, Verdict> = desired
        .iter()
        .map(|(n, t)| (n, plan::assess(t, inv, None, drain_of(n).is_ok())))
        .collect();
    // ADR-0066 D2: a node not being drained gets the whole install checked, settings too.
    let recheck: Vec<&TapName> = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Missing(_) | Verdict::Installed { drained: false }))
        .map(|(n, _)| *n)
        .collect();
    let mut node_problem: Option<(RefusalKind, String)> = None;
    if !recheck.is_empty() {
        let queues: Vec<String> = recheck.iter().map(|n| n.capture_queue()).collect();
        match m.effective_settings(&queues).await {
            Ok(settings) => {
                for (n, s) in recheck.iter().zip(settings.iter()) {
                    if let Some(t) = desired.get(*n) {
                        verdicts.insert(*n, plan::assess(t, inv, Some(s), drain_of(n).is_ok()));
                    }
                }
            }
            Err(e) => {
                let message = format!("settings unreadable, nothing written: {e}");
                node_problem = Some((e.refusal_kind(), message));
            }
        }
    }
    if node_problem.is_none() && verdicts.values().any(|v| matches!(v, Verdict::Missing(_))) {
        node_problem = security_preflight(m).await;
    }
    (verdicts, node_problem)
}

/// A tap installed on a node: drained from now on, and recorded if no record says so.
fn installed(seen: &Survey, node: &crate::topology::LogicalNode, name: &TapName, judged: &mut Judged) {
    let recorded = seen.records.iter().any(|r| {
        r.node == node.node_id && r.subscription == name.subscription && r.source_address == name.address
    });
    if !recorded {
        let endpoint = node.active_endpoint().map(str::to_string);
        judged
            .installed_unrecorded
            .push((name.clone(), node.node_id.clone(), endpoint));
    }
    judged.drain_targets.push((name.clone(), node.node_id.clone()));
}

/// An installed tap: healthy when drained, else degraded with why not.
fn found_installed(not_drained_because: Option<String>) -> Found {
    match not_drained_because {
        None => Found {
            state: TapState::Healthy,
            refusal: None,
            message: "being drained into Postgres".into(),
        },
        Some(why) => Found {
            state: TapState::Degraded,
            refusal: None,
            message: not_drained(&why),
        },
    }
}

/// A tap that is neither to install nor installed: waiting for its address, refused, or held
/// by the node's problem.
fn found_elsewise(name: &TapName, verdict: Verdict, problem: Option<&(RefusalKind, String)>) -> Found {
    match (verdict, problem) {
        (Verdict::Refused { kind, message }, _) => Found {
            state: TapState::Refused,
            refusal: Some(kind),
            message,
        },
        (Verdict::Missing(_), Some((kind, message))) => Found {
            state: if *kind == RefusalKind::NoSecurityAuthority {
                TapState::Refused
            } else {
                TapState::Pending
            },
            refusal: Some(*kind),
            message: message.clone(),
        },
        _ => Found {
            state: TapState::Pending,
            refusal: None,
            message: format!(
                "address {} does not exist on this node (no matching queue here): the tap is installed at the first pass after it appears",
                name.address
            ),
        },
    }
}

/// Orphans: our objects (this instance only, ADR-0062 D7), and what our records say we
/// installed here, that no subscription wants any more.
fn orphans_on(
    seen: &Survey,
    node: &crate::topology::LogicalNode,
    (instance, cluster_key): (&str, &str),
    inv: &crate::topology::inventory::NodeInventory,
    judged: &mut Judged,
) {
    // Another namespace's taps on shared brokers are its cluster's to judge.
    let ns = cluster_key.split_once('/').map_or("", |(ns, _)| ns);
    let mut ours = plan::our_objects(instance, inv);
    ours.retain(|t, _| t.is_legacy() || t.namespace == ns);
    for r in seen.records.iter().filter(|r| r.node == node.node_id) {
        let tap = TapName::parse(instance, &r.capture_queue)
            .map(|(t, _)| t)
            .unwrap_or_else(|| TapName::new(instance, ns, &r.source_address, &r.subscription));
        ours.entry(tap).or_insert((false, false));
    }
    for (tap, objects) in ours {
        if !seen.desired.contains_key(&tap) {
            judged
                .sweeps
                .entry(tap)
                .or_default()
                .insert(node.node_id.clone(), objects);
        }
    }
}

/// Installed taps no record names (installed by a pass that stopped before recording them).
async fn record_unrecorded(
    ctx: &Context,
    cluster_key: &str,
    instance: &str,
    seen: &Survey,
    subs_by_name: &BTreeMap<String, &Arc<ArtemisCaptureSubscription>>,
    judged: &Judged,
) -> Result<(), PassError> {
    for (tap, node, endpoint) in &judged.installed_unrecorded {
        let sub = subs_by_name.get(&tap.subscription);
        ctx.store
            .ensure_tap_recorded(&TapInstall {
                cluster: cluster_key,
                subscription: &tap.subscription,
                subscription_uid: sub.and_then(|s| s.metadata.uid.as_deref()),
                instance_id: instance,
                node,
                endpoint: endpoint.as_deref(),
                source_address: &tap.address,
                capture_queue: &tap.capture_queue(),
                divert: &tap.divert(),
                filter: seen.desired.get(tap).and_then(|t| t.filter.as_deref()),
                audit_id: None,
            })
            .await?;
    }
    Ok(())
}

/// Existing taps whose divert is gone (removed behind our back): re-created by the installs,
/// and the copies routed meanwhile estimated as `tap_missing` (issue 25 item 3).
fn divert_missing(installs: &BTreeMap<TapName, BTreeMap<String, Vec<Part>>>) -> BTreeSet<(TapName, String)> {
    installs
        .iter()
        .flat_map(|(tap, nodes)| {
            nodes
                .iter()
                .filter(|(_, parts)| parts.contains(&Part::Divert) && !parts.contains(&Part::Queue))
                .map(move |(node, _)| (tap.clone(), node.clone()))
        })
        .collect()
}

/// The drains that should run: one per installed tap and node, with the cluster's credentials.
async fn drains_to_run(
    state: &ClusterState,
    cluster_key: &str,
    seen: &Survey,
    subs_by_name: &BTreeMap<String, &Arc<ArtemisCaptureSubscription>>,
    (targets, fresh_queues): (&[TapOnNode], &BTreeSet<TapOnNode>),
) -> Vec<DrainTarget> {
    let mut drains = vec![];
    for (tap, node) in targets {
        let fresh_queue = fresh_queues.contains(&(tap.clone(), node.clone()));
        let (Some(spec), Some(n)) = (seen.desired.get(tap), seen.topology.find(node)) else {
            continue;
        };
        let (Some(sub), Some(m)) = (subs_by_name.get(&tap.subscription), &n.active) else {
            continue;
        };
        let Some(url) = amqp_url(state, m).await else {
            continue;
        };
        drains.push(DrainTarget {
            key: DrainKey {
                cluster: cluster_key.to_string(),
                node: node.clone(),
                capture_queue: spec.name.capture_queue(),
            },
            tap: tap.clone(),
            link: LinkKey {
                url,
                username: seen.access.credentials.username.clone(),
                password: seen.access.credentials.password.clone(),
            },
            max_body_bytes: sub.spec.max_body_bytes as usize,
            max_ingest_per_second: sub.spec.max_ingest_per_second,
            fresh_queue,
        });
    }
    drains
}

/// The AMQP endpoint of a node's active broker: its AMQP acceptor's port, on the Jolokia
/// endpoint's host when the acceptor listens on every interface.
async fn amqp_url(state: &ClusterState, m: &BrokerManagement) -> Option<String> {
    let endpoint = m.client().url().to_string();
    if let Some(u) = state.amqp.lock().await.get(&endpoint) {
        return Some(u.clone());
    }
    let (host, port) = match m.amqp_acceptor().await {
        Ok(Some(found)) => found,
        Ok(None) => {
            tracing::warn!(%endpoint, "capture: the broker has no plain AMQP acceptor; its taps cannot be drained");
            return None;
        }
        Err(e) => {
            tracing::warn!(%endpoint, error = %e, "capture: cannot read the broker's acceptors");
            return None;
        }
    };
    let jolokia_host = reqwest::Url::parse(&endpoint)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "localhost".into());
    let host = if host.is_empty() || host == "0.0.0.0" || host == "::" || host == "[::]" {
        jolokia_host
    } else {
        host
    };
    let url = format!("amqp://{host}:{port}");
    state.amqp.lock().await.insert(endpoint, url.clone());
    Some(url)
}

/// ADR-0062 D8: the capture queue must be restricted to the operator's role. A broker that
/// enforces no security, or a management user that may not add a security setting, gets no
/// tap at all.
async fn security_preflight(m: &BrokerManagement) -> Option<(RefusalKind, String)> {
    match m.security_authority().await {
        Ok(a) if !a.security_enabled => Some((
            RefusalKind::NoSecurityAuthority,
            "this broker has security-enabled=false: a security setting would restrict nothing and the capture queue (a complete copy of production payload) would be readable by every client (ADR-0062 D8). Nothing was installed on this node; enable security on the broker".into(),
        )),
        Ok(a) if a.may_add_security == Some(false) => Some((
            RefusalKind::NoSecurityAuthority,
            "the management user may not call addSecuritySettings (the broker's management.xml refuses it), so the capture queue could not be restricted to the capture role (ADR-0062 D8). Nothing was installed on this node; grant the user's role access to addSecuritySettings (and removeSecuritySettings)".into(),
        )),
        Ok(_) => None,
        Err(e) => Some((e.refusal_kind(), format!("security preflight unreadable, nothing written: {e}"))),
    }
}

/// Where a pass's commands go, and who sends them.
struct PassScope<'a> {
    ctx: &'a Context,
    cluster_key: &'a str,
    ns: &'a str,
    holder: &'a str,
    topology: &'a Topology,
    timeout: Duration,
    /// How each subscription was armed: its installs' audit rows say so.
    arms: &'a BTreeMap<String, ArmState>,
    /// No install or removal starts after this (the pass's budget, `write_window`).
    writes_until: std::time::Instant,
    budget: Duration,
}

fn intent(
    p: &PassScope<'_>,
    command: &str,
    sub: Option<&Arc<ArtemisCaptureSubscription>>,
    tap: &TapName,
    params: serde_json::Value,
) -> AuditIntent {
    AuditIntent {
        instance_id: p.ctx.instance_id.clone(),
        actor: format!("capture-reconciler ({})", p.holder),
        command: command.into(),
        cluster: p.cluster_key.into(),
        target: format!("capture tap {}", tap.capture_queue()),
        object_kind: "ArtemisCaptureSubscription".into(),
        object_namespace: p.ns.into(),
        object_name: tap.subscription.clone(),
        object_uid: sub.and_then(|s| s.metadata.uid.clone()).unwrap_or_default(),
        object_generation: sub.and_then(|s| s.metadata.generation),
        params,
    }
}

/// A capture command tells its subscription of a failure (none for an orphan's sweep; a success
/// is in the subscription's status and the audit log), and is no evidence
/// of the management user's authority over queues (ADR-0049).
fn told(sub: Option<&Arc<ArtemisCaptureSubscription>>) -> command::Told<'_, ArtemisCaptureSubscription> {
    command::Told {
        on: sub.map(|s| s.as_ref()),
        success_event: command::SuccessEvent::Never,
        evidence_for: None,
    }
}

#[cfg(test)]
mod naming_tests {
    use super::*;
    use crate::store::capture::TapRecord;
    use crate::topology::inventory::{NodeInventory, QueueInfo};

    fn record(tap: &TapName) -> TapRecord {
        TapRecord {
            subscription: tap.subscription.clone(),
            node: "n1".into(),
            source_address: tap.address.clone(),
            capture_queue: tap.capture_queue(),
            installed_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn taps_named_before_namespaces_keep_their_name_unless_another_cluster_shares_it() {
        let recorded = TapName::legacy("i1", "orders", "audit");
        let on_broker = TapName::legacy("i1", "payments", "audit");
        let renamed = TapName::new("i1", "ns", "refunds", "audit");
        let mut inv = NodeInventory::default();
        for t in [&on_broker, &renamed] {
            let name = t.capture_queue();
            inv.queues.insert(
                name.clone(),
                QueueInfo {
                    name,
                    ..Default::default()
                },
            );
        }
        let records = [record(&recorded), record(&renamed)];
        let kept = legacy_taps("i1", &records, &[&inv], &BTreeMap::new());
        let want: BTreeSet<(String, String)> = [("audit", "orders"), ("audit", "payments")]
            .into_iter()
            .map(|(s, a)| (s.to_string(), a.to_string()))
            .collect();
        assert_eq!(kept, want);
        let elsewhere = BTreeMap::from([("audit".to_string(), "other/audit on cluster other/c".to_string())]);
        assert!(legacy_taps("i1", &records, &[&inv], &elsewhere).is_empty());
        let legacy = kept;
        let naming = plan::Naming {
            instance: "i1",
            namespace: "ns",
            legacy: &legacy,
        };
        assert_eq!(naming.tap("orders", "audit"), recorded);
        assert_eq!(naming.tap("refunds", "audit"), renamed);
        assert_eq!(
            naming.tap("orders", "other"),
            TapName::new("i1", "ns", "orders", "other")
        );
    }
}

#[cfg(test)]
mod budget_tests {
    use super::install::found_deferred;
    use super::{budget, may_start, write_window};
    use crate::api::capture::TapState;
    use std::time::{Duration, Instant};

    #[test]
    fn a_pass_has_twice_its_interval_at_least_30_s_and_starts_writes_in_the_first_half() {
        assert_eq!(budget(Duration::from_secs(30)), Duration::from_secs(60));
        assert_eq!(budget(Duration::from_secs(2)), Duration::from_secs(30));
        assert_eq!(write_window(Duration::from_secs(60)), Duration::from_secs(30));
        assert!(may_start(Instant::now() + Duration::from_secs(1)));
        assert!(!may_start(Instant::now()));
    }

    #[test]
    fn a_deferred_install_is_pending_and_says_when_it_comes() {
        let f = found_deferred(Duration::from_secs(60));
        assert_eq!(f.state, TapState::Pending);
        assert!(
            f.message.contains("time budget (60s)") && f.message.contains("next pass"),
            "{}",
            f.message
        );
    }
}
