//! Shards (issue 46) between real operator processes (the binary, under the chart's RBAC):
//! broker clusters shared out by Lease, each acted for by exactly one replica. Judged from the
//! Leases, the audit rows (which process sent each command) and the objects' status.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

use artemis_studio_operator::api::{ArtemisCluster, ArtemisQueue};

use crate::leader::{
    LEASE_NAMESPACE, LONG, SHORT, create_queue_on_c, free_port, sample_sum, signal, spawn_with, wait_exit,
};
use crate::queue::ready;
use crate::support::{
    OperatorProcess, TestBed, brokers_shared, create_cluster, metrics, short_id, wait_cluster_condition,
    wait_ready, wait_until,
};

/// Remove the test's Leases (every one whose name carries its instance ID).
async fn delete_leases_of(leases: &Api<Lease>, instance: &str) {
    for l in leases
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        if let Some(name) = l.metadata.name.filter(|n| n.contains(instance)) {
            let _ = leases.delete(&name, &Default::default()).await;
        }
    }
}

/// The environment of one sharded operator process named `pod`.
fn sharded_env(instance: &str, pod: &str, timing: &[(&str, &str)]) -> Vec<(String, String)> {
    [
        ("SHARDING", "true"),
        ("LEASE_NAMESPACE", LEASE_NAMESPACE),
        ("INSTANCE_ID", instance),
        ("SHUTDOWN_GRACE_SECONDS", "20"),
        ("POD_NAME", pod),
    ]
    .iter()
    .chain(timing)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `status.heldBy` of each ArtemisCluster (`namespace`, or `namespace/name`; the name `c`
/// when none is given), None where unset.
async fn held_by(admin: &kube::Client, clusters: &[String]) -> BTreeMap<String, Option<String>> {
    let mut held = BTreeMap::new();
    for k in clusters {
        let (ns, name) = k.split_once('/').unwrap_or((k, "c"));
        let api: Api<ArtemisCluster> = Api::namespaced(admin.clone(), ns);
        let by = api
            .get(name)
            .await
            .ok()
            .and_then(|c| c.status)
            .and_then(|s| s.held_by);
        held.insert(k.clone(), by);
    }
    held
}

/// Wait until every cluster is held as `want` says (by namespace), from `status.heldBy`.
async fn wait_held(
    admin: &kube::Client,
    namespaces: &[String],
    what: &str,
    want: impl Fn(&BTreeMap<String, Option<String>>) -> bool,
) -> BTreeMap<String, Option<String>> {
    wait_until(what, Duration::from_secs(90), || {
        let admin = admin.clone();
        let want = &want;
        async move {
            let held = held_by(&admin, namespaces).await;
            want(&held).then_some(held)
        }
    })
    .await
}

fn count(held: &BTreeMap<String, Option<String>>, pod: &str) -> usize {
    held.values().filter(|h| h.as_deref() == Some(pod)).count()
}

/// A queue on cluster `c` of `ns`, waited Ready.
async fn ready_queue(admin: &kube::Client, ns: &str, name: &str) {
    ready_queue_on(admin, ns, "c", name).await
}

/// A queue on the cluster `cluster` of `ns`, waited Ready.
async fn ready_queue_on(admin: &kube::Client, ns: &str, cluster: &str, name: &str) {
    let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), ns);
    let q: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": name}, "spec": {"clusterRef": {"name": cluster}}
    }))
    .expect("queue json");
    queues
        .create(&Default::default(), &q)
        .await
        .expect("create queue");
    wait_until(
        &format!("ArtemisQueue {ns}/{name} Ready=True"),
        Duration::from_secs(120),
        || {
            let queues = queues.clone();
            async move { queues.get(name).await.ok().filter(ready).map(|_| ()) }
        },
    )
    .await;
}

