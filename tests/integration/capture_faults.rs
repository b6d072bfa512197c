//! Capture under faults (issue 25): copies Postgres cannot take as they are never stop a drain,
//! every AMQP body kind is stored faithfully, and a tap's health is truthful while Postgres is
//! away. Real brokers, a real AMQP producer, real Postgres.

use kube::api::DeleteParams;
use serde_json::json;

use artemis_studio_operator::api::capture::TapState;
use fe2o3_amqp::types::messaging::{
    AmqpValue, ApplicationProperties, Body, Data, Message, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, Value};

use crate::capture::{broker_queue, taps_in};
use crate::queue::fixture;
use crate::support::{TestBed, brokers_shared, short_id};

/// Send each message (one AMQP connection, in order) to an address on one broker; every one
/// must be accepted.
async fn amqp_send_messages(bed: &TestBed, broker: &str, address: &str, messages: Vec<Message<Body<Value>>>) {
    let mut producer = crate::support::amqp_producer(bed, broker, address, &short_id())
        .await
        .expect("AMQP producer");
    let sender = &mut producer.sender;
    for (i, m) in messages.into_iter().enumerate() {
        match sender.send(m).await {
            Ok(Outcome::Accepted(_)) => {}
            other => panic!("message {i} not accepted: {other:?}"),
        }
    }
    producer.close().await;
}

fn with_id(id: &str, body: Body<Value>) -> Message<Body<Value>> {
    Message::builder()
        .properties(Properties::builder().message_id(id.to_string()).build())
        .body(body)
        .build()
}

/// One stored copy, by its AMQP message ID.
#[derive(Debug, sqlx::FromRow)]
struct Stored {
    message_id: Option<String>,
    body_kind: Option<String>,
    body_text: Option<String>,
    body_binary: Option<Vec<u8>>,
    properties: serde_json::Value,
    escaped: Option<Vec<String>>,
}

