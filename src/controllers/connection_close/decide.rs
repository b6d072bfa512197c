//! ADR-0057's decisions for one ConnectionClose, pure: each stage takes the stored status and
//! what the shell (`mod.rs`) learned — the stored phase, the target's node, a read of the
//! target, the re-read right before the call, the call's outcome — and either goes on or ends
//! the pass with a [`Verdict`]: the status to write, the audit row to resolve, when to look
//! again. No broker, API server or database is touched here; the tests below need none.

use std::ops::ControlFlow;
use std::time::Duration;

use kube::runtime::controller::Action;

use super::super::command::CommandResult;
use super::super::conditions;
use crate::api::connection_close::{
    ClosePhase, CloseTarget, ConnectionClose, ConnectionCloseStatus, NodeConnections, TargetSnapshot,
};
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::broker::{BrokerError, BrokerManagement};
use crate::fanout;
use crate::topology::{LogicalNode, Topology};

const COMPLETE: &str = "Complete";
const FAILED: &str = "Failed";

pub use super::super::one_shot::Step;
use super::super::one_shot::{self, now};

/// How a pass ends: the status to write (after resolving `resolve`, an audit row already
/// written, with these outcomes) and when to look again.
#[derive(Debug, PartialEq)]
pub struct Verdict {
    pub status: ConnectionCloseStatus,
    pub resolve: Option<(i64, Vec<NodeOutcome>)>,
    pub then: Action,
}

impl Verdict {
    fn write<T>(status: &ConnectionCloseStatus, then: Action) -> ControlFlow<Verdict, T> {
        ControlFlow::Break(Verdict {
            status: status.clone(),
            resolve: None,
            then,
        })
    }
}

/// What a pass does with a close in its stored phase (ADR-0057 D5), decided from the status
/// alone.
pub fn step(
    status: &ConnectionCloseStatus,
    ttl_after_finished: Option<i64>,
    process_id: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Step {
    let stored = super::super::one_shot::Stored {
        finished: matches!(status.phase, ClosePhase::Completed | ClosePhase::Failed),
        armed: status.phase == ClosePhase::Closing,
        armed_by: status.armed_by.as_deref(),
        armed_at: status.armed_at.as_deref(),
        completed_at: status.completed_at.as_deref(),
    };
    super::super::one_shot::step(stored, ttl_after_finished, process_id, now)
}

/// The rules every broker write keeps did not hold (the cluster, its Secrets, its topology):
/// nothing is sent; look again soon.
pub fn not_usable(
    status: &mut ConnectionCloseStatus,
    generation: Option<i64>,
    reason: &str,
    message: String,
) -> Verdict {
    conditions::set(
        &mut status.conditions,
        COMPLETE,
        false,
        reason,
        message,
        generation,
    );
    Verdict {
        status: status.clone(),
        resolve: None,
        then: Action::requeue(Duration::from_secs(5)),
    }
}

/// D5: the process that armed the close did not finish: Failed with the outcome unknown.
/// Returns why, for the audit row.
pub fn fail_unknown(status: &mut ConnectionCloseStatus, generation: Option<i64>) -> &'static str {
    let why = "outcome unknown, not retried: the operator process that armed the close stopped before recording its outcome (ADR-0057 D5)";
    finish(status, ClosePhase::Failed, format!("Failed: {why}"), generation);
    why
}

/// D1: the node a close by id acts on, live — else it fails (no such node: ids are node-local)
/// or waits (the node is down: its connections can be neither read nor closed, and the broker
/// may still serve them).
pub fn judge_node<'t>(
    o: &ConnectionClose,
    topology: &'t Topology,
    status: &mut ConnectionCloseStatus,
) -> ControlFlow<Verdict, (&'t LogicalNode, &'t BrokerManagement)> {
    let generation = o.metadata.generation;
    let wanted = o.spec.target.node.clone().unwrap_or_default();
    let Some(node) = topology.find(&wanted) else {
        let known: Vec<&str> = topology.nodes.iter().map(|n| n.node_id.as_str()).collect();
        let message = format!(
            "spec.target.node {wanted} is not a logical node of cluster {}: use one of {known:?} (ids are node-local, ADR-0057 D1)",
            o.spec.cluster_ref.name
        );
        finish(status, ClosePhase::Failed, message, generation);
        return Verdict::write(status, Action::await_change());
    };
    if let Some(m) = &node.active {
        return ControlFlow::Continue((node, m));
    }
    let message = format!(
        "node {} is not live ({}): the target cannot be read or closed now; nothing was sent, the close waits for the node",
        node.node_id,
        node.not_live_reason.as_deref().unwrap_or("no active endpoint")
    );
    conditions::set(
        &mut status.conditions,
        COMPLETE,
        false,
        "NodeNotLive",
        message,
        generation,
    );
    status.nodes = vec![fanout::skipped(node)];
    if status.phase == ClosePhase::Pending {
        status.phase = ClosePhase::AwaitingConfirmation;
    }
    Verdict::write(status, Action::requeue(Duration::from_secs(10)))
}

/// Where a close by id goes: its node and the endpoint that answers for it.
#[derive(Clone, Copy, Debug)]
pub struct At<'a> {
    pub node: &'a str,
    pub endpoint: &'a str,
}

/// D3: the target as the broker reported it before anything is shown or armed. A read failure
/// is reported and read again later; a vanished target is a success (D2: known from a live
/// node that answered).
pub fn judge_target(
    o: &ConnectionClose,
    at: At<'_>,
    read: Result<Option<TargetSnapshot>, BrokerError>,
    status: &mut ConnectionCloseStatus,
) -> ControlFlow<Verdict, TargetSnapshot> {
    let t = &o.spec.target;
    match read {
        Ok(Some(snapshot)) => ControlFlow::Continue(snapshot),
        Ok(None) => {
            status.already_gone = true;
            status.nodes = vec![gone_outcome(at, t)];
            let message = format!("{} is already gone", describe(t));
            finish(status, ClosePhase::Completed, message, o.metadata.generation);
            Verdict::write(status, Action::await_change())
        }
        Err(e) => {
            let message = format!("re-reading the target failed: {e}");
            let generation = o.metadata.generation;
            conditions::set(
                &mut status.conditions,
                FAILED,
                false,
                "TargetUnreadable",
                message,
                generation,
            );
            Verdict::write(status, Action::requeue(Duration::from_secs(10)))
        }
    }
}

/// D3, D4: the consequence shown, and the confirmation checked against what the broker reports
/// (the client ID, or the remote address). Goes on with what was confirmed.
pub fn judge_confirmation(
    o: &ConnectionClose,
    snapshot: &TargetSnapshot,
    status: &mut ConnectionCloseStatus,
) -> ControlFlow<Verdict, Option<String>> {
    let expected = confirmation_of(snapshot);
    status.consequence = Some(consequence(snapshot.in_flight_messages));
    status.snapshot = Some(snapshot.clone());
    match confirmed(o, expected.as_deref(), status.shown_generation) {
        Ok(()) => ControlFlow::Continue(expected),
        Err(missing) => {
            let message = by_id_confirmation_message(o, status, expected.as_deref(), missing);
            ControlFlow::Break(awaiting_confirmation(o, status, message))
        }
    }
}

