//! ArtemisDivert: a declared divert on every live node. Create is refused where nothing consumes
//! at the forwarding address (ADR-0084 §2); `createDivert` is verified afterwards because the
//! broker ignores a duplicate or a missing address silently.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use serde_json::{Value, json};

use super::Context;
use super::pipeline::{self, FreshRead, Pass, PlanFacts, Step, TopologyObject, WholeRefusal};
use super::queue::plan::{BrokerNameError, check_broker_name};
use crate::api::divert::{ArtemisDivert, ArtemisDivertSpec, ArtemisDivertStatus, DivertRoutingType};
use crate::api::{Outcome, RefusalKind};
use crate::broker::BrokerError;
use crate::fanout::{self, NodeFailure, NodeReport, Target};
use crate::topology::inventory::{DivertsRead, NodeInventory, ScopedRead};

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

    /// The broker names of an object, checked against the naming rules.
    pub fn checked(object_name: &str, uid: &str, spec: &ArtemisDivertSpec) -> Result<Self, BrokerNameError> {
        let d = DesiredDivert::new(object_name, uid, spec);
        let name_field = if spec.name.is_some() {
            "spec.name"
        } else {
            "metadata.name"
        };
        check_broker_name(name_field, &d.name)?;
        check_broker_name("spec.address", &d.spec.address)?;
        check_broker_name("spec.forwardingAddress", &d.spec.forwarding_address)?;
        Ok(d)
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
        // ADR-0084 §2 holds for an update as for a create: never retarget into nothing.
        Some(existing) if existing.forwarding_address != *fwd && inv.queue_names_on(fwd).is_empty() => {
            DivertAction::Refuse {
                kind: RefusalKind::NothingConsumes,
                message: format!(
                    "Nothing consumes at {fwd} on this node: no queue is bound there, so retargeting the divert would make producers' sends fail or re-create a deleted queue. Declare a queue at {fwd} (an ArtemisQueue) first, or keep spec.forwardingAddress at {}",
                    existing.forwarding_address
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
        None if inv.queue_names_on(fwd).is_empty() => DivertAction::Refuse {
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

/// The fresh read a divert write needs: the divert itself (by its MBean on its source address)
/// and the two addresses it joins — never every queue or divert of the node.
async fn read_divert(t: &Target, d: &DesiredDivert) -> Result<NodeInventory, BrokerError> {
    t.ops
        .read_scoped(ScopedRead {
            queues: &[],
            addresses: &[d.spec.address.as_str(), d.spec.forwarding_address.as_str()],
            diverts: DivertsRead::Named {
                name: &d.name,
                address: &d.spec.address,
            },
        })
        .await
}

/// Create or update on one node, from the preflight's fresh read. `createDivert` is ignored
/// silently on a duplicate or a missing address: the pipeline's verify read catches it (a
/// divert of that name that is not ours is NAME_CONFLICT, a missing one NOT_CONVERGING).
async fn apply_on(t: Target, d: DesiredDivert, inv: Arc<NodeInventory>) -> Result<NodeReport, NodeFailure> {
    match plan_divert(&d, &inv) {
        DivertAction::Converged => Ok(NodeReport::new(Outcome::Already, "exists; configuration matches")),
        DivertAction::Refuse { kind, message } => Err(fanout::refuse(kind, message)),
        DivertAction::Update { changed } => {
            t.ops.update_divert(&d.document()).await?;
            Ok(
                NodeReport::new(Outcome::Applied, format!("updated: {}", changed.join(", ")))
                    .with_detail(changed),
            )
        }
        DivertAction::Create => {
            t.ops.create_divert(&d.document()).await?;
            Ok(NodeReport::new(Outcome::Applied, "created"))
        }
    }
}

/// What deleting needs on one node: only a divert carrying this object's routing name is ours.
pub fn plan_divert_delete(d: &DesiredDivert, inv: &NodeInventory) -> Step {
    match inv.diverts.get(&d.name) {
        None => Step::Nothing {
            message: "the divert is not on this node".into(),
        },
        Some(found) if found.routing_name.as_deref() != Some(d.routing_name.as_str()) => Step::Nothing {
            message: "a divert of that name exists but is not this object's: left in place".into(),
        },
        Some(_) => Step::Write {
            what: format!("remove divert {}", d.name),
            detail: vec![],
        },
    }
}

async fn delete_on(t: Target, d: DesiredDivert, inv: Arc<NodeInventory>) -> Result<NodeReport, NodeFailure> {
    match plan_divert_delete(&d, &inv) {
        Step::Nothing { message } => Ok(NodeReport::new(Outcome::Already, message)),
        Step::Refuse { kind, message } => Err(fanout::refuse(kind, message)),
        Step::Write { .. } => {
            let found = inv.diverts.get(&d.name).cloned().unwrap_or_default();
            match t.ops.destroy_divert(&d.name).await {
                Ok(()) => Ok(
                    NodeReport::new(Outcome::Applied, "removed").with_detail(vec![format!(
                        "removed divert {}",
                        crate::controllers::queue::plan::divert_document(&found)
                    )]),
                ),
                Err(e) if e.refusal_kind() == RefusalKind::DivertDoesNotExist => {
                    Ok(NodeReport::new(Outcome::Already, "the divert was already gone"))
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

impl TopologyObject for ArtemisDivert {
    type Desired = DesiredDivert;
    type Status = ArtemisDivertStatus;
    const NOUN: &'static str = "divert";
    const FINALIZER: &'static str = FINALIZER;

    pipeline::topology_object_accessors!(ArtemisDivertStatus);
    fn cache(ctx: &Context) -> &super::Cache<Self> {
        &ctx.caches.diverts
    }
    /// The refusal is shown in status as the message it reads.
    fn desired(&self) -> Result<DesiredDivert, pipeline::InvalidSpec> {
        DesiredDivert::checked(&self.name_any(), &self.uid().unwrap_or_default(), &self.spec)
            .map_err(|e| pipeline::InvalidSpec(e.to_string()))
    }
    fn claim(d: &DesiredDivert) -> String {
        format!("divert {}", d.name)
    }
    const ADDRESS_HOLD: super::AddressHold = super::AddressHold::Shared;
    fn addresses(d: &DesiredDivert) -> Vec<String> {
        vec![d.spec.address.clone(), d.spec.forwarding_address.clone()]
    }
    fn audit_target(d: &DesiredDivert) -> String {
        format!(
            "divert {} ({} -> {})",
            d.name, d.spec.address, d.spec.forwarding_address
        )
    }
    fn apply_params(&self, d: &DesiredDivert) -> Value {
        json!({"configuration": d.document()})
    }
    fn delete_params(&self, d: &DesiredDivert) -> Value {
        json!({"configuration": d.document()})
    }
    fn plan_apply(d: &DesiredDivert, inv: &NodeInventory) -> Step {
        match plan_divert(d, inv) {
            DivertAction::Converged => Step::Nothing {
                message: "exists; configuration matches".into(),
            },
            DivertAction::Create => Step::Write {
                what: format!("create divert {}", d.name),
                detail: vec![],
            },
            DivertAction::Update { changed } => Step::Write {
                what: format!("update: {}", changed.join(", ")),
                detail: changed,
            },
            DivertAction::Refuse { kind, message } => Step::Refuse { kind, message },
        }
    }
    /// ADR-0084 §1: a queue being deleted at the forwarding address removes this divert with
    /// it; repairing it meanwhile (a restart in the middle of that delete) would put back what
    /// the delete is removing.
    fn held_by_delete(d: &DesiredDivert, facts: &PlanFacts) -> Option<String> {
        let queue = facts.deleting_addresses.get(&d.spec.forwarding_address)?;
        Some(format!(
            "ArtemisQueue {queue} is being deleted at the forwarding address {}: its delete removes this divert with the queue (ADR-0084 §1), so the divert is not written meanwhile. Remove or change this ArtemisDivert, or it is refused with \"Nothing consumes at {}\" once the queue is gone",
            d.spec.forwarding_address, d.spec.forwarding_address
        ))
    }
    fn plan_delete(d: &DesiredDivert, inv: &NodeInventory, _facts: &PlanFacts) -> Step {
        plan_divert_delete(d, inv)
    }
    async fn read_fresh(
        t: &Target,
        d: &DesiredDivert,
        _purpose: FreshRead,
    ) -> Result<NodeInventory, BrokerError> {
        read_divert(t, d).await
    }
    fn refuse_delete(
        &self,
        _d: &DesiredDivert,
        _fresh: &BTreeMap<String, Arc<NodeInventory>>,
        _facts: &PlanFacts,
    ) -> Option<WholeRefusal> {
        // Removing a divert destroys no message (ADR-0084 §7).
        None
    }
    async fn apply_on(
        t: Target,
        d: DesiredDivert,
        before: Arc<NodeInventory>,
    ) -> Result<NodeReport, NodeFailure> {
        apply_on(t, d, before).await
    }
    async fn delete_on(
        t: Target,
        d: DesiredDivert,
        _facts: Arc<PlanFacts>,
        before: Arc<NodeInventory>,
    ) -> Result<NodeReport, NodeFailure> {
        delete_on(t, d, before).await
    }
    fn touch_keys(d: &DesiredDivert) -> Vec<String> {
        use crate::topology::TopologyChange as C;
        vec![
            C::divert_key(&d.name),
            C::address_key(&d.spec.address),
            C::address_key(&d.spec.forwarding_address),
        ]
    }
    fn status(&self, pass: &Pass<'_, Self>) -> ArtemisDivertStatus {
        ArtemisDivertStatus {
            observed_generation: pass.generation,
            conditions: pass.conditions.clone(),
            nodes_summary: Some(fanout::summary(&pass.nodes)),
            nodes: pass.nodes.clone(),
            nodes_generation: pass.nodes_generation,
            last_audit_id: pass.last_audit_id,
            not_owned: pass.not_owned.clone(),
        }
    }
}

pub async fn run(ctx: Arc<Context>, wiring: super::Wiring<ArtemisDivert>) {
    super::run_controller(
        wiring,
        ctx,
        pipeline::reconcile::<ArtemisDivert>,
        pipeline::error_policy::<ArtemisDivert>,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::inventory::{DivertInfo, QueueInfo};

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
        // Ours, drifted: updated with the whole configuration (a queue consumes at "elsewhere").
        i.diverts.get_mut("d").expect("divert").routing_name = Some(d.routing_name.clone());
        let d_back =
            desired(json!({"clusterRef": {"name": "c"}, "address": "src", "forwardingAddress": "elsewhere"}));
        let mut i2 = i.clone();
        i2.diverts.get_mut("d").expect("divert").forwarding_address = "dst".into();
        i2.diverts.get_mut("d").expect("divert").routing_name = Some(d_back.routing_name.clone());
        assert!(
            matches!(
                plan_divert(&d_back, &i2),
                DivertAction::Refuse {
                    kind: RefusalKind::NothingConsumes,
                    ..
                }
            ),
            "retargeting into an address nothing consumes at is refused"
        );
        assert_eq!(
            plan_divert(&d, &i),
            DivertAction::Update {
                changed: vec!["forwardingAddress".into()]
            }
        );
        assert_eq!(d.document()["routing-type"], "STRIP");
    }
}
