//! Cluster core (issue 3): live topology, logical nodes across failover, concurrent fan-out,
//! managementWrite evidence, the audit row, and the cluster's own conditions.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use artemis_studio_operator::api::cluster::{ArtemisCluster, ManagementWriteState};
use artemis_studio_operator::api::{Outcome, RefusalKind};
use artemis_studio_operator::broker::{BrokerManagement, JolokiaClient};
use artemis_studio_operator::controllers::command;
use artemis_studio_operator::fanout::{self, NodeReport};
use artemis_studio_operator::store::AuditIntent;
use artemis_studio_operator::topology::{self, Topology, TopologyMemory};

use crate::support::{
    RestoreHa, TestBed, brokers_exclusive, brokers_shared, create_cluster, short_id, wait_cluster_condition,
    wait_until,
};

async fn poll(bed: &TestBed, cluster: &str, memory: &tokio::sync::Mutex<TopologyMemory>) -> Topology {
    topology::poll(&bed.access(cluster, bed.broker_user()), memory).await
}

pub async fn node_id_of(bed: &TestBed, broker: &str) -> String {
    let b = bed.broker(broker);
    let (u, p) = bed.broker_user();
    let client = JolokiaClient::new(
        artemis_studio_operator::broker::jolokia::http_client(
            &artemis_studio_operator::broker::Registry::standalone(),
            None,
        )
        .expect("client"),
        b.jolokia,
        None,
        artemis_studio_operator::broker::Credentials {
            username: u,
            password: p,
        },
        Duration::from_secs(5),
    );
    BrokerManagement::connect(client)
        .await
        .expect("connect")
        .identity()
        .await
        .expect("identity")
        .node_id
}

#[tokio::test]
async fn the_static_cluster_is_three_live_logical_nodes() {
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    let memory = Default::default();
    let t = poll(&bed, "c", &memory).await;
    assert_eq!(t.nodes.len(), 3, "{:?}", t.nodes);
    assert!(
        t.nodes
            .iter()
            .all(|n| n.is_live() && n.role() == "primary" && n.standby.is_empty())
    );
    let mut endpoints: Vec<&str> = t.nodes.iter().filter_map(|n| n.active_endpoint()).collect();
    endpoints.sort();
    endpoints.dedup();
    assert_eq!(endpoints.len(), 3);
    assert!(t.unreachable.is_empty());
}

#[tokio::test]
async fn a_replicated_pair_is_one_logical_node_that_follows_failover() {
    let _brokers = brokers_exclusive().await;
    let bed = TestBed::get();
    let _restore = RestoreHa(&bed);
    let memory = Default::default();
    let pair_id = node_id_of(&bed, "ha1").await;
    let plain_id = node_id_of(&bed, "ha2").await;
    let (ha1, ha1b) = (bed.broker("ha1").jolokia, bed.broker("ha1b").jolokia);

    let t = poll(&bed, "ha", &memory).await;
    let pair = t.find(&pair_id).expect("the pair's logical node");
    assert_eq!(
        pair.active_endpoint(),
        Some(ha1.as_str()),
        "targeted at the primary"
    );
    assert_eq!(pair.standby, vec![ha1b.clone()]);
    assert!(t.find(&plain_id).is_some_and(|n| n.is_live()));
    let logical_nodes = t
        .nodes
        .iter()
        .filter(|n| n.node_id == pair_id || n.node_id == plain_id)
        .count();
    assert_eq!(logical_nodes, 2, "two logical nodes, not three: {:?}", t.nodes);

    // Crash the primary: the same logical node now targets the promoted backup.
    bed.broker_action("kill", "ha1");
    let t = wait_until("the backup takes over", Duration::from_secs(120), || {
        let memory = &memory;
        let bed = &bed;
        let pair_id = pair_id.clone();
        let ha1b = ha1b.clone();
        async move {
            let t = poll(bed, "ha", memory).await;
            let n = t.find(&pair_id)?;
            (n.active_endpoint() == Some(ha1b.as_str())).then_some(t)
        }
    })
    .await;
    let pair = t.find(&pair_id).expect("pair");
    assert_eq!(
        pair.role(),
        "backup",
        "the active endpoint is the promoted backup"
    );
    assert_eq!(
        t.nodes.iter().filter(|n| n.node_id == pair_id).count(),
        1,
        "no duplicate logical node"
    );

    // Stop the plain node: it is not live, and a fan-out skips it.
    bed.broker_action("stop", "ha2");
    let t = poll(&bed, "ha", &memory).await;
    let plain = t.find(&plain_id).expect("the stopped node is still named");
    assert!(!plain.is_live(), "{plain:?}");
    let outcomes = fanout::fan_out(&t, 4, Duration::from_secs(5), |target| async move {
        target.management.identity().await?;
        Ok(NodeReport::new(Outcome::Already, "answered"))
    })
    .await;
    let of = |id: &str| outcomes.iter().find(|o| o.node == id).expect("outcome").clone();
    assert_eq!(of(&plain_id).outcome, Outcome::SkippedNotLive, "{outcomes:?}");
    assert_eq!(of(&pair_id).outcome, Outcome::Already);
    assert_eq!(of(&pair_id).endpoint.as_deref(), Some(ha1b.as_str()));
}

