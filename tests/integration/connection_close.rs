//! ConnectionClose (issue 6, ADR-0057) with real brokers and real AMQP clients.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use artemis_studio_operator::api::Outcome;
use artemis_studio_operator::api::connection_close::{ClosePhase, ConnectionClose};
use artemis_studio_operator::broker::BrokerManagement;
use artemis_studio_operator::broker::management::ListKind;

use crate::queue::{Fixture, fixture, ready};
use crate::support::{
    TestBed, amqp_consumer, brokers_shared, connection_of, send_messages, short_id, wait_until,
};

impl Fixture {
    pub(crate) fn closes(&self) -> Api<ConnectionClose> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    async fn create_close(&self, name: &str, spec: serde_json::Value) {
        let mut spec = spec;
        spec["clusterRef"] = json!({"name": "c"});
        let c: ConnectionClose = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("close json");
        self.closes()
            .create(&PostParams::default(), &c)
            .await
            .expect("create ConnectionClose");
    }

    /// A close confirmed at creation by automation (no review: the annotation says so).
    pub(crate) async fn create_close_without_review(&self, name: &str, spec: serde_json::Value) {
        let mut spec = spec;
        spec["clusterRef"] = json!({"name": "c"});
        let c: ConnectionClose = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
            "metadata": {"name": name, "annotations": {"artemis-studio.io/confirm-without-review": "true"}},
            "spec": spec
        }))
        .expect("close json");
        self.closes()
            .create(&PostParams::default(), &c)
            .await
            .expect("create ConnectionClose");
    }

    pub(crate) async fn wait_phase(&self, name: &str, phase: ClosePhase) -> ConnectionClose {
        let api = self.closes();
        wait_until(
            &format!("ConnectionClose {name} {phase:?}"),
            Duration::from_secs(60),
            || {
                let api = api.clone();
                async move {
                    api.get(name)
                        .await
                        .ok()
                        .filter(|c| c.status.as_ref().is_some_and(|s| s.phase == phase))
                }
            },
        )
        .await
    }

    async fn confirm(&self, name: &str, value: &str) {
        self.closes()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"confirm": value}})),
            )
            .await
            .expect("patch confirm");
    }

    /// Positive evidence that a pass of the close ran after now, for "nothing happened" to be
    /// read from (never a sleep): the object is touched (an annotation of the test's) and this
    /// operator's finished ConnectionClose reconciles grow.
    async fn a_later_pass(&self, name: &str) {
        let reconciles = || self.op.ctx.metrics.reconciles_of("ConnectionClose");
        let before = reconciles();
        let poke = json!({"metadata": {"annotations": {"test.artemis-studio.io/poke": short_id()}}});
        self.closes()
            .patch(name, &PatchParams::default(), &Patch::Merge(poke))
            .await
            .expect("touch the close");
        wait_until(
            &format!("a later pass of ConnectionClose {name}"),
            Duration::from_secs(60),
            || async { (reconciles() > before).then_some(()) },
        )
        .await;
    }

    /// The management of one test bed broker and its logical node ID.
    pub(crate) async fn broker(&self, name: &str) -> (String, BrokerManagement) {
        let url = self.bed.broker(name).jolokia;
        let t = self.topology().await;
        let node = t.find(&url).expect("node");
        (node.node_id.clone(), node.active.clone().expect("live"))
    }

    pub(crate) async fn queue_on(&self, name: &str) -> String {
        let id = short_id();
        self.clean.also(&id);
        let q = format!("cc.{name}.{id}");
        self.create(&q.replace('.', "-"), json!({"name": q})).await;
        self.wait_for(&q.replace('.', "-"), "Ready", ready).await;
        q
    }
}

