//! Issue 9: nothing destroyed that the object did not ask for. Every test starts from state that
//! already exists on the brokers (queues made behind the operator's back, messages, diverts, a
//! second namespace's objects), and proves "nothing happened" with evidence that a later pass
//! ran, never with a sleep.

use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use artemis_studio_operator::api::queue::ArtemisQueue;
use artemis_studio_operator::api::{ArtemisCluster, Outcome, RefusalKind};
use artemis_studio_operator::broker::BrokerManagement;

use crate::queue::{Fixture, condition, fixture, outcomes, ready};
use crate::support::{
    OperatorHandle, brokers_exclusive, brokers_shared, create_cluster, send_messages, short_id,
    wait_cluster_condition, wait_until,
};

/// The active management of every node of cluster c.
async fn nodes(f: &Fixture) -> Vec<BrokerManagement> {
    f.topology()
        .await
        .nodes
        .iter()
        .filter_map(|n| n.active.clone())
        .collect()
}

/// Create a queue on every node behind the operator's back.
async fn queue_behind_our_back(f: &Fixture, name: &str, routing: &str) {
    for m in nodes(f).await {
        m.create_queue(
            &json!({"name": name, "address": name, "routing-type": routing, "auto-create-address": true}),
        )
        .await
        .expect("create the queue behind the operator's back");
    }
    // The state exists before the object does: the operator's snapshot has it on every node
    // (a create planned from an older snapshot would be sent and answered "already exists",
    // which is its own path, issue 23).
    let key = format!("{}/c", f.ns);
    wait_until(
        &format!("the operator's snapshot of cluster {key} has queue {name} on every node"),
        Duration::from_secs(60),
        || async {
            let t = f.op.ctx.topologies.get(&key)?;
            t.nodes
                .iter()
                .all(|n| n.inventory.as_ref().is_some_and(|i| i.queues.contains_key(name)))
                .then_some(())
        },
    )
    .await;
}

/// (node, message count, routing type) of a queue on every node that has it.
async fn on_brokers(f: &Fixture, name: &str) -> Vec<(String, u64, String)> {
    f.topology()
        .await
        .nodes
        .iter()
        .filter_map(|n| {
            let q = n.inventory.as_ref()?.queues.get(name)?.clone();
            Some((n.node_id.clone(), q.message_count, q.routing_type))
        })
        .collect()
}

/// Wait until the operator has finished `passes` more reconciles of a kind than now: positive
/// evidence that later passes ran (and could have acted).
async fn later_passes(op: &OperatorHandle, kind: &str, passes: u64) {
    let start = op.ctx.metrics.reconciles_of(kind);
    wait_until(
        &format!("{passes} more {kind} reconciles"),
        Duration::from_secs(60),
        || async move { (op.ctx.metrics.reconciles_of(kind) >= start + passes).then_some(()) },
    )
    .await;
}

async fn delete_and_wait_gone(f: &Fixture, name: &str) {
    f.queues()
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_gone(name).await;
}

