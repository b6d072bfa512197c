//! Issue 10: a ConnectionClose runs exactly once — armed by a compare-and-swap, re-read right
//! before the call, never called "gone" on a guess, confirmed only after the consequence was
//! shown. Real operator processes, real AMQP clients.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use artemis_studio_operator::api::connection_close::{ClosePhase, ConnectionClose};
use artemis_studio_operator::broker::BrokerManagement;

use crate::support::{
    CleanUp, TestBed, Thaw, amqp_consumer, brokers_exclusive, brokers_shared, connection_of, create_cluster,
    short_id, wait_ready, wait_until,
};

struct Setup {
    bed: TestBed,
    ns: String,
    admin: kube::Client,
    db: String,
    node: String,
    m: BrokerManagement,
    queue: String,
    /// Last: the test's operators are later locals, stopped before it sweeps.
    _clean: CleanUp,
}

/// A namespace with cluster c, a fresh database, and a queue on c1 (made directly).
async fn setup(prefix: &str) -> Setup {
    let bed = TestBed::get();
    let ns = bed.fresh_namespace(prefix).await;
    bed.install_operator_rbac().await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    let db = bed.fresh_database().await;
    artemis_studio_operator::store::Store::migrate(&db)
        .await
        .expect("migrate");
    let t = artemis_studio_operator::topology::poll(&bed.access("c", bed.broker_user()), &Default::default())
        .await;
    let node = t.find(&bed.broker("c1").jolokia).expect("c1").clone();
    let m = node.active.clone().expect("live");
    let id = short_id();
    let clean = bed.clean_up(&[&id]);
    let queue = format!("cc.once.{id}");
    m.create_queue(
        &json!({"name": queue, "address": queue, "routing-type": "ANYCAST", "auto-create-address": true}),
    )
    .await
    .expect("queue");
    Setup {
        bed,
        ns,
        admin,
        db,
        node: node.node_id.clone(),
        m,
        queue,
        _clean: clean,
    }
}

impl Setup {
    fn closes(&self) -> Api<ConnectionClose> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// A close of `connection`, confirmed at creation; `without_review` adds the annotation.
    async fn create_confirmed(&self, name: &str, connection: &str, client: &str, without_review: bool) {
        let mut meta = json!({"name": name});
        if without_review {
            meta["annotations"] = json!({"artemis-studio.io/confirm-without-review": "true"});
        }
        let c: ConnectionClose = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose", "metadata": meta,
            "spec": {"clusterRef": {"name": "c"}, "target": {"node": self.node, "connectionId": connection}, "confirm": client}
        }))
        .expect("close json");
        self.closes()
            .create(&PostParams::default(), &c)
            .await
            .expect("create ConnectionClose");
    }

    async fn wait(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ConnectionClose) -> bool,
    ) -> ConnectionClose {
        let api = self.closes();
        let check = &check;
        wait_until(
            &format!("ConnectionClose {name}: {what}"),
            Duration::from_secs(120),
            || {
                let api = api.clone();
                async move { api.get(name).await.ok().filter(|c| check(c)) }
            },
        )
        .await
    }

    async fn audit(&self) -> Vec<(String, String)> {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&self.db).await.expect("db");
        // The commands of this test's objects, not the divert watch's create (issue 45: the
        // cluster's, once per broker start, by whichever installation polls first).
        sqlx::query_as(
            "SELECT command, outcome FROM audit_event WHERE command <> 'divertwatch.create' ORDER BY id",
        )
        .fetch_all(&mut conn)
        .await
        .expect("audit")
    }
}

fn phase(c: &ConnectionClose) -> Option<ClosePhase> {
    c.status.as_ref().map(|s| s.phase)
}

/// Two operator processes on one namespace, one confirmed close: exactly one arms and calls.
#[tokio::test]
async fn two_operator_processes_close_a_connection_exactly_once() {
    let _b = brokers_shared().await;
    let s = setup("cc-two").await;
    let client = format!("twice-{}", short_id());
    let _consumer = amqp_consumer(&s.bed, "c1", &s.queue, &client).await;
    let connection = connection_of(&s.m, &client).await.expect("connection");
    let base = 19_000 + (std::process::id() % 500) as u16;
    let _a = s.bed.spawn_operator(&s.ns, &s.db, base, &[]);
    let _b2 = s.bed.spawn_operator(&s.ns, &s.db, base + 500, &[]);
    // Both processes are up and reconciling before the close exists.
    let http = reqwest::Client::new();
    for port in [base, base + 500] {
        wait_ready(&http, port).await;
    }
    crate::support::wait_cluster_condition(&s.admin, &s.ns, "c", "Ready", "True").await;
    s.create_confirmed("once", &connection, &client, true).await;
    let c = s
        .wait("once", "Completed", |c| phase(c) == Some(ClosePhase::Completed))
        .await;
    assert!(!c.status.expect("status").already_gone);
    wait_until("the client is disconnected", Duration::from_secs(30), || async {
        connection_of(&s.m, &client).await.is_none().then_some(())
    })
    .await;
    let rows = s.audit().await;
    let closes: Vec<_> = rows.iter().filter(|(c, _)| c == "connection.close").collect();
    assert_eq!(closes.len(), 1, "one close call, by one process: {rows:?}");
    assert_eq!(closes[0].1, "succeeded");
    // Both processes reconciled it: each one's metrics count ConnectionClose passes.
    for port in [base, base + 500] {
        let body = http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("body");
        assert!(
            body.lines()
                .any(|l| l.starts_with("artemis_studio_reconciles_total{kind=\"ConnectionClose\"")),
            "process on {port} reconciled the close: {body}"
        );
    }
    let _ = s.m.destroy_queue(&s.queue, true).await;
}

