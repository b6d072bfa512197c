//! ArtemisDivert: a declared divert on every live node. Create is refused where nothing consumes
//! at the forwarding address (ADR-0084 §2); `createDivert` is verified afterwards because the
//! broker ignores a duplicate or a missing address silently.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::cluster::current_topology;
use super::command::{self, Scope};
use super::{Context, ReconcileError, actor_of, conditions, is_paused, write_status};
use crate::api::divert::{ArtemisDivert, ArtemisDivertSpec, ArtemisDivertStatus, DivertRoutingType};
use crate::api::{DeletionPolicy, NodeOutcome, Outcome, RefusalKind};
use crate::fanout::{self, NodeFailure, NodeReport, Target};
use crate::store::AuditIntent;
use crate::topology::inventory::{self, DivertInfo, NodeInventory};

pub const FINALIZER: &str = "artemis-studio.io/divert";

/// The divert a spec asks for, with its broker names resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredDivert {
    pub name: String,
    /// Unique per object: how the operator recognises its own divert on a broker.
    pub routing_name: String,
    pub spec: ArtemisDivertSpec,
}

impl DesiredDivert {
    pub fn new(object_name: &str, uid: &str, spec: &ArtemisDivertSpec) -> Self {
        let name = spec.name.clone().unwrap_or_else(|| object_name.to_string());
        DesiredDivert {
            routing_name: format!("artemis-studio.{uid}"),
            name,
            spec: spec.clone(),
        }
    }