/// Items 1 and 2: a dry-run or paused object's delete leaves an existing queue, its messages and
/// its dependent divert alone, writes no audit row, and says so in an Event.
#[tokio::test]
async fn deleting_a_dry_run_or_paused_object_leaves_the_existing_queue_untouched() {
    let _b = brokers_shared().await;
    let f = fixture("s-dry", None).await;
    for mode in ["dry", "paused"] {
        let id = short_id();
        f.clean.also(&id);
        let name = format!("{mode}.{id}");
        let source = format!("{name}.src");
        queue_behind_our_back(&f, &name, "ANYCAST").await;
        let first = nodes(&f).await.into_iter().next().expect("a node");
        send_messages(&f.bed, first.broker_name(), &name, 4).await;
        // A divert into the queue's address: a delete would remove it with the queue.
        first
            .create_address(&source, "MULTICAST")
            .await
            .expect("source address");
        first
            .create_divert(&json!({"name": format!("{name}.into"), "routing-name": "someone",
                "address": source, "forwarding-address": name, "exclusive": false}))
            .await
            .expect("divert behind our back");
        let mut obj = json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": name},
            "spec": {"clusterRef": {"name": "c"}, "filter": "x=1"}
        });
        if mode == "dry" {
            obj["spec"]["dryRun"] = json!(true);
        } else {
            obj["metadata"]["annotations"] = json!({"artemis-studio.io/paused": "true"});
        }
        let q: ArtemisQueue = serde_json::from_value(obj).expect("queue json");
        f.queues()
            .create(&PostParams::default(), &q)
            .await
            .expect("create");
        // The plan saw the existing queue: it would only update the filter.
        f.wait_for(&name, "WOULD_APPLY x3 (update)", |q| {
            let s = q.status.as_ref();
            outcomes(q).len() == 3
                && s.is_some_and(|s| {
                    s.nodes
                        .iter()
                        .all(|n| n.outcome == Outcome::WouldApply && n.message.contains("filter"))
                })
        })
        .await;
        delete_and_wait_gone(&f, &name).await;
        let left = on_brokers(&f, &name).await;
        assert_eq!(left.len(), 3, "{mode}: the queue stays on every node: {left:?}");
        assert_eq!(
            left.iter().map(|(_, m, _)| m).sum::<u64>(),
            4,
            "{mode}: its messages stay"
        );
        let diverts = first.divert_names().await.expect("diverts");
        assert!(
            diverts.contains(&format!("{name}.into")),
            "{mode}: the divert stays"
        );
        let reasons = f.event_reasons(&name).await;
        let expected = if mode == "dry" {
            "DryRunDelete"
        } else {
            "PausedDelete"
        };
        assert!(reasons.iter().any(|r| r == expected), "{mode}: {reasons:?}");
    }
    assert!(
        f.audit_rows("queue.").await.is_empty(),
        "no broker write was sent"
    );
}