#[tokio::test]
async fn a_confirmed_close_disconnects_the_client_and_returns_its_in_flight_messages() {
    let _b = brokers_shared().await;
    let f = fixture("cc-confirm", None).await;
    let queue = f.queue_on("confirm").await;
    let client = format!("orders-app-{}", short_id());
    let consumer = amqp_consumer(&f.bed, "c1", &queue, &client).await;
    send_messages(&f.bed, "c1", &queue, 3).await;
    let (node, m) = f.broker("c1").await;
    wait_until(
        "3 messages in flight to the consumer",
        Duration::from_secs(30),
        || async {
            let t = f.topology().await;
            (t.find(&node)?
                .inventory
                .as_ref()?
                .queues
                .get(&queue)?
                .delivering_count
                == 3)
                .then_some(())
        },
    )
    .await;
    let connection = connection_of(&m, &client)
        .await
        .expect("the consumer's connection");

    f.create_close(
        "close-it",
        json!({"target": {"node": node, "connectionId": connection}}),
    )
    .await;
    let c = f.wait_phase("close-it", ClosePhase::AwaitingConfirmation).await;
    let status = c.status.expect("status");
    let snapshot = status.snapshot.expect("snapshot");
    assert_eq!(snapshot.client_id.as_deref(), Some(client.as_str()));
    assert_eq!(snapshot.in_flight_messages, Some(3));
    assert_eq!(snapshot.consumer_count, 1);
    assert!(
        status
            .consequence
            .as_deref()
            .is_some_and(|c| c.contains("returns 3 in-flight")
                && c.contains("DLQ")
                && c.contains("measured"))
    );

    f.confirm("close-it", &client).await;
    let c = f.wait_phase("close-it", ClosePhase::Completed).await;
    let status = c.status.expect("status");
    assert_eq!(status.nodes.len(), 1);
    assert_eq!(status.nodes[0].outcome, Outcome::Applied);
    assert!(!status.already_gone);
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
    );
    let rows: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT outcome, params FROM audit_event WHERE command = 'connection.close'")
            .fetch_all(f.op.store.pool())
            .await
            .expect("audit");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].1["snapshot"]["clientId"],
        client.as_str(),
        "the audit names the application"
    );

    let mut receiver = consumer.receiver;
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            // Deliveries already buffered may come first; then the disconnect.
            if receiver
                .recv::<fe2o3_amqp::types::primitives::Value>()
                .await
                .is_err()
            {
                break;
            }
        }
    })
    .await;
    assert!(seen.is_ok(), "the client sees the disconnect");

    // The in-flight messages are back on the queue.
    wait_until(
        "3 messages back on the queue",
        Duration::from_secs(30),
        || async {
            let t = f.topology().await;
            let q = t.find(&node)?.inventory.as_ref()?.queues.get(&queue)?.clone();
            (q.message_count == 3 && q.delivering_count == 0).then_some(())
        },
    )
    .await;
    let mut again = amqp_consumer(&f.bed, "c1", &queue, &format!("second-{}", short_id())).await;
    let delivery = tokio::time::timeout(
        Duration::from_secs(20),
        again.receiver.recv::<fe2o3_amqp::types::primitives::Value>(),
    )
    .await
    .expect("a redelivery")
    .expect("a message");
    // What the consequence states, measured: with AMQP consumers on 2.40 the redelivered
    // message's delivery count is 0 or 1 after a close (the interrupted delivery may count once).
    let count = delivery.message().header.as_ref().map_or(0, |h| h.delivery_count);
    assert!(
        count <= 1,
        "a close counts the interrupted delivery at most once: {count}"
    );
    let _ = again.receiver.accept(&delivery).await;
}

#[tokio::test]
async fn a_wrong_confirmation_names_the_client_the_broker_reports() {
    let _b = brokers_shared().await;
    let f = fixture("cc-wrong", None).await;
    let queue = f.queue_on("wrong").await;
    let client = format!("billing-{}", short_id());
    let _consumer = amqp_consumer(&f.bed, "c1", &queue, &client).await;
    let (node, m) = f.broker("c1").await;
    let connection = connection_of(&m, &client).await.expect("connection");
    f.create_close(
        "wrong",
        json!({"target": {"node": node, "connectionId": connection}, "confirm": "orders-app"}),
    )
    .await;
    let c = f.wait_phase("wrong", ClosePhase::AwaitingConfirmation).await;
    let message = c.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains(&client) && message.contains("orders-app"),
        "{message}"
    );
    f.a_later_pass("wrong").await;
    assert!(connection_of(&m, &client).await.is_some(), "still connected");
}

#[tokio::test]
async fn a_connection_gone_before_the_confirmation_completes_as_already_gone() {
    let _b = brokers_shared().await;
    let f = fixture("cc-gone", None).await;
    let queue = f.queue_on("gone").await;
    let client = format!("shortlived-{}", short_id());
    let mut consumer = amqp_consumer(&f.bed, "c1", &queue, &client).await;
    let (node, m) = f.broker("c1").await;
    let connection = connection_of(&m, &client).await.expect("connection");
    f.create_close(
        "gone",
        json!({"target": {"node": node, "connectionId": connection}}),
    )
    .await;
    f.wait_phase("gone", ClosePhase::AwaitingConfirmation).await;
    let _ = consumer.receiver.close().await;
    let _ = consumer.session.end().await;
    let _ = consumer.connection.close().await;
    wait_until("the connection is gone", Duration::from_secs(30), || async {
        connection_of(&m, &client).await.is_none().then_some(())
    })
    .await;
    f.confirm("gone", &client).await;
    let c = f.wait_phase("gone", ClosePhase::Completed).await;
    let status = c.status.expect("status");
    assert!(status.already_gone);
    assert_eq!(status.nodes[0].outcome, Outcome::Already);
}