/// The pause annotation holds a confirmed close before it is armed: who it would disconnect
/// stays shown, nothing is armed or sent until the annotation goes (the same rule as every
/// other kind's broker writes).
pub fn judge_pause(o: &ConnectionClose, status: &mut ConnectionCloseStatus) -> ControlFlow<Verdict> {
    let paused = super::super::is_paused(&o.metadata);
    let waits = "confirmed, not sent; the close goes on when the annotation goes";
    conditions::note_paused(&mut status.conditions, paused, waits, o.metadata.generation);
    if !paused {
        return ControlFlow::Continue(());
    }
    ControlFlow::Break(awaiting_confirmation(
        o,
        status,
        conditions::paused_message(waits),
    ))
}

/// A close by id, armed and audited: where it goes, its audit row, what was confirmed.
pub struct Armed<'a> {
    pub at: At<'a>,
    pub audit_id: i64,
    pub expected: Option<String>,
}

/// D3: the re-read immediately before the call, compared with what was confirmed. A vanished
/// target completes the close; a changed (or unreadable) one sends nothing and goes back to the
/// confirmation. Either way the audit row is resolved.
pub fn judge_reread(
    o: &ConnectionClose,
    armed: &Armed<'_>,
    reread: Result<Option<TargetSnapshot>, BrokerError>,
    status: &mut ConnectionCloseStatus,
) -> ControlFlow<Verdict> {
    let t = &o.spec.target;
    let now_reports = match &reread {
        Ok(None) => {
            status.already_gone = true;
            status.nodes = vec![gone_outcome(armed.at, t)];
            let message = format!("{} is already gone", describe(t));
            finish(status, ClosePhase::Completed, message, o.metadata.generation);
            return ControlFlow::Break(Verdict {
                status: status.clone(),
                resolve: Some((armed.audit_id, status.nodes.clone())),
                then: Action::await_change(),
            });
        }
        Ok(Some(s)) => confirmation_of(s),
        Err(_) => None,
    };
    if reread.is_ok() && now_reports == armed.expected {
        return ControlFlow::Continue(());
    }
    let reports = armed.expected.clone().unwrap_or_else(|| "<nothing>".into());
    let why = match &reread {
        Err(e) => format!("re-reading the target right before the close failed ({e})"),
        _ => format!(
            "the broker now reports {:?} for {} (confirmed: {reports:?})",
            now_reports.unwrap_or_else(|| "<nothing>".into()),
            describe(t)
        ),
    };
    let not_sent = NodeOutcome {
        last_command: None,
        node: armed.at.node.to_string(),
        endpoint: Some(armed.at.endpoint.to_string()),
        outcome: Outcome::Failed,
        refusal: Some(RefusalKind::NameConflict),
        message: format!("not sent: {why}"),
        detail: vec![],
    };
    status.audit_id = Some(armed.audit_id);
    let message = format!("{why}: nothing was closed. Confirm again against what the broker reports now");
    let mut verdict = awaiting_confirmation(o, status, message);
    verdict.resolve = Some((armed.audit_id, vec![not_sent]));
    ControlFlow::Break(verdict)
}

/// D6: an address close's preview (per node, the consumer connections it would close), held
/// to the bulk cap and the confirmation. Goes on with the snapshot the audit row records.
pub fn judge_address_preview(
    o: &ConnectionClose,
    address: &str,
    bulk_cap: u64,
    preview: Result<Vec<NodeConnections>, super::read::PreviewFailed>,
    status: &mut ConnectionCloseStatus,
) -> ControlFlow<Verdict, TargetSnapshot> {
    let generation = o.metadata.generation;
    let per_node = match preview {
        Ok(per_node) => per_node,
        Err(failed) => {
            conditions::set(
                &mut status.conditions,
                FAILED,
                false,
                "PreviewFailed",
                failed.to_string(),
                generation,
            );
            return Verdict::write(status, Action::requeue(Duration::from_secs(10)));
        }
    };
    let total: u64 = per_node.iter().map(|p| p.connections).sum();
    let snapshot = TargetSnapshot {
        consumer_count: total,
        per_node,
        ..Default::default()
    };
    status.snapshot = Some(snapshot.clone());
    status.consequence = Some(consequence(None));
    if total > bulk_cap && !o.spec.allow_bulk {
        status.nodes = vec![];
        let message = format!(
            "BULK_CAP_EXCEEDED: closing the consumer connections of {address} would close about {total}, above the bulk cap of {bulk_cap}: create a new ConnectionClose with allowBulk: true to accept it"
        );
        finish(status, ClosePhase::Failed, message, generation);
        return Verdict::write(status, Action::await_change());
    }
    // D4, D5: the same confirmation rule as a close by id — the address, given after the
    // consequence was shown (or the documented annotation) — and the same compare-and-swap arm.
    if let Err(missing) = confirmed(o, Some(address), status.shown_generation) {
        let message = address_confirmation_message(address, total, missing);
        return ControlFlow::Break(awaiting_confirmation(o, status, message));
    }
    ControlFlow::Continue(snapshot)
}

/// Not armed: show who would be disconnected and what `spec.confirm` must say; check again
/// later (the target may go away meanwhile).
fn awaiting_confirmation(
    o: &ConnectionClose,
    status: &mut ConnectionCloseStatus,
    message: String,
) -> Verdict {
    status.phase = ClosePhase::AwaitingConfirmation;
    status.armed_by = None;
    status.armed_at = None;
    status.shown_generation = o.metadata.generation;
    status.message = Some(message.clone());
    let generation = o.metadata.generation;
    conditions::set(
        &mut status.conditions,
        COMPLETE,
        false,
        "AwaitingConfirmation",
        message,
        generation,
    );
    Verdict {
        status: status.clone(),
        resolve: None,
        then: Action::requeue(Duration::from_secs(30)),
    }
}

/// D4: the status that arms the close (`Closing`, by this process, now), written by
/// compare-and-swap so that exactly one process wins.
pub fn arming(status: &mut ConnectionCloseStatus, process_id: &str) {
    status.phase = ClosePhase::Closing;
    status.armed_by = Some(process_id.to_string());
    status.armed_at = Some(now());
    // The confirmation is given: what it asked for no longer stands (issue 50).
    let target = status.target_description.as_deref().unwrap_or("the target");
    status.message = Some(format!(
        "confirmed: closing {target} now; the outcome follows, never retried (ADR-0057 D5)"
    ));
}

/// ADR-0057 D3: what a human confirms — the client ID, or the remote address when there is none.
pub fn confirmation_of(snapshot: &TargetSnapshot) -> Option<String> {
    snapshot
        .client_id
        .clone()
        .or_else(|| snapshot.remote_address.clone())
}

