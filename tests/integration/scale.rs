//! What the operator costs at scale, counted (never timed): converged queues cost no Kubernetes
//! API write, no LIST and no per-queue broker read while idle; a node that comes back gets every
//! queue from one inventory scrape per poll plus each queue's own preflight, write and verify.
//!
//! The per-node Jolokia counters are process-wide and keyed by endpoint URL, and concurrent tests
//! poll the same brokers: the ArtemisCluster of these tests names the test bed's Jolokia URLs with
//! a query parameter the broker ignores (as tests/integration/broker_budget.rs does), so the
//! counters of those URLs count this test's operator only.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use artemis_studio_operator::api::queue::ArtemisQueue;
use artemis_studio_operator::api::{ArtemisCluster, Outcome};
use artemis_studio_operator::telemetry::jolokia::JolokiaMetrics;

use crate::queue::{outcomes, ready};
use crate::support::{
    CleanUp, OperatorHandle, TestBed, brokers_exclusive, brokers_shared, create_cluster, short_id,
    wait_cluster_condition, wait_until,
};

/// Jolokia operations one poll sends to a live node, at most: identity (NodeID, Active, Backup,
/// HAPolicy, listNetworkTopology: one bulk of 5, src/broker/management.rs), the node's divert
/// watch, counts and one page of its queues (one bulk of 3, src/topology/by_change.rs) and, when
/// the counts moved (the brokers are shared: another test's queues move them), the inventory
/// scrape (the divert watch, every queue by one listQueues, addresses and diverts by two wildcard
/// reads, one bulk of 4, src/topology/inventory.rs).
const OPS_PER_POLL: u64 = 12;
/// The divert watch's create a node gets once after its broker starts (issue 45), unless another
/// installation on the shared brokers made it first.
const WATCH_OPS: u64 = 1;
/// The broker-name search a poll adds when it must resolve an endpoint's broker name (the first
/// poll of an endpoint, and the first one after it stopped answering).
const CONNECT_OPS: u64 = 1;
/// Jolokia operations one queue's create sends to one node (issue 23): the write only, planned
/// from the snapshot — createAddress and createQueue in one POST for a new address the spec keeps
/// (no read before, none after: the broker's answer is the evidence).
const CREATE_OPS_PER_QUEUE: u64 = 2;

struct Scale {
    bed: TestBed,
    ns: String,
    admin: Client,
    op: OperatorHandle,
    /// Broker name (c1, c2, c3) → the Jolokia URL this test's ArtemisCluster names it by.
    urls: BTreeMap<String, String>,
    /// Last, so the operator has stopped when it sweeps the test's queues (its tags, added with
    /// `also`).
    clean: CleanUp,
}

async fn scale_fixture(prefix: &str) -> Scale {
    let bed = TestBed::get();
    let ns = bed.fresh_namespace(prefix).await;
    let clean = bed.clean_up(&[]);
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let tag = short_id();
    let urls: BTreeMap<String, String> = bed
        .cluster_brokers("c")
        .into_iter()
        .map(|b| (b.name.clone(), format!("{}?scale-test={tag}", b.jolokia)))
        .collect();
    let list: Vec<String> = urls.values().cloned().collect();
    create_cluster(&admin, &ns, "c", &list, Some(bed.broker_user())).await;
    Api::<ArtemisCluster>::namespaced(admin.clone(), &ns)
        .patch(
            "c",
            &PatchParams::default(),
            // A short poll interval (polls are what these tests count); a request timeout that
            // a broker slowed by 2 busy cores still meets (a timed-out scrape makes a node
            // FAILED until the next poll, and its queue is completed by a queue.repair).
            &Patch::Merge(json!({"spec": {"pollIntervalSeconds": 2, "requestTimeoutSeconds": 10}})),
        )
        .await
        .expect("set the poll interval and request timeout");
    wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let s = Scale {
        bed,
        ns,
        admin,
        op,
        urls,
        clean,
    };
    s.wait_live_nodes(3).await;
    s
}

impl Scale {
    /// The operator's API writes since `before` (by verb and kind) for the queues, once the
    /// Events its passes queued are published: every kind but the cluster's, whose status is the
    /// managementWrite evidence.
    async fn queue_api_writes(
        &self,
        before: &BTreeMap<(String, String), u64>,
    ) -> BTreeMap<(String, String), u64> {
        self.op.ctx.events.settled().await;
        writes_of(&grown(before, &api_requests(&self.op.ctx.metrics)))
            .into_iter()
            .filter(|((_, kind), _)| !kind.starts_with("artemisclusters"))
            .collect()
    }

    fn queues(&self) -> Api<ArtemisQueue> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    fn cluster(&self) -> Api<ArtemisCluster> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    async fn wait_live_nodes(&self, n: u32) -> ArtemisCluster {
        let api = self.cluster();
        wait_until(
            &format!("ArtemisCluster {}/c reports {n} live nodes", self.ns),
            Duration::from_secs(90),
            || {
                let api = api.clone();
                async move {
                    api.get("c")
                        .await
                        .ok()
                        .filter(|c| c.status.as_ref().is_some_and(|s| s.live_nodes == n))
                }
            },
        )
        .await
    }

    /// Polls of cluster c by the cluster controller: the count of its
    /// inventory_poll_duration_seconds histogram.
    fn polls(&self) -> u64 {
        let cluster = format!("{}/c", self.ns);
        let family = self.op.ctx.metrics.poll_seconds.clone();
        samples(|r| r.register("polls", "cluster polls", family), "polls_count")
            .into_iter()
            .find(|(labels, _)| labels.get("cluster") == Some(&cluster))
            .map_or(0, |(_, n)| n)
    }

    async fn wait_polls(&self, at_least: u64) {
        wait_until(
            &format!("cluster c polled {at_least} times"),
            Duration::from_secs(60),
            || async { (self.polls() >= at_least).then_some(()) },
        )
        .await;
    }