/// SIGKILL between arming (Closing + audit intent persisted) and the call; a new process finds
/// it: Failed, the audit row `unknown`, the client still connected, no second call.
#[tokio::test]
async fn a_sigkill_after_arming_fails_the_close_with_an_unknown_outcome_and_never_calls() {
    let _b = brokers_shared().await;
    let s = setup("cc-kill").await;
    let client = format!("survives-{}", short_id());
    let _consumer = amqp_consumer(&s.bed, "c1", &s.queue, &client).await;
    let connection = connection_of(&s.m, &client).await.expect("connection");
    let marker = std::env::temp_dir().join(format!("armed-{}", short_id()));
    let port = 19_600 + (std::process::id() % 300) as u16;
    let marker_path = marker.to_string_lossy().to_string();
    let mut first = s.bed.spawn_operator(
        &s.ns,
        &s.db,
        port,
        &[("ARTEMIS_STUDIO_TEST_PAUSE_AFTER_ARM", marker_path.as_str())],
    );
    s.create_confirmed("armed", &connection, &client, true).await;
    wait_until(
        "the first process armed the close and paused",
        Duration::from_secs(120),
        || {
            let marker = marker.clone();
            async move { marker.exists().then_some(()) }
        },
    )
    .await;
    let c = s.closes().get("armed").await.expect("get");
    assert_eq!(phase(&c), Some(ClosePhase::Closing));
    assert!(
        c.status.as_ref().and_then(|st| st.audit_id).is_some(),
        "the audit id is in status before the call"
    );
    first.0.kill().expect("SIGKILL");
    let _ = first.0.wait();
    let _second = s.bed.spawn_operator(&s.ns, &s.db, port + 1, &[]);
    let c = s
        .wait("armed", "Failed", |c| phase(c) == Some(ClosePhase::Failed))
        .await;
    let message = c.status.and_then(|st| st.message).unwrap_or_default();
    assert!(message.contains("outcome unknown, not retried"), "{message}");
    let rows = s.audit().await;
    assert_eq!(
        rows,
        vec![("connection.close".to_string(), "unknown".to_string())],
        "the intent row is completed as unknown, and no second call was audited"
    );
    assert!(
        connection_of(&s.m, &client).await.is_some(),
        "nothing was called: the client is still connected"
    );
    let _ = std::fs::remove_file(&marker);
    let _ = s.m.destroy_queue(&s.queue, true).await;
}

/// A close created with `confirm` already set is not armed before the consequence was shown;
/// confirming again afterwards closes it.
#[tokio::test]
async fn a_confirm_given_before_the_consequence_was_shown_waits() {
    let _b = brokers_shared().await;
    let s = setup("cc-early").await;
    let client = format!("early-{}", short_id());
    let _consumer = amqp_consumer(&s.bed, "c1", &s.queue, &client).await;
    let connection = connection_of(&s.m, &client).await.expect("connection");
    let op = s.bed.start_operator(&s.ns).await;
    s.create_confirmed("early", &connection, &client, false).await;
    let c = s
        .wait("early", "AwaitingConfirmation, consequence shown", |c| {
            phase(c) == Some(ClosePhase::AwaitingConfirmation)
                && c.status.as_ref().is_some_and(|st| st.consequence.is_some())
        })
        .await;
    let message = c.status.and_then(|st| st.message).unwrap_or_default();
    assert!(message.contains("before the consequence was shown"), "{message}");
    // Later passes ran and still did not close.
    let start = op.ctx.metrics.reconciles_of("ConnectionClose");
    let op_ref = &op;
    wait_until(
        "two more ConnectionClose passes",
        Duration::from_secs(90),
        || async move { (op_ref.ctx.metrics.reconciles_of("ConnectionClose") >= start + 2).then_some(()) },
    )
    .await;
    assert!(
        connection_of(&s.m, &client).await.is_some(),
        "not closed before the re-confirmation"
    );
    assert!(s.audit().await.is_empty(), "no command");
    // Re-confirm after reading it: remove, then set again.
    for confirm in [serde_json::Value::Null, json!(client)] {
        s.closes()
            .patch(
                "early",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"confirm": confirm}})),
            )
            .await
            .expect("patch confirm");
        if confirm.is_null() {
            s.wait("early", "shown again", |c| {
                c.status
                    .as_ref()
                    .is_some_and(|st| st.shown_generation == c.metadata.generation)
            })
            .await;
        }
    }
    s.wait("early", "Completed", |c| phase(c) == Some(ClosePhase::Completed))
        .await;
    assert!(
        connection_of(&s.m, &client).await.is_none(),
        "closed once confirmed after review"
    );
    let _ = s.m.destroy_queue(&s.queue, true).await;
}

