//! The drain (ADR-0062 D2, D4, D9; ADR-0066 D2): one AMQP 1.0 receiver per capture queue per
//! node, consuming by FQQN with manual credit in batches, so a slow database slows the drain and
//! the ring absorbs it (the producer never waits). A batch is accepted (settled) only after it is
//! committed: at-least-once into the database, and a redelivered copy is skipped by the store.
//! A drain that stops is visible in [`DrainHealth`], which is what makes a tap HEALTHY.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{Body, Message, MessageId};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Connection, Receiver, Session};
use serde_json::json;
use tokio::sync::watch;

use super::names::TapName;
use crate::store::Store;
use crate::store::captured::{CapturedRow, LossAt, SubscriptionKey};

/// Copies asked for at once. The next batch's credit goes out as soon as a batch is in hand, so
/// the broker streams it while Postgres commits; at most two batches (400 copies) are in flight
/// and unsettled at once, which bounds how much the credit window adds to the ring
/// (CAPTURE-NOTES: delivering messages do not count toward the ring size).
pub const BATCH: u32 = 200;

/// How often an idle drain confirms in Postgres that its coverage interval is still open: the
/// precision of a coverage gap's end when the operator dies.
const COVERAGE_CONFIRM: Duration = Duration::from_secs(5);

/// One drain: a capture queue on one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DrainKey {
    pub cluster: String,
    pub node: String,
    pub capture_queue: String,
}

/// What the pass knows of a drain.
#[derive(Clone, Debug)]
pub struct DrainState {
    pub connected: bool,
    /// The last committed batch or idle heartbeat.
    pub alive_at: Instant,
    /// Why it is not draining now, when it is not.
    pub problem: Option<String>,
}

/// Every drain of this process.
#[derive(Clone, Default)]
pub struct DrainHealth {
    inner: Arc<Mutex<HashMap<DrainKey, DrainState>>>,
}

impl DrainHealth {
    fn set(&self, key: &DrainKey, connected: bool, problem: Option<String>) {
        if let Ok(mut m) = self.inner.lock() {
            m.insert(
                key.clone(),
                DrainState {
                    connected,
                    alive_at: Instant::now(),
                    problem,
                },
            );
        }
    }

    fn forget(&self, key: &DrainKey) {
        if let Ok(mut m) = self.inner.lock() {
            m.remove(key);
        }
    }

    /// Being drained: connected, no problem, alive within `within` (ADR-0066 D2's definition of
    /// a healthy tap). Err carries why not.
    pub fn draining(&self, key: &DrainKey, within: Duration) -> Result<(), String> {
        let m = self
            .inner
            .lock()
            .map_err(|_| "drain state unavailable".to_string())?;
        match m.get(key) {
            None => Err("no drain runs for this capture queue (yet)".into()),
            Some(s) if !s.connected => Err(s.problem.clone().unwrap_or_else(|| "drain not connected".into())),
            Some(s) if s.problem.is_some() => Err(s.problem.clone().unwrap_or_default()),
            Some(s) if s.alive_at.elapsed() > within => {
                Err(format!("drain silent for {}s", s.alive_at.elapsed().as_secs()))
            }
            Some(_) => Ok(()),
        }
    }
}

/// A per-subscription token bucket (D9): one firehose cannot starve the others; the excess is
/// dropped after it leaves the ring, and counted.
#[derive(Debug)]
pub struct RateCap {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl RateCap {
    pub fn new(per_second: u32) -> Self {
        RateCap {
            rate: f64::from(per_second.max(1)),
            tokens: f64::from(per_second.max(1)),
            at: Instant::now(),
        }
    }

    pub fn set_rate(&mut self, per_second: u32) {
        self.rate = f64::from(per_second.max(1));
    }

    /// How many of `n` may be stored now.
    pub fn take(&mut self, n: u64) -> u64 {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.rate);
        self.at = now;
        let granted = (self.tokens.floor() as u64).min(n);
        self.tokens -= granted as f64;
        granted
    }
}

