//! The reconcile pipeline of every kind that keeps one broker object on every live node
//! (ArtemisQueue, ArtemisDivert), for apply **and** delete:
//!
//! ```text
//! dereference → plan (pure) → preflight + execute (per node) → status (pure) → report
//! ```
//!
//! A kind implements [`TopologyObject`]: its names, its pure per-node plan, its per-node
//! execute (a fresh read of only the objects it writes, a re-plan on that read, then the write)
//! and its status. Every rule that must hold whatever the kind lives here, once:
//!
//! - no broker write without the ArtemisCluster object and its credentials Secret;
//! - `dryRun` and the paused annotation never write — on delete either (the broker is left as
//!   it is, and an Event says so);
//! - of two objects claiming one broker object on one *broker* cluster (judged by node IDs, not
//!   by namespace), the oldest wins; the other never writes and its delete touches nothing;
//! - a delete releases its finalizer only when no node may still hold what the object owned: a
//!   node not live, timed out or failed keeps it, with a condition naming the node and how to
//!   release the object anyway (`spec.deletion.policy: Retain`);
//! - a delete whose cluster does not exist says how to proceed, and an object that never reached
//!   any cluster is released at once (it never wrote anything).

use crate::crash_window::Window;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Cache;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::command::{self, Scope};
use super::runtime::ClusterRuntime;
use super::{Context, ReconcileError, StatusConditions, actor_of, conditions, is_paused, key, ownership};
use crate::api::cluster::DeclarationMode;
use crate::api::{ClusterRef, Condition, DeletionPolicy, NodeOutcome, NotOwned, Outcome, RefusalKind};
use crate::fanout::{self, NodeFailure, NodeReport, Target};
use crate::store::AuditIntent;
use crate::topology::inventory::NodeInventory;
use crate::topology::{LogicalNode, Topology};

pub const DELETE_BLOCKED: &str = conditions::DELETE_BLOCKED;

/// What one node needs, decided by a pure plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Already in the requested state: nothing to send.
    Nothing { message: String },
    /// A write is needed; `what` says which, `detail` the fields or objects concerned.
    Write { what: String, detail: Vec<String> },
    /// The node refuses (the operator decided, on the broker's behalf): nothing is sent.
    Refuse { kind: RefusalKind, message: String },
}

/// What the plans of a kind may need besides the node's inventory: the declaration ADR-0084 §2
/// checks dependent diverts against, and the cluster's declaration mode.
#[derive(Clone, Debug, Default)]
pub struct PlanFacts {
    /// Broker divert name → the ArtemisDivert (`namespace/name`) that declares it on this
    /// broker cluster.
    pub declared_diverts: BTreeMap<String, String>,
    pub declaration_mode: DeclarationMode,
    /// The cluster's cap on messages one delete may destroy (`messageLossCap`).
    pub message_loss_cap: u64,
    /// This operator's instance ID: which capture taps are ours (ADR-0062 D7).
    pub instance_id: String,
    /// Capture subscription name → its queue pattern, for the live subscriptions on this
    /// cluster (ADR-0084 §5: which taps a queue delete leaves to their subscription).
    pub capture_patterns: BTreeMap<String, String>,
    /// Address → the ArtemisQueue (`namespace/name`) being deleted there on the same brokers:
    /// its delete removes the diverts that forward into it (ADR-0084 §1), so they are not
    /// repaired meanwhile (issue 41, also after a restart in the middle of that delete).
    pub deleting_addresses: BTreeMap<String, String>,
}

/// A delete refused as a whole before anything is sent (e.g. the bulk cap).
#[derive(Clone, Debug)]
pub struct WholeRefusal {
    pub reason: &'static str,
    pub message: String,
}

/// The five accessors every topology kind implements alike, over `spec.cluster_ref`,
/// `spec.dry_run`, `spec.deletion.policy` and `status`: `topology_object_accessors!(StatusType);`
/// inside the kind's `impl TopologyObject`.
macro_rules! topology_object_accessors {
    ($status:ty) => {
        fn cluster_ref(&self) -> &$crate::api::ClusterRef {
            &self.spec.cluster_ref
        }
        fn dry_run(&self) -> bool {
            self.spec.dry_run
        }
        fn deletion_policy(&self) -> $crate::api::DeletionPolicy {
            self.spec.deletion.policy
        }
        fn current_status(&self) -> Option<&$status> {
            self.status.as_ref()
        }
        fn set_status(&mut self, status: $status) {
            self.status = Some(status);
        }
        fn destroy_confirmation(&self) -> Option<&str> {
            self.spec.deletion.destroy_confirmation.as_deref()
        }
    };
}
pub(crate) use topology_object_accessors;

/// A kind that keeps one broker object on every live node.
pub trait TopologyObject:
    Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The broker object the spec asks for, with its names resolved.
    type Desired: Clone + Send + Sync + 'static;
    type Status: StatusConditions + serde::de::DeserializeOwned + Send + Sync;

    /// `queue`, `divert`: the prefix of command names and of messages.
    const NOUN: &'static str;
    const FINALIZER: &'static str;

    fn cluster_ref(&self) -> &ClusterRef;
    fn dry_run(&self) -> bool;
    fn deletion_policy(&self) -> DeletionPolicy;
    fn current_status(&self) -> Option<&Self::Status>;
    fn set_status(&mut self, status: Self::Status);
    /// `spec.deletion.destroyConfirmation`: destroy what is not owned (issue 41).
    fn destroy_confirmation(&self) -> Option<&str>;
    /// The reflector store of this kind (conflicts are judged from memory, never a LIST).
    fn cache(ctx: &Context) -> &Cache<Self>;

    /// The broker object, or why the spec cannot name one (the same rules as admission, for
    /// objects admitted before a rule existed).
    fn desired(&self) -> Result<Self::Desired, String>;
    /// What two objects must not both claim on one broker cluster.
    fn claim(d: &Self::Desired) -> String;
    /// The broker object as the audit row names it.
    fn audit_target(d: &Self::Desired) -> String;
    /// The addresses this object's commands touch (held per process, see `AddressLocks`).
    fn addresses(d: &Self::Desired) -> Vec<String>;
    /// How its commands hold those addresses.
    const ADDRESS_HOLD: super::AddressHold;
    fn apply_params(&self, d: &Self::Desired) -> Value;
    fn delete_params(&self, d: &Self::Desired) -> Value;

    /// plan (pure): what one node needs for the spec, from the node's inventory.
    fn plan_apply(d: &Self::Desired, inv: &NodeInventory) -> Step;
    /// plan (pure): what deleting needs on one node. Ownership lives here: a broker object that
    /// is not this object's (another address, routing type or routing name) is `Nothing`.
    fn plan_delete(d: &Self::Desired, inv: &NodeInventory, facts: &PlanFacts) -> Step;
    /// The fresh read a preflight makes on a node: only what the command touches (for a
    /// delete, also what goes with it: dependent diverts, placed by the node's latest snapshot,
    /// `for_delete`).
    fn read_fresh(
        t: &Target,
        d: &Self::Desired,
        for_delete: Option<&NodeInventory>,
    ) -> impl Future<Output = Result<NodeInventory, crate::broker::BrokerError>> + Send;
    /// A refusal of the delete as a whole, from every node's fresh read (the bulk cap).
    fn refuse_delete(
        &self,
        d: &Self::Desired,
        fresh: &BTreeMap<String, Arc<NodeInventory>>,
        facts: &PlanFacts,
    ) -> Option<WholeRefusal>;

    /// The broker's answer to this node's write is its evidence (issue 23): the write goes out
    /// planned from the snapshot, with no fresh read before it and no verifying read after. True
    /// for a queue create (the broker never skips one silently; "already exists" is an answer);
    /// false where ADR-0049 reads first (an update: read, overlay, send, verify) or the broker can
    /// silently not apply (a divert create).
    fn answer_is_evidence(_d: &Self::Desired, _snapshot: &NodeInventory) -> bool {
        false
    }
    /// The refusal by which the broker says the object already exists: the node is then read
    /// and planned again from what it holds.
    const ALREADY_EXISTS: Option<RefusalKind> = None;

    /// execute on one node, from the preflight's fresh read of it (`before`, or the snapshot
    /// where the answer is the evidence): write. The pipeline verifies the write by another
    /// fresh read unless the answer is the evidence.
    fn apply_on(
        t: Target,
        d: Self::Desired,
        before: Arc<NodeInventory>,
    ) -> impl Future<Output = Result<NodeReport, NodeFailure>> + Send;
    /// execute a delete on one node, from the preflight's fresh read of it (`before`).
    fn delete_on(
        t: Target,
        d: Self::Desired,
        facts: Arc<PlanFacts>,
        before: Arc<NodeInventory>,
    ) -> impl Future<Output = Result<NodeReport, NodeFailure>> + Send;

    /// The broker names the object's plan looks at (`TopologyChange::queue_key` and the
    /// others): a change of any of them concerns it, and the cluster's poll (or a command's
    /// fresh read) triggers it, found through the kind's index of these keys.
    fn touch_keys(d: &Self::Desired) -> Vec<String>;

    /// How this object's broker object is used on a node (messages, consumers): one found in
    /// use where this object never wrote is adopted, not owned (issue 41). None: the kind's
    /// broker object holds nothing a delete would destroy, or is not on the node.
    fn in_use(_d: &Self::Desired, _inv: &NodeInventory) -> Option<ownership::InUse> {
        None
    }

    /// Why this object must not be written now because a delete in progress removes it (a
    /// divert forwarding into a queue being deleted, ADR-0084 §1), or None.
    fn held_by_delete(_d: &Self::Desired, _facts: &PlanFacts) -> Option<String> {
        None
    }

    /// status (pure): the kind's status document from the pass.
    fn status(&self, pass: &Pass<'_, Self>) -> Self::Status;
}

/// Everything a status is computed from.
pub struct Pass<'a, K: TopologyObject> {
    pub generation: Option<i64>,
    pub conditions: Vec<Condition>,
    pub desired: Option<&'a K::Desired>,
    pub nodes: Vec<NodeOutcome>,
    /// The generation `nodes` were judged for, when not `generation` (they were carried).
    pub nodes_generation: Option<i64>,
    pub last_audit_id: Option<i64>,
    /// The cluster's snapshot, when it was reached (for previews).
    pub topology: Option<&'a Topology>,
    pub facts: Option<&'a PlanFacts>,
    /// Why a plain delete leaves the broker object in place (issue 41).
    pub not_owned: Option<NotOwned>,
}

/// Why an object cannot reach its cluster now.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DereferenceError {
    #[error(
        "ArtemisCluster {0} does not exist: create it (and its credentials Secret), or point spec.clusterRef at an existing one"
    )]
    ClusterNotFound(String),
    #[error("ArtemisCluster {0} is not reachable yet: {1}")]
    ClusterNotReady(String, String),
    /// This process has not polled the cluster yet, and its status (from an earlier process)
    /// says it was Ready: nothing is known that would change the object's status.
    #[error("ArtemisCluster {0} has not been polled by this operator process yet")]
    NotYetPolled(String),
    #[error("ArtemisCluster {0}: {1}")]
    CredentialsMissing(String, String),
    #[error("ArtemisCluster {0}: {1}")]
    CredentialsChanged(String, String),
    #[error("ArtemisCluster {0}: {1}")]
    CredentialsRefused(String, String),
    #[error("ArtemisCluster {0}: {1}")]
    OriginRefused(String, String),
}

impl DereferenceError {
    pub fn reason(&self) -> &'static str {
        match self {
            DereferenceError::ClusterNotFound(_) => "ClusterNotFound",
            DereferenceError::ClusterNotReady(..) | DereferenceError::NotYetPolled(_) => "ClusterNotReady",
            DereferenceError::CredentialsMissing(..) => "CredentialsMissing",
            DereferenceError::CredentialsChanged(..) => "CredentialsChanged",
            DereferenceError::CredentialsRefused(..) => "CredentialsRefused",
            DereferenceError::OriginRefused(..) => "OriginRefused",
        }
    }
}