#[tokio::test]
async fn fan_out_calls_every_node_in_one_round_and_times_out_per_node() {
    let _brokers = brokers_exclusive().await;
    let bed = TestBed::get();
    let memory = Default::default();
    let t = poll(&bed, "c", &memory).await;
    assert_eq!(t.live_nodes().count(), 3);
    let frozen_endpoint = bed.broker("c3").jolokia;
    bed.broker_action("freeze", "c3");
    let _thaw = crate::support::Thaw(&bed, "c3");

    let events: Arc<Mutex<Vec<(&'static str, String)>>> = Default::default();
    let outcomes = fanout::fan_out(&t, 16, Duration::from_secs(2), |target| {
        let events = events.clone();
        async move {
            let url = target.management.client().url().to_string();
            events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(("start", url.clone()));
            let r = target.management.identity().await;
            events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(("end", url));
            r?;
            Ok(NodeReport::new(Outcome::Already, "answered"))
        }
    })
    .await;
    let events = events.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let first_end = events
        .iter()
        .position(|(k, _)| *k == "end")
        .expect("some node answered");
    let starts_before = events[..first_end].iter().filter(|(k, _)| *k == "start").count();
    assert_eq!(
        starts_before, 3,
        "all nodes are called before any answers: {events:?}"
    );

    for o in &outcomes {
        if o.endpoint.as_deref() == Some(frozen_endpoint.as_str()) {
            assert_eq!(o.outcome, Outcome::Failed, "{o:?}");
            assert_eq!(o.refusal, Some(RefusalKind::Timeout), "{o:?}");
        } else {
            assert_eq!(o.outcome, Outcome::Already, "{o:?}");
        }
    }
}

fn intent(command: &str, ns: &str, cluster: &ArtemisCluster) -> AuditIntent {
    AuditIntent {
        instance_id: "test".into(),
        actor: "tests".into(),
        command: command.into(),
        cluster: format!("{ns}/{}", cluster.metadata.name.clone().unwrap_or_default()),
        target: "queue".into(),
        object_kind: "ArtemisCluster".into(),
        object_namespace: ns.into(),
        object_name: cluster.metadata.name.clone().unwrap_or_default(),
        object_uid: cluster.metadata.uid.clone().unwrap_or_default(),
        object_generation: cluster.metadata.generation,
        params: json!({}),
    }
}

async fn cluster_write_state(
    client: &kube::Client,
    ns: &str,
    name: &str,
    want: ManagementWriteState,
) -> ArtemisCluster {
    let api: Api<ArtemisCluster> = Api::namespaced(client.clone(), ns);
    wait_until(
        &format!("managementWrite {want:?}"),
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                let c = api.get(name).await.ok()?;
                (c.status.as_ref()?.management_write.state == want).then_some(c)
            }
        },
    )
    .await
}

