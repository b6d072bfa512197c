//! Issue 26, upgrade in place: the operator and CRDs of the commit in `deploy/dev/upgrade-from`
//! converge queues, a divert, a capture subscription and a finished ConnectionClose; then they
//! are stopped as a Deployment stops its pod (SIGTERM), the current CRDs are applied and the
//! binary under test starts on the same namespace and database. Once it has looked at every
//! object (positive evidence: its own log names each queue and divert it judged, its /metrics
//! count each kind's reconciles and its capture passes, and its drains run), nothing was
//! re-created (same uids, same broker queue IDs, no broker write at all), no audit row was
//! written, no object was written (same resourceVersion, same status — but for each queue's
//! delete preview of the message cap, whose default issue 41 changed), the taps still drain
//! and no message is stored twice.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::FutureExt;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use artemis_studio_operator::api::ArtemisCluster;
use artemis_studio_operator::api::capture::ArtemisCaptureSubscription;
use artemis_studio_operator::api::capture_names::TapName;
use artemis_studio_operator::api::connection_close::ConnectionClose;
use artemis_studio_operator::api::divert::ArtemisDivert;
use artemis_studio_operator::api::queue::ArtemisQueue;

use crate::capture::{amqp_send, divert_names};
use crate::leader::free_port;
use crate::support::{
    OperatorProcess, TestBed, amqp_consumer, apply_manifests, brokers_exclusive, brokers_shared,
    connection_of, create_cluster, jolokia_raw, metrics, send_messages, short_id, wait_ready, wait_until,
};

const ORIGIN: Option<&str> = Some("http://localhost");
const SUBSCRIPTION: &str = "tap";
/// The objects' names (every object of the test: `objects`); the queues and the divert are the
/// ones the new process's log names (`judged`).
const QUEUES: [&str; 3] = ["a", "b", "src"];
const DIVERT: &str = "d";
const CLOSE: &str = "close";

fn resource_of(kind: &str) -> ApiResource {
    match kind {
        "ArtemisCluster" => ApiResource::erase::<ArtemisCluster>(&()),
        "ArtemisQueue" => ApiResource::erase::<ArtemisQueue>(&()),
        "ArtemisDivert" => ApiResource::erase::<ArtemisDivert>(&()),
        "ArtemisCaptureSubscription" => ApiResource::erase::<ArtemisCaptureSubscription>(&()),
        "ConnectionClose" => ApiResource::erase::<ConnectionClose>(&()),
        other => panic!("no such kind in this test: {other}"),
    }
}

fn objects() -> Vec<(&'static str, &'static str)> {
    let mut v = vec![("ArtemisCluster", "c")];
    v.extend(QUEUES.iter().map(|q| ("ArtemisQueue", *q)));
    v.push(("ArtemisDivert", DIVERT));
    v.push(("ArtemisCaptureSubscription", SUBSCRIPTION));
    v.push(("ConnectionClose", CLOSE));
    v
}

/// One object as the comparison sees it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    uid: String,
    resource_version: String,
    /// `status` with every `observedGeneration` taken out (the top-level one and each
    /// condition's): the one field the issue lets an upgrade change. The comparison also lets
    /// fields the new CRDs add appear (`without_new_fields`). Nothing else is taken out: a
    /// status write of the same content still shows in `resource_version`, and a timestamp
    /// (lastTransitionTime, lastPollTime, deletePreview.readAt, completedAt, armed.at) that
    /// moved is a write the new process made without cause.
    status: Value,
}

fn without_observed_generation(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "observedGeneration")
                .map(|(k, v)| (k.clone(), without_observed_generation(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_observed_generation).collect()),
        other => other.clone(),
    }
}

/// `after` without the fields `before` lacks that the previous commit's CRDs do not declare:
/// what the new CRDs add shows up with its default (the API server defaults a field on read,
/// and the new binary's next status write carries it) without anything having changed. Every
/// other difference stays.
/// A queue's status without its delete preview, which must state the new cap. Issue 41 moved
/// the default cap on the messages a delete may destroy from 10,000 to 0 (`messageLossCap`):
/// every preview states the cap, so an upgrade across that change rewrites each queue's preview
/// once, read again (its counts and kept diverts as of that read), and only there (the README's
/// Upgrading section says so).
fn without_message_cap(status: &Value) -> Value {
    let mut s = status.clone();
    if let Some(o) = s.as_object_mut() {
        o.remove("deletePreview");
    }
    s
}

