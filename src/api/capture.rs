//! ArtemisCaptureSubscription: complete capture that never blocks a producer (ADR-0062,
//! ADR-0066). Types only; the tap and the drain live in `capture/`.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ClusterRef, Condition, RefusalKind};

/// Capture every message routed to the addresses of the matching queues into Postgres, through a
/// non-exclusive divert into a ring-bounded, operator-owned queue on each live node.
///
/// Opt-in and its own permission (the chart's `capture-writer` ClusterRole, ADR-0062 D1): a
/// subscription CHANGES BROKER ROUTING (the operator adds a divert, a queue, an address setting
/// and a security setting on every live node, and keeps them there on its own schedule) and
/// RETAINS APPLICATION PAYLOAD (every captured message body, up to maxBodyBytes, is stored in
/// Postgres for the retention period).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "artemis-studio.io",
    version = "v1alpha1",
    kind = "ArtemisCaptureSubscription",
    namespaced,
    status = "ArtemisCaptureSubscriptionStatus",
    shortname = "acap",
    category = "artemis",
    doc = "Complete message capture for the addresses of the matching queues: a non-exclusive divert into a ring queue per node, drained into Postgres. It changes broker routing (a divert, a ring queue, an address setting and a security setting per captured address on every live node) and retains application payload in Postgres; creating one is its own permission (capture-writer).",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef.name"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Queues", type_ = "string", json_path = ".spec.queues"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Captured", type_ = "integer", json_path = ".status.captured"),
    printcolumn(name = "Dropped", type_ = "integer", json_path = ".status.droppedEstimate"),
    printcolumn(
        name = "Sampled",
        type_ = "integer",
        json_path = ".status.sampled",
        description = "messages a browse saw (mode Sample): never complete"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ArtemisCaptureSubscriptionSpec {
    /// Capture (the default): a tap per captured address on every live node (a divert into a
    /// ring queue, with its address and security settings), drained into Postgres; complete
    /// within a node's covered window. Sample: the operator installs NO tap and writes nothing
    /// to any broker; every sampleIntervalSeconds it browses (never consumes) each matching
    /// queue on every live node and stores the messages it had not seen before, as rows marked
    /// origin=sampled. A browse sees only what is still on the queue at that instant (at most
    /// the first 200 messages of each queue, bodies as the broker's management preview gives
    /// them, truncated at its management-message-attribute-size-limit): messages consumed
    /// between two browses are never seen, and a sampled tail is never complete (ADR-0062 D3,
    /// D10). Switching to Sample removes this subscription's taps at the next pass; switching
    /// to Capture installs them.
    #[serde(default)]
    pub mode: CaptureMode,
    /// Mode Sample only: seconds between two browses of each matching queue (at least 1). A
    /// shorter interval sees more of a busy queue and costs the brokers more; it never sees
    /// everything.
    #[serde(default = "default_sample_interval")]
    #[schemars(range(min = 1))]
    pub sample_interval_seconds: u32,
    /// The ArtemisCluster to act on. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("clusterRef is immutable: create a new object for another cluster"))]
    pub cluster_ref: ClusterRef,
    /// Queue-name pattern in Artemis wildcard syntax: words separated by `.`, `*` matches one
    /// word, `#` zero or more (e.g. `orders.#`). The captured addresses are the addresses of the
    /// matching queues in the latest inventory of the cluster's nodes (queues under the capture
    /// prefix never match). Capture is address-scoped: a captured message was routed to the
    /// address, not necessarily to a particular queue bound there (ADR-0062 D5).
    #[schemars(length(min = 1))]
    pub queues: String,
    /// Divert filter (Artemis filter syntax, e.g. `region = 'eu'`): only matching messages are
    /// copied. Narrowing capture narrows both the load and the payload retained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Ring size of each capture queue, in messages: when nothing drains it fast enough, the
    /// oldest copy is overwritten first and the producer is never slowed.
    #[serde(default = "default_ring_size")]
    #[schemars(range(min = 1))]
    pub ring_size: i64,
    /// Expiry delay of captured copies on the broker, in seconds: bounds in age what an
    /// abandoned tap holds (copies that carry their own expiration keep it).
    #[serde(default = "default_expiry")]
    #[schemars(range(min = 1))]
    pub expiry_delay_seconds: i64,
    /// Most messages per second stored for this subscription; the excess is dropped and counted.
    #[serde(default = "default_rate")]
    #[schemars(range(min = 1))]
    pub max_ingest_per_second: u32,
    /// Bodies are truncated to this many bytes.
    #[serde(default = "default_body")]
    #[schemars(range(min = 0))]
    pub max_body_bytes: u32,
    /// Most bytes each capture address holds on the broker; above it new copies are dropped
    /// (address-full-policy DROP), never paged and never blocking a producer.
    #[serde(default = "default_buffer")]
    #[schemars(range(min = 1048576))]
    pub max_buffer_bytes: i64,
    /// How long captured messages are kept in Postgres.
    #[serde(default)]
    pub retention: CaptureRetention,
    /// Most taps (captured addresses: each one tap, installed on every live node where the
    /// address exists) this subscription may have. A pattern matching more installs nothing
    /// until it is narrowed or this is raised (condition Ready=False, reason TapCapExceeded);
    /// one that grows past it later keeps its taps and gets no new ones past the cap.
    #[serde(default = "default_max_taps")]
    #[schemars(range(min = 1))]
    pub max_taps: u32,
    /// Arms the subscription after its blast radius was shown (the same "shown, then armed" rule
    /// as a ConnectionClose, ADR-0057): set it to status.preview.confirmation, AFTER the
    /// operator has written that preview. Until then a subscription whose `queues` holds a
    /// wildcard installs nothing. A queue named without wildcards is one address, so its spec is
    /// its own preview and needs no arming; automation that accepts any blast radius annotates
    /// the object `artemis-studio.io/confirm-without-review: "true"` instead (recorded in the
    /// audit rows of its installs). Arming holds for `queues` as armed: changing `queues` shows
    /// a new preview and installs nothing new until it is armed again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm: Option<String>,
}

/// How a subscription records messages.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CaptureMode {
    /// A tap (divert into a ring queue) per captured address per live node, drained into
    /// Postgres: every message routed there while the node is covered.
    #[default]
    Capture,
    /// Browse each matching queue every sampleIntervalSeconds: only what is still on the queue
    /// when the browse runs; nothing is installed on any broker.
    Sample,
}