    /// Poll cluster c only once an hour from now on (after the poll the change itself causes):
    /// every operation counted afterwards is a command's.
    async fn poll_hourly(&self) {
        let polls = self.polls();
        self.cluster()
            .patch(
                "c",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"pollIntervalSeconds": 3600}})),
            )
            .await
            .expect("slow the polls down");
        self.wait_polls(polls + 1).await;
    }

    /// Jolokia operations this test's operator sent to each broker of cluster c, by kind.
    fn ops_by_kind(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        self.urls
            .iter()
            .map(|(b, url)| {
                let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
                for ((kind, _), n) in jolokia_by_kind(&self.op.ctx.metrics.jolokia, url) {
                    *kinds.entry(kind).or_default() += n;
                }
                (b.clone(), kinds)
            })
            .collect()
    }

    /// Jolokia operations this test's operator sent to one broker of cluster c.
    fn jolokia_ops(&self, broker: &str) -> u64 {
        self.op.ctx.broker.requests_of(&self.urls[broker])
    }

    async fn create_queues(&self, names: &[String]) {
        self.create_queues_with(names, json!({})).await
    }

    /// Create queues whose spec is the default plus `extra` (merged over it).
    async fn create_queues_with(&self, names: &[String], extra: serde_json::Value) {
        stream::iter(names.iter().cloned())
            .map(|name| {
                let api = self.queues();
                let extra = extra.clone();
                async move {
                    // Non-durable: a run that fails before its cleanup leaves nothing on the
                    // brokers beyond their next restart.
                    let mut spec = json!({"clusterRef": {"name": "c"}, "durable": false});
                    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
                        s.extend(e.clone());
                    }
                    let q: ArtemisQueue = serde_json::from_value(json!({
                        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
                        "metadata": {"name": name},
                        "spec": spec
                    }))
                    .expect("queue json");
                    api.create(&PostParams::default(), &q)
                        .await
                        .unwrap_or_else(|e| panic!("create ArtemisQueue {name}: {e}"));
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<()>>()
            .await;
    }

    /// Wait until every ArtemisQueue of the namespace (there must be `count`) passes `check`.
    async fn wait_all(&self, count: usize, what: &str, check: impl Fn(&ArtemisQueue) -> bool) {
        let api = self.queues();
        let check = &check;
        wait_until(
            &format!("{count} ArtemisQueues: {what}"),
            Duration::from_secs(300),
            || {
                let api = api.clone();
                async move {
                    let list = api.list(&ListParams::default()).await.ok()?;
                    let good = list.items.iter().filter(|q| check(q)).count();
                    if list.items.len() == count && good == count {
                        return Some(());
                    }
                    // Listing a few hundred objects: not four times a second.
                    tokio::time::sleep(Duration::from_millis(750)).await;
                    None
                }
            },
        )
        .await
    }

    async fn delete_all_queues(&self, names: &[String]) {
        stream::iter(names.iter().cloned())
            .map(|name| {
                let api = self.queues();
                async move {
                    match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => panic!("delete ArtemisQueue {name}: {e}"),
                    }
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<()>>()
            .await;
        let api = self.queues();
        wait_until(
            "every ArtemisQueue deleted (finalizers released)",
            Duration::from_secs(300),
            || {
                let api = api.clone();
                async move {
                    let list = api.list(&ListParams::default()).await.ok()?;
                    if list.items.is_empty() {
                        return Some(());
                    }
                    tokio::time::sleep(Duration::from_millis(750)).await;
                    None
                }
            },
        )
        .await;
    }

    /// Audit rows of queue commands, in order: (command, object, outcome, outcome detail).
    async fn queue_audit(&self) -> Vec<AuditRow> {
        sqlx::query_as(
            "SELECT command, object_name, outcome, outcome_detail FROM audit_event WHERE command LIKE 'queue.%' ORDER BY id",
        )
        .fetch_all(self.op.store.pool())
        .await
        .expect("audit rows")
    }
}

type AuditRow = (String, String, String, Option<serde_json::Value>);

/// The nodes an audit row says were APPLIED.
fn applied_nodes(row: &AuditRow) -> Vec<String> {
    row.3
        .as_ref()
        .and_then(|d| d["appliedNodes"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// Every sample of one counter or histogram series (`name`, e.g. `api_requests_total`) of the
/// metric families `register` adds to a fresh registry, as (labels, value). Encoded text is
/// read because prometheus-client has no way to list a family's label sets (and reads a
/// histogram's count only in its own tests).
fn samples(
    register: impl FnOnce(&mut prometheus_client::registry::Registry),
    name: &str,
) -> Vec<(BTreeMap<String, String>, u64)> {
    let mut registry = prometheus_client::registry::Registry::default();
    register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode metrics");
    samples_in(&text, name)
}

/// The samples of the family `name` in a text exposition, by label set.
fn samples_in(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, u64)> {
    let head = format!("{name}{{");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&head)?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let labels = labels
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect();
            Some((labels, value.trim().parse::<f64>().ok()? as u64))
        })
        .collect()
}

/// The operator's Kubernetes API requests by (verb, kind), whatever the answer: every label set
/// of its `api_requests_total` family, so kinds nobody thought of are seen too.
fn api_requests(m: &artemis_studio_operator::telemetry::Metrics) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for (labels, n) in samples(|r| m.kube_api.register(r), "api_requests_total") {
        let key = (
            labels.get("verb").cloned().unwrap_or_default(),
            labels.get("kind").cloned().unwrap_or_default(),
        );
        *out.entry(key).or_default() += n;
    }
    out
}

/// Finished ArtemisQueue reconciles, every result.
fn queue_reconciles(m: &artemis_studio_operator::telemetry::Metrics) -> u64 {
    samples_in(&m.encode_text(), "artemis_studio_reconciles_total")
        .into_iter()
        .filter(|(labels, _)| labels.get("kind").map(String::as_str) == Some("ArtemisQueue"))
        .map(|(_, n)| n)
        .sum()
}

/// The operator's Kubernetes API requests by (verb, kind, answer class: 2xx, 4xx…).
fn api_requests_by_code(
    m: &artemis_studio_operator::telemetry::Metrics,
) -> BTreeMap<(String, String, String), u64> {
    let mut out = BTreeMap::new();
    for (labels, n) in samples(|r| m.kube_api.register(r), "api_requests_total") {
        let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
        *out.entry((label("verb"), label("kind"), label("code")))
            .or_default() += n;
    }
    out
}

/// The status patches of `kind` the API server accepted (2xx) between two snapshots.
fn accepted_status_patches(
    before: &BTreeMap<(String, String, String), u64>,
    after: &BTreeMap<(String, String, String), u64>,
    kind: &str,
) -> u64 {
    let key = ("patch".to_string(), kind.to_string(), "2xx".to_string());
    after.get(&key).copied().unwrap_or(0) - before.get(&key).copied().unwrap_or(0)
}

/// Jolokia operations to one endpoint URL by (kind, result), as an operator's metrics count them.
fn jolokia_by_kind(metrics: &JolokiaMetrics, url: &str) -> BTreeMap<(String, String), u64> {
    let node = artemis_studio_operator::broker::budget::node_key(url);
    let family = metrics.requests.clone();
    samples(
        |r| r.register("jolokia_requests", "Jolokia operations", family),
        "jolokia_requests_total",
    )
    .into_iter()
    .filter(|(labels, _)| labels.get("node") == Some(&node))
    .map(|(labels, n)| {
        (
            (
                labels.get("kind").cloned().unwrap_or_default(),
                labels.get("result").cloned().unwrap_or_default(),
            ),
            n,
        )
    })
    .collect()
}

/// The writes among API requests (every verb but get, list and watch).
fn writes_of(requests: &BTreeMap<(String, String), u64>) -> BTreeMap<(String, String), u64> {
    requests
        .iter()
        .filter(|((verb, _), _)| !matches!(verb.as_str(), "get" | "list" | "watch"))
        .map(|(k, n)| (k.clone(), *n))
        .collect()
}

/// What grew between two snapshots of `api_requests`.
fn grown(
    before: &BTreeMap<(String, String), u64>,
    after: &BTreeMap<(String, String), u64>,
) -> BTreeMap<(String, String), u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect()
}

/// The API server's own count of LIST requests for a resource (all clients, all scopes).
async fn apiserver_lists(admin: &Client, resource: &str) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let text = admin
        .request_text(request)
        .await
        .expect("GET /metrics on the API server");
    let needle = format!("resource=\"{resource}\"");
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{") && l.contains("verb=\"LIST\"") && l.contains(&needle)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
async fn converged_queues_cost_nothing_while_idle() {
    const QUEUES: usize = 200;
    let _b = brokers_shared().await;
    let s = scale_fixture("scale-idle").await;
    let tag = short_id();
    s.clean.also(&tag);
    let names: Vec<String> = (0..QUEUES).map(|i| format!("idle.{tag}.{i:03}")).collect();
    s.create_queues(&names).await;
    s.wait_all(QUEUES, "Ready=True", ready).await;

    let m = &s.op.ctx.metrics;
    let brokers: Vec<String> = s.urls.keys().cloned().collect();
    let mut failures: Vec<String> = vec![];
    // Idle windows of at least two polls each. The operator's own counters must show nothing in
    // the first one. The API server's LIST count has no per-client label and concurrent tests
    // start operators (each LISTs once): a window where it did not grow at all is looked for, up
    // to 5 windows; an operator that LISTed per poll would grow it in every window.
    let audit_at_ready = s.queue_audit().await;
    let mut server_growth = vec![];
    for window in 0..5 {
        let api0 = api_requests(m);
        let ops0: Vec<u64> = brokers.iter().map(|b| s.jolokia_ops(b)).collect();
        let passes0 = m.reconciles_of("ArtemisQueue");
        let server0 = apiserver_lists(&s.admin, "artemisqueues").await;
        let polls0 = s.polls();
        s.wait_polls(polls0 + 2).await;
        let polls = s.polls() - polls0;
        let server = apiserver_lists(&s.admin, "artemisqueues").await - server0;
        let api = grown(&api0, &api_requests(m));
        let ops: Vec<u64> = brokers
            .iter()
            .zip(&ops0)
            .map(|(b, o)| s.jolokia_ops(b) - o)
            .collect();
        let passes = m.reconciles_of("ArtemisQueue") - passes0;
        eprintln!(
            "idle window {window}: {polls} polls of cluster c; Jolokia operations per node {:?}; ArtemisQueue passes {passes}; operator API requests {api:?}; API server LIST artemisqueues (all clients) +{server}",
            brokers.iter().zip(&ops).collect::<Vec<_>>()
        );
        let lists: BTreeMap<_, _> = api.iter().filter(|((verb, _), _)| verb == "list").collect();
        if !lists.is_empty() {
            failures.push(format!(
                "window {window}: the operator sent LIST requests while {QUEUES} converged queues were idle for {polls} polls: {lists:?}"
            ));
        }
        let writes: BTreeMap<_, _> = api
            .iter()
            .filter(|((verb, _), _)| {
                matches!(
                    verb.as_str(),
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                )
            })
            .collect();
        if !writes.is_empty() {
            failures.push(format!(
                "window {window}: the operator wrote to the API (create/update/patch/delete by kind, e.g. artemisqueues/status, artemisclusters/status) while {QUEUES} converged queues were idle for {polls} polls: {writes:?}"
            ));
        }
        // One poll may be in flight at either end of the window: its operations are counted, its
        // poll not yet.
        let bound = (polls + 1) * OPS_PER_POLL;
        for (b, o) in brokers.iter().zip(&ops) {
            if *o > bound {
                failures.push(format!(
                    "window {window}: {o} Jolokia operations to {b} in {polls} polls with {QUEUES} converged queues: more than one poll's identity + inventory ({OPS_PER_POLL}) per poll (+1 poll in flight) = {bound}"
                ));
            }
        }
        server_growth.push(server);
        if server == 0 || !failures.is_empty() {
            break;
        }
    }
    if !server_growth.contains(&0) && failures.is_empty() {
        failures.push(format!(
            "the API server counted LIST artemisqueues in every idle window ({server_growth:?}), though this operator's client counted none: a LIST that bypasses the counted client, or concurrent tests in every window"
        ));
    }
    let audit = s.queue_audit().await;
    if audit.len() != audit_at_ready.len() {
        failures.push(format!(
            "{} audit rows were written while {QUEUES} converged queues were idle: {:?}",
            audit.len() - audit_at_ready.len(),
            &audit[audit_at_ready.len().min(audit.len())..]
        ));
    }
    // Exactly one queue.apply per object. A queue.repair is only allowed to complete a node the
    // apply could not reach (a scrape that timed out makes that node FAILED until the next poll):
    // every row writes something, and every (queue, node) is written exactly once.
    let applies = audit.iter().filter(|r| r.0 == "queue.apply").count();
    let repairs = audit.iter().filter(|r| r.0 == "queue.repair").count();
    let mut writes: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in &audit {
        for n in applied_nodes(r) {
            *writes.entry((r.1.clone(), n)).or_default() += 1;
        }
    }
    let no_ops: Vec<&AuditRow> = audit
        .iter()
        .filter(|r| r.2 != "succeeded" || applied_nodes(r).is_empty())
        .collect();
    let twice: Vec<_> = writes.iter().filter(|(_, n)| **n != 1).collect();
    let others: Vec<&AuditRow> = audit
        .iter()
        .filter(|r| !matches!(r.0.as_str(), "queue.apply" | "queue.repair"))
        .collect();
    eprintln!(
        "audit: {applies} queue.apply, {repairs} queue.repair (nodes a timed-out scrape kept from the apply), {} (queue, node) writes",
        writes.len()
    );
    if applies != QUEUES
        || writes.len() != QUEUES * brokers.len()
        || !no_ops.is_empty()
        || !twice.is_empty()
        || !others.is_empty()
    {
        failures.push(format!(
            "audit rows of queue commands after {QUEUES} creates: {applies} queue.apply (expected {QUEUES}), {repairs} queue.repair, {} (queue, node) pairs written (expected {}); rows that wrote nothing or did not succeed: {no_ops:?}; (queue, node) written more than once: {twice:?}; other commands: {others:?}",
            writes.len(),
            QUEUES * brokers.len()
        ));
    }

    s.delete_all_queues(&names).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn a_node_going_live_gets_every_queue_at_the_next_poll() {
    const QUEUES: usize = 30;
    let _b = brokers_exclusive().await;
    let s = scale_fixture("scale-late").await;
    // c3's node ID, known to the operator before it stops: a stopped endpoint is named by it.
    let c3_url = s.urls["c3"].clone();
    let cluster = s.wait_live_nodes(3).await;
    let c3_node = cluster
        .status
        .as_ref()
        .and_then(|st| {
            st.nodes
                .iter()
                .find(|n| n.active_endpoint.as_deref() == Some(c3_url.as_str()))
        })
        .map(|n| n.node_id.clone())
        .expect("c3's logical node in the cluster status");

    struct Start<'a> {
        bed: &'a TestBed,
        armed: bool,
    }
    impl Drop for Start<'_> {
        fn drop(&mut self) {
            if self.armed {
                self.bed.broker_action("start", "c3");
            }
        }
    }
    s.bed.broker_action("stop", "c3");
    let mut start = Start {
        bed: &s.bed,
        armed: true,
    };
    s.wait_live_nodes(2).await;

    let tag = short_id();
    s.clean.also(&tag);
    let names: Vec<String> = (0..QUEUES).map(|i| format!("late.{tag}.{i:02}")).collect();
    s.create_queues(&names).await;
    s.wait_all(
        QUEUES,
        "2 nodes in the requested state + c3 SKIPPED_NOT_LIVE",
        |q| {
            let os = outcomes(q);
            os.len() == 3
                && os
                    .iter()
                    .filter(|o| matches!(o, Outcome::Applied | Outcome::Already))
                    .count()
                    == 2
                && q.status.as_ref().is_some_and(|st| {
                    st.nodes
                        .iter()
                        .any(|n| n.node == c3_node && n.outcome == Outcome::SkippedNotLive)
                })
        },
    )
    .await;
    let last_audit: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM audit_event")
        .fetch_one(s.op.store.pool())
        .await
        .expect("last audit id");

    let ops0 = s.jolokia_ops("c3");
    let kinds0 = jolokia_by_kind(&s.op.ctx.metrics.jolokia, &c3_url);
    let passes0 = s.op.ctx.metrics.reconciles_of("ArtemisQueue");
    let polls0 = s.polls();
    s.bed.broker_action("start", "c3");
    start.armed = false;
    s.wait_all(QUEUES, "Ready with all three nodes APPLIED/ALREADY", |q| {
        let os = outcomes(q);
        ready(q)
            && os.len() == 3
            && os
                .iter()
                .all(|o| matches!(o, Outcome::Applied | Outcome::Already))
    })
    .await;
    let polls = s.polls() - polls0;
    let ops = s.jolokia_ops("c3") - ops0;
    let passes = s.op.ctx.metrics.reconciles_of("ArtemisQueue") - passes0;
    let kinds = grown(&kinds0, &jolokia_by_kind(&s.op.ctx.metrics.jolokia, &c3_url));
    let ok = |kind: &str| {
        kinds
            .get(&(kind.to_string(), "ok".to_string()))
            .copied()
            .unwrap_or(0)
    };
    let (creates, addresses) = (ok("createQueue"), ok("createAddress"));
    let rows: Vec<AuditRow> = sqlx::query_as(
        "SELECT command, object_name, outcome, outcome_detail FROM audit_event WHERE id > $1 AND command LIKE 'queue.%' ORDER BY id",
    )
    .bind(last_audit)
    .fetch_all(s.op.store.pool())
    .await
    .expect("audit rows");
    eprintln!(
        "c3 back: {polls} polls of cluster c and {passes} ArtemisQueue passes until all {QUEUES} queues converged; {ops} Jolokia operations to c3, by (kind, result): {kinds:?}; {} queue audit rows",
        rows.len()
    );

    let mut failures: Vec<String> = vec![];
    // Polls while c3 was still starting cost at most the failed search; the bound counts every
    // poll as a full one with a broker-name search, plus one poll in flight.
    let bound = (polls + 1) * (OPS_PER_POLL + CONNECT_OPS) + QUEUES as u64 * CREATE_OPS_PER_QUEUE + WATCH_OPS;
    if ops > bound {
        // What the excess is made of: every poll of c3 that got an answer sent one
        // listNetworkTopology (identity) with 4 reads, and at most one scrape with 2 reads; a
        // create reads nothing. Reads beyond those re-read queues.
        let of_kind =
            |kind: &str| -> u64 { kinds.iter().filter(|((k, _), _)| k == kind).map(|(_, n)| n).sum() };
        let identities = of_kind("listNetworkTopology");
        let extra_reads = of_kind("read").saturating_sub(identities * 6);
        failures.push(format!(
            "{ops} Jolokia operations to c3 from its start to all {QUEUES} queues converged, over {polls} polls and {passes} ArtemisQueue passes (by kind and result: {kinds:?}): more than (polls + 1) x {} (one identity + inventory scrape per poll, not per queue) + {QUEUES} x {CREATE_OPS_PER_QUEUE} (each queue's createAddress + createQueue, no read) = {bound}. At least {extra_reads} reads beyond {identities} polls' identity + scrape reads: fresh reads of queues",
            OPS_PER_POLL + CONNECT_OPS
        ));
    }
    let watch = creates.saturating_sub(QUEUES as u64);
    if creates < QUEUES as u64 || watch > WATCH_OPS || addresses > QUEUES as u64 {
        failures.push(format!(
            "c3 received {creates} createQueue and {addresses} createAddress operations for {QUEUES} missing queues: expected exactly {QUEUES} createQueue (one each, none re-sent) besides at most {WATCH_OPS} for its divert watch, and at most {QUEUES} createAddress"
        ));
    }
    let objects: BTreeSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    let only_c3 = |detail: &serde_json::Value| {
        detail["nodes"].as_array().is_some_and(|ns| {
            ns.len() == 1 && ns[0]["node"] == json!(c3_node) && ns[0]["outcome"] == "APPLIED"
        }) && detail["appliedNodes"] == json!([c3_node])
    };
    let bad: Vec<_> = rows
        .iter()
        .filter(|r| {
            !matches!(r.0.as_str(), "queue.apply" | "queue.repair")
                || r.2 != "succeeded"
                || !r.3.as_ref().is_some_and(only_c3)
        })
        .collect();
    if rows.len() != QUEUES || objects.len() != QUEUES || !bad.is_empty() {
        failures.push(format!(
            "audit rows after c3 came back: {} rows for {} objects (expected exactly one succeeded queue.apply/queue.repair per queue, {QUEUES}, each naming only c3 ({c3_node}) as APPLIED); offending rows: {bad:?}",
            rows.len(),
            objects.len()
        ));
    }

    s.delete_all_queues(&names).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What grew per broker, by kind, between two `ops_by_kind` snapshots.
fn ops_grown(
    before: &BTreeMap<String, BTreeMap<String, u64>>,
    after: &BTreeMap<String, BTreeMap<String, u64>>,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    after
        .iter()
        .map(|(b, kinds)| {
            let was = before.get(b).cloned().unwrap_or_default();
            let grown = kinds
                .iter()
                .map(|(k, n)| (k.clone(), n - was.get(k).copied().unwrap_or(0)))
                .filter(|(_, d)| *d > 0)
                .collect();
            (b.clone(), grown)
        })
        .collect()
}

fn generation_ready(generation: i64) -> impl Fn(&ArtemisQueue) -> bool {
    move |q| {
        q.metadata.generation == Some(generation)
            && q.status.as_ref().and_then(|s| s.observed_generation) == Some(generation)
            && ready(q)
    }
}

/// Issues 23 and 45: the broker's own answer is the evidence, and every operation costs what a
/// create costs. A create is one call per node and no read (its address created by the same
/// POST, or by the queue itself where the spec removes an emptied address anyway); an update
/// reads the queue it overlays and writes (ADR-0049), its answer the evidence (at most 2 per
/// node); a delete reads its queue and writes, and the deletes in flight on a node share one
/// read of its diverts per POST (the ADR-0084 preflight). Counted with no poll in the windows (polls made hourly, and the poll
/// count unchanged is the evidence), so every operation is a command's.
#[tokio::test]
async fn a_create_is_one_write_per_node_an_update_reads_and_writes_a_delete_shares_its_preflight() {
    const QUEUES: usize = 12;
    let _b = brokers_shared().await;
    let s = scale_fixture("scale-cost").await;
    s.poll_hourly().await;
    let tag = short_id();
    s.clean.also(&tag);
    let kept: Vec<String> = (0..QUEUES).map(|i| format!("cost.{tag}.kept.{i:02}")).collect();
    let removed: Vec<String> = (0..QUEUES).map(|i| format!("cost.{tag}.rm.{i:02}")).collect();
    let polls = s.polls();
    let before = s.ops_by_kind();
    let api_before = api_requests(&s.op.ctx.metrics);
    let api_before_by_code = api_requests_by_code(&s.op.ctx.metrics);
    let reconciles_before = queue_reconciles(&s.op.ctx.metrics);
    s.create_queues(&kept).await;
    // Durable: these get a filter change, and Artemis 2.40 journals an updated non-durable
    // queue's binding that destroyQueue leaves, so the queue comes back at the broker's next
    // restart (README, "What delete does"): non-durable, they outlived their cleanup.
    s.create_queues_with(
        &removed,
        json!({"deletion": {"removeEmptyAddress": true}, "durable": true}),
    )
    .await;
    s.wait_all(2 * QUEUES, "Ready=True", ready).await;
    let created = ops_grown(&before, &s.ops_by_kind());
    let mut failures: Vec<String> = vec![];
    let q = QUEUES as u64;
    // Two API writes per created object (issue 45): its finalizer and its status — no Event
    // (its status and audit row say it was created), no first status (the CRD's default status
    // says "not yet observed" until the pass's, issue 50). The cluster's own status (the
    // managementWrite evidence) is the cluster's, not the objects'.
    let api_writes = s.queue_api_writes(&api_before).await;
    let n = 2 * q;
    let status_kind = "artemisqueues/status".to_string();
    let landed = accepted_status_patches(
        &api_before_by_code,
        &api_requests_by_code(&s.op.ctx.metrics),
        &status_kind,
    );
    let finalizers = api_writes.get(&("patch".to_string(), "artemisqueues".to_string()));
    let statuses = api_writes
        .get(&("patch".to_string(), status_kind))
        .copied()
        .unwrap_or(0);
    let others = api_writes
        .keys()
        .filter(|(verb, kind)| verb != "patch" || !kind.starts_with("artemisqueues"))
        .count();
    if finalizers != Some(&n) || others > 0 || landed != n || statuses != n {
        failures.push(format!(
            "creating {n} queues wrote {api_writes:?} to the API ({landed} status writes accepted); expected one finalizer patch and one status write per object, no Event"
        ));
    }
    // One reconcile per create: the finalizer and the first pass are one reconcile (issue 45),
    // and the finalizer's own watch event queues no second one.
    let reconciles = queue_reconciles(&s.op.ctx.metrics) - reconciles_before;
    if reconciles != n {
        failures.push(format!(
            "creating {n} queues took {reconciles} reconciles; expected one each"
        ));
    }
    let expected_create: BTreeMap<String, u64> = [
        ("createAddress".to_string(), q),
        ("createQueue".to_string(), 2 * q),
    ]
    .into();
    for (b, kinds) in &created {
        if kinds != &expected_create {
            failures.push(format!(
                "{b}: creating {QUEUES} queues on new addresses the spec keeps and {QUEUES} whose spec removes an emptied address sent {kinds:?}; expected only {expected_create:?} (one createQueue each, one createAddress for each kept address, no read before or after)"
            ));
        }
    }

    // An update: read (ADR-0049: overlay on what the broker holds), write; the answer verifies.
    let before = s.ops_by_kind();
    let api_before = api_requests(&s.op.ctx.metrics);
    for name in &removed {
        s.queues()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"filter": "cost = 1"}})),
            )
            .await
            .expect("change the filter");
    }
    s.wait_all(2 * QUEUES, "the filter change Ready", |x| {
        x.spec.filter.is_none() || generation_ready(2)(x)
    })
    .await;
    let updated = ops_grown(&before, &s.ops_by_kind());
    // A change to a queue that exists is told by an Event on its object, besides its status.
    let events = s
        .queue_api_writes(&api_before)
        .await
        .get(&("create".to_string(), "events".to_string()))
        .copied()
        .unwrap_or(0);
    if events < q {
        failures.push(format!(
            "updating the filter of {QUEUES} queues created {events} Events; expected one per queue"
        ));
    }
    for (b, kinds) in &updated {
        let reads = kinds.get("read").copied().unwrap_or(0);
        let others: BTreeMap<&String, &u64> = kinds
            .iter()
            .filter(|(k, _)| *k != "read" && *k != "updateQueue")
            .collect();
        if kinds.get("updateQueue") != Some(&q) || reads != q || !others.is_empty() {
            failures.push(format!(
                "{b}: updating the filter of {QUEUES} queues sent {kinds:?}; expected {QUEUES} updateQueue and {QUEUES} reads (the queue it overlays; the answer is the evidence), nothing else"
            ));
        }
    }

    // A delete: the preflight's fresh read, then the write (and the emptied address).
    let before = s.ops_by_kind();
    let posts_before: BTreeMap<String, u64> = s
        .urls
        .iter()
        .map(|(b, url)| (b.clone(), s.op.ctx.broker.posts_of(url)))
        .collect();
    let all: Vec<String> = kept.iter().chain(&removed).cloned().collect();
    s.delete_all_queues(&all).await;
    let deleted = ops_grown(&before, &s.ops_by_kind());
    for (b, kinds) in &deleted {
        let writes: BTreeMap<&String, &u64> = kinds
            .iter()
            .filter(|(k, _)| *k != "read" && *k != "search")
            .collect();
        let expected: BTreeMap<String, u64> = [
            ("destroyQueue".to_string(), 2 * q),
            ("deleteAddress".to_string(), q),
        ]
        .into();
        let writes_ok = writes
            .iter()
            .map(|(k, n)| ((*k).clone(), **n))
            .collect::<BTreeMap<_, _>>()
            == expected;
        // Each delete reads its queue; the divert list is one read per POST, shared.
        let posts = s.op.ctx.broker.posts_of(&s.urls[b]) - posts_before[b];
        let reads = kinds.get("read").copied().unwrap_or(0);
        if !writes_ok || reads < 2 * q || reads > 2 * q + posts.min(2 * q - 1) {
            failures.push(format!(
                "{b}: deleting {} queues in {posts} POSTs sent {kinds:?}; expected exactly {expected:?}, one read of each queue, and fewer reads of the node's diverts than deletes (one per POST at most)",
                2 * QUEUES
            ));
        }
    }
    if s.polls() != polls {
        failures.push(format!(
            "cluster c was polled {} times during the counted windows: the counts above include a poll's reads (rerun; the test makes polls hourly)",
            s.polls() - polls
        ));
    }
    eprintln!("create {created:?}\nupdate {updated:?}\ndelete {deleted:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 45: where the API server serves MutatingAdmissionPolicy, the chart's finalizer policy
/// stores each queue with the operator's finalizer from its create on, so the operator's only
/// API write for a create is its status (elsewhere a finalizer patch comes first, as the test
/// above counts). A delete still goes through the finalizer: the queue leaves every node, one
/// audit row per command, none pending. A namespace the release does not watch is left alone.
#[tokio::test]
async fn a_queue_admitted_with_its_finalizer_costs_one_api_write_and_deletes_through_it() {
    const QUEUES: usize = 12;
    let _b = brokers_shared().await;
    let s = scale_fixture("scale-admitted").await;
    // No poll in the counted window: the brokers are shared, and another test's queues moving
    // a node's counts make a poll wake this namespace's queues (the cost test does the same).
    s.poll_hourly().await;
    let elsewhere = s.bed.fresh_namespace("scale-unwatched").await;
    let release = s.ns.clone();
    s.bed.install_finalizer_policy(&release, &[&s.ns]).await;
    let tag = short_id();
    s.clean.also(&tag);
    let names: Vec<String> = (0..QUEUES).map(|i| format!("admitted.{tag}.{i:02}")).collect();
    let api_before = api_requests(&s.op.ctx.metrics);
    let reconciles_before = queue_reconciles(&s.op.ctx.metrics);
    s.create_queues(&names).await;
    s.wait_all(QUEUES, "Ready=True", ready).await;
    let mut failures: Vec<String> = vec![];
    let api_writes = s.queue_api_writes(&api_before).await;
    let q = QUEUES as u64;
    let expected: BTreeMap<(String, String), u64> =
        [(("patch".to_string(), "artemisqueues/status".to_string()), q)].into();
    if api_writes != expected {
        failures.push(format!(
            "creating {QUEUES} queues admitted with their finalizer wrote {api_writes:?} to the API; expected {expected:?} (its status only: no finalizer patch)"
        ));
    }
    let reconciles = queue_reconciles(&s.op.ctx.metrics) - reconciles_before;
    if reconciles != q {
        failures.push(format!(
            "creating {QUEUES} queues took {reconciles} reconciles; expected one each"
        ));
    }
    for broker in s.urls.keys() {
        let held = held_by(&s.bed, broker).await;
        let missing: Vec<&String> = names.iter().filter(|n| !held.contains(*n)).collect();
        if !missing.is_empty() {
            failures.push(format!("{broker} lacks {missing:?} while every object is Ready"));
        }
    }
    // The unwatched namespace: stored as created, no finalizer that nobody would release.
    let other: Api<ArtemisQueue> = Api::namespaced(s.admin.clone(), &elsewhere);
    let probe: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": format!("unwatched.{tag}")},
        "spec": {"clusterRef": {"name": "c"}}
    }))
    .expect("queue json");
    let stored = other
        .create(&PostParams::default(), &probe)
        .await
        .expect("create in the unwatched namespace");
    if stored.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty()) {
        failures.push(format!(
            "a queue in {elsewhere}, which the release does not watch, was stored with finalizers {:?}",
            stored.metadata.finalizers
        ));
    }
    let _ = other
        .delete(&format!("unwatched.{tag}"), &DeleteParams::default())
        .await;

    s.delete_all_queues(&names).await;
    for broker in s.urls.keys() {
        let held = held_by(&s.bed, broker).await;
        let left: Vec<&String> = names.iter().filter(|n| held.contains(*n)).collect();
        if !left.is_empty() {
            failures.push(format!(
                "{broker} still holds {left:?} after their objects were deleted"
            ));
        }
    }
    let rows = s.queue_audit().await;
    let ours = |c: &str| rows.iter().filter(|r| r.0 == c && names.contains(&r.1)).count();
    let pending = rows
        .iter()
        .filter(|r| names.contains(&r.1) && r.2 == "pending")
        .count();
    if ours("queue.apply") != QUEUES || ours("queue.delete") != QUEUES || pending > 0 {
        failures.push(format!(
            "audit rows: {} queue.apply, {} queue.delete, {pending} pending; expected {QUEUES}, {QUEUES} and none",
            ours("queue.apply"),
            ours("queue.delete")
        ));
    }
    s.bed.remove_finalizer_policy(&release).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The queue names a broker holds now, read from the broker itself.
