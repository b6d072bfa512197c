//! Kubernetes-convention conditions: one per type, `lastTransitionTime` kept while the status
//! does not change, `observedGeneration` on each.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{Condition, NodeOutcome, Outcome};

pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
pub const DIVERGED: &str = "Diverged";

/// Set (or replace) the condition of `type_`.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let message = message.into();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time: now,
        }),
    }
}

/// The conditions without their transition times (to decide whether status changed).
pub fn comparable(conditions: &[Condition]) -> Vec<(String, String, String, String, Option<i64>)> {
    conditions
        .iter()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
                c.observed_generation,
            )
        })
        .collect()
}

/// Ready and Diverged from a command's per-node outcomes (ADR-0049): Ready only when every live
/// node is APPLIED or ALREADY; Diverged names the nodes that are not, not-live ones included.
pub fn from_outcomes(
    conditions: &mut Vec<Condition>,
    nodes: &[NodeOutcome],
    generation: Option<i64>,
    dry_run: bool,
    what: &str,
) {
    let in_state = |n: &&NodeOutcome| matches!(n.outcome, Outcome::Applied | Outcome::Already);
    let live: Vec<&NodeOutcome> = nodes
        .iter()
        .filter(|n| n.outcome != Outcome::SkippedNotLive)
        .collect();
    let ready = !live.is_empty() && live.iter().all(in_state);
    let (reason, message) = if ready {
        (
            "OnEveryLiveNode",
            format!(
                "the {what} is in the requested state on {} live node(s)",
                live.len()
            ),
        )
    } else if live.is_empty() {
        ("NoLiveNode", format!("no live node: nothing received the {what}"))
    } else if dry_run {
        (
            "DryRun",
            "dry run or paused: nothing is written; see status.nodes for what would change".to_string(),
        )
    } else {
        let bad: Vec<String> = live
            .iter()
            .filter(|n| !in_state(n))
            .map(|n| format!("{}: {}", n.node, n.message))
            .collect();
        ("NotOnEveryLiveNode", bad.join("; "))
    };
    set(conditions, READY, ready, reason, message, generation);
    let diverged: Vec<String> = nodes
        .iter()
        .filter(|n| !in_state(n))
        .map(|n| match n.outcome {
            Outcome::SkippedNotLive => match &n.last_command {
                Some(lc) => format!(
                    "{} (not live; last received {} {:?})",
                    n.node, lc.command, lc.outcome
                ),
                None => format!("{} (not live)", n.node),
            },
            other => format!("{} ({other:?})", n.node),
        })
        .collect();
    if diverged.is_empty() {
        set(
            conditions,
            DIVERGED,
            false,
            "Converged",
            "every node matches the spec",
            generation,
        );
    } else {
        set(
            conditions,
            DIVERGED,
            true,
            "NodesDiffer",
            diverged.join(", "),
            generation,
        );
    }
}