#[tokio::test]
async fn session_and_consumer_targets_and_a_wrong_node_never_close_elsewhere() {
    let _b = brokers_shared().await;
    let f = fixture("cc-scope", None).await;
    let queue = f.queue_on("scope").await;
    let client = format!("worker-{}", short_id());
    let _consumer = amqp_consumer(&f.bed, "c1", &queue, &client).await;
    let (c1, m) = f.broker("c1").await;
    let (c2, _) = f.broker("c2").await;
    let connection = connection_of(&m, &client).await.expect("connection");

    // The right id on the wrong node: nothing there, nothing closed anywhere.
    f.create_close(
        "wrong-node",
        json!({"target": {"node": c2, "connectionId": connection}, "confirm": client, "ttlSecondsAfterFinished": 2}),
    )
    .await;
    let c = f.wait_phase("wrong-node", ClosePhase::Completed).await;
    assert!(c.status.expect("status").already_gone);
    assert!(
        connection_of(&m, &client).await.is_some(),
        "the connection on c1 is untouched"
    );
    // ttlSecondsAfterFinished: the finished object goes away.
    wait_until(
        "the finished ConnectionClose is deleted after its TTL",
        Duration::from_secs(60),
        || async {
            f.closes()
                .get_opt("wrong-node")
                .await
                .ok()
                .and_then(|o| o.is_none().then_some(()))
        },
    )
    .await;

    // A consumer target: the consumer goes, the connection stays.
    let sessions = m
        .list(ListKind::Sessions, "connectionID", &connection)
        .await
        .expect("sessions");
    let session = sessions
        .iter()
        .find(|s| s["consumerCount"].as_u64() == Some(1))
        .and_then(|s| s["id"].as_str())
        .expect("the consumer's session")
        .to_string();
    let consumers = m
        .list(ListKind::Consumers, "session", &session)
        .await
        .expect("consumers");
    let consumer_id = consumers[0]["id"].as_str().expect("consumer id").to_string();
    f.create_close_without_review(
        "consumer",
        json!({"target": {"node": c1, "sessionId": session, "consumerId": consumer_id}, "confirm": client}),
    )
    .await;
    let c = f.wait_phase("consumer", ClosePhase::Completed).await;
    assert_eq!(c.status.expect("status").nodes[0].outcome, Outcome::Applied);
    assert!(
        m.list(ListKind::Consumers, "session", &session)
            .await
            .expect("consumers")
            .is_empty()
    );
    assert!(
        connection_of(&m, &client).await.is_some(),
        "closing a consumer keeps its connection"
    );

    // A session target.
    f.create_close_without_review(
        "session",
        json!({"target": {"node": c1, "connectionId": connection, "sessionId": session}, "confirm": client}),
    )
    .await;
    let c = f.wait_phase("session", ClosePhase::Completed).await;
    assert_eq!(c.status.expect("status").nodes[0].outcome, Outcome::Applied);
    // The session is gone; its connection survived.
    let left = m
        .list(ListKind::Sessions, "connectionID", &connection)
        .await
        .expect("sessions");
    assert!(
        left.iter().all(|s| s["id"].as_str() != Some(session.as_str())),
        "the session is gone: {left:?}"
    );
    assert!(
        connection_of(&m, &client).await.is_some(),
        "closing a session keeps its connection"
    );
}

#[tokio::test]
async fn an_address_close_reports_per_node_and_respects_the_bulk_cap() {
    let _b = brokers_shared().await;
    let f = fixture("cc-addr", Some(1)).await;
    let queue = f.queue_on("addr").await;
    let _a = amqp_consumer(&f.bed, "c1", &queue, &format!("a-{}", short_id())).await;
    let _b2 = amqp_consumer(&f.bed, "c2", &queue, &format!("b-{}", short_id())).await;
    f.create_close("capped", json!({"target": {"address": queue}, "confirm": queue}))
        .await;
    let c = f.wait_phase("capped", ClosePhase::Failed).await;
    let status = c.status.expect("status");
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("BULK_CAP_EXCEEDED") && m.contains("allowBulk")),
        "{:?}",
        status.message
    );
    assert_eq!(
        status
            .snapshot
            .expect("preview")
            .per_node
            .iter()
            .map(|p| p.connections)
            .sum::<u64>(),
        2
    );

    f.create_close(
        "allowed",
        json!({"target": {"address": queue}, "allowBulk": true}),
    )
    .await;
    f.wait_phase("allowed", ClosePhase::AwaitingConfirmation).await;
    f.confirm("allowed", &queue).await;
    let c = f.wait_phase("allowed", ClosePhase::Completed).await;
    let nodes = c.status.expect("status").nodes;
    assert_eq!(nodes.len(), 3);
    assert_eq!(
        nodes.iter().filter(|n| n.outcome == Outcome::Applied).count(),
        2,
        "{nodes:?}"
    );
    assert_eq!(
        nodes.iter().filter(|n| n.outcome == Outcome::Already).count(),
        1,
        "{nodes:?}"
    );
}

