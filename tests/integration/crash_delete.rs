//! Issue 22 item 5: a SIGKILL inside a queue delete's fan-out (one node done, the others held):
//! the process that comes next finishes the delete, leaves no divert forwarding into an address
//! with no queue (ADR-0084), and completes the killed command's audit row as `unknown`, naming
//! the command that followed it. No row stays `pending`.

use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use artemis_studio_operator::api::divert::ArtemisDivert;
use artemis_studio_operator::api::queue::ArtemisQueue;

use crate::leader::free_port;
use crate::support::{
    TestBed, brokers_shared, create_cluster, send_messages, short_id, wait_cluster_condition, wait_ready,
    wait_until,
};

fn is_ready(status: Option<&Vec<artemis_studio_operator::api::Condition>>) -> bool {
    status.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn audit(db: &str) -> Vec<(i64, String, String, Option<serde_json::Value>)> {
    let pool = sqlx::PgPool::connect(db).await.expect("audit database");
    sqlx::query_as("SELECT id, command, outcome, outcome_detail FROM audit_event WHERE command = 'queue.delete' ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("audit rows")
}

/// A namespace with cluster `c`, a fresh audit database, a target queue with messages, a source
/// queue and a declared divert into the target, converged by an operator process that then went
/// away; and the delete of the target, SIGKILLed in a crash window.
struct Scene {
    bed: TestBed,
    ns: String,
    db: String,
    id: String,
    target: String,
    queues: Api<ArtemisQueue>,
    diverts: Api<ArtemisDivert>,
    /// Last: the operator processes have stopped when it sweeps.
    _clean: crate::support::CleanUp,
}

impl Scene {
    async fn new(prefix: &str) -> Scene {
        let bed = TestBed::get();
        let ns = bed.fresh_namespace(prefix).await;
        bed.install_operator_rbac().await;
        let db = bed.fresh_database().await;
        let admin = bed.kube_admin().await;
        let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
        create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
        let id = short_id();
        // Before every operator process below, so none runs when it sweeps.
        let _clean = bed.clean_up(&[&id]);
        let (target, source) = (format!("{prefix}.tgt.{id}"), format!("{prefix}.src.{id}"));
        let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), &ns);
        let diverts: Api<ArtemisDivert> = Api::namespaced(admin.clone(), &ns);
        converged_by_a_first_process(&bed, &ns, &db, &admin, &queues, &diverts, &target, &source).await;
        Scene {
            bed,
            ns,
            db,
            id,
            target,
            queues,
            diverts,
            _clean,
        }
    }

    /// Delete the target under an operator process with the crash window `window_env` open;
    /// SIGKILL it once the window's marker is written. Returns the marker's path.
    async fn delete_killed_in(&self, window_env: &str, what: &str) -> std::path::PathBuf {
        let marker = std::env::temp_dir().join(format!("crash-{}", self.id));
        let port = free_port();
        let mut killed = self.bed.spawn_operator(
            &self.ns,
            &self.db,
            port,
            &[(window_env, &marker.display().to_string())],
        );
        wait_ready(&reqwest::Client::new(), port).await;
        self.queues
            .delete("target", &Default::default())
            .await
            .expect("delete");
        wait_until(what, Duration::from_secs(120), || {
            let marker = marker.clone();
            async move { marker.exists().then_some(()) }
        })
        .await;
        killed.0.kill().expect("SIGKILL");
        let _ = killed.0.wait();
        marker
    }

    /// Tidy the shared brokers: the divert and the source queue go through their objects.
    async fn tidy(&self) {
        self.diverts
            .delete("into", &Default::default())
            .await
            .expect("delete divert");
        self.queues
            .delete("source", &Default::default())
            .await
            .expect("delete source");
        wait_until("source gone", Duration::from_secs(90), || {
            let queues = self.queues.clone();
            async move { queues.get_opt("source").await.ok()?.is_none().then_some(()) }
        })
        .await;
    }
}

