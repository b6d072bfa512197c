//! ArtemisDivert (issue 5) on the real test bed, and its interplay with queue delete (ADR-0084 §2).

use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use artemis_studio_operator::api::divert::ArtemisDivert;
use artemis_studio_operator::api::{Outcome, RefusalKind};

use crate::capture::queue_attr;
use crate::queue::{Fixture, condition, fixture, ready};
use crate::support::{brokers_shared, send_messages_with, short_id, wait_until, wait_until_or_say};

impl Fixture {
    fn diverts(&self) -> Api<ArtemisDivert> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    async fn create_divert(&self, name: &str, spec: serde_json::Value) {
        let mut spec = spec;
        spec["clusterRef"] = json!({"name": "c"});
        let d: ArtemisDivert = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisDivert",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("divert json");
        self.diverts()
            .create(&PostParams::default(), &d)
            .await
            .expect("create ArtemisDivert");
    }

    async fn wait_divert(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ArtemisDivert) -> bool,
    ) -> ArtemisDivert {
        let api = self.diverts();
        let check = &check;
        wait_until(
            &format!("ArtemisDivert {name}: {what}"),
            Duration::from_secs(90),
            || {
                let api = api.clone();
                async move { api.get(name).await.ok().filter(|d| check(d)) }
            },
        )
        .await
    }
}

