//! MessageReplay (issue 48, ADR-0062 D4): send a captured message again, once, on one node,
//! after its preview was shown and a person typed the confirmation. One-shot like
//! ConnectionClose: armed by compare-and-swap, never retried.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ClusterRef, Condition, NodeOutcome};

/// The application property every replayed message carries: `namespace/name` of the
/// MessageReplay that sent it.
pub const REPLAY_PROPERTY: &str = "ArtemisStudioReplay";

/// Send one captured message again, as a new message, to an address on one node. Runs once,
/// after `confirm` names the address the preview shows.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "artemis-studio.io",
    version = "v1alpha1",
    kind = "MessageReplay",
    namespaced,
    status = "MessageReplayStatus",
    shortname = "mreplay",
    category = "artemis",
    doc = "A one-shot, confirmed send of a captured message, again, as a new message, to an address on one node.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef.name"),
    printcolumn(name = "Row", type_ = "integer", json_path = ".spec.row"),
    printcolumn(name = "Address", type_ = "string", json_path = ".status.preview.address"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.preview.node"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.clusterRef == oldSelf.clusterRef && self.subscription == oldSelf.subscription && self.row == oldSelf.row && has(self.node) == has(oldSelf.node) && (!has(self.node) || self.node == oldSelf.node) && has(self.address) == has(oldSelf.address) && (!has(self.address) || self.address == oldSelf.address) && has(self.ttlSecondsAfterFinished) == has(oldSelf.ttlSecondsAfterFinished) && (!has(self.ttlSecondsAfterFinished) || self.ttlSecondsAfterFinished == oldSelf.ttlSecondsAfterFinished)").message("a MessageReplay is immutable except spec.confirm: create a new one for another row, node or address"))]
pub struct MessageReplaySpec {
    /// The ArtemisCluster the row was captured on, and the replay is sent to.
    pub cluster_ref: ClusterRef,
    /// The ArtemisCaptureSubscription (in this namespace) that captured the row.
    #[schemars(length(min = 1))]
    pub subscription: String,
    /// The captured row: the ROW column of `kubectl artemis capture search`.
    #[schemars(range(min = 1))]
    pub row: i64,
    /// The logical node (broker node ID, or an endpoint URL) to send on. Default: the node the
    /// row was captured on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The address to send to. Default: the address the row was captured from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The address `status.preview.address` shows, typed after the preview was shown: the
    /// replay is sent only then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm: Option<String>,
    /// Delete this object this many seconds after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReplayPhase {
    #[default]
    Pending,
    AwaitingConfirmation,
    Sending,
    Completed,
    Failed,
}

/// Where the replay is (phase), what it sends (preview) and what happened. Written by the
/// operator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageReplayStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending, AwaitingConfirmation (spec.confirm missing, wrong, or given before the preview
    /// was shown), Sending (armed: the message is being sent), Completed or Failed. Completed
    /// and Failed are final: a replay is never retried.
    #[serde(default)]
    pub phase: ReplayPhase,
    /// Complete: the message was sent; Failed: it was not (or it is unknown whether it was),
    /// and will not be retried.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// What the replay sends, shown before it can be armed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<ReplayPreview>,
    /// The node's outcome of the send (one entry).
    #[serde(default)]
    pub nodes: Vec<NodeOutcome>,
    /// The broker's id of the new message (its internal message ID on that node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_message_id: Option<String>,
    /// The audit_event row of the send (written before the call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_id: Option<i64>,
    /// The operator process that armed the send (by compare-and-swap: exactly one can). A
    /// process that finds `Sending` armed by another waits, then marks it Failed (outcome
    /// unknown) — never sends again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed_by: Option<String>,
    /// When the send was armed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed_at: Option<String>,
    /// The generation at which the preview was last shown: `spec.confirm` counts only when
    /// given after it, unless the object carries `artemis-studio.io/confirm-without-review: "true"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_generation: Option<i64>,
    /// When the replay finished, Completed or Failed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// What happened or what is awaited, for a human: the next action when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What will be sent, stated before the replay can be armed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayPreview {
    /// The logical node the message is sent on.
    pub node: String,
    /// The address it is sent to; spec.confirm must say this.
    pub address: String,
    /// The address the row was captured from.
    pub source_address: String,
    /// How the body is sent: `text`, `bytes` or `empty`.
    pub body: String,
    /// The body's size in bytes as sent.
    pub body_bytes: i64,
    /// The application properties sent, as the strings the broker will hold (the original's,
    /// plus `ArtemisStudioReplay` naming this object).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Whether the body was truncated at capture (a truncated body is never sent).
    pub truncated: bool,
    /// What the replay is and is not, in words: a new message with a new id, durable.
    pub consequence: String,
}
