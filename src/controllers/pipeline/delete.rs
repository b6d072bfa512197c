//! delete: the delete of every kind. It releases the finalizer only when no node may still
//! hold what the object owned: a node not live, timed out or failed keeps it, with a condition
//! naming the node and how to release the object anyway (`spec.deletion.policy: Retain`).
//! `dryRun`, paused and Retain never write (the broker is left as it is, and an Event says so);
//! a delete whose cluster does not exist says how to proceed, and an object that never reached
//! any cluster is released at once.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::audit::{intent, stamp};
use super::claims::conflict_winner;
use super::dereference::{
    DereferenceError, Dereferenced, Gate, dereference, ensure_credentials, with_topology,
};
use super::plan::{merge, plan_nodes, write_targets};
use super::preflight::fresh_reads;
use super::status::{old_not_owned, report_condition};
use super::{DELETE_BLOCKED, PlanFacts, TopologyObject};
use crate::api::{DeletionPolicy, NodeOutcome, Outcome, RefusalKind};
use crate::controllers::command::{self, Scope};
use crate::controllers::{Context, DeleteRefusal, ReconcileError, StatusConditions, ownership};
use crate::crash_window::Window;
use crate::fanout::Target;
use crate::topology::inventory::NodeInventory;

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
    // Issue 45: the credentials read goes alongside the preflight read (a read, not a write),
    // both begun under the lock; the check still ends before the command is sent.
    let (credentials, fresh) = futures::join!(
        delete_credentials(&ctx, o, &d, &deref),
        fresh_reads::<K>(&deref, &d, &live, true)
    );
    if let ControlFlow::Break(done) = credentials {
        return done;
    }
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
    ControlFlow::Break(release(ctx, o, released.0, released.1))
}

/// A delete that leaves the broker untouched: the finalizer goes, an Event says why.
fn release<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    reason: &str,
    message: String,
) -> Result<Action, ReconcileError> {
    ctx.event(obj, false, reason, &format!("{}.delete", K::NOUN), message);
    Ok(Action::await_change())
}

/// A delete whose cluster cannot be used, of an object that never reached a broker: nothing of
/// its own is on any broker, so it is released without a write.
fn release_never_applied<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    why: &DereferenceError,
) -> Result<Action, ReconcileError> {
    let message = format!("{why}; this object never reached a broker: nothing to remove");
    release(ctx, obj, "NeverApplied", message)
}

const RELEASE_HINT: &str =
    "To release this object and leave the broker as it is, set spec.deletion.policy: Retain";

/// The cluster and its topology for a delete — or why the delete cannot go on:
/// released (never applied, another object's, the namespace going away), refused for now (not
/// yet polled since a restart) or blocked (naming the fix).
async fn delete_dereference<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
) -> ControlFlow<Result<Action, ReconcileError>, Dereferenced> {
    let never_reached = never_reached(o);
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
    let addresses = K::addresses(d);
    let deref = match dereference(ctx, o).and_then(|(rt, k)| with_topology(ctx, rt, k, &addresses)) {
        Ok(x) => x,
        Err(e) => {
            let m = format!("{e}. {RELEASE_HINT}");
            return ControlFlow::Break(delete_not_dereferenced(ctx, o, d, e, never_reached, m).await);
        }
    };
    ControlFlow::Continue(deref)
}

/// The delete's credentials check: missing (an object that never reached a broker is
/// released), changed or unreadable (blocked).
async fn delete_credentials<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
    deref: &Dereferenced,
) -> ControlFlow<Result<Action, ReconcileError>> {
    let ns = o.namespace().unwrap_or_default();
    let used = &deref.topology.secret_versions;
    let Err(e) = ensure_credentials(ctx, &ns, &o.cluster_ref().name, used).await else {
        return ControlFlow::Continue(());
    };
    let never = never_reached(o) && matches!(e, DereferenceError::CredentialsMissing(..));
    let m = format!("{e}. {RELEASE_HINT}");
    ControlFlow::Break(delete_not_dereferenced(ctx, o, d, e, never, m).await)
}

/// The object never reached a broker: no node in its status and no command.
fn never_reached<K: TopologyObject>(o: &K) -> bool {
    o.current_status()
        .is_none_or(|s| s.nodes().is_empty() && s.last_audit_id().is_none())
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
        return release_never_applied(ctx, o, &e);
    }
    if let DereferenceError::NotYetPolled(cluster) = e {
        return Err(DeleteRefusal::NotYetPolled { cluster }.into());
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
    Some(release(ctx, o, "Released", m))
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
    if !crate::controllers::namespace_being_deleted(&ctx.client, &ns).await {
        return None;
    }
    let message = format!(
        "{why}. Namespace {ns} is being deleted, so neither can come back: released without a broker write; {} is left on the brokers as it is",
        K::audit_target(d)
    );
    tracing::warn!(kind = K::NOUN, object = %obj.name_any(), namespace = %ns, "{message}");
    Some(release(ctx, obj, "NamespaceDeleted", message))
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
    Some(release(ctx, o, "Released", m))
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
    Err(DeleteRefusal::Blocked { message }.into())
}

/// The audited delete on the nodes the plan writes to; each node's outcome merged into the plan.
/// Its success gets an Event only when it destroys more than the object's own unused broker
/// object (`TopologyObject::delete_destroys_more`); a failure always does.
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
    let destroys_more = before.values().any(|inv| K::delete_destroys_more(d, inv, &facts));
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
    let told = if destroys_more {
        scope.told(o)
    } else {
        scope.told(o).failure_only()
    };
    let result = command::execute(
        ctx,
        told,
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
            ctx.event(o, false, "NothingDeleted", &format!("{}.delete", K::NOUN), note);
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

/// The execute stage of a delete on a fake broker node (`fanout::fake`): ADR-0084 §3: a delete
/// removes the diverts first.
#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::queue_fixtures::{desired, existing, node_with_address};
    use super::*;
    use crate::api::ArtemisQueue;
    use crate::fanout::fake::{FakeBroker, target};
    use crate::topology::inventory::{AddressInfo, DivertInfo};

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