fn divert_ready(d: &ArtemisDivert) -> bool {
    d.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

fn refusals(d: &ArtemisDivert) -> Vec<(Option<RefusalKind>, String)> {
    d.status
        .as_ref()
        .map(|s| s.nodes.iter().map(|n| (n.refusal, n.message.clone())).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_filtered_divert_copies_matching_messages_into_a_queue_on_every_node() {
    let _b = brokers_shared().await;
    let f = fixture("d-route", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (source, target) = (format!("events.{id}"), format!("red.{id}"));
    // A multicast source with a subscription, and the anycast queue the divert feeds.
    f.create(
        &format!("sub-{id}"),
        json!({"name": format!("sub.{id}"), "address": source, "routingType": "MULTICAST"}),
    )
    .await;
    f.create(&format!("red-{id}"), json!({"name": target})).await;
    f.wait_for(&format!("sub-{id}"), "Ready", ready).await;
    f.wait_for(&format!("red-{id}"), "Ready", ready).await;
    f.create_divert(
        &format!("red-{id}"),
        json!({
            "address": source, "forwardingAddress": target, "filter": "color='red'", "routingType": "ANYCAST"
        }),
    )
    .await;
    f.wait_divert(&format!("red-{id}"), "Ready", divert_ready).await;

    for broker in ["c1", "c2", "c3"] {
        send_messages_with(&f.bed, broker, &source, 2, json!({"color": "red"})).await;
        send_messages_with(&f.bed, broker, &source, 3, json!({"color": "blue"})).await;
    }
    // Each node's count read from the queue's own MBean: a full topology poll can time out on a
    // bed that other tests fill with thousands of queues, and would say nothing about this one.
    let counts = || async {
        let mut counts = Vec::new();
        for broker in f.bed.cluster_brokers("c") {
            counts.push(queue_attr(&f.bed, &broker, &target, "MessageCount").await);
        }
        counts
    };
    wait_until_or_say(
        "2 red messages in the target queue on each node",
        Duration::from_secs(60),
        || async { counts().await.iter().all(|c| *c == json!(2)).then_some(()) },
        || async { format!("MessageCount per node (c1, c2, c3): {:?}", counts().await) },
    )
    .await;
    let rows = f.audit_rows("divert.").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
}

#[tokio::test]
async fn a_divert_of_the_same_name_made_behind_our_back_is_a_failure_not_applied() {
    let _b = brokers_shared().await;
    let f = fixture("d-dup", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (source, target, elsewhere, name) = (
        format!("src.{id}"),
        format!("dst.{id}"),
        format!("else.{id}"),
        format!("dup.{id}"),
    );
    f.create(&format!("src-{id}"), json!({"name": source})).await;
    f.create(&format!("dst-{id}"), json!({"name": target})).await;
    f.create(&format!("else-{id}"), json!({"name": elsewhere})).await;
    for q in [&source, &target, &elsewhere] {
        f.wait_for(&q.replace('.', "-"), "Ready", ready).await;
    }
    let t = f.topology().await;
    let victim = t.live_nodes().next().expect("live");
    victim
        .active
        .as_ref()
        .expect("live")
        .create_divert(&json!({"name": name, "routing-name": "someone-else", "address": source, "forwarding-address": elsewhere}))
        .await
        .expect("foreign divert");
    f.create_divert(
        &name,
        json!({"name": name, "address": source, "forwardingAddress": target}),
    )
    .await;
    let d = f
        .wait_divert(&name, "one FAILED, two in place", |d| {
            let s = d.status.as_ref().map(|s| s.nodes.clone()).unwrap_or_default();
            s.len() == 3
                && s.iter().filter(|n| n.outcome == Outcome::Failed).count() == 1
                && s.iter()
                    .filter(|n| matches!(n.outcome, Outcome::Applied | Outcome::Already))
                    .count()
                    == 2
        })
        .await;
    let failed = d
        .status
        .expect("status")
        .nodes
        .into_iter()
        .find(|n| n.outcome == Outcome::Failed)
        .expect("failed");
    assert_eq!(failed.node, victim.node_id);
    assert_eq!(failed.refusal, Some(RefusalKind::NameConflict));
    assert!(failed.message.contains(&elsewhere), "{}", failed.message);
    // The foreign divert is untouched.
    let t = f.topology().await;
    let found = t
        .find(&victim.node_id)
        .and_then(|n| n.inventory.clone())
        .and_then(|i| i.diverts.get(&name).cloned());
    assert_eq!(found.map(|d| d.forwarding_address), Some(elsewhere));
}

#[tokio::test]
async fn a_divert_with_nothing_consuming_at_its_forwarding_address_is_refused() {
    let _b = brokers_shared().await;
    let f = fixture("d-none", None).await;
    let id = short_id();
    f.clean.also(&id);
    let source = format!("src.{id}");
    f.create(&format!("src-{id}"), json!({"name": source})).await;
    f.wait_for(&format!("src-{id}"), "Ready", ready).await;
    // Named with the id (spec.name defaults to it), so a divert made by mistake is swept.
    let nowhere = format!("nowhere-{id}");
    f.create_divert(
        &nowhere,
        json!({"address": source, "forwardingAddress": format!("nobody.{id}")}),
    )
    .await;
    let d = f
        .wait_divert(&nowhere, "refused on every node", |d| {
            let r = refusals(d);
            r.len() == 3 && r.iter().all(|(k, _)| *k == Some(RefusalKind::NothingConsumes))
        })
        .await;
    assert!(
        refusals(&d)[0]
            .1
            .starts_with(&format!("Nothing consumes at nobody.{id}"))
    );
    assert!(
        f.audit_rows("divert.").await.is_empty(),
        "a refusal sends nothing"
    );
    let t = f.topology().await;
    assert!(t.nodes.iter().all(|n| {
        n.inventory
            .as_ref()
            .is_some_and(|i| !i.diverts.contains_key(&nowhere))
    }));
}

/// ADR-0084 §2: a declared divert removed by a queue delete. Path 1: nothing declares a queue
/// at the forwarding address any more → the ArtemisDivert refuses until it is removed. Path 2:
/// another ArtemisQueue still declares it → the queue and the divert come back.
#[tokio::test]
async fn a_declared_divert_removed_with_its_queue_is_refused_or_comes_back() {
    let _b = brokers_shared().await;
    let f = fixture("d-decl", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (source, target) = (format!("src.{id}"), format!("dst.{id}"));
    f.create(&format!("src-{id}"), json!({"name": source})).await;
    f.create("owner", json!({"name": target})).await;
    f.wait_for(&format!("src-{id}"), "Ready", ready).await;
    f.wait_for("owner", "Ready", ready).await;
    // A unique broker name: brokers outlive test runs.
    let feed = format!("feed.{id}");
    f.create_divert(
        "feed",
        json!({"name": feed, "address": source, "forwardingAddress": target}),
    )
    .await;
    f.wait_divert("feed", "Ready", divert_ready).await;

    // The preview names the divert as declared, and says it comes back.
    let q = f
        .wait_for("owner", "preview names the declared divert", |q| {
            q.status
                .as_ref()
                .and_then(|s| s.delete_preview.as_ref())
                .is_some_and(|p| {
                    p.nodes
                        .iter()
                        .all(|n| n.dependent_diverts.iter().any(|d| d.declared_by.is_some()))
                })
        })
        .await;
    let p = q.status.and_then(|s| s.delete_preview).expect("preview");
    let impact = &p.nodes[0].dependent_diverts[0];
    assert_eq!(
        impact.declared_by.as_deref(),
        Some(format!("{}/feed", f.ns).as_str())
    );
    assert!(impact.note.contains("does not stick"), "{}", impact.note);

    // Path 2 first: a second (younger) ArtemisQueue declares the same queue; deleting the owner
    // removes queue and divert, then the survivor re-creates the queue and the divert returns.
    f.create("survivor", json!({"name": target})).await;
    f.wait_for("survivor", "ResourceConflict", |q| {
        condition(q, "Ready").is_some_and(|c| c.1 == "ResourceConflict")
    })
    .await;
    f.queues()
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete owner");
    f.wait_gone("owner").await;
    // The removal happened (not only the end state): the owner's delete row records the divert's
    // full configuration on every node.
    let deletes = f.audit_rows("queue.delete").await;
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    let nodes = deletes[0].2["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert!(
        nodes.iter().all(|n| n["outcome"] == "APPLIED"
            && n["detail"].to_string().contains("removed divert")
            && n["detail"].to_string().contains(&source)),
        "{nodes:?}"
    );
    f.wait_for("survivor", "Ready", ready).await;
    f.wait_divert("feed", "Ready again", divert_ready).await;
    let t = f.topology().await;
    assert!(t.nodes.iter().all(|n| {
        n.inventory
            .as_ref()
            .is_some_and(|i| i.diverts.contains_key(&feed) && i.queues.contains_key(&target))
    }));

    // Path 1: now nothing else declares the queue: the divert is removed and refused.
    f.queues()
        .delete("survivor", &DeleteParams::default())
        .await
        .expect("delete survivor");
    f.wait_gone("survivor").await;
    let d = f
        .wait_divert("feed", "Nothing consumes at", |d| {
            let r = refusals(d);
            r.len() == 3 && r.iter().all(|(k, _)| *k == Some(RefusalKind::NothingConsumes))
        })
        .await;
    assert!(
        refusals(&d)[0]
            .1
            .contains(&format!("Nothing consumes at {target}"))
    );
    let t = f.topology().await;
    assert!(
        t.nodes.iter().all(|n| n
            .inventory
            .as_ref()
            .is_some_and(|i| !i.queues.contains_key(&target))),
        "the queue did not come back"
    );
    // Removing the ArtemisDivert ends it: ALREADY where absent.
    f.diverts()
        .delete("feed", &DeleteParams::default())
        .await
        .expect("delete divert");
    wait_until("ArtemisDivert gone", Duration::from_secs(60), || async {
        f.diverts()
            .get_opt("feed")
            .await
            .ok()
            .and_then(|o| o.is_none().then_some(()))
    })
    .await;
}
