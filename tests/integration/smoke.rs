//! Smoke tests: each real part of the test bed does what the product relies on.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use artemis_studio_operator::api::{self, ArtemisQueue, ConnectionClose};

use crate::support::{TestBed, brokers_shared, jolokia_raw, wait_until};

/// Install the CRDs the way the operator and the chart do, and wait until they are served.
pub async fn install_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in api::all_crds() {
        crds.patch(
            &crd.name_any(),
            &PatchParams::apply("artemis-studio-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
    }
    for crd in api::all_crds() {
        let name = crd.name_any();
        wait_until(
            &format!("CRD {name} Established"),
            Duration::from_secs(60),
            || {
                let crds = crds.clone();
                let name = name.clone();
                async move {
                    let c = crds.get(&name).await.ok()?;
                    c.status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                }
            },
        )
        .await;
    }
}

#[tokio::test]
async fn crds_install_and_cel_refuses_a_routing_type_change() {
    let bed = TestBed::get();
    let client = bed.kube_admin().await;
    install_crds(&client).await;
    let ns = bed.fresh_namespace("smoke-crd").await;

    let queues: Api<ArtemisQueue> = Api::namespaced(client.clone(), &ns);
    let q: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": "orders"},
        "spec": {"clusterRef": {"name": "c"}, "routingType": "ANYCAST"}
    }))
    .expect("queue json");
    let created = queues
        .create(&PostParams::default(), &q)
        .await
        .expect("create queue");
    // Defaults are written by the schema: a reader sees them with kubectl get -o yaml.
    assert!(created.spec.durable);
    assert_eq!(created.spec.deletion.policy, api::DeletionPolicy::Delete);

    let err = queues
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"routingType": "MULTICAST"}})),
        )
        .await
        .expect_err("a routingType change must be refused at admission");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains("routingType is immutable"),
        "{}",
        status.message
    );

    // The filter stays editable.
    queues
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"filter": "color='red'"}})),
        )
        .await
        .expect("a filter change is allowed");

    // A close by id without a node is refused: ids are node-local (ADR-0057 D1).
    let closes: Api<ConnectionClose> = Api::namespaced(client.clone(), &ns);
    let cc: ConnectionClose = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
        "metadata": {"name": "no-node"},
        "spec": {"clusterRef": {"name": "c"}, "target": {"connectionId": "a3f1c9de"}}
    }))
    .expect("close json");
    let err = closes
        .create(&PostParams::default(), &cc)
        .await
        .expect_err("no node must be refused");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert!(status.message.contains("node is required"), "{}", status.message);
}

#[tokio::test]
async fn jolokia_answers_on_every_broker_and_strict_origin_is_understood() {
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    let user = bed.broker_user();
    for b in bed.brokers() {
        let read = json!({"type": "read", "mbean": format!("org.apache.activemq.artemis:broker=\"{}\"", b.name), "attribute": "NodeID"});
        let (http, body) = jolokia_raw(&b, &user, Some("http://localhost"), read.clone()).await;
        assert_eq!(http, 200, "{}: {body}", b.name);
        assert_eq!(body["status"], 200, "{}: {body}", b.name);
        assert!(
            body["value"].as_str().is_some_and(|v| !v.is_empty()),
            "{}: {body}",
            b.name
        );

        let (_, body) = jolokia_raw(&b, &user, None, read).await;
        if b.strict_origin {
            // The broker's default: no Origin, no answer. The operator always sends one.
            assert_eq!(body["status"], 403, "{}: {body}", b.name);
            assert!(
                body["error"].as_str().is_some_and(|e| e.contains("Origin")),
                "{}: {body}",
                b.name
            );
        } else {
            assert_eq!(body["status"], 200, "{}: {body}", b.name);
        }
    }
}

#[tokio::test]
async fn topology_shows_three_members_and_the_pair_shares_a_node_id() {
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    let user = bed.broker_user();
    let c1 = bed.broker("c1");
    let exec = json!({"type": "exec", "mbean": "org.apache.activemq.artemis:broker=\"c1\"", "operation": "listNetworkTopology()"});
    let members = wait_until("c1 sees 3 cluster members", Duration::from_secs(60), || {
        let (c1, user, exec) = (c1.clone(), user.clone(), exec.clone());
        async move {
            let (_, body) = jolokia_raw(&c1, &user, Some("http://localhost"), exec).await;
            let list: Vec<serde_json::Value> = serde_json::from_str(body["value"].as_str()?).ok()?;
            (list.len() == 3).then_some(list)
        }
    })
    .await;
    assert!(
        members
            .iter()
            .all(|m| m["nodeID"].is_string() && m["live"].is_string())
    );

    let node_id = |name: &'static str| {
        let b = bed.broker(name);
        let user = user.clone();
        async move {
            let read = json!({"type": "read", "mbean": format!("org.apache.activemq.artemis:broker=\"{name}\""), "attribute": "NodeID"});
            let (_, body) = jolokia_raw(&b, &user, Some("http://localhost"), read).await;
            body["value"].as_str().map(str::to_string).expect("NodeID")
        }
    };
    let primary = node_id("ha1").await;
    let backup = node_id("ha1b").await;
    assert_eq!(primary, backup, "a primary and its backup are one logical node");
    assert_ne!(primary, node_id("ha2").await);
}

