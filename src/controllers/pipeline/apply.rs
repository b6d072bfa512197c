//! apply: bring every live node to the spec — dereference, plan from the snapshot, and where a
//! node needs a write (and the gate allows it): its preflight, the audited command, its evidence
//! (the answer, or a verifying fresh read), what it shows of ownership; then the pass is judged
//! and reported.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::audit::{intent, stamp};
use super::claims::conflict_winner;
use super::dereference::{
    CredentialsAsk, DereferenceError, Dereferenced, Gate, dereference, ensure_credentials_asked,
    with_topology,
};
use super::plan::{CONTESTED_NEXT, History, merge, plan_apply, write_targets};
use super::preflight::{Planned, preflight_apply};
use super::status::{
    announce_not_ready, carry_history, next_pass, old_audit, old_conditions, old_not_owned, report,
    set_not_converging, set_paused_condition, stop,
};
use super::{FreshRead, Pass, Step, TopologyObject};
use crate::api::{NodeOutcome, NotOwned, Outcome, RefusalKind};
use crate::controllers::command::{self, Scope};
use crate::controllers::dependents::trigger_dependents;
use crate::controllers::{Context, ReconcileError, StatusConditions, conditions, ownership};
use crate::fanout::{self, NodeFailure, NodeReport, Target};
use crate::topology::inventory::NodeInventory;

/// apply: bring every live node to the spec.
pub async fn apply<K: TopologyObject>(
    obj: Arc<K>,
    ctx: Arc<Context>,
    asked: Option<CredentialsAsk>,
) -> Result<Action, ReconcileError> {
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
    } else if let Err(e) = ensure_credentials_asked(
        &ctx,
        &o.namespace().unwrap_or_default(),
        &o.cluster_ref().name,
        &deref.topology.secret_versions,
        asked.as_ref(),
    )
    .await
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

