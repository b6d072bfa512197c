//! The vocabulary every kind shares (ADR-0049, ADR-0057): one per-node outcome shape, one set of
//! refusal kinds, one cluster reference, the field managers writes go under. No I/O.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// API group of every kind.
pub const GROUP: &str = "artemis-studio.io";
/// Annotation that stops every broker write for one object (status says so).
pub const PAUSED_ANNOTATION: &str = "artemis-studio.io/paused";
/// Annotation on a ConnectionClose: its `spec.confirm` counts even when it was set before the
/// consequence was shown (automation that confirms without review; recorded in the audit row).
pub const CONFIRM_WITHOUT_REVIEW_ANNOTATION: &str = "artemis-studio.io/confirm-without-review";
/// Field manager of every write the operator makes.
pub const MANAGER: &str = "artemis-studio-operator";
/// Field manager of every write `kubectl artemis mcp` makes for an agent (issue 48).
pub const MCP_MANAGER: &str = "kubectl-artemis-mcp";

/// The parameters of a patch under `manager`, so `managedFields` names the writer as the owner
/// of what it wrote (a finalizer, a status), not "unknown".
pub fn patch_params_as(manager: &str) -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(manager.to_string()),
        ..kube::api::PatchParams::default()
    }
}

/// The same for a create or a replace (`PUT`).
pub fn post_params_as(manager: &str) -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(manager.to_string()),
        ..kube::api::PostParams::default()
    }
}

/// Every patch the operator sends: under [`MANAGER`].
pub fn patch_params() -> kube::api::PatchParams {
    patch_params_as(MANAGER)
}

/// Every create or replace the operator sends: under [`MANAGER`].
pub fn post_params() -> kube::api::PostParams {
    post_params_as(MANAGER)
}
/// Annotation on an object `kubectl artemis mcp` wrote: the MCP client that asked for the
/// write (its `clientInfo` name and version).
pub const MCP_CLIENT_ANNOTATION: &str = "artemis-studio.io/mcp-client";
/// Annotation beside it: the Kubernetes user the MCP server acted as (the API server's answer
/// to a SelfSubjectReview of its kubeconfig).
pub const MCP_USER_ANNOTATION: &str = "artemis-studio.io/mcp-user";
/// Name prefix reserved to capture subscriptions (ADR-0079 D3 via ADR-0084 §5).
pub const CAPTURE_PREFIX: &str = "artemis-studio.capture.";

/// Which ArtemisCluster (in the object's own namespace) this object acts on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRef {
    /// Name of an ArtemisCluster in the same namespace.
    pub name: String,
}

/// What one command did, or would do, on one logical node (ADR-0049). `ALREADY` is success:
/// the node was already in the requested state. `SKIPPED_NOT_LIVE` is not a failure: the node
/// never received the command.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    WouldApply,
    Applied,
    Already,
    SkippedNotLive,
    Failed,
}

impl Outcome {
    /// The node is in the requested state (or, in a dry run, could be put there).
    pub fn is_success(self) -> bool {
        matches!(self, Outcome::Applied | Outcome::Already | Outcome::WouldApply)
    }
}

/// Why a broker (or the operator, on the broker's behalf) refused a command. Each kind has a
/// message naming the next action: the flag, the field, or the grant.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefusalKind {
    /// The queue has consumers (AMQ229025, or the preflight's ConsumerCount).
    HasConsumers,
    /// The routing type of an existing queue cannot change (AMQ229211).
    RoutingTypeImmutable,
    /// The routing type is not supported by the address (AMQ229207).
    RoutingTypeNotSupported,
    /// The address does not exist (AMQ229203).
    AddressDoesNotExist,
    /// The address exists already (AMQ229204).
    AddressExists,
    /// The address still has bindings (AMQ229205).
    AddressHasBindings,
    /// The queue does not exist (AMQ229017).
    QueueDoesNotExist,
    /// The queue exists already (AMQ229019).
    QueueExists,
    /// max-consumers below the current consumer count (AMQ229210).
    MaxConsumersTooLow,
    /// The divert does not exist (AMQ229012, AMQ229231).
    DivertDoesNotExist,
    /// The name is bound, but not to a divert (AMQ229013).
    NotADivert,
    /// The broker refused the JSON document (AMQ229229).
    InvalidConfiguration,
    /// Authentication or management.xml authorization refused the call.
    NotAuthorized,
    /// Jolokia's access policy (the broker's `jolokia-access.xml`: strict Origin checking, an
    /// https Origin over http, the client address) refused the HTTP request as a whole, before
    /// any MBean: the cluster's `spec.origin` or that file is to change, not the credentials.
    OriginRefused,
    /// The command would destroy more messages or close more connections than the cluster's cap.
    BulkCapExceeded,
    /// An exclusive divert on the source address would starve a capture tap (ADR-0062 D8).
    ExclusiveDivertPresent,
    /// No authority to restrict the capture queue (ADR-0062 D8).
    NoSecurityAuthority,
    /// Nothing consumes at a divert's forwarding address (ADR-0084 §2).
    NothingConsumes,
    /// Another object on the broker already holds this name with a different shape.
    NameConflict,
    /// Another object of ours declares the same broker object; the oldest wins.
    ResourceConflict,
    /// The management endpoint could not be reached.
    Unreachable,
    /// The management call did not answer in time; its effect is unknown.
    Timeout,
    /// The broker accepted the write but a fresh read afterwards shows it did not take effect
    /// (e.g. `updateQueue` ignores `autoDelete`): not re-sent for this generation.
    NotConverging,
    /// Another writer changed the broker object back after this generation's repair (another
    /// operator installation, a script, broker.xml): not written again for this generation, and
    /// not destroyed on delete while contested.
    Contested,
    /// The broker answered something the operator cannot interpret.
    BadResponse,
}