    fn routing_type(&self) -> &'static str {
        match self.spec.routing_type {
            DivertRoutingType::Strip => "STRIP",
            DivertRoutingType::Pass => "PASS",
            DivertRoutingType::Anycast => "ANYCAST",
            DivertRoutingType::Multicast => "MULTICAST",
        }
    }

    /// The whole DivertConfiguration (an omitted routing type resets to STRIP on update).
    pub fn document(&self) -> Value {
        json!({
            "name": self.name,
            "routing-name": self.routing_name,
            "address": self.spec.address,
            "forwarding-address": self.spec.forwarding_address,
            "exclusive": self.spec.exclusive,
            "filter-string": self.spec.filter,
            "routing-type": self.routing_type(),
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum DivertAction {
    Create,
    Update { changed: Vec<String> },
    Converged,
    Refuse { kind: RefusalKind, message: String },
}

/// Pure plan for one node.
pub fn plan_divert(d: &DesiredDivert, inv: &NodeInventory) -> DivertAction {
    let fwd = &d.spec.forwarding_address;
    match inv.diverts.get(&d.name) {
        Some(existing) if existing.routing_name.as_deref() != Some(d.routing_name.as_str()) => {
            DivertAction::Refuse {
                kind: RefusalKind::NameConflict,
                message: format!(
                    "a divert named {} already exists on this node and is not this object's (source {}, forwarding to {}): the operator never changes it; rename spec.name or remove that divert",
                    d.name, existing.address, existing.forwarding_address
                ),
            }
        }
        Some(existing) if existing.exclusive != d.spec.exclusive || existing.address != d.spec.address => {
            DivertAction::Refuse {
                kind: RefusalKind::NameConflict,
                message: format!(
                    "divert {} exists with source {} and exclusive={}: neither can be updated; recreate the ArtemisDivert",
                    d.name, existing.address, existing.exclusive
                ),
            }
        }
        Some(existing) => {
            let mut changed = vec![];
            if existing.forwarding_address != *fwd {
                changed.push("forwardingAddress".to_string());
            }
            if existing.filter != d.spec.filter.clone().filter(|f| !f.is_empty()) {
                changed.push("filter".to_string());
            }
            if existing.routing_type != d.routing_type() {
                changed.push("routingType".to_string());
            }
            if changed.is_empty() {
                DivertAction::Converged
            } else {
                DivertAction::Update { changed }
            }
        }
        None if inv.queues_on(fwd).next().is_none() => DivertAction::Refuse {
            kind: RefusalKind::NothingConsumes,
            message: format!(
                "Nothing consumes at {fwd} on this node: no queue is bound there, so the divert would make producers' sends fail or re-create a deleted queue. Declare a queue at {fwd} (an ArtemisQueue), or remove this ArtemisDivert"
            ),
        },
        None if !inv.addresses.contains_key(&d.spec.address) => DivertAction::Refuse {
            kind: RefusalKind::AddressDoesNotExist,
            message: format!(
                "source address {} does not exist on this node (the broker would ignore the divert silently): create the address first",
                d.spec.address
            ),
        },
        None => DivertAction::Create,
    }
}

fn matches_desired(found: &DivertInfo, d: &DesiredDivert) -> bool {
    found.forwarding_address == d.spec.forwarding_address
        && found.address == d.spec.address
        && found.routing_name.as_deref() == Some(d.routing_name.as_str())
}

async fn apply_on(t: Target, d: &DesiredDivert) -> Result<NodeReport, NodeFailure> {
    let inv = inventory::scrape(&t.management).await?;
    match plan_divert(d, &inv) {
        DivertAction::Converged => Ok(NodeReport::new(Outcome::Already, "exists; configuration matches")),
        DivertAction::Refuse { kind, message } => Err(fanout::refuse(kind, message)),
        DivertAction::Update { changed } => {
            t.management.update_divert(&d.document()).await?;
            Ok(
                NodeReport::new(Outcome::Applied, format!("updated: {}", changed.join(", ")))
                    .with_detail(changed),
            )
        }
        DivertAction::Create => {
            t.management.create_divert(&d.document()).await?;
            // The broker ignores a duplicate or a missing address silently: look.
            let after = inventory::scrape(&t.management).await?;
            match after.diverts.get(&d.name) {
                Some(found) if matches_desired(found, d) => {
                    Ok(NodeReport::new(Outcome::Applied, "created and verified"))
                }
                Some(found) => Err(fanout::refuse(
                    RefusalKind::NameConflict,
                    format!(
                        "createDivert was ignored: a divert named {} exists, forwarding {} to {}",
                        d.name, found.address, found.forwarding_address
                    ),
                )),
                None => Err(fanout::refuse(
                    RefusalKind::BadResponse,
                    format!(
                        "createDivert was accepted but no divert {} exists afterwards: see the broker log for the reason",
                        d.name
                    ),
                )),
            }
        }
    }
}

fn intent(ctx: &Context, o: &ArtemisDivert, d: &DesiredDivert, command: &str) -> AuditIntent {
    let ns = o.namespace().unwrap_or_default();
    AuditIntent {
        instance_id: ctx.instance_id.clone(),
        actor: actor_of(&o.metadata),
        command: command.into(),
        cluster: format!("{ns}/{}", o.spec.cluster_ref.name),
        target: format!(
            "divert {} ({} -> {})",
            d.name, d.spec.address, d.spec.forwarding_address
        ),
        object_kind: "ArtemisDivert".into(),
        object_namespace: ns,
        object_name: o.name_any(),
        object_uid: o.uid().unwrap_or_default(),
        object_generation: o.metadata.generation,
        params: json!({"configuration": d.document()}),
    }
}

fn planned(n: &crate::topology::LogicalNode, d: &DesiredDivert) -> (NodeOutcome, bool) {
    let endpoint = n.active_endpoint().map(str::to_string);
    let base = |outcome, message: String| NodeOutcome {
        node: n.node_id.clone(),
        endpoint: endpoint.clone(),
        outcome,
        refusal: None,
        message,
        detail: vec![],
    };
    if !n.is_live() {
        return (fanout::skipped(n), false);
    }
    let Some(inv) = &n.inventory else {
        return (fanout::inventory_unavailable(n), false);
    };
    match plan_divert(d, inv) {
        DivertAction::Converged => (
            base(Outcome::Already, "exists; configuration matches".into()),
            false,
        ),
        DivertAction::Create => (
            base(Outcome::WouldApply, format!("create divert {}", d.name)),
            true,
        ),
        DivertAction::Update { changed } => (
            base(Outcome::WouldApply, format!("update: {}", changed.join(", "))),
            true,
        ),
        DivertAction::Refuse { kind, message } => (
            NodeOutcome {
                refusal: Some(kind),
                ..base(Outcome::Failed, message)
            },
            false,
        ),
    }
}

async fn apply(o: Arc<ArtemisDivert>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ns = o.namespace().unwrap_or_default();
    let d = DesiredDivert::new(&o.name_any(), &o.uid().unwrap_or_default(), &o.spec);
    let generation = o.metadata.generation;
    let old = o.status.clone().unwrap_or_default();
    let mut status = ArtemisDivertStatus {
        observed_generation: generation,
        ..old.clone()
    };
    let cluster = o.spec.cluster_ref.name.clone();
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
            write_status(&ctx, o.as_ref(), o.status.as_ref(), &status).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    let plan: Vec<(NodeOutcome, bool)> = topology.nodes.iter().map(|n| planned(n, &d)).collect();
    let needs_write = plan.iter().any(|(_, w)| *w);
    let paused = is_paused(&o.metadata);
    if !needs_write || paused || o.spec.dry_run {
        status.nodes = plan.into_iter().map(|(n, _)| n).collect();
    } else {
        let command_name =
            command::apply_or_repair("divert", old.observed_generation, generation, old.last_audit_id);
        let d2 = d.clone();
        let result = command::run(
            &ctx,
            o.as_ref(),
            Scope {
                cluster_ns: &ns,
                cluster_name: &cluster,
                topology: &topology,
                timeout: rt.request_timeout * 3,
            },
            intent(&ctx, &o, &d, &command_name),
            move |t| {
                let d = d2.clone();
                async move { apply_on(t, &d).await }
            },
        )
        .await?;
        status.nodes = result.nodes;
        status.last_audit_id = Some(result.audit_id);
    }
    conditions::from_outcomes(
        &mut status.conditions,
        &status.nodes,
        generation,
        o.spec.dry_run || paused,
        "divert",
    );
    status.nodes_summary = Some(fanout::summary(&status.nodes));
    write_status(&ctx, o.as_ref(), o.status.as_ref(), &status).await?;
    Ok(Action::requeue(rt.poll_interval))
}

async fn delete_on(t: Target, d: &DesiredDivert) -> Result<NodeReport, NodeFailure> {
    let inv = inventory::scrape(&t.management).await?;
    match inv.diverts.get(&d.name) {
        None => Ok(NodeReport::new(
            Outcome::Already,
            "the divert is not on this node",
        )),
        Some(found) if found.routing_name.as_deref() != Some(d.routing_name.as_str()) => Ok(NodeReport::new(
            Outcome::Already,
            "a divert of that name exists but is not this object's: left in place",
        )),
        Some(found) => match t.management.destroy_divert(&d.name).await {
            Ok(()) => Ok(
                NodeReport::new(Outcome::Applied, "removed").with_detail(vec![format!(
                    "removed divert {}",
                    crate::controllers::queue::plan::divert_document(found)
                )]),
            ),
            Err(e) if e.refusal_kind() == RefusalKind::DivertDoesNotExist => {
                Ok(NodeReport::new(Outcome::Already, "the divert was already gone"))
            }
            Err(e) => Err(e.into()),
        },
    }
}

async fn cleanup(o: Arc<ArtemisDivert>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    if o.spec.deletion.policy == DeletionPolicy::Retain || o.spec.dry_run {
        return Ok(Action::await_change());
    }
    let ns = o.namespace().unwrap_or_default();
    let d = DesiredDivert::new(&o.name_any(), &o.uid().unwrap_or_default(), &o.spec);
    let cluster = o.spec.cluster_ref.name.clone();
    let (rt, topology) = current_topology(&ctx, &ns, &cluster, Some(Duration::ZERO))
        .await
        .map_err(|e| {
            ReconcileError::DeleteRefused(format!(
                "{e}; set spec.deletion.policy: Retain to release this object"
            ))
        })?;
    let d2 = d.clone();
    let result = command::run(
        &ctx,
        o.as_ref(),
        Scope {
            cluster_ns: &ns,
            cluster_name: &cluster,
            topology: &topology,
            timeout: rt.request_timeout * 3,
        },
        intent(&ctx, &o, &d, "divert.delete"),
        move |t| {
            let d = d2.clone();
            async move { delete_on(t, &d).await }
        },
    )
    .await?;
    let failed: Vec<String> = result
        .nodes
        .iter()
        .filter(|n| n.outcome == Outcome::Failed)
        .map(|n| format!("{}: {}", n.node, n.message))
        .collect();
    if failed.is_empty() {
        Ok(Action::await_change())
    } else {
        let mut status = o.status.clone().unwrap_or_default();
        status.nodes = result.nodes;
        write_status(&ctx, o.as_ref(), o.status.as_ref(), &status).await?;
        Err(ReconcileError::DeleteRefused(failed.join("; ")))
    }
}

async fn reconcile(o: Arc<ArtemisDivert>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    super::with_finalizer(
        &ctx,
        o,
        FINALIZER,
        |o| apply(o, ctx.clone()),
        |o| cleanup(o, ctx.clone()),
    )
    .await
}

fn error_policy(_o: Arc<ArtemisDivert>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "ArtemisDivert reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

pub async fn run(ctx: Arc<Context>, api: Api<ArtemisDivert>) {
    super::run_controller(api, ctx, reconcile, error_policy).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::inventory::QueueInfo;

    fn desired(json: Value) -> DesiredDivert {
        DesiredDivert::new("d", "uid-1", &serde_json::from_value(json).expect("spec"))
    }

    fn inv_with_queue(address: &str, source: &str) -> NodeInventory {
        let mut i = NodeInventory::default();
        i.queues.insert(
            address.into(),
            QueueInfo {
                name: address.into(),
                address: address.into(),
                ..Default::default()
            },
        );
        i.addresses.entry(address.into()).or_default().name = address.into();
        i.addresses.entry(source.into()).or_default().name = source.into();
        i
    }

    #[test]
    fn nothing_consuming_at_the_forwarding_address_is_refused() {
        let d = desired(json!({"clusterRef": {"name": "c"}, "address": "src", "forwardingAddress": "dst"}));
        match plan_divert(&d, &NodeInventory::default()) {
            DivertAction::Refuse { kind, message } => {
                assert_eq!(kind, RefusalKind::NothingConsumes);
                assert!(message.starts_with("Nothing consumes at dst"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            plan_divert(&d, &inv_with_queue("dst", "src")),
            DivertAction::Create
        );
    }

    #[test]
    fn a_foreign_divert_of_the_same_name_is_never_touched() {
        let d = desired(json!({"clusterRef": {"name": "c"}, "address": "src", "forwardingAddress": "dst"}));
        let mut i = inv_with_queue("dst", "src");
        i.diverts.insert(
            "d".into(),
            DivertInfo {
                name: "d".into(),
                address: "src".into(),
                forwarding_address: "elsewhere".into(),
                routing_name: Some("someone-else".into()),
                routing_type: "STRIP".into(),
                ..Default::default()
            },
        );
        assert!(matches!(
            plan_divert(&d, &i),
            DivertAction::Refuse {
                kind: RefusalKind::NameConflict,
                ..
            }
        ));
        // Ours, drifted: updated with the whole configuration.
        i.diverts.get_mut("d").expect("divert").routing_name = Some(d.routing_name.clone());
        assert_eq!(
            plan_divert(&d, &i),
            DivertAction::Update {
                changed: vec!["forwardingAddress".into()]
            }
        );
        assert_eq!(d.document()["routing-type"], "STRIP");
    }
}