/// What a reconcile needs, read from caches and the cluster's snapshot.
pub struct Dereferenced {
    pub cluster_key: String,
    pub rt: Arc<ClusterRuntime>,
    pub topology: Arc<Topology>,
    pub facts: PlanFacts,
}

/// How a pass may act on the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Write,
    DryRun,
    Paused,
}

impl Gate {
    pub(super) fn of<K: TopologyObject>(obj: &K) -> Gate {
        if obj.dry_run() {
            Gate::DryRun
        } else if is_paused(obj.meta()) {
            Gate::Paused
        } else {
            Gate::Write
        }
    }

    /// The reason Ready gives when this gate held a change back.
    fn held(self) -> Option<conditions::Held> {
        match self {
            Gate::DryRun => Some(conditions::Held::DryRun),
            Gate::Paused => Some(conditions::Held::Paused),
            Gate::Write => None,
        }
    }
}

/// The ArtemisCluster the object names must exist in the cache; its runtime must be resolved.
/// A cluster object that is gone also drops its runtime: nothing keeps writing with cached
/// credentials.
pub fn dereference_cluster(
    ctx: &Context,
    ns: &str,
    cluster: &ClusterRef,
) -> Result<Arc<ClusterRuntime>, DereferenceError> {
    let k = key(ns, &cluster.name);
    let exists = ctx
        .caches
        .clusters
        .get(ns, &cluster.name)
        .is_some_and(|c| c.meta().deletion_timestamp.is_none());
    if !exists {
        ctx.clusters.remove(&k);
        ctx.topologies.remove(&k);
        return Err(DereferenceError::ClusterNotFound(k));
    }
    ctx.clusters.get(&k).ok_or_else(|| {
        if ctx.topologies.get(&k).is_none() && cluster_was_ready(ctx, ns, &cluster.name) {
            return DereferenceError::NotYetPolled(k.clone());
        }
        let why = ctx
            .caches
            .clusters
            .get(ns, &cluster.name)
            .and_then(|c| {
                c.status.as_ref().and_then(|s| {
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == conditions::READY)
                        .map(|c| format!("{} ({})", c.message, c.reason))
                })
            })
            .unwrap_or_else(|| "it has not been polled yet".into());
        DereferenceError::ClusterNotReady(k.clone(), why)
    })
}

/// The cluster object's status says Ready (as the last process that polled it found it).
fn cluster_was_ready(ctx: &Context, ns: &str, cluster: &str) -> bool {
    ctx.caches.clusters.get(ns, cluster).is_some_and(|c| {
        c.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == conditions::READY && c.status == "True")
        })
    })
}

/// Read the cluster's Secrets right before a command: a Secret deleted since the cluster was
/// polled stops every write (its cached copy is never used on its own), and a Secret changed
/// since (rotated or revoked credentials, another CA) stops this command and every other one on
/// the old access: the runtime is dropped and the cluster re-polled with what the Secret holds
/// now, which then triggers its dependents.
pub async fn ensure_credentials(ctx: &Context, ns: &str, cluster: &str) -> Result<(), DereferenceError> {
    let k = key(ns, cluster);
    let c = ctx
        .caches
        .clusters
        .get(ns, cluster)
        .ok_or_else(|| DereferenceError::ClusterNotFound(k.clone()))?;
    // Shared with the commands asking at the same time: a read that began after this one asked
    // (of the spec generation it reads by: the Secrets' names and keys).
    let slot = format!("{k}@{}", c.metadata.generation.unwrap_or_default());
    let read = || async {
        let read = super::access::read_secrets(&ctx.client, ns, &c.spec).await;
        read.map(|m| m.versions).map_err(Arc::new)
    };
    let now = match ctx.secret_reads.read(&slot, read).await {
        Ok(versions) => versions,
        Err(problem) => {
            // Withdrawn (a Secret or a key gone): nothing uses the access read from it.
            if problem.reason != "SecretUnreadable" {
                ctx.clusters.remove(&k);
            }
            let message = format!(
                "{}: nothing is written to the brokers without it",
                problem.message
            );
            return Err(DereferenceError::CredentialsMissing(k, message));
        }
    };
    let Some(rt) = ctx.clusters.get(&k) else {
        return Err(DereferenceError::ClusterNotReady(
            k,
            "it is being polled again".into(),
        ));
    };
    if rt.access.secret_versions == now {
        return Ok(());
    }
    let changed: Vec<&str> = now
        .iter()
        .filter(|(name, version)| rt.access.secret_versions.get(*name) != Some(*version))
        .map(|(name, _)| name.as_str())
        .collect();
    ctx.clusters.remove(&k);
    let _ = ctx
        .triggers
        .clusters
        .send(kube::runtime::reflector::ObjectRef::new(cluster).within(ns));
    Err(DereferenceError::CredentialsChanged(
        k,
        format!(
            "Secret {} changed since the last poll: nothing was sent with what it held before; the cluster is polled again with what it holds now",
            changed.join(", ")
        ),
    ))
}

/// After a cluster's credentials or trust roots changed, or a node came back: every dependent
/// is retried now (its failed nodes' backoff is forgotten: they may have failed for the old
/// credentials, or while the node was away). The ArtemisQueues of `queues_first` (uids) are
/// triggered before the rest.
pub fn retry_dependents_now(ctx: &Context, ns: &str, cluster: &str, queues_first: &BTreeSet<String>) {
    forget_node_backoff::<crate::api::ArtemisQueue>(ctx, ns, cluster);
    forget_node_backoff::<crate::api::ArtemisDivert>(ctx, ns, cluster);
    // Issue 41: the queues a returned node still lacks go to the head of the line, not behind
    // every object's pass that only reports what the catch-up did.
    let cache = crate::api::ArtemisQueue::cache(ctx);
    for o in cache
        .state()
        .iter()
        .filter(|o| o.meta().uid.as_ref().is_some_and(|u| queues_first.contains(u)))
    {
        let _ = ctx
            .triggers
            .queues
            .send(kube::runtime::reflector::ObjectRef::from_obj(o.as_ref()));
    }
    trigger_dependents(
        ctx,
        ns,
        cluster,
        &crate::topology::TopologyChange::everything(),
        None,
    );
}

fn forget_node_backoff<K: TopologyObject>(ctx: &Context, ns: &str, cluster: &str) {
    for o in K::cache(ctx)
        .state()
        .iter()
        .filter(|o| of_cluster(o.as_ref(), ns, cluster))
    {
        ctx.backoff
            .reset(&format!("{}/nodes", o.uid().unwrap_or_default()));
    }
}

/// The object names this ArtemisCluster (namespace and name).
pub(super) fn of_cluster<K: TopologyObject>(o: &K, ns: &str, cluster: &str) -> bool {
    o.namespace().as_deref() == Some(ns) && o.cluster_ref().name == cluster
}

/// The ArtemisDivert objects declaring diverts on the same broker cluster (from the cache).
fn declared_diverts(ctx: &Context, cluster_key: &str) -> BTreeMap<String, String> {
    ctx.caches
        .diverts
        .state()
        .iter()
        .filter(|d| ctx.watches(&d.namespace().unwrap_or_default()))
        .filter(|d| {
            let other = key(&d.namespace().unwrap_or_default(), &d.spec.cluster_ref.name);
            same_brokers(ctx, cluster_key, &other) == Some(true)
        })
        .map(|d| {
            (
                d.spec.name.clone().unwrap_or_else(|| d.name_any()),
                key(&d.namespace().unwrap_or_default(), &d.name_any()),
            )
        })
        .collect()
}

/// The addresses of ArtemisQueues being deleted (their finalizer still held) on the same broker
/// cluster (from the cache): after a restart the object is still there, so this survives one.
fn deleting_addresses(ctx: &Context, cluster_key: &str) -> BTreeMap<String, String> {
    ctx.caches
        .queues
        .state()
        .iter()
        .filter(|q| q.metadata.deletion_timestamp.is_some())
        .filter(|q| ctx.watches(&q.namespace().unwrap_or_default()))
        .filter(|q| {
            let other = key(&q.namespace().unwrap_or_default(), &q.spec.cluster_ref.name);
            same_brokers(ctx, cluster_key, &other) == Some(true)
        })
        .filter_map(|q| {
            let d = q.desired().ok()?;
            Some((d.address, key(&q.namespace().unwrap_or_default(), &q.name_any())))
        })
        .collect()
}

/// Whether two ArtemisClusters reach the same brokers: the same object, or topologies that share
/// a broker node ID. None when one of them has no topology yet.
pub fn same_brokers(ctx: &Context, a: &str, b: &str) -> Option<bool> {
    if a == b {
        return Some(true);
    }
    let (ta, tb) = (ctx.topologies.get(a)?, ctx.topologies.get(b)?);
    let ids: BTreeSet<&str> = ta.nodes.iter().map(|n| n.node_id.as_str()).collect();
    Some(tb.nodes.iter().any(|n| ids.contains(n.node_id.as_str())))
}

/// What an object claims (None: its spec does not validate), for the claim index.
pub fn claim_of<K: TopologyObject>(o: &K) -> Option<String> {
    o.desired().ok().map(|d| K::claim(&d))
}

/// Two objects claiming one broker object on one broker cluster: the oldest wins (creation
/// time, then namespace/name). `Some(winner)` when this object is not the winner. An older
/// claimant whose cluster has no topology yet counts as a winner until it is known.
pub fn conflict_winner<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: &K::Desired,
    cluster_key: &str,
) -> Option<String> {
    let claim = K::claim(d);
    let order = |o: &K| {
        (
            o.meta().creation_timestamp.clone().map(|t| t.0),
            o.namespace().unwrap_or_default(),
            o.name_any(),
        )
    };
    let mine = order(obj);
    K::cache(ctx)
        .claimants(&claim)
        .iter()
        .filter(|o| o.uid() != obj.uid())
        .filter(|o| ctx.watches(&o.namespace().unwrap_or_default()))
        .filter(|o| o.desired().is_ok_and(|od| K::claim(&od) == claim))
        .filter(|o| {
            let other = key(&o.namespace().unwrap_or_default(), &o.cluster_ref().name);
            same_brokers(ctx, cluster_key, &other) != Some(false)
        })
        .filter(|o| order(o) < mine)
        .min_by_key(|o| order(o))
        .map(|w| key(&w.namespace().unwrap_or_default(), &w.name_any()))
}

fn dereference<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
) -> Result<(Arc<ClusterRuntime>, String), DereferenceError> {
    let ns = obj.namespace().unwrap_or_default();
    let rt = dereference_cluster(ctx, &ns, obj.cluster_ref())?;
    Ok((rt, key(&ns, &obj.cluster_ref().name)))
}

pub(super) fn facts(ctx: &Context, cluster_key: &str, rt: &ClusterRuntime) -> PlanFacts {
    PlanFacts {
        declared_diverts: declared_diverts(ctx, cluster_key),
        declaration_mode: rt.declaration_mode,
        message_loss_cap: rt.message_loss_cap,
        instance_id: ctx.instance_id.clone(),
        deleting_addresses: deleting_addresses(ctx, cluster_key),
        capture_patterns: ctx
            .caches
            .subscriptions
            .state()
            .iter()
            .filter(|s| {
                s.metadata.deletion_timestamp.is_none()
                    && key(
                        s.metadata.namespace.as_deref().unwrap_or_default(),
                        &s.spec.cluster_ref.name,
                    ) == cluster_key
            })
            .map(|s| (s.metadata.name.clone().unwrap_or_default(), s.spec.queues.clone()))
            .collect(),
    }
}

