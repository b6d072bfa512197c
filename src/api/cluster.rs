//! ArtemisCluster: how to reach a cluster's management endpoints, and what the cluster looks
//! like now (ADR-0049: live nodes from polled topology, managementWrite from evidence).

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::Condition;

/// How to reach an Apache ActiveMQ Artemis cluster's Jolokia management endpoints.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "artemis-studio.io",
    version = "v1alpha1",
    kind = "ArtemisCluster",
    namespaced,
    status = "ArtemisClusterStatus",
    shortname = "acl",
    category = "artemis",
    doc = "An Artemis cluster the operator manages: its Jolokia endpoints, credentials and limits. Status shows the live logical nodes and whether management writes are permitted.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Live",
        type_ = "integer",
        json_path = ".status.liveNodes",
        description = "live logical nodes"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        json_path = ".status.totalNodes",
        description = "logical nodes seen"
    ),
    printcolumn(
        name = "Writes",
        type_ = "string",
        json_path = ".status.managementWrite.state",
        description = "management write evidence"
    ),
    printcolumn(
        name = "Held By",
        type_ = "string",
        json_path = ".status.heldBy",
        description = "the operator replica acting for this cluster",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("size(self.brokers) > 0 || has(self.discovery)").message("set spec.brokers (Jolokia URLs) or spec.discovery (a pod selector), or both"))]
pub struct ArtemisClusterSpec {
    /// Static Jolokia endpoints, one per broker process (primary and backup alike), e.g.
    /// `http://broker-0.broker:8161/console/jolokia`.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub brokers: Vec<BrokerEndpoint>,
    /// Discover broker pods by label in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<PodDiscovery>,
    /// Secret holding the management user's credentials.
    pub credentials: CredentialsRef,
    /// TLS for https endpoints: the CA that signed the brokers' certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// Drain captured messages over plain AMQP from brokers that have no TLS acceptor for AMQP,
    /// although this cluster uses TLS (https endpoints or `tls`). Off (the default): such a
    /// broker's taps are not drained and say why — payloads and credentials never travel in
    /// clear unasked (issue 44).
    #[serde(default)]
    pub allow_capture_in_clear: bool,
    /// The `Origin` header sent to Jolokia. Artemis's default strict origin checking refuses a
    /// request without one. Defaults to the endpoint's `scheme://host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// How often the topology and inventory are polled, in seconds.
    #[serde(default = "default_poll_interval")]
    #[schemars(range(min = 1, max = 3600))]
    pub poll_interval_seconds: u32,
    /// How often each node's inventory is read in full, in seconds (issue 45). Between full
    /// reads a poll reads the node's queue and address counts, its divert names and one page of
    /// 500 queues (the next at each poll), and reads in full when the counts differ from what
    /// the operator knows: a setting changed on an existing queue is seen within a round of
    /// pages; a queue removed and another added between two polls, and an address's or a
    /// divert's settings changed behind the operator's back, at the next full read.
    #[serde(default = "default_full_read_interval")]
    #[schemars(range(min = 10, max = 86400))]
    pub full_read_interval_seconds: u32,
    /// Per-request timeout for one management call that writes (and its preflight), in seconds.
    #[serde(default = "default_request_timeout")]
    #[schemars(range(min = 1, max = 300))]
    pub request_timeout_seconds: u32,
    /// Timeout of one poll's reads of a node (identity and inventory), in seconds: the inventory
    /// of thousands of queues takes longer to read than one write. A poll that times out leaves
    /// the last inventory standing, marked stale in status.nodes; objects keep their state.
    #[serde(default = "default_poll_timeout")]
    #[schemars(range(min = 1, max = 600))]
    pub poll_timeout_seconds: u32,
    /// The bulk cap (ADR-0022) on connections: the most connections one command may close. A
    /// ConnectionClose overrides it with `allowBulk`.
    #[serde(default = "default_bulk_cap")]
    #[schemars(range(min = 0))]
    pub bulk_cap: u64,
    /// The bulk cap (ADR-0022) on messages: the most messages one queue delete may destroy
    /// without the object naming the loss in `spec.deletion.allowMessageLoss`. Default 0: a
    /// delete — a GitOps prune included, which nobody watches — destroys no message unless the
    /// object says how many it may (issue 41).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub message_loss_cap: u64,
    /// Where the declared topology lives (ADR-0084 §2): `StudioManaged` (the operator's objects
    /// are the declaration) or `ConfigManaged` (broker.xml rendered from it).
    #[serde(default)]
    pub declaration_mode: DeclarationMode,
    /// The broker role of the credentials' user. Capture queues (ADR-0062 D8) get a security
    /// setting that lets only this role consume and browse them, and no one send to them.
    #[serde(default = "default_capture_role")]
    #[schemars(length(min = 1))]
    pub capture_role: String,
}

pub fn default_capture_role() -> String {
    "amq".into()
}

