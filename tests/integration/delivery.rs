//! Issue 49: a queue's delivery paused and resumed on every live node, declared and audited —
//! the broker's own persisted pause, a hand-made resume put back and reported, a dry run that
//! says what a pause would do and pauses nothing.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;

use artemis_studio_operator::api::Outcome;
use artemis_studio_operator::api::queue::ArtemisQueue;

use crate::capture::{amqp_send, queue_attr};
use crate::queue::{fixture, ready};
use crate::support::{amqp_consumer, brokers_shared, short_id, wait_until};

const NODES: [&str; 3] = ["c1", "c2", "c3"];

async fn paused_on(f: &crate::queue::Fixture, queue: &str) -> Vec<bool> {
    let mut v = vec![];
    for b in NODES {
        v.push(queue_attr(&f.bed, &f.bed.broker(b), queue, "Paused").await == json!(true));
    }
    v
}

async fn set_spec(f: &crate::queue::Fixture, obj: &str, spec: serde_json::Value) {
    f.queues()
        .patch(
            obj,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("patch the queue");
}

/// Every node in the requested state for the object's current generation.
fn converged(q: &ArtemisQueue) -> bool {
    let s = q.status.as_ref();
    ready(q)
        && s.is_some_and(|s| {
            s.observed_generation == q.metadata.generation
                && s.nodes.len() == 3
                && s.nodes
                    .iter()
                    .all(|n| matches!(n.outcome, Outcome::Applied | Outcome::Already))
        })
}

#[tokio::test]
async fn delivery_pauses_on_every_node_is_put_back_when_resumed_by_hand_and_resumes() {
    let _b = brokers_shared().await;
    let f = fixture("delivery", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (obj, queue) = (format!("deliv-{id}"), format!("deliv.{id}"));
    f.create(&obj, json!({"name": queue})).await;
    f.wait_for(&obj, "Ready", ready).await;
    let mut consumer = amqp_consumer(&f.bed, "c1", &queue, &format!("deliv-{id}")).await;

    // Dry run: every node WOULD_APPLY, saying what the pause would do; nothing is paused.
    set_spec(&f, &obj, json!({"dryRun": true, "delivery": "Paused"})).await;
    let q = f
        .wait_for(&obj, "a dry run of the pause on every node", |q| {
            q.status.as_ref().is_some_and(|s| {
                s.observed_generation == q.metadata.generation
                    && s.nodes.len() == 3
                    && s.nodes.iter().all(|n| {
                        n.outcome == Outcome::WouldApply
                            && n.message.contains("pause delivery")
                            && n.message.contains("consumer(s) stop receiving")
                    })
            })
        })
        .await;
    assert_eq!(paused_on(&f, &queue).await, [false; 3], "{:?}", q.status);

    // Paused: every node's own pause, one audit row naming the nodes.
    set_spec(&f, &obj, json!({"dryRun": false})).await;
    f.wait_for(&obj, "paused on every node", converged).await;
    assert_eq!(paused_on(&f, &queue).await, [true; 3]);
    let rows = f.audit_rows("queue.").await;
    let pause = rows
        .iter()
        .rev()
        .find(|(_, _, detail)| detail.to_string().contains("delivery"))
        .unwrap_or_else(|| panic!("no audit row of the pause: {rows:?}"));
    for b in NODES {
        let node = crate::cluster_core::node_id_of(&f.bed, b).await;
        assert!(pause.2.to_string().contains(&node), "{b} not in {pause:?}");
    }
    // A producer's messages arrive and wait; the consumer gets none of them.
    amqp_send(&f.bed, "c1", &queue, 5, "held")
        .await
        .expect("producer");
    wait_until("5 messages waiting on c1", Duration::from_secs(30), || async {
        (queue_attr(&f.bed, &f.bed.broker("c1"), &queue, "MessageCount").await == json!(5)).then_some(())
    })
    .await;
    let early = tokio::time::timeout(
        Duration::from_secs(2),
        consumer.receiver.recv::<fe2o3_amqp::types::primitives::Value>(),
    )
    .await;
    assert!(early.is_err(), "a paused queue delivered: {early:?}");

    // Resumed by hand on c2: paused again, and the status names who undid what.
    let c2 = f.bed.broker("c2");
    let mbean = format!(
        "org.apache.activemq.artemis:broker=\"c2\",component=addresses,address=\"{queue}\",subcomponent=queues,routing-type=\"anycast\",queue=\"{queue}\""
    );
    let (status, body) = crate::support::jolokia_raw(
        &c2,
        &f.bed.broker_user(),
        Some("http://localhost"),
        json!({"type": "exec", "mbean": mbean, "operation": "resume()", "arguments": []}),
    )
    .await;
    assert_eq!(
        body["status"],
        json!(200),
        "resume by hand on c2: {status:?} {body}"
    );
    wait_until("c2 paused again", Duration::from_secs(60), || async {
        (paused_on(&f, &queue).await == [true; 3]).then_some(())
    })
    .await;
    let c2_node = crate::cluster_core::node_id_of(&f.bed, "c2").await;
    f.wait_for(&obj, "the hand-made resume reported", |q| {
        q.status
            .as_ref()
            .and_then(|s| s.not_owned.as_ref())
            .is_some_and(|n| {
                n.other_writer
                    .iter()
                    .any(|w| w.node == c2_node && w.fields.iter().any(|f| f == "delivery"))
            })
    })
    .await;

    // Active: delivered, everything sent meanwhile.
    set_spec(&f, &obj, json!({"delivery": "Active"})).await;
    f.wait_for(&obj, "active on every node", converged).await;
    assert_eq!(paused_on(&f, &queue).await, [false; 3]);
    for i in 0..5 {
        let got = tokio::time::timeout(
            Duration::from_secs(30),
            consumer.receiver.recv::<fe2o3_amqp::types::primitives::Value>(),
        )
        .await
        .unwrap_or_else(|_| panic!("message {i} not delivered after the resume"))
        .expect("receive");
        consumer.receiver.accept(&got).await.expect("accept");
    }
    let _ = consumer.receiver.close().await;
    let _ = consumer.session.end().await;
    let _ = consumer.connection.close().await;
    f.queues()
        .delete(&obj, &Default::default())
        .await
        .expect("delete");
    f.wait_gone(&obj).await;
}

/// Issue 49: the pause is the broker's own, persisted: a broker restarted while the queue is
/// paused comes back paused. The object is annotated paused first, so the operator writes
/// nothing meanwhile and what c3 reports after its restart is what c3 kept.
#[tokio::test]
async fn a_broker_restarted_while_paused_comes_back_paused() {
    let _b = crate::support::brokers_exclusive().await;
    let f = fixture("delivery-restart", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (obj, queue) = (format!("deliv-r-{id}"), format!("deliv.r.{id}"));
    f.create(&obj, json!({"name": queue, "delivery": "Paused"})).await;
    f.wait_for(&obj, "paused on every node", converged).await;
    assert_eq!(paused_on(&f, &queue).await, [true; 3]);
    let annotate = |value: serde_json::Value| {
        Patch::Merge(json!({"metadata": {"annotations": {"artemis-studio.io/paused": value}}}))
    };
    f.queues()
        .patch(&obj, &PatchParams::default(), &annotate(json!("true")))
        .await
        .expect("annotate");
    f.wait_for(&obj, "Paused=True (the operator writes nothing)", |q| {
        crate::queue::condition(q, "Paused").is_some_and(|c| c.0 == "True")
    })
    .await;
    f.bed.broker_action("stop", "c3");
    f.bed.broker_action("start", "c3");
    let c3 = queue_attr(&f.bed, &f.bed.broker("c3"), &queue, "Paused").await;
    assert_eq!(c3, json!(true), "c3 came back with {queue} not paused");
    f.queues()
        .patch(&obj, &PatchParams::default(), &annotate(serde_json::Value::Null))
        .await
        .expect("remove the annotation");
    f.wait_for(&obj, "converged after the restart", converged).await;
    f.queues()
        .delete(&obj, &Default::default())
        .await
        .expect("delete");
    f.wait_gone(&obj).await;
}
