//! Issue 22 item 1: two installations on one broker cluster (two operators, each watching its
//! own namespace, each with its own instance ID and audit database) declare one queue with
//! different filters, over a queue that already holds messages. The fight stops after one
//! repair: the side that finds its repair undone says the queue is contested (the field, both
//! values, another writer suspected) and writes no more. Issue 41: neither side's plain delete
//! destroys the queue, whichever side won, in either order and across a restart — each keeps
//! the evidence of the other writer (or of the adoption) in `status.notOwned`.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use artemis_studio_operator::api::RefusalKind;
use artemis_studio_operator::api::queue::ArtemisQueue;

use crate::support::{
    OperatorHandle, TestBed, brokers_shared, create_cluster, send_messages, send_messages_with, short_id,
    wait_cluster_condition, wait_until,
};

struct Side {
    ns: String,
    op: OperatorHandle,
    queues: Api<ArtemisQueue>,
}

async fn side(bed: &TestBed, admin: &kube::Client, prefix: &str) -> Side {
    let ns = bed.fresh_namespace(prefix).await;
    let op = bed.start_operator(&ns).await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    wait_cluster_condition(admin, &ns, "c", "Ready", "True").await;
    Side {
        queues: Api::namespaced(admin.clone(), &ns),
        ns,
        op,
    }
}

async fn writes(s: &Side) -> i64 {
    // Broker writes: an adoption is recorded without one.
    sqlx::query_scalar(
        "SELECT count(*) FROM audit_event WHERE command LIKE 'queue.%' AND command <> 'queue.adopt'",
    )
    .fetch_one(s.op.store.pool())
    .await
    .expect("audit count")
}

fn contested_nodes(q: &ArtemisQueue) -> std::collections::BTreeSet<String> {
    q.status
        .iter()
        .flat_map(|s| s.nodes.iter())
        .filter(|n| n.refusal == Some(RefusalKind::Contested))
        .map(|n| n.node.clone())
        .collect()
}

#[tokio::test]
async fn two_installations_declaring_one_queue_stop_fighting_and_neither_side_destroys_it() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let admin = bed.kube_admin().await;
    let id = short_id();
    // Before both operators, so neither runs when it sweeps.
    let _clean = bed.clean_up(&[&id]);
    let (a, b) = (
        side(&bed, &admin, "inst-a").await,
        side(&bed, &admin, "inst-b").await,
    );
    assert_ne!(a.op.ctx.instance_id, b.op.ctx.instance_id);
    // The queue exists already, with messages.
    let name = format!("shared.{id}");
    let access = bed.access("c", bed.broker_user());
    let t = artemis_studio_operator::topology::poll(&access, &Default::default()).await;
    for m in t.nodes.iter().filter_map(|n| n.active.clone()) {
        m.create_queue(
            &json!({"name": name, "address": name, "routing-type": "ANYCAST", "auto-create-address": true}),
        )
        .await
        .expect("queue behind the operators' backs");
    }
    send_messages(&bed, "c1", &name, 3).await;
    for (s, filter) in [(&a, "k = 1"), (&b, "k = 2")] {
        let q: ArtemisQueue = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": "shared"},
            "spec": {"clusterRef": {"name": "c"}, "name": name, "filter": filter}
        }))
        .expect("queue json");
        s.queues.create(&PostParams::default(), &q).await.expect("create");
    }

    // On every node one side finds its write undone and stops (which side may differ per node:
    // the writes race node by node).
    let (loser, winner) = wait_until(
        "every node contested on one side or the other",
        Duration::from_secs(120),
        || async {
            let (qa, qb) = (
                a.queues.get("shared").await.ok()?,
                b.queues.get("shared").await.ok()?,
            );
            let (na, nb) = (contested_nodes(&qa), contested_nodes(&qb));
            if na.union(&nb).count() < 3 {
                return None;
            }
            Some(if na.is_empty() { (&b, &a) } else { (&a, &b) })
        },
    )
    .await;
    let q = loser.queues.get("shared").await.expect("get");
    let node = q
        .status
        .as_ref()
        .and_then(|s| {
            s.nodes
                .iter()
                .find(|n| n.refusal == Some(RefusalKind::Contested))
                .cloned()
        })
        .expect("a contested node");
    assert!(
        node.message.contains("filter-string")
            && node.message.contains("another writer")
            && node.message.contains("broker has"),
        "{}",
        node.message
    );
    let stalled = q
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Stalled").cloned())
        .expect("Stalled");
    assert_eq!(stalled.status, "True", "{stalled:?}");

    // Positive evidence that later passes ran on both sides (three polls of each cluster, and
    // a queue pass each, asked for by touching a label): no more writes from either.
    let before = (writes(&a).await, writes(&b).await);
    for s in [&a, &b] {
        let (polls, passes) = (
            s.op.ctx.metrics.reconciles_of("ArtemisCluster"),
            s.op.ctx.metrics.reconciles_of("ArtemisQueue"),
        );
        s.queues
            .patch(
                "shared",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"looked": "again"}}})),
            )
            .await
            .expect("touch");
        wait_until(
            "3 more polls and a queue pass",
            Duration::from_secs(90),
            || async move {
                let m = &s.op.ctx.metrics;
                (m.reconciles_of("ArtemisCluster") >= polls + 3 && m.reconciles_of("ArtemisQueue") > passes)
                    .then_some(())
            },
        )
        .await;
    }
    let after = (writes(&a).await, writes(&b).await);
    assert_eq!(before, after, "the fight went on");
    assert!(
        after.0 + after.1 <= 6,
        "at most a create-or-update and one repair per side per node batch: {after:?}"
    );

    // Issue 41: either side's plain delete leaves the queue and its messages, whichever won.
    // The loser first; then the winner, after a restart (its evidence is read back from status).
    delete_released(loser, &bed, &name, 3).await;
    let winner = restarted(winner, &bed).await;
    let q = winner.queues.get("shared").await.expect("get");
    assert!(
        q.status.as_ref().and_then(|s| s.not_owned.as_ref()).is_some(),
        "the winner records the other writer (or the adoption) too: {:?}",
        q.status
    );
    delete_released(&winner, &bed, &name, 3).await;
    tidy(&bed, &name).await;
}

