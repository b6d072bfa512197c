//! Issue 22 item 7: a filter is a value. A filter that mentions an exception (`kind =
//! 'TimeoutException'`) on a queue or on a divert made behind the operator's back never reads as
//! a failed attribute: the queue converges and deletes, and the node's inventory stays readable
//! for every other object.

use serde_json::json;

use crate::queue::{fixture, ready};
use crate::support::{brokers_shared, short_id};

#[tokio::test]
async fn filters_that_mention_exceptions_are_read_as_filters_on_queues_and_diverts() {
    let _b = brokers_shared().await;
    let f = fixture("filters", None).await;
    let id = short_id();
    f.clean.also(&id);
    // State that exists first: on c1, a foreign divert whose filter names an exception, between
    // two addresses of its own (the forwarding one with a queue, as a real divert has).
    let c1 = f
        .topology()
        .await
        .nodes
        .iter()
        .filter_map(|n| n.active.clone())
        .find(|m| m.broker_name() == "c1")
        .expect("c1 is live");
    let (src, dst, divert) = (format!("fx.src.{id}"), format!("fx.dst.{id}"), format!("fx.{id}"));
    c1.create_address(&src, "MULTICAST")
        .await
        .expect("source address");
    c1.create_queue(
        &json!({"name": dst, "address": dst, "routing-type": "ANYCAST", "auto-create-address": true}),
    )
    .await
    .expect("forwarding queue");
    c1.create_divert(&json!({"name": divert, "routing-name": divert, "address": src,
        "forwarding-address": dst, "exclusive": false, "filter-string": "cause LIKE '%Exception%'"}))
        .await
        .expect("the foreign divert");

    // A queue whose filter names an exception converges on every node, c1 included.
    let (obj, queue) = (format!("timeouts-{id}"), format!("timeouts.{id}"));
    f.create(
        &obj,
        json!({"name": queue, "filter": "kind = 'TimeoutException'"}),
    )
    .await;
    let q = f.wait_for(&obj, "Ready", ready).await;
    let summary = q.status.as_ref().and_then(|s| s.nodes_summary.clone());
    assert_eq!(summary.as_deref(), Some("3/3"), "{:?}", q.status);
    for n in f.topology().await.nodes {
        let inv = n.inventory.expect("every node's inventory is readable");
        assert!(
            inv.unreadable_queues.is_empty(),
            "{}: {:?}",
            n.node_id,
            inv.unreadable_queues
        );
        assert_eq!(
            inv.queues.get(&queue).and_then(|q| q.filter.as_deref()),
            Some("kind = 'TimeoutException'"),
            "{}",
            n.node_id
        );
        if n.node_id == c1.identity().await.expect("c1 identity").node_id {
            let d = inv
                .diverts
                .get(&divert)
                .expect("the foreign divert is in c1's inventory");
            assert_eq!(d.filter.as_deref(), Some("cause LIKE '%Exception%'"));
        }
    }

    // And it deletes: gone from every node, one audited command.
    f.queues()
        .delete(&obj, &Default::default())
        .await
        .expect("delete");
    f.wait_gone(&obj).await;
    for n in f.topology().await.nodes {
        let inv = n.inventory.expect("inventory");
        assert!(
            !inv.queues.contains_key(&queue),
            "{} still has {queue}",
            n.node_id
        );
    }
    let rows = f.audit_rows("queue.delete").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1, "succeeded", "{rows:?}");
    // Item 8: the delete's actor says what Kubernetes does not record.
    let actor: String = sqlx::query_scalar("SELECT actor FROM audit_event WHERE command = 'queue.delete'")
        .fetch_one(f.op.store.pool())
        .await
        .expect("actor");
    assert!(
        actor.starts_with("deleter not recorded by Kubernetes") && actor.contains("last spec writer: "),
        "{actor}"
    );

    // The foreign objects go as they came.
    c1.destroy_divert(&divert).await.expect("remove the divert");
    c1.destroy_queue(&dst, false).await.expect("remove its queue");
    let _ = c1.delete_address(&dst).await;
    c1.delete_address(&src).await.expect("remove the source address");
}
