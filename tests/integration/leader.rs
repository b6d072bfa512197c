//! Leader election between real operator processes (the binary, under the chart's RBAC): one
//! Lease, one holder; the standby is ready and reconciles nothing; SIGKILL of the leader hands
//! the Lease to the standby, which then acts; SIGTERM of a leader releases the Lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

use artemis_studio_operator::api::ArtemisQueue;

use crate::queue::ready;
use crate::support::{
    OperatorProcess, TestBed, brokers_shared, create_cluster, metrics, short_id, wait_cluster_condition,
    wait_ready, wait_until,
};

/// The namespace of the chart's leader-election Role as `install_operator_rbac` renders it.
pub(crate) const LEASE_NAMESPACE: &str = "artemis-studio";

/// A short lease, so a killed leader is replaced soon.
pub(crate) const SHORT: [(&str, &str); 3] = [
    ("LEASE_DURATION_SECONDS", "4"),
    ("LEASE_RENEW_DEADLINE_SECONDS", "3"),
    ("LEASE_RETRY_PERIOD_SECONDS", "1"),
];
/// A long lease: a process that sees it recorded can take it over only after a release, never
/// by waiting for it to expire (within a test's bounded waits).
pub(crate) const LONG: [(&str, &str); 3] = [
    ("LEASE_DURATION_SECONDS", "600"),
    ("LEASE_RENEW_DEADLINE_SECONDS", "300"),
    ("LEASE_RETRY_PERIOD_SECONDS", "1"),
];

/// The environment of one elected operator process named `pod`.
fn operator_env(instance: &str, pod: &str, timing: &[(&str, &str)]) -> Vec<(String, String)> {
    [
        ("LEADER_ELECTION", "true"),
        ("LEASE_NAMESPACE", LEASE_NAMESPACE),
        ("INSTANCE_ID", instance),
        ("SHUTDOWN_GRACE_SECONDS", "20"),
        ("POD_NAME", pod),
    ]
    .iter()
    .chain(timing)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

pub(crate) fn spawn_with(
    bed: &TestBed,
    ns: &str,
    db: &str,
    port: u16,
    vars: &[(String, String)],
) -> OperatorProcess {
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    bed.spawn_operator(ns, db, port, &vars)
}

/// A port nothing listens on now, each call a new one, below the kernel's ephemeral range
/// (32768–60999): a port the kernel handed out for `:0` could be taken, between this check
/// and the operator's bind, as the local end of another test's outgoing connection (seen in a
/// loaded suite: the spawned operator could not listen, and never took its Lease).
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    loop {
        let port = 23_000 + NEXT.fetch_add(1, Ordering::Relaxed) % 9_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub(crate) fn signal(p: &OperatorProcess, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &p.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig}");
}

/// The value of an unlabelled sample, or the sum of a family's labelled samples.
pub(crate) fn sample_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// `artemis_studio_leader` of one process. Its absence means the process is not this branch's
/// binary (the shared target directory's `debug/artemis-studio-operator` is replaced by any
/// checkout that builds): fail with that, not with a misleading timeout.
fn leader_gauge(metrics: &str) -> f64 {
    assert!(
        metrics.lines().any(|l| l.starts_with("artemis_studio_leader ")),
        "no artemis_studio_leader gauge: the spawned binary is not this checkout's\n{metrics}"
    );
    sample_sum(metrics, "artemis_studio_leader")
}

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

async fn wait_holder(leases: &Api<Lease>, name: &str, pod: &str) -> String {
    let prefix = format!("{pod}-");
    wait_until(
        &format!("Lease {name} held by {pod}"),
        Duration::from_secs(60),
        || {
            let leases = leases.clone();
            let prefix = prefix.clone();
            async move { holder(&leases, name).await.filter(|h| h.starts_with(&prefix)) }
        },
    )
    .await
}

async fn wait_leader_gauge(http: &reqwest::Client, port: u16, value: f64) {
    wait_until(
        &format!("artemis_studio_leader {value} on port {port}"),
        Duration::from_secs(30),
        || {
            let http = http.clone();
            async move {
                let m = http
                    .get(format!("http://127.0.0.1:{port}/metrics"))
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                (sample_sum(&m, "artemis_studio_leader") == value).then_some(())
            }
        },
    )
    .await;
}

/// Create the ArtemisQueue `name` on cluster `c`, every other field defaulted.
pub(crate) async fn create_queue_on_c(queues: &Api<ArtemisQueue>, name: &str) {
    let q: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": name}, "spec": {"clusterRef": {"name": "c"}}
    }))
    .expect("queue json");
    queues
        .create(&Default::default(), &q)
        .await
        .expect("create queue");
}

async fn create_ready_queue(queues: &Api<ArtemisQueue>, name: &str) {
    create_queue_on_c(queues, name).await;
    wait_until(
        &format!("ArtemisQueue {name} Ready=True"),
        Duration::from_secs(90),
        || {
            let queues = queues.clone();
            async move { queues.get(name).await.ok().filter(ready).map(|_| ()) }
        },
    )
    .await;
}

