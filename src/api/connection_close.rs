//! ConnectionClose: a one-shot, confirmed disconnect (ADR-0057). Identifiers are node-local and
//! ephemeral, so a close by id names its node; only the address close is cluster-wide.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ClusterRef, Condition, NodeOutcome};

/// Disconnect one connection, session or consumer on one node, or every consumer connection of
/// an address cluster-wide. Runs once, after `confirm` names the client the broker reports.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "artemis-studio.io",
    version = "v1alpha1",
    kind = "ConnectionClose",
    namespaced,
    status = "ConnectionCloseStatus",
    shortname = "cclose",
    category = "artemis",
    doc = "A one-shot, confirmed close of a connection, session or consumer (by node), or of an address's consumer connections (cluster-wide).",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef.name"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.target.node"),
    printcolumn(name = "Target", type_ = "string", json_path = ".status.targetDescription"),
    printcolumn(name = "Client", type_ = "string", json_path = ".status.snapshot.clientId"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.clusterRef == oldSelf.clusterRef && self.target == oldSelf.target && self.allowBulk == oldSelf.allowBulk && has(self.ttlSecondsAfterFinished) == has(oldSelf.ttlSecondsAfterFinished) && (!has(self.ttlSecondsAfterFinished) || self.ttlSecondsAfterFinished == oldSelf.ttlSecondsAfterFinished)").message("a ConnectionClose is immutable except spec.confirm: create a new one for another target"))]
pub struct ConnectionCloseSpec {
    /// The ArtemisCluster to act on.
    pub cluster_ref: ClusterRef,
    /// Exactly one target.
    pub target: CloseTarget,
    /// The client ID the broker reports for the target (or its remote address when it reports
    /// none); for an address close, the address. The close runs only when this matches what the
    /// broker reports right before the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm: Option<String>,
    /// Allow an address close above the cluster's bulk cap (connections).
    #[serde(default)]
    pub allow_bulk: bool,
    /// Delete this object this many seconds after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i64>,
}

/// `{node, connectionId}`, `{node, connectionId, sessionId}`, `{node, sessionId, consumerId}`,
/// or `{address}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.address) ? !(has(self.node) || has(self.connectionId) || has(self.sessionId) || has(self.consumerId)) : true").message("spec.target: an address close names only the address"))]
#[x_kube(validation = Rule::new("has(self.address) || has(self.node)").message("spec.target.node is required for a close by id: connection, session and consumer ids are node-local (ADR-0057 D1)"))]
#[x_kube(validation = Rule::new("has(self.address) || has(self.connectionId) || (has(self.sessionId) && has(self.consumerId))").message("spec.target: name exactly one target: {node, connectionId}, {node, connectionId, sessionId}, {node, sessionId, consumerId} or {address}"))]
#[x_kube(validation = Rule::new("!has(self.consumerId) || (has(self.sessionId) && !has(self.connectionId))").message("spec.target: a consumer is named by {node, sessionId, consumerId}"))]
pub struct CloseTarget {
    /// Logical node ID (or an endpoint URL); resolved to its active endpoint at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Connection ID on that node, as the broker lists it (`connectionID` in listConnections).
    /// Alone: close the whole connection; with sessionId: close that session only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_id: Option<String>,
    /// Session ID on that node, as the broker lists it (`sessionID`); with connectionId to close
    /// one session, or with consumerId to name a consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Consumer ID within sessionId, as the broker lists it (`consumerID`, a number): close that
    /// one consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_id: Option<String>,
    /// Close every consumer connection of this address, on every live node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ClosePhase {
    #[default]
    Pending,
    AwaitingConfirmation,
    Closing,
    Completed,
    Failed,
}

/// Where the close is (phase), who it would disconnect or did, and its per-node outcome.
/// Written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionCloseStatus {
    /// The metadata.generation this status describes; older than metadata.generation while the
    /// operator has not acted on the latest spec (e.g. a new spec.confirm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending, AwaitingConfirmation (spec.confirm missing or not what the broker reports), Closing
    /// (armed: the close is being sent), Completed or Failed. Completed and Failed are final: a
    /// close is never retried.
    #[serde(default)]
    pub phase: ClosePhase,
    /// Complete: the close was done (or the target was gone already); Failed: it was not, and will
    /// not be retried.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The target in words, e.g. `session 7 of connection c1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_description: Option<String>,
    /// Who would be (or was) disconnected, as the broker reported right before the close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<TargetSnapshot>,
    /// What closing does to in-flight messages (ADR-0057 D4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consequence: Option<String>,
    /// Per-node outcome of the close (one entry for a close by id).
    #[serde(default)]
    pub nodes: Vec<NodeOutcome>,
    /// The target was gone when re-read right before the close: nothing was closed (ALREADY).
    #[serde(default)]
    pub already_gone: bool,
    /// The audit_event row of the close (written before the call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_id: Option<i64>,
    /// The operator process that armed the close (set with a resourceVersion precondition, so
    /// exactly one process can): a process that finds `Closing` armed by another waits, then
    /// marks it Failed (outcome unknown) — never calls again (ADR-0057 D5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed_by: Option<String>,
    /// When the close was armed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed_at: Option<String>,
    /// The generation at which the target and the consequence were last shown in status. A
    /// `spec.confirm` counts only when given after that (a later generation), unless the
    /// object carries the annotation `artemis-studio.io/confirm-without-review: "true"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_generation: Option<i64>,
    /// When the close finished, Completed or Failed (RFC 3339); ttlSecondsAfterFinished counts from
    /// here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// What happened or what is awaited, for a human: the next action when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetSnapshot {
    /// The client ID the broker reports for the connection; spec.confirm must match it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The client's remote address (host:port); spec.confirm must match it when the broker reports
    /// no client ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_address: Option<String>,
    /// The users the broker reports for the connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// The connection's protocol (CORE, AMQP, OPENWIRE, MQTT, STOMP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Sessions the connection has.
    #[serde(default)]
    pub session_count: u64,
    /// Consumers the close would end.
    #[serde(default)]
    pub consumer_count: u64,
    /// In-flight (delivering) messages across its consumers; absent when not reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight_messages: Option<u64>,
    /// Per node, for an address close: consumer connections it would close.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_node: Vec<NodeConnections>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeConnections {
    /// Logical node: the broker node ID.
    pub node: String,
    /// Consumer connections of the address on this node.
    pub connections: u64,
}
