//! ConnectionClose (ADR-0057): a one-shot, confirmed disconnect. The target is re-read right
//! before acting; the confirmation is against the client ID the broker reports (or the remote
//! address); `Closing` and the audit row are written before the call; nothing is ever retried.

use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::command::{self, Scope};
use super::runtime::{ClusterRuntime, current_topology};
use super::{Context, ReconcileError, actor_of, conditions};
use crate::api::connection_close::{
    ClosePhase, CloseTarget, ConnectionClose, ConnectionCloseStatus, NodeConnections, TargetSnapshot,
};
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::broker::BrokerManagement;
use crate::broker::management::ListKind;
use crate::fanout::{self, NodeReport};
use crate::store::AuditIntent;
use crate::topology::{LogicalNode, Topology};

const COMPLETE: &str = "Complete";
const FAILED: &str = "Failed";

fn s(v: &Value, k: &str) -> Option<String> {
    match v.get(k)? {
        Value::String(x) if !x.is_empty() => Some(x.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}
fn n(v: &Value, k: &str) -> Option<u64> {
    match v.get(k)? {
        Value::Number(x) => x.as_u64(),
        Value::String(x) => x.parse().ok(),
        _ => None,
    }
}

/// What the broker reports now about the target; None when it is gone.
async fn read_target(
    m: &BrokerManagement,
    t: &CloseTarget,
) -> Result<Option<TargetSnapshot>, crate::broker::BrokerError> {
    // Resolve the connection the target belongs to (consumer/session → connection).
    let connection_id = match (&t.connection_id, &t.session_id, &t.consumer_id) {
        (Some(c), None, None) => c.clone(),
        (Some(c), Some(sid), None) => {
            let sessions = m.list(ListKind::Sessions, "id", sid).await?;
            match sessions.first() {
                Some(row) if s(row, "connectionID").as_deref() == Some(c.as_str()) => c.clone(),
                _ => return Ok(None),
            }
        }
        (None, Some(sid), Some(cid)) => {
            let r = m
                .list_many(&[(ListKind::Consumers, "id", cid), (ListKind::Sessions, "id", sid)])
                .await?;
            let consumer_here = r[0]
                .iter()
                .any(|c| s(c, "session").as_deref() == Some(sid.as_str()));
            match (consumer_here, r[1].first().and_then(|row| s(row, "connectionID"))) {
                (true, Some(conn)) => conn,
                _ => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let r = m
        .list_many(&[
            (ListKind::Connections, "connectionID", &connection_id),
            (ListKind::Sessions, "connectionID", &connection_id),
        ])
        .await?;
    let Some(conn) = r[0].first() else { return Ok(None) };
    let sessions: Vec<String> = r[1].iter().filter_map(|row| s(row, "id")).collect();
    let queries: Vec<(ListKind, &str, &str)> = sessions
        .iter()
        .map(|sid| (ListKind::Consumers, "session", sid.as_str()))
        .collect();
    let consumers: Vec<Value> = if queries.is_empty() {
        vec![]
    } else {
        m.list_many(&queries).await?.into_iter().flatten().collect()
    };
    // The in-flight messages the close hands back: of the closed consumer, session or connection.
    let affected: Vec<&Value> = consumers
        .iter()
        .filter(|c| match (&t.session_id, &t.consumer_id) {
            (Some(sid), Some(cid)) => {
                s(c, "session").as_deref() == Some(sid) && s(c, "id").as_deref() == Some(cid)
            }
            (Some(sid), None) => s(c, "session").as_deref() == Some(sid),
            _ => true,
        })
        .collect();
    let in_flight = affected
        .iter()
        .map(|c| n(c, "messagesInTransit"))
        .sum::<Option<u64>>();
    Ok(Some(TargetSnapshot {
        client_id: s(conn, "clientID"),
        remote_address: s(conn, "remoteAddress"),
        users: s(conn, "users")
            .map(|u| u.split(',').map(str::to_string).collect())
            .unwrap_or_default(),
        protocol: s(conn, "protocol"),
        session_count: n(conn, "sessionCount").unwrap_or(sessions.len() as u64),
        consumer_count: consumers.len() as u64,
        in_flight_messages: in_flight,
        per_node: vec![],
    }))
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

fn describe(t: &CloseTarget) -> String {
    match (&t.address, &t.connection_id, &t.session_id, &t.consumer_id) {
        (Some(a), ..) => format!("consumer connections of address {a}"),
        (None, Some(c), None, _) => format!("connection {c}"),
        (None, Some(c), Some(sid), _) => format!("session {sid} of connection {c}"),
        (None, None, Some(sid), Some(cid)) => format!("consumer {cid} of session {sid}"),
        _ => "invalid target".into(),
    }
}

/// Ready, Reconciling and Stalled from the phase (Flux, kstatus; `Complete`/`Failed` stay for
/// `kubectl wait`): Completed is Ready; Failed, and a close waiting for its confirmation, need a
/// person; Pending and Closing are on their way.
fn with_phase_conditions(status: &ConnectionCloseStatus) -> ConnectionCloseStatus {
    let mut status = status.clone();
    let generation = status.observed_generation;
    let message = status.message.clone().unwrap_or_default();
    let (ready, reason) = match status.phase {
        ClosePhase::Completed => (true, "Closed"),
        ClosePhase::Failed => (false, "CloseFailed"),
        ClosePhase::AwaitingConfirmation => (false, "AwaitingConfirmation"),
        ClosePhase::Pending | ClosePhase::Closing => (false, "Closing"),
    };
    let judged = [(conditions::READY, (ready, reason, message))];
    conditions::set_all(&mut status.conditions, generation, judged);
    conditions::kstatus(&mut status.conditions, &[], generation);
    status
}

async fn write(
    ctx: &Context,
    o: &ConnectionClose,
    status: &ConnectionCloseStatus,
) -> Result<(), ReconcileError> {
    super::report::apply_status(&ctx.client, o, &with_phase_conditions(status)).await?;
    Ok(())
}

/// Write status only if the object is still at the resourceVersion it was read at (a
/// compare-and-swap): `Ok(false)` when another writer got there first.
async fn write_if_unchanged(
    ctx: &Context,
    o: &ConnectionClose,
    status: &ConnectionCloseStatus,
) -> Result<bool, ReconcileError> {
    let mut next = o.clone();
    next.status = Some(with_phase_conditions(status));
    Ok(super::report::replace_status_if_unchanged(&ctx.client, next).await?)
}

/// How long a `Closing` armed by another process is left alone: that process may be calling
/// the broker right now. After it, the close is Failed with its outcome unknown.
const ARMED_GRACE: Duration = Duration::from_secs(30);

/// Is the close confirmed by a human who saw the consequence (ADR-0057 D3, D4)? `Err` says
/// what to do.
pub fn confirmed(
    confirm: Option<&str>,
    expected: Option<&str>,
    generation: Option<i64>,
    shown_generation: Option<i64>,
    without_review: bool,
) -> Result<(), ConfirmationMissing> {
    match (confirm, expected) {
        (None, _) => Err(ConfirmationMissing::NotGiven),
        (Some(c), e) if Some(c) != e => Err(ConfirmationMissing::Mismatch),
        _ if without_review => Ok(()),
        // A confirmation counts only when given after the consequence was shown.
        _ if shown_generation.is_some_and(|s| generation.is_some_and(|g| g > s)) => Ok(()),
        _ => Err(ConfirmationMissing::BeforeShown),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmationMissing {
    NotGiven,
    Mismatch,
    BeforeShown,
}

fn finish(status: &mut ConnectionCloseStatus, phase: ClosePhase, message: String, generation: Option<i64>) {
    status.phase = phase;
    status.completed_at = Some(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let done = phase == ClosePhase::Completed;
    conditions::set(
        &mut status.conditions,
        COMPLETE,
        done,
        if done { "Closed" } else { "NotClosed" },
        &message,
        generation,
    );
    conditions::set(
        &mut status.conditions,
        FAILED,
        !done,
        if done { "Closed" } else { "CloseFailed" },
        &message,
        generation,
    );
    status.message = Some(message);
}

/// Not armed: show who would be disconnected and what `spec.confirm` must say; check again
/// later (the target may go away meanwhile).
async fn await_confirmation(
    ctx: &Context,
    o: &ConnectionClose,
    mut status: ConnectionCloseStatus,
    message: String,
) -> Result<Action, ReconcileError> {
    status.phase = ClosePhase::AwaitingConfirmation;
    status.armed_by = None;
    status.armed_at = None;
    status.shown_generation = o.metadata.generation;
    status.message = Some(message.clone());
    conditions::set(
        &mut status.conditions,
        COMPLETE,
        false,
        "AwaitingConfirmation",
        message,
        o.metadata.generation,
    );
    write(ctx, o, &status).await?;
    Ok(Action::requeue(Duration::from_secs(30)))
}

fn intent(ctx: &Context, o: &ConnectionClose, snapshot: &TargetSnapshot, node: &str) -> AuditIntent {
    let ns = o.namespace().unwrap_or_default();
    AuditIntent {
        instance_id: ctx.instance_id.clone(),
        actor: actor_of(&o.metadata),
        command: "connection.close".into(),
        cluster: format!("{ns}/{}", o.spec.cluster_ref.name),
        target: format!("{} on {node}", describe(&o.spec.target)),
        object_kind: "ConnectionClose".into(),
        object_namespace: ns,
        object_name: o.name_any(),
        object_uid: o.uid().unwrap_or_default(),
        object_generation: o.metadata.generation,
        // D3: the audit names the application, not the identifier.
        params: json!({
            "snapshot": snapshot, "confirm": o.spec.confirm, "allowBulk": o.spec.allow_bulk,
            "confirmWithoutReview": without_review(o),
        }),
    }
}

fn without_review(o: &ConnectionClose) -> bool {
    o.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION))
        .is_some_and(|v| v == "true")
}

async fn close_by_id(
    ctx: &Context,
    o: &ConnectionClose,
    rt: &ClusterRuntime,
    topology: &Topology,
    mut status: ConnectionCloseStatus,
) -> Result<Action, ReconcileError> {
    let (node, m) = match live_target_node(ctx, o, topology, &mut status).await? {
        ControlFlow::Continue(found) => found,
        ControlFlow::Break(action) => return Ok(action),
    };
    // D3: read the target before anything is shown or armed.
    let snapshot = match read_snapshot(ctx, o, node, &m, &mut status).await? {
        ControlFlow::Continue(snapshot) => snapshot,
        ControlFlow::Break(action) => return Ok(action),
    };
    let expected = confirmation_of(&snapshot);
    status.consequence = Some(consequence(snapshot.in_flight_messages));
    status.snapshot = Some(snapshot.clone());
    if let Err(missing) = confirmed(
        o.spec.confirm.as_deref(),
        expected.as_deref(),
        o.metadata.generation,
        status.shown_generation,
        without_review(o),
    ) {
        let message = by_id_confirmation_message(o, &status, expected.as_deref(), missing);
        return await_confirmation(ctx, o, status, message).await;
    }
    if !arm(ctx, o, &mut status).await? {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    // Then the audit intent, its id in status, before the broker is called.
    let audit_id = ctx
        .store
        .audit_intent(&intent(ctx, o, &snapshot, &node.node_id))
        .await?;
    status.audit_id = Some(audit_id);
    write(ctx, o, &status).await?;
    // The crash window between arming and the call (test builds only).
    crate::crash_window::pause(crate::crash_window::Window::AfterArm, &audit_id.to_string()).await;
    let armed = Armed {
        node,
        m: &m,
        audit_id,
        expected,
    };
    if let ControlFlow::Break(action) = reread_before_call(ctx, o, &armed, &mut status).await? {
        return Ok(action);
    }
    let target = o.spec.target.clone();
    let outcome = fanout::run_on(node, rt.request_timeout * 2, &move |tg| {
        close_on(target.clone(), tg)
    })
    .await;
    let result = finish_close(ctx, o, audit_id, vec![outcome]).await?;
    record_by_id_result(&mut status, result, &o.spec.target, o.metadata.generation);
    write(ctx, o, &status).await?;
    Ok(Action::await_change())
}

/// The node the target lives on, live: else the close fails (no such node) or waits (the node
/// is down: its connections can be neither read nor closed, and the broker may still serve them).
async fn live_target_node<'t>(
    ctx: &Context,
    o: &ConnectionClose,
    topology: &'t Topology,
    status: &mut ConnectionCloseStatus,
) -> Result<ControlFlow<Action, (&'t LogicalNode, BrokerManagement)>, ReconcileError> {
    let generation = o.metadata.generation;
    let wanted = o.spec.target.node.clone().unwrap_or_default();
    let Some(node) = topology.find(&wanted) else {
        let known: Vec<&str> = topology.nodes.iter().map(|n| n.node_id.as_str()).collect();
        let message = format!(
            "spec.target.node {wanted} is not a logical node of cluster {}: use one of {known:?} (ids are node-local, ADR-0057 D1)",
            o.spec.cluster_ref.name
        );
        finish(status, ClosePhase::Failed, message, generation);
        write(ctx, o, status).await?;
        return Ok(ControlFlow::Break(Action::await_change()));
    };
    if let Some(m) = node.active.clone() {
        return Ok(ControlFlow::Continue((node, m)));
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
    write(ctx, o, status).await?;
    Ok(ControlFlow::Break(Action::requeue(Duration::from_secs(10))))
}

/// The target as the broker reports it now; a read failure is reported and read again later, a
/// vanished target is a success (D2: known from a live node that answered).
async fn read_snapshot(
    ctx: &Context,
    o: &ConnectionClose,
    node: &LogicalNode,
    m: &BrokerManagement,
    status: &mut ConnectionCloseStatus,
) -> Result<ControlFlow<Action, TargetSnapshot>, ReconcileError> {
    let t = &o.spec.target;
    match read_target(m, t).await {
        Ok(Some(snapshot)) => Ok(ControlFlow::Continue(snapshot)),
        Ok(None) => {
            status.already_gone = true;
            status.nodes = vec![gone_outcome(node, m, t)];
            let message = format!("{} is already gone", describe(t));
            finish(status, ClosePhase::Completed, message, o.metadata.generation);
            write(ctx, o, status).await?;
            Ok(ControlFlow::Break(Action::await_change()))
        }
        Err(e) => {
            let message = format!("re-reading the target failed: {e}");
            conditions::set(
                &mut status.conditions,
                FAILED,
                false,
                "TargetUnreadable",
                message,
                o.metadata.generation,
            );
            write(ctx, o, status).await?;
            Ok(ControlFlow::Break(Action::requeue(Duration::from_secs(10))))
        }
    }
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

/// D4: persist `Closing` with a resourceVersion precondition; exactly one process wins. False
/// when another writer changed the object first (this process does not call the broker).
async fn arm(
    ctx: &Context,
    o: &ConnectionClose,
    status: &mut ConnectionCloseStatus,
) -> Result<bool, ReconcileError> {
    status.phase = ClosePhase::Closing;
    status.armed_by = Some(ctx.process_id.clone());
    status.armed_at = Some(now());
    let won = write_if_unchanged(ctx, o, status).await?;
    if !won {
        tracing::info!(close = %o.name_any(), "another writer changed the ConnectionClose first: not armed here");
    }
    Ok(won)
}

/// A close by id, armed: its node, the audit row and what the confirmation was against.
struct Armed<'a> {
    node: &'a LogicalNode,
    m: &'a BrokerManagement,
    audit_id: i64,
    expected: Option<String>,
}

/// D3: the re-read immediately before the call, compared with what was confirmed. A vanished
/// target completes the close; a changed one sends nothing and goes back to the confirmation.
async fn reread_before_call(
    ctx: &Context,
    o: &ConnectionClose,
    armed: &Armed<'_>,
    status: &mut ConnectionCloseStatus,
) -> Result<ControlFlow<Action>, ReconcileError> {
    let t = &o.spec.target;
    let reread = read_target(armed.m, t).await;
    let now_reports = match &reread {
        Ok(Some(s)) => confirmation_of(s),
        _ => None,
    };
    if let Ok(None) = reread {
        finish_close(ctx, o, armed.audit_id, vec![gone_outcome(armed.node, armed.m, t)]).await?;
        status.already_gone = true;
        status.nodes = vec![gone_outcome(armed.node, armed.m, t)];
        let message = format!("{} is already gone", describe(t));
        finish(status, ClosePhase::Completed, message, o.metadata.generation);
        write(ctx, o, status).await?;
        return Ok(ControlFlow::Break(Action::await_change()));
    }
    if reread.is_ok() && now_reports == armed.expected {
        return Ok(ControlFlow::Continue(()));
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
        node: armed.node.node_id.clone(),
        endpoint: Some(armed.m.client().url().to_string()),
        outcome: Outcome::Failed,
        refusal: Some(RefusalKind::NameConflict),
        message: format!("not sent: {why}"),
        detail: vec![],
    };
    finish_close(ctx, o, armed.audit_id, vec![not_sent]).await?;
    status.audit_id = Some(armed.audit_id);
    let message = format!("{why}: nothing was closed. Confirm again against what the broker reports now");
    let action = await_confirmation(ctx, o, status.clone(), message).await?;
    Ok(ControlFlow::Break(action))
}

/// The one broker call of a close by id, on its node.
async fn close_on(target: CloseTarget, tg: fanout::Target) -> Result<NodeReport, fanout::NodeFailure> {
    let m = &tg.ops;
    let closed = match (&target.connection_id, &target.session_id, &target.consumer_id) {
        (Some(c), None, None) => m.close_connection(c).await?,
        (Some(c), Some(sid), None) => m.close_session(c, sid).await?,
        (None, Some(sid), Some(cid)) => {
            let id: i64 = cid.parse().map_err(|_| {
                fanout::refuse(
                    RefusalKind::InvalidConfiguration,
                    "spec.target.consumerId is not a number",
                )
            })?;
            m.close_consumer(sid, id).await?
        }
        _ => {
            return Err(fanout::refuse(
                RefusalKind::InvalidConfiguration,
                "invalid target",
            ));
        }
    };
    Ok(if closed {
        NodeReport::new(Outcome::Applied, "closed")
    } else {
        NodeReport::new(
            Outcome::Already,
            "already gone (the broker found nothing to close)",
        )
    })
}

/// The audit outcome, write evidence and Event of a close already audited.
async fn finish_close(
    ctx: &Context,
    o: &ConnectionClose,
    audit_id: i64,
    nodes: Vec<NodeOutcome>,
) -> Result<command::CommandResult, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    command::finish(
        ctx,
        o,
        &ns,
        &o.spec.cluster_ref.name,
        "connection.close",
        audit_id,
        nodes,
    )
    .await
}

fn record_by_id_result(
    status: &mut ConnectionCloseStatus,
    result: command::CommandResult,
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

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// D2: the node answered and the target is not there.
fn gone_outcome(node: &crate::topology::LogicalNode, m: &BrokerManagement, t: &CloseTarget) -> NodeOutcome {
    NodeOutcome {
        last_command: None,
        node: node.node_id.clone(),
        endpoint: Some(m.client().url().to_string()),
        outcome: Outcome::Already,
        refusal: None,
        message: format!("{} is not on this node (already gone)", describe(t)),
        detail: vec![],
    }
}

async fn close_address(
    ctx: &Context,
    o: &ConnectionClose,
    rt: &ClusterRuntime,
    topology: &Topology,
    mut status: ConnectionCloseStatus,
    address: &str,
) -> Result<Action, ReconcileError> {
    let generation = o.metadata.generation;
    let per_node = match address_preview(topology, address).await {
        Ok(per_node) => per_node,
        Err(message) => {
            conditions::set(
                &mut status.conditions,
                FAILED,
                false,
                "PreviewFailed",
                message,
                generation,
            );
            write(ctx, o, &status).await?;
            return Ok(Action::requeue(Duration::from_secs(10)));
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
    if total > rt.bulk_cap && !o.spec.allow_bulk {
        status.nodes = vec![];
        let message = format!(
            "BULK_CAP_EXCEEDED: closing the consumer connections of {address} would close about {total}, above the bulk cap of {}: create a new ConnectionClose with allowBulk: true to accept it",
            rt.bulk_cap
        );
        finish(&mut status, ClosePhase::Failed, message, generation);
        write(ctx, o, &status).await?;
        return Ok(Action::await_change());
    }
    // D4, D5: the same confirmation rule as a close by id — the address, given after the
    // consequence was shown (or the documented annotation) — and the same compare-and-swap arm.
    if let Err(missing) = confirmed(
        o.spec.confirm.as_deref(),
        Some(address),
        generation,
        status.shown_generation,
        without_review(o),
    ) {
        let message = address_confirmation_message(address, total, missing);
        return await_confirmation(ctx, o, status, message).await;
    }
    if !arm(ctx, o, &mut status).await? {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    let result = close_address_everywhere(ctx, o, rt, topology, &snapshot, address).await?;
    record_address_result(&mut status, result, address, generation);
    write(ctx, o, &status).await?;
    Ok(Action::await_change())
}

/// D6: preview per node, the consumer connections each would close. The cap counts
/// connections — distinct ones, over every page. A 2.40 consumer row names no connection; its
/// remote address (the client's socket) is one per connection. `Err` names the node that failed.
async fn address_preview(topology: &Topology, address: &str) -> Result<Vec<NodeConnections>, String> {
    let mut per_node = vec![];
    for node in topology.live_nodes() {
        let Some(m) = &node.active else { continue };
        let consumers = m
            .list_all(ListKind::Consumers, "address", address)
            .await
            .map_err(|e| format!("{}: {e}", node.node_id))?;
        let connections: BTreeSet<String> = consumers
            .iter()
            .filter_map(|c| s(c, "remoteAddress").or_else(|| s(c, "session")))
            .collect();
        per_node.push(NodeConnections {
            node: node.node_id.clone(),
            connections: connections.len() as u64,
        });
    }
    Ok(per_node)
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

/// The armed address close: one audited command over every live node.
async fn close_address_everywhere(
    ctx: &Context,
    o: &ConnectionClose,
    rt: &ClusterRuntime,
    topology: &Topology,
    snapshot: &TargetSnapshot,
    address: &str,
) -> Result<command::CommandResult, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let scope = Scope {
        cluster_ns: &ns,
        cluster_name: &o.spec.cluster_ref.name,
        topology,
        timeout: rt.request_timeout * 2,
    };
    let addr = address.to_string();
    let close = move |tg: fanout::Target| {
        let addr = addr.clone();
        async move {
            let closed = tg.ops.close_consumer_connections_for_address(&addr).await?;
            Ok(if closed {
                NodeReport::new(Outcome::Applied, "closed")
            } else {
                NodeReport::new(Outcome::Already, "no consumer connection to close")
            })
        }
    };
    command::run(ctx, o, scope, intent(ctx, o, snapshot, "every live node"), close).await
}

fn record_address_result(
    status: &mut ConnectionCloseStatus,
    result: command::CommandResult,
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

/// What a pass does with a close in its stored phase (ADR-0057 D5), decided from the status
/// alone: a pure step, unit-tested without a broker or an API server.
#[derive(Debug, PartialEq)]
enum Step {
    /// Nothing now; look again after this long (None: when the object changes).
    Wait(Option<Duration>),
    /// Finished and past `ttlSecondsAfterFinished`: delete the object.
    DeleteObject,
    /// Armed by a process that did not record the outcome: Failed, outcome unknown, never
    /// called again.
    FailUnknown,
    /// Not armed yet: read the target, show the consequence, arm when confirmed.
    Act,
}

fn step(
    status: &ConnectionCloseStatus,
    ttl_after_finished: Option<i64>,
    process_id: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Step {
    let since = |t: Option<&str>| {
        t.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| now.signed_duration_since(t))
    };
    match status.phase {
        ClosePhase::Completed | ClosePhase::Failed => {
            let Some(ttl) = ttl_after_finished else {
                return Step::Wait(None);
            };
            let left = since(status.completed_at.as_deref()).map_or(0, |d| ttl - d.num_seconds());
            if left <= 0 {
                Step::DeleteObject
            } else {
                Step::Wait(Some(Duration::from_secs(left as u64)))
            }
        }
        ClosePhase::Closing => {
            let mine = status.armed_by.as_deref() == Some(process_id);
            let armed_for = since(status.armed_at.as_deref()).and_then(|d| d.to_std().ok());
            match armed_for
                .filter(|_| !mine)
                .and_then(|d| ARMED_GRACE.checked_sub(d))
            {
                // Another process armed it moments ago and may be calling the broker now.
                Some(left) => Step::Wait(Some(left + Duration::from_secs(1))),
                None => Step::FailUnknown,
            }
        }
        ClosePhase::Pending | ClosePhase::AwaitingConfirmation => Step::Act,
    }
}

async fn reconcile(o: Arc<ConnectionClose>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let api: Api<ConnectionClose> = Api::namespaced(ctx.client.clone(), &ns);
    // Decide on the stored state, not a cached copy: a stale `Closing` must not read as a crash.
    let fresh = api.get_status(&o.name_any()).await?;
    let mut status = fresh.status.clone().unwrap_or_default();
    let generation = fresh.metadata.generation;
    status.observed_generation = generation;
    status.target_description = Some(describe(&fresh.spec.target));
    let ttl = fresh.spec.ttl_seconds_after_finished;
    match step(&status, ttl, &ctx.process_id, chrono::Utc::now()) {
        Step::Wait(None) => return Ok(Action::await_change()),
        Step::Wait(Some(after)) => return Ok(Action::requeue(after)),
        Step::DeleteObject => {
            api.delete(&fresh.name_any(), &DeleteParams::default()).await?;
            return Ok(Action::await_change());
        }
        Step::FailUnknown => return fail_unknown(&ctx, &fresh, status).await,
        Step::Act => {}
    }
    let cluster = &fresh.spec.cluster_ref.name;
    // The rules every broker write keeps: the cluster and its Secrets as they are now (a
    // revoked credential is never used), then its current topology.
    let usable = match super::pipeline::ensure_credentials(&ctx, &ns, cluster).await {
        Ok(()) => current_topology(&ctx, &ns, cluster, None)
            .await
            .map_err(|e| ("ClusterNotReady", e.to_string())),
        Err(e) => Err((e.reason(), e.to_string())),
    };
    let (rt, topology) = match usable {
        Ok(x) => x,
        Err((reason, message)) => {
            conditions::set(
                &mut status.conditions,
                COMPLETE,
                false,
                reason,
                message,
                generation,
            );
            write(&ctx, &fresh, &status).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    match fresh.spec.target.address.clone() {
        Some(address) => close_address(&ctx, &fresh, &rt, &topology, status, &address).await,
        None => close_by_id(&ctx, &fresh, &rt, &topology, status).await,
    }
}

/// D5: the process that armed the close did not finish: Failed with the outcome unknown, its
/// audit row resolved as such, never called again.
async fn fail_unknown(
    ctx: &Context,
    fresh: &ConnectionClose,
    mut status: ConnectionCloseStatus,
) -> Result<Action, ReconcileError> {
    let why = "outcome unknown, not retried: the operator process that armed the close stopped before recording its outcome (ADR-0057 D5)";
    let generation = fresh.metadata.generation;
    finish(
        &mut status,
        ClosePhase::Failed,
        format!("Failed: {why}"),
        generation,
    );
    if !write_if_unchanged(ctx, fresh, &status).await? {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    ctx.store
        .audit_unknown(&fresh.uid().unwrap_or_default(), why)
        .await?;
    Ok(Action::await_change())
}

fn error_policy(_o: Arc<ConnectionClose>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "ConnectionClose reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

pub async fn run(ctx: Arc<Context>, wiring: super::Wiring<ConnectionClose>) {
    super::run_controller(wiring, ctx, reconcile, error_policy).await;
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
mod step_tests {
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