/// The cluster's latest snapshot. Only the cluster controller polls (one poll in flight per
/// cluster); a reconcile plans from the snapshot and confirms with a fresh read of its own object.
fn with_topology(
    ctx: &Context,
    rt: Arc<ClusterRuntime>,
    cluster_key: String,
) -> Result<Dereferenced, DereferenceError> {
    let topology = ctx
        .topologies
        .get(&cluster_key)
        .ok_or_else(|| DereferenceError::NotYetPolled(cluster_key.clone()))?;
    // No live node because Jolokia's access policy refused the operator's requests: the
    // cluster's spec.origin (or the broker's jolokia-access.xml), not the credentials.
    if topology.live_nodes().next().is_none()
        && let Some((_, e)) = topology
            .unreachable
            .iter()
            .find(|(_, e)| e.refusal_kind() == crate::api::RefusalKind::OriginRefused)
    {
        return Err(DereferenceError::OriginRefused(
            cluster_key.clone(),
            e.to_string(),
        ));
    }
    // No live node because every endpoint refused the credentials: say that, not "no live node".
    if topology.live_nodes().next().is_none()
        && let Some((url, e)) = topology.unreachable.iter().find(|(_, e)| e.is_authorization())
    {
        return Err(DereferenceError::CredentialsRefused(
            cluster_key.clone(),
            format!(
                "{url} refused the credentials in the cluster's Secret ({e}): fix the Secret or the broker's users"
            ),
        ));
    }
    // No live node because no endpoint answered as a broker (down, or a URL that is not
    // Jolokia): the cluster's cause, not a bare "no live node" (issue 41 item 6).
    if topology.live_nodes().next().is_none() && !topology.unreachable.is_empty() {
        let causes: Vec<String> = topology
            .unreachable
            .iter()
            .map(|(url, e)| format!("{url}: {e}"))
            .collect();
        return Err(DereferenceError::ClusterNotReady(
            cluster_key.clone(),
            format!(
                "no endpoint answered as a live broker ({}): check the ArtemisCluster's spec.brokers (each a Jolokia URL, e.g. http://host:8161/console/jolokia) or spec.discovery, and that the brokers run",
                causes.join("; ")
            ),
        ));
    }
    let facts = facts(ctx, &cluster_key, &rt);
    Ok(Dereferenced {
        cluster_key,
        rt,
        topology,
        facts,
    })
}

/// Trigger every object of this ArtemisCluster that the change concerns (reconcile_on), but
/// `except` (the uid of the object whose write made the change, if any).
pub fn trigger_dependents(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    change: &crate::topology::TopologyChange,
    except: Option<&str>,
) {
    let queues = dependents::<crate::api::ArtemisQueue>(ctx, ns, cluster, change, except);
    let diverts = dependents::<crate::api::ArtemisDivert>(ctx, ns, cluster, change, except);
    tracing::debug!(cluster = %key(ns, cluster), queues = queues.len(), diverts = diverts.len(), ?change, "topology changed");
    for q in queues {
        let _ = ctx.triggers.queues.send(q);
    }
    for d in diverts {
        let _ = ctx.triggers.diverts.send(d);
    }
}

fn dependents<K: TopologyObject>(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    change: &crate::topology::TopologyChange,
    except: Option<&str>,
) -> Vec<kube::runtime::reflector::ObjectRef<K>> {
    let cache = K::cache(ctx);
    let concerned: Vec<Arc<K>> = if change.everything {
        cache.state()
    } else {
        // One lookup per changed name: a command's write changes one or two, and the cost of
        // finding who they concern must not grow with the kind's size (issue 23).
        let keys: std::collections::BTreeSet<(String, String)> = change
            .keys()
            .iter()
            .flat_map(|k| cache.touched.claimants(k))
            .collect();
        keys.iter().filter_map(|(ns, name)| cache.get(ns, name)).collect()
    };
    concerned
        .iter()
        .filter(|o| except.is_none() || o.meta().uid.as_deref() != except)
        .filter(|o| of_cluster(o.as_ref(), ns, cluster))
        .map(|o| kube::runtime::reflector::ObjectRef::from_obj(o.as_ref()))
        .collect()
}

/// The index keys of what an object's plan looks at (none for a spec that does not validate:
/// it plans nothing).
pub fn touch_keys_of<K: TopologyObject>(o: &K) -> Vec<String> {
    o.desired().map(|d| K::touch_keys(&d)).unwrap_or_default()
}

/// A Warning Event when Ready turns False, or says something new while False, in a pass that
/// sent nothing (a node refusing for good, e.g. a routing type the broker cannot change).
async fn announce_not_ready<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    before: Option<&Condition>,
    conds: &[Condition],
) {
    let Some(now) = conditions::get(conds, conditions::READY) else {
        return;
    };
    let same =
        before.is_some_and(|b| b.status == now.status && b.reason == now.reason && b.message == now.message);
    if now.status == "False" && !same {
        ctx.event(
            obj,
            true,
            &now.reason,
            &format!("{}.apply", K::NOUN),
            now.message.clone(),
        )
        .await;
    }
}

/// One planned node outcome.
fn planned(n: &LogicalNode, step: &Step) -> NodeOutcome {
    let base = |outcome, message: String, detail: Vec<String>| NodeOutcome {
        last_command: None,
        node: n.node_id.clone(),
        endpoint: n.active_endpoint().map(str::to_string),
        outcome,
        refusal: None,
        message,
        detail,
    };
    match step {
        Step::Nothing { message } => base(Outcome::Already, message.clone(), vec![]),
        Step::Write { what, detail } => base(Outcome::WouldApply, what.clone(), detail.clone()),
        Step::Refuse { kind, message } => NodeOutcome {
            refusal: Some(*kind),
            ..base(Outcome::Failed, message.clone(), vec![])
        },
    }
}

/// Plan every node of a topology with `plan` on its inventory. A node not live is
/// SKIPPED_NOT_LIVE; a live node whose inventory (or the object's entry in it) could not be read
/// is FAILED and nothing is planned there.
fn plan_nodes(
    topology: &Topology,
    inventories: &BTreeMap<String, Result<Arc<NodeInventory>, NodeOutcome>>,
    plan: impl Fn(&NodeInventory) -> Step,
) -> Vec<(NodeOutcome, bool)> {
    topology
        .nodes
        .iter()
        .map(|n| {
            if !n.is_live() {
                return (fanout::skipped(n), false);
            }
            match inventories.get(&n.node_id) {
                Some(Ok(inv)) => {
                    let step = plan(inv);
                    let write = matches!(step, Step::Write { .. });
                    (planned(n, &step), write)
                }
                Some(Err(failed)) => (failed.clone(), false),
                None => (fanout::inventory_unavailable(n), false),
            }
        })
        .collect()
}

fn snapshot_inventories(topology: &Topology) -> BTreeMap<String, Result<Arc<NodeInventory>, NodeOutcome>> {
    topology
        .nodes
        .iter()
        .filter(|n| n.is_live())
        .map(|n| {
            let inv = n
                .inventory
                .clone()
                .ok_or_else(|| fanout::inventory_unavailable(n));
            (n.node_id.clone(), inv)
        })
        .collect()
}

pub(super) fn intent<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: &K::Desired,
    command: &str,
    params: Value,
) -> AuditIntent {
    let ns = obj.namespace().unwrap_or_default();
    // Kubernetes records who last wrote the spec, not who deleted the object: a delete's actor
    // says exactly that much (the API server's audit log has the deleter).
    let actor = match obj.meta().deletion_timestamp {
        Some(_) => format!(
            "deleter not recorded by Kubernetes (the API server's audit log has it); last spec writer: {}",
            actor_of(obj.meta())
        ),
        None => actor_of(obj.meta()),
    };
    let mut params = params;
    let follows = ctx.take_abandoned(&obj.uid().unwrap_or_default());
    if !follows.is_empty() {
        // The commands of a stopped process on this object, recorded `unknown`: this one acts
        // on what the broker shows now, after them.
        params["follows"] = serde_json::json!(follows);
    }
    AuditIntent {
        instance_id: ctx.instance_id.clone(),
        actor,
        command: command.into(),
        cluster: key(&ns, &obj.cluster_ref().name),
        target: K::audit_target(d),
        object_kind: K::kind(&()).to_string(),
        object_namespace: ns,
        object_name: obj.name_any(),
        object_uid: obj.uid().unwrap_or_default(),
        object_generation: obj.meta().generation,
        params,
    }
}

/// The nodes a plan writes to.
fn write_targets(plan: &[(NodeOutcome, bool)]) -> BTreeSet<String> {
    plan.iter()
        .filter(|(_, w)| *w)
        .map(|(n, _)| n.node.clone())
        .collect()
}

/// Merge executed outcomes over planned ones (nodes that were not written keep their plan).
fn merge(planned: Vec<(NodeOutcome, bool)>, executed: Vec<NodeOutcome>) -> Vec<NodeOutcome> {
    let mut by_node: BTreeMap<String, NodeOutcome> =
        executed.into_iter().map(|n| (n.node.clone(), n)).collect();
    planned
        .into_iter()
        .map(|(p, _)| by_node.remove(&p.node).unwrap_or(p))
        .collect()
}

fn set_paused_condition(conditions_: &mut Vec<Condition>, gate: Gate, generation: Option<i64>) {
    let waits = "no broker writes, on apply or delete; status.nodes shows what would change";
    conditions::set_paused(conditions_, gate == Gate::Paused, waits, generation);
}

/// report: the one place that writes status.
async fn report<K: TopologyObject>(ctx: &Context, obj: &K, pass: Pass<'_, K>) -> Result<(), ReconcileError> {
    let status = obj.status(&pass);
    super::report::write_status(ctx, obj, obj.current_status(), &status).await
}

fn old_conditions<K: TopologyObject>(obj: &K) -> Vec<Condition> {
    obj.current_status()
        .cloned()
        .map(|mut s| std::mem::take(s.conditions_mut()))
        .unwrap_or_default()
}

fn old_not_owned<K: TopologyObject>(obj: &K) -> Option<NotOwned> {
    obj.current_status().and_then(|s| s.not_owned().cloned())
}

fn old_audit<K: TopologyObject>(obj: &K) -> Option<i64> {
    obj.current_status().and_then(|s| s.last_audit_id())
}

/// A pass that stops before the plan: Ready=False with the reason, nothing written. The Event
/// is published only when the reason or message changed (no Event per requeue).
async fn stop<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: Option<&K::Desired>,
    reason: &str,
    message: String,
) -> Result<(), ReconcileError> {
    report_condition(
        ctx,
        obj,
        d,
        (conditions::READY, false),
        reason,
        message,
        None,
        None,
    )
    .await
}

/// Set one condition and report it, the nodes keeping what they last reported (and received)
/// unless given: an error or a blocked delete says nothing new of them. The Event (a Warning,
/// for the kind's apply or delete) is published only when the condition changed.
#[allow(clippy::too_many_arguments)]
async fn report_condition<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: Option<&K::Desired>,
    (type_, status): (&str, bool),
    reason: &str,
    message: String,
    nodes: Option<Vec<NodeOutcome>>,
    last_audit_id: Option<i64>,
) -> Result<(), ReconcileError> {
    let generation = obj.meta().generation;
    let mut conds = old_conditions(obj);
    let shown = if status { "True" } else { "False" };
    let changed = !conds
        .iter()
        .any(|c| c.type_ == type_ && c.reason == reason && c.message == message && c.status == shown);
    conditions::set(&mut conds, type_, status, reason, message.clone(), generation);
    let (nodes, nodes_generation) = match nodes {
        Some(judged) => (judged, None),
        None => carried_nodes(obj.current_status(), generation),
    };
    report(
        ctx,
        obj,
        Pass {
            generation,
            conditions: conds,
            desired: d,
            nodes,
            nodes_generation,
            last_audit_id: last_audit_id.or(old_audit(obj)),
            topology: None,
            facts: None,
            not_owned: old_not_owned(obj),
        },
    )
    .await?;
    if changed {
        let action = if type_ == DELETE_BLOCKED {
            "delete"
        } else {
            "apply"
        };
        ctx.event(obj, true, reason, &format!("{}.{action}", K::NOUN), message)
            .await;
    }
    Ok(())
}

