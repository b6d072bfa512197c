//! Sampling (ADR-0062 D3, D10): `mode: Sample` on an ArtemisCaptureSubscription. No tap is
//! installed on any broker; every `sampleIntervalSeconds` each queue matching the subscription
//! on every live node is BROWSED (`QueueControl.browse(page, pageSize)`: never consumes, never
//! acknowledges, never moves a message) and each message newer than the per-(subscription, node,
//! queue) high-water mark of the broker message ID is stored with origin 'sampled'.
//!
//! What a sampled row claims is weaker than a captured one, and the product says so wherever it
//! shows one: a browse sees only what is still on the queue at that instant (at most the first
//! [`SAMPLE_DEPTH`] messages, bodies as the broker's management preview gives them); messages
//! consumed between two browses are never seen; a message ordered behind a newer one (a higher
//! priority sent later) that only becomes visible after the newer one was stored falls below the
//! high-water mark and is not stored either. A sampled tail is never complete.
//!
//! Runs with the capture pass, under the cluster's advisory lock (exactly one replica samples a
//! cluster), on the live nodes and inventories of the latest pass's topology: one bulk Jolokia
//! request per node per sample, whatever the number of queues and subscriptions (a queue matched
//! by several subscriptions is browsed once).
//!
//! Audit: sampling writes nothing to any broker (only reads: `browse` and
//! `getAddressSettingsAsJSON`), so it is not a command and writes no `audit_event` row
//! (ADR-0049: one row per command, a command being a pass that sends a broker write).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use serde_json::{Map, Value, json};

use crate::api::capture::{
    ArtemisCaptureSubscription, ArtemisCaptureSubscriptionStatus, CaptureMode, SampledQueueCounts,
    SampledQueueStatus,
};
use crate::api::capture_names::{never_captured, wildcard_matches};
use crate::broker::BrokerError;
use crate::broker::management::{Browse, BrowseTarget};
use crate::controllers::{Context, conditions};
use crate::store::StoreError;
use crate::store::captured::{CapturedRow, SubscriptionKey, TapTotals};
use crate::store::sampled::{SampleAt, SampleMark};
use crate::topology::Topology;
use crate::topology::inventory::NodeInventory;
use tokio::sync::Mutex;

/// The most messages one browse reads from the head of a queue (Artemis's own default
/// management-browse-page-size).
pub const SAMPLE_DEPTH: i32 = 200;

/// The condition a subscription in mode Sample always carries: the claim it can make.
pub const SAMPLING: &str = "Sampling";

/// What the sampler keeps per cluster between samples (in the pass's `ClusterState`).
#[derive(Default)]
pub struct SampleState {
    /// The latest pass's topology: which nodes are live and which queues they hold.
    pub topology: Option<Topology>,
    /// Per subscription: when it was last sampled.
    pub last: BTreeMap<String, Instant>,
    /// Per (subscription, node, queue): when the latest browse succeeded, or why it failed.
    pub outcomes: BTreeMap<(String, String, String), Result<DateTime<Utc>, BrowseFailed>>,
    /// Subscriptions whose partitions this process made (retention makes the next days').
    pub partitioned: BTreeSet<String>,
}

/// Why a queue's latest browse stored nothing: the broker's side or the database's. Shown in
/// `sampledQueues[].message`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrowseFailed {
    /// The node's bulk browse request failed as a whole.
    #[error("browse request failed: {0}")]
    Request(#[source] BrokerError),
    /// The broker refused this queue's browse.
    #[error("browse of {queue} refused: {source}")]
    Refused {
        queue: String,
        #[source]
        source: BrokerError,
    },
    /// Browsed; Postgres did not take the rows (the next browse reads them again).
    #[error("browsed, not stored (database: {0}); the next browse tries again")]
    NotStored(#[source] Arc<StoreError>),
}

/// A live (not deleting) subscription in mode Sample.
pub fn is_sampling(s: &ArtemisCaptureSubscription) -> bool {
    s.spec.mode == CaptureMode::Sample && s.metadata.deletion_timestamp.is_none()
}

fn interval(s: &ArtemisCaptureSubscription) -> Duration {
    Duration::from_secs(u64::from(s.spec.sample_interval_seconds.max(1)))
}

/// The plain statement every sampled subscription carries.
pub fn claim(interval_seconds: u32) -> String {
    format!(
        "sampled: a browse every {interval_seconds}s sees only what is still on the queue; messages consumed between browses are never seen (each browse reads at most the first {SAMPLE_DEPTH} messages of a queue). Never complete: use mode Capture for every message"
    )
}

/// The queues a subscription samples on one node: its pattern over queue names (never one under
/// the capture prefix or broker-internal, never a temporary queue), as capture matches them.
pub fn sampled_queues(pattern: &str, inventory: &NodeInventory) -> Vec<BrowseTarget> {
    inventory
        .queues
        .values()
        .filter(|q| {
            !never_captured(&q.name)
                && !never_captured(&q.address)
                && !q.temporary
                && wildcard_matches(pattern, &q.name)
        })
        .map(|q| BrowseTarget {
            queue: q.name.clone(),
            address: q.address.clone(),
            routing_type: q.routing_type.clone(),
        })
        .collect()
}

/// When the next sample of these subscriptions is due (None: none samples).
pub async fn next_due(
    state: &Mutex<SampleState>,
    subs: &[Arc<ArtemisCaptureSubscription>],
) -> Option<Instant> {
    let s = state.lock().await;
    subs.iter()
        .filter(|x| is_sampling(x))
        .map(|x| match s.last.get(&x.name_any()) {
            Some(at) => *at + interval(x),
            None => Instant::now(),
        })
        .min()
}

/// What one sample did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SampleSummary {
    /// Bulk requests sent (one per live node with something to browse).
    pub requests: usize,
    pub browses: usize,
    pub failed: usize,
    pub stored: u64,
}