/// Everything one drain needs.
#[derive(Clone)]
pub struct DrainSpec {
    pub key: DrainKey,
    pub tap: TapName,
    pub subscription: SubscriptionKey,
    /// `amqp://host:port` of the node's active broker.
    pub url: String,
    pub username: String,
    pub password: String,
    pub max_body_bytes: usize,
    pub rate_cap: Arc<Mutex<RateCap>>,
    pub container_id: String,
}

/// A running drain. [`DrainHandle::stop`] stops it after the batch in hand; dropping the handle
/// (the worker is gone) aborts it, and its unsettled copies go back to the queue.
pub struct DrainHandle {
    pub url: String,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl DrainHandle {
    /// Stop after the batch in hand is committed and settled (unsettled copies go back to the
    /// queue head); waits up to `grace`.
    pub async fn stop(mut self, grace: Duration) {
        let _ = self.stop.send(true);
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(grace, &mut task).await.is_err()
        {
            task.abort();
        }
    }
}

impl Drop for DrainHandle {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

pub fn spawn(store: Store, health: DrainHealth, spec: DrainSpec) -> DrainHandle {
    let (stop, stopped) = watch::channel(false);
    let url = spec.url.clone();
    let task = tokio::spawn(async move {
        let drains = &crate::telemetry::capture::metrics().drains;
        drains.inc();
        // Counted down however the task ends (stopped, or aborted with its handle).
        struct Running<'a>(&'a prometheus_client::metrics::gauge::Gauge);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.dec();
            }
        }
        let _running = Running(drains);
        run(store, health, spec, stopped).await
    });
    DrainHandle {
        url,
        stop,
        task: Some(task),
    }
}

