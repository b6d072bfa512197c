//! ArtemisQueue: a queue on every live node (ADR-0049), deleted with ADR-0084's checks.

pub mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;

use self::plan::{DesiredQueue, NodeAction};
use super::cluster::{ClusterRuntime, current_topology};
use super::command::{self, Scope};
use super::{Context, ReconcileError, actor_of, conditions, is_paused};
use crate::api::divert::ArtemisDivert;
use crate::api::queue::{ArtemisQueue, ArtemisQueueStatus, DeletePreview};
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::broker::BrokerError;
use crate::fanout::{self, NodeFailure, NodeReport, Target};
use crate::store::AuditIntent;
use crate::topology::{Topology, inventory};

pub const FINALIZER: &str = "artemis-studio.io/queue";
const PAUSED: &str = "Paused";
const DELETE_BLOCKED: &str = "DeleteBlocked";

fn outcome(node: &str, endpoint: Option<&str>, outcome: Outcome, message: impl Into<String>) -> NodeOutcome {
    NodeOutcome {
        node: node.into(),
        endpoint: endpoint.map(str::to_string),
        outcome,
        refusal: None,
        message: message.into(),
        detail: vec![],
    }
}

fn refused(node: &str, endpoint: Option<&str>, kind: RefusalKind, message: String) -> NodeOutcome {
    NodeOutcome {
        refusal: Some(kind),
        ..outcome(node, endpoint, Outcome::Failed, message)
    }
}

fn intent(
    ctx: &Context,
    q: &ArtemisQueue,
    d: &DesiredQueue,
    command: &str,
    params: serde_json::Value,
) -> AuditIntent {
    let ns = q.namespace().unwrap_or_default();
    AuditIntent {
        instance_id: ctx.instance_id.clone(),
        actor: actor_of(&q.metadata),
        command: command.into(),
        cluster: format!("{ns}/{}", q.spec.cluster_ref.name),
        target: format!("queue {} (address {}, {})", d.name, d.address, d.routing_type),
        object_kind: "ArtemisQueue".into(),
        object_namespace: ns,
        object_name: q.name_any(),
        object_uid: q.uid().unwrap_or_default(),
        object_generation: q.metadata.generation,
        params,
    }
}

/// ArtemisDivert objects on the same cluster, by broker divert name: the declaration ADR-0084 §2
/// checks a dependent divert against.
async fn declared_diverts(
    ctx: &Context,
    ns: &str,
    cluster: &str,
) -> Result<BTreeMap<String, String>, ReconcileError> {
    let api: Api<ArtemisDivert> = Api::namespaced(ctx.client.clone(), ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .into_iter()
        .filter(|d| d.spec.cluster_ref.name == cluster)
        .map(|d| {
            (
                d.spec.name.clone().unwrap_or_else(|| d.name_any()),
                format!("{ns}/{}", d.name_any()),
            )
        })
        .collect())
}

/// Two objects naming one queue on one cluster: the oldest wins.
async fn conflict_winner(
    ctx: &Context,
    q: &ArtemisQueue,
    d: &DesiredQueue,
) -> Result<Option<String>, ReconcileError> {
    let ns = q.namespace().unwrap_or_default();
    let api: Api<ArtemisQueue> = Api::namespaced(ctx.client.clone(), &ns);
    let key = |o: &ArtemisQueue| (o.metadata.creation_timestamp.clone().map(|t| t.0), o.name_any());
    let winner = api
        .list(&ListParams::default())
        .await?
        .into_iter()
        .filter(|o| {
            o.spec.cluster_ref == q.spec.cluster_ref
                && DesiredQueue::new(&o.name_any(), &o.spec).name == d.name
        })
        .min_by_key(key);
    Ok(winner
        .filter(|w| w.uid() != q.uid())
        .map(|w| format!("{ns}/{}", w.name_any())))
}

