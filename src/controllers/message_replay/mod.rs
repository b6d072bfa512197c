//! MessageReplay (issue 48): a captured message sent again, once, on one node. The row is read
//! from the capture store, the preview shown, the confirmation checked; `Sending` and the audit
//! row are written before the one broker call; nothing is ever retried (the close's rules,
//! `one_shot`).
//!
//! This module is the shell: it reads, asks the pure stages (`decide`) what follows, and does
//! what they say — the status write, the compare-and-swap arm, the audit row, the send.

mod decide;

use std::ops::ControlFlow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;

use self::decide::{Planned, Verdict};
use super::one_shot::{Step, usable_cluster};
use super::{Context, ReconcileError, actor_of, key};
use crate::api::message_replay::{MessageReplay, MessageReplayStatus};
use crate::api::{NodeOutcome, Outcome};
use crate::fanout::{self, NodeReport};
use crate::store::AuditIntent;

const COMMAND: &str = "message.replay";

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
/// pass read it (a pass that read `Pending` never writes over a `Sending` another process
/// armed meanwhile). Another writer first: look again at once.
async fn conclude(ctx: &Context, o: &MessageReplay, verdict: Verdict) -> Result<Action, ReconcileError> {
    if !write_if_unchanged(ctx, o, &verdict.status).await? {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    Ok(verdict.then)
}

async fn write(ctx: &Context, o: &MessageReplay, status: &MessageReplayStatus) -> Result<(), ReconcileError> {
    super::report::patch_whole_status(&ctx.client, o, &decide::with_phase_conditions(status)).await?;
    Ok(())
}

/// Write status only if the object is still at the resourceVersion it was read at (a
/// compare-and-swap): `Ok(false)` when another writer got there first.
async fn write_if_unchanged(
    ctx: &Context,
    o: &MessageReplay,
    status: &MessageReplayStatus,
) -> Result<bool, ReconcileError> {
    let mut next = o.clone();
    next.status = Some(decide::with_phase_conditions(status));
    Ok(super::report::replace_status_if_unchanged(&ctx.client, next).await?)
}

fn intent(ctx: &Context, o: &MessageReplay, planned: &Planned) -> AuditIntent {
    let ns = o.namespace().unwrap_or_default();
    AuditIntent {
        instance_id: ctx.instance_id.clone(),
        actor: actor_of(&o.metadata),
        command: COMMAND.into(),
        cluster: key(&ns, &o.spec.cluster_ref.name),
        target: format!("address {} on {}", planned.address, planned.node),
        object_kind: "MessageReplay".into(),
        object_namespace: ns,
        object_name: o.name_any(),
        object_uid: o.uid().unwrap_or_default(),
        object_generation: o.metadata.generation,
        // Never the body: the row it came from, where it goes, its size and property names.
        params: json!({
            "subscription": o.spec.subscription, "row": o.spec.row,
            "address": planned.address, "node": planned.node,
            "body": planned.body.kind(), "bodyBytes": planned.body.len(),
            "properties": planned.properties.keys().collect::<Vec<_>>(),
            "confirm": o.spec.confirm, "confirmWithoutReview": decide::without_review(o),
        }),
    }
}

async fn reconcile(o: Arc<MessageReplay>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let api: Api<MessageReplay> = Api::namespaced(ctx.client.clone(), &ns);
    // Decide on the stored state, not a cached copy: a stale `Sending` must not read as a crash.
    let fresh = api.get_status(&o.name_any()).await?;
    let mut status = fresh.status.clone().unwrap_or_default();
    let generation = fresh.metadata.generation;
    status.observed_generation = generation;
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
    let cluster = key(&ns, &fresh.spec.cluster_ref.name);
    let row = ctx
        .store
        .replay_source(&cluster, &fresh.spec.subscription, fresh.spec.row)
        .await?;
    let Some(row) = row else {
        let message = format!(
            "subscription {} has no row {} on cluster {}: check the ROW column of `kubectl artemis capture search --subscription {}`",
            fresh.spec.subscription, fresh.spec.row, fresh.spec.cluster_ref.name, fresh.spec.subscription
        );
        return conclude(&ctx, &fresh, decide::refuse(&mut status, message, generation)).await;
    };
    let planned = match decide::plan(&fresh, &row) {
        Ok(p) => p,
        Err(why) => {
            let verdict = decide::refuse(&mut status, why.to_string(), generation);
            return conclude(&ctx, &fresh, verdict).await;
        }
    };
    let preview = decide::preview(&planned, &row);
    go_on!(
        &ctx,
        &fresh,
        decide::judge_confirmation(&fresh, preview, &mut status)
    );
    go_on!(&ctx, &fresh, decide::judge_pause(&fresh, &mut status));
    send(&ctx, &fresh, status, planned).await
}

/// Confirmed: check the cluster and the node, arm, audit, send once, record.
async fn send(
    ctx: &Context,
    o: &MessageReplay,
    mut status: MessageReplayStatus,
    planned: Planned,
) -> Result<Action, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let generation = o.metadata.generation;
    let (rt, topology) = match usable_cluster(ctx, &ns, &o.spec.cluster_ref).await {
        Ok(x) => x,
        Err((reason, message)) => {
            return conclude(
                ctx,
                o,
                decide::not_usable(&mut status, generation, reason, message),
            )
            .await;
        }
    };
    let Some(node) = topology.find(&planned.node) else {
        let known: Vec<&str> = topology.nodes.iter().map(|n| n.node_id.as_str()).collect();
        let message = format!(
            "node {} is not a logical node of cluster {}: set spec.node to one of {known:?} in a new MessageReplay",
            planned.node, o.spec.cluster_ref.name
        );
        return conclude(ctx, o, decide::refuse(&mut status, message, generation)).await;
    };
    if node.active.is_none() {
        let message = format!(
            "node {} is not live ({}): nothing was sent, the replay waits for the node",
            node.node_id,
            node.not_live_reason.as_deref().unwrap_or("no active endpoint")
        );
        return conclude(
            ctx,
            o,
            decide::not_usable(&mut status, generation, "NodeNotLive", message),
        )
        .await;
    }
    // Persist `Sending` on the version read; exactly one process wins.
    decide::arming(&mut status, &ctx.process_id, generation);
    if !write_if_unchanged(ctx, o, &status).await? {
        tracing::info!(replay = %o.name_any(), "another writer changed the MessageReplay first: not armed here");
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    let audit_id = ctx.store.audit_intent(&intent(ctx, o, &planned)).await?;
    status.audit_id = Some(audit_id);
    write(ctx, o, &status).await?;
    crate::crash_window::pause(crate::crash_window::Window::AfterArm, &audit_id.to_string()).await;
    let sent_id = Arc::new(OnceLock::new());
    let outcome = fanout::run_on(node, rt.request_timeout * 2, &|tg| {
        send_on(planned.clone(), sent_id.clone(), tg)
    })
    .await;
    finish_send(ctx, o, audit_id, outcome.clone()).await?;
    decide::record_result(&mut status, outcome, sent_id.get().cloned(), generation);
    write(ctx, o, &status).await?;
    Ok(Action::await_change())
}

/// The one broker call of a replay, on its node.
async fn send_on(
    planned: Planned,
    sent_id: Arc<OnceLock<String>>,
    tg: fanout::Target,
) -> Result<NodeReport, fanout::NodeFailure> {
    let id = tg
        .ops
        .send_message(&planned.address, &planned.properties, &planned.body)
        .await?;
    let mut report = NodeReport::new(
        Outcome::Applied,
        format!(
            "sent to {} as a new message, broker message ID {id}",
            planned.address
        ),
    );
    report.detail = vec![format!("messageId: {id}")];
    let _ = sent_id.set(id);
    Ok(report)
}

/// The audit outcome and Event of a send already audited.
async fn finish_send(
    ctx: &Context,
    o: &MessageReplay,
    audit_id: i64,
    outcome: NodeOutcome,
) -> Result<(), ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let cluster = &o.spec.cluster_ref.name;
    super::command::finish(ctx, o, &ns, cluster, COMMAND, audit_id, vec![outcome]).await?;
    Ok(())
}

/// The process that armed the send did not finish: Failed with the outcome unknown, its audit
/// row resolved as such, never sent again.
async fn fail_unknown(
    ctx: &Context,
    fresh: &MessageReplay,
    mut status: MessageReplayStatus,
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

fn error_policy(_o: Arc<MessageReplay>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "MessageReplay reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

pub async fn run(ctx: Arc<Context>, wiring: super::Wiring<MessageReplay>) {
    super::run_controller(wiring, ctx, reconcile, error_policy).await;
}
