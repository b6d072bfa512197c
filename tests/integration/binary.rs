//! The operator binary itself, as a deployment runs it: its own identity (the chart's RBAC),
//! migrations at start-up, probes and metrics.

use std::time::Duration;

use serde_json::json;

use artemis_studio_operator::api::ArtemisQueue;

use crate::queue::ready;
use crate::support::{TestBed, brokers_shared, create_cluster, short_id, wait_ready, wait_until};

#[tokio::test]
async fn the_binary_runs_under_the_chart_rbac_and_serves_probes_and_metrics() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("bin").await;
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let port = 18_000 + (std::process::id() % 1000) as u16;
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);
    let _operator = bed.spawn_operator(&ns, &db, port, &[]);
    let http = reqwest::Client::new();
    wait_ready(&http, port).await;

    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    let queues: kube::Api<ArtemisQueue> = kube::Api::namespaced(admin.clone(), &ns);
    let name = format!("bin.{id}");
    let q: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": name}, "spec": {"clusterRef": {"name": "c"}}
    }))
    .expect("queue json");
    queues
        .create(&Default::default(), &q)
        .await
        .expect("create queue");
    wait_until("the queue is Ready", Duration::from_secs(90), || {
        let queues = queues.clone();
        let name = name.clone();
        async move { queues.get(&name).await.ok().filter(ready).map(|_| ()) }
    })
    .await;
    let metrics = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    let applied = format!(
        r#"artemis_studio_commands_total{{command="queue.apply",verdict="succeeded",cluster="{ns}/c"}} 1"#
    );
    assert!(metrics.contains(&applied), "{metrics}");
}