#[tokio::test]
async fn a_close_found_armed_after_a_restart_fails_and_is_never_retried() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("cc-crash").await;
    let admin = bed.kube_admin().await;
    crate::smoke::install_crds(&admin).await;
    crate::support::create_cluster(
        &admin,
        &ns,
        "c",
        &bed.cluster_brokers("c")
            .into_iter()
            .map(|b| b.jolokia)
            .collect::<Vec<_>>(),
        Some(bed.broker_user()),
    )
    .await;
    // A queue and a consumer, made directly (no operator is running yet).
    let t = artemis_studio_operator::topology::poll(&bed.access("c", bed.broker_user()), &Default::default())
        .await;
    let node = t.find(&bed.broker("c1").jolokia).expect("c1").clone();
    let m = node.active.clone().expect("live");
    let id = short_id();
    let clean = bed.clean_up(&[&id]);
    let queue = format!("cc.crash.{id}");
    m.create_queue(
        &json!({"name": queue, "address": queue, "routing-type": "ANYCAST", "auto-create-address": true}),
    )
    .await
    .expect("queue");
    let client = format!("survivor-{}", short_id());
    let _consumer = amqp_consumer(&bed, "c1", &queue, &client).await;
    let connection = connection_of(&m, &client).await.expect("connection");
    // The state an operator killed between persisting Closing and the call leaves behind.
    let closes: Api<ConnectionClose> = Api::namespaced(admin.clone(), &ns);
    let c: ConnectionClose = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose", "metadata": {"name": "armed"},
        "spec": {"clusterRef": {"name": "c"}, "target": {"node": node.node_id, "connectionId": connection}, "confirm": client}
    }))
    .expect("json");
    closes.create(&PostParams::default(), &c).await.expect("create");
    closes
        .patch_status(
            "armed",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Closing"}})),
        )
        .await
        .expect("status Closing");

    let op = bed.start_operator(&ns).await;
    let f = Fixture {
        bed,
        ns,
        admin,
        op,
        clean,
    };
    let c = f.wait_phase("armed", ClosePhase::Failed).await;
    let message = c.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("outcome unknown, not retried"), "{message}");
    f.a_later_pass("armed").await;
    assert!(
        connection_of(&m, &client).await.is_some(),
        "nothing was retried: the connection is still open"
    );
    let _ = m.destroy_queue(&queue, true).await;
}

#[tokio::test]
async fn bad_targets_are_refused_at_admission_and_only_confirm_may_change() {
    let bed = TestBed::get();
    let admin = bed.kube_admin().await;
    crate::smoke::install_crds(&admin).await;
    let ns = bed.fresh_namespace("cc-admit").await;
    let closes: Api<ConnectionClose> = Api::namespaced(admin, &ns);
    let make = |name: &str, target: serde_json::Value| -> ConnectionClose {
        serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose", "metadata": {"name": name},
            "spec": {"clusterRef": {"name": "c"}, "target": target}
        }))
        .expect("json")
    };
    for (name, target, needle) in [
        (
            "two",
            json!({"node": "n", "connectionId": "x", "address": "a"}),
            "names only the address",
        ),
        ("none", json!({}), "node is required"),
        (
            "nonode",
            json!({"sessionId": "s", "consumerId": "1"}),
            "node is required",
        ),
    ] {
        let err = closes
            .create(&PostParams::default(), &make(name, target))
            .await
            .expect_err(name);
        assert!(err.to_string().contains(needle), "{name}: {err}");
    }
    closes
        .create(
            &PostParams::default(),
            &make("ok", json!({"node": "n", "connectionId": "x"})),
        )
        .await
        .expect("valid");
    closes
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"confirm": "app"}})),
        )
        .await
        .expect("confirm may change");
    let err = closes
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"target": {"connectionId": "y"}}})),
        )
        .await
        .expect_err("the target may not change");
    assert!(err.to_string().contains("immutable except spec.confirm"), "{err}");
}