/// The pod (POD_NAME, the first part of `process_id`) of every process that sent a command for
/// the object, by command.
async fn senders(pool: &sqlx::PgPool, object: &str) -> Vec<String> {
    let rows: Vec<(Option<String>,)> =
        sqlx::query_as("SELECT process_id FROM audit_event WHERE object_name = $1 ORDER BY id")
            .bind(object)
            .fetch_all(pool)
            .await
            .expect("audit rows");
    rows.into_iter()
        .map(|(p,)| {
            p.unwrap_or_default()
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

async fn clusters_held_gauge(http: &reqwest::Client, port: u16) -> f64 {
    sample_sum(&metrics(http, port).await, "artemis_studio_clusters_held")
}

/// Two replicas, four ArtemisClusters (one per namespace): two each, every command sent by its
/// cluster's holder; one SIGKILLed: the other holds all four within the lease duration plus a
/// renewal, and new objects in every namespace become Ready. A third joins: they rebalance
/// (never two writers for one cluster: a cluster moves only once released). SIGTERM of a
/// replica whose Lease is long hands its clusters over in seconds, by release.
#[tokio::test]
async fn four_clusters_on_two_replicas_two_each_a_killed_ones_taken_over_and_a_stopped_ones_handed_over() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let mut namespaces = vec![];
    for _ in 0..4 {
        namespaces.push(bed.fresh_namespace("shard").await);
    }
    let watch = namespaces.join(",");
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let admin = bed.kube_admin().await;
    let instance = format!("sh-{}", short_id());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let http = reqwest::Client::new();
    let (port_a, port_b, port_c) = (free_port(), free_port(), free_port());
    let spawn = |port: u16, pod: &str, timing: &[(&str, &str)]| {
        spawn_with(&bed, &watch, &db, port, &sharded_env(&instance, pod, timing))
    };
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);

    let mut a = spawn(port_a, "shard-a", &SHORT);
    let mut b: OperatorProcess = spawn(port_b, "shard-b", &LONG);
    wait_ready(&http, port_a).await;
    wait_ready(&http, port_b).await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    for ns in &namespaces {
        create_cluster(&admin, ns, "c", &urls, Some(bed.broker_user())).await;
    }
    for ns in &namespaces {
        wait_cluster_condition(&admin, ns, "c", "Ready", "True").await;
    }
    let held = wait_held(&admin, &namespaces, "two clusters held by each replica", |h| {
        count(h, "shard-a") == 2 && count(h, "shard-b") == 2
    })
    .await;
    for ns in &namespaces {
        ready_queue(&admin, ns, &format!("sh.{id}.{ns}")).await;
    }
    let pool = sqlx::PgPool::connect(&db).await.expect("audit database");
    for ns in &namespaces {
        let holder = held[ns].clone().expect("held");
        let sent = senders(&pool, &format!("sh.{id}.{ns}")).await;
        assert!(
            !sent.is_empty() && sent.iter().all(|p| *p == holder),
            "{ns}: commands by {sent:?}, held by {holder}"
        );
    }
    assert_eq!(clusters_held_gauge(&http, port_a).await, 2.0);
    assert_eq!(clusters_held_gauge(&http, port_b).await, 2.0);

    // SIGKILL A (short lease): B holds all four within the lease duration and a renewal.
    a.0.kill().expect("SIGKILL");
    let _ = a.0.wait();
    wait_held(&admin, &namespaces, "all four held by shard-b", |h| {
        count(h, "shard-b") == 4
    })
    .await;
    for ns in &namespaces {
        let name = format!("sh.{id}.after.{ns}");
        ready_queue(&admin, ns, &name).await;
        assert_eq!(senders(&pool, &name).await, vec!["shard-b".to_string()], "{ns}");
    }

    // C joins: two each again. B recorded a long lease (600 s): C can have B's clusters only by
    // B's release, never by expiry.
    let _c = spawn(port_c, "shard-c", &SHORT);
    wait_ready(&http, port_c).await;
    wait_held(
        &admin,
        &namespaces,
        "rebalanced: two each on shard-b and shard-c",
        |h| count(h, "shard-b") == 2 && count(h, "shard-c") == 2,
    )
    .await;
    // SIGTERM B: its clusters are released once idle, C takes them, B exits 0.
    signal(&b, "-TERM");
    let exit = wait_exit(&mut b).await;
    assert!(exit.success(), "a replica stopped by SIGTERM exits 0: {exit:?}");
    wait_held(&admin, &namespaces, "all four held by shard-c", |h| {
        count(h, "shard-c") == 4
    })
    .await;
    for ns in &namespaces {
        let name = format!("sh.{id}.last.{ns}");
        ready_queue(&admin, ns, &name).await;
        assert_eq!(senders(&pool, &name).await, vec!["shard-c".to_string()], "{ns}");
    }
    // Every command of the test has its outcome: none pending.
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE outcome = 'pending'")
        .fetch_one(&pool)
        .await
        .expect("count pending");
    assert_eq!(pending, 0);

    // The shared brokers' queues go with their objects (C acts for every cluster).
    for ns in &namespaces {
        let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), ns);
        let _ = queues
            .delete_collection(&Default::default(), &Default::default())
            .await;
    }
    for ns in &namespaces {
        let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), ns);
        wait_until(
            &format!("the queues of {ns} deleted"),
            Duration::from_secs(120),
            || {
                let queues = queues.clone();
                async move {
                    queues
                        .list(&Default::default())
                        .await
                        .ok()
                        .filter(|l| l.items.is_empty())
                        .map(|_| ())
                }
            },
        )
        .await;
    }
    delete_leases_of(&leases, &instance).await;
}

