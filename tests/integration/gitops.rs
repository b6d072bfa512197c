//! GitOps on the real test bed: the Argo CD health scripts judge the status documents the
//! controllers really wrote (read back from the API server as Argo CD reads them).

#[path = "../common/argocd_lua.rs"]
mod argocd_lua;

use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use artemis_studio_operator::api::ArtemisCluster;

use crate::queue::{condition, fixture, ready};
use crate::support::{brokers_shared, send_messages, short_id, wait_until};

/// The object exactly as the API server returns it (no typed round trip), as Argo CD reads it.
async fn read_back(client: &Client, ns: &str, kind: &str, plural: &str, name: &str) -> Value {
    let ar = kube::discovery::ApiResource {
        group: "artemis-studio.io".into(),
        version: "v1alpha1".into(),
        api_version: "artemis-studio.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let obj = api
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get {kind} {ns}/{name}: {e}"));
    serde_json::to_value(obj).expect("object json")
}

/// Argo CD's verdict on the object as it is now; prints the status it judged.
async fn verdict(client: &Client, ns: &str, kind: &str, plural: &str, name: &str) -> (String, String) {
    let obj = read_back(client, ns, kind, plural, name).await;
    let (status, message) = argocd_lua::health(&obj);
    println!(
        "{kind} {name}: {status} ({message})\n  status: {}",
        obj.get("status").unwrap_or(&Value::Null)
    );
    (status, message)
}

fn has_condition(obj: &Value, type_: &str, status: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == status))
}