#[tokio::test]
async fn copies_postgres_cannot_take_as_they_are_never_stop_the_drain_and_every_body_kind_is_stored_faithfully()
 {
    let _shared = brokers_shared().await;
    let f = fixture("cap-poison", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.poison");
    broker_queue(&f.bed, &address).await;
    f.subscribe("poison", json!({"queues": address})).await;
    f.wait_subscription("poison", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    let bytes: Vec<u8> = vec![255, 254, 0, 128, 1, 2, 3];
    let mut messages = vec![
        // A text body with U+0000 (Postgres refuses it in TEXT: SQLSTATE 22021).
        with_id(
            "nul-text",
            Body::Value(AmqpValue(Value::String("before\0after".into()))),
        ),
        // A string property with U+0000 (refused in JSONB: 22P05).
        Message::builder()
            .properties(
                Properties::builder()
                    .message_id("nul-property".to_string())
                    .build(),
            )
            .application_properties(ApplicationProperties::builder().insert("note", "x\0y").build())
            .body(Body::Value(AmqpValue(Value::String("property".into()))))
            .build(),
        // qpid-proton's default for bytes: an amqp-value binary.
        with_id(
            "value-binary",
            Body::Value(AmqpValue(Value::Binary(Binary::from(bytes.clone())))),
        ),
        with_id(
            "sequence",
            Body::Sequence(vec![vec![Value::Int(1), Value::String("two".into())].into()].into()),
        ),
        // fe2o3-amqp sends "no body" as an amqp-value null (a body with no section at all is
        // covered by the unit tests of `capture::row`); and an empty data section.
        with_id("empty", Body::Empty),
        with_id("empty-data", Body::Data(vec![Data(Binary::from(vec![]))].into())),
    ];
    for i in 0..5 {
        messages.push(with_id(
            &format!("after-{i}"),
            Body::Value(AmqpValue(Value::String(format!("after {i}")))),
        ));
    }
    amqp_send_messages(&f.bed, "c1", &address, messages).await;

    // Everything is stored: the faulty copies (escaped or kept as bytes, and flagged) and the
    // ordinary ones behind them on the same tap.
    let pool = f.op.store.pool().clone();
    let rows: Vec<Stored> =
        crate::support::wait_until("11 rows stored", std::time::Duration::from_secs(60), || {
            let pool = pool.clone();
            async move {
                let rows: Vec<Stored> = sqlx::query_as(
                    "SELECT message_id, body_kind, body_text, body_binary, properties, escaped \
                     FROM captured_message WHERE subscription = 'poison' ORDER BY message_id",
                )
                .fetch_all(&pool)
                .await
                .ok()?;
                (rows.len() >= 11).then_some(rows)
            }
        })
        .await;
    assert_eq!(rows.len(), 11, "{rows:?}");
    let by_id = |id: &str| {
        rows.iter()
            .find(|r| r.message_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no row {id}: {rows:?}"))
    };
    let nul_text = by_id("nul-text");
    assert_eq!(
        nul_text.body_binary.as_deref(),
        Some(&b"before\0after"[..]),
        "kept exactly"
    );
    assert!(
        nul_text
            .escaped
            .as_ref()
            .is_some_and(|e| e.iter().any(|n| n.starts_with("body:"))),
        "{nul_text:?}"
    );
    let nul_property = by_id("nul-property");
    assert_eq!(nul_property.properties["note"], "x\\u0000y");
    assert_eq!(nul_property.body_text.as_deref(), Some("property"));
    assert!(
        nul_property
            .escaped
            .as_ref()
            .is_some_and(|e| e.iter().any(|n| n.starts_with("properties.note"))),
        "{nul_property:?}"
    );
    let binary = by_id("value-binary");
    assert_eq!(
        binary.body_binary.as_deref(),
        Some(&bytes[..]),
        "binary as binary: {binary:?}"
    );
    assert_eq!(
        (binary.body_kind.as_deref(), binary.body_text.as_deref()),
        (Some("amqp-value"), None)
    );
    let sequence = by_id("sequence");
    assert_eq!(sequence.body_kind.as_deref(), Some("amqp-sequence"));
    assert_eq!(sequence.body_text.as_deref(), Some(r#"[[1,"two"]]"#));
    let empty = by_id("empty");
    assert_eq!(
        (empty.body_kind.as_deref(), &empty.body_text, &empty.body_binary),
        (Some("amqp-value"), &None, &None),
        "a null amqp-value: no body"
    );
    let empty_data = by_id("empty-data");
    assert_eq!(
        (empty_data.body_kind.as_deref(), empty_data.body_binary.as_deref()),
        (Some("data"), Some(&[][..]))
    );
    for i in 0..5 {
        let r = by_id(&format!("after-{i}"));
        assert_eq!(r.body_text.as_deref(), Some(format!("after {i}").as_str()));
        assert_eq!(r.escaped, None, "stored as received");
    }
    // Nothing was counted lost: every copy was stored.
    let lost: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(messages), 0)::bigint FROM capture_loss WHERE subscription = 'poison'",
    )
    .fetch_one(f.op.store.pool())
    .await
    .expect("loss");
    assert_eq!(lost, 0);
    f.subscriptions()
        .delete("poison", &DeleteParams::default())
        .await
        .expect("delete");
}

fn every_tap(s: &artemis_studio_operator::api::capture::ArtemisCaptureSubscription, state: TapState) -> bool {
    s.status
        .as_ref()
        .is_some_and(|st| !st.taps.is_empty() && st.taps.iter().all(|t| t.state == state))
}

fn ready(s: &artemis_studio_operator::api::capture::ArtemisCaptureSubscription) -> Option<String> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

/// Issue 25 item 4: no pass can run without Postgres, and status said HEALTHY throughout an
/// outage. Now the taps are DEGRADED (Ready=False) within two passes of Postgres stopping,
/// written while it is still down, and HEALTHY again once it is back.
#[tokio::test]
async fn postgres_stopped_makes_every_tap_degraded_within_two_passes_and_healthy_again_after() {
    let _shared = brokers_shared().await;
    // This operator keeps its data in a Postgres server of its own, which the test stops (it
    // outlives the operator).
    let pg;
    let mut f = fixture("cap-pgstatus", None).await;
    pg = f.bed.scratch_postgres(&format!("pgstatus-{}", short_id()));
    f.restart_operator_on(&pg.url).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.pgstatus");
    broker_queue(&f.bed, &address).await;
    f.subscribe("status", json!({"queues": address})).await;
    f.wait_subscription("status", "3 taps drained, Ready", |s| {
        taps_in(s, TapState::Healthy) == 3 && ready(s).as_deref() == Some("True")
    })
    .await;

    pg.stop();
    let stopped = std::time::Instant::now();
    // Two passes' time, plus what it takes to notice a lost session and write the status.
    let two_passes = f.op.ctx.capture_pass_interval * 2 + std::time::Duration::from_secs(4);
    let api = f.subscriptions();
    let degraded = crate::support::wait_until(
        "every tap DEGRADED and Ready=False while Postgres is down",
        two_passes,
        || {
            let api = api.clone();
            async move {
                let s = api.get("status").await.ok()?;
                (every_tap(&s, TapState::Degraded) && ready(&s).as_deref() == Some("False")).then_some(s)
            }
        },
    )
    .await;
    let taps = degraded.status.map(|s| s.taps).unwrap_or_default();
    eprintln!(
        "DEGRADED {:?} after Postgres stopped: {:?}",
        stopped.elapsed(),
        taps.first()
    );
    assert!(
        taps.iter().all(|t| t
            .message
            .as_deref()
            .is_some_and(|m| m.contains("Postgres") || m.contains("database"))),
        "each tap says why: {taps:?}"
    );

    pg.start();
    f.wait_subscription(
        "status",
        "3 taps HEALTHY and Ready again after Postgres returned",
        |s| {
            every_tap(s, TapState::Healthy)
                && taps_in(s, TapState::Healthy) == 3
                && ready(s).as_deref() == Some("True")
        },
    )
    .await;
    // And it captures again.
    crate::support::send_messages(&f.bed, "c1", &address, 3).await;
    f.wait_rows("status", 3).await;
    f.subscriptions()
        .delete("status", &DeleteParams::default())
        .await
        .expect("delete");
}

/// A copy Postgres refuses for a reason the escapes do not foresee — here a text body whose
/// full-text index entry is over Postgres's 1 MiB tsvector limit (SQLSTATE 54000) — is found by
/// splitting its batch, stored once more as bytes (and says so), and the copies around it on the
/// same tap are all stored.
#[tokio::test]
async fn a_copy_postgres_refuses_for_its_size_is_found_by_splitting_and_kept_as_bytes() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-limit", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.limit");
    broker_queue(&f.bed, &address).await;
    f.subscribe("limit", json!({"queues": address, "maxBodyBytes": 4_194_304}))
        .await;
    f.wait_subscription("limit", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    // 200,000 distinct words: about 1.3 MB of lexemes, over the tsvector limit.
    let huge: String = (0..200_000).map(|i| format!("w{i} ")).collect();
    let text = |id: &str, body: String| with_id(id, Body::Value(AmqpValue(Value::String(body))));
    let mut messages: Vec<Message<Body<Value>>> = (0..3)
        .map(|i| text(&format!("before-{i}"), format!("before {i}")))
        .collect();
    messages.push(text("huge", huge.clone()));
    messages.extend((0..3).map(|i| text(&format!("after-{i}"), format!("after {i}"))));
    amqp_send_messages(&f.bed, "c1", &address, messages).await;

    let pool = f.op.store.pool().clone();
    let rows: Vec<Stored> =
        crate::support::wait_until("7 rows stored", std::time::Duration::from_secs(90), || {
            let pool = pool.clone();
            async move {
                let rows: Vec<Stored> = sqlx::query_as(
                    "SELECT message_id, body_kind, body_text, body_binary, properties, escaped \
                 FROM captured_message WHERE subscription = 'limit' ORDER BY message_id",
                )
                .fetch_all(&pool)
                .await
                .ok()?;
                (rows.len() >= 7).then_some(rows)
            }
        })
        .await;
    assert_eq!(rows.len(), 7);
    let big = rows
        .iter()
        .find(|r| r.message_id.as_deref() == Some("huge"))
        .expect("the huge copy is stored");
    assert_eq!(big.body_text, None);
    assert_eq!(
        big.body_binary.as_deref(),
        Some(huge.as_bytes()),
        "kept exactly, as bytes"
    );
    assert!(
        big.escaped
            .as_ref()
            .and_then(|e| e.first())
            .is_some_and(|n| n.contains("SQLSTATE 54000")),
        "it says why: {:?}",
        big.escaped
    );
    for r in rows.iter().filter(|r| r.message_id.as_deref() != Some("huge")) {
        assert!(r.body_text.is_some() && r.escaped.is_none(), "{r:?}");
    }
    f.subscriptions()
        .delete("limit", &DeleteParams::default())
        .await
        .expect("delete");
}
