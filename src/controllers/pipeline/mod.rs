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
//!
//! One module per stage; each uses the types here (the trait, [`Step`], [`PlanFacts`],
//! [`Pass`]), and this module's reconcile walks them:
//!
//! - `dereference`: the ArtemisCluster, its credentials, its snapshot and the plan facts; the
//!   dryRun/paused [`Gate`];
//! - `claims`: which of two objects claiming one broker object on one broker cluster wins;
//! - `plan`: the per-node plan from an inventory, and a write held back (not converging,
//!   contested by another writer, a failed node's retry not due);
//! - `preflight`: the fresh reads a write or a delete is planned from;
//! - `apply`: an apply pass (dereference, plan, write with its evidence, ownership, judge);
//! - `delete`: a delete pass (what a delete may do at all, its preflight, the audited delete,
//!   whether the finalizer goes);
//! - `status`: the status document and its conditions, the one place that writes status;
//! - `audit`: the audit row of a command, and the node outcomes stamped with it;
//! - `dependents`: which other objects a change concerns, and triggering them.
//!
//! Each stage uses only the stages below it (and the types here), never one above:
//!
//! ```text
//! apply, delete                            the two passes (`reconcile`, here, runs one)
//!   └─▶ preflight, status, audit, dependents
//!         └─▶ plan
//!               └─▶ dereference
//!                     └─▶ claims
//! ```

mod apply;
mod audit;
mod claims;
mod delete;
mod dependents;
mod dereference;
mod plan;
mod preflight;
#[cfg(test)]
mod queue_fixtures;
mod status;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::{Cache, Context, ReconcileError, StatusConditions, conditions, ownership};
use crate::api::cluster::DeclarationMode;
use crate::api::{ClusterRef, Condition, DeletionPolicy, NodeOutcome, NotOwned, RefusalKind};
use crate::fanout::{NodeFailure, NodeReport, Target};
use crate::topology::Topology;
use crate::topology::inventory::NodeInventory;

pub use apply::apply;
pub(in crate::controllers) use apply::{apply_command, apply_with_evidence};
pub(in crate::controllers) use audit::{intent, stamp};
pub use claims::{claim_of, conflict_winner, same_brokers};
pub use delete::cleanup;
pub use dependents::touch_keys_of;
pub(in crate::controllers) use dereference::facts;
pub use dereference::{DereferenceError, Dereferenced, Gate, dereference_cluster, ensure_credentials};
pub use plan::FLAP_WINDOW;
pub(in crate::controllers) use preflight::Planned;
pub use status::{NOT_CONVERGING, RESYNC};

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

/// What a fresh read is for.
#[derive(Clone, Debug)]
pub enum FreshRead {
    /// A write's: only the object itself.
    Apply,
    /// A delete's: also what goes with it. `last_inventory`: the node's latest inventory (none:
    /// no poll yet), whose diverts are read by name where they were, beside the node's divert
    /// names; the node is read in full only if it lists one not found there (issue 45).
    Delete {
        last_inventory: Option<Arc<NodeInventory>>,
    },
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
    + super::OfCluster
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
    fn desired(&self) -> Result<Self::Desired, InvalidSpec>;
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
    /// delete, also what goes with it: the dependent diverts).
    fn read_fresh(
        t: &Target,
        d: &Self::Desired,
        read: FreshRead,
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
    /// false where ADR-0049 reads first (an update: read, overlay, send; its answer, the queue
    /// after it, is judged) or the broker can silently not apply (a divert create).
    fn answer_is_evidence(_d: &Self::Desired, _snapshot: &NodeInventory) -> bool {
        false
    }
    /// The refusal by which the broker says the object already exists: the node is then read
    /// and planned again from what it holds.
    const ALREADY_EXISTS: Option<RefusalKind> = None;

    /// execute on one node, from the preflight's fresh read of it (`before`, or the snapshot
    /// where the answer is the evidence): write. The pipeline verifies the write by the state
    /// the report's `seen` holds (the broker's answer) or, without one, another fresh read.
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

    /// Whether deleting this object on a node, as its preflight read it, destroys more than the
    /// object's own unused broker object (messages, consumers, other objects' diverts): such a
    /// delete's success is told by an Event. A plain one is told by the object's going and its
    /// audit row (issue 45: no second API write per deleted object, as none for a create).
    fn delete_destroys_more(_d: &Self::Desired, _before: &NodeInventory, _facts: &PlanFacts) -> bool {
        false
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

/// Why a spec cannot name a broker object (the same rules as admission): the object's status
/// says so (`InvalidSpec`), and it writes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSpec(pub String);

impl From<String> for InvalidSpec {
    fn from(why: String) -> Self {
        InvalidSpec(why)
    }
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
    // Issue 45: the pass asks for its cluster's Secrets as it begins (once granted its slot); a
    // new object's read goes alongside its finalizer patch.
    let (ns, cluster) = (
        obj.namespace().unwrap_or_default(),
        obj.cluster_ref().name.clone(),
    );
    let asked = (Gate::of(obj.as_ref()) == Gate::Write)
        .then(|| dereference::ask_credentials(&ctx, &ns, &cluster))
        .flatten();
    let read_alongside = async {
        if let Some(a) = &asked {
            dereference::read_credentials(&ctx, &ns, &cluster, a).await;
        }
    };
    let result = super::with_finalizer(
        &ctx,
        obj.clone(),
        K::FINALIZER,
        |patched| {
            if let Ok(mut c) = K::cache(&ctx).changes.lock() {
                c.expect(patched);
            }
        },
        read_alongside,
        |o| apply::apply(o, ctx.clone(), asked.clone()),
        |o| delete::cleanup(o, ctx.clone()),
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
        if let Err(report_error) =
            status::stop(&ctx, obj.as_ref(), desired.as_ref(), e.reason(), e.to_string()).await
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