/// Every kind, driven through the states the issue names, judged by its Lua script on the
/// status the controllers wrote: ArtemisQueue (Progressing before its first status, Healthy when
/// Ready, Degraded when its delete is refused), ArtemisDivert, ArtemisCluster and
/// ArtemisCaptureSubscription Healthy when Ready, ConnectionClose Healthy when Complete.
#[tokio::test]
async fn argocd_health_scripts_judge_the_statuses_the_controllers_wrote() {
    let _b = brokers_shared().await;
    // A bulk cap of 2: three messages make a delete the operator refuses.
    let f = fixture("gitops-health", Some(2)).await;
    let (admin, ns) = (f.admin.clone(), f.ns.clone());
    let id = short_id();

    // ArtemisCluster: the fixture's bulkCap patch made generation 2 while Ready=True was still
    // generation 1's: Progressing until the operator observes it, then Healthy.
    let c = read_back(&admin, &ns, "ArtemisCluster", "artemisclusters", "c").await;
    if c["status"]["observedGeneration"].as_i64() < c["metadata"]["generation"].as_i64() {
        let (s, m) = argocd_lua::health(&c);
        assert_eq!(s, "Progressing", "{m}");
    }
    wait_until(
        "ArtemisCluster observes generation 2",
        Duration::from_secs(60),
        || async {
            let c = read_back(&admin, &ns, "ArtemisCluster", "artemisclusters", "c").await;
            (c["status"]["observedGeneration"] == c["metadata"]["generation"]).then_some(())
        },
    )
    .await;
    let (s, m) = verdict(&admin, &ns, "ArtemisCluster", "artemisclusters", "c").await;
    assert_eq!(s, "Healthy", "{m}");

    // ArtemisQueue: Progressing until the operator has written a status for it, then Healthy.
    let ok = format!("ok-{id}");
    f.create(&ok, json!({"name": format!("gitops.{id}.ok")})).await;
    let first = read_back(&admin, &ns, "ArtemisQueue", "artemisqueues", &ok).await;
    if first.get("status").is_none() {
        let (s, m) = argocd_lua::health(&first);
        assert_eq!(s, "Progressing", "no status yet: {m}");
    }
    f.wait_for(&ok, "Ready", ready).await;
    let (s, m) = verdict(&admin, &ns, "ArtemisQueue", "artemisqueues", &ok).await;
    assert_eq!(s, "Healthy", "{m}");

    // ArtemisDivert Ready: from the queue's address into a second queue.
    let fwd = format!("fwd-{id}");
    f.create(&fwd, json!({"name": format!("gitops.{id}.fwd")})).await;
    f.wait_for(&fwd, "Ready", ready).await;
    let diverts = kube::Api::<artemis_studio_operator::api::ArtemisDivert>::namespaced(admin.clone(), &ns);
    let divert = format!("copy-{id}");
    diverts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisDivert",
                "metadata": {"name": divert},
                "spec": {"clusterRef": {"name": "c"}, "address": format!("gitops.{id}.ok"),
                         "forwardingAddress": format!("gitops.{id}.fwd")}
            }))
            .expect("divert json"),
        )
        .await
        .expect("create ArtemisDivert");
    wait_until("ArtemisDivert Ready", Duration::from_secs(90), || async {
        let d = read_back(&admin, &ns, "ArtemisDivert", "artemisdiverts", &divert).await;
        has_condition(&d, "Ready", "True").then_some(())
    })
    .await;
    let (s, m) = verdict(&admin, &ns, "ArtemisDivert", "artemisdiverts", &divert).await;
    assert_eq!(s, "Healthy", "{m}");

    // ArtemisCaptureSubscription Ready: its tap on the queue's address installed and drained.
    let subs =
        kube::Api::<artemis_studio_operator::api::ArtemisCaptureSubscription>::namespaced(admin.clone(), &ns);
    let sub = format!("tap-{id}");
    subs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
            "metadata": {"name": sub},
            "spec": {"clusterRef": {"name": "c"}, "queues": format!("gitops.{id}.ok")}
        }))
        .expect("subscription json"),
    )
    .await
    .expect("create ArtemisCaptureSubscription");
    wait_until(
        "ArtemisCaptureSubscription Ready",
        Duration::from_secs(90),
        || async {
            let s = read_back(
                &admin,
                &ns,
                "ArtemisCaptureSubscription",
                "artemiscapturesubscriptions",
                &sub,
            )
            .await;
            has_condition(&s, "Ready", "True").then_some(())
        },
    )
    .await;
    let (s, m) = verdict(
        &admin,
        &ns,
        "ArtemisCaptureSubscription",
        "artemiscapturesubscriptions",
        &sub,
    )
    .await;
    assert_eq!(s, "Healthy", "{m}");

    // ConnectionClose Complete: a connection that is not there is closed already (final).
    let cluster: ArtemisCluster = Api::namespaced(admin.clone(), &ns)
        .get("c")
        .await
        .expect("get ArtemisCluster");
    let node = cluster
        .status
        .as_ref()
        .and_then(|s| s.nodes.first())
        .expect("a node")
        .node_id
        .clone();
    let closes = kube::Api::<artemis_studio_operator::api::ConnectionClose>::namespaced(admin.clone(), &ns);
    let close = format!("close-{id}");
    closes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
                "metadata": {"name": close},
                "spec": {"clusterRef": {"name": "c"}, "confirm": "nobody",
                         "target": {"node": node, "connectionId": format!("no-such-connection-{id}")}}
            }))
            .expect("close json"),
        )
        .await
        .expect("create ConnectionClose");
    wait_until("ConnectionClose Complete", Duration::from_secs(90), || async {
        let c = read_back(&admin, &ns, "ConnectionClose", "connectioncloses", &close).await;
        has_condition(&c, "Complete", "True").then_some(())
    })
    .await;
    let (s, m) = verdict(&admin, &ns, "ConnectionClose", "connectioncloses", &close).await;
    assert_eq!(s, "Healthy", "{m}");

    // ArtemisQueue with a refused delete: three messages above the bulk cap of 2.
    let full = format!("full-{id}");
    let full_queue = format!("gitops.{id}.full");
    f.create(&full, json!({"name": full_queue})).await;
    f.wait_for(&full, "Ready", ready).await;
    send_messages(&f.bed, "c1", &full_queue, 3).await;
    f.wait_for(&full, "the preview counts 3 messages", |q| {
        q.status
            .as_ref()
            .and_then(|s| s.delete_preview.as_ref())
            .is_some_and(|p| p.total_messages == 3)
    })
    .await;
    f.queues()
        .delete(&full, &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_for(&full, "DeleteBlocked BulkCapExceeded", |q| {
        condition(q, "DeleteBlocked").is_some_and(|c| c.1 == "BulkCapExceeded")
    })
    .await;
    let (s, m) = verdict(&admin, &ns, "ArtemisQueue", "artemisqueues", &full).await;
    assert_eq!(s, "Degraded", "{m}");
    assert!(
        m.contains("BulkCapExceeded") && m.contains("allowMessageLoss"),
        "{m}"
    );

    // Tidy the shared brokers: the subscription's taps and the refused queue go.
    subs.delete(&sub, &DeleteParams::default())
        .await
        .expect("delete subscription");
    f.queues()
        .patch(
            &full,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deletion": {"allowMessageLoss": 3}}})),
        )
        .await
        .expect("allow the loss");
    f.wait_gone(&full).await;
    wait_until(
        "the subscription's taps removed",
        Duration::from_secs(90),
        || async {
            subs.get_opt(&sub)
                .await
                .ok()
                .and_then(|o| o.is_none().then_some(()))
        },
    )
    .await;
}
