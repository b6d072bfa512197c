//! Issue 49: a queue's delivery paused and resumed on every live node, declared and audited —
//! the broker's own persisted pause, a hand-made resume put back and reported, a pause made by
//! hand without persistence shown per node and persisted once declared, a dry run that says
//! what a pause would do and pauses nothing.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;

use artemis_studio_operator::api::queue::{ArtemisQueue, DeliveryState};
use artemis_studio_operator::api::{NodeOutcome, Outcome};

use crate::capture::{amqp_send, queue_attr};
use crate::queue::{fixture, ready};
use crate::support::{amqp_consumer, brokers_shared, jolokia_raw, short_id, wait_until};

const NODES: [&str; 3] = ["c1", "c2", "c3"];

/// The poll interval of the cluster these tests use (`support::create_cluster`:
/// `pollIntervalSeconds: 2`).
const POLL: Duration = Duration::from_secs(2);

/// How long a change made by hand may stand before the operator has acted on it: the poll that
/// sees it (every poll reads each node's queues while a node has at most 500), the pass it
/// triggers and that pass's write — two poll intervals, and a margin for the pass itself.
const WITHIN_TWO_POLLS: Duration = Duration::from_secs(2 * POLL.as_secs() + 3);

/// Operations run by hand on one node's queue, in one POST (as a JMX console user would).
async fn by_hand(f: &crate::queue::Fixture, broker: &str, queue: &str, operations: &[&str]) {
    let mbean = format!(
        "org.apache.activemq.artemis:broker=\"{broker}\",component=addresses,address=\"{queue}\",subcomponent=queues,routing-type=\"anycast\",queue=\"{queue}\""
    );
    let body: Vec<serde_json::Value> = operations
        .iter()
        .map(|op| json!({"type": "exec", "mbean": mbean, "operation": op, "arguments": []}))
        .collect();
    let (status, answer) = jolokia_raw(
        &f.bed.broker(broker),
        &f.bed.broker_user(),
        Some("http://localhost"),
        json!(body),
    )
    .await;
    let done = answer
        .as_array()
        .is_some_and(|a| a.len() == operations.len() && a.iter().all(|e| e["status"] == json!(200)));
    assert!(done, "{operations:?} by hand on {broker}: {status} {answer}");
}

/// The queue's `PersistedPause` on one node (Artemis 2.41+); None where the broker has no such
/// attribute (Artemis 2.40: its read answers AttributeNotFoundException).
async fn persisted_pause(f: &crate::queue::Fixture, broker: &str, queue: &str) -> Option<bool> {
    queue_attr(&f.bed, &f.bed.broker(broker), queue, "PersistedPause")
        .await
        .as_bool()
}

/// Each node's delivery as the status reports it (`status.delivery`), in `NODES` order.
fn states(q: &ArtemisQueue, ids: &[String]) -> Vec<Option<DeliveryState>> {
    let reported = q.status.as_ref().map(|s| s.delivery.clone()).unwrap_or_default();
    ids.iter()
        .map(|id| reported.iter().find(|n| &n.node == id).map(|n| n.state))
        .collect()
}

fn outcome_on<'a>(q: &'a ArtemisQueue, node: &str) -> Option<&'a NodeOutcome> {
    q.status.as_ref()?.nodes.iter().find(|n| n.node == node)
}

/// The status names `node` as changed behind the operator's back, in `delivery`.
fn names_other_writer(q: &ArtemisQueue, node: &str) -> bool {
    q.status
        .as_ref()
        .and_then(|s| s.not_owned.as_ref())
        .is_some_and(|n| {
            n.other_writer
                .iter()
                .any(|w| w.node == node && w.fields.iter().any(|f| f == "delivery"))
        })
}