/// Item 3: a MULTICAST queue made behind our back, an ANYCAST object of the same name — refused;
/// deleting the object leaves the MULTICAST queue and its messages on every node.
#[tokio::test]
async fn deleting_an_object_refused_for_its_routing_type_leaves_the_other_queue() {
    let _b = brokers_shared().await;
    let f = fixture("s-refused", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("mc.{id}");
    queue_behind_our_back(&f, &name, "MULTICAST").await;
    let first = nodes(&f).await.into_iter().next().expect("a node");
    send_messages(&f.bed, first.broker_name(), &name, 3).await;
    f.create(&name, json!({"routingType": "ANYCAST"})).await;
    let q = f
        .wait_for(&name, "refused on every node", |q| {
            let s = q.status.as_ref();
            outcomes(q).len() == 3
                && s.is_some_and(|s| {
                    s.nodes
                        .iter()
                        .all(|n| n.refusal == Some(RefusalKind::RoutingTypeImmutable))
                })
        })
        .await;
    let preview = q.status.and_then(|s| s.delete_preview).expect("preview");
    assert_eq!(
        preview.total_messages, 0,
        "the other queue's messages are not this object's"
    );
    // Issue 22 item 8: the refusal is told in an Event, though no command was sent.
    wait_until(
        "a Warning Event for the refusal",
        Duration::from_secs(30),
        || async {
            f.event_reasons(&name)
                .await
                .iter()
                .any(|r| r == "NotOnEveryLiveNode" || r == "NodesRefused")
                .then_some(())
        },
    )
    .await;
    delete_and_wait_gone(&f, &name).await;
    wait_until(
        "an Event says the delete touched nothing",
        Duration::from_secs(30),
        || async {
            f.event_reasons(&name)
                .await
                .iter()
                .any(|r| r == "NothingDeleted")
                .then_some(())
        },
    )
    .await;
    let left = on_brokers(&f, &name).await;
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(left.iter().all(|(_, _, rt)| rt == "MULTICAST"));
    assert_eq!(left.iter().map(|(_, m, _)| m).sum::<u64>(), 3);
    let rows = f.audit_rows("queue.").await;
    assert!(rows.is_empty(), "nothing was written or destroyed: {rows:?}");
}

/// Item 4: two namespaces, each with an ArtemisCluster pointing at the same brokers, one queue
/// name. The older object owns it; the younger never writes (no flip-flopping filter) and its
/// delete leaves the queue.
#[tokio::test]
async fn two_namespaces_on_one_broker_cluster_the_older_object_owns_the_queue() {
    let _b = brokers_shared().await;
    let bed = crate::support::TestBed::get();
    let ns1 = bed.fresh_namespace("s-ns1").await;
    let ns2 = bed.fresh_namespace("s-ns2").await;
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);
    let op = bed.start_operator_for(&[&ns1, &ns2]).await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    for ns in [&ns1, &ns2] {
        create_cluster(&admin, ns, "c", &urls, Some(bed.broker_user())).await;
        wait_cluster_condition(&admin, ns, "c", "Ready", "True").await;
    }
    let name = format!("shared.{id}");
    let create = |ns: &str, object: &str, filter: &str| {
        let api: Api<ArtemisQueue> = Api::namespaced(admin.clone(), ns);
        let q: ArtemisQueue = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": object},
            "spec": {"clusterRef": {"name": "c"}, "name": name, "filter": filter}
        }))
        .expect("queue json");
        async move { api.create(&PostParams::default(), &q).await.expect("create") }
    };
    create(&ns1, "first", "owner = 1").await;
    let api1: Api<ArtemisQueue> = Api::namespaced(admin.clone(), &ns1);
    let api2: Api<ArtemisQueue> = Api::namespaced(admin.clone(), &ns2);
    wait_until("first Ready", Duration::from_secs(90), || {
        let api1 = api1.clone();
        async move { api1.get("first").await.ok().filter(ready) }
    })
    .await;
    create(&ns2, "second", "owner = 2").await;
    let second = wait_until("second ResourceConflict", Duration::from_secs(90), || {
        let api2 = api2.clone();
        async move {
            api2.get("second")
                .await
                .ok()
                .filter(|q| condition(q, "Ready").is_some_and(|c| c.1 == "ResourceConflict"))
        }
    })
    .await;
    let (_, _, message) = condition(&second, "Ready").expect("Ready");
    assert!(message.contains(&format!("{ns1}/first")), "{message}");
    // Later passes of both objects ran; the broker keeps the owner's filter throughout.
    later_passes(&op, "ArtemisQueue", 6).await;
    let bed_access = bed.access("c", bed.broker_user());
    let t = artemis_studio_operator::topology::poll(&bed_access, &Default::default()).await;
    for n in &t.nodes {
        let q = n
            .inventory
            .as_ref()
            .and_then(|i| i.queues.get(&name))
            .expect("queue");
        assert_eq!(q.filter.as_deref(), Some("owner = 1"), "{}", n.node_id);
    }
    let rows: Vec<(String, String)> =
        // Not the divert watch's create (issue 45: the cluster's, once per broker start).
        sqlx::query_as("SELECT command, object_namespace FROM audit_event WHERE command <> 'divertwatch.create' ORDER BY id")
            .fetch_all(op.store.pool())
            .await
            .expect("audit");
    assert_eq!(
        rows,
        vec![("queue.apply".to_string(), ns1.clone())],
        "only the owner wrote"
    );
    // Deleting the younger object leaves the owner's queue.
    api2.delete("second", &DeleteParams::default())
        .await
        .expect("delete second");
    wait_until("second gone", Duration::from_secs(90), || {
        let api2 = api2.clone();
        async move {
            api2.get_opt("second")
                .await
                .ok()
                .and_then(|o| o.is_none().then_some(()))
        }
    })
    .await;
    let t = artemis_studio_operator::topology::poll(&bed_access, &Default::default()).await;
    assert!(
        t.nodes
            .iter()
            .all(|n| n.inventory.as_ref().is_some_and(|i| i.queues.contains_key(&name)))
    );
    // Clean up: the owner's delete removes it.
    api1.delete("first", &DeleteParams::default())
        .await
        .expect("delete first");
}

