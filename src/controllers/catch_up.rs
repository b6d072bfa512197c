//! Issue 41: a node that comes back gets what it missed in bulk, before its objects' passes.
//!
//! While a node is away its objects' passes skip it (SKIPPED_NOT_LIVE); a restart may also lose
//! what it held (a non-durable queue). When the cluster's poll finds it back, every object whose
//! last pass found every *other* node in the requested state (same generation) and whose plan on
//! the returned node's fresh inventory is a write whose answer is its evidence (a queue create)
//! gets that write now, from the cluster
//! controller: all of them at once, each its own command (one audit row, its own Event rules),
//! coalesced by the batcher into the node's bulk POSTs. The node then holds what it missed
//! within one poll of its return, at the broker's pace rather than at one status write per
//! object; the objects' passes that follow find it there and report the command's outcome
//! (kept here until then).
//!
//! Anything else — an update (read first, ADR-0049), a divert (verified), a refusal, a delete,
//! a paused or dry-run object, a conflict loser, an object a delete holds — is left to its own
//! pass, which every return triggers as before.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, stream};
use kube::ResourceExt;

use super::command::{self, Scope};
use super::pipeline::{self, Gate, Planned, Step, TopologyObject};
use super::{Context, StatusConditions, key};
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::topology::inventory::NodeInventory;
use crate::topology::{LogicalNode, Topology};

/// Objects caught up at once: enough to fill every bulk POST the node's budget permits, few
/// enough that the audit store's pool is not the queue.
const IN_FLIGHT: usize = 256;

/// Outcomes of catch-up commands, by object uid, until the object's next pass reports them.
#[derive(Clone, Default)]
pub struct CaughtUp {
    by_uid: Arc<Mutex<HashMap<String, Kept>>>,
}

#[derive(Clone, Debug)]
struct Kept {
    generation: Option<i64>,
    nodes: Vec<NodeOutcome>,
    audit_id: i64,
}

impl CaughtUp {
    fn keep(&self, uid: String, kept: Kept) {
        if let Ok(mut m) = self.by_uid.lock() {
            m.insert(uid, kept);
        }
    }

    /// Lay what a catch-up command did on this object's nodes over the pass's outcomes: a node
    /// the pass found in the requested state says what the command did there, and the
    /// command's audit row is the object's last one. Taken: reported once.
    pub fn report_into(
        &self,
        uid: &str,
        generation: Option<i64>,
        nodes: &mut [NodeOutcome],
        last_audit_id: &mut Option<i64>,
    ) {
        let Some(kept) = self.by_uid.lock().ok().and_then(|mut m| m.remove(uid)) else {
            return;
        };
        if kept.generation != generation {
            return;
        }
        for done in kept.nodes {
            if let Some(n) = nodes
                .iter_mut()
                .find(|n| n.node == done.node && matches!(n.outcome, Outcome::Already | Outcome::Applied))
            {
                *n = done;
            }
        }
        *last_audit_id = Some(last_audit_id.map_or(kept.audit_id, |a| a.max(kept.audit_id)));
    }
}

/// What one return sent: how many objects, and their audit rows' range; and the objects whose
/// queue a returned node still lacks after it (by uid), left to their own passes.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Summary {
    pub objects: usize,
    pub failed: usize,
    pub audit_ids: Option<(i64, i64)>,
    pub lacking: BTreeSet<String>,
}

impl Summary {
    fn absorb(&mut self, other: Summary) {
        self.objects += other.objects;
        self.failed += other.failed;
        self.audit_ids = match (self.audit_ids, other.audit_ids) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (x, y) => x.or(y),
        };
    }

    fn add(&mut self, audit_id: i64, ok: bool) {
        self.absorb(Summary {
            objects: 1,
            failed: usize::from(!ok),
            audit_ids: Some((audit_id, audit_id)),
            ..Summary::default()
        });
    }
}

/// What was laid on each returned node's inventory since its poll: the answers of the
/// catch-up's commands (node ID → the node's inventory as polled, with them).
type Sent = Mutex<BTreeMap<String, NodeInventory>>;

/// What each returned node missed of one object: the node's inventory the write is planned from.
type Missed = BTreeMap<String, Arc<NodeInventory>>;