#[tokio::test]
async fn a_sigkill_inside_a_delete_leaves_no_dangling_divert_and_no_pending_row() {
    let _b = brokers_shared().await;
    let scene = Scene::new("crashdel").await;
    let (bed, ns, db, target) = (
        &scene.bed,
        scene.ns.clone(),
        scene.db.clone(),
        scene.target.clone(),
    );
    let queues = scene.queues.clone();
    // The delete, SIGKILLed inside its fan-out: one node done, the others held.
    let marker = scene
        .delete_killed_in(
            "ARTEMIS_STUDIO_TEST_PAUSE_MID_FANOUT",
            "the first node deleted, the others held",
        )
        .await;
    let rows = audit(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].2, "pending", "killed inside the command: {rows:?}");

    // The next process finishes the delete and completes the killed row.
    let port = free_port();
    let _next = bed.spawn_operator(&ns, &db, port, &[]);
    wait_until("the delete finished", Duration::from_secs(120), || {
        let queues = queues.clone();
        async move { queues.get_opt("target").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let rows = wait_until("no delete row pending", Duration::from_secs(90), || {
        let db = db.clone();
        async move {
            let rows = audit(&db).await;
            rows.iter().all(|r| r.2 != "pending").then_some(rows)
        }
    })
    .await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0].2.as_str(), rows[1].2.as_str()),
        ("unknown", "succeeded"),
        "{rows:?}"
    );
    let followed: Vec<i64> = rows[0]
        .3
        .as_ref()
        .and_then(|d| serde_json::from_value(d["followedBy"].clone()).ok())
        .unwrap_or_default();
    assert_eq!(followed, vec![rows[1].0], "{rows:?}");

    // No node keeps the divert forwarding into the address whose last queue went.
    let t = artemis_studio_operator::topology::poll(&bed.access("c", bed.broker_user()), &Default::default())
        .await;
    for n in &t.nodes {
        let inv = n.inventory.as_ref().expect("inventory");
        assert!(
            !inv.queues.contains_key(&target),
            "{} still has {target}",
            n.node_id
        );
        let dangling: Vec<&String> = inv
            .diverts
            .values()
            .filter(|d| d.forwarding_address == target)
            .map(|d| &d.name)
            .collect();
        assert!(
            dangling.is_empty(),
            "{}: diverts into {target} with no queue: {dangling:?}",
            n.node_id
        );
    }

    scene.tidy().await;
    let _ = std::fs::remove_file(&marker);
}

/// Issue 41 item 3: a SIGKILL on a node between the removal of the queue's dependent divert and
/// the queue's own destroy (the divert gone, the queue still there). The next process must not
/// put the divert back (`divert.apply`/`divert.repair`) while the queue's delete is unfinished:
/// the ArtemisQueue still holds its finalizer, and the resumed delete removes the queue.
#[tokio::test]
async fn a_restart_inside_a_delete_never_repairs_the_divert_the_delete_is_removing() {
    let _b = brokers_shared().await;
    let scene = Scene::new("crashdiv").await;
    let (bed, ns, db, target) = (
        &scene.bed,
        scene.ns.clone(),
        scene.db.clone(),
        scene.target.clone(),
    );
    let (queues, diverts) = (scene.queues.clone(), scene.diverts.clone());
    let marker = scene
        .delete_killed_in(
            "ARTEMIS_STUDIO_TEST_PAUSE_AFTER_DIVERTS_REMOVED",
            "a node's divert removed, its queue not yet",
        )
        .await;
    // The state the restart meets: at least one node holds the queue without its divert.
    let t = artemis_studio_operator::topology::poll(&bed.access("c", bed.broker_user()), &Default::default())
        .await;
    let without_divert = t
        .nodes
        .iter()
        .filter_map(|n| n.inventory.as_ref())
        .filter(|i| {
            i.queues.contains_key(&target) && !i.diverts.values().any(|d| d.forwarding_address == target)
        })
        .count();
    assert!(
        without_divert > 0,
        "the kill landed between the divert's removal and the queue's"
    );
    let pool = sqlx::PgPool::connect(&db).await.expect("audit database");
    let killed_at: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM audit_event")
        .fetch_one(&pool)
        .await
        .expect("last row");

    // The resumed delete is held back by the message cap until the divert has had its pass (so
    // the order is not a race): the object asks for no loss now.
    queues
        .patch(
            "target",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"deletion": {"allowMessageLoss": 0}}})),
        )
        .await
        .expect("no loss allowed for now");
    let port = free_port();
    let _next = bed.spawn_operator(&ns, &db, port, &[]);
    // Positive evidence the divert's pass ran after the restart: it says it waits for the
    // delete, or (the defect) it wrote.
    wait_until(
        "the divert's pass after the restart",
        Duration::from_secs(90),
        || {
            let (diverts, pool) = (diverts.clone(), pool.clone());
            async move {
                let d = diverts.get("into").await.ok()?;
                let held = d
                    .status
                    .as_ref()?
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "HeldByDelete");
                let wrote: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM audit_event WHERE command LIKE 'divert.%' AND id > $1",
                )
                .bind(killed_at)
                .fetch_one(&pool)
                .await
                .ok()?;
                (held || wrote > 0).then_some(())
            }
        },
    )
    .await;
    queues
        .patch(
            "target",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"deletion": {"allowMessageLoss": 2}}})),
        )
        .await
        .expect("the loss allowed again");
    wait_until("the delete finished", Duration::from_secs(120), || {
        let queues = queues.clone();
        async move { queues.get_opt("target").await.ok()?.is_none().then_some(()) }
    })
    .await;
    // A later divert pass: the divert says its forwarding queue is gone.
    wait_until(
        "the divert refused: nothing consumes",
        Duration::from_secs(90),
        || {
            let diverts = diverts.clone();
            async move {
                let d = diverts.get("into").await.ok()?;
                let refused =
                    d.status.as_ref()?.nodes.iter().all(|n| {
                        n.refusal == Some(artemis_studio_operator::api::RefusalKind::NothingConsumes)
                    });
                refused.then_some(())
            }
        },
    )
    .await;
    let divert_writes: Vec<(i64, String)> = sqlx::query_as(
        "SELECT id, command FROM audit_event WHERE command LIKE 'divert.%' AND id > $1 ORDER BY id",
    )
    .bind(killed_at)
    .fetch_all(&pool)
    .await
    .expect("divert rows");
    assert!(
        divert_writes.is_empty(),
        "the restart re-created the divert the delete was removing: {divert_writes:?}"
    );
    // The killed command's row becomes `unknown` once its process missed its heartbeats.
    wait_until("no row pending", Duration::from_secs(90), || {
        let pool = pool.clone();
        async move {
            let pending: i64 =
                sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE outcome = 'pending'")
                    .fetch_one(&pool)
                    .await
                    .ok()?;
            (pending == 0).then_some(())
        }
    })
    .await;

    scene.tidy().await;
    let _ = std::fs::remove_file(&marker);
}