/// Items 5 and 8: names with Artemis wildcard characters, and names under the capture prefix
/// (metadata.name included), are refused at admission with the field and the fix.
#[tokio::test]
async fn wildcard_and_capture_prefix_names_are_refused_at_admission() {
    let bed = crate::support::TestBed::get();
    let client = bed.kube_admin().await;
    crate::smoke::install_crds(&client).await;
    let ns = bed.fresh_namespace("s-names").await;
    let queues: Api<ArtemisQueue> = Api::namespaced(client.clone(), &ns);
    let refused = |meta_name: &str, spec: serde_json::Value| {
        let q: ArtemisQueue = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": meta_name}, "spec": spec
        }))
        .expect("queue json");
        let queues = queues.clone();
        async move {
            match queues.create(&PostParams::default(), &q).await {
                Err(kube::Error::Api(e)) => e.message,
                other => panic!("admitted: {other:?}"),
            }
        }
    };
    let m = refused("a", json!({"clusterRef": {"name": "c"}, "name": "orders.*"})).await;
    assert!(m.contains("'*' or '#'"), "{m}");
    let m = refused("b", json!({"clusterRef": {"name": "c"}, "address": "orders.#"})).await;
    assert!(m.contains("spec.address"), "{m}");
    let m = refused("artemis-studio.capture.x", json!({"clusterRef": {"name": "c"}})).await;
    assert!(m.contains("reserved for capture"), "{m}");
    // Issue 22 item 8: a negative ring size is refused, naming the field and what it may be.
    for size in [-5, 0] {
        let m = refused("ring", json!({"clusterRef": {"name": "c"}, "ringSize": size})).await;
        assert!(m.contains("spec.ringSize") && m.contains("-1"), "{m}");
    }
    let diverts: Api<artemis_studio_operator::api::ArtemisDivert> = Api::namespaced(client.clone(), &ns);
    let d: artemis_studio_operator::api::ArtemisDivert = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisDivert",
        "metadata": {"name": "artemis-studio.capture.y"},
        "spec": {"clusterRef": {"name": "c"}, "address": "a", "forwardingAddress": "b"}
    }))
    .expect("divert json");
    match diverts.create(&PostParams::default(), &d).await {
        Err(kube::Error::Api(e)) => assert!(e.message.contains("reserved for capture"), "{}", e.message),
        other => panic!("admitted: {other:?}"),
    }
}