/// One logical node's result for one command. Every mutating kind reports a list of these.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeOutcome {
    /// Logical node: the broker node ID (a primary and its backup share it).
    pub node: String,
    /// The endpoint the command went to (the node's active endpoint at the time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// WOULD_APPLY (dry run), APPLIED, ALREADY (already in the requested state), SKIPPED_NOT_LIVE
    /// (the node never received the command) or FAILED (see refusal and message).
    pub outcome: Outcome,
    /// Why the node refused, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<RefusalKind>,
    /// What happened, for a human: the cause and the next action.
    pub message: String,
    /// Further lines: the fields that differ, the objects removed, warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub detail: Vec<String>,
    /// The last command this node received (kept while later passes find it in the requested
    /// state, or cannot reach it): what was done, by which audit row, when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_command: Option<LastCommand>,
}

/// The last command one node received.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastCommand {
    /// e.g. `queue.apply`, `queue.repair`, `divert.delete`.
    pub command: String,
    /// The `audit_event` row of the command.
    pub audit_id: i64,
    /// The node's outcome of that command.
    pub outcome: Outcome,
    /// When the outcome was recorded (RFC 3339).
    pub at: String,
    /// Fields the broker accepted and did not apply (NOT_CONVERGING): not sent again for this
    /// generation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_applied: Vec<String>,
}

/// Why a plain delete of this object leaves its broker object in place (issue 41): the object
/// did not create it (adopted), or another writer keeps it. Recorded once, kept for the
/// object's life (an operator restart reads it back from status), and never cleared by the
/// operator: destroying the broker object takes `spec.deletion.destroyConfirmation` set to
/// [`NotOwned::confirmation`], written after this was shown.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotOwned {
    /// Nodes where the broker object was found, holding messages or consumers, before this
    /// object first wrote there: it was adopted, not created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adopted: Vec<AdoptedNode>,
    /// Nodes where another writer undid what this object had written (another operator
    /// installation on these brokers, a script, broker.xml).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_writer: Vec<OtherWriterNode>,
    /// When this was first recorded (RFC 3339).
    pub since: String,
    /// The `audit_event` row that recorded the adoption, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_id: Option<i64>,
    /// What `spec.deletion.destroyConfirmation` must say for a delete to destroy the broker
    /// object anyway (the bulk cap still applies).
    pub confirmation: String,
}

/// A node where the broker object existed, in use, before this object wrote to it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptedNode {
    /// Logical node: the broker node ID.
    pub node: String,
    /// Messages it held when found.
    pub message_count: u64,
    /// Consumers attached when found.
    pub consumer_count: u64,
}

/// A node where another writer changed the broker object after this object's write took.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OtherWriterNode {
    /// Logical node: the broker node ID.
    pub node: String,
    /// The fields found changed back.
    pub fields: Vec<String>,
    /// This object's command that was undone (`queue.update`, audit #…).
    pub undone: String,
    /// When it was seen (RFC 3339).
    pub at: String,
}

impl NotOwned {
    /// What a delete says when it leaves the broker object in place.
    pub fn evidence(&self) -> String {
        let mut parts = vec![];
        if !self.adopted.is_empty() {
            let nodes: Vec<String> = self
                .adopted
                .iter()
                .map(|n| {
                    format!(
                        "{} ({} message(s), {} consumer(s))",
                        n.node, n.message_count, n.consumer_count
                    )
                })
                .collect();
            parts.push(format!(
                "adopted, not created by this object: it was found in use on {}",
                nodes.join(", ")
            ));
        }
        if !self.other_writer.is_empty() {
            let nodes: Vec<String> = self
                .other_writer
                .iter()
                .map(|n| {
                    format!(
                        "{} ({} changed back after {}, {})",
                        n.node,
                        n.fields.join(", "),
                        n.undone,
                        n.at
                    )
                })
                .collect();
            parts.push(format!(
                "another writer keeps it as it wants it (another operator installation on these brokers, a script, or broker.xml): {}",
                nodes.join("; ")
            ));
        }
        parts.join("; ")
    }
}

/// What happens to the broker object when the Kubernetes object is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Remove it from every live node (with the checks of ADR-0084).
    #[default]
    Delete,
    /// Leave the broker untouched; only the Kubernetes object goes.
    Retain,
}

pub fn default_true() -> bool {
    true
}