/// State first: a target queue with messages, a source queue, and a declared divert into the
/// target, all converged by an operator process that then goes away.
#[allow(clippy::too_many_arguments)]
async fn converged_by_a_first_process(
    bed: &TestBed,
    ns: &str,
    db: &str,
    admin: &kube::Client,
    queues: &Api<ArtemisQueue>,
    diverts: &Api<ArtemisDivert>,
    target: &str,
    source: &str,
) {
    let port = free_port();
    let _first = bed.spawn_operator(ns, db, port, &[]);
    wait_ready(&reqwest::Client::new(), port).await;
    wait_cluster_condition(admin, ns, "c", "Ready", "True").await;
    for (object, name, routing) in [("target", target, "ANYCAST"), ("source", source, "MULTICAST")] {
        let q: ArtemisQueue = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": object},
            "spec": {"clusterRef": {"name": "c"}, "name": name, "routingType": routing,
                // The delete destroys the target's 2 messages: named, as the cluster's
                // messageLossCap (0) asks.
                "deletion": {"allowMessageLoss": 2}}
        }))
        .expect("queue json");
        queues
            .create(&PostParams::default(), &q)
            .await
            .expect("create queue");
    }
    for object in ["target", "source"] {
        wait_until(&format!("{object} Ready"), Duration::from_secs(90), || {
            let queues = queues.clone();
            async move {
                is_ready(
                    queues
                        .get(object)
                        .await
                        .ok()?
                        .status
                        .as_ref()
                        .map(|s| &s.conditions),
                )
                .then_some(())
            }
        })
        .await;
    }
    let d: ArtemisDivert = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisDivert",
        "metadata": {"name": "into"},
        "spec": {"clusterRef": {"name": "c"}, "name": format!("into.{target}"), "address": source, "forwardingAddress": target}
    }))
    .expect("divert json");
    diverts
        .create(&PostParams::default(), &d)
        .await
        .expect("create divert");
    wait_until("the divert Ready", Duration::from_secs(90), || {
        let diverts = diverts.clone();
        async move {
            is_ready(
                diverts
                    .get("into")
                    .await
                    .ok()?
                    .status
                    .as_ref()
                    .map(|s| &s.conditions),
            )
            .then_some(())
        }
    })
    .await;
    send_messages(bed, "c1", target, 2).await;
}