/// The cap a queue's delete preview states (`bulkCap`), if it has a preview.
fn previewed_cap(status: &Value) -> Option<u64> {
    status.get("deletePreview")?.get("bulkCap")?.as_u64()
}

fn without_new_fields(after: &Value, before: &Value, old_crds: &str) -> Value {
    match (after, before) {
        (Value::Object(a), Value::Object(b)) => Value::Object(
            a.iter()
                .filter(|(k, _)| b.contains_key(*k) || old_crds.contains(&format!(" {k}:")))
                .map(|(k, v)| {
                    let v = match b.get(k) {
                        Some(bv) => without_new_fields(v, bv, old_crds),
                        None => v.clone(),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => Value::Array(
            a.iter()
                .zip(b)
                .map(|(x, y)| without_new_fields(x, y, old_crds))
                .collect(),
        ),
        (a, _) => a.clone(),
    }
}

async fn snapshot(client: &Client, ns: &str) -> BTreeMap<String, Seen> {
    let mut out = BTreeMap::new();
    for (kind, name) in objects() {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource_of(kind));
        let o = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get {kind} {name}: {e}"));
        out.insert(
            format!("{kind}/{name}"),
            Seen {
                uid: o.metadata.uid.clone().expect("uid"),
                resource_version: o.metadata.resource_version.clone().expect("resourceVersion"),
                status: without_observed_generation(o.data.get("status").unwrap_or(&Value::Null)),
            },
        );
    }
    out
}

fn condition_true(status: &Value, type_: &str) -> bool {
    status["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

/// Every object converged: Ready (the close: Completed), the subscription draining on all 3
/// nodes with `captured` copies counted.
fn converged(s: &BTreeMap<String, Seen>, captured: u64) -> Result<(), String> {
    for (key, seen) in s {
        let st = &seen.status;
        let ok = match key.split('/').next() {
            Some("ConnectionClose") => st["phase"] == "Completed",
            Some("ArtemisCaptureSubscription") => {
                condition_true(st, "Ready")
                    && st["taps"]
                        .as_array()
                        .is_some_and(|t| t.len() == 3 && t.iter().all(|t| t["state"] == "HEALTHY"))
                    && st["captured"] == captured
            }
            _ => condition_true(st, "Ready"),
        };
        if !ok {
            return Err(format!("{key} not converged: {st}"));
        }
    }
    Ok(())
}

/// Prometheus text: (metric name, labels, value) of every sample.
fn samples(body: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter_map(|kv| {
                    let (k, v) = kv.split_once("=\"")?;
                    Some((k.to_string(), v.trim_end_matches('"').to_string()))
                })
                .collect();
            Some((name.to_string(), labels, value))
        })
        .collect()
}

fn sum(body: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    samples(body)
        .into_iter()
        .filter(|(n, labels, _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// Capture passes this process finished (`ok`) and its finished ArtemisCluster reconciles (each
/// polls the cluster when due): the clocks "a later pass ran" is read from.
fn passes_and_polls(body: &str) -> (f64, f64) {
    (
        sum(body, "artemis_studio_capture_passes_total", &[("result", "ok")]),
        sum(
            body,
            "artemis_studio_reconciles_total",
            &[("kind", "ArtemisCluster")],
        ),
    )
}

/// Kubernetes API writes this process made: (verb, kind) → count.
fn api_writes(body: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for (name, labels, v) in samples(body) {
        let verb = labels.get("verb").cloned().unwrap_or_default();
        if name == "artemis_studio_api_requests_total"
            && ["create", "update", "patch", "delete", "deletecollection"].contains(&verb.as_str())
            && v > 0.0
        {
            *out.entry((verb, labels.get("kind").cloned().unwrap_or_default()))
                .or_insert(0.0) += v;
        }
    }
    out
}

/// Jolokia operations this process sent that are not reads (a create, update, destroy, add,
/// remove, close or send of any kind): (node, kind) → count.
fn broker_writes(body: &str) -> BTreeMap<(String, String), f64> {
    let read_only =
        |k: &str| matches!(k, "read" | "search" | "browse") || k.starts_with("get") || k.starts_with("list");
    let mut out = BTreeMap::new();
    for (name, labels, v) in samples(body) {
        let kind = labels.get("kind").cloned().unwrap_or_default();
        if name == "artemis_studio_jolokia_requests_total" && !read_only(&kind) && v > 0.0 {
            *out.entry((labels.get("node").cloned().unwrap_or_default(), kind))
                .or_insert(0.0) += v;
        }
    }
    out
}

/// The queues and the divert whose apply pass the process judged against its cluster's
/// snapshot: the `plan` event (src/controllers/pipeline/plan.rs, debug) inside each reconcile's span,
/// which names the object (JSON log lines).
fn judged(log: &Path, ns: &str) -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["message"] == "plan" && l["span"]["name"] == "reconcile")
        .filter(|l| l["span"]["namespace"] == ns)
        .filter_map(|l| {
            Some((
                l["span"]["kind"].as_str()?.to_string(),
                l["span"]["object"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The broker's own ID of a queue on one node (a re-created queue gets a new one), by a pattern
/// read over every address and routing type.
async fn queue_id(bed: &TestBed, broker: &str, queue: &str) -> Option<i64> {
    let b = bed.broker(broker);
    let (_, body) = jolokia_raw(
        &b,
        &bed.broker_user(),
        ORIGIN,
        json!({"type": "read", "mbean": format!(
            "org.apache.activemq.artemis:broker=\"{broker}\",component=addresses,subcomponent=queues,queue=\"{queue}\",*"),
            "attribute": "ID"}),
    )
    .await;
    let found = body["value"].as_object()?;
    assert!(found.len() <= 1, "one queue {queue} on {broker}: {body}");
    found.values().next()?["ID"].as_i64()
}

/// What the brokers hold of this test: per node, each queue's ID (None: absent) and whether
/// each divert is there.
async fn broker_state(bed: &TestBed, queues: &[String], diverts: &[String]) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for b in bed.cluster_brokers("c") {
        for q in queues {
            let id = queue_id(bed, &b.name, q).await;
            out.insert(format!("{}/queue {q}", b.name), json!(id));
        }
        let there = divert_names(bed, &b).await;
        for d in diverts {
            out.insert(format!("{}/divert {d}", b.name), json!(there.contains(d)));
        }
    }
    out
}

/// Message counts per node of the application's queues (the poll's inventory).
async fn message_counts(bed: &TestBed, queues: &[String]) -> BTreeMap<String, u64> {
    let t = artemis_studio_operator::topology::poll(&bed.access("c", bed.broker_user()), &Default::default())
        .await;
    let mut out = BTreeMap::new();
    for n in &t.nodes {
        let inv = n.inventory.as_ref().expect("inventory");
        for q in queues {
            let count = inv.queues.get(q).map(|i| i.message_count).expect("queue on node");
            out.insert(format!("{}/{q}", n.node_id), count);
        }
    }
    out
}

type AuditRow = (i64, String, String, Option<String>);
async fn audit(pool: &sqlx::PgPool) -> Vec<AuditRow> {
    // Not the divert watch's create (issue 45: the cluster's, once per broker start).
    sqlx::query_as(
        "SELECT id, command, outcome, outcome_detail::text FROM audit_event WHERE command <> 'divertwatch.create' ORDER BY id",
    )
        .fetch_all(pool)
        .await
        .expect("audit rows")
}

type CapturedRow = (String, String, Option<String>, Option<String>);
async fn captured(pool: &sqlx::PgPool, ns: &str) -> Vec<CapturedRow> {
    sqlx::query_as(
        "SELECT node, capture_queue, source_message_id, body_text FROM captured_message \
         WHERE cluster = $1 AND subscription = $2 ORDER BY node, capture_queue, source_message_id",
    )
    .bind(format!("{ns}/c"))
    .bind(SUBSCRIPTION)
    .fetch_all(pool)
    .await
    .expect("captured rows")
}

async fn wait_captured(pool: &sqlx::PgPool, ns: &str, n: usize) -> Vec<CapturedRow> {
    let rows = wait_until(
        &format!("{n} captured rows"),
        Duration::from_secs(90),
        || async move {
            let rows = captured(pool, ns).await;
            (rows.len() >= n).then_some(rows)
        },
    )
    .await;
    assert_eq!(rows.len(), n, "exactly {n} rows: {rows:?}");
    rows
}

/// Capture passes recorded over the cluster: (holder, result, commands).
async fn passes(pool: &sqlx::PgPool, ns: &str) -> Vec<(String, String, i32)> {
    sqlx::query_as("SELECT holder, result, commands FROM capture_pass WHERE cluster = $1 ORDER BY id")
        .bind(format!("{ns}/c"))
        .fetch_all(pool)
        .await
        .expect("capture passes")
}

/// Server-side apply of a CRD file (what `kubectl apply --server-side -f crds/` does), then
/// wait until every CRD in it is Established.
async fn apply_crd_file(client: &Client, path: &Path) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let yaml = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let applied = apply_manifests(client, &yaml, "artemis-studio-tests").await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for o in applied {
        let name = o.metadata.name.clone().expect("CRD name");
        wait_until(
            &format!("CRD {name} Established"),
            Duration::from_secs(60),
            || {
                let (crds, name) = (crds.clone(), name.clone());
                async move {
                    crds.get(&name)
                        .await
                        .ok()?
                        .status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                }
            },
        )
        .await;
    }
}

/// Puts the current CRDs back however the test ends, when it applied the previous commit's
/// (shared by every test on the API server).
struct RestoreCrds<'a>(&'a TestBed, PathBuf);
impl Drop for RestoreCrds<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new(self.0.var("TESTBED_KUBECTL"))
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(&self.1)
            .env("KUBECONFIG", self.0.var("TESTBED_KUBECONFIG"))
            .stdout(std::process::Stdio::null())
            .status();
    }
}

/// The objects once converged and settled under the operator on `port`: a snapshot that two
/// more of its capture passes and cluster polls left unchanged (a queue's delete preview, for
/// one, is refreshed by a poll after messages arrive).
async fn settled(
    admin: &Client,
    ns: &str,
    http: &reqwest::Client,
    port: u16,
    captured: u64,
) -> BTreeMap<String, Seen> {
    let mut last: Option<BTreeMap<String, Seen>> = None;
    for _ in 0..10 {
        let now = wait_until(
            "every object converged",
            Duration::from_secs(120),
            || async move {
                let s = snapshot(admin, ns).await;
                converged(&s, captured).ok().map(|_| s)
            },
        )
        .await;
        if last.as_ref() == Some(&now) {
            return now;
        }
        last = Some(now);
        let (passes0, polls0) = passes_and_polls(&metrics(http, port).await);
        wait_until(
            "two more capture passes and cluster polls",
            Duration::from_secs(90),
            || async move {
                let (passes, polls) = passes_and_polls(&metrics(http, port).await);
                (passes >= passes0 + 2.0 && polls >= polls0 + 2.0).then_some(())
            },
        )
        .await;
    }
    panic!("the objects never settled: the last snapshot {last:?}");
}

/// SIGTERM, as the kubelet stops a pod on a rolling upgrade; then wait for the exit.
async fn stop(p: &mut OperatorProcess) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &p.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -TERM");
    let exited = wait_until(
        "the previous operator exits after SIGTERM",
        Duration::from_secs(60),
        || {
            let r = p.0.try_wait().ok().flatten();
            async move { r }
        },
    )
    .await;
    eprintln!("the previous operator exited: {exited:?}");
}

fn create<K: serde::de::DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).expect("object json")
}

#[tokio::test]
async fn an_upgrade_in_place_recreates_nothing_writes_no_audit_row_or_status_and_keeps_draining() {
    let bed = TestBed::get();
    // The previous commit's operator and CRDs (built once per commit; minutes on a cold cache).
    let (old_binary, old_crds) = bed.previous_operator();
    let current_crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/artemis-studio.io.yaml");
    let old_crds_text = std::fs::read_to_string(&old_crds).expect("the previous CRDs");
    let crds_differ = old_crds_text != std::fs::read_to_string(&current_crds).expect("the current CRDs");
    // CRDs are cluster-wide: other tests run on the same API server, so the previous ones are
    // applied only when they differ, and then with every other broker test kept out (tests that
    // take no broker lock may still run; they do not depend on a CRD change).
    let (_shared, _exclusive) = if crds_differ {
        (None, Some(brokers_exclusive().await))
    } else {
        (Some(brokers_shared().await), None)
    };
    let ns = bed.fresh_namespace("upgrade").await;
    bed.install_operator_rbac().await;
    let admin = bed.kube_admin().await;
    let _restore = crds_differ.then(|| RestoreCrds(&bed, current_crds.clone()));
    if crds_differ {
        apply_crd_file(&admin, &old_crds).await;
    }
    // A fresh database: the previous binary runs its own migrations, the new one its own on top.
    let db = bed.fresh_database().await;
    let id = short_id();
    // Its operators run inside the futures below, stopped by the time this sweeps.
    let _clean = bed.clean_up(&[&id]);
    let run = Run {
        bed: &bed,
        instance: format!("upg-{id}"),
        id,
        ns,
        admin,
        db,
        old_binary,
        old_crds_text,
        current_crds,
    };
    // However the upgrade ends, what it made on the shared brokers goes (a failed assertion
    // is raised after).
    let outcome = std::panic::AssertUnwindSafe(upgrade_in_place(&run))
        .catch_unwind()
        .await;
    tidy(&run).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// One run of the test: the bed, its namespace and database, and the previous commit's build.
struct Run<'a> {
    bed: &'a TestBed,
    id: String,
    /// The installation's instance ID, the same before and after the upgrade.
    instance: String,
    ns: String,
    admin: Client,
    db: String,
    old_binary: PathBuf,
    old_crds_text: String,
    current_crds: PathBuf,
}

/// Delete every object but the cluster with an operator of the current binary running (on the
/// installation's database and instance ID, so the capture sweep removes its taps), and wait
/// until they are gone.
async fn tidy(run: &Run<'_>) {
    let (bed, ns) = (run.bed, run.ns.as_str());
    let port = free_port();
    let _operator = bed.spawn_operator(
        ns,
        &run.db,
        port,
        &[
            ("INSTANCE_ID", run.instance.as_str()),
            ("CAPTURE_PASS_SECONDS", "2"),
        ],
    );
    wait_ready(&reqwest::Client::new(), port).await;
    let kinds = objects();
    let kinds = kinds.iter().filter(|(k, _)| *k != "ArtemisCluster");
    for (kind, name) in kinds.clone() {
        let api: Api<DynamicObject> = Api::namespaced_with(run.admin.clone(), ns, &resource_of(kind));
        if *kind == "ArtemisQueue" {
            // The test's messages go with their queues: named, as the message cap (0) asks.
            let allow = serde_json::json!({"spec": {"deletion": {"allowMessageLoss": 1_000_000}}});
            let _ = api
                .patch(
                    name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&allow),
                )
                .await;
        }
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("delete {kind} {name}: {e}"),
        }
    }
    for (kind, name) in kinds {
        let api: Api<DynamicObject> = Api::namespaced_with(run.admin.clone(), ns, &resource_of(kind));
        wait_until(&format!("{kind} {name} gone"), Duration::from_secs(120), || {
            let api = api.clone();
            async move { api.get_opt(name).await.ok()?.is_none().then_some(()) }
        })
        .await;
    }
}