/// ADR-0057 D4: the consequence, stated before the close can be armed — only what was
/// measured: on Artemis 2.40 a closed AMQP consumer's unsettled messages go back to their queue
/// with a delivery count of 0 or 1 (the interrupted delivery may count once;
/// tests/integration/connection_close.rs). Core/JMS consumers were not measured here.
pub fn consequence(in_flight: Option<u64>) -> String {
    let what = match in_flight {
        Some(n) => format!("closing returns {n} in-flight message(s) to their queues"),
        None => {
            "closing returns the in-flight messages to their queues (in-flight count not reported)".into()
        }
    };
    format!(
        "{what}. The interrupted delivery may count once toward max-delivery-attempts (measured on Artemis 2.40 with AMQP consumers: delivery count 0 or 1 afterwards), so a message already at its limit can go to the DLQ"
    )
}

pub fn describe(t: &CloseTarget) -> String {
    match (&t.address, &t.connection_id, &t.session_id, &t.consumer_id) {
        (Some(a), ..) => format!("consumer connections of address {a}"),
        (None, Some(c), None, _) => format!("connection {c}"),
        (None, Some(c), Some(sid), _) => format!("session {sid} of connection {c}"),
        (None, None, Some(sid), Some(cid)) => format!("consumer {cid} of session {sid}"),
        _ => "invalid target".into(),
    }
}

