//! Capture mode Sample (ADR-0062 D3, D10) on the real test bed: no tap on any broker; matching
//! queues browsed (never consumed) against a high-water mark; rows marked origin='sampled'.
//! Every test starts from state already on the brokers (queues made behind the operator's back,
//! messages already on them), and proves "a later browse ran" from the browse counter sampling
//! keeps in `capture_sample_mark`, never from a sleep.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use artemis_studio_operator::api::capture::{ArtemisCaptureSubscription, CaptureMode, TapState};

use crate::capture::{broker_queue, divert_names, queue_attr};
use crate::queue::{Fixture, fixture};
use crate::support::{TestBed, brokers_shared, jolokia_raw, send_messages, short_id, wait_until};

const ORIGIN: Option<&str> = Some("http://localhost");

pub(crate) fn condition(s: &ArtemisCaptureSubscription, kind: &str) -> Option<(String, String, String)> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn ready(s: &ArtemisCaptureSubscription) -> bool {
    condition(s, "Ready").is_some_and(|c| c.0 == "True")
}

fn healthy_taps(s: &ArtemisCaptureSubscription) -> usize {
    s.status
        .as_ref()
        .map(|st| st.taps.iter().filter(|t| t.state == TapState::Healthy).count())
        .unwrap_or(0)
}

async fn node_id(bed: &TestBed, broker: &str) -> String {
    let b = bed.broker(broker);
    let (_, body) = jolokia_raw(
        &b,
        &bed.broker_user(),
        ORIGIN,
        json!({"type": "read", "mbean": format!("org.apache.activemq.artemis:broker=\"{broker}\""), "attribute": "NodeID"}),
    )
    .await;
    body["value"].as_str().expect("NodeID").to_string()
}

/// MessageCount, MessagesAcknowledged, MessagesAdded and DeliveringCount of a queue on c1.
async fn counters(bed: &TestBed, queue: &str) -> [i64; 4] {
    let c1 = bed.broker("c1");
    let mut out = [0; 4];
    for (i, a) in [
        "MessageCount",
        "MessagesAcknowledged",
        "MessagesAdded",
        "DeliveringCount",
    ]
    .iter()
    .enumerate()
    {
        out[i] = queue_attr(bed, &c1, queue, a)
            .await
            .as_i64()
            .unwrap_or_else(|| panic!("{a} of {queue}"));
    }
    out
}

/// Asserts that the queue's counters reach `expected` (MessageCount, MessagesAcknowledged,
/// MessagesAdded, DeliveringCount). Artemis updates MessageCount a moment after MessagesAdded (a
/// read right after a send saw [2, 0, 3, 0]), so this polls for up to 15 s; a browse that consumed
/// or held a message would leave the counters off for good and fail here.
async fn assert_counters(bed: &TestBed, queue: &str, expected: [i64; 4], why: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = counters(bed, queue).await;
        if now == expected {
            return;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "{why}: MessageCount, MessagesAcknowledged, MessagesAdded, DeliveringCount of {queue} are {now:?}, expected {expected:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Fixture {
    /// Successful browses sampling recorded for a subscription (its own counter).
    async fn browses(&self, subscription: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT COALESCE(sum(browses), 0)::bigint FROM capture_sample_mark WHERE cluster = $1 AND subscription = $2",
        )
        .bind(format!("{}/c", self.ns))
        .bind(subscription)
        .fetch_one(self.op.store.pool())
        .await
        .expect("browses")
    }

    /// Wait until every node's queues were browsed `n` more times: positive evidence that later
    /// samples ran.
    async fn later_browses(&self, subscription: &str, n: i64) {
        let start = self.browses(subscription).await;
        wait_until(
            &format!("{n} more browses by {subscription}"),
            Duration::from_secs(60),
            || async move { (self.browses(subscription).await >= start + n).then_some(()) },
        )
        .await;
    }

    /// (origin, node, original address, capture queue, source message ID, body) of each row.
    async fn rows_of(
        &self,
        subscription: &str,
    ) -> Vec<(String, String, String, String, Option<String>, Option<String>)> {
        sqlx::query_as(
            "SELECT origin, node, original_address, capture_queue, source_message_id, body_text FROM captured_message \
             WHERE cluster = $1 AND subscription = $2 ORDER BY source_message_id::bigint",
        )
        .bind(format!("{}/c", self.ns))
        .bind(subscription)
        .fetch_all(self.op.store.pool())
        .await
        .expect("rows")
    }

    async fn mode_row(&self, subscription: &str) -> (String, Option<i32>) {
        sqlx::query_as("SELECT mode, sample_interval_seconds FROM capture_subscription WHERE cluster = $1 AND subscription = $2")
            .bind(format!("{}/c", self.ns))
            .bind(subscription)
            .fetch_one(self.op.store.pool())
            .await
            .expect("capture_subscription row")
    }

    async fn delete_and_wait(&self, name: &str) {
        self.subscriptions()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete subscription");
        let api = self.subscriptions();
        wait_until("the subscription is gone", Duration::from_secs(90), || {
            let api = api.clone();
            async move { api.get_opt(name).await.ok().flatten().is_none().then_some(()) }
        })
        .await;
    }
}