impl CaptureMode {
    /// As stored in `capture_subscription.mode`.
    pub fn as_db(self) -> &'static str {
        match self {
            CaptureMode::Capture => "capture",
            CaptureMode::Sample => "sample",
        }
    }
}

fn default_max_taps() -> u32 {
    100
}

fn default_sample_interval() -> u32 {
    10
}

fn default_ring_size() -> i64 {
    10_000
}
fn default_expiry() -> i64 {
    3_600
}
fn default_rate() -> u32 {
    1_000
}
fn default_body() -> u32 {
    65_536
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaptureRetention {
    /// Drop captured rows older than this many hours.
    #[serde(default = "default_age")]
    pub max_age_hours: u32,
    /// Drop the oldest partitions above this many bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

impl Default for CaptureRetention {
    fn default() -> Self {
        CaptureRetention {
            max_age_hours: default_age(),
            max_bytes: None,
        }
    }
}

fn default_buffer() -> i64 {
    64 * 1024 * 1024
}

/// The finalizer a subscription carries while its taps may be on a broker: released by the
/// capture pass once every tap is removed (ADR-0062 D6: the sweep is the only removal).
pub const CAPTURE_FINALIZER: &str = "artemis-studio.io/capture-taps";

fn default_age() -> u32 {
    168
}

/// Per address and node, whether the capture tap drains, and what it captured and lost.
/// Written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtemisCaptureSubscriptionStatus {
    /// The metadata.generation this status describes; older than metadata.generation while the
    /// operator has not acted on the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready: every tap is installed and being drained. Degraded: some tap is installed and not
    /// drained, or refused.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The operator instance whose taps these are (their names carry it, ADR-0062 D7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The captured addresses (resolved from the matching queues), sorted; at most
    /// 100 are listed, `addressCount` counts them all.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// How many addresses are captured (listed or not).
    #[serde(default)]
    pub address_count: u64,
    /// One tap per captured address per live node; at most 100 are listed (status is
    /// bounded, whatever the pattern matches), every tap that is not HEALTHY first, and
    /// `tapCounts` counts them all.
    #[serde(default)]
    pub taps: Vec<TapStatus>,
    /// Every tap by state, listed or not.
    #[serde(default)]
    pub tap_counts: TapCounts,
    /// Taps not listed in `taps` (the list is bounded; the capture_tap table in the audit
    /// database has every one).
    #[serde(default)]
    pub taps_omitted: u64,
    /// Messages stored so far, summed over taps.
    #[serde(default)]
    pub captured: u64,
    /// Messages estimated lost so far (ring overwrites, the rate cap, failover windows), summed
    /// over taps.
    #[serde(default)]
    pub dropped_estimate: u64,
    /// The mode this status describes (Capture or Sample).
    #[serde(default)]
    pub mode: Option<CaptureMode>,
    /// Mode Sample: one entry per matching queue per live node, with what its browses stored;
    /// at most 100 are listed (those whose browse failed first, then those not browsed yet),
    /// `sampledQueueCounts` counts them all. Empty in mode Capture.
    #[serde(default)]
    pub sampled_queues: Vec<SampledQueueStatus>,
    /// Mode Sample: every sampled queue (per node) by the state of its latest browse, listed
    /// or not.
    #[serde(default)]
    pub sampled_queue_counts: SampledQueueCounts,
    /// Mode Sample: sampled queues not listed in `sampledQueues` (the list is bounded).
    #[serde(default)]
    pub sampled_queues_omitted: u64,
    /// Messages stored by sampling so far (rows marked origin=sampled), summed over queues and
    /// nodes. What a browse saw, never a count of what was sent.
    #[serde(default)]
    pub sampled: u64,
    /// Mode Capture: what `spec.queues` installs on the brokers now (the blast radius), kept
    /// current; shown before anything is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<CapturePreview>,
    /// How and when the subscription was armed (None: nothing new is installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed: Option<CaptureArming>,
}

/// The blast radius of a subscription: what its pattern makes the operator install.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapturePreview {
    /// The pattern this preview is of (spec.queues when it was computed).
    pub queues: String,
    /// Taps: the captured addresses (each installed on every live node holding it).
    pub taps: u64,
    /// The first captured addresses, sorted (at most 50; `taps` counts them all).
    #[serde(default)]
    pub addresses: Vec<String>,
    /// The live nodes the taps go on.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Broker objects installed in all: a divert, a ring queue, an address setting and a security
    /// setting per captured address per live node holding it.
    pub broker_objects: u64,
    /// Addresses the pattern matches that are never tapped: broker-internal ones
    /// ($.artemis.internal.*, $sys.*, activemq.management*, activemq.notifications) and every
    /// installation's capture prefix (artemis-studio.capture.*). The first 20, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub never_tapped: Vec<String>,
    /// spec.maxTaps when it was computed.
    pub max_taps: u32,
    /// What spec.confirm must say to arm exactly this preview.
    pub confirmation: String,
    /// The metadata.generation at which this preview was shown: spec.confirm counts only when
    /// set at a later generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_generation: Option<i64>,
}