/// A close whose node does not answer is never Complete or "already gone".
#[tokio::test]
async fn a_close_on_a_node_that_does_not_answer_is_never_complete() {
    let _x = brokers_exclusive().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("cc-down").await;
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    let cluster = crate::support::wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let c3 = bed.broker("c3").jolokia;
    let node = cluster
        .status
        .and_then(|s| {
            s.nodes
                .into_iter()
                .find(|n| n.active_endpoint.as_deref() == Some(c3.as_str()))
        })
        .expect("c3's node")
        .node_id;
    bed.broker_action("freeze", "c3");
    let _thaw = Thaw(&bed, "c3");
    let closes: Api<ConnectionClose> = Api::namespaced(admin.clone(), &ns);
    let c: ConnectionClose = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
        "metadata": {"name": "down", "annotations": {"artemis-studio.io/confirm-without-review": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "target": {"node": node, "connectionId": "any"}, "confirm": "app"}
    }))
    .expect("close json");
    closes.create(&PostParams::default(), &c).await.expect("create");
    let start = op.ctx.metrics.reconciles_of("ConnectionClose");
    let op_ref = &op;
    wait_until(
        "three ConnectionClose passes",
        Duration::from_secs(120),
        || async move { (op_ref.ctx.metrics.reconciles_of("ConnectionClose") >= start + 3).then_some(()) },
    )
    .await;
    let c = closes.get("down").await.expect("get");
    let status = c.status.expect("status");
    assert_ne!(status.phase, ClosePhase::Completed, "{status:?}");
    assert!(!status.already_gone, "{status:?}");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.reason == "NodeNotLive" || c.reason == "TargetUnreadable"),
        "{:?}",
        status.conditions
    );
}

/// D6: an address close counts every consumer connection over every page: a node with more than
/// 1,000 consumers (one busy connection) and two more connections, cap 2 → refused.
#[tokio::test]
async fn an_address_close_counts_every_connection_beyond_the_first_page() {
    let _b = brokers_shared().await;
    let f = crate::queue::fixture("cc-many", Some(2)).await;
    let id = short_id();
    f.clean.also(&id);
    let queue = format!("cc.many.{id}");
    f.create(&queue.replace('.', "-"), json!({"name": queue})).await;
    f.wait_for(&queue.replace('.', "-"), "Ready", crate::queue::ready)
        .await;
    // One connection with 1,001 consumers first (they fill the first page), then two more.
    let b = f.bed.broker("c1");
    let (u, p) = f.bed.broker_user();
    let url = b.amqp.replace("amqp://", &format!("amqp://{u}:{p}@"));
    let mut busy = fe2o3_amqp::Connection::open(format!("busy-{}", short_id()), url.as_str())
        .await
        .expect("AMQP connection");
    let mut session = fe2o3_amqp::Session::builder()
        .handle_max(4096u32)
        .begin(&mut busy)
        .await
        .expect("AMQP session");
    let mut receivers = vec![];
    for i in 0..1001 {
        receivers.push(
            fe2o3_amqp::Receiver::attach(&mut session, format!("r{i}"), queue.as_str())
                .await
                .expect("receiver"),
        );
    }
    let _x = amqp_consumer(&f.bed, "c1", &queue, &format!("x-{}", short_id())).await;
    let _y = amqp_consumer(&f.bed, "c1", &queue, &format!("y-{}", short_id())).await;
    let c: ConnectionClose = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
        "metadata": {"name": "many"},
        "spec": {"clusterRef": {"name": "c"}, "target": {"address": queue}, "confirm": queue}
    }))
    .expect("close json");
    let closes: Api<ConnectionClose> = Api::namespaced(f.admin.clone(), &f.ns);
    closes.create(&PostParams::default(), &c).await.expect("create");
    let c = wait_until(
        "the close is refused for the cap",
        Duration::from_secs(120),
        || {
            let closes = closes.clone();
            async move {
                closes
                    .get("many")
                    .await
                    .ok()
                    .filter(|c| phase(c) == Some(ClosePhase::Failed))
            }
        },
    )
    .await;
    let status = c.status.expect("status");
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("BULK_CAP_EXCEEDED")),
        "{:?}",
        status.message
    );
    let counted: u64 = status
        .snapshot
        .expect("preview")
        .per_node
        .iter()
        .map(|p| p.connections)
        .sum();
    assert_eq!(
        counted, 3,
        "three distinct connections, counted past the first 1,000 rows"
    );
    drop(receivers);
    let _ = busy.close().await;
}