async fn node_ids(f: &crate::queue::Fixture) -> Vec<String> {
    let mut ids = vec![];
    for b in NODES {
        ids.push(crate::cluster_core::node_id_of(&f.bed, b).await);
    }
    ids
}

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
    for (b, node) in NODES.iter().zip(node_ids(&f).await) {
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

    // Resumed by hand on c2: paused again within two polls, and the status names who undid
    // what, and shows c2 paused again.
    let c2_node = crate::cluster_core::node_id_of(&f.bed, "c2").await;
    let resumed_at = tokio::time::Instant::now();
    by_hand(&f, "c2", &queue, &["resume()"]).await;
    wait_until("c2 paused again", WITHIN_TWO_POLLS, || async {
        (paused_on(&f, &queue).await == [true; 3]).then_some(())
    })
    .await;
    let api = f.queues();
    let reported = wait_until(
        "the hand-made resume on c2 reported in status",
        WITHIN_TWO_POLLS.saturating_sub(resumed_at.elapsed()) + POLL,
        || async {
            api.get(&obj)
                .await
                .ok()
                .filter(|q| names_other_writer(q, &c2_node))
        },
    )
    .await;
    let c2_state = states(&reported, std::slice::from_ref(&c2_node));
    assert!(
        matches!(
            c2_state[..],
            [Some(
                DeliveryState::Paused | DeliveryState::PausedPersistenceUnknown
            )]
        ),
        "c2 is reported {c2_state:?}: {:?}",
        reported.status
    );

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

/// Issue 49: the status reports each node's own delivery, declared or not, so a pause made by
/// hand on one node (`pause()`: not persisted) shows as that node differing and is left alone
/// while nothing is declared. Declared Paused, the other nodes are paused with persistence and
/// that node's pause, not persisted, is paused again with `pause(true)` — where the broker
/// reports `PersistedPause` (Artemis 2.41+); a pause made again by hand without persistence
/// while declared is persisted again within two polls and reported. Artemis 2.40 (this bed)
/// has no `PersistedPause`: there a pause is all the broker says, the node is ALREADY and the
/// status says its persistence is unknown.
#[tokio::test]
async fn a_pause_by_hand_without_persistence_shows_per_node_and_is_persisted_once_declared() {
    let _b = brokers_shared().await;
    let f = fixture("delivery-hand", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (obj, queue) = (format!("deliv-h-{id}"), format!("deliv.h.{id}"));
    let ids = node_ids(&f).await;
    f.create(&obj, json!({"name": queue})).await;
    let active = [Some(DeliveryState::Active); 3];
    f.wait_for(&obj, "Ready, every node delivering", |q| {
        ready(q) && states(q, &ids) == active
    })
    .await;

    // Nothing declared: c3 paused by hand shows as c3 differing, and stays as it is.
    by_hand(&f, "c3", &queue, &["pause()"]).await;
    let reports_persistence = persisted_pause(&f, "c3", &queue).await.is_some();
    let hand_paused = if reports_persistence {
        DeliveryState::PausedNotPersisted
    } else {
        DeliveryState::PausedPersistenceUnknown
    };
    let api = f.queues();
    let want = [active[0], active[1], Some(hand_paused)];
    let q = wait_until("c3's pause by hand in status", WITHIN_TWO_POLLS, || async {
        api.get(&obj).await.ok().filter(|q| states(q, &ids) == want)
    })
    .await;
    tokio::time::sleep(WITHIN_TWO_POLLS).await;
    assert_eq!(
        paused_on(&f, &queue).await,
        [false, false, true],
        "undeclared, the operator leaves the broker's pause alone: {:?}",
        q.status
    );

    // Declared Paused: every node paused; c3's pause persisted where the broker can say so.
    set_spec(&f, &obj, json!({"delivery": "Paused"})).await;
    let q = f.wait_for(&obj, "paused on every node", converged).await;
    assert_eq!(paused_on(&f, &queue).await, [true; 3]);
    let c3 = outcome_on(&q, &ids[2]).cloned();
    if !reports_persistence {
        // Artemis 2.40: nothing says c3's pause is not persisted.
        assert!(
            c3.as_ref().is_some_and(|n| n.outcome == Outcome::Already
                && n.message
                    .contains("does not report whether the pause is persisted")),
            "{c3:?}"
        );
        assert_eq!(
            states(&q, &ids),
            [Some(DeliveryState::PausedPersistenceUnknown); 3]
        );
        eprintln!(
            "note: this bed's brokers have no PersistedPause (Artemis before 2.41): a pause made by hand without persistence cannot be told from a persisted one there; the re-pause with pause(true) is checked by the unit tests only"
        );
    } else {
        assert!(
            c3.as_ref().is_some_and(
                |n| n.outcome == Outcome::Applied && n.detail.iter().any(|l| l.contains("not persisted"))
            ),
            "{c3:?}"
        );
        for b in NODES {
            assert_eq!(persisted_pause(&f, b, &queue).await, Some(true), "{b}");
        }
        let all_persisted = [Some(DeliveryState::Paused); 3];
        wait_until(
            "every node Paused (persisted) in status",
            WITHIN_TWO_POLLS,
            || async {
                api.get(&obj)
                    .await
                    .ok()
                    .filter(|q| states(q, &ids) == all_persisted)
            },
        )
        .await;
        // While declared: resumed and paused again by hand, in one POST, without persistence
        // — paused with persistence again within two polls, and named as another writer.
        let at = tokio::time::Instant::now();
        by_hand(&f, "c2", &queue, &["resume()", "pause()"]).await;
        wait_until("c2's pause persisted again", WITHIN_TWO_POLLS, || async {
            (persisted_pause(&f, "c2", &queue).await == Some(true)).then_some(())
        })
        .await;
        wait_until(
            "the pause by hand on c2 reported in status",
            WITHIN_TWO_POLLS.saturating_sub(at.elapsed()) + POLL,
            || async {
                api.get(&obj)
                    .await
                    .ok()
                    .filter(|q| names_other_writer(q, &ids[1]))
            },
        )
        .await;
    }
    f.queues()
        .delete(&obj, &Default::default())
        .await
        .expect("delete");
    f.wait_gone(&obj).await;
}