async fn held_by(bed: &TestBed, broker: &str) -> BTreeSet<String> {
    crate::support::queue_names(bed, &bed.broker(broker))
        .await
        .unwrap_or_default()
}

/// Issue 23: an operator restart with converged queues sends no broker write, writes no audit
/// row, and writes no status (nor anything else) to the API — after every queue was reconciled
/// by the new process, following its first poll (the positive evidence).
#[tokio::test]
async fn a_restart_with_converged_queues_writes_nothing() {
    const QUEUES: usize = 150;
    let _b = brokers_shared().await;
    let mut s = scale_fixture("scale-restart").await;
    let tag = short_id();
    s.clean.also(&tag);
    let names: Vec<String> = (0..QUEUES).map(|i| format!("restart.{tag}.{i:03}")).collect();
    s.create_queues(&names).await;
    s.wait_all(QUEUES, "Ready=True", ready).await;
    let audit = s.queue_audit().await.len();

    let (db, instance) = (s.op.db.clone(), s.op.ctx.instance_id.clone());
    s.op.stop();
    // The restarted operator counts its own traffic from nothing (its registry is new).
    s.op = s.bed.start_operator_on(&[s.ns.as_str()], &db, &instance).await;
    // Every queue judged against the new process's snapshot (which only its polls make), then
    // one more poll.
    wait_until(
        &format!("{QUEUES} ArtemisQueue passes planned by the restarted operator"),
        Duration::from_secs(120),
        || async { (s.op.ctx.metrics.planned_of("ArtemisQueue") >= QUEUES as u64).then_some(()) },
    )
    .await;
    s.wait_polls(s.polls() + 1).await;
    let mut failures: Vec<String> = vec![];
    s.op.ctx.events.settled().await;
    let writes = writes_of(&api_requests(&s.op.ctx.metrics));
    if !writes.is_empty() {
        failures.push(format!(
            "the restarted operator wrote to the API with {QUEUES} converged queues: {writes:?} (by verb and kind; status writes are patch artemisqueues/status)"
        ));
    }
    for (b, kinds) in s.ops_by_kind() {
        let broker_writes: BTreeMap<&String, &u64> = kinds
            .iter()
            .filter(|(k, _)| !(matches!(k.as_str(), "read" | "search") || k.starts_with("list")))
            .collect();
        if !broker_writes.is_empty() {
            failures.push(format!("the restarted operator sent {broker_writes:?} to {b}"));
        }
    }
    let audit_after = s.queue_audit().await.len();
    if audit_after != audit {
        failures.push(format!("the restart wrote {} audit rows", audit_after - audit));
    }
    s.delete_all_queues(&names).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 23: a burst of applies — every object gets its first reconcile and is `Ready` within a
/// bound that follows the burst's size, none waiting behind newer ones without end: from each
/// object's creation to its `Ready` transition, none takes longer than the whole burst needed to
/// be applied plus a margin; each object got exactly one queue.apply.
#[tokio::test]
async fn a_burst_of_applies_reaches_every_object_none_starves() {
    const QUEUES: usize = 600;
    let _b = brokers_shared().await;
    let s = scale_fixture("scale-burst").await;
    let tag = short_id();
    s.clean.also(&tag);
    let names: Vec<String> = (0..QUEUES).map(|i| format!("burst.{tag}.{i:04}")).collect();
    let started = chrono::Utc::now();
    s.create_queues(&names).await;
    let applied = chrono::Utc::now() - started;
    s.wait_all(QUEUES, "Ready=True", ready).await;
    let list = s.queues().list(&ListParams::default()).await.expect("list");
    let mut waits: Vec<(i64, String)> = list
        .items
        .iter()
        .filter_map(|q| {
            let created = q.metadata.creation_timestamp.as_ref()?.0.as_second();
            let ready_at = q
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")?
                .last_transition_time
                .0
                .as_second();
            Some((ready_at - created, q.metadata.name.clone().unwrap_or_default()))
        })
        .collect();
    waits.sort();
    let longest = waits.last().cloned().unwrap_or_default();
    // The whole burst took `applied` to reach the API server; an object may wait for every
    // object ahead of it, never for ever: the applying time plus 60 s (seconds resolution,
    // a poll, a slow bed).
    let bound = applied.num_seconds() + 60;
    let audit = s.queue_audit().await;
    let mut applies: BTreeMap<&str, usize> = BTreeMap::new();
    for r in audit.iter().filter(|r| r.0 == "queue.apply") {
        *applies.entry(r.1.as_str()).or_default() += 1;
    }
    let not_once: Vec<&String> = names
        .iter()
        .filter(|n| applies.get(n.as_str()) != Some(&1))
        .collect();
    eprintln!(
        "burst of {QUEUES}: applied in {} s; creation → Ready: median {} s, longest {} s ({})",
        applied.num_seconds(),
        waits.get(waits.len() / 2).map_or(0, |w| w.0),
        longest.0,
        longest.1
    );
    s.delete_all_queues(&names).await;
    assert_eq!(waits.len(), QUEUES, "every object has a Ready transition time");
    assert!(
        longest.0 <= bound,
        "{} waited {} s from creation to Ready, more than the burst's applying time + 60 s = {bound} s",
        longest.1,
        longest.0
    );
    assert!(
        not_once.is_empty(),
        "objects without exactly one queue.apply: {not_once:?}"
    );
}

/// Issue 23: a create planned from a snapshot that predates a queue made behind the operator's
/// back is sent, answered "already exists" (AMQ229019), and that answer is the signal to read the
/// queue and judge it: ALREADY where it matches, an update where it does not — one audited
/// command, no queue destroyed, the messages kept.
#[tokio::test]
async fn a_create_answered_already_exists_reads_the_queue_and_judges_it() {
    let _b = brokers_shared().await;
    let s = scale_fixture("scale-exists").await;
    s.poll_hourly().await;
    let tag = short_id();
    s.clean.also(&tag);
    let (same, other) = (format!("exists.{tag}.same"), format!("exists.{tag}.filtered"));
    // Behind the operator's back, on the bed's plain URLs (not counted as this operator's).
    let user = s.bed.broker_user();
    for b in s.bed.cluster_brokers("c") {
        let http = artemis_studio_operator::broker::jolokia::http_client(
            &artemis_studio_operator::broker::Registry::standalone(),
            None,
        )
        .expect("http");
        let client = artemis_studio_operator::broker::JolokiaClient::new(
            http,
            b.jolokia.clone(),
            None,
            artemis_studio_operator::broker::Credentials {
                username: user.0.clone(),
                password: user.1.clone(),
            },
            Duration::from_secs(10),
        );
        let m = artemis_studio_operator::broker::BrokerManagement::connect(client)
            .await
            .expect("connect");
        for (name, filter) in [(&same, None), (&other, Some("old = 1"))] {
            // Durable, as the objects below: the filtered one gets an update (see the cost test).
            let mut q = json!({"name": name, "address": name, "routing-type": "ANYCAST", "durable": true, "auto-create-address": true});
            if let Some(f) = filter {
                q["filter-string"] = json!(f);
            }
            m.create_queue(&q)
                .await
                .expect("create behind the operator's back");
        }
    }
    let before = s.ops_by_kind();
    s.create_queues_with(std::slice::from_ref(&same), json!({"durable": true}))
        .await;
    s.create_queues_with(
        std::slice::from_ref(&other),
        json!({"filter": "new = 1", "durable": true}),
    )
    .await;
    s.wait_all(2, "Ready=True", ready).await;
    let grown = ops_grown(&before, &s.ops_by_kind());
    let list = s.queues().list(&ListParams::default()).await.expect("list");
    let q_same = list
        .items
        .iter()
        .find(|q| q.metadata.name.as_deref() == Some(same.as_str()))
        .expect("same");
    let q_other = list
        .items
        .iter()
        .find(|q| q.metadata.name.as_deref() == Some(other.as_str()))
        .expect("other");
    let audit = s.queue_audit().await;
    s.delete_all_queues(&[same.clone(), other.clone()]).await;
    assert!(
        outcomes(q_same).iter().all(|o| *o == Outcome::Already),
        "a matching queue made behind the operator's back is ALREADY: {:?}",
        outcomes(q_same)
    );
    assert!(
        outcomes(q_other).iter().all(|o| *o == Outcome::Applied),
        "a differing one is updated: {:?}",
        outcomes(q_other)
    );
    for (b, kinds) in &grown {
        assert_eq!(
            kinds.get("createQueue"),
            Some(&2),
            "{b}: one create each, answered 'already exists': {kinds:?}"
        );
        assert_eq!(
            kinds.get("updateQueue"),
            Some(&1),
            "{b}: the differing queue updated once: {kinds:?}"
        );
        assert!(
            !kinds.contains_key("destroyQueue"),
            "{b}: nothing destroyed: {kinds:?}"
        );
    }
    let rows: Vec<&AuditRow> = audit.iter().filter(|r| r.1 == same || r.1 == other).collect();
    assert_eq!(rows.len(), 2, "one audited command per object: {rows:?}");
}

/// Issue 45: inventory by change. A converged poll reads each node's counts and one page of its
/// queues, not its whole inventory, while the counts match what the operator knows; a setting
/// changed behind the operator's back on an existing queue (which moves no count) is found by
/// the pages (every poll, at 30 queues) or at the latest by the next full read, within
/// `spec.fullReadIntervalSeconds` (20 s here) and a poll. Concurrent tests change the shared
/// brokers' counts (each such poll reads in full), so the evidence looked for is a read by
/// change on every node, within two minutes.
#[tokio::test]
async fn a_converged_poll_reads_counts_and_drift_is_found_at_the_next_full_read() {
    const QUEUES: usize = 30;
    let _b = brokers_shared().await;
    let s = scale_fixture("scale-bychange").await;
    s.cluster()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"fullReadIntervalSeconds": 20}})),
        )
        .await
        .expect("a short full-read interval");
    let tag = short_id();
    s.clean.also(&tag);
    let names: Vec<String> = (0..QUEUES).map(|i| format!("bychange.{tag}.{i:02}")).collect();
    s.create_queues_with(&names, json!({"filter": "a = 1"})).await;
    s.wait_all(QUEUES, "Ready=True", ready).await;

    let reads = |s: &Scale| -> BTreeMap<String, (u64, u64)> {
        s.urls
            .iter()
            .map(|(b, url)| {
                let node = artemis_studio_operator::broker::budget::node_key(url);
                (b.clone(), s.op.ctx.metrics.jolokia.inventory_reads_of(&node))
            })
            .collect()
    };
    let start = reads(&s);
    wait_until(
        "a poll of every node that read it by change (its counts and a page), not in full",
        Duration::from_secs(120),
        || {
            let by_change = reads(&s).iter().all(|(b, (_, by))| *by > start[b].1);
            async move {
                if !by_change {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                by_change.then_some(())
            }
        },
    )
    .await;

    // Behind the operator's back: the filter of one queue on c2 (no count moves).
    let drifted = &names[7];
    let access = s.bed.access("c", s.bed.broker_user());
    let c2_url = s.bed.broker("c2").jolokia;
    let topology = artemis_studio_operator::topology::poll(&access, &Default::default()).await;
    let c2 = topology
        .nodes
        .iter()
        .filter_map(|n| n.active.clone())
        .find(|m| m.client().url() == c2_url)
        .expect("c2 live");
    let rows_before = s.queue_audit().await.len();
    let changed_at = std::time::Instant::now();
    c2.update_queue(
        &json!({"name": drifted, "address": drifted, "routing-type": "ANYCAST", "filter-string": "a = 2"}),
    )
    .await
    .expect("change the filter behind the operator's back");
    wait_until(
        &format!("{drifted}'s filter on c2 put back by the operator"),
        Duration::from_secs(20 + 30),
        || {
            let access = access.clone();
            let drifted = drifted.clone();
            let c2_url = c2_url.clone();
            async move {
                let t = artemis_studio_operator::topology::poll(&access, &Default::default()).await;
                let back = t.nodes.iter().any(|n| {
                    n.active.as_ref().is_some_and(|m| m.client().url() == c2_url)
                        && n.inventory.as_ref().is_some_and(|i| {
                            i.queues.get(&drifted).and_then(|q| q.filter.as_deref()) == Some("a = 1")
                        })
                });
                if !back {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                back.then_some(())
            }
        },
    )
    .await;
    eprintln!(
        "drift on c2 repaired {:.1} s after it was made (full-read interval 20 s)",
        changed_at.elapsed().as_secs_f64()
    );
    let rows: Vec<AuditRow> = s.queue_audit().await.into_iter().skip(rows_before).collect();
    assert!(
        rows.len() == 1 && &rows[0].1 == drifted && applied_nodes(&rows[0]).len() == 1,
        "one command since the drift, the drifted queue's on c2: {rows:?}"
    );
    s.delete_all_queues(&names).await;
}