/// The poll found `returned` back (published not live, `Topology::catching_up`): send them what
/// they missed, then publish them live, as `merged` polled them with what was sent laid over.
pub async fn catch_up_returned(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    merged: Topology,
    returned: &[String],
) -> Summary {
    let back = |n: &&LogicalNode| returned.contains(&n.node_id);
    let sent: Sent = Mutex::new(
        merged
            .nodes
            .iter()
            .filter(back)
            .filter_map(|n| Some((n.node_id.clone(), (**n.inventory.as_ref()?).clone())))
            .collect(),
    );
    // A pass that was under way when the node came back may report after the first round chose
    // its work: later rounds (on the node's inventory with what was sent) take those too.
    let mut summary = Summary::default();
    for _ in 0..ROUNDS {
        let polled = with_sent(&merged, &sent);
        let round = catch_up::<crate::api::ArtemisQueue>(ctx, ns, cluster, &polled, returned, &sent).await;
        let done = round.objects == 0;
        summary.absorb(round);
        if done {
            break;
        }
    }
    let mut sent = sent.into_inner().unwrap_or_else(|p| p.into_inner());
    let live: Vec<LogicalNode> = merged
        .nodes
        .iter()
        .filter(back)
        .map(|n| {
            let mut n = n.clone();
            if let Some(inv) = sent.remove(&n.node_id) {
                n.inventory = Some(Arc::new(inv));
            }
            n
        })
        .collect();
    summary.lacking =
        still_lacking::<crate::api::ArtemisQueue>(ctx, ns, cluster, &merged.caught_up(&live), returned);
    ctx.topologies
        .update(&key(ns, cluster), |t| (t.caught_up(&live), ()));
    summary
}

/// Rounds of a catch-up at most (see `catch_up_returned`).
const ROUNDS: usize = 3;

/// `t` with the returned nodes' inventories as sent so far (as polled, before anything is sent).
fn with_sent(t: &Topology, sent: &Sent) -> Topology {
    let mut t = t.clone();
    if let Ok(sent) = sent.lock() {
        for n in t.nodes.iter_mut() {
            if let Some(inv) = sent.get(&n.node_id) {
                n.inventory = Some(Arc::new(inv.clone()));
            }
        }
    }
    t
}

/// Send every object of kind `K` on cluster `ns/cluster` what the `returned` nodes missed (as
/// `topology` polled them), as described above. Returns what was sent.
async fn catch_up<K: TopologyObject>(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    topology: &Topology,
    returned: &[String],
    sent: &Sent,
) -> Summary {
    let cluster_key = key(ns, cluster);
    let Some(rt) = ctx.clusters.get(&cluster_key) else {
        return Summary::default();
    };
    let facts = pipeline::facts(ctx, &cluster_key, &rt, None);
    let work: Vec<(Arc<K>, K::Desired, Missed)> = K::cache(ctx)
        .state()
        .into_iter()
        .filter(|o| super::dependents::of_cluster(o.as_ref(), ns, cluster))
        .filter_map(|o| {
            let (d, missed) = missed::<K>(ctx, &o, topology, returned, &cluster_key, &facts)?;
            Some((o, d, missed))
        })
        .collect();
    // The shared write gate: the Secrets as they are now are the ones this poll's clients use,
    // or nothing is sent (the objects are left to their own passes).
    let used = &topology.secret_versions;
    if work.is_empty()
        || pipeline::ensure_credentials(ctx, ns, cluster, used)
            .await
            .is_err()
    {
        return Summary::default();
    }
    let timeout = rt.request_timeout * 3;
    let done: Vec<Option<(i64, bool)>> = stream::iter(work)
        .map(|(o, d, missed)| async move { send::<K>(ctx, &o, &d, topology, missed, timeout, sent).await })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut summary = Summary::default();
    for (audit_id, ok) in done.into_iter().flatten() {
        summary.add(audit_id, ok);
    }
    summary
}

/// The objects of kind `K` on the cluster whose queue a `returned` node lacks on `topology`
/// (as polled, with what was sent): a catch-up that failed, or an object it could not take (no
/// status yet, a pass under way, paused, held). Their uids.
fn still_lacking<K: TopologyObject>(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    topology: &Topology,
    returned: &[String],
) -> BTreeSet<String> {
    let lacks = |d: &K::Desired| {
        returned.iter().any(|r| {
            topology
                .find(r)
                .and_then(|n| n.inventory.as_ref())
                .is_some_and(|inv| matches!(K::plan_apply(d, inv), Step::Write { .. }))
        })
    };
    K::cache(ctx)
        .state()
        .into_iter()
        .filter(|o| super::dependents::of_cluster(o.as_ref(), ns, cluster))
        .filter(|o| o.meta().deletion_timestamp.is_none())
        .filter(|o| o.desired().is_ok_and(|d| lacks(&d)))
        .filter_map(|o| o.uid())
        .collect()
}

