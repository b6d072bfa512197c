//! ConnectionClose (ADR-0057): a one-shot, confirmed disconnect. The target is re-read right
//! before acting; the confirmation is against the client ID the broker reports (or the remote
//! address); `Closing` and the audit row are written before the call; nothing is ever retried.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::cluster::{ClusterRuntime, current_topology};
use super::command::{self, Scope};
use super::{Context, MANAGER, ReconcileError, actor_of, conditions};
use crate::api::connection_close::{
    ClosePhase, CloseTarget, ConnectionClose, ConnectionCloseStatus, NodeConnections, TargetSnapshot,
};
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::broker::BrokerManagement;
use crate::broker::management::ListKind;
use crate::fanout::{self, NodeReport};
use crate::store::AuditIntent;
use crate::topology::Topology;

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

/// ADR-0057 D4: the consequence, stated before the close can be armed.
pub fn consequence(in_flight: Option<u64>) -> String {
    match in_flight {
        Some(n) => format!(
            "closing returns {n} in-flight message(s) to their queues and increments their delivery count; messages at their max-delivery-attempts go to the DLQ"
        ),
        None => "closing returns the in-flight messages to their queues (in-flight count not reported) and increments their delivery count; messages at their max-delivery-attempts go to the DLQ".into(),
    }
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

async fn write(
    ctx: &Context,
    o: &ConnectionClose,
    status: &ConnectionCloseStatus,
) -> Result<(), ReconcileError> {
    let api: Api<ConnectionClose> = Api::namespaced(ctx.client.clone(), &o.namespace().unwrap_or_default());
    let patch =
        json!({"apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose", "status": status});
    api.patch_status(
        &o.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    Ok(())
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
        params: json!({"snapshot": snapshot, "confirm": o.spec.confirm, "allowBulk": o.spec.allow_bulk}),
    }
}

/// A topology of one node, for a node-scoped command (same outcome shape, one entry).
fn only(topology: &Topology, node_id: &str) -> Topology {
    topology.restricted_to(&BTreeSet::from([node_id.to_string()]))
}

async fn close_by_id(
    ctx: &Context,
    o: &ConnectionClose,
    rt: &ClusterRuntime,
    topology: &Topology,
    mut status: ConnectionCloseStatus,
) -> Result<Action, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let generation = o.metadata.generation;
    let t = &o.spec.target;
    let wanted = t.node.clone().unwrap_or_default();
    let Some(node) = topology.find(&wanted) else {
        let known: Vec<&str> = topology.nodes.iter().map(|n| n.node_id.as_str()).collect();
        finish(
            &mut status,
            ClosePhase::Failed,
            format!(
                "spec.target.node {wanted} is not a logical node of cluster {}: use one of {known:?} (ids are node-local, ADR-0057 D1)",
                o.spec.cluster_ref.name
            ),
            generation,
        );
        write(ctx, o, &status).await?;
        return Ok(Action::await_change());
    };
    let Some(m) = node.active.clone() else {
        status.already_gone = true;
        status.nodes = vec![NodeOutcome {
            outcome: Outcome::Already,
            ..fanout::skipped(node)
        }];
        finish(
            &mut status,
            ClosePhase::Completed,
            "the node is not live: its connections are gone".into(),
            generation,
        );
        write(ctx, o, &status).await?;
        return Ok(Action::await_change());
    };
    // D3: re-read right before acting.
    let snapshot = match read_target(&m, t).await {
        Ok(s) => s,
        Err(e) => {
            // A read failure is not a close: report it and try the read again later.
            conditions::set(
                &mut status.conditions,
                FAILED,
                false,
                "TargetUnreadable",
                format!("re-reading the target failed: {e}"),
                generation,
            );
            write(ctx, o, &status).await?;
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
    };
    let Some(snapshot) = snapshot else {
        // D2: a vanished target is a success.
        status.already_gone = true;
        status.nodes = vec![NodeOutcome {
            node: node.node_id.clone(),
            endpoint: Some(m.client().url().to_string()),
            outcome: Outcome::Already,
            refusal: None,
            message: format!("{} is not on this node (already gone)", describe(t)),
            detail: vec![],
        }];
        finish(
            &mut status,
            ClosePhase::Completed,
            format!("{} is already gone", describe(t)),
            generation,
        );
        write(ctx, o, &status).await?;
        return Ok(Action::await_change());
    };
    let expected = confirmation_of(&snapshot);
    status.consequence = Some(consequence(snapshot.in_flight_messages));
    status.snapshot = Some(snapshot.clone());
    if o.spec.confirm.is_none() || o.spec.confirm != expected {
        let reports = expected.clone().unwrap_or_else(|| "<nothing>".into());
        let message = match &o.spec.confirm {
            None => format!(
                "set spec.confirm to {reports:?} (the client the broker reports) to close {}; {}",
                describe(t),
                status.consequence.clone().unwrap_or_default()
            ),
            Some(c) => format!(
                "spec.confirm is {c:?} but the broker reports {reports:?} for {} now: not closing. If {reports:?} is the application to disconnect, set spec.confirm to it",
                describe(t)
            ),
        };
        return await_confirmation(ctx, o, status, message).await;
    }
    // Armed: Closing is persisted before the call (an operator that dies now never retries).
    status.phase = ClosePhase::Closing;
    write(ctx, o, &status).await?;
    let target = t.clone();
    let scoped = only(topology, &node.node_id);
    let result = command::run(
        ctx,
        o,
        Scope {
            cluster_ns: &ns,
            cluster_name: &o.spec.cluster_ref.name,
            topology: &scoped,
            timeout: rt.request_timeout * 2,
        },
        intent(ctx, o, &snapshot, &node.node_id),
        move |tg| {
            let target = target.clone();
            async move {
                let closed = match (&target.connection_id, &target.session_id, &target.consumer_id) {
                    (Some(c), None, None) => tg.management.close_connection(c).await?,
                    (Some(c), Some(sid), None) => tg.management.close_session(c, sid).await?,
                    (None, Some(sid), Some(cid)) => {
                        let id: i64 = cid.parse().map_err(|_| {
                            fanout::refuse(
                                RefusalKind::InvalidConfiguration,
                                "spec.target.consumerId is not a number",
                            )
                        })?;
                        tg.management.close_consumer(sid, id).await?
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
        },
    )
    .await?;
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
            &mut status,
            ClosePhase::Completed,
            format!("{}: {message}", describe(t)),
            generation,
        );
    } else {
        finish(
            &mut status,
            ClosePhase::Failed,
            format!("{}: {message}; not retried (ADR-0057 D5)", describe(t)),
            generation,
        );
    }
    write(ctx, o, &status).await?;
    Ok(Action::await_change())
}

async fn close_address(
    ctx: &Context,
    o: &ConnectionClose,
    rt: &ClusterRuntime,
    topology: &Topology,
    mut status: ConnectionCloseStatus,
    address: &str,
) -> Result<Action, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let generation = o.metadata.generation;
    // D6: preview per node: the consumer connections each would close.
    let mut per_node = vec![];
    for node in topology.live_nodes() {
        let Some(m) = &node.active else { continue };
        let consumers = match m.list(ListKind::Consumers, "address", address).await {
            Ok(c) => c,
            Err(e) => {
                conditions::set(
                    &mut status.conditions,
                    FAILED,
                    false,
                    "PreviewFailed",
                    format!("{}: {e}", node.node_id),
                    generation,
                );
                write(ctx, o, &status).await?;
                return Ok(Action::requeue(Duration::from_secs(10)));
            }
        };
        let sessions: BTreeSet<String> = consumers.iter().filter_map(|c| s(c, "session")).collect();
        per_node.push(NodeConnections {
            node: node.node_id.clone(),
            connections: sessions.len() as u64,
        });
    }
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
        finish(
            &mut status,
            ClosePhase::Failed,
            format!(
                "BULK_CAP_EXCEEDED: closing the consumer connections of {address} would close about {total}, above the bulk cap of {}: create a new ConnectionClose with allowBulk: true to accept it",
                rt.bulk_cap
            ),
            generation,
        );
        write(ctx, o, &status).await?;
        return Ok(Action::await_change());
    }
    if o.spec.confirm.as_deref() != Some(address) {
        let message = format!(
            "set spec.confirm to {address:?} to close about {total} consumer connection(s) of {address} on every live node"
        );
        return await_confirmation(ctx, o, status, message).await;
    }
    status.phase = ClosePhase::Closing;
    write(ctx, o, &status).await?;
    let addr = address.to_string();
    let result = command::run(
        ctx,
        o,
        Scope {
            cluster_ns: &ns,
            cluster_name: &o.spec.cluster_ref.name,
            topology,
            timeout: rt.request_timeout * 2,
        },
        intent(ctx, o, &snapshot, "every live node"),
        move |tg| {
            let addr = addr.clone();
            async move {
                let closed = tg
                    .management
                    .close_consumer_connections_for_address(&addr)
                    .await?;
                Ok(if closed {
                    NodeReport::new(Outcome::Applied, "closed")
                } else {
                    NodeReport::new(Outcome::Already, "no consumer connection to close")
                })
            }
        },
    )
    .await?;
    status.audit_id = Some(result.audit_id);
    status.already_gone = result
        .nodes
        .iter()
        .all(|n| matches!(n.outcome, Outcome::Already | Outcome::SkippedNotLive));
    let failed = result.nodes.iter().any(|n| n.outcome == Outcome::Failed);
    status.nodes = result.nodes;
    if failed {
        finish(
            &mut status,
            ClosePhase::Failed,
            "some nodes failed; see status.nodes. Not retried (ADR-0057 D5)".into(),
            generation,
        );
    } else {
        finish(
            &mut status,
            ClosePhase::Completed,
            format!("closed consumer connections of {address}; see status.nodes"),
            generation,
        );
    }
    write(ctx, o, &status).await?;
    Ok(Action::await_change())
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
    match status.phase {
        ClosePhase::Completed | ClosePhase::Failed => {
            let Some(ttl) = fresh.spec.ttl_seconds_after_finished else {
                return Ok(Action::await_change());
            };
            let done = status
                .completed_at
                .as_deref()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
            let left = done
                .map(|d| ttl - chrono::Utc::now().signed_duration_since(d).num_seconds())
                .unwrap_or(0);
            if left <= 0 {
                api.delete(&fresh.name_any(), &DeleteParams::default()).await?;
                return Ok(Action::await_change());
            }
            return Ok(Action::requeue(Duration::from_secs(left as u64)));
        }
        ClosePhase::Closing => {
            // D5: this process did not finish it (it restarted): never retried.
            finish(
                &mut status,
                ClosePhase::Failed,
                "Failed: outcome unknown, not retried (the operator restarted after arming the close)".into(),
                generation,
            );
            write(&ctx, &fresh, &status).await?;
            return Ok(Action::await_change());
        }
        ClosePhase::Pending | ClosePhase::AwaitingConfirmation => {}
    }
    let (rt, topology) = match current_topology(&ctx, &ns, &fresh.spec.cluster_ref.name, None).await {
        Ok(x) => x,
        Err(e) => {
            conditions::set(
                &mut status.conditions,
                COMPLETE,
                false,
                "ClusterNotReady",
                e.to_string(),
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

fn error_policy(_o: Arc<ConnectionClose>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "ConnectionClose reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

pub async fn run(ctx: Arc<Context>, api: Api<ConnectionClose>) {
    super::run_controller(api, ctx, reconcile, error_policy).await;
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