async fn run(store: Store, health: DrainHealth, spec: DrainSpec, mut stopped: watch::Receiver<bool>) {
    let mut delay = Duration::from_millis(500);
    while !*stopped.borrow() {
        match session(&store, &health, &spec, &mut stopped).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(queue = %spec.key.capture_queue, node = %spec.key.node, error = %e, "capture drain stopped; reconnecting");
                health.set(&spec.key, false, Some(format!("drain stopped: {e}")));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stopped.changed() => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
    health.forget(&spec.key);
}

/// One connection's life: attach, then batches until stopped or broken.
async fn session(
    store: &Store,
    health: &DrainHealth,
    spec: &DrainSpec,
    stopped: &mut watch::Receiver<bool>,
) -> Result<(), String> {
    let url = spec.url.replacen(
        "amqp://",
        &format!(
            "amqp://{}:{}@",
            urlencode(&spec.username),
            urlencode(&spec.password)
        ),
        1,
    );
    let mut connection = Connection::open(spec.container_id.clone(), url.as_str())
        .await
        .map_err(|e| format!("connect to {}: {e}", spec.url))?;
    let mut amqp = Session::begin(&mut connection)
        .await
        .map_err(|e| format!("session: {e}"))?;
    let queue = spec.tap.capture_queue();
    let mut receiver = Receiver::builder()
        .name(format!("{}-{}", spec.container_id, spec.key.node))
        .source(format!("{queue}::{queue}"))
        .credit_mode(CreditMode::Manual)
        .attach(&mut amqp)
        .await
        .map_err(|e| format!("attach to {queue}: {e}"))?;
    store
        .ensure_partitions(&spec.subscription)
        .await
        .map_err(|e| format!("partitions: {e}"))?;
    let coverage = store
        .coverage_start(&spec.subscription, &spec.key.node, &spec.tap.address, &queue)
        .await
        .map_err(|e| format!("coverage: {e}"))?;
    health.set(&spec.key, true, None);
    let result = batches(store, health, spec, &mut receiver, coverage, stopped).await;
    let _ = store.coverage_end(&spec.subscription, coverage).await;
    let _ = receiver.close().await;
    let _ = amqp.end().await;
    let _ = connection.close().await;
    result
}

async fn batches(
    store: &Store,
    health: &DrainHealth,
    spec: &DrainSpec,
    receiver: &mut Receiver,
    coverage: i64,
    stopped: &mut watch::Receiver<bool>,
) -> Result<(), String> {
    let mut last_confirm = Instant::now();
    // Credit is granted again only after a batch used it: an idle drain sends nothing to the
    // broker and touches the database once per COVERAGE_CONFIRM. It is granted before the batch
    // is committed (the broker streams the next batch meanwhile), never while a batch is held
    // for a database that refuses: at most two batches are unsettled.
    receiver
        .set_credit(BATCH)
        .await
        .map_err(|e| format!("credit: {e}"))?;
    loop {
        if *stopped.borrow() {
            return Ok(());
        }
        let mut batch = vec![];
        // The first copy (or an idle heartbeat), then whatever follows within a short linger.
        tokio::select! {
            r = receiver.recv::<Body<Value>>() => batch.push(r.map_err(|e| format!("receive: {e}"))?),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stopped.changed() => {}
        }
        while !batch.is_empty() && batch.len() < BATCH as usize {
            match tokio::time::timeout(Duration::from_millis(20), receiver.recv::<Body<Value>>()).await {
                Ok(r) => batch.push(r.map_err(|e| format!("receive: {e}"))?),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            health.set(&spec.key, true, None);
            if last_confirm.elapsed() > COVERAGE_CONFIRM {
                store
                    .coverage_confirm(&spec.subscription, coverage, 0)
                    .await
                    .map_err(|e| format!("coverage: {e}"))?;
                last_confirm = Instant::now();
            }
            continue;
        }
        receiver
            .set_credit(BATCH)
            .await
            .map_err(|e| format!("credit: {e}"))?;
        let allowed = spec
            .rate_cap
            .lock()
            .map(|mut b| b.take(batch.len() as u64))
            .unwrap_or(batch.len() as u64) as usize;
        let rows: Vec<CapturedRow> = batch
            .iter()
            .take(allowed)
            .map(|d| row(&spec.key.node, &spec.tap, spec.max_body_bytes, d.message()))
            .collect();
        let capped = (batch.len() - allowed) as u64;
        // Commit first; settle after. While the database refuses, hold the batch (no new
        // credit): the ring absorbs, the producer never waits.
        let mut wait = Duration::from_millis(200);
        let stored = loop {
            let started = Instant::now();
            match store.insert_captured(&spec.subscription, &rows, coverage).await {
                Ok(n) => {
                    record_batch(spec, &rows, n, capped, started.elapsed());
                    break n;
                }
                Err(e) => {
                    tracing::warn!(queue = %spec.key.capture_queue, node = %spec.key.node, error = %e, held = batch.len(), "capture: batch not stored; held unsettled and retried");
                    health.set(
                        &spec.key,
                        true,
                        Some(format!("database unavailable, batch held: {e}")),
                    );
                    if e.to_string().contains("no partition") {
                        let _ = store.ensure_partitions(&spec.subscription).await;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        };
        if let Ok(marker) = std::env::var("ARTEMIS_STUDIO_TEST_PAUSE_AFTER_INSERT") {
            // A test-only pause point: the crash window between commit and settle (a SIGKILL
            // here must not make a second row of any copy redelivered to the next drain).
            let _ = std::fs::write(&marker, stored.to_string());
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        receiver
            .accept_all(&batch)
            .await
            .map_err(|e| format!("settle: {e}"))?;
        let at = LossAt {
            cluster: &spec.key.cluster,
            subscription: &spec.tap.subscription,
            node: &spec.key.node,
            source_address: &spec.tap.address,
        };
        let _ = store.add_loss(&at, "rate_cap", capped).await;
        last_confirm = Instant::now();
        health.set(&spec.key, true, None);
    }
}

/// The metrics of one committed batch.
fn record_batch(spec: &DrainSpec, rows: &[CapturedRow], stored: u64, capped: u64, took: Duration) {
    let m = crate::telemetry::capture::metrics();
    let labels = crate::telemetry::capture::SubscriptionLabels {
        cluster: spec.key.cluster.clone(),
        subscription: spec.tap.subscription.clone(),
    };
    m.stored.get_or_create(&labels).inc_by(stored);
    m.batch_size
        .get_or_create(&labels)
        .observe((rows.len() as u64 + capped) as f64);
    m.insert_seconds
        .get_or_create(&labels)
        .observe(took.as_secs_f64());
    if let Some(oldest) = rows.iter().filter_map(|r| r.routed_at).min() {
        let lag = (chrono::Utc::now() - oldest).num_milliseconds().max(0) as f64 / 1000.0;
        m.drain_lag_seconds.get_or_create(&labels).set(lag);
    }
    m.dropped(&spec.key.cluster, &spec.tap.subscription, "rate_cap", capped);
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn id_text(id: &MessageId) -> String {
    match id {
        MessageId::String(s) => s.clone(),
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(u) => format!("{u:?}"),
        MessageId::Binary(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::String(s) => json!(s),
        Value::Symbol(s) => json!(s.0),
        Value::Bool(b) => json!(b),
        Value::Long(n) => json!(n),
        Value::Int(n) => json!(n),
        Value::Short(n) => json!(n),
        Value::Byte(n) => json!(n),
        Value::Ulong(n) => json!(n),
        Value::Uint(n) => json!(n),
        Value::Ushort(n) => json!(n),
        Value::Ubyte(n) => json!(n),
        Value::Double(n) => json!(n.0),
        Value::Float(n) => json!(n.0),
        Value::Timestamp(t) => json!(t.milliseconds()),
        Value::Null => serde_json::Value::Null,
        other => serde_json::to_value(other).unwrap_or_else(|_| json!(format!("{other:?}"))),
    }
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(to_json(other).to_string().trim_matches('"').to_string()),
    }
}

/// One delivered copy as a row (pure). The original address comes from our install record (the
/// tap we drain), never from a header (ADR-0062 D4); the source message ID from the broker's
/// divert annotations (AMQP origin) or properties (Core/JMS origin), null when absent.
pub fn row(node: &str, tap: &TapName, max_body: usize, m: &Message<Body<Value>>) -> CapturedRow {
    let annotations: serde_json::Map<String, serde_json::Value> = m
        .message_annotations
        .as_ref()
        .map(|a| {
            a.0.iter()
                .map(|(k, v)| {
                    let key = match k {
                        fe2o3_amqp::types::messaging::annotations::OwnedKey::Symbol(s) => s.0.clone(),
                        fe2o3_amqp::types::messaging::annotations::OwnedKey::Ulong(n) => n.to_string(),
                    };
                    (key, to_json(v))
                })
                .collect()
        })
        .unwrap_or_default();
    let properties: serde_json::Map<String, serde_json::Value> = m
        .application_properties
        .as_ref()
        .map(|p| {
            p.0.iter()
                .map(|(k, v)| (k.clone(), to_json(&Value::from(v.clone()))))
                .collect()
        })
        .unwrap_or_default();
    let source = annotations
        .get("x-opt-ORIG-MESSAGE-ID")
        .or_else(|| properties.get("_AMQ_ORIG_MESSAGE_ID"))
        .filter(|v| !v.is_null())
        .map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()));
    let p = m.properties.as_ref();
    let routed_at = annotations
        .get("x-opt-ingress-time")
        .and_then(serde_json::Value::as_i64)
        .or_else(|| p.and_then(|p| p.creation_time.as_ref()).map(|t| t.milliseconds()))
        .and_then(chrono::DateTime::from_timestamp_millis);
    let mut headers = serde_json::Map::new();
    if let Some(h) = &m.header {
        headers.insert("durable".into(), json!(h.durable));
        headers.insert("priority".into(), json!(h.priority.0));
        headers.insert("ttl".into(), json!(h.ttl));
        headers.insert("deliveryCount".into(), json!(h.delivery_count));
    }
    if let Some(p) = p {
        if let Some(s) = &p.subject {
            headers.insert("subject".into(), json!(s));
        }
        if let Some(c) = &p.content_type {
            headers.insert("contentType".into(), json!(c.0));
        }
    }
    headers.insert("annotations".into(), serde_json::Value::Object(annotations));
    let (text, binary) = match &m.body {
        Body::Value(v) => (text_of(&v.0), None),
        Body::Data(batch) => (
            None,
            Some(
                batch
                    .iter()
                    .flat_map(|d| d.0.iter().copied())
                    .collect::<Vec<u8>>(),
            ),
        ),
        Body::Sequence(seqs) => (
            Some(
                serde_json::Value::Array(seqs.iter().flat_map(|s| s.0.iter().map(to_json)).collect())
                    .to_string(),
            ),
            None,
        ),
        _ => (None, None),
    };
    let size = text
        .as_ref()
        .map(String::len)
        .or(binary.as_ref().map(Vec::len))
        .unwrap_or(0);
    let truncated = size > max_body;
    let text = text.map(|mut t| {
        if t.len() > max_body {
            let mut cut = max_body;
            while !t.is_char_boundary(cut) {
                cut -= 1;
            }
            t.truncate(cut);
        }
        t
    });
    let binary = binary.map(|mut b| {
        b.truncate(max_body);
        b
    });
    CapturedRow {
        node: node.into(),
        original_address: tap.address.clone(),
        capture_queue: tap.capture_queue(),
        source_message_id: source,
        message_id: p.and_then(|p| p.message_id.as_ref()).map(id_text),
        correlation_id: p.and_then(|p| p.correlation_id.as_ref()).map(id_text),
        reply_to: p.and_then(|p| p.reply_to.clone()),
        properties: serde_json::Value::Object(properties),
        headers: serde_json::Value::Object(headers),
        body_text: text,
        body_binary: binary,
        body_size: i32::try_from(size).unwrap_or(i32::MAX),
        body_truncated: truncated,
        routed_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp::types::messaging::{AmqpValue, ApplicationProperties, MessageAnnotations, Properties};

    fn message(body: &str) -> Message<Body<Value>> {
        Message::builder()
            .properties(Properties::builder().message_id(String::from("m-1")).build())
            .message_annotations(
                MessageAnnotations::builder()
                    .insert("x-opt-ORIG-MESSAGE-ID", Value::Long(42))
                    .insert("x-opt-ORIG-ADDRESS", Value::String("spoofed".into()))
                    .build(),
            )
            .application_properties(ApplicationProperties::builder().insert("region", "eu").build())
            .body(Body::Value(AmqpValue(Value::String(body.into()))))
            .build()
    }

    #[test]
    fn the_original_address_is_ours_and_the_source_id_the_brokers() {
        let tap = TapName::new("i1", "orders.in", "sub");
        let r = row("n1", &tap, 1024, &message("hello"));
        assert_eq!(
            r.original_address, "orders.in",
            "from the install record, not a header"
        );
        assert_eq!(r.source_message_id.as_deref(), Some("42"));
        assert_eq!(r.message_id.as_deref(), Some("m-1"));
        assert_eq!(r.properties["region"], "eu");
        assert_eq!(r.body_text.as_deref(), Some("hello"));
        assert!(!r.body_truncated);
    }

    #[test]
    fn bodies_are_truncated_at_the_limit_and_say_so() {
        let tap = TapName::new("i1", "a", "s");
        let r = row("n1", &tap, 4, &message("héllo world"));
        assert!(r.body_truncated);
        assert_eq!(r.body_size, "héllo world".len() as i32);
        assert!(r.body_text.as_deref().is_some_and(|t| t.len() <= 4));
    }

    #[test]
    fn the_rate_cap_grants_at_most_its_rate() {
        let mut cap = RateCap::new(10);
        assert_eq!(cap.take(25), 10);
        assert_eq!(cap.take(5), 0);
    }
}
