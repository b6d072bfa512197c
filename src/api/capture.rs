//! ArtemisCaptureSubscription: complete capture that never blocks a producer (ADR-0062,
//! ADR-0066). Types only; the tap and the drain live in `capture/`.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ClusterRef, Condition, RefusalKind};

/// Capture every message routed to the addresses of the matching queues into Postgres, through a
/// non-exclusive divert into a ring-bounded, operator-owned queue on each live node.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "artemis-studio.io",
    version = "v1alpha1",
    kind = "ArtemisCaptureSubscription",
    namespaced,
    status = "ArtemisCaptureSubscriptionStatus",
    shortname = "acap",
    category = "artemis",
    doc = "Complete message capture for the addresses of the matching queues: a non-exclusive divert into a ring queue per node, drained into Postgres.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef.name"),
    printcolumn(name = "Queues", type_ = "string", json_path = ".spec.queues"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Captured", type_ = "integer", json_path = ".status.captured"),
    printcolumn(name = "Dropped", type_ = "integer", json_path = ".status.droppedEstimate"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ArtemisCaptureSubscriptionSpec {
    /// The ArtemisCluster to act on. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("clusterRef is immutable: create a new object for another cluster"))]
    pub cluster_ref: ClusterRef,
    /// Queue-name pattern (`*` any run of characters); the captured addresses are those of the
    /// matching queues in the latest scrape.
    #[schemars(length(min = 1))]
    pub queues: String,
    /// Divert filter: only matching messages are captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Ring size of each capture queue (oldest overwritten first).
    #[serde(default = "default_ring_size")]
    #[schemars(range(min = 1))]
    pub ring_size: i64,
    /// Expiry delay of captured copies on the broker, in seconds.
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
    /// How long captured messages are kept in Postgres.
    #[serde(default)]
    pub retention: CaptureRetention,
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
    /// Ready: every tap is installed and draining.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// One tap per captured address per live node.
    #[serde(default)]
    pub taps: Vec<TapStatus>,
    /// Messages stored so far, summed over taps.
    #[serde(default)]
    pub captured: u64,
    /// Messages estimated lost so far (ring overwrites, the rate cap, failover windows), summed
    /// over taps.
    #[serde(default)]
    pub dropped_estimate: u64,
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
    /// Messages stored from this tap.
    #[serde(default)]
    pub captured: u64,
    /// Messages estimated lost at this tap.
    #[serde(default)]
    pub dropped_estimate: u64,
    /// When this node's tap started draining (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage_start: Option<String>,
}