/// Wait (at most `bound`) until every object in `lacking` has reported a pass that judged each
/// `returned` node (not SKIPPED_NOT_LIVE), or is gone: until then its status may still say Ready
/// as judged without the node, so the cluster does not yet say the node is live (issue 41).
/// Whether all did.
pub async fn passes_reported<K: TopologyObject>(
    ctx: &Context,
    lacking: &BTreeSet<String>,
    returned: &[String],
    bound: std::time::Duration,
) -> bool {
    let judged = |o: &K| {
        o.current_status().is_some_and(|s| {
            s.nodes_generation() == o.meta().generation
                && returned.iter().all(|r| {
                    s.nodes()
                        .iter()
                        .any(|n| &n.node == r && n.outcome != Outcome::SkippedNotLive)
                })
        })
    };
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let waiting = K::cache(ctx)
            .state()
            .into_iter()
            .filter(|o| o.meta().uid.as_ref().is_some_and(|u| lacking.contains(u)))
            .filter(|o| o.meta().deletion_timestamp.is_none() && !judged(o))
            .count();
        if waiting == 0 {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::info!(
                waiting,
                "objects a returned node lacks have not all reported on it yet; the cluster says it is live anyway"
            );
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The desired object and what each returned node missed (its inventory, the write's plan), if
/// this object is one a catch-up may write (see the module doc).
fn missed<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    topology: &Topology,
    returned: &[String],
    cluster_key: &str,
    facts: &pipeline::PlanFacts,
) -> Option<(K::Desired, Missed)> {
    if o.meta().deletion_timestamp.is_some() || Gate::of(o) != Gate::Write {
        return None;
    }
    let status = o.current_status()?;
    if status.nodes_generation() != o.meta().generation {
        return None;
    }
    let d = o.desired().ok()?;
    if pipeline::conflict_winner(ctx, o, &d, cluster_key).is_some() || K::held_by_delete(&d, facts).is_some()
    {
        return None;
    }
    let in_state = |n: &NodeOutcome| matches!(n.outcome, Outcome::Applied | Outcome::Already);
    // Everywhere else the spec took; on a returned node, whatever its last pass found (skipped,
    // failed while it went away, or held before a restart lost it) but another writer's fight.
    let elsewhere_in_state = status.nodes().iter().all(|n| {
        if returned.contains(&n.node) {
            !matches!(
                n.refusal,
                Some(RefusalKind::Contested | RefusalKind::NotConverging)
            )
        } else {
            in_state(n)
        }
    });
    if !elsewhere_in_state {
        return None;
    }
    let missed: Missed = status
        .nodes()
        .iter()
        .filter(|n| returned.contains(&n.node))
        .filter_map(|n| {
            let node = topology.find(&n.node).filter(|l| l.is_live())?;
            let inv = node.inventory.clone()?;
            let creates =
                matches!(K::plan_apply(&d, &inv), Step::Write { .. }) && K::answer_is_evidence(&d, &inv);
            creates.then(|| (n.node.clone(), inv))
        })
        .collect();
    (!missed.is_empty()).then_some((d, missed))
}

/// One object's catch-up command on the nodes it missed: audited, its answers laid over the
/// cluster's snapshot, its outcome kept for the object's next pass. The audit row and whether
/// every node took it.
async fn send<K: TopologyObject>(
    ctx: &Context,
    o: &K,
    d: &K::Desired,
    topology: &Topology,
    missed: Missed,
    timeout: std::time::Duration,
    sent: &Sent,
) -> Option<(i64, bool)> {
    let cluster_key = key(&o.namespace().unwrap_or_default(), &o.cluster_ref().name);
    let _held = ctx
        .address_locks
        .hold(&cluster_key, &K::addresses(d), K::ADDRESS_HOLD)
        .await;
    let targets: std::collections::BTreeSet<String> = missed.keys().cloned().collect();
    let ns = o.namespace().unwrap_or_default();
    let scope = Scope {
        cluster_ns: &ns,
        cluster_name: &o.cluster_ref().name,
        topology: &topology.restricted_to(&targets),
        timeout,
    };
    let mut params = o.apply_params(d);
    params["catchUp"] = serde_json::json!("sent in bulk when the node came back");
    // A node that held it before it went away (a restart lost it) is repaired; one that never
    // received it is applied to.
    let last_audit = o.current_status().and_then(|s| s.last_audit_id());
    let (command_name, _) = pipeline::apply_command(o, &targets, last_audit);
    let intent = pipeline::intent(ctx, o, d, &command_name, params);
    let existed = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<BTreeMap<String, Arc<NodeInventory>>>> = Arc::default();
    let missed = Arc::new(missed);
    // Success is told once, on the ArtemisCluster (see cluster.rs), not by an Event per object.
    let told = scope.told(o).unless_created(&existed);
    let result = command::execute(ctx, told, scope.topology, scope.timeout, intent, |t| {
        let (d, missed, seen, existed) = (d.clone(), missed.clone(), seen.clone(), existed.clone());
        async move {
            let inv = missed.get(&t.node_id).cloned().unwrap_or_default();
            pipeline::apply_with_evidence::<K>(t, d, Planned::Snapshot(inv), &seen, &existed).await
        }
    })
    .await;
    let mut result = match result {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(object = %o.name_any(), error = %e, "catch-up command could not be recorded; the object's pass sends it");
            return None;
        }
    };
    if let (Ok(seen), Ok(mut sent)) = (seen.lock(), sent.lock()) {
        for (node, answer) in seen.iter() {
            if let Some(inv) = sent.get_mut(node) {
                inv.overlay(answer);
            }
        }
    }
    pipeline::stamp(&mut result.nodes, &command_name, result.audit_id);
    let ok = result
        .nodes
        .iter()
        .all(|n| matches!(n.outcome, Outcome::Applied | Outcome::Already));
    let kept = Kept {
        generation: o.meta().generation,
        nodes: result.nodes,
        audit_id: result.audit_id,
    };
    ctx.caught_up.keep(o.uid().unwrap_or_default(), kept);
    Some((result.audit_id, ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LastCommand;

    fn node(name: &str, outcome: Outcome, audit: Option<i64>) -> NodeOutcome {
        NodeOutcome {
            node: name.into(),
            outcome,
            last_command: audit.map(|audit_id| LastCommand {
                command: "queue.apply".into(),
                audit_id,
                outcome,
                at: "2026-12-04T00:00:00Z".into(),
                not_applied: vec![],
            }),
            endpoint: None,
            refusal: None,
            message: String::new(),
            detail: vec![],
        }
    }

    #[test]
    fn the_next_pass_reports_what_was_sent_once_and_only_for_its_generation() {
        let kept = CaughtUp::default();
        let sent = Kept {
            generation: Some(1),
            nodes: vec![node("c2", Outcome::Applied, Some(7))],
            audit_id: 7,
        };
        kept.keep("u".into(), sent.clone());
        let mut nodes = vec![
            node("c1", Outcome::Applied, Some(3)),
            node("c2", Outcome::Already, None),
        ];
        let mut last = Some(3);
        kept.report_into("u", Some(1), &mut nodes, &mut last);
        assert_eq!(nodes[1].outcome, Outcome::Applied);
        assert_eq!(nodes[1].last_command.as_ref().map(|c| c.audit_id), Some(7));
        assert_eq!(nodes[0].last_command.as_ref().map(|c| c.audit_id), Some(3));
        assert_eq!(last, Some(7));
        let mut again = vec![node("c2", Outcome::Already, None)];
        kept.report_into("u", Some(1), &mut again, &mut last);
        assert_eq!(again[0].outcome, Outcome::Already, "reported once");
        kept.keep("u".into(), sent);
        let mut newer = vec![node("c2", Outcome::Already, None)];
        let mut last = Some(9);
        kept.report_into("u", Some(2), &mut newer, &mut last);
        assert_eq!(
            (newer[0].outcome, last),
            (Outcome::Already, Some(9)),
            "another generation"
        );
    }

    #[test]
    fn a_node_the_pass_did_not_find_in_state_keeps_the_pass_outcome() {
        let kept = CaughtUp::default();
        let failed = Kept {
            generation: Some(1),
            nodes: vec![node("c2", Outcome::Applied, Some(7))],
            audit_id: 7,
        };
        kept.keep("u".into(), failed);
        let mut nodes = vec![node("c2", Outcome::WouldApply, None)];
        let mut last = None;
        kept.report_into("u", Some(1), &mut nodes, &mut last);
        assert_eq!(nodes[0].outcome, Outcome::WouldApply);
    }
}