pub fn default_poll_interval() -> u32 {
    10
}
pub fn default_full_read_interval() -> u32 {
    300
}
pub fn default_request_timeout() -> u32 {
    5
}
pub fn default_poll_timeout() -> u32 {
    30
}
pub fn default_bulk_cap() -> u64 {
    10_000
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
// Issue 44: credentials live in the Secret only; a URL carrying them would be echoed by every
// transport error into status and logs.
#[x_kube(validation = Rule::new("!self.url.matches('^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@')").message("spec.brokers[].url carries credentials (user:password@ before the host): remove them from the URL and put them in the Secret that spec.credentials names"))]
pub struct BrokerEndpoint {
    /// Jolokia URL, e.g. `https://broker-0.broker.ns.svc:8161/console/jolokia`. No user info:
    /// the credentials are in the Secret `credentials` names.
    #[schemars(regex(pattern = r"^https?://"), length(max = 2048))]
    pub url: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodDiscovery {
    /// Labels that select the broker pods (matchLabels) in this namespace.
    pub match_labels: BTreeMap<String, String>,
    /// Jolokia port on each pod.
    #[serde(default = "default_jolokia_port")]
    pub port: u16,
    /// Jolokia path on each pod.
    #[serde(default = "default_jolokia_path")]
    pub path: String,
    /// `http` or `https`.
    #[serde(default = "default_scheme")]
    #[schemars(regex(pattern = r"^https?$"))]
    pub scheme: String,
}

fn default_jolokia_port() -> u16 {
    8161
}
fn default_jolokia_path() -> String {
    "/console/jolokia".into()
}
fn default_scheme() -> String {
    "http".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsRef {
    /// Secret in this namespace.
    pub secret_name: String,
    /// Key of the user name in the Secret.
    #[serde(default = "default_username_key")]
    pub username_key: String,
    /// Key of the password in the Secret.
    #[serde(default = "default_password_key")]
    pub password_key: String,
}

fn default_username_key() -> String {
    "username".into()
}
fn default_password_key() -> String {
    "password".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// Secret in this namespace holding the CA certificate (PEM).
    pub ca_secret_name: String,
    /// Key of the CA certificate in the Secret.
    #[serde(default = "default_ca_key")]
    pub ca_key: String,
}

fn default_ca_key() -> String {
    "ca.crt".into()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeclarationMode {
    #[default]
    StudioManaged,
    ConfigManaged,
}

/// What the operator last saw of the cluster: its logical nodes, which are live, and whether
/// management writes are permitted (from evidence only, ADR-0049).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtemisClusterStatus {
    /// The metadata.generation this status describes; older than metadata.generation while the
    /// operator has not acted on the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready: at least one logical node is live and answers; Degraded: some endpoint does not
    /// answer (the reason names it).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Logical nodes: one per broker node ID, a primary and its backup together.
    #[serde(default)]
    pub nodes: Vec<LogicalNodeStatus>,
    /// Logical nodes live now.
    #[serde(default)]
    pub live_nodes: u32,
    /// Logical nodes seen, live or not.
    #[serde(default)]
    pub total_nodes: u32,
    /// Endpoints that did not answer the last poll, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable_endpoints: Vec<EndpointProblem>,
    /// When the topology was last polled (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_poll_time: Option<String>,
    /// Whether management writes are permitted, from evidence only (ADR-0049).
    #[serde(default)]
    pub management_write: ManagementWrite,
    /// What the operator's connections to the endpoints trust (issue 44): only the CA that
    /// spec.tls names, the system's public roots when it names none, or nothing at all (plain
    /// http: the credentials travel in clear).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<String>,
    /// With several replicas (sharding), the replica holding this cluster (its pod's name, else
    /// its host's): it polls the cluster and reconciles every object that names it; written by
    /// the holder when it takes the cluster. Absent with one leader (the leader acts for all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogicalNodeStatus {
    /// Broker node ID.
    pub node_id: String,
    /// The endpoint commands go to now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_endpoint: Option<String>,
    /// Endpoints of the same node ID that are not active (replicating backups).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standby_endpoints: Vec<String>,
    /// `primary`, `backup` (a backup that is active now, after failover) or `unknown`.
    pub role: String,
    /// In the polled topology and answering now.
    pub live: bool,
    /// Set when the last poll could not read this node's inventory: why. Objects are judged
    /// from the inventory read before it (writes still read or answer for themselves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory_stale: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointProblem {
    /// The Jolokia URL that did not answer.
    pub endpoint: String,
    /// Why, and what to check.
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ManagementWriteState {
    /// No write has been attempted yet.
    #[default]
    Unknown,
    /// A write succeeded.
    Available,
    /// A write was refused for an authorization reason.
    Unavailable,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagementWrite {
    /// UNKNOWN (no write tried yet), AVAILABLE (a write succeeded) or UNAVAILABLE (a write was
    /// refused for authorization).
    pub state: ManagementWriteState,
    /// The write that decided the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<WriteEvidence>,
    /// For UNAVAILABLE: the management.xml `<role-access>` entry that would grant it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WriteEvidence {
    /// When (RFC 3339).
    pub at: String,
    /// The command, e.g. `ArtemisQueue ns/orders create`.
    pub command: String,
    /// The logical node that answered.
    pub node: String,
    /// What the broker said.
    pub message: String,
}