/// Wait (bounded) for a process to exit; its status.
pub(crate) async fn wait_exit(p: &mut OperatorProcess) -> std::process::ExitStatus {
    wait_until("the operator process exits", Duration::from_secs(60), || {
        let status = p.0.try_wait().expect("try_wait");
        async move { status }
    })
    .await
}

#[tokio::test]
async fn one_leader_acts_the_standby_takes_over_on_kill_and_sigterm_releases_the_lease() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("leader").await;
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let admin = bed.kube_admin().await;
    let instance = format!("le-{}", short_id());
    let lease_name = format!("artemis-studio-operator-{instance}");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let http = reqwest::Client::new();
    let (port_a, port_b, port_c) = (free_port(), free_port(), free_port());
    let env = |pod: &str, timing: &[(&str, &str)]| operator_env(&instance, pod, timing);
    let spawn = |port: u16, vars: Vec<(String, String)>| spawn_with(&bed, &ns, &db, port, &vars);
    let id = short_id();
    // Before the processes, so none runs when it sweeps.
    let _clean = bed.clean_up(&[&id]);

    // A starts first and takes the Lease; B joins as a standby.
    let mut a = spawn(port_a, env("leader-a", &SHORT));
    let holder_a = wait_holder(&leases, &lease_name, "leader-a").await;
    // B records a long lease once it leads (see LONG): the SIGTERM step relies on it.
    let mut b = spawn(port_b, env("leader-b", &LONG));
    wait_ready(&http, port_a).await;
    wait_ready(&http, port_b).await; // a standby is ready
    assert_eq!(
        holder(&leases, &lease_name).await.as_deref(),
        Some(holder_a.as_str())
    );
    assert_eq!(leader_gauge(&metrics(&http, port_a).await), 1.0);
    assert_eq!(leader_gauge(&metrics(&http, port_b).await), 0.0);

    // Only the leader reconciles.
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), &ns);
    create_ready_queue(&queues, &format!("le.before.{id}")).await;
    let (ma, mb) = (metrics(&http, port_a).await, metrics(&http, port_b).await);
    assert!(sample_sum(&ma, "artemis_studio_reconciles_total") > 0.0, "{ma}");
    assert_eq!(sample_sum(&mb, "artemis_studio_reconciles_total"), 0.0, "{mb}");
    assert_eq!(sample_sum(&mb, "artemis_studio_commands_total"), 0.0, "{mb}");
    assert_eq!(leader_gauge(&mb), 0.0, "{mb}");
    assert!(a.0.try_wait().expect("try_wait").is_none(), "the leader runs");
    assert!(b.0.try_wait().expect("try_wait").is_none(), "the standby runs");

    // SIGKILL the leader: B takes the Lease over once it expires, and acts.
    a.0.kill().expect("SIGKILL");
    let _ = a.0.wait();
    let holder_b = wait_holder(&leases, &lease_name, "leader-b").await;
    wait_leader_gauge(&http, port_b, 1.0).await;
    create_ready_queue(&queues, &format!("le.after.{id}")).await;
    let mb = metrics(&http, port_b).await;
    assert!(sample_sum(&mb, "artemis_studio_reconciles_total") > 0.0, "{mb}");

    // C joins as a standby; SIGTERM on B releases the Lease (B recorded 600 s, so C can only
    // have it this soon by the release) and B exits 0.
    let _c = spawn(port_c, env("leader-c", &SHORT));
    wait_ready(&http, port_c).await;
    assert_eq!(
        holder(&leases, &lease_name).await.as_deref(),
        Some(holder_b.as_str())
    );
    assert_eq!(leader_gauge(&metrics(&http, port_c).await), 0.0);
    signal(&b, "-TERM");
    let exit = wait_exit(&mut b).await;
    assert!(exit.success(), "a leader stopped by SIGTERM exits 0: {exit:?}");
    wait_holder(&leases, &lease_name, "leader-c").await;
    wait_leader_gauge(&http, port_c, 1.0).await;

    let _ = leases.delete(&lease_name, &Default::default()).await;
}

/// A leader that has not renewed within its renew deadline (frozen by SIGSTOP while the standby
/// takes the Lease over) stops its controllers and exits non-zero once it runs again.
#[tokio::test]
async fn a_leader_past_its_renew_deadline_exits_non_zero() {
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("leader-frozen").await;
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let admin = bed.kube_admin().await;
    let instance = format!("lf-{}", short_id());
    let lease_name = format!("artemis-studio-operator-{instance}");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let http = reqwest::Client::new();
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = spawn_with(
        &bed,
        &ns,
        &db,
        port_a,
        &operator_env(&instance, "frozen-a", &SHORT),
    );
    wait_holder(&leases, &lease_name, "frozen-a").await;
    let _b = spawn_with(
        &bed,
        &ns,
        &db,
        port_b,
        &operator_env(&instance, "frozen-b", &SHORT),
    );
    wait_ready(&http, port_a).await;
    wait_ready(&http, port_b).await;
    assert_eq!(leader_gauge(&metrics(&http, port_a).await), 1.0);
    assert_eq!(leader_gauge(&metrics(&http, port_b).await), 0.0);

    signal(&a, "-STOP");
    let thaw = Thawed(a.0.id());
    wait_holder(&leases, &lease_name, "frozen-b").await;
    drop(thaw);
    let exit = wait_exit(&mut a).await;
    assert_eq!(
        exit.code(),
        Some(1),
        "a leader past its renew deadline exits 1: {exit:?}"
    );
    wait_leader_gauge(&http, port_b, 1.0).await;

    let _ = leases.delete(&lease_name, &Default::default()).await;
}