#[tokio::test]
async fn management_write_follows_evidence_only() {
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("mw").await;
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.viewer_user())).await;
    let cluster = wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    assert_eq!(
        cluster.status.as_ref().map(|s| s.management_write.state),
        Some(ManagementWriteState::Unknown)
    );
    let key = format!("{ns}/c");
    let queue = format!("mw.{id}");

    // The viewer's write is refused by management.xml: UNAVAILABLE, with the grant.
    let topology = op.ctx.topologies.get(&key).expect("topology");
    let config =
        json!({"name": queue, "address": queue, "routing-type": "ANYCAST", "auto-create-address": true});
    let create = |target: fanout::Target| {
        let config = config.clone();
        async move {
            target.management.create_queue(&config).await?;
            Ok(NodeReport::new(Outcome::Applied, "created"))
        }
    };
    let r = command::execute(
        &op.ctx,
        command::Told::management(&cluster, &ns, "c"),
        &topology,
        Duration::from_secs(5),
        intent("queue.create", &ns, &cluster),
        create,
    )
    .await
    .expect("command");
    assert!(
        r.nodes
            .iter()
            .all(|n| n.refusal == Some(RefusalKind::NotAuthorized)),
        "{:?}",
        r.nodes
    );
    let c = cluster_write_state(&admin, &ns, "c", ManagementWriteState::Unavailable).await;
    let mw = c.status.expect("status").management_write;
    assert!(
        mw.grant
            .as_deref()
            .is_some_and(|g| g.contains("<access method=\"*\"") && g.contains("viewer")),
        "{mw:?}"
    );
    assert!(mw.evidence.is_some_and(|e| e.message.contains("not authorized")));

    // Now with the admin's credentials: a malformed write changes nothing...
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), &ns);
    let (u, p) = bed.broker_user();
    secrets
        .patch(
            "c-credentials",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"username": u, "password": p}})),
        )
        .await
        .expect("patch secret");
    let topology = wait_until(
        "the cluster uses the new credentials",
        Duration::from_secs(30),
        || {
            let op = &op;
            let key = key.clone();
            let user = u.clone();
            async move {
                let rt = op.ctx.clusters.get(&key)?;
                (rt.access.credentials.username == user).then_some(())?;
                let t = op.ctx.topologies.get(&key)?;
                (t.live_nodes().count() == 3).then_some(t)
            }
        },
    )
    .await;
    let malformed = |target: fanout::Target| async move {
        target.management.create_queue(&json!("{not a queue")).await?;
        Ok(NodeReport::new(Outcome::Applied, "created"))
    };
    let r = command::execute(
        &op.ctx,
        command::Told::management(&cluster, &ns, "c"),
        &topology,
        Duration::from_secs(5),
        intent("queue.create", &ns, &cluster),
        malformed,
    )
    .await
    .expect("command");
    assert!(
        r.nodes
            .iter()
            .all(|n| n.outcome == Outcome::Failed && n.refusal != Some(RefusalKind::NotAuthorized)),
        "{:?}",
        r.nodes
    );
    let c: ArtemisCluster = Api::namespaced(admin.clone(), &ns).get("c").await.expect("get");
    assert_eq!(
        c.status.expect("status").management_write.state,
        ManagementWriteState::Unavailable
    );

    // ...and a permitted write flips it to AVAILABLE.
    let r = command::execute(
        &op.ctx,
        command::Told::management(&cluster, &ns, "c"),
        &topology,
        Duration::from_secs(5),
        intent("queue.create", &ns, &cluster),
        create,
    )
    .await
    .expect("command");
    assert!(
        r.nodes.iter().all(|n| n.outcome == Outcome::Applied),
        "{:?}",
        r.nodes
    );
    let c = cluster_write_state(&admin, &ns, "c", ManagementWriteState::Available).await;
    assert!(c.status.expect("status").management_write.grant.is_none());

    // Three commands, three audit rows.
    let rows: Vec<(String, serde_json::Value)> =
        // Not the divert watch's create (issue 45: the cluster's, once per broker start).
        sqlx::query_as("SELECT outcome, outcome_detail FROM audit_event WHERE command <> 'divertwatch.create' ORDER BY id")
            .fetch_all(op.store.pool())
            .await
            .expect("rows");
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["failed", "failed", "succeeded"]
    );
    assert_eq!(rows[2].1["nodes"].as_array().map(Vec::len), Some(3));

    let mgmt_cleanup = fanout::fan_out(&topology, 4, Duration::from_secs(5), |t| {
        let queue = queue.clone();
        async move {
            t.management.destroy_queue(&queue, false).await?;
            Ok(NodeReport::new(Outcome::Applied, "removed"))
        }
    })
    .await;
    assert!(mgmt_cleanup.iter().all(|o| o.outcome == Outcome::Applied));
}