/// No object of this operator instance (divert or capture queue) on any node of cluster c.
async fn no_tap_on_any_node(f: &Fixture, address: &str, subscription: &str) {
    let tap = f.tap(address, subscription);
    for b in f.bed.cluster_brokers("c") {
        assert!(
            !divert_names(&f.bed, &b).await.contains(&tap.divert()),
            "divert on {}",
            b.name
        );
        assert_eq!(
            queue_attr(&f.bed, &b, &tap.capture_queue(), "Durable").await,
            Value::Null,
            "capture queue on {}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_sampled_queue_shows_what_the_browse_saw_never_consumes_and_a_later_browse_adds_only_new_messages()
{
    let _shared = brokers_shared().await;
    let f = fixture("samp-browse", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("samp.{id}.orders");
    // State already on the broker: the queue, made behind the operator's back, with messages.
    broker_queue(&f.bed, &address).await;
    send_messages(&f.bed, "c1", &address, 3).await;
    let before = [3, 0, 3, 0];
    assert_counters(
        &f.bed,
        &address,
        before,
        "three messages on the queue before sampling",
    )
    .await;

    f.subscribe(
        "peek",
        json!({"queues": address, "mode": "Sample", "sampleIntervalSeconds": 1, "maxBodyBytes": 1024}),
    )
    .await;
    let s = f
        .wait_subscription("peek", "Ready, 3 sampled", |s| {
            ready(s) && s.status.as_ref().is_some_and(|st| st.sampled == 3)
        })
        .await;
    let status = s.status.clone().expect("status");
    assert_eq!(status.mode, Some(CaptureMode::Sample));
    assert!(
        status.taps.is_empty(),
        "no taps in mode Sample: {:?}",
        status.taps
    );
    assert_eq!(status.addresses, vec![address.clone()]);
    // One entry per live node (the queue is on all three), all browsing; c1 holds the three.
    assert_eq!(status.sampled_queues.len(), 3, "{:?}", status.sampled_queues);
    assert!(
        status
            .sampled_queues
            .iter()
            .all(|q| q.browsing && q.queue == address)
    );
    let counts = status.sampled_queue_counts;
    assert_eq!(
        (
            counts.browsing,
            counts.failed,
            counts.pending,
            status.sampled_queues_omitted
        ),
        (3, 0, 0, 0)
    );
    let c1 = node_id(&f.bed, "c1").await;
    let on_c1 = status
        .sampled_queues
        .iter()
        .find(|q| q.node == c1)
        .expect("c1's entry");
    assert_eq!(on_c1.sampled, 3);
    let (_, reason, message) = condition(&s, "Sampling").expect("Sampling condition");
    assert_eq!(reason, "Sampled");
    assert!(
        message.starts_with(
            "sampled: a browse every 1s sees only what is still on the queue; messages consumed between browses are never seen"
        ),
        "{message}"
    );
    assert!(!message.contains("complete;"), "{message}");
    let (_, ready_reason, ready_message) = condition(&s, "Ready").expect("Ready");
    assert_eq!(ready_reason, "Sampling");
    assert!(
        ready_message.contains("sampled: a browse every 1s"),
        "{ready_message}"
    );

    // What the browse saw, marked sampled, where it was seen.
    let rows = f.rows_of("peek").await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.0, "sampled");
        assert_eq!(r.1, c1, "the node the browse saw it on");
        assert_eq!(r.2, address, "the queue's address");
        assert_eq!(r.3, address, "the browsed queue");
        assert!(
            r.4.as_deref().is_some_and(|m| m.parse::<i64>().is_ok()),
            "the broker message ID: {r:?}"
        );
        assert_eq!(r.5.as_deref(), Some(format!("message {i}").as_str()));
    }
    assert_eq!(f.mode_row("peek").await, ("sample".to_string(), Some(1)));

    // Later browses (counted) never consume and never store a message twice.
    f.later_browses("peek", 6).await;
    assert_counters(&f.bed, &address, before, "unchanged by browsing").await;
    assert_eq!(f.rows_of("peek").await.len(), 3);

    // New messages: only they are added.
    send_messages(&f.bed, "c1", &address, 2).await;
    f.wait_subscription("peek", "5 sampled", |s| {
        s.status.as_ref().is_some_and(|st| st.sampled == 5)
    })
    .await;
    f.later_browses("peek", 6).await;
    let rows = f.rows_of("peek").await;
    assert_eq!(rows.len(), 5, "{rows:?}");
    let bodies: Vec<Option<String>> = rows.iter().map(|r| r.5.clone()).collect();
    assert_eq!(
        bodies[3..].to_vec(),
        vec![Some("message 0".to_string()), Some("message 1".to_string())],
        "the second batch, once each"
    );
    assert_counters(&f.bed, &address, [5, 0, 5, 0], "five messages, none consumed").await;

    // No tap was ever installed, and sampling wrote no audit row (it writes nothing to a broker).
    no_tap_on_any_node(&f, &address, "peek").await;
    assert!(f.capture_audit_rows("capture.install").await.is_empty());
    assert!(f.capture_audit_rows("capture.remove").await.is_empty());

    f.delete_and_wait("peek").await;
}

/// A real Core JMS consumer (the Artemis CLI) on one anycast queue of c1, receiving `n`
/// messages as fast as they come; killed if the test ends first.
struct FastConsumer(std::process::Child);

impl FastConsumer {
    fn start(bed: &TestBed, queue: &str, n: usize) -> FastConsumer {
        let home = bed.var("TESTBED_ARTEMIS_HOME");
        let (u, p) = bed.broker_user();
        let child = std::process::Command::new(format!("{home}/bin/artemis"))
            .args([
                "consumer",
                "--url",
                &bed.var("TESTBED_C1_CORE"),
                "--user",
                &u,
                "--password",
                &p,
                "--destination",
                &format!("queue://{queue}"),
                "--message-count",
                &n.to_string(),
                "--receive-timeout",
                "120000",
                "--silent",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the Artemis CLI consumer");
        FastConsumer(child)
    }

    /// Finished, having received all it was asked for.
    fn done(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(Some(s)) if s.success())
    }
}

impl Drop for FastConsumer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `n` AMQP messages to an address on c1, each accepted.
async fn amqp_send(bed: &TestBed, address: &str, n: usize, tag: &str) {
    use fe2o3_amqp::types::messaging::Outcome;
    let mut producer = crate::support::amqp_producer(bed, "c1", address, tag)
        .await
        .expect("AMQP producer");
    let sender = &mut producer.sender;
    for i in 0..n {
        match sender.send(format!("{tag} {i}")).await {
            Ok(Outcome::Accepted(_)) => {}
            other => panic!("message {i} to {address} not accepted: {other:?}"),
        }
    }
    producer.close().await;
}

#[tokio::test]
async fn a_queue_drained_fast_is_sampled_incompletely_while_capture_stores_every_message() {
    let _shared = brokers_shared().await;
    let f = fixture("samp-fast", None).await;
    let id = short_id();
    f.clean.also(&id);
    let sampled_address = format!("samp.{id}.fast");
    let captured_address = format!("samp.{id}.full");
    broker_queue(&f.bed, &sampled_address).await;
    broker_queue(&f.bed, &captured_address).await;
    // Consumers already draining both queues fast, before the operator looks.
    let sent = 200usize;
    let mut fast_sampled = FastConsumer::start(&f.bed, &sampled_address, sent);
    let mut fast_captured = FastConsumer::start(&f.bed, &captured_address, sent);
    let c1 = f.bed.broker("c1");
    for q in [&sampled_address, &captured_address] {
        wait_until(&format!("a consumer on {q}"), Duration::from_secs(60), || {
            let c1 = c1.clone();
            let bed = &f.bed;
            async move { (queue_attr(bed, &c1, q, "ConsumerCount").await == json!(1)).then_some(()) }
        })
        .await;
    }

    f.subscribe(
        "sampler",
        json!({"queues": sampled_address, "mode": "Sample", "sampleIntervalSeconds": 1}),
    )
    .await;
    f.subscribe("capturer", json!({"queues": captured_address})).await;
    f.wait_subscription("sampler", "Ready", ready).await;
    f.wait_subscription("capturer", "3 taps draining", |s| healthy_taps(s) == 3)
        .await;

    // The same traffic to both addresses.
    amqp_send(&f.bed, &sampled_address, sent, &format!("s{id}")).await;
    amqp_send(&f.bed, &captured_address, sent, &format!("c{id}")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !(fast_sampled.done() && fast_captured.done()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the consumers did not receive all {sent} messages in time"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for q in [&sampled_address, &captured_address] {
        assert_eq!(
            queue_attr(&f.bed, &c1, q, "MessageCount").await,
            json!(0),
            "{q} drained"
        );
    }
    // Capture stores every message.
    let captured = f.wait_rows("capturer", sent).await;
    assert_eq!(captured.len(), sent);
    // Sampling looked again after the queue was drained, and saw only what a browse caught.
    f.later_browses("sampler", 6).await;
    let rows = f.rows_of("sampler").await;
    let sampled = rows.len();
    assert!(rows.iter().all(|r| r.0 == "sampled"), "every sampled row says so");
    assert!(
        sampled < sent,
        "a browse sees only what is still on the queue: {sampled} of {sent} seen"
    );
    let origins: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT origin FROM captured_message WHERE cluster = $1 AND subscription = 'capturer'",
    )
    .bind(format!("{}/c", f.ns))
    .fetch_all(f.op.store.pool())
    .await
    .expect("origins");
    assert_eq!(origins, vec!["captured".to_string()]);
    let s = f.subscriptions().get("sampler").await.expect("sampler");
    assert_eq!(
        s.status.as_ref().map(|st| st.sampled),
        Some(sampled as u64),
        "status counts what was stored"
    );
    eprintln!(
        "sent {sent} to each address: captured {}, sampled {sampled}",
        captured.len()
    );
    no_tap_on_any_node(&f, &sampled_address, "sampler").await;

    f.delete_and_wait("sampler").await;
    f.delete_and_wait("capturer").await;
}

#[tokio::test]
async fn switching_capture_to_sample_removes_the_taps_and_back_installs_them() {
    let _shared = brokers_shared().await;
    let f = fixture("samp-switch", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("samp.{id}.switch");
    broker_queue(&f.bed, &address).await;
    f.subscribe("switch", json!({"queues": address})).await;
    f.wait_subscription("switch", "3 taps draining", |s| healthy_taps(s) == 3)
        .await;
    let tap = f.tap(&address, "switch");
    for b in f.bed.cluster_brokers("c") {
        assert!(
            divert_names(&f.bed, &b).await.contains(&tap.divert()),
            "divert on {}",
            b.name
        );
    }
    assert_eq!(f.mode_row("switch").await, ("capture".to_string(), None));

    // Capture → Sample: the sweep removes every tap.
    f.subscriptions()
        .patch(
            "switch",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "Sample", "sampleIntervalSeconds": 2}})),
        )
        .await
        .expect("switch to Sample");
    let s = f
        .wait_subscription("switch", "sampling, no taps", |s| {
            ready(s)
                && s.status
                    .as_ref()
                    .is_some_and(|st| st.mode == Some(CaptureMode::Sample) && st.taps.is_empty())
        })
        .await;
    assert!(condition(&s, "Sampling").is_some());
    no_tap_on_any_node(&f, &address, "switch").await;
    let removes = f.capture_audit_rows("capture.remove").await;
    assert_eq!(removes.len(), 1, "{removes:?}");
    assert_eq!(removes[0].0, "succeeded", "{removes:?}");
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM capture_tap WHERE removed_at IS NULL")
        .fetch_one(f.op.store.pool())
        .await
        .expect("open taps");
    assert_eq!(open, 0);
    assert_eq!(f.mode_row("switch").await, ("sample".to_string(), Some(2)));
    // Later samples install nothing.
    f.later_browses("switch", 3).await;
    no_tap_on_any_node(&f, &address, "switch").await;
    assert_eq!(f.capture_audit_rows("capture.install").await.len(), 1);

    // Sample → Capture: the taps come back, and the claim of sampling goes.
    f.subscriptions()
        .patch(
            "switch",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "Capture"}})),
        )
        .await
        .expect("switch to Capture");
    let s = f
        .wait_subscription("switch", "3 taps draining again", |s| {
            healthy_taps(s) == 3
                && s.status
                    .as_ref()
                    .is_some_and(|st| st.mode == Some(CaptureMode::Capture))
        })
        .await;
    assert!(condition(&s, "Sampling").is_none());
    assert!(s.status.as_ref().is_some_and(|st| st.sampled_queues.is_empty()));
    for b in f.bed.cluster_brokers("c") {
        assert!(
            divert_names(&f.bed, &b).await.contains(&tap.divert()),
            "divert on {}",
            b.name
        );
    }
    assert_eq!(f.mode_row("switch").await, ("capture".to_string(), None));

    f.delete_and_wait("switch").await;
    no_tap_on_any_node(&f, &address, "switch").await;
}