/// Sample every due subscription of one cluster: one bulk request per live node.
pub async fn sample_due(
    ctx: &Context,
    state: &Mutex<SampleState>,
    cluster_key: &str,
    subs: &[Arc<ArtemisCaptureSubscription>],
) -> SampleSummary {
    let mut summary = SampleSummary::default();
    // No topology yet (no pass got that far): the next one samples after its poll.
    let Some((due, topology)) = take_due(state, subs).await else {
        return summary;
    };
    let marks: BTreeMap<(String, String, String), i64> = match ctx.store.sample_marks(cluster_key).await {
        Ok(m) => m
            .into_iter()
            .map(|m| ((m.subscription, m.node, m.queue), m.high_water))
            .collect(),
        Err(e) => {
            tracing::warn!(cluster = %cluster_key, error = %e, "sampling skipped: high-water marks unreadable");
            return summary;
        }
    };
    let keys = subscription_keys(ctx, state, cluster_key, &due).await;
    let per_node = browse_plan(&topology, &due);
    let browses = futures::future::join_all(per_node.iter().map(|(_, m, wanted)| async move {
        let targets: Vec<BrowseTarget> = wanted.keys().cloned().collect();
        m.browse_queues(&targets, SAMPLE_DEPTH).await
    }))
    .await;
    let sampling = Sampling {
        ctx,
        state,
        cluster_key,
        keys: &keys,
        marks: &marks,
    };
    for ((node, _, wanted), result) in per_node.iter().zip(browses) {
        summary.requests += 1;
        let results: Vec<Browse> = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%node, cluster = %cluster_key, error = %e, "sampling: browse request failed");
                record_failure(state, node, wanted.iter(), &BrowseFailed::Request(e)).await;
                summary.failed += wanted.len();
                continue;
            }
        };
        for ((t, subs), browse) in wanted.iter().zip(results) {
            sampling.store_browse(node, t, subs, browse, &mut summary).await;
        }
    }
    tracing::debug!(cluster = %cluster_key, ?summary, "sampled");
    summary
}

/// The subscriptions due now (marked as sampled now) and the topology to browse on; None when
/// nothing is due or no pass has polled yet.
async fn take_due(
    state: &Mutex<SampleState>,
    subs: &[Arc<ArtemisCaptureSubscription>],
) -> Option<(Vec<Arc<ArtemisCaptureSubscription>>, Topology)> {
    let now = Instant::now();
    let mut s = state.lock().await;
    let due: Vec<Arc<ArtemisCaptureSubscription>> = subs
        .iter()
        .filter(|x| is_sampling(x))
        .filter(|x| {
            s.last
                .get(&x.name_any())
                .is_none_or(|at| now >= *at + interval(x))
        })
        .cloned()
        .collect();
    if due.is_empty() {
        return None;
    }
    for x in &due {
        s.last.insert(x.name_any(), now);
    }
    s.topology.clone().map(|t| (due, t))
}

/// Each due subscription's key in the store (its partitions made once per process).
async fn subscription_keys(
    ctx: &Context,
    state: &Mutex<SampleState>,
    cluster_key: &str,
    due: &[Arc<ArtemisCaptureSubscription>],
) -> BTreeMap<String, SubscriptionKey> {
    let mut keys = BTreeMap::new();
    for x in due {
        let name = x.name_any();
        match ctx.store.subscription_key(cluster_key, &name).await {
            Ok(k) => {
                let fresh = state.lock().await.partitioned.insert(name.clone());
                if fresh && let Err(e) = ctx.store.ensure_partitions(&k).await {
                    tracing::warn!(subscription = %name, error = %e, "sampling: partitions not made");
                    state.lock().await.partitioned.remove(&name);
                }
                keys.insert(name, k);
            }
            Err(e) => {
                tracing::warn!(subscription = %name, error = %e, "sampling: subscription not registered")
            }
        }
    }
    keys
}