/// The documented annotation: automation confirms without review (recorded in the audit row).
pub fn without_review(o: &ConnectionClose) -> bool {
    o.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// Is the close confirmed by a human who saw the consequence (ADR-0057 D3, D4)? `Err` says
/// what to do.
fn confirmed(
    o: &ConnectionClose,
    expected: Option<&str>,
    shown_generation: Option<i64>,
) -> Result<(), ConfirmationMissing> {
    let generation = o.metadata.generation;
    match (o.spec.confirm.as_deref(), expected) {
        (None, _) => Err(ConfirmationMissing::NotGiven),
        (Some(c), e) if Some(c) != e => Err(ConfirmationMissing::Mismatch),
        _ if without_review(o) => Ok(()),
        // A confirmation counts only when given after the consequence was shown.
        _ if shown_generation.is_some_and(|s| generation.is_some_and(|g| g > s)) => Ok(()),
        _ => Err(ConfirmationMissing::BeforeShown),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConfirmationMissing {
    NotGiven,
    Mismatch,
    BeforeShown,
}

/// What `spec.confirm` must say to close this target, and why what it says does not count.
fn by_id_confirmation_message(
    o: &ConnectionClose,
    status: &ConnectionCloseStatus,
    expected: Option<&str>,
    missing: ConfirmationMissing,
) -> String {
    let t = &o.spec.target;
    let reports = expected.unwrap_or("<nothing>");
    let consequence = status.consequence.clone().unwrap_or_default();
    match missing {
        ConfirmationMissing::NotGiven => format!(
            "set spec.confirm to {reports:?} (the client the broker reports) to close {}; {consequence}",
            describe(t)
        ),
        ConfirmationMissing::Mismatch => format!(
            "spec.confirm is {:?} but the broker reports {reports:?} for {} now: not closing. If {reports:?} is the application to disconnect, set spec.confirm to it",
            o.spec.confirm.clone().unwrap_or_default(),
            describe(t)
        ),
        ConfirmationMissing::BeforeShown => format!(
            "spec.confirm was set before the consequence was shown, so it does not count: {consequence}. To close {} ({reports:?}), remove spec.confirm and set it again; automation that confirms without review annotates the object {}: \"true\" (recorded in the audit row)",
            describe(t),
            crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION
        ),
    }
}

fn address_confirmation_message(address: &str, total: u64, missing: ConfirmationMissing) -> String {
    let what = format!("about {total} consumer connection(s) of {address} on every live node");
    let consequence = consequence(None);
    match missing {
        ConfirmationMissing::NotGiven | ConfirmationMissing::Mismatch => {
            format!("set spec.confirm to {address:?} to close {what}; {consequence}")
        }
        ConfirmationMissing::BeforeShown => format!(
            "spec.confirm was set before the consequence was shown, so it does not count: {consequence}. To close {what}, remove spec.confirm and set it again; automation that confirms without review annotates the object {}: \"true\" (recorded in the audit row)",
            crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION
        ),
    }
}

/// D2: the node answered and the target is not there.
fn gone_outcome(at: At<'_>, t: &CloseTarget) -> NodeOutcome {
    NodeOutcome {
        last_command: None,
        node: at.node.to_string(),
        endpoint: Some(at.endpoint.to_string()),
        outcome: Outcome::Already,
        refusal: None,
        message: format!("{} is not on this node (already gone)", describe(t)),
        detail: vec![],
    }
}

/// D5: a close by id called: Completed when the node closed it or found it gone, else Failed,
/// never retried.
pub fn record_by_id_result(
    status: &mut ConnectionCloseStatus,
    result: CommandResult,
    t: &CloseTarget,
    generation: Option<i64>,
) {
    status.audit_id = Some(result.audit_id);
    status.already_gone = result.nodes.iter().all(|n| n.outcome == Outcome::Already);
    let ok = result
        .nodes
        .iter()
        .all(|n| matches!(n.outcome, Outcome::Applied | Outcome::Already));
    let message = result
        .nodes
        .first()
        .map(|n| n.message.clone())
        .unwrap_or_default();
    status.nodes = result.nodes;
    if ok {
        finish(
            status,
            ClosePhase::Completed,
            format!("{}: {message}", describe(t)),
            generation,
        );
    } else {
        let message = format!("{}: {message}; not retried (ADR-0057 D5)", describe(t));
        finish(status, ClosePhase::Failed, message, generation);
    }
}

/// D5: an address close called on every live node: Failed if any node failed, never retried.
pub fn record_address_result(
    status: &mut ConnectionCloseStatus,
    result: CommandResult,
    address: &str,
    generation: Option<i64>,
) {
    status.audit_id = Some(result.audit_id);
    status.already_gone = result
        .nodes
        .iter()
        .all(|n| matches!(n.outcome, Outcome::Already | Outcome::SkippedNotLive));
    let failed = result.nodes.iter().any(|n| n.outcome == Outcome::Failed);
    status.nodes = result.nodes;
    if failed {
        let message = "some nodes failed; see status.nodes. Not retried (ADR-0057 D5)".into();
        finish(status, ClosePhase::Failed, message, generation);
    } else {
        let message = format!("closed consumer connections of {address}; see status.nodes");
        finish(status, ClosePhase::Completed, message, generation);
    }
}

/// A close's words for its stages.
const REASONS: one_shot::Reasons = one_shot::Reasons {
    done: "Closed",
    not_done: "NotClosed",
    failed: "CloseFailed",
    in_flight: "Closing",
};

fn finish(status: &mut ConnectionCloseStatus, phase: ClosePhase, message: String, generation: Option<i64>) {
    status.phase = phase;
    status.completed_at = Some(now());
    let done = phase == ClosePhase::Completed;
    one_shot::set_finished(&mut status.conditions, done, REASONS, &message, generation);
    status.message = Some(message);
}

/// Ready, Reconciling and Stalled from the phase (`one_shot::stage_conditions`).
pub fn with_phase_conditions(status: &ConnectionCloseStatus) -> ConnectionCloseStatus {
    let mut status = status.clone();
    let stage = match status.phase {
        ClosePhase::Pending => one_shot::Stage::Pending,
        ClosePhase::AwaitingConfirmation => one_shot::Stage::AwaitingConfirmation,
        ClosePhase::Closing => one_shot::Stage::InFlight,
        ClosePhase::Completed => one_shot::Stage::Completed,
        ClosePhase::Failed => one_shot::Stage::Failed,
    };
    let message = status.message.clone().unwrap_or_default();
    let generation = status.observed_generation;
    one_shot::stage_conditions(&mut status.conditions, stage, REASONS, message, generation);
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirmation_is_the_client_id_or_else_the_remote_address() {
        let mut s = TargetSnapshot {
            client_id: Some("orders-app".into()),
            remote_address: Some("10.0.0.7:5123".into()),
            ..Default::default()
        };
        assert_eq!(confirmation_of(&s).as_deref(), Some("orders-app"));
        s.client_id = None;
        assert_eq!(confirmation_of(&s).as_deref(), Some("10.0.0.7:5123"));
    }

    #[test]
    fn the_consequence_states_the_count_or_says_it_is_not_reported() {
        assert!(consequence(Some(3)).contains("returns 3 in-flight"));
        assert!(consequence(None).contains("not reported"));
        assert!(consequence(Some(0)).contains("DLQ"));
    }
}

#[cfg(test)]
mod phase_condition_tests {
    use super::*;

    fn ready(s: &ConnectionCloseStatus) -> (String, String, String) {
        let c = conditions::get(&s.conditions, conditions::READY)
            .cloned()
            .unwrap_or_else(|| panic!("Ready"));
        (c.status, c.reason, c.message)
    }

    #[test]
    fn an_armed_close_no_longer_asks_for_the_confirmation_it_was_given() {
        let mut s = ConnectionCloseStatus {
            phase: ClosePhase::AwaitingConfirmation,
            target_description: Some("connection c1 on node n1".into()),
            message: Some("set spec.confirm to \"orders-app\" (the client the broker reports)".into()),
            ..Default::default()
        };
        arming(&mut s, "p1");
        let (status, reason, message) = ready(&with_phase_conditions(&s));
        assert_eq!((status.as_str(), reason.as_str()), ("False", "Closing"));
        assert!(!message.contains("set spec.confirm"), "{message}");
        assert!(message.contains("connection c1 on node n1"), "{message}");
    }

    #[test]
    fn a_close_whose_cluster_is_missing_says_so_in_ready_and_waits_for_a_person() {
        let mut s = ConnectionCloseStatus::default();
        let why = "ArtemisCluster ns/nope does not exist".to_string();
        let _ = not_usable(&mut s, Some(1), "ClusterNotFound", why.clone());
        let s = with_phase_conditions(&s);
        assert_eq!(ready(&s), ("False".into(), "ClusterNotFound".into(), why));
        let stalled = conditions::get(&s.conditions, conditions::STALLED).map(|c| c.status.clone());
        assert_eq!(stalled.as_deref(), Some("True"));
        // A close on its way (the cluster not polled yet) stays on its way.
        let mut s = ConnectionCloseStatus::default();
        let _ = not_usable(&mut s, Some(1), "ClusterNotReady", "not polled yet".into());
        let s = with_phase_conditions(&s);
        let reconciling = conditions::get(&s.conditions, conditions::RECONCILING).map(|c| c.status.clone());
        assert_eq!(reconciling.as_deref(), Some("True"));
    }
}

#[cfg(test)]
mod step_tests {
    use super::super::super::one_shot::ARMED_GRACE;
    use super::*;

    fn at(s: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
    }

    fn status(phase: ClosePhase) -> ConnectionCloseStatus {
        ConnectionCloseStatus {
            phase,
            ..Default::default()
        }
    }

    #[test]
    fn a_close_not_armed_is_acted_on_and_a_finished_one_waits_for_its_ttl() {
        assert_eq!(step(&status(ClosePhase::Pending), None, "p", at(0)), Step::Act);
        assert_eq!(
            step(&status(ClosePhase::AwaitingConfirmation), None, "p", at(0)),
            Step::Act
        );
        let mut done = status(ClosePhase::Completed);
        done.completed_at = Some(at(0).to_rfc3339());
        assert_eq!(step(&done, None, "p", at(10)), Step::Wait(None));
        assert_eq!(
            step(&done, Some(60), "p", at(10)),
            Step::Wait(Some(Duration::from_secs(50)))
        );
        assert_eq!(step(&done, Some(60), "p", at(60)), Step::DeleteObject);
    }

    #[test]
    fn a_close_armed_by_another_process_is_left_alone_for_the_grace_then_failed_unknown() {
        let mut armed = status(ClosePhase::Closing);
        armed.armed_by = Some("other".into());
        armed.armed_at = Some(at(0).to_rfc3339());
        let grace = ARMED_GRACE.as_secs() as i64;
        assert_eq!(
            step(&armed, None, "me", at(10)),
            Step::Wait(Some(
                ARMED_GRACE - Duration::from_secs(10) + Duration::from_secs(1)
            ))
        );
        assert_eq!(step(&armed, None, "me", at(grace + 1)), Step::FailUnknown);
        // Armed by this process in a pass that ended before its outcome (an error after
        // arming): never called again either.
        armed.armed_by = Some("me".into());
        assert_eq!(step(&armed, None, "me", at(10)), Step::FailUnknown);
    }
}

#[cfg(test)]
mod stage_tests {
    use super::*;
    use crate::api::Condition;

    fn close(generation: i64, spec: serde_json::Value, annotations: serde_json::Value) -> ConnectionClose {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
            "metadata": {"name": "x", "namespace": "ns", "generation": generation, "annotations": annotations},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("close json: {e}"))
    }

    fn by_id(generation: i64, confirm: Option<&str>) -> ConnectionClose {
        let mut spec =
            serde_json::json!({"clusterRef": {"name": "c"}, "target": {"node": "n1", "connectionId": "7"}});
        if let Some(c) = confirm {
            spec["confirm"] = c.into();
        }
        close(generation, spec, serde_json::json!({}))
    }

    #[test]
    fn a_paused_close_is_shown_and_never_armed_until_the_annotation_goes() {
        let spec = serde_json::json!({"clusterRef": {"name": "c"}, "target": {"node": "n1", "connectionId": "7"}, "confirm": "orders-app"});
        let paused = close(
            3,
            spec.clone(),
            serde_json::json!({"artemis-studio.io/paused": "true"}),
        );
        let mut status = ConnectionCloseStatus::default();
        let ControlFlow::Break(v) = judge_pause(&paused, &mut status) else {
            panic!("a paused close goes on to arm")
        };
        assert_eq!(v.status.phase, ClosePhase::AwaitingConfirmation);
        assert!(v.status.armed_by.is_none() && v.resolve.is_none());
        let p = conditions::get(&v.status.conditions, conditions::PAUSED).expect("Paused");
        assert_eq!((p.status.as_str(), p.reason.as_str()), ("True", "Annotated"));
        let unpaused = close(3, spec, serde_json::json!({}));
        assert!(judge_pause(&unpaused, &mut status).is_continue());
        let p = conditions::get(&status.conditions, conditions::PAUSED).expect("Paused");
        assert_eq!(p.status, "False");
    }

    fn node(id: &str, live: bool) -> LogicalNode {
        let management = fanout::fake::target(id, Default::default()).management;
        LogicalNode {
            node_id: id.into(),
            active: live.then_some(management),
            not_live_reason: (!live).then(|| "no endpoint answered".into()),
            ..Default::default()
        }
    }

    fn topology(nodes: Vec<LogicalNode>) -> Topology {
        Topology {
            polled_at: std::time::Instant::now(),
            polled_at_utc: chrono::Utc::now(),
            nodes,
            unreachable: vec![],
            fresh_reads: crate::topology::FreshReads::new(),
            secret_versions: Default::default(),
        }
    }

    fn app(client: &str) -> TargetSnapshot {
        TargetSnapshot {
            client_id: Some(client.into()),
            in_flight_messages: Some(2),
            ..Default::default()
        }
    }

    fn condition<'a>(s: &'a ConnectionCloseStatus, kind: &str) -> &'a Condition {
        s.conditions
            .iter()
            .find(|c| c.type_ == kind)
            .unwrap_or_else(|| panic!("no {kind} condition in {:?}", s.conditions))
    }

    const AT: At<'static> = At {
        node: "n1",
        endpoint: "http://n1/jolokia",
    };

    #[test]
    fn a_node_the_cluster_does_not_have_fails_the_close_and_a_node_that_is_down_makes_it_wait() {
        let mut status = ConnectionCloseStatus::default();
        let ControlFlow::Break(v) =
            judge_node(&by_id(1, None), &topology(vec![node("n2", true)]), &mut status)
        else {
            panic!("an unknown node goes on")
        };
        assert_eq!(
            (v.status.phase, v.then.clone()),
            (ClosePhase::Failed, Action::await_change())
        );
        assert!(
            v.status.message.as_deref().is_some_and(|m| m.contains("n2")),
            "names the known nodes"
        );

        let mut status = ConnectionCloseStatus::default();
        let ControlFlow::Break(v) =
            judge_node(&by_id(1, None), &topology(vec![node("n1", false)]), &mut status)
        else {
            panic!("a node that is down goes on")
        };
        assert_eq!(
            v.status.phase,
            ClosePhase::AwaitingConfirmation,
            "nothing was sent; it waits"
        );
        assert_eq!(condition(&v.status, COMPLETE).reason, "NodeNotLive");
        assert_eq!(v.status.nodes[0].outcome, Outcome::SkippedNotLive);
        assert_eq!(v.then, Action::requeue(Duration::from_secs(10)));
        assert!(v.resolve.is_none(), "no audit row: nothing was armed");

        let t = topology(vec![node("n1", true)]);
        let found = judge_node(&by_id(1, None), &t, &mut ConnectionCloseStatus::default());
        assert!(matches!(found, ControlFlow::Continue((n, _)) if n.node_id == "n1"));
    }

    #[test]
    fn a_target_already_gone_completes_and_one_that_cannot_be_read_is_read_again() {
        let mut status = ConnectionCloseStatus::default();
        let ControlFlow::Break(v) = judge_target(&by_id(1, None), AT, Ok(None), &mut status) else {
            panic!("a gone target goes on")
        };
        assert_eq!(v.status.phase, ClosePhase::Completed);
        assert!(v.status.already_gone);
        assert_eq!(v.status.nodes[0].outcome, Outcome::Already);
        assert!(v.resolve.is_none(), "nothing was armed, so no audit row");

        let mut status = ConnectionCloseStatus::default();
        let read = Err(BrokerError::Timeout(5));
        let ControlFlow::Break(v) = judge_target(&by_id(1, None), AT, read, &mut status) else {
            panic!("a failed read goes on")
        };
        assert_eq!(v.status.phase, ClosePhase::Pending, "not finished: read again");
        assert_eq!(condition(&v.status, FAILED).reason, "TargetUnreadable");
        assert_eq!(v.then, Action::requeue(Duration::from_secs(10)));
    }

    #[test]
    fn a_confirmation_counts_only_when_given_for_what_the_broker_reports_after_it_was_shown() {
        // Not given: the consequence and what to confirm are shown.
        let mut status = ConnectionCloseStatus::default();
        let ControlFlow::Break(v) = judge_confirmation(&by_id(1, None), &app("orders-app"), &mut status)
        else {
            panic!("no confirmation goes on")
        };
        assert_eq!(v.status.phase, ClosePhase::AwaitingConfirmation);
        assert_eq!(v.status.shown_generation, Some(1));
        assert!(
            v.status
                .message
                .as_deref()
                .is_some_and(|m| m.contains("\"orders-app\""))
        );
        assert!(
            v.status
                .consequence
                .as_deref()
                .is_some_and(|c| c.contains("returns 2 in-flight"))
        );
        // Given in the same generation it was shown (set with the object): does not count.
        let mut fresh = ConnectionCloseStatus::default();
        let flow = judge_confirmation(&by_id(1, Some("orders-app")), &app("orders-app"), &mut fresh);
        assert!(
            matches!(&flow, ControlFlow::Break(v) if v.status.message.as_deref().is_some_and(|m| m.contains("before the consequence was shown")))
        );
        // Given after it was shown, for another application: not closing.
        let mut shown = v.status.clone();
        let flow = judge_confirmation(&by_id(2, Some("billing")), &app("orders-app"), &mut shown);
        assert!(
            matches!(&flow, ControlFlow::Break(v) if v.status.message.as_deref().is_some_and(|m| m.contains("but the broker reports")))
        );
        // Given after it was shown, for what the broker reports: armed next.
        let mut shown = v.status.clone();
        let flow = judge_confirmation(&by_id(2, Some("orders-app")), &app("orders-app"), &mut shown);
        assert_eq!(flow, ControlFlow::Continue(Some("orders-app".into())));
        // Automation that says so confirms without review.
        let annotated = close(
            1,
            serde_json::json!({"clusterRef": {"name": "c"}, "target": {"node": "n1", "connectionId": "7"}, "confirm": "orders-app"}),
            serde_json::json!({crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION: "true"}),
        );
        let flow = judge_confirmation(
            &annotated,
            &app("orders-app"),
            &mut ConnectionCloseStatus::default(),
        );
        assert_eq!(flow, ControlFlow::Continue(Some("orders-app".into())));
    }

    #[test]
    fn the_reread_before_the_call_sends_only_to_what_was_confirmed_and_always_resolves_the_audit_row() {
        let o = by_id(2, Some("orders-app"));
        let armed = Armed {
            at: AT,
            audit_id: 41,
            expected: Some("orders-app".into()),
        };
        let same = judge_reread(
            &o,
            &armed,
            Ok(Some(app("orders-app"))),
            &mut ConnectionCloseStatus::default(),
        );
        assert!(matches!(same, ControlFlow::Continue(())));

        let ControlFlow::Break(gone) =
            judge_reread(&o, &armed, Ok(None), &mut ConnectionCloseStatus::default())
        else {
            panic!("a gone target is called")
        };
        assert_eq!(gone.status.phase, ClosePhase::Completed);
        let (id, nodes) = gone.resolve.unwrap_or_default();
        assert_eq!((id, nodes[0].outcome), (41, Outcome::Already));

        for reread in [Ok(Some(app("another-app"))), Err(BrokerError::Timeout(5))] {
            let mut status = ConnectionCloseStatus::default();
            let ControlFlow::Break(changed) = judge_reread(&o, &armed, reread, &mut status) else {
                panic!("a changed target is called")
            };
            assert_eq!(
                changed.status.phase,
                ClosePhase::AwaitingConfirmation,
                "confirm again"
            );
            assert_eq!(changed.status.audit_id, Some(41));
            let (id, nodes) = changed.resolve.unwrap_or_default();
            assert_eq!(id, 41);
            assert_eq!(
                (nodes[0].outcome, nodes[0].refusal),
                (Outcome::Failed, Some(RefusalKind::NameConflict))
            );
            assert!(nodes[0].message.starts_with("not sent"), "{}", nodes[0].message);
        }
    }

    #[test]
    fn an_address_close_over_the_bulk_cap_fails_unless_allowed_and_a_failed_preview_is_read_again() {
        let spec = |allow: bool| serde_json::json!({"clusterRef": {"name": "c"}, "target": {"address": "orders"}, "confirm": "orders", "allowBulk": allow});
        let preview = || {
            Ok(vec![
                NodeConnections {
                    node: "n1".into(),
                    connections: 3,
                },
                NodeConnections {
                    node: "n2".into(),
                    connections: 2,
                },
            ])
        };
        let mut status = ConnectionCloseStatus::default();
        let o = close(1, spec(false), serde_json::json!({}));
        let ControlFlow::Break(v) = judge_address_preview(&o, "orders", 4, preview(), &mut status) else {
            panic!("over the cap goes on")
        };
        assert_eq!(v.status.phase, ClosePhase::Failed);
        assert!(
            v.status
                .message
                .as_deref()
                .is_some_and(|m| m.starts_with("BULK_CAP_EXCEEDED") && m.contains("about 5"))
        );

        // Allowed: held to the confirmation like a close by id (given with the object: not yet).
        let o = close(1, spec(true), serde_json::json!({}));
        let flow = judge_address_preview(&o, "orders", 4, preview(), &mut ConnectionCloseStatus::default());
        assert!(matches!(&flow, ControlFlow::Break(v) if v.status.phase == ClosePhase::AwaitingConfirmation));
        let mut shown = ConnectionCloseStatus {
            shown_generation: Some(1),
            ..Default::default()
        };
        let o = close(2, spec(true), serde_json::json!({}));
        let ControlFlow::Continue(snapshot) = judge_address_preview(&o, "orders", 4, preview(), &mut shown)
        else {
            panic!("confirmed after the preview does not go on")
        };
        assert_eq!(snapshot.consumer_count, 5);

        let mut status = ConnectionCloseStatus::default();
        let failed = judge_address_preview(
            &o,
            "orders",
            4,
            Err(super::super::read::PreviewFailed {
                node: "n2".into(),
                source: crate::broker::BrokerError::Timeout(5),
            }),
            &mut status,
        );
        assert!(
            matches!(&failed, ControlFlow::Break(v) if condition(&v.status, FAILED).reason == "PreviewFailed" && v.then == Action::requeue(Duration::from_secs(10)))
        );
    }
}