/// The nodes a report keeps when it judged none, and the generation they describe when it is
/// not `generation`: nodes carried from an older generation stay described as such, so a later
/// pass never reads them as this generation's outcomes (issue 41: no other-writer evidence and
/// no repair from a change that was never applied).
fn carried_nodes<S: StatusConditions>(
    old: Option<&S>,
    generation: Option<i64>,
) -> (Vec<NodeOutcome>, Option<i64>) {
    let carried = old.map(|s| s.nodes().to_vec()).unwrap_or_default();
    let judged_for = old.and_then(|s| s.nodes_generation());
    (carried, judged_for.filter(|g| Some(*g) != generation))
}

/// How long a converged object waits before it is looked at again without a trigger (the
/// cluster's poll triggers every object whose broker objects or nodes changed).
pub const RESYNC: Duration = Duration::from_secs(600);

/// What this pass knows from the last one, per node: an APPLIED outcome stays APPLIED while the
/// node is found in the requested state (the next pass's ALREADY never hides what was done), the
/// last command received is carried, and a node not live is described by what it last received.
fn carry_history(old: &[NodeOutcome], nodes: &mut [NodeOutcome], same_generation: bool) {
    for n in nodes.iter_mut() {
        let Some(o) = old.iter().find(|o| o.node == n.node) else {
            continue;
        };
        if same_generation
            && n.outcome == Outcome::Already
            && o.outcome == Outcome::Applied
            && o.endpoint == n.endpoint
        {
            *n = o.clone();
            continue;
        }
        if n.last_command.is_none() {
            n.last_command = o.last_command.clone();
        }
        if n.outcome == Outcome::SkippedNotLive
            && let Some(lc) = &n.last_command
        {
            n.message = format!(
                "{}; it last received {} ({:?}, audit #{}) at {}",
                n.message, lc.command, lc.outcome, lc.audit_id, lc.at
            );
        }
    }
}

/// Whether a write planned on a node is held back, and the outcome the node keeps instead:
/// - a write this generation already made and the broker did not take (NOT_CONVERGING) is not
///   sent again until the spec or the broker object changes (also after the node was down in
///   between: its last command remembers the fields);
/// - a node that failed this generation is retried when its delay is due (`retry_due`), not at
///   every trigger: a refusing node is not written every poll.
fn held_back(
    old: &[NodeOutcome],
    planned: &NodeOutcome,
    same_generation: bool,
    retry_due: bool,
) -> Option<NodeOutcome> {
    let o = old.iter().find(|o| o.node == planned.node)?;
    if !same_generation {
        return None;
    }
    let not_converging = !planned.detail.is_empty();
    if not_converging
        && o.outcome == Outcome::Failed
        && o.refusal == Some(RefusalKind::NotConverging)
        && o.detail == planned.detail
    {
        return Some(o.clone());
    }
    if let Some(lc) = o
        .last_command
        .as_ref()
        .filter(|lc| not_converging && lc.not_applied == planned.detail)
    {
        return Some(NodeOutcome {
            outcome: Outcome::Failed,
            refusal: Some(RefusalKind::NotConverging),
            message: format!(
                "the broker did not apply {} when {} (audit #{}) sent it; not re-sent for this generation: change the spec back, or delete and re-create the object",
                planned.detail.join(", "),
                lc.command,
                lc.audit_id
            ),
            last_command: Some(lc.clone()),
            ..planned.clone()
        });
    }
    if let Some(contested) = contested(o, planned) {
        return Some(contested);
    }
    (o.outcome == Outcome::Failed && !retry_due).then(|| o.clone())
}

/// What a contested node says to do.
const CONTESTED_NEXT: &str = "Not written again for this generation, and a plain delete leaves it on the brokers: decide who owns it, then stop the other writer or change this spec to match";

/// How soon after a repair a change back means another writer (issue 22 item 1).
pub const FLAP_WINDOW: Duration = Duration::from_secs(120);

/// Another writer keeps the broker object as it wants it: this generation's *repair* took on
/// the node, and within [`FLAP_WINDOW`] the broker differs from the spec again (the spec did not
/// change, so someone else changed the broker). Writing again would start a fight — two
/// installations sharing brokers, a script, broker.xml — so the node is not written again for
/// this generation and says which fields, both values, and that another writer is suspected.
/// (A first change behind the operator's back is repaired once, as before.) What this cannot
/// see: the other side of the fight, once this one stops, finds its own value and has no
/// evidence of a second writer.
fn contested(old: &NodeOutcome, planned: &NodeOutcome) -> Option<NodeOutcome> {
    if old.refusal == Some(RefusalKind::Contested) {
        return Some(NodeOutcome {
            message: old.message.clone(),
            ..contested_outcome(planned, old.last_command.clone(), old.message.clone())
        });
    }
    let lc = old.last_command.as_ref()?;
    let repaired = lc.command.ends_with(".repair") && lc.outcome == Outcome::Applied;
    let at = chrono::DateTime::parse_from_rfc3339(&lc.at).ok()?;
    let since = chrono::Utc::now().signed_duration_since(at).to_std().ok()?;
    // Only fields that changed back (an update): a broker object deleted again behind the
    // operator's back is re-created, as before.
    let update = planned.outcome == Outcome::WouldApply && !planned.detail.is_empty();
    if !repaired || since > FLAP_WINDOW || !update {
        return None;
    }
    let message = format!(
        "changed back {}s after {} (audit #{}) repaired it — {}: another writer keeps this broker object as it wants it (another operator installation on these brokers, a script, or broker.xml). {CONTESTED_NEXT}",
        since.as_secs(),
        lc.command,
        lc.audit_id,
        planned.message
    );
    Some(contested_outcome(planned, Some(lc.clone()), message))
}

fn contested_outcome(
    planned: &NodeOutcome,
    last_command: Option<crate::api::LastCommand>,
    message: String,
) -> NodeOutcome {
    NodeOutcome {
        outcome: Outcome::Failed,
        refusal: Some(RefusalKind::Contested),
        message,
        last_command,
        ..planned.clone()
    }
}

pub const NOT_CONVERGING: &str = conditions::NOT_CONVERGING;

fn set_not_converging(conds: &mut Vec<Condition>, nodes: &[NodeOutcome], generation: Option<i64>) {
    let stuck: Vec<String> = nodes
        .iter()
        .filter(|n| n.refusal == Some(RefusalKind::NotConverging))
        .map(|n| format!("{}: {}", n.node, n.detail.join(", ")))
        .collect();
    if !stuck.is_empty() {
        conditions::set(
            conds,
            NOT_CONVERGING,
            true,
            "BrokerDidNotApply",
            format!(
                "the broker accepted the write but did not change {}; not re-sent for this generation: change the spec back, or delete and re-create the object to re-create the broker object",
                stuck.join("; ")
            ),
            generation,
        );
    } else if conds.iter().any(|c| c.type_ == NOT_CONVERGING) {
        conditions::set(
            conds,
            NOT_CONVERGING,
            false,
            "Converging",
            "every write took effect",
            generation,
        );
    }
}

/// The node outcomes of a command, each with the command it received.
pub(super) fn stamp(nodes: &mut [NodeOutcome], command: &str, audit_id: i64) {
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    for n in nodes.iter_mut().filter(|n| n.outcome != Outcome::SkippedNotLive) {
        let not_applied = if n.refusal == Some(RefusalKind::NotConverging) {
            n.detail.clone()
        } else {
            vec![]
        };
        n.last_command = Some(crate::api::LastCommand {
            command: command.to_string(),
            audit_id,
            outcome: n.outcome,
            at: at.clone(),
            not_applied,
        });
    }
}

/// When to look again: a converged object waits for a trigger (or the slow resync); one with a
/// failed node retries after a delay that doubles with each failed pass in a row (from the poll
/// interval up to 5 minutes), so a node that keeps refusing is not written every poll.
fn next_pass(ctx: &Context, retry_key: &str, nodes: &[NodeOutcome], poll_interval: Duration) -> Action {
    let retry = nodes
        .iter()
        .any(|n| n.outcome == Outcome::Failed && n.refusal != Some(RefusalKind::NotConverging));
    if retry {
        let base = poll_interval.max(Duration::from_secs(5));
        // A pass that did not retry (its delay was not due) does not lengthen the delay.
        let delay = ctx
            .backoff
            .remaining(retry_key)
            .unwrap_or_else(|| ctx.backoff.next(retry_key, base, Duration::from_secs(300)));
        Action::requeue(delay)
    } else {
        ctx.backoff.reset(retry_key);
        Action::requeue(RESYNC)
    }
}