/// Each queue to browse, once per live node, with the subscriptions that want it.
type Wanted<'a> = BTreeMap<BrowseTarget, Vec<&'a Arc<ArtemisCaptureSubscription>>>;

/// Per live node: each queue to browse once, and the subscriptions that want it.
fn browse_plan<'a>(
    topology: &Topology,
    due: &'a [Arc<ArtemisCaptureSubscription>],
) -> Vec<(String, crate::broker::BrokerManagement, Wanted<'a>)> {
    let mut per_node = vec![];
    for node in topology.live_nodes() {
        let (Some(m), Some(inv)) = (&node.active, &node.inventory) else {
            continue;
        };
        let mut wanted: Wanted<'a> = BTreeMap::new();
        for x in due {
            for t in sampled_queues(&x.spec.queues, inv) {
                wanted.entry(t).or_default().push(x);
            }
        }
        if !wanted.is_empty() {
            per_node.push((node.node_id.clone(), m.clone(), wanted));
        }
    }
    per_node
}

/// A failed browse, told on every (subscription, node, queue) it concerned.
async fn record_failure<'a>(
    state: &Mutex<SampleState>,
    node: &str,
    wanted: impl Iterator<Item = (&'a BrowseTarget, &'a Vec<&'a Arc<ArtemisCaptureSubscription>>)>,
    why: &BrowseFailed,
) {
    let mut s = state.lock().await;
    for (t, subs) in wanted {
        for x in subs {
            s.outcomes.insert(
                (x.name_any(), node.to_string(), t.queue.clone()),
                Err(why.clone()),
            );
        }
    }
}

/// What one sampling round stores with.
struct Sampling<'a> {
    ctx: &'a Context,
    state: &'a Mutex<SampleState>,
    cluster_key: &'a str,
    keys: &'a BTreeMap<String, SubscriptionKey>,
    marks: &'a BTreeMap<(String, String, String), i64>,
}

impl Sampling<'_> {
    /// One queue's browse: its new messages stored for every subscription that wants it.
    async fn store_browse(
        &self,
        node: &str,
        t: &BrowseTarget,
        subs: &[&Arc<ArtemisCaptureSubscription>],
        browse: Browse,
        summary: &mut SampleSummary,
    ) {
        let messages = match browse.messages {
            Ok(m) => m,
            Err(e) => {
                summary.failed += 1;
                let why = BrowseFailed::Refused {
                    queue: t.queue.clone(),
                    source: e,
                };
                let subs = subs.to_vec();
                record_failure(self.state, node, std::iter::once((t, &subs)), &why).await;
                return;
            }
        };
        summary.browses += 1;
        for x in subs {
            let name = x.name_any();
            let Some(key) = self.keys.get(&name) else { continue };
            let mark = self
                .marks
                .get(&(name.clone(), node.to_string(), t.queue.clone()))
                .copied()
                .unwrap_or(0);
            let max_body = x.spec.max_body_bytes as usize;
            let fresh = new_rows(node, t, &messages, mark, max_body, browse.preview_limit);
            let (outcome, stored) = self.store_rows(key, &name, node, t, fresh, mark).await;
            summary.stored += stored;
            let mut s = self.state.lock().await;
            s.outcomes
                .insert((name, node.to_string(), t.queue.clone()), outcome);
        }
    }

    /// Store one subscription's new rows of one queue: when, or why not, and how many.
    async fn store_rows(
        &self,
        key: &SubscriptionKey,
        name: &str,
        node: &str,
        t: &BrowseTarget,
        fresh: Vec<(i64, CapturedRow)>,
        mark: i64,
    ) -> (Result<DateTime<Utc>, BrowseFailed>, u64) {
        let high_water = fresh.iter().map(|(id, _)| *id).max().unwrap_or(mark).max(mark);
        let rows: Vec<CapturedRow> = fresh.into_iter().map(|(_, r)| r).collect();
        let at = SampleAt {
            node,
            queue: &t.queue,
            address: &t.address,
        };
        match store(self.ctx, key, &at, &rows, high_water).await {
            Ok(n) => {
                let labels = crate::telemetry::capture::SubscriptionLabels {
                    cluster: self.cluster_key.to_string(),
                    subscription: name.to_string(),
                };
                self.ctx.metrics.capture.sampled.get_or_create(&labels).inc_by(n);
                (Ok(Utc::now()), n)
            }
            Err(e) => {
                tracing::warn!(%node, subscription = %name, error = %e, "sampling: rows not stored");
                (Err(BrowseFailed::NotStored(Arc::new(e))), 0)
            }
        }
    }
}

