//! Issue 11: no write loops, and errors that reach the object. Counted on the real test bed:
//! audit rows and the operator's own passes, never time.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use artemis_studio_operator::api::queue::ArtemisQueue;
use artemis_studio_operator::api::{Outcome, RefusalKind};

use crate::queue::{Fixture, condition, fixture, ready};
use crate::support::{brokers_shared, short_id, wait_until};

/// Audit rows of one object's commands, oldest first.
async fn rows_of(f: &Fixture, object: &str) -> Vec<(String, String)> {
    sqlx::query_as("SELECT command, outcome FROM audit_event WHERE object_name = $1 ORDER BY id")
        .bind(object)
        .fetch_all(f.op.store.pool())
        .await
        .expect("audit rows")
}

/// Positive evidence that the cluster was polled `n` more times (each poll triggers the objects
/// whose broker objects changed).
async fn polls(f: &Fixture, n: u64) {
    let start = f.op.ctx.metrics.reconciles_of("ArtemisCluster");
    wait_until(
        &format!("{n} more cluster polls"),
        Duration::from_secs(90),
        || async move { (f.op.ctx.metrics.reconciles_of("ArtemisCluster") >= start + n).then_some(()) },
    )
    .await;
}

async fn poll_fast(f: &Fixture) {
    let clusters: Api<artemis_studio_operator::api::ArtemisCluster> = Api::namespaced(f.admin.clone(), &f.ns);
    clusters
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pollIntervalSeconds": 2}})),
        )
        .await
        .expect("poll interval");
}