/// The object cannot reach its cluster now: its status says why — except on an operator restart,
/// before this process's first poll of a cluster that was Ready, where the status as written
/// stands (issue 23: a restart writes no status for objects whose status is current). The
/// cluster's first poll triggers every object of it.
async fn not_dereferenced<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: &K::Desired,
    e: DereferenceError,
) -> Result<Action, ReconcileError> {
    let current = obj
        .current_status()
        .is_some_and(|s| s.observed_generation() == obj.meta().generation);
    if matches!(e, DereferenceError::NotYetPolled(_)) && current {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    stop(ctx, obj, Some(d), e.reason(), e.to_string()).await?;
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// apply: bring every live node to the spec.
pub async fn apply<K: TopologyObject>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let o = obj.as_ref();
    let (d, deref) = match apply_dereference(&ctx, o).await? {
        ControlFlow::Continue(found) => found,
        ControlFlow::Break(action) => return Ok(action),
    };
    // Issue 41: a node that came back is being sent what it missed; no pass judges the cluster
    // meanwhile (its status would say Ready without that node). The catch-up triggers every
    // object once the node is live.
    if deref.topology.nodes.iter().any(|n| n.catching_up) {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let kind = crate::telemetry::KindLabels {
        kind: K::kind(&()).to_string(),
    };
    ctx.metrics.planned.get_or_create(&kind).inc();
    let history = History::of(o);
    let plan = plan_apply::<K>(&ctx, &d, &deref, &history);
    let gate = Gate::of(o);
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let other_writer = match gate {
        Gate::Write => {
            let planned: Vec<NodeOutcome> = plan.iter().map(|(n, _)| n.clone()).collect();
            ownership::other_writer_nodes(&history.nodes, &planned, history.same_generation, &now)
        }
        _ => vec![],
    };
    let mut last_audit_id = old_audit(o);
    let mut nodes = if !plan.iter().any(|(_, w)| *w) || gate != Gate::Write {
        plan.into_iter().map(|(n, _)| n).collect()
    } else if let Err(e) =
        ensure_credentials(&ctx, &o.namespace().unwrap_or_default(), &o.cluster_ref().name).await
    {
        stop(&ctx, o, Some(&d), e.reason(), e.to_string()).await?;
        return Ok(Action::requeue(Duration::from_secs(10)));
    } else {
        let (nodes, audit) = write::<K>(&ctx, o, &d, &deref, plan, last_audit_id).await?;
        last_audit_id = audit.or(last_audit_id);
        nodes
    };
    carry_history(&history.nodes, &mut nodes, history.same_generation);
    // What a node that came back was sent in bulk for this object (catch_up.rs).
    let uid = o.uid().unwrap_or_default();
    ctx.caught_up
        .report_into(&uid, o.meta().generation, &mut nodes, &mut last_audit_id);
    let not_owned = match gate {
        Gate::Write => record_ownership(&ctx, o, &d, &deref, &history, other_writer, &now).await?,
        _ => old_not_owned(o),
    };
    let outcome = (nodes, last_audit_id, not_owned);
    judge_apply(&ctx, o, &d, &deref, &history, gate, outcome).await
}

/// Issue 41: what this pass learned of ownership, added to the record in status. A broker
/// object found in use where this object never wrote is adopted: one `<kind>.adopt` audit row
/// (no broker write: it records who declared it and what it held) and an Event. Another writer's
/// change is told by an Event. Both are kept for the object's life.
async fn record_ownership<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
    deref: &Dereferenced,
    history: &History,
    other_writer: Vec<crate::api::OtherWriterNode>,
    now: &str,
) -> Result<Option<NotOwned>, ReconcileError> {
    let old = old_not_owned(o);
    let latest = ctx
        .topologies
        .get(&deref.cluster_key)
        .unwrap_or(deref.topology.clone());
    let inventories: BTreeMap<String, Arc<NodeInventory>> = latest
        .live_nodes()
        .filter_map(|n| n.inventory.clone().map(|i| (n.node_id.clone(), i)))
        .collect();
    let adopted = ownership::adopted_nodes(&history.nodes, old.as_ref(), &inventories, |inv| {
        K::in_use(d, inv)
    });
    let new_writer: Vec<_> = other_writer
        .into_iter()
        .filter(|w| {
            !old.as_ref()
                .is_some_and(|r| r.other_writer.iter().any(|x| x.node == w.node))
        })
        .collect();
    if adopted.is_empty() && new_writer.is_empty() {
        return Ok(old);
    }
    let target = K::audit_target(d);
    let mut record = ownership::merged(old.as_ref(), adopted.clone(), new_writer.clone(), now, &target);
    if let Some(r) = record.as_mut().filter(|_| !adopted.is_empty()) {
        let command = format!("{}.adopt", K::NOUN);
        let detail = serde_json::json!({ "adopted": adopted, "brokerWrite": false });
        let id = ctx
            .store
            .audit_intent(&intent(ctx, o, d, &command, detail.clone()))
            .await?;
        ctx.store
            .audit_outcome(id, crate::store::CommandVerdict::Succeeded, &detail)
            .await?;
        r.audit_id = r.audit_id.or(Some(id));
        let m = format!(
            "{target} was already on the brokers and in use: {}. Adopted, not owned (audit #{id}): a plain delete leaves it on the brokers; to destroy it, set spec.deletion.destroyConfirmation: \"{}\"",
            r.evidence(),
            r.confirmation
        );
        ctx.event(o, false, "Adopted", &command, m).await;
    }
    if let Some(r) = record.as_ref().filter(|_| !new_writer.is_empty()) {
        let m = format!(
            "{target}: {}. A plain delete leaves it on the brokers; to destroy it, set spec.deletion.destroyConfirmation: \"{}\"",
            r.evidence(),
            r.confirmation
        );
        ctx.event(o, true, "OtherWriter", &format!("{}.apply", K::NOUN), m)
            .await;
    }
    Ok(record)
}

/// The desired object and its cluster's topology, or why the object cannot be applied now
/// (its status says so): an invalid spec, a cluster not usable, an older object's claim.
async fn apply_dereference<K: TopologyObject>(
    ctx: &Context,
    o: &K,
) -> Result<ControlFlow<Action, (K::Desired, Dereferenced)>, ReconcileError> {
    let d = match o.desired() {
        Ok(d) => d,
        Err(why) => {
            stop(ctx, o, None, "InvalidSpec", why).await?;
            return Ok(ControlFlow::Break(Action::await_change()));
        }
    };
    let (rt, cluster_key) = match dereference(ctx, o) {
        Ok(x) => x,
        Err(e) => return Ok(ControlFlow::Break(not_dereferenced(ctx, o, &d, e).await?)),
    };
    if let Some(winner) = conflict_winner(ctx, o, &d, &cluster_key) {
        let m = format!(
            "{} is declared on the same brokers by the older {} {winner}; this object makes no broker writes, and deleting it leaves the broker untouched: delete it or give it another spec.name",
            K::audit_target(&d),
            K::kind(&())
        );
        stop(ctx, o, Some(&d), "ResourceConflict", m).await?;
        return Ok(ControlFlow::Break(Action::requeue(
            rt.poll_interval.max(Duration::from_secs(10)),
        )));
    }
    let deref = match with_topology(ctx, rt, cluster_key) {
        Ok(deref) => deref,
        Err(e) => return Ok(ControlFlow::Break(not_dereferenced(ctx, o, &d, e).await?)),
    };
    if let Some(why) = K::held_by_delete(&d, &deref.facts) {
        stop(ctx, o, Some(&d), "HeldByDelete", why).await?;
        let again = deref.rt.poll_interval.max(Duration::from_secs(5));
        return Ok(ControlFlow::Break(Action::requeue(again)));
    }
    Ok(ControlFlow::Continue((d, deref)))
}

/// What the last pass reported, for the plan (a write held back) and the report (history).
struct History {
    nodes: Vec<NodeOutcome>,
    same_generation: bool,
    retry_key: String,
}

impl History {
    fn of<K: TopologyObject>(o: &K) -> Self {
        let status = o.current_status();
        History {
            nodes: status.map(|s| s.nodes().to_vec()).unwrap_or_default(),
            same_generation: status.and_then(|s| s.nodes_generation()) == o.meta().generation,
            retry_key: format!("{}/nodes", o.uid().unwrap_or_default()),
        }
    }
}

/// The plan, from the snapshot; a write held back (see `held_back`) is not planned.
fn plan_apply<K: TopologyObject>(
    ctx: &Context,
    d: &K::Desired,
    deref: &Dereferenced,
    history: &History,
) -> Vec<(NodeOutcome, bool)> {
    let planned = plan_nodes(&deref.topology, &snapshot_inventories(&deref.topology), |inv| {
        K::plan_apply(d, inv)
    });
    let plan: Vec<(NodeOutcome, bool)> = planned
        .into_iter()
        .map(|(n, w)| {
            let retry_due = ctx.backoff.due(&history.retry_key);
            match held_back(&history.nodes, &n, history.same_generation, retry_due) {
                Some(kept) if w => (kept, false),
                _ => (n, w),
            }
        })
        .collect();
    tracing::debug!(
        same_generation = history.same_generation,
        old = ?history.nodes.iter().map(|n| (n.outcome, n.refusal, n.detail.clone())).collect::<Vec<_>>(),
        planned = ?plan.iter().map(|(n, w)| (n.outcome, *w, n.detail.clone())).collect::<Vec<_>>(),
        "plan"
    );
    plan
}

/// Conditions from the nodes' outcomes, a new refusal told once, the next pass, and the report.
async fn judge_apply<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
    deref: &Dereferenced,
    history: &History,
    gate: Gate,
    (nodes, last_audit_id, not_owned): (Vec<NodeOutcome>, Option<i64>, Option<NotOwned>),
) -> Result<Action, ReconcileError> {
    let generation = o.meta().generation;
    let mut conds = old_conditions(o);
    set_paused_condition(&mut conds, gate, generation);
    let before = conditions::get(&conds, conditions::READY).cloned();
    conditions::from_outcomes(&mut conds, &nodes, generation, gate.held(), K::NOUN);
    set_not_converging(&mut conds, &nodes, generation);
    if last_audit_id == old_audit(o) {
        // No command (which has its own Event): a new refusal is still told once.
        announce_not_ready::<K>(ctx, o, before.as_ref(), &conds).await;
    }
    let next = next_pass(ctx, &history.retry_key, &nodes, deref.rt.poll_interval);
    let topology = ctx
        .topologies
        .get(&deref.cluster_key)
        .unwrap_or(deref.topology.clone());
    let pass = Pass {
        generation,
        conditions: conds,
        desired: Some(d),
        nodes,
        nodes_generation: None,
        last_audit_id,
        topology: Some(&topology),
        facts: Some(&deref.facts),
        not_owned,
    };
    report(ctx, o, pass).await?;
    Ok(next)
}

/// The nodes to write, re-planned where a fresh read is the evidence (ADR-0049: an update reads
/// first; the snapshot may predate a write, ours or someone else's: no audited no-op commands).
/// Where the write's answer is the evidence, the snapshot stands (issue 23). Returns the plan and
/// what each written node is planned from.
async fn preflight_apply<K: TopologyObject>(
    deref: &Dereferenced,
    d: &K::Desired,
    plan: Vec<(NodeOutcome, bool)>,
) -> (Vec<(NodeOutcome, bool)>, BTreeMap<String, Planned>) {
    let snapshot = snapshot_inventories(&deref.topology);
    let mut from: BTreeMap<String, Planned> = BTreeMap::new();
    let mut to_read: BTreeSet<String> = BTreeSet::new();
    for node in write_targets(&plan) {
        match snapshot.get(&node) {
            Some(Ok(inv)) if K::answer_is_evidence(d, inv) => {
                from.insert(node, Planned::Snapshot(inv.clone()));
            }
            _ => {
                to_read.insert(node);
            }
        }
    }
    let fresh = fresh_reads::<K>(deref, d, &to_read, false).await;
    let plan = plan
        .into_iter()
        .map(|(n, w)| {
            let node = deref.topology.nodes.iter().find(|x| x.node_id == n.node);
            match (w, fresh.get(&n.node), node) {
                (true, Some(Ok(inv)), Some(node)) => {
                    let step = K::plan_apply(d, inv);
                    from.insert(n.node.clone(), Planned::Fresh(inv.clone()));
                    (planned(node, &step), matches!(step, Step::Write { .. }))
                }
                (true, Some(Err(failed)), _) => (failed.clone(), false),
                (w, _, _) => {
                    let write = w && from.contains_key(&n.node);
                    (n, write)
                }
            }
        })
        .collect();
    (plan, from)
}

/// What a node's write is planned from.
#[derive(Clone)]
pub(super) enum Planned {
    /// The preflight's fresh read: the write is verified by another one.
    Fresh(Arc<NodeInventory>),
    /// The cluster's snapshot: the write's answer is the evidence.
    Snapshot(Arc<NodeInventory>),
}

impl Planned {
    fn inventory(&self) -> Arc<NodeInventory> {
        match self {
            Planned::Fresh(i) | Planned::Snapshot(i) => i.clone(),
        }
    }
}

/// preflight + command + evidence: a command only for a difference the evidence confirms; each
/// write read back where the ADRs require it, and one the broker did not take is FAILED as
/// NOT_CONVERGING with the fields named. Every read and every answer that shows the broker's
/// state lands in the cluster's snapshot. Returns the node outcomes and the audit row, if a
/// command was sent.
async fn write<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: &K::Desired,
    deref: &Dereferenced,
    plan: Vec<(NodeOutcome, bool)>,
    last_audit_id: Option<i64>,
) -> Result<(Vec<NodeOutcome>, Option<i64>), ReconcileError> {
    // The fresh reads, the writes and their verification see one state of these addresses.
    let _held = ctx
        .address_locks
        .hold(&deref.cluster_key, &K::addresses(d), K::ADDRESS_HOLD)
        .await;
    let (plan, from) = preflight_apply::<K>(deref, d, plan).await;
    let seen: Arc<std::sync::Mutex<BTreeMap<String, Arc<NodeInventory>>>> = Arc::new(std::sync::Mutex::new(
        from.iter()
            .filter(|(_, p)| matches!(p, Planned::Fresh(_)))
            .map(|(n, p)| (n.clone(), p.inventory()))
            .collect(),
    ));
    let targets: BTreeSet<String> = write_targets(&plan);
    if targets.is_empty() {
        // The fresh reads found nothing to do (or a refusal): no command, no audit row.
        overlay_seen(ctx, &deref.cluster_key, &seen, obj.meta().uid.as_deref());
        return Ok((plan.into_iter().map(|(n, _)| n).collect(), None));
    }
    let (command_name, repair) = apply_command(obj, &targets, last_audit_id);
    // A create on every node it goes to: its status and audit row say so, no Event.
    let creates_only = !repair && from.values().all(|p| matches!(p, Planned::Snapshot(_)));
    let mut params = obj.apply_params(d);
    params["plan"] = serde_json::to_value(plan.iter().map(|(n, _)| n).collect::<Vec<_>>())?;
    let ns = obj.namespace().unwrap_or_default();
    let intent = intent(ctx, obj, d, &command_name, params);
    let from = Arc::new(from);
    let scope = Scope {
        cluster_ns: &ns,
        cluster_name: &obj.cluster_ref().name,
        topology: &deref.topology.restricted_to(&targets),
        timeout: deref.rt.request_timeout * 3,
    };
    let existed = Arc::new(AtomicBool::new(false));
    let told = scope.told(obj);
    let told = if creates_only {
        told.unless_created(&existed)
    } else {
        told
    };
    let mut result = command::execute(ctx, told, scope.topology, scope.timeout, intent, |t| {
        let (d, from, seen, existed) = (d.clone(), from.clone(), seen.clone(), existed.clone());
        async move {
            crate::crash_window::hold_all_but_first_node().await;
            let planned = from.get(&t.node_id).cloned();
            let planned = planned.unwrap_or_else(|| Planned::Fresh(Default::default()));
            apply_with_evidence::<K>(t, d, planned, &seen, &existed).await
        }
    })
    .await?;
    let audit_id = result.audit_id;
    overlay_seen(ctx, &deref.cluster_key, &seen, obj.meta().uid.as_deref());
    stamp(&mut result.nodes, &command_name, audit_id);
    Ok((merge(plan, result.nodes), Some(audit_id)))
}

