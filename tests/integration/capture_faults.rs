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

/// One sample's value in a `/metrics` text: the line that starts with `series` (its name and
/// labels as encoded).
#[cfg(feature = "test-hooks")]
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The deaths in a row a tap's message states (`…, N deaths in a row; restarts at …`).
#[cfg(feature = "test-hooks")]
fn deaths_in_a_row(message: &str) -> u32 {
    message
        .split_once(" deaths in a row")
        .and_then(|(before, _)| before.rsplit(' ').next()?.parse().ok())
        .unwrap_or(1)
}

/// Issue 42: a drain task that died was never restarted (`converge_drains` skipped any key with
/// a handle). Now: an operator process whose drains panic (the `ARTEMIS_STUDIO_TEST_DRAIN_DIES`
/// hook, while its file exists) restarts them at the next passes with a growing backoff, counts
/// every death in `capture_drain_restarts_total` (0 before the first), and its taps say the
/// drain died and when it restarts; once the fault is gone they are drained again and capture
/// works. Drains stopped on purpose (the taps swept) are not counted.
#[cfg(feature = "test-hooks")]
#[tokio::test]
async fn a_drain_that_dies_is_restarted_with_a_backoff_counted_and_shown_in_status_while_it_is_down() {
    use std::time::Duration;

    use crate::support::{metrics, wait_ready, wait_until};

    let _shared = brokers_shared().await;
    let f = fixture("cap-supervise", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.supervise");
    broker_queue(&f.bed, &address).await;
    f.subscribe("orders", json!({"queues": address})).await;
    f.wait_subscription("orders", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;

    // The same installation, now as a process whose drains die while the file exists.
    f.op.stop();
    let dies = std::env::temp_dir().join(format!("drain-dies-{id}"));
    let port = crate::leader::free_port();
    let _process = f.bed.spawn_operator(
        &f.ns,
        &f.op.db,
        port,
        &[
            ("ARTEMIS_STUDIO_TEST_DRAIN_DIES", &dies.display().to_string()),
            ("INSTANCE_ID", &f.op.ctx.instance_id),
            ("CAPTURE_PASS_SECONDS", "2"),
            ("RUST_BACKTRACE", "0"),
        ],
    );
    let http = reqwest::Client::new();
    wait_ready(&http, port).await;
    let restarts_series = format!(
        "artemis_studio_capture_drain_restarts_total{{cluster=\"{}/c\",subscription=\"orders\"}}",
        f.ns
    );
    let read = |series: &'static str| {
        let (http, restarts_series) = (http.clone(), restarts_series.clone());
        async move {
            let body = metrics(&http, port).await;
            let series = if series == "restarts" {
                restarts_series.as_str()
            } else {
                series
            };
            sample(&body, series)
        }
    };
    wait_until(
        "3 drains running, and the restarts counter at 0",
        Duration::from_secs(60),
        || async {
            let running = read("artemis_studio_capture_drains").await;
            (running == Some(3.0) && read("restarts").await == Some(0.0)).then_some(())
        },
    )
    .await;

    std::fs::write(&dies, "").expect("open the fault");
    // Each drain dies at its next batch (within a second), and again at each restart: its
    // backoff grows past the pass interval, and its taps say so while it is down.
    let said = "drain died: it panicked: test hook ARTEMIS_STUDIO_TEST_DRAIN_DIES";
    let down = f
        .wait_subscription(
            "orders",
            "every tap says its drain died, 3+ times in a row, and when it restarts",
            |s| {
                let taps = s.status.as_ref().map(|st| st.taps.clone()).unwrap_or_default();
                taps.len() == 3
                    && taps.iter().all(|t| {
                        let m = t.message.as_deref().unwrap_or_default();
                        t.state == TapState::Degraded
                            && m.contains(said)
                            && m.contains("; restarts at ")
                            && deaths_in_a_row(m) >= 3
                    })
            },
        )
        .await;
    eprintln!(
        "while down: {:?}",
        down.status
            .as_ref()
            .and_then(|s| s.taps.first())
            .map(|t| &t.message)
    );
    let counted = read("restarts").await.expect("the restarts counter");
    assert!(counted >= 9.0, "3 drains, 3+ deaths each: {counted}");
    // Backed off: with a backoff of 8 s or more now, no drain dies more than twice in 10 s
    // (restarted at every 2 s pass, each would die 5 times).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let later = read("restarts").await.expect("the restarts counter");
    assert!(
        later - counted <= 6.0,
        "deaths in 10 s: {} (from {counted})",
        later - counted
    );

    std::fs::remove_file(&dies).expect("close the fault");
    f.wait_subscription("orders", "3 taps drained again", |s| {
        taps_in(s, TapState::Healthy) == 3
    })
    .await;
    assert_eq!(read("artemis_studio_capture_drains").await, Some(3.0));
    crate::support::send_messages(&f.bed, "c1", &address, 3).await;
    f.wait_rows("orders", 3).await;
    let recovered = read("restarts").await.expect("the restarts counter");

    // Drains stopped on purpose (Sample mode sweeps the taps) are not deaths.
    f.subscriptions()
        .patch(
            "orders",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"mode": "Sample"}})),
        )
        .await
        .expect("switch to Sample");
    wait_until("no drain runs", Duration::from_secs(60), || async {
        (read("artemis_studio_capture_drains").await == Some(0.0)).then_some(())
    })
    .await;
    f.later_passes(2).await;
    assert_eq!(read("restarts").await, Some(recovered), "a stop is not a death");
    f.subscriptions()
        .delete("orders", &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_subscription_gone("orders").await;
}