/// The desired object and its cluster's topology, or why the object cannot be applied now
/// (its status says so): an invalid spec, a cluster not usable, an older object's claim.
async fn apply_dereference<K: TopologyObject>(
    ctx: &Context,
    o: &K,
) -> Result<ControlFlow<Action, (K::Desired, Dereferenced)>, ReconcileError> {
    let d = match o.desired() {
        Ok(d) => d,
        Err(why) => {
            stop(ctx, o, None, "InvalidSpec", why.to_string()).await?;
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
    let deref = match with_topology(ctx, rt, cluster_key, &K::addresses(&d)) {
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
        ctx.event(o, false, "Adopted", &command, m);
    }
    if let Some(r) = record.as_ref().filter(|_| !new_writer.is_empty()) {
        let m = format!(
            "{target}: {}. A plain delete leaves it on the brokers; to destroy it, set spec.deletion.destroyConfirmation: \"{}\"",
            r.evidence(),
            r.confirmation
        );
        ctx.event(o, true, "OtherWriter", &format!("{}.apply", K::NOUN), m);
    }
    Ok(record)
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
        announce_not_ready::<K>(ctx, o, before.as_ref(), &conds);
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
pub(in crate::controllers) fn apply_command<K: TopologyObject>(
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
pub(in crate::controllers) async fn apply_with_evidence<K: TopologyObject>(
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
                let fresh = Arc::new(K::read_fresh(&t, &d, FreshRead::Apply).await?);
                record(&fresh);
                let report = K::apply_on(t.clone(), d.clone(), fresh.clone()).await?;
                verify::<K>(&t, &d, report, &fresh, seen).await
            }
            Err(f) => Err(f),
        },
    }
}

/// Verify one write: the plan on the broker's state after it must find nothing left to do. That
/// state is the write's own answer where it carries one (issue 45: an update's answer is the
/// queue right after it, in the same call), else a fresh read.
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
    let (after, answered) = match &report.seen {
        Some(seen) => (seen.clone(), true),
        None => match K::read_fresh(t, d, FreshRead::Apply).await {
            Ok(inv) => (Arc::new(inv), false),
            Err(e) => {
                return Ok(NodeReport {
                    message: format!(
                        "{} (not verified: the read afterwards failed: {e})",
                        report.message
                    ),
                    ..report
                });
            }
        },
    };
    if let Ok(mut v) = verified.lock() {
        v.insert(t.node_id.clone(), after.clone());
    }
    match K::plan_apply(d, &after) {
        Step::Nothing { .. } => Ok(report),
        // The broker holds neither what it held before nor what was sent: someone else wrote
        // in between (issue 22 item 1), not a field Artemis ignores. Never so by an answer:
        // nothing comes between a write and its own answer.
        Step::Write { what, detail }
            if !answered
                && !matches!(K::plan_apply(d, before), Step::Write { what: was, .. } if was == what) =>
        {
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
                "the broker accepted the write ({}) but {} shows it did not take effect ({what}): Artemis does not apply this change to an existing object. Not re-sent for this generation: change the spec back, or delete and re-create the object",
                report.message,
                if answered { "its answer" } else { "a fresh read" }
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

/// The execute stage on a fake broker node (`fanout::fake`): what each write sends and what
/// it takes as evidence (issue 23: a create is one write and no read; ADR-0049: an update
/// reads, writes and verifies).
#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::super::queue_fixtures::{desired, existing, node_with_address};
    use super::*;
    use crate::api::ArtemisQueue;
    use crate::controllers::queue::plan::DesiredQueue;
    use crate::fanout::fake::{FakeBroker, target};

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

    /// Issue 45: the address a create made is laid over the snapshot with its queue, so the
    /// node's counts match what is known once the creates are answered (no full read after a
    /// burst); an address that was there already is left to the reads (its other queues are
    /// not known here).
    #[tokio::test]
    async fn a_create_lays_the_address_it_made_over_the_snapshot_and_only_that() {
        let d = desired(json!({}));
        let fake = Arc::new(FakeBroker::with(NodeInventory::default()));
        let report = apply(&fake, &d, Planned::Snapshot(Arc::new(NodeInventory::default())))
            .await
            .expect("created");
        assert_eq!(
            fake.calls(),
            vec!["createAddress orders", "createQueue \"orders\""]
        );
        let mut known = NodeInventory::default();
        known.overlay(&report.seen.expect("the answers are the evidence"));
        let address = known.addresses.get("orders").expect("the address it made");
        assert_eq!(address.routing_types, vec!["ANYCAST"]);
        assert_eq!(address.queue_names, vec!["orders"]);
        assert_eq!((known.queues.len(), known.addresses.len()), (1, 1));

        let fake = Arc::new(FakeBroker::with(node_with_address()));
        let report = apply(&fake, &d, Planned::Snapshot(Arc::new(NodeInventory::default())))
            .await
            .expect("created on the address that was there");
        let seen = report.seen.expect("the queue's answer");
        assert!(seen.queues.contains_key("orders"));
        assert!(
            seen.addresses.is_empty() && seen.scope.as_ref().is_some_and(|s| s.addresses.is_empty()),
            "an address it did not make is not described from a guess"
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
    async fn an_update_writes_once_and_its_answer_is_the_evidence() {
        let d = desired(json!({"maxConsumers": 5}));
        let before = existing(&desired(json!({})));
        let fake = Arc::new(FakeBroker::with(before.clone()));
        let report = apply(&fake, &d, Planned::Fresh(Arc::new(before)))
            .await
            .expect("updated");
        assert_eq!(report.outcome, Outcome::Applied);
        assert_eq!(
            fake.calls(),
            vec!["updateQueue \"orders\""],
            "no verifying read (issue 45)"
        );
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

    /// A node holding the queue paused by hand, without persistence.
    fn hand_paused(d: &DesiredQueue, reports_persisted_pause: bool) -> Arc<FakeBroker> {
        let mut held = existing(d);
        held.queues
            .update("orders", |q| (q.paused, q.pause_persisted) = (true, Some(false)));
        Arc::new(FakeBroker {
            reports_persisted_pause,
            ..FakeBroker::with(held)
        })
    }

    /// Issue 49: declared Paused, a pause made by hand without persistence is read as such
    /// (PersistedPause beside the strict read), paused again with pause(true), and the write's
    /// evidence plans nothing more; a broker that does not report persistence (2.40) leaves it
    /// ALREADY, as paused is all it says.
    #[tokio::test]
    async fn a_pause_not_persisted_is_paused_again_with_persistence() {
        let d = desired(json!({"delivery": "Paused"}));
        let fake = hand_paused(&d, true);
        let t = target("n1", fake.clone());
        let fresh = ArtemisQueue::read_fresh(&t, &d, FreshRead::Apply)
            .await
            .expect("read");
        assert_eq!(fresh.queues["orders"].pause_persisted, Some(false));
        let report = apply(&fake, &d, Planned::Fresh(Arc::new(fresh)))
            .await
            .expect("paused again");
        assert_eq!(report.outcome, Outcome::Applied);
        assert!(
            report.message.contains("not persisted")
                && report.detail.iter().any(|l| l.contains("not persisted")),
            "{report:?}"
        );
        assert_eq!(
            fake.calls(),
            vec!["read", "read PersistedPause orders", "pause orders"]
        );
        let held = fake.state.lock().map(|s| s.queues["orders"].clone()).ok();
        assert_eq!(
            held.map(|q| (q.paused, q.pause_persisted)),
            Some((true, Some(true)))
        );

        let fake = hand_paused(&d, false);
        let t = target("n1", fake.clone());
        let fresh = ArtemisQueue::read_fresh(&t, &d, FreshRead::Apply)
            .await
            .expect("read");
        let report = apply(&fake, &d, Planned::Fresh(Arc::new(fresh)))
            .await
            .expect("judged");
        assert_eq!(report.outcome, Outcome::Already);
        assert!(report.message.contains("does not report"), "{report:?}");
        assert_eq!(fake.count("pause"), 0);
    }
}