/// Store, making the day's partition once if the insert found none.
async fn store(
    ctx: &Context,
    key: &SubscriptionKey,
    at: &SampleAt<'_>,
    rows: &[CapturedRow],
    high_water: i64,
) -> Result<u64, StoreError> {
    match ctx.store.store_sample(key, at, rows, high_water).await {
        // By SQLSTATE: the day's partition does not exist yet (retention makes the next ones).
        Err(e) if e.sqlstate().as_deref() == Some(crate::store::NO_PARTITION_OR_CHECK) => {
            ctx.store.ensure_partitions(key).await?;
            ctx.store.store_sample(key, at, rows, high_water).await
        }
        r => r,
    }
}

/// The browsed messages above the high-water mark, as rows (pure).
pub fn new_rows(
    node: &str,
    target: &BrowseTarget,
    messages: &[Value],
    high_water: i64,
    max_body: usize,
    preview_limit: Option<i64>,
) -> Vec<(i64, CapturedRow)> {
    messages
        .iter()
        .filter_map(|m| {
            let id = message_id(m)?;
            (id > high_water).then(|| (id, row(node, target, max_body, preview_limit, m)))
        })
        .collect()
}

/// The broker message ID of a browsed message (`messageID`, a decimal string).
pub fn message_id(m: &Value) -> Option<i64> {
    match m.get("messageID")? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// The typed property maps of a browsed message (CompositeData item names).
const PROPERTY_MAPS: [&str; 8] = [
    "StringProperties",
    "BooleanProperties",
    "ByteProperties",
    "ShortProperties",
    "IntProperties",
    "LongProperties",
    "FloatProperties",
    "DoubleProperties",
];

/// Body previews the broker gives instead of a body.
const NO_BODY: [&str; 3] = ["[large message]", "... Large message ...", "[compressed]"];

/// One browsed message as a row (pure). Original address: the browsed queue's address (from the
/// inventory, not a header); capture queue: the browsed queue; source message ID: the broker's.
/// Properties as the drain stores them (an AMQP message's application properties without the
/// broker's `applicationProperties.` prefix; its other sections go to headers). The body is
/// what the broker's preview holds, cut at `max_body`; truncation is flagged when either cut.
pub fn row(
    node: &str,
    target: &BrowseTarget,
    max_body: usize,
    preview_limit: Option<i64>,
    m: &Value,
) -> CapturedRow {
    let amqp = m.get("protocol").and_then(Value::as_str) == Some("AMQP");
    let mut properties = Map::new();
    let mut sections = Map::new();
    for map in PROPERTY_MAPS {
        for (k, v) in m.get(map).and_then(Value::as_object).into_iter().flatten() {
            match k.strip_prefix("applicationProperties.") {
                Some(app) => {
                    properties.insert(app.to_string(), v.clone());
                }
                None if amqp => {
                    sections.insert(k.clone(), v.clone());
                }
                None => {
                    properties.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let text_of = |k: &str| -> Option<String> {
        properties.get(k).or_else(|| sections.get(k)).and_then(|v| {
            v.as_str()
                .map(str::to_string)
                .or_else(|| (!v.is_null()).then(|| v.to_string()))
        })
    };
    let correlation_id = text_of("JMSCorrelationID").or_else(|| text_of("properties.correlationId"));
    let reply_to = text_of("JMSReplyTo").or_else(|| text_of("properties.replyTo"));
    let headers = headers_of(m, sections);
    let large = m.get("largeMessage").and_then(Value::as_bool) == Some(true);
    let (text, binary, size, cut_by_broker) = body_of(m, large, preview_limit);
    let truncated = cut_by_broker || size > max_body;
    let (text, binary) = crate::store::storable::cut_body(text, binary, max_body);
    CapturedRow {
        node: node.into(),
        original_address: target.address.clone(),
        capture_queue: target.queue.clone(),
        source_message_id: message_id(m).map(|id| id.to_string()),
        message_id: m
            .get("userID")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        correlation_id,
        reply_to,
        properties: Value::Object(properties),
        headers: Value::Object(headers),
        body_text: text,
        body_binary: binary,
        body_size: i32::try_from(size).unwrap_or(i32::MAX),
        body_truncated: truncated,
        routed_at: m
            .get("timestamp")
            .and_then(Value::as_i64)
            .filter(|t| *t > 0)
            .and_then(DateTime::from_timestamp_millis),
        body_kind: None,
        escaped: vec![],
    }
}

/// The message's headers as a sampled row keeps them (AMQP sections under `amqp`).
fn headers_of(m: &Value, sections: Map<String, Value>) -> Map<String, Value> {
    let mut headers = Map::new();
    for k in [
        "protocol",
        "type",
        "durable",
        "priority",
        "expiration",
        "redelivered",
        "largeMessage",
        "persistentSize",
    ] {
        if let Some(v) = m.get(k) {
            headers.insert(k.into(), v.clone());
        }
    }
    if !sections.is_empty() {
        headers.insert("amqp".into(), Value::Object(sections));
    }
    headers.insert("sampled".into(), json!(true));
    headers
}

/// The body a browse shows: text, or binary (Java's signed bytes), its size, and whether the
/// broker cut it (a large message, a body type it does not preview, a preview at its limit).
fn body_of(
    m: &Value,
    large: bool,
    preview_limit: Option<i64>,
) -> (Option<String>, Option<Vec<u8>>, usize, bool) {
    let limit = preview_limit.filter(|l| *l >= 0).map(|l| l as usize);
    match (m.get("text"), m.get("BodyPreview")) {
        (Some(Value::String(t)), _) if large || NO_BODY.contains(&t.as_str()) => {
            (None, None, persistent(m), true)
        }
        (Some(Value::String(t)), _) => {
            let (body, full_chars) = untruncate(t, limit);
            let size = match full_chars {
                // Cut by the broker: the prefix's bytes plus the characters it says are missing.
                Some(missing) => body.len() + missing,
                None => body.len(),
            };
            (Some(body), None, size, full_chars.is_some())
        }
        (_, Some(Value::Array(bytes))) if !large => {
            // Java bytes are signed.
            let b: Vec<u8> = bytes
                .iter()
                .filter_map(Value::as_i64)
                .map(|x| x as i8 as u8)
                .collect();
            // A preview as long as the limit may have been cut: the full size is unknown, and
            // the row says it may be truncated rather than claim a complete body.
            let cut = limit.is_some_and(|l| b.len() >= l);
            let n = b.len();
            (None, Some(b), n, cut)
        }
        _ => (None, None, if large { persistent(m) } else { 0 }, large),
    }
}

fn persistent(m: &Value) -> usize {
    m.get("persistentSize")
        .and_then(Value::as_i64)
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// A text preview the broker cut at `limit` characters ends with `, + N more`
/// (`JsonUtil.truncateString`): the prefix, and N, when that is what this is.
pub fn untruncate(text: &str, limit: Option<usize>) -> (String, Option<usize>) {
    let Some(limit) = limit else {
        return (text.to_string(), None);
    };
    if let Some(i) = text.rfind(", + ")
        && let Some(n) = text[i + 4..].strip_suffix(" more")
        && let Ok(missing) = n.parse::<usize>()
        && text[..i].chars().count() == limit
    {
        return (text[..i].to_string(), Some(missing));
    }
    (text.to_string(), None)
}

/// What Postgres holds of a subscription in mode Sample after the pass, and whether the pause
/// held a sweep of its taps.
pub struct Sampled<'a> {
    pub marks: &'a [SampleMark],
    /// What an earlier mode Capture stored and lost stays counted.
    pub totals: &'a [TapTotals],
    pub held: bool,
}

/// Status of a subscription in mode Sample, written only when it changed: no taps; per node and
/// matching queue, what its browses stored; Ready when the browses succeed; and the claim.
pub async fn write_status(
    ctx: &Context,
    state: &Mutex<SampleState>,
    s: &ArtemisCaptureSubscription,
    topology: &Topology,
    sampled: &Sampled<'_>,
) -> Result<(), kube::Error> {
    let (marks, totals) = (sampled.marks, sampled.totals);
    let name = s.name_any();
    let generation = s.metadata.generation;
    let old = s.status.clone().unwrap_or_default();
    let outcomes = state.lock().await.outcomes.clone();
    let mut status = ArtemisCaptureSubscriptionStatus {
        observed_generation: generation,
        conditions: old.conditions.clone(),
        instance_id: Some(ctx.instance_id.clone()),
        mode: Some(CaptureMode::Sample),
        // Armed stays armed for its pattern: switching back to Capture needs no new arming.
        armed: old.armed.clone(),
        ..Default::default()
    };
    // Sampling installs nothing: no preview, nothing to arm.
    status.conditions.retain(|c| c.type_ != super::status::ARMED);
    let (queues, addresses) = sampled_queue_statuses(s, topology, marks, &outcomes);
    set_sampled_queues(&mut status, queues, addresses);
    status.sampled = marks
        .iter()
        .filter(|m| m.subscription == name)
        .map(|m| m.sampled.max(0) as u64)
        .sum();
    // What an earlier Capture mode stored and lost stays counted.
    let mine = totals.iter().filter(|t| t.subscription == name);
    status.captured = mine.clone().map(|t| t.captured.max(0) as u64).sum();
    status.dropped_estimate = mine.map(|t| t.lost.max(0) as u64).sum();
    set_conditions(&mut status, s, sampled.held);
    if !super::status::same_status(&old, &status) {
        crate::controllers::report::patch_whole_status(&ctx.client, s, &status).await?;
    }
    Ok(())
}

/// How a sampled queue's latest browse went: its status lists the failed ones first, then those
/// not browsed yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Browsed {
    Failed,
    NotYet,
    Succeeded,
}

/// Each sampled queue on each live node, with its last browse, and the addresses they are on.
fn sampled_queue_statuses(
    s: &ArtemisCaptureSubscription,
    topology: &Topology,
    marks: &[SampleMark],
    outcomes: &BTreeMap<(String, String, String), Result<DateTime<Utc>, BrowseFailed>>,
) -> (Vec<(Browsed, SampledQueueStatus)>, Vec<String>) {
    let name = s.name_any();
    let marks: BTreeMap<(&str, &str), &SampleMark> = marks
        .iter()
        .filter(|m| m.subscription == name)
        .map(|m| ((m.node.as_str(), m.queue.as_str()), m))
        .collect();
    let mut queues = vec![];
    let mut addresses = BTreeSet::new();
    for node in topology.live_nodes() {
        let Some(inv) = &node.inventory else { continue };
        for t in sampled_queues(&s.spec.queues, inv) {
            let mark = marks.get(&(node.node_id.as_str(), t.queue.as_str()));
            let outcome = outcomes.get(&(name.clone(), node.node_id.clone(), t.queue.clone()));
            addresses.insert(t.address.clone());
            let (browsed, message) = match outcome {
                Some(Err(e)) => (Browsed::Failed, Some(e.to_string())),
                None => (Browsed::NotYet, Some(NOT_BROWSED_YET.into())),
                Some(Ok(_)) => (Browsed::Succeeded, None),
            };
            let entry = SampledQueueStatus {
                node: node.node_id.clone(),
                queue: t.queue.clone(),
                address: t.address.clone(),
                browsing: browsed == Browsed::Succeeded,
                sampled: mark.map(|m| m.sampled.max(0) as u64).unwrap_or(0),
                last_browse: mark.map(|m| m.last_browse_at.to_rfc3339()),
                message,
            };
            queues.push((browsed, entry));
        }
    }
    (queues, addresses.into_iter().collect())
}

const NOT_BROWSED_YET: &str = "not browsed yet by this operator process";

/// Set `sampledQueues` and `addresses` bounded, as taps are (issue 25: a status stays far below
/// etcd's object limit whatever the pattern matches): the counts of all of them, and at most
/// `status::MOST_LISTED` of each listed — the failed browses first, then those not browsed yet.
fn set_sampled_queues(
    status: &mut ArtemisCaptureSubscriptionStatus,
    mut browsed: Vec<(Browsed, SampledQueueStatus)>,
    addresses: Vec<String>,
) {
    let mut counts = SampledQueueCounts::default();
    for (b, _) in &browsed {
        *match b {
            Browsed::Failed => &mut counts.failed,
            Browsed::NotYet => &mut counts.pending,
            Browsed::Succeeded => &mut counts.browsing,
        } += 1;
    }
    browsed.sort_by_key(|(b, _)| *b);
    let mut queues: Vec<SampledQueueStatus> = browsed.into_iter().map(|(_, q)| q).collect();
    status.sampled_queues_omitted = super::status::most_listed(&mut queues);
    status.sampled_queues = queues;
    status.sampled_queue_counts = counts;
    super::status::set_addresses(status, addresses);
}

/// Every condition of a sampling subscription: from the browses' outcomes, then the pause
/// (`held`: the pass held the sweep of the taps it had), then kstatus.
fn set_conditions(status: &mut ArtemisCaptureSubscriptionStatus, s: &ArtemisCaptureSubscription, held: bool) {
    set_sampling_conditions(status, s);
    // Sampling writes nothing to a broker but the sweep of the taps the subscription had.
    let waits = "no tap it had is removed (its browses go on) until the annotation goes";
    super::status::set_paused(status, s, held, waits);
    conditions::kstatus(&mut status.conditions, &[], status.observed_generation);
}

/// Ready, Degraded and Sampling from the browses' outcomes.
fn set_sampling_conditions(status: &mut ArtemisCaptureSubscriptionStatus, s: &ArtemisCaptureSubscription) {
    let generation = status.observed_generation;
    let every = s.spec.sample_interval_seconds;
    let c = status.sampled_queue_counts;
    let (total, failed, browsing) = (c.total(), c.failed, c.browsing);
    let (ready, reason, message) = if total == 0 {
        (
            false,
            "NoMatchingQueues",
            format!(
                "no queue matches {:?} on any live node: nothing to sample yet",
                s.spec.queues
            ),
        )
    } else if browsing == total {
        (
            true,
            "Sampling",
            format!(
                "{total} queue browses succeed (no tap installed); {}",
                claim(every)
            ),
        )
    } else if failed > 0 {
        (
            false,
            "BrowseFailed",
            format!(
                "{failed} of {total} queue browses failed (see sampledQueues[].message); {browsing} succeed"
            ),
        )
    } else {
        (
            false,
            "Pending",
            format!(
                "{} of {total} queues not browsed yet; {browsing} succeed",
                total - browsing
            ),
        )
    };
    let degraded = if failed > 0 {
        (true, "BrowseFailed", format!("{failed} queue browses failed"))
    } else {
        (false, "AsExpected", "no browse failed".to_string())
    };
    let judged = [
        (conditions::READY, (ready, reason, message)),
        (conditions::DEGRADED, degraded),
        (SAMPLING, (true, "Sampled", claim(every))),
    ];
    conditions::set_all(&mut status.conditions, generation, judged);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_thousand_sampled_queues_make_a_bounded_status_that_lists_the_failed_browses_first() {
        let entry = |n: usize, browsed: Browsed, message: Option<&str>| {
            let q = SampledQueueStatus {
                node: "n1".into(),
                queue: format!("orders.{n:05}"),
                address: format!("orders.{n:05}"),
                browsing: browsed == Browsed::Succeeded,
                sampled: 3,
                last_browse: Some("2026-12-02T01:00:00Z".into()),
                message: message.map(str::to_string),
            };
            (browsed, q)
        };
        let mut queues: Vec<(Browsed, SampledQueueStatus)> =
            (0..2_000).map(|n| entry(n, Browsed::Succeeded, None)).collect();
        queues[1_500] = entry(1_500, Browsed::Failed, Some("browse refused: AMQ229032"));
        queues[1_999] = entry(1_999, Browsed::NotYet, Some(NOT_BROWSED_YET));
        let addresses: Vec<String> = queues.iter().map(|(_, q)| q.address.clone()).collect();
        let mut status = ArtemisCaptureSubscriptionStatus::default();
        set_sampled_queues(&mut status, queues, addresses);
        let s: ArtemisCaptureSubscription = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
            "metadata": {"name": "s", "namespace": "ns"},
            "spec": {"clusterRef": {"name": "c"}, "queues": "orders.#", "mode": "Sample"}
        }))
        .expect("subscription");
        set_sampling_conditions(&mut status, &s);

        let c = status.sampled_queue_counts;
        assert_eq!((c.browsing, c.failed, c.pending), (1_998, 1, 1));
        assert_eq!(
            (status.sampled_queues.len(), status.sampled_queues_omitted),
            (100, 1_900)
        );
        assert_eq!(
            (
                status.sampled_queues[0].queue.as_str(),
                status.sampled_queues[1].queue.as_str()
            ),
            ("orders.01500", "orders.01999")
        );
        assert_eq!((status.addresses.len(), status.address_count), (100, 2_000));
        let ready = crate::controllers::conditions::get(&status.conditions, "Ready").expect("Ready");
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            (
                "BrowseFailed",
                "1 of 2000 queue browses failed (see sampledQueues[].message); 1998 succeed"
            )
        );
        let bytes = serde_json::to_vec(&status).expect("json").len();
        assert!(
            bytes < 64 * 1024,
            "{bytes} bytes of status for 2,000 sampled queues"
        );
    }

    #[test]
    fn a_paused_sampling_subscription_says_so_and_a_stale_pause_goes() {
        let sub = |annotations: serde_json::Value| -> ArtemisCaptureSubscription {
            serde_json::from_value(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
                "metadata": {"name": "s", "namespace": "ns", "generation": 2, "annotations": annotations},
                "spec": {"clusterRef": {"name": "c"}, "queues": "orders.#", "mode": "Sample"}
            }))
            .expect("subscription")
        };
        let get = |st: &ArtemisCaptureSubscriptionStatus, t: &str| {
            crate::controllers::conditions::get(&st.conditions, t)
                .map(|c| (c.status.clone(), c.reason.clone()))
                .expect("condition")
        };
        let mut status = ArtemisCaptureSubscriptionStatus {
            observed_generation: Some(2),
            ..Default::default()
        };
        status.sampled_queue_counts.browsing = 3;
        let paused = sub(json!({"artemis-studio.io/paused": "true"}));
        set_conditions(&mut status, &paused, true);
        assert_eq!(get(&status, "Paused"), ("True".into(), "Annotated".into()));
        assert_eq!(get(&status, "Ready"), ("False".into(), "Paused".into()));

        // The annotation gone: Paused is False, not left True; Ready from the browses again.
        set_conditions(&mut status, &sub(json!({})), false);
        assert_eq!(get(&status, "Paused"), ("False".into(), "NotPaused".into()));
        assert_eq!(get(&status, "Ready"), ("True".into(), "Sampling".into()));
    }

    fn target() -> BrowseTarget {
        BrowseTarget {
            queue: "orders.in".into(),
            address: "orders".into(),
            routing_type: "ANYCAST".into(),
        }
    }

    /// As Artemis 2.40 answered `browse(int,int)` over Jolokia on the test bed: a Core text
    /// message, an AMQP one, and a Core bytes one (signed Java bytes).
    fn browsed() -> Vec<Value> {
        vec![
            json!({"address": "orders", "messageID": "109", "priority": 4, "type": 3, "protocol": "CORE",
                   "userID": "ID:2d00e488", "durable": true, "largeMessage": false, "persistentSize": 432,
                   "StringProperties": {"region": "eu", "JMSCorrelationID": "c-1"}, "LongProperties": {"n": 7},
                   "IntProperties": null, "text": "hello \u{e9}", "timestamp": 1796086646490i64}),
            json!({"address": "orders", "messageID": "116", "protocol": "AMQP", "userID": "ID:90c6:1",
                   "StringProperties": {"properties.to": "orders", "applicationProperties.kind": "new"},
                   "ByteProperties": {"messageAnnotations.x-opt-jms-msg-type": 5},
                   "text": "amqp text", "timestamp": 1796086651799i64}),
            json!({"address": "orders", "messageID": "95", "protocol": "CORE", "type": 4,
                   "BodyPreview": [46, -61, -87, 46], "timestamp": 1796086640816i64}),
        ]
    }

    #[test]
    fn only_messages_above_the_high_water_mark_become_rows() {
        let rows = new_rows("n1", &target(), &browsed(), 100, 1024, Some(256));
        let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![109, 116]);
        assert!(new_rows("n1", &target(), &browsed(), 116, 1024, Some(256)).is_empty());
    }

    #[test]
    fn a_row_says_where_the_browse_saw_it_and_what_it_held() {
        let rows = new_rows("n1", &target(), &browsed(), 0, 1024, Some(256));
        let core = &rows[0].1;
        assert_eq!(
            core.original_address, "orders",
            "the queue's address, from the inventory"
        );
        assert_eq!(core.capture_queue, "orders.in", "the browsed queue");
        assert_eq!(core.source_message_id.as_deref(), Some("109"));
        assert_eq!(core.message_id.as_deref(), Some("ID:2d00e488"));
        assert_eq!(core.correlation_id.as_deref(), Some("c-1"));
        assert_eq!(core.properties["region"], "eu");
        assert_eq!(core.properties["n"], 7);
        assert_eq!(core.body_text.as_deref(), Some("hello é"));
        assert!(!core.body_truncated);
        let amqp = &rows[1].1;
        assert_eq!(
            amqp.properties,
            json!({"kind": "new"}),
            "application properties only"
        );
        assert_eq!(amqp.headers["amqp"]["properties.to"], "orders");
        let bytes = &rows[2].1;
        assert_eq!(bytes.body_binary.as_deref(), Some(&[46u8, 0xc3, 0xa9, 46][..]));
        assert!(!bytes.body_truncated);
    }

    #[test]
    fn a_body_the_broker_cut_is_flagged_with_its_full_size() {
        let cut = format!("{}, + 44 more", "x".repeat(256));
        let m = json!({"messageID": "1", "protocol": "CORE", "text": cut});
        let r = row("n1", &target(), 65536, Some(256), &m);
        assert!(r.body_truncated);
        assert_eq!(r.body_text.as_deref().map(str::len), Some(256));
        assert_eq!(r.body_size, 300);
        // A body that merely ends like that, shorter than the limit, is not taken for a cut.
        let m = json!({"messageID": "2", "text": "a, + 3 more"});
        let r = row("n1", &target(), 65536, Some(256), &m);
        assert!(!r.body_truncated);
        assert_eq!(r.body_text.as_deref(), Some("a, + 3 more"));
        // A bytes preview as long as the limit may have been cut.
        let m = json!({"messageID": "3", "BodyPreview": vec![1; 256]});
        assert!(row("n1", &target(), 65536, Some(256), &m).body_truncated);
    }

    #[test]
    fn max_body_bytes_cuts_further_and_says_so() {
        let m = json!({"messageID": "1", "text": "héllo world"});
        let r = row("n1", &target(), 4, Some(256), &m);
        assert!(r.body_truncated);
        assert!(r.body_text.as_deref().is_some_and(|t| t.len() <= 4));
        assert_eq!(r.body_size, "héllo world".len() as i32);
    }

    #[test]
    fn the_claim_is_never_complete() {
        let c = claim(10);
        assert!(c.starts_with("sampled: a browse every 10s sees only what is still on the queue"));
        assert!(c.contains("messages consumed between browses are never seen"));
    }
}
