//! ArtemisQueue: one queue on every live node of a cluster (ADR-0049), deleted with the checks
//! of ADR-0084.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ClusterRef, Condition, DeletionPolicy, NodeOutcome, NotOwned, RefusalKind};

/// A queue the operator keeps on every live node of an ArtemisCluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "artemis-studio.io",
    version = "v1alpha1",
    kind = "ArtemisQueue",
    namespaced,
    status = "ArtemisQueueStatus",
    shortname = "aq",
    category = "artemis",
    doc = "A queue on every live node of an Artemis cluster, with a per-node report and a delete preview.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef.name"),
    printcolumn(name = "Queue", type_ = "string", json_path = ".status.queueName"),
    printcolumn(name = "Routing", type_ = "string", json_path = ".spec.routingType"),
    printcolumn(
        name = "Delivery",
        type_ = "string",
        json_path = ".spec.delivery",
        description = "declared delivery state (empty: left as the broker has it)"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Applied",
        type_ = "string",
        json_path = ".status.nodesSummary",
        description = "nodes in the requested state / live nodes"
    ),
    printcolumn(
        name = "Blocked",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"DeleteBlocked\")].reason",
        description = "why a delete cannot finish (DeleteBlocked's reason; Ready is False with it)"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!(has(self.spec.name) ? self.spec.name : self.metadata.name).matches('[*#]')").message("the queue name (spec.name, or metadata.name when unset) contains '*' or '#', Artemis wildcard characters that management calls would treat as a pattern: choose a name without them"),
    validation = Rule::new("!(has(self.spec.name) ? self.spec.name : self.metadata.name).startsWith('artemis-studio.capture.')").message("the queue name (spec.name, or metadata.name when unset): the prefix artemis-studio.capture. is reserved for capture subscriptions (ADR-0079 D3); choose another name"),
    validation = Rule::new("!has(self.spec.address) || (!self.spec.address.matches('[*#]') && !self.spec.address.startsWith('artemis-studio.capture.'))").message("spec.address contains '*' or '#' (Artemis wildcard characters) or starts with the reserved prefix artemis-studio.capture.: choose another address")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.name) == has(oldSelf.name) && (!has(self.name) || self.name == oldSelf.name)").message("spec.name is immutable: create a new ArtemisQueue for another queue"))]
#[x_kube(validation = Rule::new("has(self.address) == has(oldSelf.address) && (!has(self.address) || self.address == oldSelf.address)").message("spec.address is immutable: create a new ArtemisQueue for another address"))]
pub struct ArtemisQueueSpec {
    /// The ArtemisCluster to act on. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("clusterRef is immutable: create a new object for another cluster"))]
    pub cluster_ref: ClusterRef,
    /// Queue name on the broker. Defaults to metadata.name. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Address the queue is bound to. Defaults to the queue name. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// ANYCAST (point to point) or MULTICAST (a subscription). Immutable: the broker refuses a
    /// change (AMQ229211); create a new queue and move the messages instead.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("routingType is immutable (the broker refuses the change with AMQ229211): create a new queue with the other routing type and move the messages"))]
    pub routing_type: QueueRoutingType,
    /// Message selector (filter string). Editable. Unset leaves the broker's filter as it is
    /// (an adopted queue keeps its own); `""` removes the filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Durable queues survive a broker restart. Used when the queue is created; the broker
    /// cannot change it afterwards.
    #[serde(default = "super::common::default_true")]
    pub durable: bool,
    /// Most consumers at once; -1 for unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers: Option<i32>,
    /// Deliver to one consumer at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<bool>,
    /// Last-value queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_value: Option<bool>,
    /// Property that keys a last-value queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_value_key: Option<String>,
    /// Consumers browse instead of consuming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_destructive: Option<bool>,
    /// Purge messages when the last consumer leaves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge_on_no_consumers: Option<bool>,
    /// A disabled queue receives no routed messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Delivery to consumers (issue 49): `Paused` stops it on every live node with the broker's
    /// own persisted pause (`pause(true)`: a broker restart keeps it; messages keep arriving
    /// and wait), `Active` resumes it. Unset: the operator leaves the broker's pause state as
    /// it is (so upgrading never resumes a queue someone paused by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// Consumers to wait for before dispatching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumers_before_dispatch: Option<i32>,
    /// Milliseconds to wait for consumersBeforeDispatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_before_dispatch: Option<i64>,
    /// Default priority of consumers on this queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_priority: Option<i32>,
    /// Ring queue size; -1 for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == -1 || self > 0").message("spec.ringSize: -1 (not a ring queue) or a positive number of messages"))]
    pub ring_size: Option<i64>,
    /// Rebalance message groups when a consumer is added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_rebalance: Option<bool>,
    /// Number of message-group buckets; -1 for unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_buckets: Option<i32>,
    /// Header key of the first message of a group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_first_key: Option<String>,
    /// Let the broker delete the queue when it is unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_delete: Option<bool>,
    /// Milliseconds unused before auto delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_delete_delay: Option<i64>,
    /// Message count at or below which auto delete may act.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_delete_message_count: Option<i64>,
    /// Never write to the broker: status shows WOULD_APPLY per node and what would change.
    #[serde(default)]
    pub dry_run: bool,
    /// What deleting this object does to the broker.
    #[serde(default)]
    pub deletion: QueueDeletion,
}

