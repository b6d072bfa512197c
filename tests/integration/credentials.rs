//! Issue 22 item 3: the credentials a command uses are the credentials in the Secret now. A
//! Secret switched to a view-only user under a live operator: a queue applied right after is
//! never created with the old admin credentials. Switched back, the queue is created at once
//! (the Secret change triggers the cluster and its dependents), not after its own backoff.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use artemis_studio_operator::api::{Outcome, RefusalKind};

use crate::queue::{fixture, ready};
use crate::support::{brokers_shared, short_id, wait_until};

async fn set_credentials(f: &crate::queue::Fixture, user: (String, String)) {
    let secrets: Api<Secret> = Api::namespaced(f.admin.clone(), &f.ns);
    secrets
        .patch(
            "c-credentials",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"username": user.0, "password": user.1}})),
        )
        .await
        .expect("switch the credentials");
}

#[tokio::test]
async fn a_revoked_secret_is_never_written_with_and_a_restored_one_acts_at_once() {
    let _b = brokers_shared().await;
    let f = fixture("creds", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (obj, queue) = (format!("rotated-{}", short_id()), format!("rotated.{id}"));

    // The Secret now holds the view-only user; the queue is applied right after.
    set_credentials(&f, f.bed.viewer_user()).await;
    // Created at once: its first pass may take a snapshot polled with the admin user just
    // before the cluster is re-polled with the viewer (the gate compares the snapshot's
    // Secrets, not the runtime's: `ensure_credentials`).
    f.create(&obj, json!({"name": queue})).await;

    // Every node refuses it for authorization: it was sent with the viewer, never the admin.
    let uid_of =
        |q: &artemis_studio_operator::api::queue::ArtemisQueue| q.metadata.uid.clone().unwrap_or_default();
    let q = f
        .wait_for(&obj, "refused for authorization on every node", |q| {
            let nodes = q.status.as_ref().map(|s| s.nodes.clone()).unwrap_or_default();
            nodes.len() == 3
                && nodes
                    .iter()
                    .all(|n| n.outcome == Outcome::Failed && n.refusal == Some(RefusalKind::NotAuthorized))
        })
        .await;
    for n in f.topology().await.nodes {
        let inv = n.inventory.expect("inventory");
        assert!(
            !inv.queues.contains_key(&queue),
            "{} has {queue}: written with the old credentials",
            n.node_id
        );
    }

    // Let the failures back off (the operator's own retry delay grows past what follows).
    let retry_key = format!("{}/nodes", uid_of(&q));
    wait_until(
        "the failed create backs off for 20 s or more",
        Duration::from_secs(120),
        || async {
            f.op.ctx
                .backoff
                .remaining(&retry_key)
                .filter(|d| *d >= Duration::from_secs(20))
                .map(|_| ())
        },
    )
    .await;
    let waiting = f.op.ctx.backoff.remaining(&retry_key).unwrap_or_default();

    // Switched back: the queue is created before its backoff would have let it retry.
    let restored = Instant::now();
    set_credentials(&f, f.bed.broker_user()).await;
    f.wait_for(&obj, "Ready", ready).await;
    assert!(
        restored.elapsed() < waiting,
        "Ready {:?} after the Secret was restored; the backoff had {waiting:?} left",
        restored.elapsed()
    );
    for n in f.topology().await.nodes {
        assert!(
            n.inventory.expect("inventory").queues.contains_key(&queue),
            "{}",
            n.node_id
        );
    }
    // Tidy the shared brokers.
    f.queues()
        .delete(&obj, &Default::default())
        .await
        .expect("delete");
    f.wait_gone(&obj).await;
}

/// The shared gate holds for a ConnectionClose too (issue 24): a close created right after the
/// Secret was switched to a view-only user is never sent with the admin credentials the last
/// poll held — the broker refuses it for authorization and the consumer stays connected.
#[tokio::test]
async fn a_close_after_the_secret_was_revoked_never_uses_the_old_credentials() {
    use artemis_studio_operator::api::connection_close::ClosePhase;
    use artemis_studio_operator::broker::management::ListKind;
    let _b = brokers_shared().await;
    let f = fixture("creds-close", Some(1)).await;
    let queue = f.queue_on("revoked").await;
    let client = format!("revoked-{}", short_id());
    let mut consumer = crate::support::amqp_consumer(&f.bed, "c1", &queue, &client).await;
    let (_, admin) = f.broker("c1").await;

    // Created at once after the switch: the close's first pass races the cluster's re-poll.
    set_credentials(&f, f.bed.viewer_user()).await;
    let spec = json!({"target": {"address": queue}, "confirm": queue, "allowBulk": true});
    f.create_close_without_review("revoked", spec).await;
    let c = f.wait_phase("revoked", ClosePhase::Failed).await;
    let nodes = c.status.expect("status").nodes;
    assert!(
        nodes.iter().all(|n| n.outcome != Outcome::Applied),
        "something was closed: {nodes:?}"
    );
    assert!(
        nodes
            .iter()
            .any(|n| n.refusal == Some(RefusalKind::NotAuthorized)),
        "sent with the view-only user, refused for it: {nodes:?}"
    );
    let consumers = admin
        .list_all(ListKind::Consumers, "address", &queue)
        .await
        .expect("consumers");
    assert_eq!(
        consumers.len(),
        1,
        "the consumer is still connected: {consumers:?}"
    );

    // Tidy the shared brokers.
    let _ = consumer.receiver.close().await;
    let _ = consumer.session.end().await;
    let _ = consumer.connection.close().await;
    set_credentials(&f, f.bed.broker_user()).await;
    let obj = queue.replace('.', "-");
    f.queues()
        .delete(&obj, &Default::default())
        .await
        .expect("delete");
    f.wait_gone(&obj).await;
}