#[tokio::test]
async fn a_partially_failed_command_is_one_failed_audit_row_naming_the_applied_nodes() {
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("audit").await;
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    let cluster = wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let topology = op.ctx.topologies.get(&format!("{ns}/c")).expect("topology");

    // On c2 only, a queue of that name exists already (as MULTICAST): c2 refuses the create.
    let address = format!("audit.{id}");
    let c2_id = node_id_of(&bed, "c2").await;
    let c2 = topology.find(&c2_id).and_then(|n| n.active.clone()).expect("c2");
    c2.create_queue(&json!({"name": address, "address": address, "routing-type": "MULTICAST", "auto-create-address": true}))
        .await
        .expect("create the conflicting queue on c2");

    let config =
        json!({"name": address, "address": address, "routing-type": "ANYCAST", "auto-create-address": true});
    let r = command::execute(
        &op.ctx,
        command::Told::management(&cluster, &ns, "c"),
        &topology,
        Duration::from_secs(5),
        intent("queue.create", &ns, &cluster),
        |t| {
            let config = config.clone();
            async move {
                t.management.create_queue(&config).await?;
                Ok(NodeReport::new(Outcome::Applied, "created"))
            }
        },
    )
    .await
    .expect("command");
    let failed: Vec<_> = r.nodes.iter().filter(|n| n.outcome == Outcome::Failed).collect();
    assert_eq!(failed.len(), 1, "{:?}", r.nodes);
    assert_eq!(failed[0].node, c2_id);
    assert_eq!(
        failed[0].refusal,
        Some(RefusalKind::QueueExists),
        "{:?}",
        failed[0]
    );

    let rows: Vec<(String, serde_json::Value)> =
        // Not the divert watch's create (issue 45: the cluster's, once per broker start).
        sqlx::query_as("SELECT outcome, outcome_detail FROM audit_event WHERE command <> 'divertwatch.create'")
            .fetch_all(op.store.pool())
            .await
            .expect("rows");
    assert_eq!(rows.len(), 1, "one row per command");
    assert_eq!(rows[0].0, "failed");
    let mut applied: Vec<String> =
        serde_json::from_value(rows[0].1["appliedNodes"].clone()).expect("appliedNodes");
    applied.sort();
    let mut expected: Vec<String> = r
        .nodes
        .iter()
        .filter(|n| n.outcome == Outcome::Applied)
        .map(|n| n.node.clone())
        .collect();
    expected.sort();
    assert_eq!(applied, expected);
    assert_eq!(applied.len(), 2);

    for n in topology.live_nodes() {
        let m = n.active.clone().expect("live");
        let _ = m.destroy_queue(&address, false).await;
        let _ = m.delete_address(&address).await;
    }
}

