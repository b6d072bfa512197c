//! The audit log's group commit (ADR-0049 rows, issue 23): concurrent commands' intents and
//! outcomes share statements and transactions, and each still gets its own row, its own id and
//! its own error. Counted by the transactions that wrote the rows (`xmin`), never timed.

use artemis_studio_operator::api::{NodeOutcome, Outcome};
use artemis_studio_operator::store::{AuditIntent, CommandVerdict, Store, outcome_detail};
use futures::future::join_all;
use serde_json::json;

use crate::support::{TestBed, short_id};

fn intent(tag: &str, n: usize, params: serde_json::Value) -> AuditIntent {
    AuditIntent {
        instance_id: "audit-log-test".into(),
        actor: "tester".into(),
        command: "queue.create".into(),
        cluster: "ns/c".into(),
        target: format!("queue {tag}.{n}"),
        object_kind: "ArtemisQueue".into(),
        object_namespace: "ns".into(),
        object_name: format!("q{n}"),
        object_uid: format!("{tag}-{n}"),
        object_generation: Some(n as i64),
        params,
    }
}

/// The transactions that last wrote this run's rows.
async fn transactions(store: &Store, tag: &str) -> i64 {
    sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM audit_event WHERE object_uid LIKE $1 || '-%'")
        .bind(tag)
        .fetch_one(store.pool())
        .await
        .expect("count transactions")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_share_audit_statements_and_keep_their_own_rows() {
    let bed = TestBed::get();
    let db = bed.fresh_database().await;
    Store::migrate(&db).await.expect("migrate");
    let store = Store::connect(&db)
        .await
        .expect("store")
        .for_process("audit-log-test");
    let tag = short_id();
    const N: usize = 64;
    // One of them carries what Postgres cannot store (U+0000 in jsonb): it alone fails.
    let intents: Vec<AuditIntent> = (0..N)
        .map(|n| {
            let filter = if n == 17 { "a\u{0}b" } else { "kind = 'x'" };
            intent(&tag, n, json!({ "filter": filter }))
        })
        .collect();
    let ids = join_all(intents.iter().map(|i| store.audit_intent(i))).await;

    let refused = ids[17].as_ref().expect_err("a NUL in jsonb is refused");
    assert!(refused.data_refusal().is_some(), "refused as data: {refused}");
    for (n, id) in ids.iter().enumerate().filter(|(n, _)| *n != 17) {
        let id = id.as_ref().unwrap_or_else(|e| panic!("intent {n}: {e}"));
        let (uid, target, generation, pid): (String, String, Option<i64>, Option<String>) = sqlx::query_as(
            "SELECT object_uid, target, object_generation, process_id FROM audit_event WHERE id = $1",
        )
        .bind(id)
        .fetch_one(store.pool())
        .await
        .expect("row");
        assert_eq!(
            (uid, target, generation, pid.as_deref()),
            (
                format!("{tag}-{n}"),
                format!("queue {tag}.{n}"),
                Some(n as i64),
                Some("audit-log-test")
            ),
            "intent {n} got the id of its own row"
        );
    }
    let written = transactions(&store, &tag).await;
    assert!(written <= 8, "{} intents in {written} transactions", N - 1);

    let nodes = vec![NodeOutcome {
        node: "n1".into(),
        endpoint: None,
        outcome: Outcome::Applied,
        refusal: None,
        message: "created".into(),
        detail: vec![],
        last_command: None,
    }];
    let ok: Vec<i64> = ids.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
    let detail = outcome_detail(&nodes);
    let done = join_all(
        ok.iter()
            .map(|id| store.audit_outcome(*id, CommandVerdict::Succeeded, &detail)),
    )
    .await;
    assert!(done.iter().all(|r| r.is_ok()), "{done:?}");
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_event WHERE object_uid LIKE $1 || '-%' AND outcome <> 'succeeded'",
    )
    .bind(&tag)
    .fetch_one(store.pool())
    .await
    .expect("count");
    assert_eq!(pending, 0, "every outcome written");
    let written = transactions(&store, &tag).await;
    assert!(written <= 8, "{} outcomes in {written} transactions", N - 1);
}
