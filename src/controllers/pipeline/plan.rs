//! plan (pure): what each node needs, judged from its inventory — the cluster's snapshot, or a
//! preflight's fresh read — and, for an apply, a write held back: one the broker did not take
//! this generation (NOT_CONVERGING), one another writer keeps undoing (contested), or a failed
//! node whose retry is not due.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use super::dereference::Dereferenced;
use super::{Step, TopologyObject};
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::controllers::{Context, StatusConditions};
use crate::fanout;
use crate::topology::inventory::NodeInventory;
use crate::topology::{LogicalNode, Topology};

/// One planned node outcome.
pub(super) fn planned(n: &LogicalNode, step: &Step) -> NodeOutcome {
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
pub(super) fn plan_nodes(
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

pub(super) fn snapshot_inventories(
    topology: &Topology,
) -> BTreeMap<String, Result<Arc<NodeInventory>, NodeOutcome>> {
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

/// The nodes a plan writes to.
pub(super) fn write_targets(plan: &[(NodeOutcome, bool)]) -> BTreeSet<String> {
    plan.iter()
        .filter(|(_, w)| *w)
        .map(|(n, _)| n.node.clone())
        .collect()
}

/// Merge executed outcomes over planned ones (nodes that were not written keep their plan).
pub(super) fn merge(planned: Vec<(NodeOutcome, bool)>, executed: Vec<NodeOutcome>) -> Vec<NodeOutcome> {
    let mut by_node: BTreeMap<String, NodeOutcome> =
        executed.into_iter().map(|n| (n.node.clone(), n)).collect();
    planned
        .into_iter()
        .map(|(p, _)| by_node.remove(&p.node).unwrap_or(p))
        .collect()
}

/// What the last pass reported, for the plan (a write held back) and the report (history).
pub(super) struct History {
    pub(super) nodes: Vec<NodeOutcome>,
    pub(super) same_generation: bool,
    pub(super) retry_key: String,
}

impl History {
    pub(super) fn of<K: TopologyObject>(o: &K) -> Self {
        let status = o.current_status();
        History {
            nodes: status.map(|s| s.nodes().to_vec()).unwrap_or_default(),
            same_generation: status.and_then(|s| s.nodes_generation()) == o.meta().generation,
            retry_key: format!("{}/nodes", o.uid().unwrap_or_default()),
        }
    }
}

/// The plan, from the snapshot; a write held back (see `held_back`) is not planned.
pub(super) fn plan_apply<K: TopologyObject>(
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
pub(super) const CONTESTED_NEXT: &str = "Not written again for this generation, and a plain delete leaves it on the brokers: decide who owns it, then stop the other writer or change this spec to match";

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

#[cfg(test)]
mod tests {
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