/// How a subscription was armed: from then on its taps follow `queues` (up to spec.maxTaps).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaptureArming {
    /// The pattern armed; a different spec.queues needs arming again.
    pub queues: String,
    /// ConfirmedAfterPreview (spec.confirm, given after the preview was shown),
    /// ConfirmWithoutReview (the annotation) or ExactQueueName (no wildcard: one address).
    pub how: String,
    /// The generation it was armed at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// spec.confirm as it was armed (ConfirmedAfterPreview).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm: Option<String>,
    /// The taps the preview showed when it was armed.
    pub taps: u64,
    /// When (RFC 3339).
    pub at: String,
}

/// What sampling saw of one queue on one node (mode Sample).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SampledQueueStatus {
    /// Logical node: the broker node ID.
    pub node: String,
    /// The browsed queue.
    pub queue: String,
    /// The queue's address.
    pub address: String,
    /// Whether the latest browse of this queue on this node succeeded.
    pub browsing: bool,
    /// Messages stored from this queue's browses on this node (each at most once).
    pub sampled: u64,
    /// When the latest successful browse ran (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_browse: Option<String>,
    /// Why the latest browse failed, when it did, with the next action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Every sampled queue of a subscription (one per queue per live node) by its latest browse.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SampledQueueCounts {
    /// The latest browse succeeded.
    pub browsing: u64,
    /// The latest browse failed (its entry's message says why).
    pub failed: u64,
    /// Not browsed yet by this operator process.
    pub pending: u64,
}

impl SampledQueueCounts {
    pub fn total(&self) -> u64 {
        self.browsing + self.failed + self.pending
    }
}

/// Every tap of a subscription by state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TapCounts {
    /// Installed and being drained.
    pub healthy: u64,
    /// Installed and not drained.
    pub degraded: u64,
    /// Not installed yet.
    pub pending: u64,
    /// Refused by their node.
    pub refused: u64,
}

impl TapCounts {
    pub fn total(&self) -> u64 {
        self.healthy + self.degraded + self.pending + self.refused
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TapState {
    #[default]
    Pending,
    Healthy,
    Degraded,
    Refused,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TapStatus {
    /// The captured (source) address.
    pub address: String,
    /// Logical node: the broker node ID.
    pub node: String,
    /// PENDING (not installed yet), HEALTHY (draining), DEGRADED (installed, not drained) or
    /// REFUSED (see refusal).
    pub state: TapState,
    /// Why the node refused the tap, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<RefusalKind>,
    /// What happened, for a human: the cause and the next action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The capture queue (and address) on the broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_queue: Option<String>,
    /// Messages stored from this tap.
    #[serde(default)]
    pub captured: u64,
    /// Messages estimated lost at this tap.
    #[serde(default)]
    pub dropped_estimate: u64,
    /// When this node's current tap started (RFC 3339): its capture queue was (re-)created then.
    /// Nothing routed to this node before it is captured; a broker restart or a failover starts
    /// a new tap, and the interval in between is a gap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage_start: Option<String>,
}