/// A queue's declared delivery state (issue 49).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Delivery {
    Active,
    Paused,
}

/// One node's delivery of the queue, as its broker reports it (issue 49).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDelivery {
    /// Logical node: the broker node ID.
    pub node: String,
    pub state: DeliveryState,
}

/// What a node's broker reports of the queue's delivery (`isPaused`, `isPersistedPause`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeliveryState {
    /// Delivering to consumers.
    Active,
    /// Paused, and the broker reports the pause persisted: a broker restart keeps it.
    Paused,
    /// Paused without persistence (`pause()` by hand; a non-durable queue's pause, which is
    /// never persisted): a broker restart resumes delivery.
    PausedNotPersisted,
    /// Paused; the broker does not report whether the pause is persisted (`PersistedPause`
    /// exists from Artemis 2.41; 2.40 has no such attribute).
    PausedPersistenceUnknown,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum QueueRoutingType {
    #[default]
    Anycast,
    Multicast,
}

impl QueueRoutingType {
    pub fn as_broker(self) -> &'static str {
        match self {
            QueueRoutingType::Anycast => "ANYCAST",
            QueueRoutingType::Multicast => "MULTICAST",
        }
    }
}

/// ADR-0084: deleting removes the queue on every live node after a preflight.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueDeletion {
    /// `Delete` removes the queue (and its dependent diverts) from every live node; `Retain`
    /// leaves the broker untouched.
    #[serde(default)]
    pub policy: DeletionPolicy,
    /// Close the queue's consumers to delete it. Without it a node with consumers refuses
    /// (HAS_CONSUMERS).
    #[serde(default)]
    pub disconnect_consumers: bool,
    /// The most messages this delete may destroy, summed over nodes. It replaces the cluster's
    /// bulk cap for this object when larger (it never lowers it): set it to the preview's
    /// `totalMessages` to accept that loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub allow_message_loss: Option<u64>,
    /// Also delete the address when no binding is left on it (never forced).
    #[serde(default)]
    pub remove_empty_address: bool,
    /// A queue this object did not create (found in use before it first wrote there) or that
    /// another writer keeps is released by a plain delete, left on the brokers (issue 41). To
    /// destroy it anyway, set this to `status.notOwned.confirmation`, shown once the operator
    /// recorded why it is not owned; the bulk cap still applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destroy_confirmation: Option<String>,
}

/// What the operator last did on every node, and what deleting the queue would do now. Written
/// by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtemisQueueStatus {
    /// The metadata.generation this status describes; older than metadata.generation while the
    /// operator has not acted on the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready: the queue is in the requested state on every live node; Diverged names the nodes that
    /// are not; DeleteBlocked: a delete waits (the reason says why); Paused: the paused annotation
    /// stops broker writes.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The queue name on the broker (spec.name or metadata.name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
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
    /// What deleting this object would do now (ADR-0084), kept current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_preview: Option<DeletePreview>,
    /// Audit row of the last command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_audit_id: Option<i64>,
    /// Why a plain delete leaves this queue on the brokers: adopted, or kept by another writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_owned: Option<NotOwned>,
    /// Each live node's delivery as its broker reports it (issue 49), whether or not
    /// spec.delivery declares one: a pause or resume made by hand on one node shows as that
    /// node differing from the others, and a pause a broker restart would drop as
    /// `PausedNotPersisted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivery: Vec<NodeDelivery>,
}