async fn upgrade_in_place(run: &Run<'_>) {
    let bed = run.bed;
    let (ns, admin, db, id, instance) = (
        run.ns.clone(),
        run.admin.clone(),
        run.db.clone(),
        run.id.clone(),
        run.instance.clone(),
    );
    let (old_binary, old_crds_text, current_crds) = (&run.old_binary, &run.old_crds_text, &run.current_crds);
    let pool = sqlx::PgPool::connect(&db).await.expect("the database");
    let env = [("INSTANCE_ID", instance.as_str()), ("CAPTURE_PASS_SECONDS", "2")];
    let http = reqwest::Client::new();

    // ---- The previous commit's operator converges every kind.
    let old_port = free_port();
    let mut old = bed.spawn_operator_binary(old_binary, &ns, &db, old_port, &env);
    wait_ready(&http, old_port).await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    crate::support::wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let addr = |q: &str| format!("upg.{id}.{q}");
    let (tapped, target, source) = (addr("a"), addr("b"), addr("src"));
    let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), &ns);
    for (object, name, routing) in [
        ("a", &tapped, "ANYCAST"),
        ("b", &target, "ANYCAST"),
        ("src", &source, "MULTICAST"),
    ] {
        queues
            .create(
                &PostParams::default(),
                &create(json!({
                    "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
                    "metadata": {"name": object},
                    "spec": {"clusterRef": {"name": "c"}, "name": name, "routingType": routing}
                })),
            )
            .await
            .expect("create ArtemisQueue");
    }
    for q in QUEUES {
        wait_until(&format!("queue {q} Ready"), Duration::from_secs(90), || {
            let queues = queues.clone();
            async move { queues.get(q).await.ok().filter(crate::queue::ready).map(|_| ()) }
        })
        .await;
    }
    let diverts: Api<ArtemisDivert> = Api::namespaced(admin.clone(), &ns);
    diverts
        .create(
            &PostParams::default(),
            &create(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisDivert",
                "metadata": {"name": DIVERT},
                "spec": {"clusterRef": {"name": "c"}, "name": addr("d"), "address": source, "forwardingAddress": target}
            })),
        )
        .await
        .expect("create ArtemisDivert");
    // One queue by its exact name: armed without review (ExactQueueName).
    let subscriptions: Api<ArtemisCaptureSubscription> = Api::namespaced(admin.clone(), &ns);
    subscriptions
        .create(
            &PostParams::default(),
            &create(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
                "metadata": {"name": SUBSCRIPTION},
                "spec": {"clusterRef": {"name": "c"}, "queues": tapped}
            })),
        )
        .await
        .expect("create ArtemisCaptureSubscription");
    // A close of a real client's connection, confirmed at creation, that completes.
    let t = artemis_studio_operator::topology::poll(&bed.access("c", bed.broker_user()), &Default::default())
        .await;
    let c1 = t.find(&bed.broker("c1").jolokia).expect("c1").clone();
    let m = c1.active.clone().expect("c1 live");
    let client_id = format!("upg-app-{id}");
    let consumer = amqp_consumer(bed, "c1", &target, &client_id).await;
    let connection = connection_of(&m, &client_id)
        .await
        .expect("the client's connection");
    let closes: Api<ConnectionClose> = Api::namespaced(admin.clone(), &ns);
    closes
        .create(
            &PostParams::default(),
            &create(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
                "metadata": {"name": CLOSE, "annotations": {"artemis-studio.io/confirm-without-review": "true"}},
                "spec": {"clusterRef": {"name": "c"}, "target": {"node": c1.node_id, "connectionId": connection},
                         "confirm": client_id}
            })),
        )
        .await
        .expect("create ConnectionClose");
    wait_until(
        "the client is disconnected by the close",
        Duration::from_secs(90),
        || async { connection_of(&m, &client_id).await.is_none().then_some(()) },
    )
    .await;
    drop(consumer);
    // Traffic once the divert and the taps are in place: copies of what reaches the tapped
    // queue are stored; the divert copies what reaches the source address into the target queue.
    wait_until(
        "the divert Ready, the subscription draining 3 taps",
        Duration::from_secs(120),
        || {
            let (admin, ns) = (admin.clone(), ns.clone());
            async move {
                let s = snapshot(&admin, &ns).await;
                let divert = &s[&format!("ArtemisDivert/{DIVERT}")].status;
                let sub = BTreeMap::from_iter(
                    s.iter()
                        .filter(|(k, _)| k.starts_with("ArtemisCaptureSubscription/"))
                        .map(|(k, v)| (k.clone(), v.clone())),
                );
                (condition_true(divert, "Ready") && converged(&sub, 0).is_ok()).then_some(())
            }
        },
    )
    .await;
    amqp_send(bed, "c1", &tapped, 3, &format!("before-{id}"))
        .await
        .expect("send before the upgrade");
    send_messages(bed, "c1", &source, 2).await;
    wait_captured(&pool, &ns, 3).await;
    let converged_now = settled(&admin, &ns, &http, old_port, 3).await;

    // ---- The upgrade: the previous process stops, the current CRDs, the new binary.
    stop(&mut old).await;
    drop(old);
    let before = snapshot(&admin, &ns).await;
    assert_eq!(before, converged_now);
    let audit_before = audit(&pool).await;
    assert!(
        audit_before.iter().any(|r| r.1 == "connection.close")
            && audit_before.iter().all(|r| r.2 != "pending"),
        "every command of the previous operator is audited and complete: {audit_before:?}"
    );
    let rows_before = captured(&pool, &ns).await;
    let old_holders: BTreeSet<String> = passes(&pool, &ns).await.into_iter().map(|p| p.0).collect();
    // Installed by the previous operator before tap names carried the namespace: the upgrade
    // keeps its name (renaming a live tap would drop what its ring holds).
    let tap = TapName::legacy(&instance, &tapped, SUBSCRIPTION);
    let broker_queues = vec![
        tapped.clone(),
        target.clone(),
        source.clone(),
        tap.capture_queue(),
    ];
    let broker_diverts = vec![addr("d"), tap.divert()];
    let brokers_before = broker_state(bed, &broker_queues, &broker_diverts).await;
    assert!(
        brokers_before.values().all(|v| v.is_i64() || v == &json!(true)),
        "every queue, the divert and the tap on every node: {brokers_before:?}"
    );
    let app_queues = [tapped.clone(), target.clone(), source.clone()];
    let counts_before = message_counts(bed, &app_queues).await;

    apply_crd_file(&admin, current_crds).await;
    let new_port = free_port();
    let log = std::env::temp_dir().join(format!("upgrade-{id}.log"));
    let mut cmd = bed.operator_command(
        Path::new(env!("CARGO_BIN_EXE_artemis-studio-operator")),
        &ns,
        &db,
        new_port,
        &[
            ("INSTANCE_ID", instance.as_str()),
            ("CAPTURE_PASS_SECONDS", "2"),
            ("LOG_JSON", "true"),
            (
                "RUST_LOG",
                // The `reconcile` span (info, src/controllers/runner.rs) names the object of the
                // pipeline's `plan` event (debug).
                "warn,artemis_studio_operator::controllers=info,artemis_studio_operator::controllers::pipeline=debug",
            ),
        ],
    );
    cmd.stdout(std::fs::File::create(&log).expect("the new operator's log file"));
    let _new = OperatorProcess(cmd.spawn().expect("start the operator under test"));
    wait_ready(&http, new_port).await;

    // Positive evidence that the new process looked at every object: each queue and the divert
    // judged against a fresh poll of the cluster (its log), each kind's reconciles finished (its
    // /metrics), two capture passes of its own (capture_pass rows of a new holder) and its drains
    // running on the 3 taps.
    let want: BTreeSet<(String, String)> = QUEUES
        .iter()
        .map(|q| ("ArtemisQueue".to_string(), q.to_string()))
        .chain([("ArtemisDivert".to_string(), DIVERT.to_string())])
        .collect();
    wait_until(
        "the new operator judged every object and ran its own capture passes",
        Duration::from_secs(120),
        || {
            let (http, pool, ns, log, want, old_holders) = (
                http.clone(),
                pool.clone(),
                ns.clone(),
                log.clone(),
                want.clone(),
                old_holders.clone(),
            );
            async move {
                let body = metrics(&http, new_port).await;
                let reconciled =
                    |kind: &str| sum(&body, "artemis_studio_reconciles_total", &[("kind", kind)]);
                let new_passes = passes(&pool, &ns)
                    .await
                    .into_iter()
                    .filter(|p| !old_holders.contains(&p.0) && p.1 == "ok")
                    .count();
                let seen = judged(&log, &ns);
                let drains = sum(&body, "artemis_studio_capture_drains", &[]);
                let done = seen.is_superset(&want)
                    && reconciled("ArtemisCluster") >= 1.0
                    && reconciled("ArtemisQueue") >= QUEUES.len() as f64
                    && reconciled("ArtemisDivert") >= 1.0
                    && reconciled("ConnectionClose") >= 1.0
                    && new_passes >= 2
                    && drains >= 3.0;
                if !done {
                    // What is still missing, should this wait time out.
                    eprintln!(
                        "new operator so far: judged {seen:?}; reconciles: cluster {}, queue {}, divert {}, close {}; \
                         its capture passes {new_passes}, drains {drains}",
                        reconciled("ArtemisCluster"),
                        reconciled("ArtemisQueue"),
                        reconciled("ArtemisDivert"),
                        reconciled("ConnectionClose")
                    );
                }
                done.then_some(())
            }
        },
    )
    .await;
    // Whatever those passes were going to write is written by the time two more cluster polls
    // and one more capture pass of the new process have finished.
    let (passes1, polls1) = passes_and_polls(&metrics(&http, new_port).await);
    wait_until(
        "one more capture pass and two more cluster polls of the new operator",
        Duration::from_secs(90),
        || {
            let http = http.clone();
            async move {
                let (passes, polls) = passes_and_polls(&metrics(&http, new_port).await);
                (passes >= passes1 + 1.0 && polls >= polls1 + 2.0).then_some(())
            }
        },
    )
    .await;

    // Nothing re-created, nothing written.
    let after = snapshot(&admin, &ns).await;
    let mut restated = 0usize;
    for (key, b) in &before {
        let a = &after[key];
        assert_eq!(a.uid, b.uid, "{key} was re-created");
        let (new, old) = (
            without_new_fields(&a.status, &b.status, old_crds_text),
            b.status.clone(),
        );
        assert_eq!(
            without_message_cap(&new),
            without_message_cap(&old),
            "{key}: the status changed beyond observedGeneration (and the fields the new CRDs add)"
        );
        // The one write an upgrade across issue 41 makes: a queue's preview of the new cap.
        let cap_restated = key.starts_with("ArtemisQueue") && new != old;
        if cap_restated {
            assert_eq!(
                previewed_cap(&new),
                Some(0),
                "{key}: the rewritten preview states the cap 0"
            );
            restated += 1;
        }
        assert!(
            a.resource_version == b.resource_version || cap_restated,
            "{key} was written by the new operator (status {})",
            a.status
        );
    }
    let body = metrics(&http, new_port).await;
    // Exactly one status write per queue whose preview restated the cap, and nothing else.
    let expected: BTreeMap<_, f64> = (restated > 0)
        .then(|| {
            (
                ("patch".to_string(), "artemisqueues/status".to_string()),
                restated as f64,
            )
        })
        .into_iter()
        .collect();
    assert_eq!(
        api_writes(&body),
        expected,
        "the new operator wrote to the API server over converged objects"
    );
    assert_eq!(
        broker_writes(&body),
        BTreeMap::new(),
        "the new operator sent broker writes over converged objects"
    );
    assert_eq!(
        audit(&pool).await,
        audit_before,
        "the new operator wrote or changed audit rows"
    );
    let new_passes: Vec<_> = passes(&pool, &ns)
        .await
        .into_iter()
        .filter(|p| !old_holders.contains(&p.0))
        .collect();
    assert!(
        new_passes.iter().all(|p| p.1 == "ok" && p.2 == 0),
        "the new operator's capture passes issued broker commands: {new_passes:?}"
    );
    assert_eq!(
        broker_state(bed, &broker_queues, &broker_diverts).await,
        brokers_before,
        "a queue or divert on the brokers was re-created or removed"
    );
    assert_eq!(
        message_counts(bed, &app_queues).await,
        counts_before,
        "the application's queues keep their messages"
    );
    assert_eq!(captured(&pool, &ns).await, rows_before);

    // The taps still drain: what is sent now is stored, and no copy twice.
    amqp_send(bed, "c1", &tapped, 3, &format!("after-{id}"))
        .await
        .expect("send after the upgrade");
    let rows = wait_captured(&pool, &ns, 6).await;
    let counts = message_counts(bed, &app_queues).await;
    let on_c1 = format!("{}/{tapped}", c1.node_id);
    assert_eq!(
        counts[&on_c1],
        counts_before[&on_c1] + 3,
        "the tapped queue keeps every message"
    );
    let keys: BTreeSet<(&str, &str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.0.as_str(), r.1.as_str(), r.2.as_deref()))
        .collect();
    assert_eq!(keys.len(), 6, "no copy stored twice: {rows:?}");
    let sources: BTreeSet<Option<&str>> = rows.iter().map(|r| r.2.as_deref()).collect();
    assert!(
        sources.len() == 6 && !sources.contains(&None),
        "six source messages: {rows:?}"
    );
    assert!(
        rows_before.iter().all(|r| rows.contains(r)),
        "the rows stored before the upgrade are kept: {rows:?}"
    );
    assert_eq!(
        rows.iter()
            .filter(|r| r
                .3
                .as_deref()
                .is_some_and(|b| b.starts_with(&format!("after-{id} "))))
            .count(),
        3,
        "{rows:?}"
    );
    wait_until(
        "the subscription counts 6 captured",
        Duration::from_secs(90),
        || {
            let subscriptions = subscriptions.clone();
            async move {
                let s = subscriptions.get(SUBSCRIPTION).await.ok()?;
                (s.status?.captured == 6).then_some(())
            }
        },
    )
    .await;
    // Still nothing else written since: only the subscription's status (its captured counts).
    let late = snapshot(&admin, &ns).await;
    for (key, b) in &after {
        if key.starts_with("ArtemisCaptureSubscription/") {
            continue;
        }
        assert_eq!(
            late[key].resource_version, b.resource_version,
            "{key} was written after the upgrade (status {})",
            late[key].status
        );
    }
    let body = metrics(&http, new_port).await;
    let writes = api_writes(&body);
    assert!(
        writes.keys().all(|(verb, kind)| verb == "patch"
            && (kind == "artemiscapturesubscriptions/status"
                || (kind == "artemisqueues/status"
                    && writes[&(verb.clone(), kind.clone())] == restated as f64))),
        "{writes:?}"
    );
    assert_eq!(broker_writes(&body), BTreeMap::new());
    assert_eq!(
        audit(&pool).await,
        audit_before,
        "no audit row for capture traffic"
    );

    let _ = std::fs::remove_file(&log);
}
