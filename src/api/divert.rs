//! ArtemisDivert: a declared divert on every live node. It is the declaration ADR-0084 §2 checks
//! a dependent divert against.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ClusterRef, Condition, DeletionPolicy, NodeOutcome, NotOwned};

/// A divert the operator keeps on every live node of an ArtemisCluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "artemis-studio.io",
    version = "v1alpha1",
    kind = "ArtemisDivert",
    namespaced,
    status = "ArtemisDivertStatus",
    shortname = "adv",
    category = "artemis",
    doc = "A divert on every live node of an Artemis cluster: copies (or moves) messages sent to one address into another.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef.name"),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(name = "Forward", type_ = "string", json_path = ".spec.forwardingAddress"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Applied", type_ = "string", json_path = ".status.nodesSummary"),
    printcolumn(
        name = "Blocked",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"DeleteBlocked\")].reason",
        description = "why a delete cannot finish (DeleteBlocked's reason; Ready is False with it)"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!(has(self.spec.name) ? self.spec.name : self.metadata.name).startsWith('artemis-studio.capture.')").message("the divert name (spec.name, or metadata.name when unset): the prefix artemis-studio.capture. is reserved for capture subscriptions (ADR-0079 D3); choose another name"),
    validation = Rule::new("!(has(self.spec.name) ? self.spec.name : self.metadata.name).matches('[*#]') && !self.spec.address.matches('[*#]') && !self.spec.forwardingAddress.matches('[*#]')").message("a divert name or address contains '*' or '#', Artemis wildcard characters: choose names without them")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.name) == has(oldSelf.name) && (!has(self.name) || self.name == oldSelf.name)").message("spec.name is immutable: create a new ArtemisDivert"))]
pub struct ArtemisDivertSpec {
    /// The ArtemisCluster to act on. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("clusterRef is immutable: create a new object for another cluster"))]
    pub cluster_ref: ClusterRef,
    /// Divert name on the broker. Defaults to metadata.name. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Source address: messages sent here are diverted.
    #[schemars(length(min = 1))]
    pub address: String,
    /// Where the diverted messages go. Something must consume there (a queue bound to it).
    #[schemars(length(min = 1))]
    pub forwarding_address: String,
    /// Only messages matching this filter are diverted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Routing type of the diverted copy: STRIP (the broker's default), PASS, ANYCAST, MULTICAST.
    #[serde(default)]
    pub routing_type: DivertRoutingType,
    /// An exclusive divert moves messages instead of copying them. Immutable: the broker cannot
    /// update it; create a new ArtemisDivert.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("exclusive is immutable (the broker cannot update it): create a new ArtemisDivert"))]
    pub exclusive: bool,
    /// Never write to the broker: status shows WOULD_APPLY per node.
    #[serde(default)]
    pub dry_run: bool,
    /// What deleting this object does to the broker.
    #[serde(default)]
    pub deletion: DivertDeletion,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DivertRoutingType {
    #[default]
    Strip,
    Pass,
    Anycast,
    Multicast,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DivertDeletion {
    /// `Delete` removes the divert from every live node; `Retain` leaves it.
    #[serde(default)]
    pub policy: DeletionPolicy,
    /// A divert another writer keeps is released by a plain delete, left on the brokers
    /// (issue 41). To remove it anyway, set this to `status.notOwned.confirmation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destroy_confirmation: Option<String>,
}

/// What the operator last did on every node. Written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtemisDivertStatus {
    /// The metadata.generation this status describes; older than metadata.generation while the
    /// operator has not acted on the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready: the divert is in the requested state on every live node; Diverged names the nodes
    /// that are not.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Per-node outcome of the last command.
    #[serde(default)]
    pub nodes: Vec<NodeOutcome>,
    /// The generation `nodes` were judged for, when older than `observedGeneration`: a pass that
    /// could not reach the brokers for the latest spec reported it and kept what the nodes last
    /// reported. Absent: the nodes describe `observedGeneration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_generation: Option<i64>,
    /// `applied/total`: nodes in the requested state over live nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_summary: Option<String>,
    /// Audit row of the last command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_audit_id: Option<i64>,
    /// Why a plain delete leaves this divert on the brokers: another writer keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_owned: Option<NotOwned>,
}