/// The delete preview from the snapshot (kept current for every object, ADR-0084).
fn preview(
    d: &DesiredQueue,
    topology: &Topology,
    rt: &ClusterRuntime,
    declared: &BTreeMap<String, String>,
) -> DeletePreview {
    let mut p = DeletePreview::default();
    for n in &topology.nodes {
        let Some(inv) = &n.inventory else {
            if n.is_live() {
                p.warnings.push(format!(
                    "{}: inventory unavailable; the delete preflight reads it again",
                    n.node_id
                ));
            } else {
                p.warnings.push(format!(
                    "{}: not live; a delete now would skip it and the queue would stay there",
                    n.node_id
                ));
            }
            continue;
        };
        let (np, _) = plan::delete_preview(d, &n.node_id, inv, declared);
        p.total_messages += np.message_count;
        if !np.dependent_diverts.is_empty() {
            p.warnings.push(format!(
                "{}: {} divert(s) are removed with the queue; a divert in the node's broker.xml comes back at the next restart",
                n.node_id,
                np.dependent_diverts.len()
            ));
        }
        p.nodes.push(np);
    }
    let (cap, exceeds) =
        plan::bulk_cap_verdict(p.total_messages, rt.bulk_cap, d.spec.deletion.allow_message_loss);
    p.bulk_cap = cap;
    p.exceeds_bulk_cap = exceeds;
    if exceeds {
        p.warnings.push(format!(
            "deleting destroys {} messages, above the bulk cap of {cap}: the delete is refused unless spec.deletion.allowMessageLoss is at least {}",
            p.total_messages, p.total_messages
        ));
    }
    p
}

async fn record(ctx: &Context, q: &ArtemisQueue, status: ArtemisQueueStatus) -> Result<(), ReconcileError> {
    super::write_status(ctx, q, q.status.as_ref(), &status).await
}

fn base_status(q: &ArtemisQueue, d: &DesiredQueue) -> ArtemisQueueStatus {
    let old = q.status.clone().unwrap_or_default();
    ArtemisQueueStatus {
        observed_generation: q.metadata.generation,
        conditions: old.conditions,
        queue_name: Some(d.name.clone()),
        last_audit_id: old.last_audit_id,
        delete_preview: old.delete_preview,
        nodes: old.nodes,
        nodes_summary: old.nodes_summary,
    }
}

fn set_state_conditions(status: &mut ArtemisQueueStatus, generation: Option<i64>, dry_run: bool) {
    conditions::from_outcomes(
        &mut status.conditions,
        &status.nodes,
        generation,
        dry_run,
        "queue",
    );
    status.nodes_summary = Some(fanout::summary(&status.nodes));
}