/// Item 6: a node that cannot be reached at delete time keeps the finalizer, with a condition
/// naming the node and the way out; once it answers, the delete finishes there too.
#[tokio::test]
async fn a_delete_waits_for_a_node_that_does_not_answer() {
    let _b = brokers_exclusive().await;
    let f = fixture("s-frozen", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("frozen.{id}");
    f.create(&name, json!({})).await;
    f.wait_for(&name, "Ready", ready).await;
    let victim = f.bed.broker("c3");
    let victim_node = f
        .topology()
        .await
        .nodes
        .iter()
        .find(|n| n.active_endpoint() == Some(victim.jolokia.as_str()))
        .map(|n| n.node_id.clone())
        .expect("c3's node");
    f.bed.broker_action("freeze", "c3");
    let thaw = crate::support::Thaw(&f.bed, "c3");
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let q = f
        .wait_for(&name, "DeleteBlocked naming c3's node", |q| {
            condition(q, "DeleteBlocked").is_some_and(|c| c.0 == "True" && c.2.contains(&victim_node))
        })
        .await;
    let (_, reason, message) = condition(&q, "DeleteBlocked").expect("DeleteBlocked");
    assert!(reason == "NodesNotLive" || reason == "NodesRefused", "{reason}");
    assert!(message.contains("spec.deletion.policy: Retain"), "{message}");
    assert!(q.metadata.deletion_timestamp.is_some(), "the object waits");
    // The answering nodes lost the queue already.
    let t = f.topology().await;
    let holders: Vec<&str> = t
        .nodes
        .iter()
        .filter(|n| n.inventory.as_ref().is_some_and(|i| i.queues.contains_key(&name)))
        .map(|n| n.node_id.as_str())
        .collect();
    assert!(
        holders.is_empty(),
        "only the frozen node (not scraped) may still hold it: {holders:?}"
    );
    drop(thaw);
    f.wait_gone(&name).await;
    let left = on_brokers(&f, &name).await;
    assert!(left.is_empty(), "deleted on the node that came back: {left:?}");
    let rows = f.audit_rows("queue.delete").await;
    assert!(
        rows.iter().any(|(_, _, d)| d.to_string().contains(&victim_node)),
        "{rows:?}"
    );
}

/// Item 7: the Secret deleted → no more writes; the cluster deleted → a delete says how to
/// release the object, and never touches the brokers; an object whose cluster never existed is
/// released at once.
#[tokio::test]
async fn without_its_cluster_or_secret_nothing_is_written_and_the_delete_says_how_to_release() {
    let _b = brokers_shared().await;
    let f = fixture("s-cluster", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("orphan.{id}");
    f.create(&name, json!({"filter": "v = 1"})).await;
    f.wait_for(&name, "Ready", ready).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(f.admin.clone(), &f.ns);
    secrets
        .delete("c-credentials", &DeleteParams::default())
        .await
        .expect("delete secret");
    // A change that needs a write: refused for the missing credentials, never sent.
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"filter": "v = 2"}})),
        )
        .await
        .expect("patch filter");
    let q = f
        .wait_for(&name, "not Ready for the credentials", |q| {
            condition(q, "Ready")
                .is_some_and(|c| c.0 == "False" && (c.1 == "CredentialsMissing" || c.1 == "ClusterNotReady"))
        })
        .await;
    assert_eq!(
        q.status.and_then(|s| s.observed_generation),
        q.metadata.generation
    );
    let filters: Vec<Option<String>> = f
        .topology()
        .await
        .nodes
        .iter()
        .map(|n| {
            n.inventory
                .as_ref()
                .and_then(|i| i.queues.get(&name))
                .and_then(|q| q.filter.clone())
        })
        .collect();
    assert!(
        filters.iter().all(|x| x.as_deref() == Some("v = 1")),
        "{filters:?}"
    );
    // The cluster goes too; the delete blocks, names the cluster and the way out.
    let clusters: Api<ArtemisCluster> = Api::namespaced(f.admin.clone(), &f.ns);
    clusters
        .delete("c", &DeleteParams::default())
        .await
        .expect("delete cluster");
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let q = f
        .wait_for(&name, "DeleteBlocked ClusterNotFound", |q| {
            condition(q, "DeleteBlocked").is_some_and(|c| c.1 == "ClusterNotFound")
        })
        .await;
    let (_, _, message) = condition(&q, "DeleteBlocked").expect("DeleteBlocked");
    assert!(message.contains("spec.deletion.policy: Retain"), "{message}");
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deletion": {"policy": "Retain"}}})),
        )
        .await
        .expect("retain");
    f.wait_gone(&name).await;
    assert_eq!(
        on_brokers(&f, &name).await.len(),
        3,
        "the queue is left on every node"
    );
    let deletes = f.audit_rows("queue.delete").await;
    assert!(deletes.is_empty(), "{deletes:?}");
    // An object whose cluster never existed is released at once.
    let never = format!("never.{}", short_id());
    let q: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": never}, "spec": {"clusterRef": {"name": "nowhere"}}
    }))
    .expect("queue json");
    f.queues()
        .create(&PostParams::default(), &q)
        .await
        .expect("create");
    f.wait_for(&never, "ClusterNotFound", |q| {
        condition(q, "Ready").is_some_and(|c| c.1 == "ClusterNotFound")
    })
    .await;
    delete_and_wait_gone(&f, &never).await;
}