#[tokio::test]
async fn bad_cluster_input_names_the_cause_and_the_fix() {
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("badc").await;
    let _op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let c1 = bed.broker("c1").jolokia;

    create_cluster(
        &admin,
        &ns,
        "unreachable",
        &["http://127.0.0.1:1/console/jolokia".into()],
        Some(bed.broker_user()),
    )
    .await;
    create_cluster(
        &admin,
        &ns,
        "wrongpw",
        std::slice::from_ref(&c1),
        Some(("admin".into(), "not-the-password".into())),
    )
    .await;
    create_cluster(&admin, &ns, "nosecret", std::slice::from_ref(&c1), None).await;
    let root = c1.replace("/console/jolokia", "/");
    create_cluster(&admin, &ns, "notjolokia", &[root], Some(bed.broker_user())).await;

    for (name, reason, needle) in [
        ("unreachable", "Unreachable", "check the URL in spec.brokers"),
        (
            "wrongpw",
            "CredentialsRefused",
            "check the username and password in the credentials Secret",
        ),
        ("nosecret", "SecretMissing", "does not exist: create it"),
        ("notjolokia", "NotJolokia", "is this the Jolokia URL"),
    ] {
        let c = wait_cluster_condition(&admin, &ns, name, "Ready", "False").await;
        let ready = c
            .status
            .expect("status")
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready");
        assert_eq!(ready.reason, reason, "{name}: {ready:?}");
        assert!(ready.message.contains(needle), "{name}: {}", ready.message);
    }
    // Issue 22 item 8: a queue on the cluster whose credentials are refused names the
    // credentials (not "no live node"), and its delete — it never reached a broker — finishes.
    // The same for a queue whose cluster's Secret does not exist.
    let queues: Api<artemis_studio_operator::api::queue::ArtemisQueue> = Api::namespaced(admin.clone(), &ns);
    // Issue 41 item 6: a cluster whose URL is not Jolokia (or does not answer) gives its queues
    // the cluster's cause, not "no live node".
    for (cluster, reason, needle) in [
        ("wrongpw", "CredentialsRefused", "refused the credentials"),
        ("nosecret", "ClusterNotReady", "does not exist"),
        (
            "notjolokia",
            "ClusterNotReady",
            "no endpoint answered as a live broker",
        ),
        ("unreachable", "ClusterNotReady", "127.0.0.1:1"),
    ] {
        let q = serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": cluster}, "spec": {"clusterRef": {"name": cluster}}
        }))
        .expect("queue json");
        queues
            .create(&Default::default(), &q)
            .await
            .expect("create queue");
        wait_until(
            &format!("the queue on {cluster} says {reason}"),
            Duration::from_secs(60),
            || {
                let queues = queues.clone();
                async move {
                    let q = queues.get(cluster).await.ok()?;
                    q.status?
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == reason && c.message.contains(needle))
                        .then_some(())
                }
            },
        )
        .await;
        queues.delete(cluster, &Default::default()).await.expect("delete");
        wait_until(
            &format!("the delete of the queue on {cluster} finishes"),
            Duration::from_secs(60),
            || {
                let queues = queues.clone();
                async move { queues.get_opt(cluster).await.ok()?.is_none().then_some(()) }
            },
        )
        .await;
    }
}

/// Issue 42: Jolokia's origin refusal was reported as CredentialsRefused. On the bed's
/// strict-origin broker c1: an https Origin over http ("Secure origin … should not be processed
/// over HTTP") and an Origin jolokia-access.xml does not allow are OriginRefused on the cluster
/// and on a queue of it, naming spec.origin and jolokia-access.xml; the right origin is Ready.
#[tokio::test]
async fn a_cluster_whose_origin_jolokia_refuses_says_origin_refused_and_the_fix() {
    use kube::api::PostParams;
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    assert!(bed.broker("c1").strict_origin, "c1 checks origins strictly");
    let ns = bed.fresh_namespace("orig").await;
    let _op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let c1 = bed.broker("c1").jolokia;
    let clusters: Api<ArtemisCluster> = Api::namespaced(admin.clone(), &ns);
    let (u, p) = bed.broker_user();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), &ns);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
        "stringData": {"username": u, "password": p}});
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(secret).expect("secret json"),
        )
        .await
        .expect("secret");
    for (name, origin) in [
        ("secure", "https://localhost"),
        ("foreign", "http://evil.example"),
        ("allowed", "http://localhost"),
    ] {
        let cluster = json!({"apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": name},
            "spec": {"brokers": [{"url": c1}], "credentials": {"secretName": "creds"},
                     "origin": origin, "pollIntervalSeconds": 2, "requestTimeoutSeconds": 10}});
        clusters
            .create(
                &PostParams::default(),
                &serde_json::from_value(cluster).expect("cluster json"),
            )
            .await
            .expect("create ArtemisCluster");
    }
    let queues: Api<artemis_studio_operator::api::queue::ArtemisQueue> = Api::namespaced(admin.clone(), &ns);
    for (name, broker_said) in [
        (
            "secure",
            "Secure origin https://localhost should not be processed over HTTP",
        ),
        ("foreign", "Origin http://evil.example is not allowed"),
    ] {
        let reason_is = |want: &'static str| {
            let clusters = clusters.clone();
            async move {
                let c = clusters.get(name).await.ok()?;
                let ready = c.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
                (ready.reason == want).then_some(ready.message)
            }
        };
        let message = wait_until(
            &format!("{name}: Ready=False OriginRefused"),
            Duration::from_secs(60),
            || reason_is("OriginRefused"),
        )
        .await;
        assert!(message.contains(broker_said), "{name}: {message}");
        assert!(
            message.contains("spec.origin") && message.contains("jolokia-access.xml"),
            "{name}: {message}"
        );
        assert!(!message.contains("credentials"), "{name}: {message}");
        let q = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": name}, "spec": {"clusterRef": {"name": name}}
        }))
        .expect("queue json");
        queues
            .create(&PostParams::default(), &q)
            .await
            .expect("create queue");
        wait_until(
            &format!("the queue on {name} says OriginRefused"),
            Duration::from_secs(60),
            || {
                let queues = queues.clone();
                async move {
                    let q = queues.get(name).await.ok()?;
                    q.status?
                        .conditions
                        .iter()
                        .any(|c| {
                            c.type_ == "Ready"
                                && c.reason == "OriginRefused"
                                && c.message.contains("spec.origin")
                        })
                        .then_some(())
                }
            },
        )
        .await;
    }
    wait_cluster_condition(&admin, &ns, "allowed", "Ready", "True").await;
}