/// Issue 41, the other order: the older side created the queue (empty: the younger side adopts
/// nothing), the younger declares it too with another filter; after the fight, messages both
/// filters take arrive, and the *winner* is deleted first, then the loser. Neither destroys the
/// queue, though each allows the loss of every message: each holds evidence of the other writer
/// (the winner's first write was undone by the other side).
#[tokio::test]
async fn two_installations_the_winners_delete_first_keeps_the_queue_the_other_declares() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let admin = bed.kube_admin().await;
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);
    let (a, b) = (
        side(&bed, &admin, "inst-c").await,
        side(&bed, &admin, "inst-d").await,
    );
    let name = format!("owned.{id}");
    declare(&a, &name, "k = '1'", Some(12)).await;
    wait_until("a's queue Ready", Duration::from_secs(90), || async {
        let q = a.queues.get("shared").await.ok()?;
        crate::queue::ready(&q).then_some(())
    })
    .await;
    declare(&b, &name, "k = '1' OR k = '2'", Some(12)).await;
    let winner_is_a = wait_until("one side contested", Duration::from_secs(120), || async {
        let (qa, qb) = (
            a.queues.get("shared").await.ok()?,
            b.queues.get("shared").await.ok()?,
        );
        let (na, nb) = (contested_nodes(&qa), contested_nodes(&qb));
        (!na.is_empty() || !nb.is_empty()).then_some(na.is_empty())
    })
    .await;
    let (winner, loser) = if winner_is_a { (&a, &b) } else { (&b, &a) };
    let q = winner.queues.get("shared").await.expect("get");
    let record = q
        .status
        .and_then(|s| s.not_owned)
        .expect("the winner has evidence");
    assert!(record.adopted.is_empty(), "nothing was adopted: {record:?}");
    assert!(!record.other_writer.is_empty(), "{record:?}");
    // Messages either filter takes (a message the filter refuses is never routed to the queue).
    send_messages_with(&bed, "c1", &name, 12, json!({"k": "1"})).await;
    delete_released(winner, &bed, &name, 12).await;
    delete_released(loser, &bed, &name, 12).await;
    tidy(&bed, &name).await;
}

/// Declare the shared queue on one side (allowing the loss of `allow` messages, so only
/// ownership can keep them).
async fn declare(s: &Side, name: &str, filter: &str, allow: Option<u64>) {
    let q: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": "shared"},
        "spec": {"clusterRef": {"name": "c"}, "name": name, "filter": filter,
            "deletion": {"allowMessageLoss": allow}}
    }))
    .expect("queue json");
    s.queues.create(&PostParams::default(), &q).await.expect("create");
}

/// A plain delete of this side's object: released with an Event that gives the evidence, no
/// `queue.delete` row, and the queue still on c1 with its `messages`.
async fn delete_released(s: &Side, bed: &TestBed, name: &str, messages: u64) {
    s.queues
        .delete("shared", &Default::default())
        .await
        .expect("delete");
    wait_until("released", Duration::from_secs(60), || async {
        s.queues.get_opt("shared").await.ok()?.is_none().then_some(())
    })
    .await;
    let deletes: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE command = 'queue.delete'")
        .fetch_one(s.op.store.pool())
        .await
        .expect("audit count");
    assert_eq!(
        deletes, 0,
        "a plain delete of what another declares sends no delete"
    );
    s.op.ctx.events.settled().await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(bed.kube_admin().await, &s.ns);
    let released = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("shared"))
        .find(|e| e.reason.as_deref() == Some("Released"))
        .and_then(|e| e.note)
        .expect("a Released Event");
    assert!(released.contains("left on the brokers"), "{released}");
    let access = bed.access("c", bed.broker_user());
    let t = artemis_studio_operator::topology::poll(&access, &Default::default()).await;
    let held = |node: &str| {
        t.find(&bed.broker(node).jolokia)
            .and_then(|n| n.inventory.as_ref())
            .and_then(|i| i.queues.get(name))
            .map(|q| q.message_count)
    };
    assert_eq!(
        held("c1"),
        Some(messages),
        "the queue and its messages are still on c1"
    );
    for node in ["c2", "c3"] {
        assert!(held(node).is_some(), "the queue is still on {node}");
    }
}

/// This side's operator stopped and started again on its database and instance ID.
async fn restarted(s: &Side, bed: &TestBed) -> Side {
    let instance = s.op.ctx.instance_id.clone();
    s.op.stop();
    let op = bed.start_operator_on(&[s.ns.as_str()], &s.op.db, &instance).await;
    Side {
        ns: s.ns.clone(),
        queues: s.queues.clone(),
        op,
    }
}

/// The queue goes by hand.
async fn tidy(bed: &TestBed, name: &str) {
    let t = artemis_studio_operator::topology::poll(&bed.access("c", bed.broker_user()), &Default::default())
        .await;
    for m in t.nodes.iter().filter_map(|n| n.active.clone()) {
        let _ = m.destroy_queue(name, true).await;
    }
}