/// The blast radius of a delete, per node (ADR-0084 §1–§7).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletePreview {
    /// Per live node: what a delete would destroy and remove.
    pub nodes: Vec<NodeDeletePreview>,
    /// Messages a delete would destroy, summed over live nodes.
    pub total_messages: u64,
    /// The cap they are measured against (the cluster's bulk cap, or allowMessageLoss).
    pub bulk_cap: u64,
    /// The delete would be refused for the bulk cap.
    pub exceeds_bulk_cap: bool,
    /// What a delete would skip or not undo: nodes not live or not read, removed diverts that
    /// broker.xml brings back at the next restart, the bulk cap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// When the counts were read (the cluster's poll); a later read that found exactly the same
    /// preview leaves it as it is. A count that moves within its order of magnitude (0, 1-9,
    /// 10-99, …) does not rewrite status: counts are refreshed when one changes magnitude, when
    /// the preview otherwise changes (nodes, diverts, the bulk cap verdict), or when the object
    /// is reconciled and the counts moved over 5 minutes after this time. A delete never acts on
    /// this preview: its preflight reads every node fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<String>,
}

/// A count's order of magnitude: 0 for 0, 1 for 1-9, 2 for 10-99…
pub fn magnitude(n: u64) -> u64 {
    if n == 0 { 0 } else { u64::from(n.ilog10()) + 1 }
}

impl DeletePreview {
    /// The preview with its counts reduced to their order of magnitude.
    pub fn shape(&self) -> DeletePreview {
        DeletePreview {
            nodes: self
                .nodes
                .iter()
                .map(|n| NodeDeletePreview {
                    message_count: magnitude(n.message_count),
                    consumer_count: magnitude(n.consumer_count),
                    dependent_divert_count: magnitude(n.dependent_divert_count),
                    kept_divert_count: magnitude(n.kept_divert_count),
                    ..n.clone()
                })
                .collect(),
            total_messages: magnitude(self.total_messages),
            read_at: None,
            warnings: vec![],
            ..self.clone()
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDeletePreview {
    /// Logical node: the broker node ID.
    pub node: String,
    /// Messages in the queue on this node: a delete destroys them.
    pub message_count: u64,
    /// Consumers attached on this node: a delete is refused (HAS_CONSUMERS) unless
    /// deletion.disconnectConsumers.
    pub consumer_count: u64,
    /// Diverts a delete removes first (they forward into the queue's address and this is the
    /// last queue bound there): the first [`LISTED_DIVERTS`] in status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependent_diverts: Vec<DivertImpact>,
    /// How many diverts a delete removes on this node, listed or not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dependent_divert_count: u64,
    /// Diverts kept, with the reason: the first [`LISTED_DIVERTS`] in status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_diverts: Vec<DivertImpact>,
    /// How many diverts at the queue's address a delete keeps on this node, listed or not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kept_divert_count: u64,
    /// The refusal a delete would get on this node now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<RefusalKind>,
    /// The refusal's cause and next action, for a human.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Diverts listed per node in a status's delete preview: the rest are counted. A queue that
/// 2,000 diverts forward into must not outgrow what the API server stores (about 1.5 MiB an
/// object); the delete itself always acts on every one, read fresh.
pub const LISTED_DIVERTS: usize = 10;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl NodeDeletePreview {
    /// This preview as status shows it: counts of diverts, the first [`LISTED_DIVERTS`] listed.
    pub fn listed(mut self) -> NodeDeletePreview {
        self.dependent_divert_count = self.dependent_diverts.len() as u64;
        self.kept_divert_count = self.kept_diverts.len() as u64;
        self.dependent_diverts.truncate(LISTED_DIVERTS);
        self.kept_diverts.truncate(LISTED_DIVERTS);
        self
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DivertImpact {
    /// Divert name on the broker.
    pub name: String,
    /// Its source address.
    pub address: String,
    /// Where it forwards to.
    pub forwarding_address: String,
    /// The ArtemisDivert that declares it, if any: its next pass acts again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_by: Option<String>,
    /// Why it is removed or kept, and what comes back.
    pub note: String,
}