#[tokio::test]
async fn pod_discovery_finds_broker_pods_by_label_and_uses_the_configured_origin() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("disc").await;
    let _op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    // No kubelet here: a Pod gets its IP from a status patch, as a kubelet would report it.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "broker-0", "labels": {"app": "artemis", "cluster": "c"}},
        "spec": {"containers": [{"name": "broker", "image": "apache/activemq-artemis:2.40.0"}]}
    }))
    .expect("pod json");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    pods.patch_status(
        "broker-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"podIP": "127.0.0.1"}})),
    )
    .await
    .expect("pod IP");
    let port = reqwest::Url::parse(&bed.broker("c1").jolokia)
        .ok()
        .and_then(|u| u.port())
        .expect("c1 port");
    let (u, p) = bed.broker_user();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                "stringData": {"username": u, "password": p}}),
            )
            .expect("secret json"),
        )
        .await
        .expect("secret");
    let clusters: Api<ArtemisCluster> = Api::namespaced(admin.clone(), &ns);
    let cluster = |name: &str, origin: Option<&str>| -> ArtemisCluster {
        let mut spec = json!({"discovery": {"matchLabels": {"app": "artemis"}, "port": port},
            "credentials": {"secretName": "creds"}, "pollIntervalSeconds": 2});
        if let Some(o) = origin {
            spec["origin"] = json!(o);
        }
        serde_json::from_value(
            json!({"apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": name}, "spec": spec}),
        )
        .expect("cluster json")
    };
    // The pod IP is not an origin c1's strict Jolokia accepts: the condition says what to set.
    clusters
        .create(&PostParams::default(), &cluster("by-ip", None))
        .await
        .expect("create");
    let c = wait_cluster_condition(&admin, &ns, "by-ip", "Ready", "False").await;
    let ready = c
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert!(ready.message.contains("spec.origin"), "{}", ready.message);
    assert_eq!(ready.reason, "OriginRefused");
    // With the broker's allowed origin, the discovered pod is a live logical node.
    clusters
        .create(
            &PostParams::default(),
            &cluster("by-origin", Some("http://localhost")),
        )
        .await
        .expect("create");
    let c = wait_cluster_condition(&admin, &ns, "by-origin", "Ready", "True").await;
    let status = c.status.expect("status");
    assert_eq!(status.live_nodes, 1);
    assert!(
        status.nodes.iter().any(|n| n.active_endpoint.as_deref()
            == Some(format!("http://127.0.0.1:{port}/console/jolokia").as_str()))
    );
}