#[tokio::test]
async fn an_operator_restart_never_stores_a_sampled_message_twice() {
    let _shared = brokers_shared().await;
    let mut f = fixture("samp-restart", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("samp.{id}.restart");
    broker_queue(&f.bed, &address).await;
    send_messages(&f.bed, "c1", &address, 3).await;
    f.subscribe(
        "again",
        json!({"queues": address, "mode": "Sample", "sampleIntervalSeconds": 1}),
    )
    .await;
    f.wait_subscription("again", "3 sampled", |s| {
        s.status.as_ref().is_some_and(|st| st.sampled == 3)
    })
    .await;
    assert_eq!(f.rows_of("again").await.len(), 3);

    // The operator stops and starts again on the same database and instance ID: the high-water
    // marks are in Postgres, so the messages still on the queue are not stored again.
    let db = f.op.db.clone();
    f.restart_operator_on(&db).await;
    f.later_browses("again", 6).await;
    assert_eq!(f.rows_of("again").await.len(), 3, "nothing stored twice");
    assert_counters(&f.bed, &address, [3, 0, 3, 0], "three messages, none consumed").await;
    send_messages(&f.bed, "c1", &address, 1).await;
    f.wait_subscription("again", "4 sampled", |s| {
        s.status.as_ref().is_some_and(|st| st.sampled == 4)
    })
    .await;
    assert_eq!(f.rows_of("again").await.len(), 4);
    f.delete_and_wait("again").await;
}