/// Create, or converge, on one node. Reads the node fresh before it writes (ADR-0049: the
/// update path reads before it writes).
async fn apply_on(t: Target, d: &DesiredQueue) -> Result<NodeReport, NodeFailure> {
    let inv = inventory::scrape(&t.management).await?;
    match plan::plan_node(d, &inv) {
        NodeAction::Converged => Ok(NodeReport::new(Outcome::Already, "exists; configuration matches")),
        NodeAction::Refuse { kind, message } => Err(fanout::refuse(kind, message)),
        NodeAction::Create {
            create_address,
            document,
        } => {
            if create_address {
                match t.management.create_address(&d.address, d.routing_type).await {
                    Ok(())
                    | Err(BrokerError::Refused(crate::broker::ManagementRefusal {
                        kind: RefusalKind::AddressExists,
                        ..
                    })) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            match t.management.create_queue(&document).await {
                Ok(_) => Ok(NodeReport::new(Outcome::Applied, "created")),
                Err(e) if e.refusal_kind() == RefusalKind::QueueExists => {
                    Ok(NodeReport::new(Outcome::Already, "exists (created concurrently)"))
                }
                Err(e) if e.refusal_kind() == RefusalKind::RoutingTypeNotSupported => Err(NodeFailure {
                    message: Some(format!(
                        "address {} exists without routing type {}: {e}. Add the routing type to the address on the broker, or use the address's routing type",
                        d.address, d.routing_type
                    )),
                    ..e.into()
                }),
                Err(e) => Err(e.into()),
            }
        }
        NodeAction::Update { changed } => {
            let current = inv.queues.get(&d.name).cloned().unwrap_or_default();
            let doc = plan::update_document(&current, &d.spec);
            match t.management.update_queue(&doc).await {
                Ok(_) => Ok(
                    NodeReport::new(Outcome::Applied, format!("updated: {}", changed.join(", ")))
                        .with_detail(changed),
                ),
                Err(e) if e.refusal_kind() == RefusalKind::MaxConsumersTooLow => Err(NodeFailure {
                    message: Some(format!(
                        "{e}: spec.maxConsumers is below the queue's current consumer count; raise it or disconnect consumers first"
                    )),
                    ..e.into()
                }),
                Err(e) => Err(e.into()),
            }
        }
    }
}

async fn apply(q: Arc<ArtemisQueue>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ns = q.namespace().unwrap_or_default();
    let d = DesiredQueue::new(&q.name_any(), &q.spec);
    let generation = q.metadata.generation;
    let mut status = base_status(&q, &d);
    let cluster = q.spec.cluster_ref.name.clone();

    if let Some(winner) = conflict_winner(&ctx, &q, &d).await? {
        status.nodes.clear();
        conditions::set(
            &mut status.conditions,
            conditions::READY,
            false,
            "ResourceConflict",
            format!(
                "queue {} on cluster {cluster} is declared by the older ArtemisQueue {winner}; this object makes no broker writes: delete it or give it another spec.name",
                d.name
            ),
            generation,
        );
        record(&ctx, &q, status).await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    }

    let (rt, topology) = match current_topology(&ctx, &ns, &cluster, None).await {
        Ok(x) => x,
        Err(e) => {
            conditions::set(
                &mut status.conditions,
                conditions::READY,
                false,
                "ClusterNotReady",
                e.to_string(),
                generation,
            );
            record(&ctx, &q, status).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    let declared = declared_diverts(&ctx, &ns, &cluster).await?;
    let delete_preview = preview(&d, &topology, &rt, &declared);
    status.delete_preview = Some(delete_preview);

    // Plan from the snapshot: which nodes need a write.
    let mut planned: Vec<NodeOutcome> = vec![];
    let mut needs_write = false;
    for n in &topology.nodes {
        let endpoint = n.active_endpoint();
        let Some(inv) = n.inventory.as_ref().filter(|_| n.is_live()) else {
            if n.is_live() {
                planned.push(fanout::inventory_unavailable(n));
            } else {
                planned.push(fanout::skipped(n));
            }
            continue;
        };
        planned.push(match plan::plan_node(&d, inv) {
            NodeAction::Converged => outcome(
                &n.node_id,
                endpoint,
                Outcome::Already,
                "exists; configuration matches",
            ),
            NodeAction::Refuse { kind, message } => refused(&n.node_id, endpoint, kind, message),
            NodeAction::Create { create_address, .. } => {
                needs_write = true;
                let what = if create_address {
                    format!("create address {} and queue {}", d.address, d.name)
                } else {
                    format!("create queue {}", d.name)
                };
                outcome(&n.node_id, endpoint, Outcome::WouldApply, what)
            }
            NodeAction::Update { changed } => {
                needs_write = true;
                NodeOutcome {
                    detail: changed.clone(),
                    ..outcome(
                        &n.node_id,
                        endpoint,
                        Outcome::WouldApply,
                        format!("update: {}", changed.join(", ")),
                    )
                }
            }
        });
    }

    let paused = is_paused(&q.metadata);
    if paused {
        conditions::set(
            &mut status.conditions,
            PAUSED,
            true,
            "Annotated",
            format!(
                "{} is \"true\": no broker writes; status.nodes shows what would change",
                crate::api::PAUSED_ANNOTATION
            ),
            generation,
        );
    } else {
        conditions::set(
            &mut status.conditions,
            PAUSED,
            false,
            "NotPaused",
            "broker writes allowed",
            generation,
        );
    }

    if !needs_write || paused || q.spec.dry_run {
        status.nodes = planned;
    } else {
        let old = q.status.clone().unwrap_or_default();
        let command_name =
            command::apply_or_repair("queue", old.observed_generation, generation, old.last_audit_id);
        let params = json!({"spec": q.spec, "plan": planned});
        let d2 = d.clone();
        let result = command::run(
            &ctx,
            q.as_ref(),
            Scope {
                cluster_ns: &ns,
                cluster_name: &cluster,
                topology: &topology,
                timeout: rt.request_timeout * 3,
            },
            intent(&ctx, &q, &d, &command_name, params),
            move |t| {
                let d = d2.clone();
                async move { apply_on(t, &d).await }
            },
        )
        .await?;
        status.nodes = result.nodes;
        status.last_audit_id = Some(result.audit_id);
    }
    set_state_conditions(&mut status, generation, q.spec.dry_run || paused);
    record(&ctx, &q, status).await?;
    Ok(Action::requeue(rt.poll_interval))
}

/// Delete on one node (ADR-0084 §3): diverts first, then the queue; never rolled back.
async fn delete_on(
    t: Target,
    d: &DesiredQueue,
    declared: &BTreeMap<String, String>,
) -> Result<NodeReport, NodeFailure> {
    // The preflight, again, for real on this node.
    let inv = inventory::scrape(&t.management).await?;
    let (p, dependent) = plan::delete_preview(d, &t.node_id, &inv, declared);
    if !inv.queues.contains_key(&d.name) {
        return Ok(NodeReport::new(Outcome::Already, "the queue is not on this node"));
    }
    if let (Some(kind), Some(message)) = (p.refusal, p.message.clone()) {
        return Err(fanout::refuse(kind, message));
    }
    let mut removed: Vec<String> = vec![];
    for div in &dependent {
        match t.management.destroy_divert(&div.name).await {
            Ok(()) => removed.push(format!("removed divert {}", plan::divert_document(div))),
            Err(e) if e.refusal_kind() == RefusalKind::DivertDoesNotExist => {}
            Err(e) => {
                return Err(NodeFailure {
                    message: Some(format!(
                        "divert {} could not be removed ({e}); the queue was left in place on this node",
                        div.name
                    )),
                    detail: removed,
                    error: e,
                });
            }
        }
    }
    if let Err(e) = t
        .management
        .destroy_queue(&d.name, d.spec.deletion.disconnect_consumers)
        .await
    {
        if e.refusal_kind() == RefusalKind::QueueDoesNotExist {
            return Ok(NodeReport::new(Outcome::Already, "the queue was already gone").with_detail(removed));
        }
        let message = if e.refusal_kind() == RefusalKind::HasConsumers {
            format!(
                "a consumer attached after the preflight ({e}): set spec.deletion.disconnectConsumers: true to close consumers"
            )
        } else if removed.is_empty() {
            format!("the queue could not be deleted: {e}")
        } else {
            format!("the queue could not be deleted ({e}); the diverts listed in detail were already removed")
        };
        return Err(NodeFailure {
            message: Some(message),
            detail: removed,
            error: e,
        });
    }
    let mut message = format!("deleted ({} message(s) destroyed", p.message_count);
    if p.consumer_count > 0 {
        message.push_str(&format!(", {} consumer(s) disconnected", p.consumer_count));
    }
    if !dependent.is_empty() {
        message.push_str(&format!(", {} dependent divert(s) removed", dependent.len()));
    }
    message.push(')');
    if d.spec.deletion.remove_empty_address {
        match t.management.delete_address(&d.address).await {
            Ok(()) => message.push_str("; address removed"),
            Err(e) => removed.push(format!("address {} kept: {e}", d.address)),
        }
    }
    Ok(NodeReport::new(Outcome::Applied, message).with_detail(removed))
}

async fn cleanup(q: Arc<ArtemisQueue>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ns = q.namespace().unwrap_or_default();
    let d = DesiredQueue::new(&q.name_any(), &q.spec);
    let generation = q.metadata.generation;
    let cluster = q.spec.cluster_ref.name.clone();
    if q.spec.deletion.policy == crate::api::DeletionPolicy::Retain {
        ctx.event(
            q.as_ref(),
            false,
            "Retained",
            "queue.delete",
            format!("deletion policy Retain: queue {} left on the broker", d.name),
        )
        .await;
        return Ok(Action::await_change());
    }
    if let Some(winner) = conflict_winner(&ctx, &q, &d).await? {
        // The queue is the older object's: this one never wrote to it and must not delete it.
        ctx.event(
            q.as_ref(),
            false,
            "Released",
            "queue.delete",
            format!(
                "queue {} belongs to the older ArtemisQueue {winner}: left on the broker",
                d.name
            ),
        )
        .await;
        return Ok(Action::await_change());
    }
    let mut status = base_status(&q, &d);
    let blocked = |status: &mut ArtemisQueueStatus, reason: &str, message: String| {
        conditions::set(
            &mut status.conditions,
            DELETE_BLOCKED,
            true,
            reason,
            message,
            generation,
        );
    };
    // A fresh poll: the preflight reads every node again, for real.
    let (rt, topology) = match current_topology(&ctx, &ns, &cluster, Some(Duration::ZERO)).await {
        Ok(x) => x,
        Err(e) => {
            let m = format!(
                "{e}. To release this object without touching the broker, set spec.deletion.policy: Retain"
            );
            blocked(&mut status, "ClusterNotReady", m.clone());
            record(&ctx, &q, status).await?;
            return Err(ReconcileError::DeleteRefused(m));
        }
    };
    let declared = declared_diverts(&ctx, &ns, &cluster).await?;
    let p = preview(&d, &topology, &rt, &declared);
    let exceeds = p.exceeds_bulk_cap;
    let total = p.total_messages;
    let cap = p.bulk_cap;
    status.delete_preview = Some(p);
    if exceeds {
        let m = format!(
            "BULK_CAP_EXCEEDED: deleting destroys {total} messages, above the bulk cap of {cap}: set spec.deletion.allowMessageLoss: {total} (or more) on this object to accept the loss, or drain the queue first"
        );
        blocked(&mut status, "BulkCapExceeded", m.clone());
        record(&ctx, &q, status).await?;
        ctx.event(q.as_ref(), true, "DeleteRefused", "queue.delete", m.clone())
            .await;
        return Err(ReconcileError::DeleteRefused(m));
    }
    let params = json!({
        "disconnectConsumers": q.spec.deletion.disconnect_consumers,
        "allowMessageLoss": q.spec.deletion.allow_message_loss,
        "removeEmptyAddress": q.spec.deletion.remove_empty_address,
        "messages": total,
    });
    let (d2, decl2) = (d.clone(), declared.clone());
    let result = command::run(
        &ctx,
        q.as_ref(),
        Scope {
            cluster_ns: &ns,
            cluster_name: &cluster,
            topology: &topology,
            timeout: rt.request_timeout * 4,
        },
        intent(&ctx, &q, &d, "queue.delete", params),
        move |t| {
            let (d, decl) = (d2.clone(), decl2.clone());
            async move { delete_on(t, &d, &decl).await }
        },
    )
    .await?;
    status.nodes = result.nodes.clone();
    status.last_audit_id = Some(result.audit_id);
    status.nodes_summary = Some(fanout::summary(&status.nodes));
    let failed: Vec<String> = result
        .nodes
        .iter()
        .filter(|n| n.outcome == Outcome::Failed)
        .map(|n| format!("{}: {}", n.node, n.message))
        .collect();
    if !failed.is_empty() {
        let m = format!(
            "not deleted everywhere; retried on the resync period: {}",
            failed.join("; ")
        );
        blocked(&mut status, "NodesRefused", m.clone());
        record(&ctx, &q, status).await?;
        return Err(ReconcileError::DeleteRefused(m));
    }
    let skipped: Vec<String> = result
        .nodes
        .iter()
        .filter(|n| n.outcome == Outcome::SkippedNotLive)
        .map(|n| n.node.clone())
        .collect();
    if !skipped.is_empty() {
        let m = format!(
            "deleted on every live node; not live at delete time, so the queue may remain on: {}",
            skipped.join(", ")
        );
        blocked(&mut status, "SkippedNotLive", m.clone());
        record(&ctx, &q, status).await?;
        ctx.event(q.as_ref(), true, "SkippedNotLive", "queue.delete", m)
            .await;
    }
    Ok(Action::await_change())
}

async fn reconcile(q: Arc<ArtemisQueue>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    super::with_finalizer(
        &ctx,
        q,
        FINALIZER,
        |o| apply(o, ctx.clone()),
        |o| cleanup(o, ctx.clone()),
    )
    .await
}

fn error_policy(_q: Arc<ArtemisQueue>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    match error {
        ReconcileError::DeleteRefused(_) => Action::requeue(Duration::from_secs(15)),
        e => {
            tracing::warn!(error = %e, "ArtemisQueue reconcile failed");
            Action::requeue(Duration::from_secs(5))
        }
    }
}

pub async fn run(ctx: Arc<Context>, api: Api<ArtemisQueue>) {
    super::run_controller(api, ctx, reconcile, error_policy).await;
}