/// The name of a write to `targets` (`<kind>.repair` where each target held what this
/// generation's last command put there, else `<kind>.apply`) and whether it repairs.
pub(super) fn apply_command<K: TopologyObject>(
    obj: &K,
    targets: &BTreeSet<String>,
    last_audit_id: Option<i64>,
) -> (String, bool) {
    let status = obj.current_status();
    let old_nodes = status.map(|s| s.nodes()).unwrap_or_default();
    let before: Vec<Option<Outcome>> = targets
        .iter()
        .map(|t| old_nodes.iter().find(|n| &n.node == t).map(|n| n.outcome))
        .collect();
    let old_generation = status.and_then(|s| s.nodes_generation());
    let repair = command::is_repair(old_generation, obj.meta().generation, last_audit_id, &before);
    (command::apply_or_repair(K::NOUN, repair), repair)
}

/// One node's write and its evidence: the answer where it is the evidence (an "already exists"
/// answer is read and planned again from what the node holds, and `existed` set), else a
/// verifying fresh read.
pub(super) async fn apply_with_evidence<K: TopologyObject>(
    t: Target,
    d: K::Desired,
    planned: Planned,
    seen: &std::sync::Mutex<BTreeMap<String, Arc<NodeInventory>>>,
    existed: &AtomicBool,
) -> Result<NodeReport, NodeFailure> {
    let record = |inv: &Arc<NodeInventory>| {
        if let Ok(mut m) = seen.lock() {
            m.insert(t.node_id.clone(), inv.clone());
        }
    };
    match planned {
        Planned::Fresh(inv) => {
            let report = K::apply_on(t.clone(), d.clone(), inv.clone()).await?;
            verify::<K>(&t, &d, report, &inv, seen).await
        }
        Planned::Snapshot(inv) => match K::apply_on(t.clone(), d.clone(), inv).await {
            Ok(report) => {
                if let Some(answer) = &report.seen {
                    record(answer);
                }
                Ok(report)
            }
            Err(f) if K::ALREADY_EXISTS.is_some_and(|k| f.error.refusal_kind() == k) => {
                // Made behind the snapshot's back (another writer, or a poll not yet seen):
                // read that object and judge it as an update would be.
                existed.store(true, Ordering::Relaxed);
                let fresh = Arc::new(K::read_fresh(&t, &d, None).await?);
                record(&fresh);
                let report = K::apply_on(t.clone(), d.clone(), fresh.clone()).await?;
                verify::<K>(&t, &d, report, &fresh, seen).await
            }
            Err(f) => Err(f),
        },
    }
}

/// Lay what the command saw (fresh reads, answers) over the cluster's snapshot.
fn overlay_seen(
    ctx: &Context,
    cluster_key: &str,
    seen: &std::sync::Mutex<BTreeMap<String, Arc<NodeInventory>>>,
    writer: Option<&str>,
) {
    let seen = seen.lock().map(|m| m.clone()).unwrap_or_default();
    overlay_snapshot(ctx, cluster_key, &seen, writer);
}

/// Verify one write by a fresh read of the object: the plan on it must find nothing left to do.
async fn verify<K: TopologyObject>(
    t: &Target,
    d: &K::Desired,
    report: NodeReport,
    before: &NodeInventory,
    verified: &std::sync::Mutex<BTreeMap<String, Arc<NodeInventory>>>,
) -> Result<NodeReport, NodeFailure> {
    if report.outcome != Outcome::Applied {
        return Ok(report);
    }
    let after = match K::read_fresh(t, d, None).await {
        Ok(inv) => Arc::new(inv),
        Err(e) => {
            return Ok(NodeReport {
                message: format!(
                    "{} (not verified: the read afterwards failed: {e})",
                    report.message
                ),
                ..report
            });
        }
    };
    if let Ok(mut v) = verified.lock() {
        v.insert(t.node_id.clone(), after.clone());
    }
    match K::plan_apply(d, &after) {
        Step::Nothing { .. } => Ok(report),
        // The broker holds neither what it held before nor what was sent: someone else wrote
        // in between (issue 22 item 1), not a field Artemis ignores.
        Step::Write { what, detail } if !matches!(K::plan_apply(d, before), Step::Write { what: was, .. } if was == what) => {
            Err(NodeFailure {
                message: Some(format!(
                    "the broker took the write ({}), and a fresh read right after shows another value ({what}): another writer changed it in between (another operator installation on these brokers, a script). {CONTESTED_NEXT}",
                    report.message
                )),
                detail,
                error: crate::broker::BrokerError::refused(
                    RefusalKind::Contested,
                    format!("{what} changed by another writer"),
                ),
            })
        }
        Step::Write { what, detail } => Err(NodeFailure {
            message: Some(format!(
                "the broker accepted the write ({}) but a fresh read shows it did not take effect ({what}): Artemis does not apply this change to an existing object. Not re-sent for this generation: change the spec back, or delete and re-create the object",
                report.message
            )),
            detail,
            error: crate::broker::BrokerError::refused(
                RefusalKind::NotConverging,
                format!("{what} did not take effect"),
            ),
        }),
        Step::Refuse { kind, message } => Err(fanout::refuse(kind, message)),
    }
}

/// Lay fresh reads over the cluster's snapshot, and trigger the other objects they concern (a
/// divert written into a queue's address changes that queue's delete preview): the poll that
/// follows finds nothing new, so it would not.
fn overlay_snapshot(
    ctx: &Context,
    cluster_key: &str,
    reads: &BTreeMap<String, Arc<NodeInventory>>,
    writer: Option<&str>,
) {
    if reads.is_empty() {
        return;
    }
    let change = ctx.topologies.update(cluster_key, |t| {
        let next = t.overlaid(reads);
        let change = crate::topology::changes(Some(t), &next);
        (next, change)
    });
    if let (Some(change), Some((ns, cluster))) = (change, cluster_key.split_once('/'))
        && !change.is_empty()
    {
        trigger_dependents(ctx, ns, cluster, &change, writer);
    }
}

/// A delete that leaves the broker untouched: the finalizer goes, an Event says why.
async fn release<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    reason: &str,
    message: String,
) -> Result<Action, ReconcileError> {
    ctx.event(obj, false, reason, &format!("{}.delete", K::NOUN), message)
        .await;
    Ok(Action::await_change())
}

/// A delete whose cluster cannot be used, of an object that never reached a broker: nothing of
/// its own is on any broker, so it is released without a write.
async fn release_never_applied<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    why: &DereferenceError,
) -> Result<Action, ReconcileError> {
    let message = format!("{why}; this object never reached a broker: nothing to remove");
    release(ctx, obj, "NeverApplied", message).await
}

/// A delete that cannot finish now: DeleteBlocked names why and how to proceed; the finalizer
/// stays. The Event is published only when the condition changed.
async fn block<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: Option<&K::Desired>,
    reason: &str,
    message: String,
    nodes: Option<Vec<NodeOutcome>>,
    last_audit_id: Option<i64>,
) -> Result<Action, ReconcileError> {
    let cond = (DELETE_BLOCKED, true);
    report_condition(ctx, obj, d, cond, reason, message.clone(), nodes, last_audit_id).await?;
    Err(ReconcileError::DeleteRefused(message))
}

/// A delete that cannot reach the brokers because the ArtemisCluster or its credentials Secret
/// is gone, in a namespace being deleted (a GitOps prune of the whole namespace, which deletes
/// the Secret and the cluster — neither has a finalizer — alongside the queues): nothing can be
/// created there any more, so waiting for the cluster to be restored would hold the namespace
/// `Terminating` forever. The object is released and the broker left as it is, as with
/// `Retain`: nothing is destroyed that could not be checked (the bulk cap, consumers) first.
/// `None` when the namespace is not being deleted (or cannot be read): the delete blocks.
async fn release_if_namespace_deleted<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: &K::Desired,
    why: &DereferenceError,
) -> Option<Result<Action, ReconcileError>> {
    let ns = obj.namespace().unwrap_or_default();
    if !super::namespace_being_deleted(&ctx.client, &ns).await {
        return None;
    }
    let message = format!(
        "{why}. Namespace {ns} is being deleted, so neither can come back: released without a broker write; {} is left on the brokers as it is",
        K::audit_target(d)
    );
    tracing::warn!(kind = K::NOUN, object = %obj.name_any(), namespace = %ns, "{message}");
    Some(release(ctx, obj, "NamespaceDeleted", message).await)
}

const RELEASE_HINT: &str =
    "To release this object and leave the broker as it is, set spec.deletion.policy: Retain";

/// cleanup: the delete of every kind. Releases the finalizer only when no node may still hold
/// what the object owned.
pub async fn cleanup<K: TopologyObject>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let o = obj.as_ref();
    let d = match delete_gate(&ctx, o).await {
        ControlFlow::Continue(d) => d,
        ControlFlow::Break(done) => return done,
    };
    if let Some(done) = release_not_owned(&ctx, o, &d).await {
        return done;
    }
    let deref = match delete_dereference(&ctx, o, &d).await {
        ControlFlow::Continue(deref) => deref,
        ControlFlow::Break(done) => return done,
    };
    // preflight: a fresh read of what the delete touches, on every live node — under the
    // address's lock, so no divert write into it lands between this read and the delete.
    let _held = ctx
        .address_locks
        .hold(&deref.cluster_key, &K::addresses(&d), K::ADDRESS_HOLD)
        .await;
    let live: BTreeSet<String> = deref.topology.live_nodes().map(|n| n.node_id.clone()).collect();
    let fresh = fresh_reads::<K>(&deref, &d, &live, true).await;
    let fresh_ok: BTreeMap<String, Arc<NodeInventory>> = fresh
        .iter()
        .filter_map(|(n, r)| r.as_ref().ok().map(|i| (n.clone(), i.clone())))
        .collect();
    let facts = Arc::new(deref.facts.clone());
    let plan = plan_nodes(&deref.topology, &fresh, |inv| K::plan_delete(&d, inv, &facts));
    if let Some(refusal) = o.refuse_delete(&d, &fresh_ok, &facts) {
        let nodes = plan.into_iter().map(|(n, _)| n).collect();
        return block(
            &ctx,
            o,
            Some(&d),
            refusal.reason,
            refusal.message,
            Some(nodes),
            None,
        )
        .await;
    }
    let (nodes, last_audit_id) = if plan.iter().any(|(_, w)| *w) {
        let (nodes, audit_id) = execute_delete(&ctx, o, &d, &deref, plan, facts, fresh_ok).await?;
        (nodes, Some(audit_id))
    } else {
        (plan.into_iter().map(|(n, _)| n).collect(), None)
    };
    judge_delete(&ctx, o, &d, nodes, last_audit_id).await
}