/// SIGKILL of a holder inside a command (one node written, the outcome not recorded): another
/// replica takes the cluster over once the holder's Lease expired, and finishes the command
/// without a second write (the nodes that have the queue are not written again).
#[tokio::test]
async fn a_holder_killed_mid_fan_out_is_finished_by_the_next_holder_without_a_second_write() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("shardfan").await;
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let admin = bed.kube_admin().await;
    let instance = format!("sf-{}", short_id());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let http = reqwest::Client::new();
    let marker = std::env::temp_dir().join(format!("shardfan-{}", short_id()));
    let (port_a, port_b) = (free_port(), free_port());
    let mut env_a = sharded_env(&instance, "shardfan-a", &SHORT);
    env_a.push((
        "ARTEMIS_STUDIO_TEST_PAUSE_MID_FANOUT".into(),
        marker.display().to_string(),
    ));
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);
    // A alone: it holds the one cluster.
    let mut a = spawn_with(&bed, &ns, &db, port_a, &env_a);
    wait_ready(&http, port_a).await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let name = format!("shardfan.{id}");
    let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), &ns);
    create_queue_on_c(&queues, &name).await;
    wait_until("the holder in the crash window", Duration::from_secs(120), || {
        let marker = marker.clone();
        async move { std::fs::read_to_string(&marker).ok() }
    })
    .await;
    // B joins while A is inside the command: the cluster may be assigned to B, but A does not
    // release it with a reconcile in flight, and B never takes a Lease A renews.
    let _b_proc = spawn_with(
        &bed,
        &ns,
        &db,
        port_b,
        &sharded_env(&instance, "shardfan-b", &SHORT),
    );
    wait_ready(&http, port_b).await;
    a.0.kill().expect("SIGKILL");
    let _ = a.0.wait();
    wait_held(
        &admin,
        std::slice::from_ref(&ns),
        "the cluster held by shardfan-b",
        |h| count(h, "shardfan-b") == 1,
    )
    .await;
    wait_until(
        &format!("ArtemisQueue {name} Ready=True"),
        Duration::from_secs(120),
        || {
            let (queues, name) = (queues.clone(), name.clone());
            async move { queues.get(&name).await.ok().filter(ready).map(|_| ()) }
        },
    )
    .await;
    let pool = sqlx::PgPool::connect(&db).await.expect("audit database");
    let rows: Vec<(String, Option<serde_json::Value>, Option<String>)> =
        wait_until("the dead holder's command recorded as unknown", Duration::from_secs(90), || {
            let (pool, name) = (pool.clone(), name.clone());
            async move {
                let rows: Vec<(String, Option<serde_json::Value>, Option<String>)> = sqlx::query_as(
                    "SELECT outcome, outcome_detail, process_id FROM audit_event WHERE object_name = $1 ORDER BY id",
                )
                .bind(&name)
                .fetch_all(&pool)
                .await
                .ok()?;
                rows.iter().all(|r| r.0 != "pending").then_some(rows)
            }
        })
        .await;
    assert_eq!(
        rows.len(),
        2,
        "the dead holder's command and the next holder's: {rows:?}"
    );
    assert_eq!(rows[0].0, "unknown", "{rows:?}");
    assert!(
        rows[0]
            .2
            .as_deref()
            .unwrap_or_default()
            .starts_with("shardfan-a/"),
        "{rows:?}"
    );
    assert_eq!(rows[1].0, "succeeded", "{rows:?}");
    assert!(
        rows[1]
            .2
            .as_deref()
            .unwrap_or_default()
            .starts_with("shardfan-b/"),
        "{rows:?}"
    );
    let applied = rows[1]
        .1
        .as_ref()
        .and_then(|d| d["appliedNodes"].as_array().cloned())
        .unwrap_or_default();
    assert_eq!(
        applied.len(),
        2,
        "two nodes lacked the queue, and only they were written: {rows:?}"
    );
    let _ = queues.delete(&name, &Default::default()).await;
    wait_until(
        &format!("ArtemisQueue {name} deleted"),
        Duration::from_secs(120),
        || {
            let (queues, name) = (queues.clone(), name.clone());
            async move {
                queues
                    .get_opt(&name)
                    .await
                    .ok()
                    .filter(Option::is_none)
                    .map(|_| ())
            }
        },
    )
    .await;
    let _ = std::fs::remove_file(&marker);
    delete_leases_of(&leases, &instance).await;
}