/// A field Artemis's `updateQueue` does not apply (autoDelete): one write, verified, FAILED as
/// NOT_CONVERGING naming the field, a NotConverging condition — and never sent again while the
/// spec stays, however many polls pass. Without the verify-and-hold rule this wrote a
/// `queue.repair` several times a second.
#[tokio::test]
async fn a_field_the_broker_ignores_is_written_once_then_named() {
    let _b = brokers_shared().await;
    let f = fixture("l-auto", None).await;
    poll_fast(&f).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("auto.{id}");
    f.create(&name, json!({"routingType": "ANYCAST"})).await;
    f.wait_for(&name, "Ready", ready).await;
    assert_eq!(rows_of(&f, &name).await.len(), 1, "the create");
    // Ask for a change the broker accepts and ignores.
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoDelete": true}})),
        )
        .await
        .expect("set autoDelete");
    let q = f
        .wait_for(&name, "NotConverging", |q: &ArtemisQueue| {
            condition(q, "NotConverging").is_some_and(|c| c.0 == "True")
        })
        .await;
    let status = q.status.expect("status");
    let stuck: Vec<_> = status
        .nodes
        .iter()
        .filter(|n| n.refusal == Some(RefusalKind::NotConverging))
        .collect();
    let live = f.topology().await.live_nodes().count();
    assert_eq!(stuck.len(), live, "{:#?}", status.nodes);
    for n in stuck {
        assert_eq!(n.outcome, Outcome::Failed);
        assert_eq!(n.detail, vec!["auto-delete".to_string()], "{n:?}");
    }
    let (_, reason, message) =
        condition(&f.queues().get(&name).await.expect("get"), "NotConverging").expect("condition");
    assert_eq!(reason, "BrokerDidNotApply");
    assert!(message.contains("auto-delete"), "{message}");
    // Only a person can act: kstatus says Stalled (issue 22 item 8).
    let stalled = condition(&f.queues().get(&name).await.expect("get"), "Stalled").expect("Stalled");
    assert_eq!(
        (stalled.0.as_str(), stalled.1.as_str()),
        ("True", "BrokerDidNotApply")
    );
    // … and /metrics counts it, as the NotConverging and Stalled alerts read it (issue 26).
    let flagged = |condition: &str| {
        format!(
            r#"artemis_studio_objects_condition_true{{kind="ArtemisQueue",cluster="{}/c",condition="{condition}",reason="BrokerDidNotApply"}} 1"#,
            f.ns
        )
    };
    wait_for_metrics(
        &f,
        "the census counts the queue NotConverging and Stalled",
        |text| text.contains(&flagged("NotConverging")) && text.contains(&flagged("Stalled")),
    )
    .await;
    // Every live node's endpoint is mapped to the cluster (the Jolokia panels' node list).
    let endpoint_of_c = format!(r#"artemis_studio_cluster_endpoints{{cluster="{}/c","#, f.ns);
    let text = f.op.ctx.metrics.encode_text();
    let active = text
        .lines()
        .filter(|l| l.starts_with(&endpoint_of_c) && l.contains(r#"role="active""#))
        .count();
    assert_eq!(active, live, "{text}");
    // Several polls later (each a chance to loop): still one write for the change.
    polls(&f, 4).await;
    let rows = rows_of(&f, &name).await;
    assert_eq!(rows.len(), 2, "the create and one write for the change: {rows:?}");
    assert_eq!(rows[1].0, "queue.apply");
    assert_ne!(rows[1].1, "succeeded", "{rows:?}");
    // Changing the spec back converges without a write (the broker never changed).
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoDelete": false}})),
        )
        .await
        .expect("unset autoDelete");
    f.wait_for(&name, "Ready again", |q| {
        ready(q) && condition(q, "NotConverging").is_some_and(|c| c.0 == "False")
    })
    .await;
    assert_eq!(
        rows_of(&f, &name).await.len(),
        2,
        "no write for a spec the broker already has"
    );
    let ready_line = format!(
        r#"artemis_studio_objects{{kind="ArtemisQueue",cluster="{}/c",ready="True""#,
        f.ns
    );
    wait_for_metrics(
        &f,
        "the census counts the queue Ready and flags nothing",
        |text| text.contains(&ready_line) && !text.contains(&format!(r#"cluster="{}/c",condition="#, f.ns)),
    )
    .await;
}

/// Wait until this operator's /metrics text satisfies `ok` (the census follows the watch,
/// which may deliver a status a moment after the API server answered with it).
async fn wait_for_metrics(f: &Fixture, what: &str, ok: impl Fn(&str) -> bool) {
    wait_until(what, Duration::from_secs(30), || {
        let text = f.op.ctx.metrics.encode_text();
        let done = ok(&text);
        async move { done.then_some(()) }
    })
    .await;
}

/// The audit store down: no broker write without its audit row, and the object says why
/// (condition reason and Event), as do the operator's metrics.
#[tokio::test]
async fn an_unavailable_audit_store_shows_on_the_object_and_writes_nothing() {
    use sqlx::Connection;
    let _b = brokers_shared().await;
    let f = fixture("l-store", None).await;
    let (db,): (String,) = sqlx::query_as("SELECT current_database()")
        .fetch_one(f.op.store.pool())
        .await
        .expect("database name");
    // Postgres stops serving the operator's database (its sessions end, no new one is let in).
    let mut admin = sqlx::PgConnection::connect(&f.bed.database_url())
        .await
        .expect("admin connection");
    sqlx::query(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false"))
        .execute(&mut admin)
        .await
        .expect("refuse connections");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&db)
        .execute(&mut admin)
        .await
        .expect("end sessions");
    let id = short_id();
    f.clean.also(&id);
    let name = format!("nostore.{id}");
    f.create(&name, json!({})).await;
    let q = f
        .wait_for(&name, "Ready=False AuditStoreUnavailable", |q| {
            condition(q, "Ready").is_some_and(|c| c.0 == "False" && c.1 == "AuditStoreUnavailable")
        })
        .await;
    let message = condition(&q, "Ready").map(|c| c.2).unwrap_or_default();
    assert!(message.contains("store"), "{message}");
    // Nothing reached a broker without its audit row.
    for n in f.topology().await.nodes {
        let inv = n.inventory.expect("inventory");
        assert!(
            !inv.queues.contains_key(&name),
            "{} got the queue unaudited",
            n.node_id
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(f.admin.clone(), &f.ns);
    let found = wait_until(
        "a Warning Event AuditStoreUnavailable",
        Duration::from_secs(60),
        || {
            let events = events.clone();
            let name = name.clone();
            async move {
                events
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|e| {
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                            && e.reason.as_deref() == Some("AuditStoreUnavailable")
                    })
            }
        },
    )
    .await;
    assert_eq!(found.type_.as_deref(), Some("Warning"));
    let text = f.op.ctx.metrics.encode_text();
    let failed = format!(
        r#"artemis_studio_reconciles_total{{kind="ArtemisQueue",cluster="{}/c",result="AuditStoreUnavailable"}}"#,
        f.ns
    );
    assert!(text.lines().any(|l| l.starts_with(&failed)), "{text}");
    // The store back: the queue is created, audited.
    sqlx::query(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS true"))
        .execute(&mut admin)
        .await
        .expect("allow connections");
    f.wait_for(&name, "Ready", ready).await;
    assert_eq!(rows_of(&f, &name).await.len(), 1);
}