/// SIGCONT when dropped (also when the test fails while the process is stopped).
struct Thawed(u32);
impl Drop for Thawed {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// The leader SIGKILLed in the middle of a command (one node written, the others not, the
/// outcome not recorded): the standby takes over and writes only the nodes that lack the queue.
/// The audit shows the dead leader's command without an outcome and one command for the rest:
/// no node is written twice.
#[tokio::test]
async fn a_leader_killed_mid_fan_out_is_finished_by_the_standby_without_a_second_write() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("midfan").await;
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let admin = bed.kube_admin().await;
    let instance = format!("mf-{}", short_id());
    let lease_name = format!("artemis-studio-operator-{instance}");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let http = reqwest::Client::new();
    let marker = std::env::temp_dir().join(format!("midfan-{}", short_id()));
    let (port_a, port_b) = (free_port(), free_port());
    let mut env_a = operator_env(&instance, "midfan-a", &SHORT);
    env_a.push((
        "ARTEMIS_STUDIO_TEST_PAUSE_MID_FANOUT".into(),
        marker.display().to_string(),
    ));
    let id = short_id();
    // Before the processes, so none runs when it sweeps.
    let _clean = bed.clean_up(&[&id]);
    let mut a = spawn_with(&bed, &ns, &db, port_a, &env_a);
    wait_holder(&leases, &lease_name, "midfan-a").await;
    let _b_proc = spawn_with(
        &bed,
        &ns,
        &db,
        port_b,
        &operator_env(&instance, "midfan-b", &SHORT),
    );
    wait_ready(&http, port_b).await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let name = format!("midfan.{id}");
    let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), &ns);
    create_queue_on_c(&queues, &name).await;
    // The leader wrote one node and stopped before the outcome: kill it there.
    wait_until("the leader in the crash window", Duration::from_secs(120), || {
        let marker = marker.clone();
        async move { std::fs::read_to_string(&marker).ok() }
    })
    .await;
    a.0.kill().expect("SIGKILL");
    let _ = a.0.wait();
    wait_holder(&leases, &lease_name, "midfan-b").await;
    wait_until(
        &format!("ArtemisQueue {name} Ready=True"),
        Duration::from_secs(120),
        || {
            let queues = queues.clone();
            let name = name.clone();
            async move { queues.get(&name).await.ok().filter(ready).map(|_| ()) }
        },
    )
    .await;
    let pool = sqlx::PgPool::connect(&db).await.expect("audit database");
    // The dead leader's row does not stay pending: once its process stopped heartbeating, the
    // live one records it as unknown (issue 22 item 5).
    let rows: Vec<(String, String, Option<serde_json::Value>)> = wait_until(
        "the dead leader's command recorded as unknown",
        Duration::from_secs(90),
        || {
            let (pool, name) = (pool.clone(), name.clone());
            async move {
                let rows: Vec<(String, String, Option<serde_json::Value>)> = sqlx::query_as(
                    "SELECT command, outcome, outcome_detail FROM audit_event WHERE object_name = $1 ORDER BY id",
                )
                .bind(&name)
                .fetch_all(&pool)
                .await
                .ok()?;
                rows.iter().all(|r| r.1 != "pending").then_some(rows)
            }
        },
    )
    .await;
    assert_eq!(
        rows.len(),
        2,
        "the dead leader's command and the standby's: {rows:?}"
    );
    assert_eq!(
        rows[0].1, "unknown",
        "the killed command's outcome is not known: {rows:?}"
    );
    let reason = rows[0]
        .2
        .as_ref()
        .and_then(|d| d["reason"].as_str())
        .unwrap_or_default();
    assert!(
        reason.contains("stopped before recording its outcome"),
        "{reason}"
    );
    // It names the command that followed it on the same object.
    let followed: Vec<i64> = rows[0]
        .2
        .as_ref()
        .and_then(|d| serde_json::from_value(d["followedBy"].clone()).ok())
        .unwrap_or_default();
    assert_eq!(followed.len(), 1, "{rows:?}");
    assert_eq!(rows[1].1, "succeeded", "{rows:?}");
    // The standby wrote only the nodes the dead leader had not: each node got the queue once.
    let applied = rows[1]
        .2
        .as_ref()
        .and_then(|d| d["appliedNodes"].as_array().cloned())
        .unwrap_or_default();
    let queue = queues.get(&name).await.expect("get");
    let nodes = queue.status.map(|s| s.nodes).unwrap_or_default();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert_eq!(applied.len(), 2, "two nodes lacked the queue: {rows:?}");
    let _ = std::fs::remove_file(&marker);
    let _ = leases.delete(&lease_name, &Default::default()).await;
}
