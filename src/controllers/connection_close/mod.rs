//! ConnectionClose (ADR-0057): a one-shot, confirmed disconnect. The target is re-read right
//! before acting; the confirmation is against the client ID the broker reports (or the remote
//! address); `Closing` and the audit row are written before the call; nothing is ever retried.
//!
//! This module is the shell: it reads (`read`), asks the pure stages (`decide`) what follows,
//! and does what they say — the status write, the compare-and-swap arm, the audit row, the one
//! broker call. Every decision is in `decide`.

mod decide;
mod read;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;

use self::decide::{Armed, At, Step, Verdict};
use super::command::{self, Scope};
use super::runtime::ClusterRuntime;
use super::{Context, ReconcileError, actor_of};
use crate::api::connection_close::{CloseTarget, ConnectionClose, ConnectionCloseStatus, TargetSnapshot};
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::fanout::{self, NodeReport};
use crate::store::AuditIntent;
use crate::topology::Topology;

/// Go on with what a stage found, or end the pass as its verdict says.
macro_rules! go_on {
    ($ctx:expr, $o:expr, $stage:expr) => {
        match $stage {
            ControlFlow::Continue(found) => found,
            ControlFlow::Break(verdict) => return conclude($ctx, $o, verdict).await,
        }
    };
}

/// End a pass before arming: write the verdict's status only if the object is still as this
/// pass read it. The status is the close's state: a pass that read `Pending` while another
/// process armed (or finished) the close must not write `Pending` back over it — the next
/// pass would arm and close a second time. Another writer first: look again at once.
async fn conclude(ctx: &Context, o: &ConnectionClose, verdict: Verdict) -> Result<Action, ReconcileError> {
    debug_assert!(verdict.resolve.is_none(), "nothing is audited before the arm");
    if !write_if_unchanged(ctx, o, &verdict.status).await? {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    Ok(verdict.then)
}

/// End an armed pass (this process won the compare-and-swap; no other writes until it records
/// the outcome): resolve the audit row the verdict names, write the status.
async fn conclude_armed(
    ctx: &Context,
    o: &ConnectionClose,
    verdict: Verdict,
) -> Result<Action, ReconcileError> {
    if let Some((audit_id, nodes)) = verdict.resolve {
        finish_close(ctx, o, audit_id, nodes).await?;
    }
    write(ctx, o, &verdict.status).await?;
    Ok(verdict.then)
}

async fn write(
    ctx: &Context,
    o: &ConnectionClose,
    status: &ConnectionCloseStatus,
) -> Result<(), ReconcileError> {
    super::report::patch_whole_status(&ctx.client, o, &decide::with_phase_conditions(status)).await?;
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
    next.status = Some(decide::with_phase_conditions(status));
    Ok(super::report::replace_status_if_unchanged(&ctx.client, next).await?)
}

/// D4: persist `Closing` with a resourceVersion precondition; exactly one process wins. False
/// when another writer changed the object first (this process does not call the broker).
async fn arm(
    ctx: &Context,
    o: &ConnectionClose,
    status: &mut ConnectionCloseStatus,
) -> Result<bool, ReconcileError> {
    decide::arming(status, &ctx.process_id);
    let won = write_if_unchanged(ctx, o, status).await?;
    if !won {
        tracing::info!(close = %o.name_any(), "another writer changed the ConnectionClose first: not armed here");
    }
    Ok(won)
}

fn intent(ctx: &Context, o: &ConnectionClose, snapshot: &TargetSnapshot, node: &str) -> AuditIntent {
    let ns = o.namespace().unwrap_or_default();
    AuditIntent {
        instance_id: ctx.instance_id.clone(),
        actor: actor_of(&o.metadata),
        command: "connection.close".into(),
        cluster: format!("{ns}/{}", o.spec.cluster_ref.name),
        target: format!("{} on {node}", decide::describe(&o.spec.target)),
        object_kind: "ConnectionClose".into(),
        object_namespace: ns,
        object_name: o.name_any(),
        object_uid: o.uid().unwrap_or_default(),
        object_generation: o.metadata.generation,
        // D3: the audit names the application, not the identifier.
        params: json!({
            "snapshot": snapshot, "confirm": o.spec.confirm, "allowBulk": o.spec.allow_bulk,
            "confirmWithoutReview": decide::without_review(o),
        }),
    }
}

async fn close_by_id(
    ctx: &Context,
    o: &ConnectionClose,
    rt: &ClusterRuntime,
    topology: &Topology,
    mut status: ConnectionCloseStatus,
) -> Result<Action, ReconcileError> {
    let (node, m) = go_on!(ctx, o, decide::judge_node(o, topology, &mut status));
    let at = At {
        node: &node.node_id,
        endpoint: m.client().url(),
    };
    // D3: read the target before anything is shown or armed.
    let read = read::target(m, &o.spec.target).await;
    let snapshot = go_on!(ctx, o, decide::judge_target(o, at, read, &mut status));
    let expected = go_on!(ctx, o, decide::judge_confirmation(o, &snapshot, &mut status));
    go_on!(ctx, o, decide::judge_pause(o, &mut status));
    if !arm(ctx, o, &mut status).await? {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    // Then the audit intent, its id in status, before the broker is called.
    let audit_id = ctx
        .store
        .audit_intent(&intent(ctx, o, &snapshot, at.node))
        .await?;
    status.audit_id = Some(audit_id);
    write(ctx, o, &status).await?;
    // The crash window between arming and the call (test builds only).
    crate::crash_window::pause(crate::crash_window::Window::AfterArm, &audit_id.to_string()).await;
    let armed = Armed {
        at,
        audit_id,
        expected,
    };
    let reread = read::target(m, &o.spec.target).await;
    if let ControlFlow::Break(verdict) = decide::judge_reread(o, &armed, reread, &mut status) {
        return conclude_armed(ctx, o, verdict).await;
    }
    let target = o.spec.target.clone();
    let outcome = fanout::run_on(node, rt.request_timeout * 2, &move |tg| {
        close_on(target.clone(), tg)
    })
    .await;
    let result = finish_close(ctx, o, audit_id, vec![outcome]).await?;
    decide::record_by_id_result(&mut status, result, &o.spec.target, o.metadata.generation);
    write(ctx, o, &status).await?;
    Ok(Action::await_change())
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

async fn close_address(
    ctx: &Context,
    o: &ConnectionClose,
    rt: &ClusterRuntime,
    topology: &Topology,
    mut status: ConnectionCloseStatus,
    address: &str,
) -> Result<Action, ReconcileError> {
    let preview = read::address_preview(topology, address).await;
    let judged = decide::judge_address_preview(o, address, rt.bulk_cap, preview, &mut status);
    let snapshot = go_on!(ctx, o, judged);
    go_on!(ctx, o, decide::judge_pause(o, &mut status));
    if !arm(ctx, o, &mut status).await? {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    let result = close_address_everywhere(ctx, o, rt, topology, &snapshot, address).await?;
    decide::record_address_result(&mut status, result, address, o.metadata.generation);
    write(ctx, o, &status).await?;
    Ok(Action::await_change())
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
    command::execute(
        ctx,
        scope.told(o),
        scope.topology,
        scope.timeout,
        intent(ctx, o, snapshot, "every live node"),
        close,
    )
    .await
}

async fn reconcile(o: Arc<ConnectionClose>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let api: Api<ConnectionClose> = Api::namespaced(ctx.client.clone(), &ns);
    // Decide on the stored state, not a cached copy: a stale `Closing` must not read as a crash.
    let fresh = api.get_status(&o.name_any()).await?;
    let mut status = fresh.status.clone().unwrap_or_default();
    let generation = fresh.metadata.generation;
    status.observed_generation = generation;
    status.target_description = Some(decide::describe(&fresh.spec.target));
    let ttl = fresh.spec.ttl_seconds_after_finished;
    match decide::step(&status, ttl, &ctx.process_id, chrono::Utc::now()) {
        Step::Wait(None) => return Ok(Action::await_change()),
        Step::Wait(Some(after)) => return Ok(Action::requeue(after)),
        Step::DeleteObject => {
            api.delete(&fresh.name_any(), &DeleteParams::default()).await?;
            return Ok(Action::await_change());
        }
        Step::FailUnknown => return fail_unknown(&ctx, &fresh, status).await,
        Step::Act => {}
    }
    let usable = super::one_shot::usable_cluster(&ctx, &ns, &fresh.spec.cluster_ref).await;
    let (rt, topology) = match usable {
        Ok(x) => x,
        Err((reason, message)) => {
            let verdict = decide::not_usable(&mut status, generation, reason, message);
            return conclude(&ctx, &fresh, verdict).await;
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
    let why = decide::fail_unknown(&mut status, fresh.metadata.generation);
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
    use serde_json::{Value, json};

    use super::*;
    use crate::controllers::fixtures;

    /// The close as the API server has it: seen before (a first status), `Pending`, at
    /// resourceVersion 7.
    fn pending() -> Value {
        json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
            "metadata": {"name": "by-address", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "7"},
            "spec": {"clusterRef": {"name": "c"}, "target": {"address": "orders"}, "confirm": "orders"},
            "status": {"phase": "Pending", "observedGeneration": 1}
        })
    }

    /// Issue 41 (seen in CI): a pass that read `Pending` and ends without arming (here: its
    /// cluster not usable yet) while another process armed the close meanwhile writes its status
    /// only on the resourceVersion it read — refused, nothing else written. A plain write would
    /// put `Pending` back over `Closing` and the next pass would close a second time.
    #[tokio::test]
    async fn a_pass_that_did_not_arm_never_writes_over_a_status_changed_since_it_read() {
        let (ctx, received) = fixtures::context(Box::new(|sent| match sent.method.as_str() {
            "GET" => (200, pending()),
            // Another process armed the close after this pass read it.
            _ => (409, json!({"kind": "Status", "code": 409, "reason": "Conflict"})),
        }));
        let o: ConnectionClose = serde_json::from_value(pending()).expect("close");
        let then = reconcile(Arc::new(o), ctx)
            .await
            .expect("a conflict is not an error");
        assert_eq!(then, Action::requeue(Duration::from_secs(2)));
        let writes: Vec<_> = received.all().into_iter().filter(|s| s.method != "GET").collect();
        assert_eq!(writes.len(), 1, "one write, refused: {writes:?}");
        assert_eq!(
            writes[0].method, "PUT",
            "a replace on the version read: {writes:?}"
        );
        assert_eq!(writes[0].body["metadata"]["resourceVersion"], "7");
        assert_eq!(
            writes[0].body["status"]["conditions"][0]["reason"],
            "ClusterNotFound"
        );
    }
}