#[tokio::test]
async fn migrations_apply_to_postgres() {
    let bed = TestBed::get();
    let url = bed.fresh_database().await;
    artemis_studio_operator::store::Store::migrate(&url)
        .await
        .expect("migrations apply");
    // Twice is a no-op.
    artemis_studio_operator::store::Store::migrate(&url)
        .await
        .expect("migrations are idempotent");
    let store = artemis_studio_operator::store::Store::connect(&url)
        .await
        .expect("connect");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_event")
        .fetch_one(store.pool())
        .await
        .expect("audit_event exists");
    assert_eq!(n, 0);
}

/// Every example under deploy/examples/ is admitted by the API server as written (schema and
/// CEL rules), so the README's examples stay true.
#[tokio::test]
async fn every_example_is_admitted_by_the_api_server() {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::Discovery;
    let bed = crate::support::TestBed::get();
    let client = bed.kube_admin().await;
    install_crds(&client).await;
    let ns = bed.fresh_namespace("examples").await;
    let discovery = Discovery::new(client.clone()).run().await.expect("discovery");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples");
    let mut applied = vec![];
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read example");
        for doc in text.split("\n---\n") {
            let Ok(mut obj) = serde_saphyr::from_str::<DynamicObject>(doc) else {
                continue;
            };
            let Some(types) = obj.types.clone() else { continue };
            if types.kind == "Namespace" {
                continue;
            }
            let (group, version) = types
                .api_version
                .split_once('/')
                .unwrap_or(("", &types.api_version));
            let gvk = kube::api::GroupVersionKind::gvk(group, version, &types.kind);
            let (ar, _) = discovery.resolve_gvk(&gvk).expect("a known kind");
            obj.metadata.namespace = Some(ns.clone());
            let name = obj.metadata.name.clone().expect("name");
            let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(client.clone(), &ns, &ar);
            api.patch(
                &name,
                &PatchParams::apply("examples-test").force(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_or_else(|e| panic!("{} ({} {name}) is refused: {e}", path.display(), types.kind));
            applied.push(types.kind.clone());
        }
    }
    for kind in [
        "ArtemisCluster",
        "ArtemisQueue",
        "ArtemisDivert",
        "ConnectionClose",
        "MessageReplay",
        "ArtemisCaptureSubscription",
    ] {
        assert!(
            applied.iter().any(|k| k == kind),
            "an example of {kind}: {applied:?}"
        );
    }
}

/// The shared brokers' hygiene: what a test makes (queues with messages, their addresses, a
/// divert) is gone from every broker once the test's `CleanUp` is dropped, and only that.
#[tokio::test]
async fn a_test_leaves_the_brokers_as_it_found_them() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let (id, other) = (crate::support::short_id(), crate::support::short_id());
    let (ours, theirs) = (format!("swept.{id}"), format!("kept.{other}"));
    let names = |b: crate::support::Broker| {
        let bed = &bed;
        async move {
            let mut all = vec![];
            for attribute in ["QueueNames", "AddressNames", "DivertNames"] {
                let (_, v) = jolokia_raw(
                    &b,
                    &bed.broker_user(),
                    Some("http://localhost"),
                    json!({
                    "type": "read", "mbean": format!("org.apache.activemq.artemis:broker=\"{}\"", b.name),
                    "attribute": attribute}),
                )
                .await;
                all.extend(
                    v["value"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|n| n.as_str().map(str::to_string)),
                );
            }
            all
        }
    };
    let keep = bed.clean_up(&[&other]);
    crate::capture::broker_queue(&bed, &theirs).await;
    {
        let _clean = bed.clean_up(&[&id]);
        crate::capture::broker_queue(&bed, &ours).await;
        crate::support::send_messages(&bed, "c1", &ours, 3).await;
        let c1 = bed.broker("c1");
        let divert = format!("{ours}.copy");
        let doc =
            json!({"name": divert, "routing-name": divert, "address": ours, "forwarding-address": theirs,
                         "exclusive": false})
            .to_string();
        let r = crate::capture::exec(&bed, &c1, "createDivert(java.lang.String)", json!([doc])).await;
        assert_eq!(r["status"], 200, "create the divert: {r}");
        assert!(
            names(c1).await.iter().filter(|n| n.contains(&id)).count() >= 3,
            "made on c1"
        );
    }
    for b in bed.cluster_brokers("c") {
        let left = names(b.clone()).await;
        assert!(
            !left.iter().any(|n| n.contains(&id)),
            "left on {}: {left:?}",
            b.name
        );
        assert!(left.contains(&theirs), "another test's queue kept on {}", b.name);
    }
    drop(keep);
}