/// The rules the stage tests above left unproven (issue 50: each one survived a mutant).
#[cfg(test)]
mod rule_tests {
    use super::*;
    use crate::store::CommandVerdict;

    fn by_id(generation: i64, confirm: Option<&str>) -> ConnectionClose {
        let mut spec =
            serde_json::json!({"clusterRef": {"name": "c"}, "target": {"node": "n1", "connectionId": "7"}});
        if let Some(c) = confirm {
            spec["confirm"] = c.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
            "metadata": {"name": "x", "namespace": "ns", "generation": generation},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("close json: {e}"))
    }

    fn app(client: &str) -> TargetSnapshot {
        TargetSnapshot {
            client_id: Some(client.into()),
            in_flight_messages: Some(2),
            ..Default::default()
        }
    }

    /// ADR-0057 D4: a confirmation written with the object (generation 1) was given before the
    /// consequence was shown. The first pass shows it (shown at generation 1); every later pass
    /// of that same generation still refuses to arm: only an edit after the showing counts.
    #[test]
    fn a_confirmation_written_with_the_object_does_not_count_on_any_later_pass() {
        let o = by_id(1, Some("orders-app"));
        let mut status = ConnectionCloseStatus::default();
        let ControlFlow::Break(first) = judge_confirmation(&o, &app("orders-app"), &mut status) else {
            panic!("a confirmation given with the object arms the close")
        };
        assert_eq!(first.status.shown_generation, Some(1));
        let mut shown = first.status.clone();
        let ControlFlow::Break(again) = judge_confirmation(&o, &app("orders-app"), &mut shown) else {
            panic!("the same generation, shown once, arms the close on the next pass")
        };
        assert_eq!(again.status.phase, ClosePhase::AwaitingConfirmation);
        assert!(
            again
                .status
                .message
                .as_deref()
                .is_some_and(|m| m.contains("before the consequence was shown")),
            "{:?}",
            again.status.message
        );
        // The same rule holds for an address close.
        let spec = serde_json::json!({"clusterRef": {"name": "c"}, "target": {"address": "orders"}, "confirm": "orders"});
        let o: ConnectionClose = serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
            "metadata": {"name": "x", "namespace": "ns", "generation": 1},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("close json: {e}"));
        let mut shown = ConnectionCloseStatus {
            shown_generation: Some(1),
            ..Default::default()
        };
        let preview = Ok(vec![NodeConnections {
            node: "n1".into(),
            connections: 1,
        }]);
        let flow = judge_address_preview(&o, "orders", 10, preview, &mut shown);
        assert!(
            matches!(&flow, ControlFlow::Break(v) if v.status.phase == ClosePhase::AwaitingConfirmation),
            "an address close confirmed with the object is armed on the next pass"
        );
    }

    fn outcome(node: &str, outcome: Outcome) -> NodeOutcome {
        NodeOutcome {
            last_command: None,
            node: node.into(),
            endpoint: None,
            outcome,
            refusal: None,
            message: format!("{outcome:?} on {node}"),
            detail: vec![],
        }
    }

    fn result(nodes: Vec<NodeOutcome>) -> CommandResult {
        CommandResult {
            audit_id: 7,
            verdict: CommandVerdict::of(&nodes),
            nodes,
        }
    }

    /// ADR-0057 D2: `alreadyGone` is the API's dedicated flag, true only when the node answered
    /// that the target was not there; a close that closed something says false, and both are
    /// Completed. A failed close is Failed, never retried, and not gone.
    #[test]
    fn already_gone_is_true_only_when_the_node_found_nothing_to_close() {
        let t = by_id(2, Some("orders-app")).spec.target;
        for (node_outcome, phase, gone) in [
            (Outcome::Applied, ClosePhase::Completed, false),
            (Outcome::Already, ClosePhase::Completed, true),
            (Outcome::Failed, ClosePhase::Failed, false),
        ] {
            let mut status = ConnectionCloseStatus::default();
            record_by_id_result(
                &mut status,
                result(vec![outcome("n1", node_outcome)]),
                &t,
                Some(2),
            );
            assert_eq!(
                (status.phase, status.already_gone, status.audit_id),
                (phase, gone, Some(7)),
                "{node_outcome:?}"
            );
        }
        // An address close: gone only when no node closed anything (a node not live was not
        // asked); any failed node fails the close.
        for (nodes, phase, gone) in [
            (
                vec![Outcome::Applied, Outcome::Already],
                ClosePhase::Completed,
                false,
            ),
            (
                vec![Outcome::Already, Outcome::SkippedNotLive],
                ClosePhase::Completed,
                true,
            ),
            (vec![Outcome::Applied, Outcome::Failed], ClosePhase::Failed, false),
        ] {
            let outcomes = nodes
                .iter()
                .enumerate()
                .map(|(i, o)| outcome(&format!("n{i}"), *o))
                .collect();
            let mut status = ConnectionCloseStatus::default();
            record_address_result(&mut status, result(outcomes), "orders", Some(2));
            assert_eq!((status.phase, status.already_gone), (phase, gone), "{nodes:?}");
        }
    }

    /// ADR-0057 D3: a close never arms without spec.confirm. Neither an edit after the showing
    /// (a label, a new generation) nor the confirm-without-review annotation stands in for it:
    /// the annotation skips the review, never the confirmation itself.
    #[test]
    fn a_close_without_spec_confirm_never_arms_whatever_else_changed() {
        let mut edited = by_id(2, None);
        let mut shown = ConnectionCloseStatus {
            shown_generation: Some(1),
            ..Default::default()
        };
        let ControlFlow::Break(v) = judge_confirmation(&edited, &app("orders-app"), &mut shown) else {
            panic!("an edit after the showing arms a close nobody confirmed")
        };
        assert!(
            v.status
                .message
                .as_deref()
                .is_some_and(|m| m.starts_with("set spec.confirm to \"orders-app\"")),
            "{:?}",
            v.status.message
        );
        edited.metadata.annotations = Some(
            [(
                crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION.to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        let mut status = ConnectionCloseStatus::default();
        assert!(
            judge_confirmation(&edited, &app("orders-app"), &mut status).is_break(),
            "the annotation arms a close with no spec.confirm"
        );
    }

    /// ADR-0057 D6: an address close previews per node; the snapshot shown (and recorded in
    /// the audit row) names each node's consumer connections, not only their sum.
    #[test]
    fn an_address_close_shows_the_connections_it_would_close_per_node() {
        let o: ConnectionClose = serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
            "metadata": {"name": "x", "namespace": "ns", "generation": 2},
            "spec": {"clusterRef": {"name": "c"}, "target": {"address": "orders"}, "confirm": "orders"},
        }))
        .unwrap_or_else(|e| panic!("close json: {e}"));
        let per_node = vec![
            NodeConnections {
                node: "n1".into(),
                connections: 3,
            },
            NodeConnections {
                node: "n2".into(),
                connections: 2,
            },
        ];
        let mut status = ConnectionCloseStatus {
            shown_generation: Some(1),
            ..Default::default()
        };
        let ControlFlow::Continue(snapshot) =
            judge_address_preview(&o, "orders", 10, Ok(per_node.clone()), &mut status)
        else {
            panic!("a confirmed address close within the cap does not go on")
        };
        assert_eq!(snapshot.per_node, per_node);
        assert_eq!(snapshot.consumer_count, 5);
        assert_eq!(status.snapshot.map(|s| s.per_node), Some(per_node));
    }

    /// ADR-0057 D5: a close armed by a process that stopped before recording its outcome is
    /// Failed with the outcome unknown and never retried; the audit row is resolved with that
    /// same reason, so it says why nobody knows what the broker did.
    #[test]
    fn a_close_whose_outcome_was_not_recorded_fails_as_unknown_in_status_and_audit_row() {
        let mut status = ConnectionCloseStatus {
            phase: ClosePhase::Closing,
            ..Default::default()
        };
        let why = fail_unknown(&mut status, Some(3));
        assert!(
            why.contains("outcome unknown") && why.contains("not retried"),
            "{why}"
        );
        assert_eq!(status.phase, ClosePhase::Failed);
        assert!(
            status.message.as_deref().is_some_and(|m| m.contains(why)),
            "{:?}",
            status.message
        );
    }

    /// ADR-0057 D3: when the re-read right before the call fails, nothing is sent and the user
    /// is told that the read failed, with the broker's error, not that the target changed.
    #[test]
    fn a_failed_reread_says_the_read_failed_and_sends_nothing() {
        let o = by_id(2, Some("orders-app"));
        let armed = Armed {
            at: At {
                node: "n1",
                endpoint: "http://n1/jolokia",
            },
            audit_id: 41,
            expected: Some("orders-app".into()),
        };
        let mut status = ConnectionCloseStatus::default();
        let ControlFlow::Break(v) = judge_reread(&o, &armed, Err(BrokerError::Timeout(5)), &mut status)
        else {
            panic!("a failed re-read is called")
        };
        let message = v.status.message.clone().unwrap_or_default();
        assert!(
            message.contains("re-reading the target right before the close failed")
                && message.contains("timed out after 5s"),
            "{message}"
        );
        let (_, nodes) = v.resolve.unwrap_or_default();
        assert!(
            nodes[0].message.starts_with("not sent: re-reading"),
            "{}",
            nodes[0].message
        );
    }

    /// Every message, Event and audit row names the target as a person would: the address, the
    /// connection, the session of a connection, or the consumer of a session.
    #[test]
    fn the_target_is_named_by_what_it_is() {
        let target = |json: serde_json::Value| -> CloseTarget {
            serde_json::from_value(json).unwrap_or_else(|e| panic!("target json: {e}"))
        };
        for (t, named) in [
            (
                serde_json::json!({"address": "orders"}),
                "consumer connections of address orders",
            ),
            (
                serde_json::json!({"node": "n1", "connectionId": "7"}),
                "connection 7",
            ),
            (
                serde_json::json!({"node": "n1", "connectionId": "7", "sessionId": "s1"}),
                "session s1 of connection 7",
            ),
            (
                serde_json::json!({"node": "n1", "sessionId": "s1", "consumerId": "c1"}),
                "consumer c1 of session s1",
            ),
            (serde_json::json!({"node": "n1"}), "invalid target"),
        ] {
            assert_eq!(describe(&target(t.clone())), named, "{t}");
        }
    }

    /// ADR-0057 D6 (the ADR-0022 bulk cap): an address close is refused only above the cap;
    /// exactly at it, it goes on to the confirmation.
    #[test]
    fn an_address_close_at_the_bulk_cap_is_not_over_it() {
        let o: ConnectionClose = serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
            "metadata": {"name": "x", "namespace": "ns", "generation": 2},
            "spec": {"clusterRef": {"name": "c"}, "target": {"address": "orders"}, "confirm": "orders"},
        }))
        .unwrap_or_else(|e| panic!("close json: {e}"));
        let preview = || {
            Ok(vec![NodeConnections {
                node: "n1".into(),
                connections: 5,
            }])
        };
        let mut status = ConnectionCloseStatus {
            shown_generation: Some(1),
            ..Default::default()
        };
        assert!(judge_address_preview(&o, "orders", 5, preview(), &mut status).is_continue());
        let mut status = ConnectionCloseStatus {
            shown_generation: Some(1),
            ..Default::default()
        };
        assert!(
            matches!(judge_address_preview(&o, "orders", 4, preview(), &mut status), ControlFlow::Break(v) if v.status.phase == ClosePhase::Failed)
        );
    }

    /// ADR-0057 D4, D5: arming marks the close Closing, by this process, now; another process
    /// finding it so leaves it alone (it may be calling the broker), and it is never armed twice.
    #[test]
    fn an_armed_close_is_closing_by_its_process_and_left_alone_by_others() {
        let mut status = ConnectionCloseStatus {
            phase: ClosePhase::AwaitingConfirmation,
            ..Default::default()
        };
        arming(&mut status, "p1");
        assert_eq!(status.phase, ClosePhase::Closing);
        assert_eq!(status.armed_by.as_deref(), Some("p1"));
        let now = chrono::Utc::now();
        assert!(matches!(step(&status, None, "p2", now), Step::Wait(Some(_))));
        assert_eq!(step(&status, None, "p1", now), Step::FailUnknown);
    }

    /// `kubectl wait --for=condition=Complete` (and `=Failed`): a finished close says which, in
    /// both conditions; and it stays for its ttlSecondsAfterFinished, counted from when it
    /// finished, before the object is deleted.
    #[test]
    fn a_finished_close_sets_complete_or_failed_and_waits_its_ttl() {
        let t = by_id(2, Some("orders-app")).spec.target;
        for (node_outcome, complete, failed) in [
            (Outcome::Applied, ("True", "Closed"), ("False", "Closed")),
            (Outcome::Failed, ("False", "NotClosed"), ("True", "CloseFailed")),
        ] {
            let mut status = ConnectionCloseStatus::default();
            record_by_id_result(
                &mut status,
                result(vec![outcome("n1", node_outcome)]),
                &t,
                Some(2),
            );
            let get = |kind: &str| {
                conditions::get(&status.conditions, kind)
                    .map(|c| (c.status.clone(), c.reason.clone()))
                    .unwrap_or_default()
            };
            assert_eq!(
                get(COMPLETE),
                (complete.0.to_string(), complete.1.to_string()),
                "{node_outcome:?}"
            );
            assert_eq!(
                get(FAILED),
                (failed.0.to_string(), failed.1.to_string()),
                "{node_outcome:?}"
            );
            assert!(
                matches!(step(&status, Some(60), "p", chrono::Utc::now()), Step::Wait(Some(left)) if left > Duration::from_secs(50)),
                "{node_outcome:?}: deleted before its ttl ({:?})",
                status.completed_at
            );
        }
    }

    /// ADR-0057 D6: an address close waiting for its confirmation says what to type (the
    /// address), how many connections it would close, and the consequence; a confirmation given
    /// with the object is said not to count.
    #[test]
    fn an_address_close_says_what_to_confirm_and_what_it_closes() {
        let close = |generation: i64, confirm: Option<&str>| -> ConnectionClose {
            let mut spec = serde_json::json!({"clusterRef": {"name": "c"}, "target": {"address": "orders"}});
            if let Some(c) = confirm {
                spec["confirm"] = c.into();
            }
            serde_json::from_value(serde_json::json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
                "metadata": {"name": "x", "namespace": "ns", "generation": generation},
                "spec": spec,
            }))
            .unwrap_or_else(|e| panic!("close json: {e}"))
        };
        let preview = || {
            Ok(vec![NodeConnections {
                node: "n1".into(),
                connections: 3,
            }])
        };
        let message = |o: &ConnectionClose| match judge_address_preview(
            o,
            "orders",
            10,
            preview(),
            &mut ConnectionCloseStatus::default(),
        ) {
            ControlFlow::Break(v) => v.status.message.unwrap_or_default(),
            ControlFlow::Continue(_) => panic!("an unconfirmed address close goes on"),
        };
        let m = message(&close(1, None));
        assert!(
            m.starts_with("set spec.confirm to \"orders\"")
                && m.contains("about 3 consumer connection(s) of orders")
                && m.contains("DLQ"),
            "{m}"
        );
        let m = message(&close(1, Some("orders")));
        assert!(
            m.starts_with("spec.confirm was set before the consequence was shown") && m.contains("about 3"),
            "{m}"
        );
    }

    /// What GitOps tools and `kubectl wait --for=condition=Ready` read (README, GitOps): a
    /// completed close is Ready; a failed one needs a person (Stalled); one waiting for its
    /// confirmation is held as asked (neither Reconciling nor Stalled); a pending one is on its
    /// way (Reconciling).
    #[test]
    fn ready_reconciling_and_stalled_follow_the_phase() {
        for (phase, ready, reconciling, stalled) in [
            (ClosePhase::Completed, ("True", "Closed"), "False", "False"),
            (ClosePhase::Failed, ("False", "CloseFailed"), "False", "True"),
            (
                ClosePhase::AwaitingConfirmation,
                ("False", "AwaitingConfirmation"),
                "False",
                "False",
            ),
            (ClosePhase::Pending, ("False", "Closing"), "True", "False"),
        ] {
            let status = with_phase_conditions(&ConnectionCloseStatus {
                phase,
                observed_generation: Some(2),
                message: Some("m".into()),
                ..Default::default()
            });
            let get = |kind: &str| {
                conditions::get(&status.conditions, kind)
                    .map(|c| (c.status.clone(), c.reason.clone()))
                    .unwrap_or_default()
            };
            assert_eq!(
                get(conditions::READY),
                (ready.0.into(), ready.1.into()),
                "{phase:?}"
            );
            assert_eq!(get(conditions::RECONCILING).0, reconciling, "{phase:?}");
            assert_eq!(get(conditions::STALLED).0, stalled, "{phase:?}");
        }
    }
}