/// Issue 41 item 2: a queue that already existed with messages is adopted, not owned. The
/// object's first pass records the adoption (status, a `queue.adopt` audit row, an Event), and
/// a plain delete releases the object and leaves the queue and its messages. Declared again,
/// the queue is destroyed only with `destroyConfirmation` set to what the status showed (and
/// the loss named, the cluster's messageLossCap being 0).
#[tokio::test]
async fn an_adopted_queue_is_released_by_a_plain_delete_and_destroyed_only_when_confirmed() {
    let _b = brokers_shared().await;
    let f = fixture("s-adopt", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("adopt.{id}");
    queue_behind_our_back(&f, &name, "ANYCAST").await;
    let first = nodes(&f).await.into_iter().next().expect("a node");
    send_messages(&f.bed, first.broker_name(), &name, 4).await;
    let adopted = |q: &ArtemisQueue| {
        ready(q)
            && q.status
                .as_ref()
                .and_then(|s| s.not_owned.as_ref())
                .is_some_and(|n| n.adopted.iter().any(|a| a.message_count == 4))
    };
    f.create(
        &name,
        json!({"filter": "x=1", "deletion": {"allowMessageLoss": 4}}),
    )
    .await;
    let q = f
        .wait_for(&name, "Ready, adopted with its 4 messages", adopted)
        .await;
    let warnings = q
        .status
        .as_ref()
        .and_then(|s| s.delete_preview.as_ref())
        .map(|p| p.warnings.join(" | "))
        .unwrap_or_default();
    assert!(
        warnings.contains("destroyConfirmation"),
        "the preview says how: {warnings}"
    );
    let rows = f.audit_rows("queue.adopt").await;
    assert_eq!(rows.len(), 1, "one adoption row: {rows:?}");
    assert!(f.event_reasons(&name).await.iter().any(|r| r == "Adopted"));

    // A plain delete (allowMessageLoss set, so only ownership keeps the messages).
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_gone(&name).await;
    let left = on_brokers(&f, &name).await;
    assert_eq!(left.len(), 3, "the queue stays on every node: {left:?}");
    assert_eq!(
        left.iter().map(|(_, m, _)| m).sum::<u64>(),
        4,
        "its messages stay"
    );
    assert!(
        f.audit_rows("queue.delete").await.is_empty(),
        "no delete was sent"
    );
    assert!(f.event_reasons(&name).await.iter().any(|r| r == "Released"));

    // Declared again, confirmed after the adoption was shown: destroyed and audited.
    f.create(
        &name,
        json!({"filter": "x=1", "deletion": {"allowMessageLoss": 4}}),
    )
    .await;
    let q = f.wait_for(&name, "adopted again", adopted).await;
    let confirmation = q
        .status
        .and_then(|s| s.not_owned)
        .map(|n| n.confirmation)
        .expect("a confirmation to give");
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deletion": {"destroyConfirmation": confirmation}}})),
        )
        .await
        .expect("confirm");
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_gone(&name).await;
    assert!(on_brokers(&f, &name).await.is_empty(), "destroyed on every node");
    let rows = f.audit_rows("queue.delete").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1, "succeeded");
}

/// Issue 41 item 5: the audit row's actor is the field manager that last wrote the spec (here
/// a server-side apply as `alice-gitops`), never the operator and never "unknown".
#[tokio::test]
async fn the_audit_actor_is_the_field_manager_that_wrote_the_spec() {
    let _b = brokers_shared().await;
    let f = fixture("s-actor", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("actor.{id}");
    let q = json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": name}, "spec": {"clusterRef": {"name": "c"}}
    });
    f.queues()
        .patch(&name, &PatchParams::apply("alice-gitops"), &Patch::Apply(&q))
        .await
        .expect("server-side apply");
    f.wait_for(&name, "Ready", ready).await;
    let actors: Vec<(String, String)> =
        sqlx::query_as("SELECT command, actor FROM audit_event WHERE command LIKE 'queue.%' ORDER BY id")
            .fetch_all(f.op.store.pool())
            .await
            .expect("actors");
    assert!(!actors.is_empty());
    assert!(actors.iter().all(|(_, a)| a == "alice-gitops"), "{actors:?}");
}
