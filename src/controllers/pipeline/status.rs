//! status (pure) and report: the status document of a pass — its conditions from the nodes'
//! outcomes, what each node keeps from the last pass — the one place that writes it, the Event
//! a changed condition publishes, and when to look again.

use std::time::Duration;

use kube::runtime::controller::Action;

use super::dereference::Gate;
use super::{DELETE_BLOCKED, Pass, TopologyObject};
use crate::api::{Condition, NodeOutcome, NotOwned, Outcome, RefusalKind};
use crate::controllers::{Context, ReconcileError, StatusConditions, conditions};

/// report: the one place that writes status.
pub(super) async fn report<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    pass: Pass<'_, K>,
) -> Result<(), ReconcileError> {
    let status = obj.status(&pass);
    crate::controllers::report::write_status(ctx, obj, obj.current_status(), &status).await
}

pub(super) fn old_conditions<K: TopologyObject>(obj: &K) -> Vec<Condition> {
    obj.current_status()
        .cloned()
        .map(|mut s| std::mem::take(s.conditions_mut()))
        .unwrap_or_default()
}

pub(super) fn old_not_owned<K: TopologyObject>(obj: &K) -> Option<NotOwned> {
    obj.current_status().and_then(|s| s.not_owned().cloned())
}

pub(super) fn old_audit<K: TopologyObject>(obj: &K) -> Option<i64> {
    obj.current_status().and_then(|s| s.last_audit_id())
}

/// A pass that stops before the plan: Ready=False with the reason, nothing written. The Event
/// is published only when the reason or message changed (no Event per requeue).
pub(super) async fn stop<K: TopologyObject>(
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
pub(super) async fn report_condition<K: TopologyObject>(
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
    if changed {
        // Queued before the status is written: whoever reads the status may read the Event.
        let action = if type_ == DELETE_BLOCKED {
            "delete"
        } else {
            "apply"
        };
        ctx.event(obj, true, reason, &format!("{}.{action}", K::NOUN), message);
    }
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
    .await
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

/// What this pass knows from the last one, per node: an APPLIED outcome stays APPLIED while the
/// node is found in the requested state (the next pass's ALREADY never hides what was done), the
/// last command received is carried, and a node not live is described by what it last received.
pub(super) fn carry_history(old: &[NodeOutcome], nodes: &mut [NodeOutcome], same_generation: bool) {
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

pub(super) fn set_paused_condition(conditions_: &mut Vec<Condition>, gate: Gate, generation: Option<i64>) {
    let waits = "no broker writes, on apply or delete; status.nodes shows what would change";
    conditions::set_paused(conditions_, gate == Gate::Paused, waits, generation);
}

pub const NOT_CONVERGING: &str = conditions::NOT_CONVERGING;

pub(super) fn set_not_converging(conds: &mut Vec<Condition>, nodes: &[NodeOutcome], generation: Option<i64>) {
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

/// A Warning Event when Ready turns False, or says something new while False, in a pass that
/// sent nothing (a node refusing for good, e.g. a routing type the broker cannot change).
pub(super) fn announce_not_ready<K: TopologyObject>(
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
        );
    }
}

/// How long a converged object waits before it is looked at again without a trigger (the
/// cluster's poll triggers every object whose broker objects or nodes changed).
pub const RESYNC: Duration = Duration::from_secs(600);

/// When to look again: a converged object waits for a trigger (or the slow resync); one with a
/// failed node retries after a delay that doubles with each failed pass in a row (from the poll
/// interval up to 5 minutes), so a node that keeps refusing is not written every poll.
pub(super) fn next_pass(
    ctx: &Context,
    retry_key: &str,
    nodes: &[NodeOutcome],
    poll_interval: Duration,
) -> Action {
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

#[cfg(test)]
mod tests {
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