/// Issue 22 item 6: an address close by two operator processes is armed by one compare-and-swap
/// and called once (one audit row, `armedBy` set).
#[tokio::test]
async fn two_operator_processes_close_an_address_exactly_once() {
    let _b = brokers_shared().await;
    let s = setup("cc-addr-two").await;
    let client = format!("addr-twice-{}", short_id());
    let _consumer = amqp_consumer(&s.bed, "c1", &s.queue, &client).await;
    let base = 18_000 + (std::process::id() % 400) as u16;
    let _a = s.bed.spawn_operator(&s.ns, &s.db, base, &[]);
    let _b2 = s.bed.spawn_operator(&s.ns, &s.db, base + 400, &[]);
    let http = reqwest::Client::new();
    for port in [base, base + 400] {
        wait_ready(&http, port).await;
    }
    crate::support::wait_cluster_condition(&s.admin, &s.ns, "c", "Ready", "True").await;
    let c: ConnectionClose = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
        "metadata": {"name": "by-address", "annotations": {"artemis-studio.io/confirm-without-review": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "target": {"address": s.queue}, "confirm": s.queue}
    }))
    .expect("close json");
    s.closes()
        .create(&PostParams::default(), &c)
        .await
        .expect("create");
    let c = s
        .wait("by-address", "Completed", |c| {
            phase(c) == Some(ClosePhase::Completed)
        })
        .await;
    assert!(
        c.status.as_ref().and_then(|st| st.armed_by.clone()).is_some(),
        "armed by one named process: {:?}",
        c.status
    );
    wait_until("the client is disconnected", Duration::from_secs(30), || async {
        connection_of(&s.m, &client).await.is_none().then_some(())
    })
    .await;
    let rows = s.audit().await;
    let closes: Vec<_> = rows.iter().filter(|(c, _)| c == "connection.close").collect();
    assert_eq!(closes.len(), 1, "one address close, by one process: {rows:?}");
    let _ = s.m.destroy_queue(&s.queue, true).await;
}

/// Issue 22 item 6: an address close created with `confirm` already set (no review annotation)
/// closes nothing on its first pass: it shows the consequence and waits; a confirmation given
/// after that closes.
#[tokio::test]
async fn an_address_close_confirmed_before_the_consequence_was_shown_waits() {
    let _b = brokers_shared().await;
    let s = setup("cc-addr-review").await;
    let client = format!("addr-review-{}", short_id());
    let _consumer = amqp_consumer(&s.bed, "c1", &s.queue, &client).await;
    let port = 18_900 + (std::process::id() % 90) as u16;
    let _op = s.bed.spawn_operator(&s.ns, &s.db, port, &[]);
    let c: ConnectionClose = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
        "metadata": {"name": "eager"},
        "spec": {"clusterRef": {"name": "c"}, "target": {"address": s.queue}, "confirm": s.queue}
    }))
    .expect("close json");
    s.closes()
        .create(&PostParams::default(), &c)
        .await
        .expect("create");
    // A pass ran (it wrote the preview and the consequence) and closed nothing.
    let c = s
        .wait(
            "eager",
            "awaiting a confirmation given after the consequence",
            |c| {
                phase(c) == Some(ClosePhase::AwaitingConfirmation)
                    && c.status.as_ref().is_some_and(|st| st.shown_generation.is_some())
            },
        )
        .await;
    let message = c
        .status
        .as_ref()
        .and_then(|st| st.message.clone())
        .unwrap_or_default();
    assert!(message.contains("before the consequence was shown"), "{message}");
    assert!(
        connection_of(&s.m, &client).await.is_some(),
        "the client is still connected"
    );
    assert!(
        !s.audit().await.iter().any(|(c, _)| c == "connection.close"),
        "no close was sent"
    );
    // Confirmed again, after it was shown: now it closes.
    for confirm in [serde_json::Value::Null, json!(s.queue)] {
        s.closes()
            .patch(
                "eager",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"confirm": confirm}})),
            )
            .await
            .expect("confirm");
    }
    s.wait("eager", "Completed", |c| phase(c) == Some(ClosePhase::Completed))
        .await;
    wait_until("the client is disconnected", Duration::from_secs(30), || async {
        connection_of(&s.m, &client).await.is_none().then_some(())
    })
    .await;
    let _ = s.m.destroy_queue(&s.queue, true).await;
}