/// Three replicas, three ArtemisClusters (`c`; `ha`, the replicated pair and its third node; and
/// another namespace's cluster over `c`'s brokers): one each, and every command sent by its
/// cluster's holder. (A cluster naming a subset of `c`'s nodes is not used: its queues' deletes
/// wait, rightly, for the nodes it sees but cannot reach.)
#[tokio::test]
async fn three_clusters_on_three_replicas_one_each_every_command_by_its_holder() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let (ns1, ns2) = (
        bed.fresh_namespace("shard3").await,
        bed.fresh_namespace("shard3").await,
    );
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let admin = bed.kube_admin().await;
    let instance = format!("s3-{}", short_id());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let http = reqwest::Client::new();
    let watch = format!("{ns1},{ns2}");
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);
    let pods = ["shard3-a", "shard3-b", "shard3-c"];
    let mut procs = vec![];
    for pod in pods {
        let port = free_port();
        procs.push(spawn_with(
            &bed,
            &watch,
            &db,
            port,
            &sharded_env(&instance, pod, &SHORT),
        ));
        wait_ready(&http, port).await;
    }
    let urls = |cluster: &str| -> Vec<String> {
        bed.cluster_brokers(cluster)
            .into_iter()
            .map(|b| b.jolokia)
            .collect()
    };
    let clusters = [
        (ns1.clone(), "c", urls("c")),
        (ns1.clone(), "ha", urls("ha")),
        (ns2.clone(), "c", urls("c")),
    ];
    for (ns, name, urls) in &clusters {
        create_cluster(&admin, ns, name, urls, Some(bed.broker_user())).await;
    }
    for (ns, name, _) in &clusters {
        wait_cluster_condition(&admin, ns, name, "Ready", "True").await;
    }
    let keys: Vec<String> = clusters
        .iter()
        .map(|(ns, name, _)| format!("{ns}/{name}"))
        .collect();
    let held = wait_held(&admin, &keys, "one cluster held by each replica", |h| {
        pods.iter().all(|p| count(h, p) == 1)
    })
    .await;
    let pool = sqlx::PgPool::connect(&db).await.expect("audit database");
    for (ns, name, _) in &clusters {
        let queue = format!("sh3.{id}.{ns}.{name}");
        ready_queue_on(&admin, ns, name, &queue).await;
        let holder = held[&format!("{ns}/{name}")].clone().expect("held");
        let sent = senders(&pool, &queue).await;
        assert!(
            !sent.is_empty() && sent.iter().all(|p| *p == holder),
            "{ns}/{name}: commands by {sent:?}, held by {holder}"
        );
    }
    for ns in [&ns1, &ns2] {
        let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), ns);
        let _ = queues
            .delete_collection(&Default::default(), &Default::default())
            .await;
        wait_until(
            &format!("the queues of {ns} deleted"),
            Duration::from_secs(120),
            || {
                let queues = queues.clone();
                async move {
                    queues
                        .list(&Default::default())
                        .await
                        .ok()
                        .filter(|l| l.items.is_empty())
                        .map(|_| ())
                }
            },
        )
        .await;
    }
    drop(procs);
    delete_leases_of(&leases, &instance).await;
}