/// What a delete may do at all: Retain, dry run and paused release the object and leave the
/// broker as it is; an invalid spec never reached a broker. The desired object otherwise.
async fn delete_gate<K: TopologyObject>(
    ctx: &Context,
    o: &K,
) -> ControlFlow<Result<Action, ReconcileError>, K::Desired> {
    let released = if o.deletion_policy() == DeletionPolicy::Retain {
        (
            "Retained",
            "deletion policy Retain: the broker is left as it is".to_string(),
        )
    } else {
        match Gate::of(o) {
            Gate::DryRun => (
                "DryRunDelete",
                "dry run: deleting the object left the broker untouched (nothing was destroyed)".into(),
            ),
            Gate::Paused => (
                "PausedDelete",
                format!(
                    "paused ({}): deleting the object left the broker untouched (nothing was destroyed)",
                    crate::api::PAUSED_ANNOTATION
                ),
            ),
            Gate::Write => match o.desired() {
                Ok(d) => return ControlFlow::Continue(d),
                Err(why) => (
                    "InvalidSpec",
                    format!("{why}: nothing was ever written; released"),
                ),
            },
        }
    };
    ControlFlow::Break(release(ctx, o, released.0, released.1).await)
}

/// The cluster, its topology and credentials for a delete — or why the delete cannot go on:
/// released (never applied, another object's, the namespace going away), refused for now (not
/// yet polled since a restart) or blocked (naming the fix).
async fn delete_dereference<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
) -> ControlFlow<Result<Action, ReconcileError>, Dereferenced> {
    let never_reached = o
        .current_status()
        .is_none_or(|s| s.nodes().is_empty() && s.last_audit_id().is_none());
    let cluster_key = match dereference(ctx, o) {
        Ok((_, k)) => k,
        Err(e) => {
            let m =
                format!("{e}. The delete needs the cluster to reach the brokers: restore it. {RELEASE_HINT}");
            return ControlFlow::Break(delete_not_dereferenced(ctx, o, d, e, never_reached, m).await);
        }
    };
    if let Some(done) = owned_elsewhere(ctx, o, d, &cluster_key).await {
        return ControlFlow::Break(done);
    }
    let deref = match dereference(ctx, o).and_then(|(rt, k)| with_topology(ctx, rt, k)) {
        Ok(x) => x,
        Err(e) => {
            let m = format!("{e}. {RELEASE_HINT}");
            return ControlFlow::Break(delete_not_dereferenced(ctx, o, d, e, never_reached, m).await);
        }
    };
    let ns = o.namespace().unwrap_or_default();
    if let Err(e) = ensure_credentials(ctx, &ns, &o.cluster_ref().name).await {
        let never = never_reached && matches!(e, DereferenceError::CredentialsMissing(..));
        let m = format!("{e}. {RELEASE_HINT}");
        return ControlFlow::Break(delete_not_dereferenced(ctx, o, d, e, never, m).await);
    }
    ControlFlow::Continue(deref)
}

/// A delete whose cluster cannot be used: the cluster is gone or cannot be used (its Secret is
/// missing) and this object never reached a broker — nothing of its own to remove, released;
/// restarted — the cluster's first poll (which triggers this object) comes first, and never
/// Ok (the finalizer helper releases the object on Ok); else blocked, unless the namespace
/// is going away.
async fn delete_not_dereferenced<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
    e: DereferenceError,
    never_reached: bool,
    blocked: String,
) -> Result<Action, ReconcileError> {
    if never_reached {
        return release_never_applied(ctx, o, &e).await;
    }
    if let DereferenceError::NotYetPolled(_) = e {
        return Err(ReconcileError::DeleteRefused(e.to_string()));
    }
    if let Some(released) = release_if_namespace_deleted(ctx, o, d, &e).await {
        return released;
    }
    block(ctx, o, Some(d), e.reason(), blocked, None, None).await
}

/// What this object would delete belongs to another object: an older one declaring it on the
/// same brokers (released, left on the broker).
async fn owned_elsewhere<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
    cluster_key: &str,
) -> Option<Result<Action, ReconcileError>> {
    let winner = conflict_winner(ctx, o, d, cluster_key)?;
    let m = format!(
        "{} belongs to the older {} {winner}: left on the broker",
        K::audit_target(d),
        K::kind(&())
    );
    Some(release(ctx, o, "Released", m).await)
}

/// Issue 41: a broker object this object does not own — adopted (found in use before it wrote
/// there) or kept by another writer (this object's writes were undone, or it is contested) — is
/// left on the brokers by a plain delete, whichever side of a fight won: the object is released
/// with the evidence. `spec.deletion.destroyConfirmation` set to the confirmation the status
/// showed lets the delete go on (its checks and the bulk cap still apply).
async fn release_not_owned<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
) -> Option<Result<Action, ReconcileError>> {
    let target = K::audit_target(d);
    let record = old_not_owned(o);
    let contested: Vec<String> = o
        .current_status()
        .map(|s| {
            s.nodes()
                .iter()
                .filter(|n| n.refusal == Some(RefusalKind::Contested))
                .map(|n| n.node.clone())
                .collect()
        })
        .unwrap_or_default();
    let m = match ownership::delete_verdict(record.as_ref(), o.destroy_confirmation()) {
        ownership::DeleteVerdict::Release {
            evidence,
            confirmation,
        } => format!(
            "{target} is left on the brokers: {evidence}. Released without a broker write; to destroy it, delete it on the brokers, or declare it again and set spec.deletion.destroyConfirmation: \"{confirmation}\" before deleting"
        ),
        ownership::DeleteVerdict::Destroy if record.is_none() && !contested.is_empty() => format!(
            "{target} is contested by another writer on {}: left on the brokers, released without a broker write (deleting it would destroy what that writer keeps)",
            contested.join(", ")
        ),
        ownership::DeleteVerdict::Destroy => return None,
    };
    tracing::info!(kind = K::NOUN, object = %o.name_any(), "{m}");
    Some(release(ctx, o, "Released", m).await)
}

/// The audited delete on the nodes the plan writes to; each node's outcome merged into the plan.
async fn execute_delete<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
    deref: &Dereferenced,
    plan: Vec<(NodeOutcome, bool)>,
    facts: Arc<PlanFacts>,
    before: BTreeMap<String, Arc<NodeInventory>>,
) -> Result<(Vec<NodeOutcome>, i64), ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let targets: BTreeSet<String> = write_targets(&plan);
    let mut params = o.delete_params(d);
    params["plan"] = serde_json::to_value(plan.iter().map(|(n, _)| n).collect::<Vec<_>>())?;
    let (d2, before) = (d.clone(), Arc::new(before));
    let delete = move |t: Target| {
        let inv = before.get(&t.node_id).cloned().unwrap_or_default();
        let (d2, f2) = (d2.clone(), facts.clone());
        async move {
            crate::crash_window::hold_all_but_first_node().await;
            let report = K::delete_on(t, d2, f2, inv).await;
            crate::crash_window::mark(Window::MidFanout, "first node done");
            report
        }
    };
    let scope = Scope {
        cluster_ns: &ns,
        cluster_name: &o.cluster_ref().name,
        topology: &deref.topology.restricted_to(&targets),
        timeout: deref.rt.request_timeout * 4,
    };
    let command = format!("{}.delete", K::NOUN);
    let result = command::execute(
        ctx,
        scope.told(o),
        scope.topology,
        scope.timeout,
        intent(ctx, o, d, &command, params),
        delete,
    )
    .await?;
    let mut executed = result.nodes;
    stamp(&mut executed, &command, result.audit_id);
    Ok((merge(plan, executed), result.audit_id))
}

/// Done only when no node may still hold what the object owned (never finalize otherwise);
/// a delete that touched nothing says so.
async fn judge_delete<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
    nodes: Vec<NodeOutcome>,
    last_audit_id: Option<i64>,
) -> Result<Action, ReconcileError> {
    let unfinished: Vec<String> = nodes
        .iter()
        .filter(|n| !matches!(n.outcome, Outcome::Applied | Outcome::Already))
        .map(|n| match n.outcome {
            Outcome::SkippedNotLive => format!("{} (not live: it may still hold it)", n.node),
            _ => format!("{} ({})", n.node, n.message),
        })
        .collect();
    if unfinished.is_empty() {
        if last_audit_id.is_none() {
            // Nothing of this object's was on any node (another's queue, another routing type).
            let why: Vec<String> = nodes
                .iter()
                .map(|n| format!("{}: {}", n.node, n.message))
                .collect();
            let note = format!(
                "no broker write: nothing of this object's was on any live node ({})",
                why.join("; ")
            );
            ctx.event(o, false, "NothingDeleted", &format!("{}.delete", K::NOUN), note)
                .await;
        }
        return Ok(Action::await_change());
    }
    let reason = if nodes.iter().any(|n| n.outcome == Outcome::Failed) {
        "NodesRefused"
    } else {
        "NodesNotLive"
    };
    let m = format!(
        "not deleted on every node; retried when the object or the cluster changes: {}. {RELEASE_HINT} on those nodes",
        unfinished.join("; ")
    );
    block(ctx, o, Some(d), reason, m, Some(nodes), last_audit_id).await
}

/// One fresh read per named live node, concurrently; a node whose read fails is FAILED with the
/// error (nothing is written or destroyed there on a guess). A delete's read is placed by each
/// node's latest snapshot (an empty one where the node has none: every divert searched for).
async fn fresh_reads<K: TopologyObject>(
    deref: &Dereferenced,
    d: &K::Desired,
    nodes: &BTreeSet<String>,
    for_delete: bool,
) -> BTreeMap<String, Result<Arc<NodeInventory>, NodeOutcome>> {
    let timeout = deref.rt.request_timeout * 2;
    let nothing_known = Arc::new(NodeInventory::default());
    let reads = deref.topology.live_nodes().filter(|n| nodes.contains(&n.node_id)).filter_map(|n| {
        let management = n.active.clone()?;
        let snapshot = for_delete.then(|| n.inventory.clone().unwrap_or_else(|| nothing_known.clone()));
        Some(async move {
            let t = Target::new(n.node_id.clone(), management);
            let read = tokio::time::timeout(timeout, K::read_fresh(&t, d, snapshot.as_deref()))
                .await
                .unwrap_or(Err(crate::broker::BrokerError::Timeout(timeout.as_secs())));
            let r = read.map(Arc::new).map_err(|e| NodeOutcome {
                last_command: None,
                node: n.node_id.clone(),
                endpoint: n.active_endpoint().map(str::to_string),
                outcome: Outcome::Failed,
                refusal: Some(e.refusal_kind()),
                message: format!(
                    "the preflight could not read this node ({e}); nothing is written or destroyed there on a guess"
                ),
                detail: vec![],
            });
            (n.node_id.clone(), r)
        })
    });
    futures::future::join_all(reads).await.into_iter().collect()
}

/// Reconcile through the finalizer: the kind's apply while it lives, its cleanup once deleted.
pub async fn reconcile<K: TopologyObject>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    // The cache may not have our own last status write yet: never plan from an older one.
    let obj = match ctx.written.newer_than::<K::Status>(obj.meta()) {
        Some(status) => {
            let mut o = (*obj).clone();
            o.set_status(status);
            Arc::new(o)
        }
        None => obj,
    };
    let deleting = obj.meta().deletion_timestamp.is_some();
    let result = super::with_finalizer(
        &ctx,
        obj.clone(),
        K::FINALIZER,
        |o| apply(o, ctx.clone()),
        |o| cleanup(o, ctx.clone()),
    )
    .await;
    if deleting && result.is_ok() {
        ctx.written.forget(&obj.uid().unwrap_or_default());
    }
    if let Err(e) = &result
        && !matches!(e, ReconcileError::DeleteRefused(_))
    {
        // Every error reaches the object: a condition reason and (on change) an Event.
        // Best effort: when the API server itself is what failed, the log is all there is.
        let desired = obj.desired().ok();
        if let Err(report_error) = stop(&ctx, obj.as_ref(), desired.as_ref(), e.reason(), e.to_string()).await
        {
            tracing::warn!(error = %e, %report_error, kind = K::NOUN, "reconcile failed and could not be reported on the object");
        }
    }
    result
}

