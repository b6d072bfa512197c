//! Client-side Kubernetes API metrics against the real API server: the layer sits in kube's
//! client stack and sees each request's verb and resource.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Config};
use serde_json::json;

use artemis_studio_operator::telemetry::{Metrics, kube_api};

use crate::support::{TestBed, short_id};

#[tokio::test]
async fn api_requests_are_counted_by_verb_and_resource() {
    let bed = TestBed::get();
    let kc = Kubeconfig::read_from(bed.var("TESTBED_KUBECONFIG")).expect("read kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let metrics = Metrics::default();
    let client = kube_api::api_client_with(config, &metrics).expect("client");
    let ns = bed.fresh_namespace("apimetrics").await;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.get(&ns).await.expect("get namespace");
    namespaces
        .list(&ListParams::default().limit(1))
        .await
        .expect("list namespaces");
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let name = format!("m-{}", short_id());
    maps.patch(
        &name,
        &PatchParams::apply("artemis-studio-tests"),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})),
    )
    .await
    .expect("apply");
    maps.get(&name).await.expect("get");
    assert!(maps.get("does-not-exist").await.is_err());
    maps.delete(&name, &Default::default()).await.expect("delete");

    let api = &metrics.kube_api;
    assert_eq!(api.count("get", "namespaces"), 1);
    assert_eq!(api.count("list", "namespaces"), 1);
    assert_eq!(api.count("patch", "configmaps"), 1);
    assert_eq!(api.count("get", "configmaps"), 2);
    assert_eq!(api.count("delete", "configmaps"), 1);
    assert_eq!(
        api.requests
            .get_or_create(&kube_api::ApiRequestLabels {
                verb: "get".into(),
                kind: "configmaps".into(),
                code: "4xx".into(),
            })
            .get(),
        1,
        "the 404 is counted as 4xx"
    );
}