pub fn error_policy<K: TopologyObject>(obj: Arc<K>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    let uid = obj.uid().unwrap_or_default();
    match error {
        // A blocked delete is re-evaluated when the object or its nodes change (the cluster's
        // poll triggers it), and otherwise with a growing delay: it sends nothing and writes no
        // audit row while it waits.
        ReconcileError::DeleteRefused(_) => Action::requeue(ctx.backoff.next(
            &uid,
            Duration::from_secs(30),
            Duration::from_secs(600),
        )),
        e => {
            tracing::warn!(error = %e, reason = e.reason(), kind = K::NOUN, object = %obj.name_any(), "reconcile failed");
            Action::requeue(
                ctx.backoff
                    .next(&uid, Duration::from_secs(5), Duration::from_secs(300)),
            )
        }
    }
}

#[cfg(test)]
mod contested_tests {
    use super::*;
    use crate::api::LastCommand;

    fn node(
        outcome: Outcome,
        detail: &[&str],
        last: Option<(&str, Outcome, chrono::Duration)>,
    ) -> NodeOutcome {
        NodeOutcome {
            node: "n1".into(),
            endpoint: None,
            outcome,
            refusal: None,
            message: "update: filter-string (broker has \"b\", spec wants \"a\")".into(),
            detail: detail.iter().map(|d| d.to_string()).collect(),
            last_command: last.map(|(command, outcome, ago)| LastCommand {
                command: command.into(),
                audit_id: 7,
                outcome,
                at: (chrono::Utc::now() - ago).to_rfc3339(),
                not_applied: vec![],
            }),
        }
    }

    #[test]
    fn a_field_changed_back_soon_after_a_repair_is_another_writer() {
        let old = node(
            Outcome::Applied,
            &[],
            Some(("queue.repair", Outcome::Applied, chrono::Duration::seconds(6))),
        );
        let planned = node(Outcome::WouldApply, &["filter-string"], None);
        let held = held_back(&[old], &planned, true, true).expect("held back");
        assert_eq!(
            (held.outcome, held.refusal),
            (Outcome::Failed, Some(RefusalKind::Contested))
        );
        assert!(
            held.message.contains("another writer") && held.message.contains("broker has"),
            "{}",
            held.message
        );
        // It stays contested at the next pass of the same generation...
        let again = held_back(std::slice::from_ref(&held), &planned, true, true).expect("still held");
        assert_eq!(again.refusal, Some(RefusalKind::Contested));
        // ...and a new generation (the person decided) writes again.
        assert_eq!(held_back(&[held], &planned, false, true), None);
    }

    #[test]
    fn a_first_change_an_old_repair_and_a_re_creation_are_repaired() {
        let planned = node(Outcome::WouldApply, &["filter-string"], None);
        // The last write was the create (an apply), not a repair: repaired once.
        let created = node(
            Outcome::Applied,
            &[],
            Some(("queue.apply", Outcome::Applied, chrono::Duration::seconds(6))),
        );
        assert_eq!(held_back(&[created], &planned, true, true), None);
        // A repair long ago: a new change is repaired.
        let old_repair = node(
            Outcome::Applied,
            &[],
            Some(("queue.repair", Outcome::Applied, chrono::Duration::seconds(600))),
        );
        assert_eq!(held_back(&[old_repair], &planned, true, true), None);
        // A queue deleted again behind the operator's back is created again.
        let recent = node(
            Outcome::Applied,
            &[],
            Some(("queue.repair", Outcome::Applied, chrono::Duration::seconds(6))),
        );
        let create = node(Outcome::WouldApply, &[], None);
        assert_eq!(held_back(&[recent], &create, true, true), None);
    }
}

/// The execute stage on a fake broker node (`fanout::fake`): what each write sends and what
/// it takes as evidence (issue 23: a create is one write and no read; ADR-0049: an update
/// reads, writes and verifies; ADR-0084 §3: a delete removes the diverts first).
#[cfg(test)]
mod carried_tests {
    use super::*;
    use crate::api::queue::ArtemisQueueStatus;

    fn status(observed: i64, nodes_generation: Option<i64>) -> ArtemisQueueStatus {
        ArtemisQueueStatus {
            observed_generation: Some(observed),
            nodes_generation,
            nodes: vec![NodeOutcome {
                node: "n1".into(),
                endpoint: None,
                outcome: Outcome::Applied,
                refusal: None,
                message: "created".into(),
                detail: vec![],
                last_command: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn nodes_carried_into_a_newer_generation_keep_the_generation_they_were_judged_for() {
        // Judged for 1, reported again for 2 (the cluster not reachable): still 1's.
        let (nodes, judged) = carried_nodes(Some(&status(1, None)), Some(2));
        assert_eq!((nodes.len(), judged), (1, Some(1)));
        // Carried twice (2, then 3): the generation they were judged for, not the last report's.
        let (_, judged) = carried_nodes(Some(&status(2, Some(1))), Some(3));
        assert_eq!(judged, Some(1));
        // Same generation: nothing to say.
        let (_, judged) = carried_nodes(Some(&status(2, None)), Some(2));
        assert_eq!(judged, None);
        // A pass that judges the nodes for 3 after all: History reads them as 3's.
        let judged_now = status(3, None);
        assert_eq!(judged_now.nodes_generation(), Some(3));
        assert_eq!(status(3, Some(1)).nodes_generation(), Some(1));
    }
}

#[cfg(test)]
mod on_a_fake_broker {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::api::ArtemisQueue;
    use crate::controllers::queue::plan::DesiredQueue;
    use crate::fanout::fake::{FakeBroker, target};
    use crate::topology::inventory::{AddressInfo, DivertInfo, QueueInfo};

    fn desired(spec: serde_json::Value) -> DesiredQueue {
        let mut spec = spec;
        spec["clusterRef"] = json!({"name": "c"});
        let spec = serde_json::from_value(spec).unwrap_or_else(|e| panic!("spec: {e}"));
        DesiredQueue::checked("orders", &spec).unwrap_or_else(|e| panic!("desired: {e}"))
    }

    fn node_with_address() -> NodeInventory {
        let mut inv = NodeInventory::default();
        inv.addresses.insert(
            "orders".into(),
            AddressInfo {
                name: "orders".into(),
                routing_types: vec!["ANYCAST".into()],
                queue_names: vec![],
            },
        );
        inv
    }

    fn existing(d: &DesiredQueue) -> NodeInventory {
        let mut inv = node_with_address();
        let answer = Value::String(queue::plan::create_document(d).to_string());
        let q: QueueInfo = crate::topology::inventory::created_queue(&answer).unwrap_or_default();
        inv.addresses
            .entry("orders".into())
            .or_default()
            .queue_names
            .push(q.name.clone());
        inv.queues.insert(q.name.clone(), q);
        inv
    }

    async fn apply(
        fake: &Arc<FakeBroker>,
        d: &DesiredQueue,
        planned: Planned,
    ) -> Result<NodeReport, NodeFailure> {
        let seen = Mutex::new(BTreeMap::new());
        let t = target("n1", fake.clone());
        let existed = AtomicBool::new(false);
        apply_with_evidence::<ArtemisQueue>(t, d.clone(), planned, &seen, &existed).await
    }

    use super::super::queue;

    #[tokio::test]
    async fn a_create_is_one_write_and_no_read() {
        let d = desired(json!({}));
        let fake = Arc::new(FakeBroker::with(node_with_address()));
        let snapshot = Arc::new(node_with_address());
        let report = apply(&fake, &d, Planned::Snapshot(snapshot))
            .await
            .expect("created");
        assert_eq!(report.outcome, Outcome::Applied);
        assert_eq!(fake.calls(), vec!["createQueue \"orders\""]);
        assert!(
            report.seen.is_some_and(|s| s.queues.contains_key("orders")),
            "the answer is the evidence"
        );
    }

    #[tokio::test]
    async fn a_queue_made_behind_the_snapshots_back_is_read_and_judged_not_written_again() {
        let d = desired(json!({}));
        let fake = Arc::new(FakeBroker::with(existing(&d)));
        let report = apply(&fake, &d, Planned::Snapshot(Arc::new(node_with_address())))
            .await
            .expect("judged");
        assert_eq!(report.outcome, Outcome::Already);
        assert_eq!(fake.calls(), vec!["createQueue \"orders\"", "read"]);
    }

    #[tokio::test]
    async fn an_update_writes_once_and_verifies_by_a_fresh_read() {
        let d = desired(json!({"maxConsumers": 5}));
        let before = existing(&desired(json!({})));
        let fake = Arc::new(FakeBroker::with(before.clone()));
        let report = apply(&fake, &d, Planned::Fresh(Arc::new(before)))
            .await
            .expect("updated");
        assert_eq!(report.outcome, Outcome::Applied);
        assert_eq!(fake.calls(), vec!["updateQueue \"orders\"", "read"]);
        assert_eq!(
            fake.state.lock().map(|s| s.queues["orders"].max_consumers).ok(),
            Some(5)
        );
    }

    #[tokio::test]
    async fn an_update_the_broker_ignores_is_not_converging_after_one_write() {
        let d = desired(json!({"exclusive": true}));
        let before = existing(&desired(json!({})));
        let fake = Arc::new(FakeBroker {
            ignored_on_update: vec!["exclusive"],
            ..FakeBroker::with(before.clone())
        });
        let failure = apply(&fake, &d, Planned::Fresh(Arc::new(before)))
            .await
            .expect_err("not converging");
        assert_eq!(failure.error.refusal_kind(), RefusalKind::NotConverging);
        assert_eq!(
            fake.count("updateQueue"),
            1,
            "sent once, never again in this pass"
        );
    }

    #[tokio::test]
    async fn a_delete_removes_the_diverts_into_the_address_first_then_the_queue() {
        let d = desired(json!({}));
        let mut inv = existing(&d);
        inv.addresses.insert(
            "in".into(),
            AddressInfo {
                name: "in".into(),
                routing_types: vec!["ANYCAST".into()],
                queue_names: vec![],
            },
        );
        let divert = DivertInfo {
            name: "to-orders".into(),
            address: "in".into(),
            forwarding_address: "orders".into(),
            routing_type: "STRIP".into(),
            ..Default::default()
        };
        inv.diverts.insert(divert.name.clone(), divert);
        let fake = Arc::new(FakeBroker::with(inv.clone()));
        let facts = Arc::new(PlanFacts::default());
        let t = target("n1", fake.clone());
        let report = ArtemisQueue::delete_on(t, d, facts, Arc::new(inv))
            .await
            .expect("deleted");
        assert_eq!(report.outcome, Outcome::Applied);
        assert_eq!(
            fake.calls(),
            vec!["destroyDivert to-orders", "destroyQueue orders"]
        );
        assert!(
            fake.state
                .lock()
                .is_ok_and(|s| s.queues.is_empty() && s.diverts.is_empty())
        );
    }

    #[tokio::test]
    async fn a_delete_of_a_queue_that_is_not_there_writes_nothing() {
        let d = desired(json!({}));
        let fake = Arc::new(FakeBroker::with(node_with_address()));
        let t = target("n1", fake.clone());
        let facts = Arc::new(PlanFacts::default());
        let report = ArtemisQueue::delete_on(t, d, facts, Arc::new(node_with_address()))
            .await
            .expect("nothing to do");
        assert_eq!(report.outcome, Outcome::Already);
        assert!(fake.calls().is_empty());
    }
}
