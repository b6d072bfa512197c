//! The ArtemisQueue plan: a pure function of (spec, node inventory, cluster limits). All the ADR
//! judgement lives here — the read-overlay-send merge (ADR-0049), the routing-type refusal, the
//! dependent-divert analysis, the consumer check and the bulk cap (ADR-0084).

use serde_json::{Value, json};

use crate::api::cluster::DeclarationMode;
use crate::api::queue::{ArtemisQueueSpec, Delivery, DeliveryState, DivertImpact, NodeDeletePreview};
use crate::api::{CAPTURE_PREFIX, RefusalKind};
use crate::controllers::pipeline::{PlanFacts, Step};
use crate::topology::inventory::{DivertInfo, NodeInventory, QueueInfo};

/// Artemis's wildcard characters (`#` any words, `*` one word): a queue or address named with
/// one would be a pattern to every management call that matches by name.
pub const WILDCARD_CHARACTERS: [char; 2] = ['#', '*'];

/// A broker name that breaks the naming rules, with the field to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BrokerNameError {
    #[error("{field} is empty: name the broker object")]
    Empty { field: &'static str },
    #[error(
        "{field} '{value}' contains '{character}', an Artemis wildcard character: management calls would treat it as a pattern. Choose a name without '#' or '*'"
    )]
    Wildcard {
        field: &'static str,
        value: String,
        character: char,
    },
    #[error(
        "{field} '{value}': the prefix {CAPTURE_PREFIX} is reserved for capture subscriptions (ADR-0079 D3); choose another name"
    )]
    CapturePrefix { field: &'static str, value: String },
}

/// The naming rules every broker name of ours obeys (admission checks the same with CEL; this
/// catches objects admitted before a rule existed). `field` names the field to fix.
pub fn check_broker_name(field: &'static str, value: &str) -> Result<(), BrokerNameError> {
    if value.is_empty() {
        return Err(BrokerNameError::Empty { field });
    }
    if let Some(character) = value.chars().find(|c| WILDCARD_CHARACTERS.contains(c)) {
        return Err(BrokerNameError::Wildcard {
            field,
            value: value.to_string(),
            character,
        });
    }
    if value.starts_with(CAPTURE_PREFIX) {
        return Err(BrokerNameError::CapturePrefix {
            field,
            value: value.to_string(),
        });
    }
    Ok(())
}

/// The queue a spec asks for, with its broker names resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredQueue {
    pub name: String,
    pub address: String,
    pub routing_type: &'static str,
    pub spec: ArtemisQueueSpec,
}

impl DesiredQueue {
    /// The broker names of a spec (no checks: for comparing claims and in tests).
    pub fn new(object_name: &str, spec: &ArtemisQueueSpec) -> Self {
        let name = spec.name.clone().unwrap_or_else(|| object_name.to_string());
        let address = spec.address.clone().unwrap_or_else(|| name.clone());
        DesiredQueue {
            name,
            address,
            routing_type: spec.routing_type.as_broker(),
            spec: spec.clone(),
        }
    }

    /// The broker names of a spec, checked against the naming rules.
    pub fn checked(object_name: &str, spec: &ArtemisQueueSpec) -> Result<Self, BrokerNameError> {
        let d = DesiredQueue::new(object_name, spec);
        let name_field = if spec.name.is_some() {
            "spec.name"
        } else {
            "metadata.name"
        };
        check_broker_name(name_field, &d.name)?;
        let address_field = if spec.address.is_some() {
            "spec.address"
        } else {
            name_field
        };
        check_broker_name(address_field, &d.address)?;
        Ok(d)
    }

    /// The queue on a node is this object's only when its address and routing type are the
    /// spec's too: a name alone may be another application's queue.
    pub fn owns(&self, q: &QueueInfo) -> bool {
        q.address == self.address && q.routing_type == self.routing_type
    }
}

/// What one live node needs.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeAction {
    /// The queue is missing: create it (and its address when that is missing too).
    Create { create_address: bool, document: Value },
    /// The queue exists and differs from the spec in these fields.
    Update { changed: Vec<String> },
    /// The queue exists and matches.
    Converged,
    /// The queue exists with the other routing type: never delete-and-recreate.
    Refuse { kind: RefusalKind, message: String },
}

/// The QueueConfiguration document for a create: only what the spec sets, plus the basics.
pub fn create_document(d: &DesiredQueue) -> Value {
    let mut doc = json!({
        "name": d.name,
        "address": d.address,
        "routing-type": d.routing_type,
        "durable": d.spec.durable,
    });
    overlay(&mut doc, &d.spec);
    doc
}

/// The broker's current configuration of a queue as a QueueConfiguration document. Fields the
/// broker does not report are left out: they are unknown, never compared (no write loop on a
/// value that cannot be read back), and sent only when the spec sets them.
pub fn current_document(q: &QueueInfo) -> Value {
    let mut doc = json!({
        "name": q.name,
        "address": q.address,
        "routing-type": q.routing_type,
        "filter-string": q.filter.clone().unwrap_or_default(),
        "durable": q.durable,
        "max-consumers": q.max_consumers,
        "exclusive": q.exclusive,
        "last-value": q.last_value,
        "last-value-key": q.last_value_key,
        "purge-on-no-consumers": q.purge_on_no_consumers,
        "enabled": q.enabled,
        "consumers-before-dispatch": q.consumers_before_dispatch,
        "delay-before-dispatch": q.delay_before_dispatch,
        "ring-size": q.ring_size,
        "group-rebalance": q.group_rebalance,
        "group-buckets": q.group_buckets,
        "group-first-key": q.group_first_key,
        "auto-delete": q.auto_delete,
    });
    if let Some(obj) = doc.as_object_mut() {
        if let Some(v) = q.non_destructive {
            obj.insert("non-destructive".into(), Value::from(v));
        }
        for (k, v) in [
            ("consumer-priority", q.consumer_priority),
            ("auto-delete-delay", q.auto_delete_delay),
            ("auto-delete-message-count", q.auto_delete_message_count),
        ] {
            if let Some(v) = v {
                obj.insert(k.into(), Value::from(v));
            }
        }
    }
    doc
}

/// Overlay the fields the spec sets onto a document (ADR-0049: the merge lives in one place).
/// A field the spec does not set keeps the broker's value; `filter: ""` clears the filter.
pub fn overlay(doc: &mut Value, s: &ArtemisQueueSpec) {
    let Some(obj) = doc.as_object_mut() else { return };
    let mut set = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            obj.insert(k.to_string(), v);
        }
    };
    set("filter-string", s.filter.clone().map(Value::from));
    set("max-consumers", s.max_consumers.map(Value::from));
    set("exclusive", s.exclusive.map(Value::from));
    set("last-value", s.last_value.map(Value::from));
    set("last-value-key", s.last_value_key.clone().map(Value::from));
    set("non-destructive", s.non_destructive.map(Value::from));
    set("purge-on-no-consumers", s.purge_on_no_consumers.map(Value::from));
    set("enabled", s.enabled.map(Value::from));
    set(
        "consumers-before-dispatch",
        s.consumers_before_dispatch.map(Value::from),
    );
    set("delay-before-dispatch", s.delay_before_dispatch.map(Value::from));
    set("consumer-priority", s.consumer_priority.map(Value::from));
    set("ring-size", s.ring_size.map(Value::from));
    set("group-rebalance", s.group_rebalance.map(Value::from));
    set("group-buckets", s.group_buckets.map(Value::from));
    set("group-first-key", s.group_first_key.clone().map(Value::from));
    set("auto-delete", s.auto_delete.map(Value::from));
    set("auto-delete-delay", s.auto_delete_delay.map(Value::from));
    set(
        "auto-delete-message-count",
        s.auto_delete_message_count.map(Value::from),
    );
}

/// Fields whose value differs between two documents (null and "" are the same absence). A field
/// the current document does not have is unknown (the broker does not report it): not compared.
pub fn differing_fields(current: &Value, desired: &Value) -> Vec<String> {
    let absent = |v: Option<&Value>| matches!(v, None | Some(Value::Null)) || v == Some(&Value::from(""));
    let (Some(c), Some(d)) = (current.as_object(), desired.as_object()) else {
        return vec![];
    };
    let mut out: Vec<String> = d
        .iter()
        .filter(|(k, dv)| {
            let Some(cv) = c.get(*k) else { return false };
            !(cv == *dv || (absent(Some(cv)) && absent(Some(dv))))
        })
        .map(|(k, _)| k.clone())
        .collect();
    out.sort();
    out
}

/// The whole document to send to `updateQueue`: the current configuration with the spec on top.
pub fn update_document(current: &QueueInfo, spec: &ArtemisQueueSpec) -> Value {
    let mut doc = current_document(current);
    overlay(&mut doc, spec);
    doc
}

/// A create, with its address in the same call where the spec allows it: `auto-create-address`
/// makes the broker mark the address auto-created (the broker may remove it once empty), so it is
/// used only when the spec removes an emptied address anyway (spec.deletion.removeEmptyAddress);
/// otherwise the address is created by `createAddress`, in the same POST.
fn create(d: &DesiredQueue, inv: &NodeInventory) -> NodeAction {
    let mut document = create_document(d);
    let missing = !inv.addresses.contains_key(&d.address);
    if missing && d.spec.deletion.remove_empty_address {
        document["auto-create-address"] = json!(true);
    }
    NodeAction::Create {
        create_address: missing && !d.spec.deletion.remove_empty_address,
        document,
    }
}

/// Decide what one node needs, from its inventory.
pub fn plan_node(d: &DesiredQueue, inv: &NodeInventory) -> NodeAction {
    if let Some(why) = inv.unreadable_queues.get(&d.name) {
        return NodeAction::Refuse {
            kind: RefusalKind::BadResponse,
            message: format!(
                "queue {} could not be read on this node ({why}): nothing is written on a guess; read again at the next poll",
                d.name
            ),
        };
    }
    match inv.queues.get(&d.name) {
        None => create(d, inv),
        Some(q) if q.routing_type != d.routing_type => NodeAction::Refuse {
            kind: RefusalKind::RoutingTypeImmutable,
            message: format!(
                "queue {} exists on this node as {}, the spec asks for {}: the broker cannot change a queue's routing type (AMQ229211). Set spec.routingType to {} (recreate the ArtemisQueue), or move the messages and delete the broker's queue so the operator can create it",
                d.name, q.routing_type, d.routing_type, q.routing_type
            ),
        },
        Some(q) if q.address != d.address => NodeAction::Refuse {
            kind: RefusalKind::NameConflict,
            message: format!(
                "queue {} exists on this node on address {}, the spec asks for {}: a queue cannot move; rename the queue in spec.name or delete the broker's queue",
                d.name, q.address, d.address
            ),
        },
        Some(q) => {
            let mut changed = differing_fields(&current_document(q), &update_document(q, &d.spec));
            if delivery_differs(d, q) {
                changed.push(DELIVERY.to_string());
            }
            if changed.is_empty() {
                NodeAction::Converged
            } else {
                NodeAction::Update { changed }
            }
        }
    }
}

/// The field name an update's `changed` list gives the delivery state (issue 49): not part of
/// the queue's configuration document, applied by `pause(true)` / `resume()`.
pub const DELIVERY: &str = "delivery";

/// The spec declares a delivery state the queue is not in (unset declares none). Declared
/// Paused, a pause the broker reports not persisted (`pause()` by hand) is not the declared
/// state: a broker restart would resume delivery.
pub fn delivery_differs(d: &DesiredQueue, q: &QueueInfo) -> bool {
    match d.spec.delivery {
        None => false,
        Some(Delivery::Active) => q.paused,
        Some(Delivery::Paused) => !q.paused || pause_not_persisted(q),
    }
}

/// Paused, and the broker reports the pause not persisted (Artemis 2.41+ reports it; 2.40 does
/// not, and its pause counts as what it is known to be: paused). A non-durable queue's pause is
/// never persisted (`QueueImpl.pause` persists a durable queue's only) and the queue itself does
/// not outlive a restart: its pause is as declared.
pub fn pause_not_persisted(q: &QueueInfo) -> bool {
    q.paused && q.durable && q.pause_persisted == Some(false)
}

/// What a node's broker reports of the queue's delivery (its status, issue 49).
pub fn delivery_state(q: &QueueInfo) -> DeliveryState {
    match (q.paused, q.pause_persisted) {
        (false, _) => DeliveryState::Active,
        (true, Some(true)) => DeliveryState::Paused,
        (true, Some(false)) => DeliveryState::PausedNotPersisted,
        (true, None) => DeliveryState::PausedPersistenceUnknown,
    }
}

/// What pausing or resuming delivery does on this node, said before it is done (issue 49).
pub fn delivery_consequence(d: &DesiredQueue, q: &QueueInfo) -> String {
    match d.spec.delivery {
        Some(Delivery::Paused) if q.paused => format!(
            "persist the pause: delivery is paused on this node but the pause was not persisted (a pause() by hand), so a broker restart would resume it; pause(true) persists it ({} consumer(s), {} message(s) waiting: nothing else changes)",
            q.consumer_count, q.message_count
        ),
        Some(Delivery::Paused) => format!(
            "pause delivery: {} consumer(s) stop receiving; {} message(s) waiting; messages keep arriving and wait (kept in memory, paged or blocked as the address's settings say)",
            q.consumer_count, q.message_count
        ),
        _ => format!(
            "resume delivery: the {} waiting message(s) go to {} consumer(s)",
            q.message_count, q.consumer_count
        ),
    }
}

/// ADR-0084 §5: what happens to a capture tap on the deleted queue's address. The delete never
/// touches it; its subscription removes it at its next pass once no queue its pattern matches
/// remains on the address, otherwise it stays.
fn capture_tap_note(
    queue: &str,
    address: &str,
    divert: &str,
    inv: &NodeInventory,
    facts: &PlanFacts,
) -> String {
    use crate::api::capture_names::{TapName, wildcard_matches};
    let Some((tap, _)) = TapName::parse(&facts.instance_id, divert) else {
        return "capture tap of another operator instance: kept; this operator never touches it (ADR-0062 D7)".into();
    };
    let Some(pattern) = facts.capture_patterns.get(&tap.subscription) else {
        return format!(
            "capture tap of ArtemisCaptureSubscription {}, which no longer exists: kept by this delete; the next capture pass sweeps it (ADR-0084 §5)",
            tap.subscription
        );
    };
    let others: Vec<String> = inv
        .queue_names_on(address)
        .into_iter()
        .filter(|q| q != queue && wildcard_matches(pattern, q))
        .collect();
    if others.is_empty() {
        format!(
            "capture tap of ArtemisCaptureSubscription {}: kept by this delete; removed by that subscription's next capture pass once the snapshot no longer holds this queue, the last one on {address} its pattern {pattern:?} matches (until then it copies into its ring) (ADR-0084 §5)",
            tap.subscription
        )
    } else {
        format!(
            "capture tap of ArtemisCaptureSubscription {}: kept; the subscription still captures {address} through {} (ADR-0084 §5)",
            tap.subscription,
            others.join(", ")
        )
    }
}

/// Diverts a queue delete removes with the queue on a node, and those it keeps (ADR-0084 §1, §4, §5).
pub fn divert_impact(
    queue: &str,
    address: &str,
    inv: &NodeInventory,
    facts: &PlanFacts,
) -> (Vec<(DivertInfo, DivertImpact)>, Vec<DivertImpact>) {
    let declared = &facts.declared_diverts;
    let last_queue_on_address = inv.queue_names_on(address).iter().all(|q| q == queue);
    let mut removed = vec![];
    let mut kept = vec![];
    for d in inv.diverts.values() {
        let impact = |note: String| DivertImpact {
            name: d.name.clone(),
            address: d.address.clone(),
            forwarding_address: d.forwarding_address.clone(),
            declared_by: declared.get(&d.name).cloned(),
            note,
        };
        if d.name.starts_with(CAPTURE_PREFIX) {
            // §5: capture taps belong to their subscription, never to a queue delete.
            if d.address == address || d.forwarding_address == address {
                kept.push(impact(capture_tap_note(queue, address, &d.name, inv, facts)));
            }
            continue;
        }
        if d.forwarding_address == address && last_queue_on_address {
            let mut note = format!(
                "removed with the queue: it forwards into {address} and this is the last queue bound there. If this divert is in the node's broker.xml, the broker creates it again at the next restart and the queue can come back with it"
            );
            if let Some(by) = declared.get(&d.name) {
                note.push_str(&match facts.declaration_mode {
                    DeclarationMode::StudioManaged => format!(
                        ". Declared by ArtemisDivert {by}: the removal does not stick — its next pass acts on the declaration again (it re-creates the divert if a queue is declared at {address}, otherwise it is refused with \"Nothing consumes at {address}\"); remove the ArtemisDivert"
                    ),
                    DeclarationMode::ConfigManaged => format!(
                        ". Declared by ArtemisDivert {by} and the cluster is ConfigManaged: the broker.xml rendered from the declaration still carries the divert, so the next deployment and restart bring it back; remove it from the declaration"
                    ),
                });
            }
            removed.push((d.clone(), impact(note)));
        } else if d.address == address {
            kept.push(impact(format!(
                "kept: its source is {address}; it still routes what producers send there (delete it with its own ArtemisDivert)"
            )));
        }
    }
    (removed, kept)
}

/// The delete preflight of one node (ADR-0084 §1, §6), from an inventory. The dependent
/// diverts come back too; a queue that is not this object's (another address or routing type)
/// is named and left alone.
pub fn delete_preview(
    d: &DesiredQueue,
    node: &str,
    inv: &NodeInventory,
    facts: &PlanFacts,
) -> (NodeDeletePreview, Vec<DivertInfo>) {
    let nothing = |message: String| {
        (
            NodeDeletePreview {
                node: node.into(),
                message: Some(message),
                ..Default::default()
            },
            vec![],
        )
    };
    if let Some(why) = inv.unreadable_queues.get(&d.name) {
        let (mut p, v) = nothing(format!(
            "queue {} could not be read on this node ({why}): nothing is destroyed on a guess",
            d.name
        ));
        p.refusal = Some(RefusalKind::BadResponse);
        return (p, v);
    }
    let Some(q) = inv.queues.get(&d.name) else {
        return nothing("the queue is not on this node: nothing to delete (ALREADY)".into());
    };
    if !d.owns(q) {
        return nothing(format!(
            "queue {} on this node is on address {} as {}, not this object's ({} on {}): a delete leaves it in place",
            d.name, q.address, q.routing_type, d.routing_type, d.address
        ));
    }
    let (removed, kept) = divert_impact(&d.name, &d.address, inv, facts);
    let (refusal, message) = if q.consumer_count > 0 && !d.spec.deletion.disconnect_consumers {
        (
            Some(RefusalKind::HasConsumers),
            Some(format!(
                "{} consumer(s) attached: delete is refused; set spec.deletion.disconnectConsumers: true to close them (a client that reconnects may re-create the queue if auto-create is on)",
                q.consumer_count
            )),
        )
    } else if q.consumer_count > 0 {
        (
            None,
            Some(format!(
                "{} consumer(s) will be disconnected (disconnectConsumers); a client that reconnects may re-create the queue if auto-create is on",
                q.consumer_count
            )),
        )
    } else {
        (None, None)
    };
    let preview = NodeDeletePreview {
        node: node.into(),
        message_count: q.message_count,
        consumer_count: q.consumer_count,
        dependent_diverts: removed.iter().map(|(_, i)| i.clone()).collect(),
        kept_diverts: kept,
        refusal,
        message,
        ..Default::default()
    };
    (preview, removed.into_iter().map(|(d, _)| d).collect())
}

/// What deleting needs on one node, from its (fresh) inventory.
pub fn plan_delete(d: &DesiredQueue, inv: &NodeInventory, facts: &PlanFacts) -> Step {
    let (p, dependent) = delete_preview(d, "", inv, facts);
    let owned = inv.queues.get(&d.name).is_some_and(|q| d.owns(q));
    match (p.refusal, owned) {
        (Some(kind), _) => Step::Refuse {
            kind,
            message: p.message.unwrap_or_default(),
        },
        (None, false) => Step::Nothing {
            message: p.message.unwrap_or_default(),
        },
        (None, true) => Step::Write {
            what: format!(
                "delete queue {} ({} message(s), {} consumer(s), {} dependent divert(s))",
                d.name,
                p.message_count,
                p.consumer_count,
                dependent.len()
            ),
            detail: dependent
                .iter()
                .map(|x| format!("removes divert {}", x.name))
                .collect(),
        },
    }
}

/// Messages a delete would destroy on one node: only a queue this object owns counts.
pub fn owned_message_count(d: &DesiredQueue, inv: &NodeInventory) -> u64 {
    inv.queues
        .get(&d.name)
        .filter(|q| d.owns(q))
        .map_or(0, |q| q.message_count)
}

/// The bulk cap (ADR-0049, ADR-0022): the summed MessageCount against the cap. `allowMessageLoss`
/// is the most messages this one delete may destroy in total: it raises the cap, never lowers it.
pub fn bulk_cap_verdict(
    total_messages: u64,
    cluster_cap: u64,
    allow_message_loss: Option<u64>,
) -> (u64, bool) {
    let cap = allow_message_loss.map_or(cluster_cap, |a| a.max(cluster_cap));
    (cap, total_messages > cap)
}

/// The full configuration of a divert, as createDivert takes it (kept in the audit row so a
/// removed divert can be recreated exactly, ADR-0084 §3).
pub fn divert_document(d: &DivertInfo) -> Value {
    json!({
        "name": d.name,
        "routing-name": d.routing_name,
        "address": d.address,
        "forwarding-address": d.forwarding_address,
        "exclusive": d.exclusive,
        "filter-string": d.filter,
        "routing-type": d.routing_type,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::queue::QueueRoutingType;
    use crate::topology::inventory::{Expected, Unreadable};

    fn spec(json: Value) -> ArtemisQueueSpec {
        serde_json::from_value(json).expect("spec")
    }

    fn queue(name: &str, address: &str, routing: &str) -> QueueInfo {
        QueueInfo {
            name: name.into(),
            address: address.into(),
            routing_type: routing.into(),
            durable: true,
            max_consumers: -1,
            enabled: true,
            ring_size: -1,
            group_buckets: -1,
            ..Default::default()
        }
    }

    fn inv(queues: Vec<QueueInfo>, diverts: Vec<DivertInfo>) -> NodeInventory {
        let mut i = NodeInventory::default();
        for q in queues {
            i.addresses.entry(q.address.clone()).or_default().name = q.address.clone();
            i.queues.insert(q.name.clone(), q);
        }
        for d in diverts {
            i.diverts.insert(d.name.clone(), d);
        }
        i
    }

    fn divert(name: &str, from: &str, to: &str) -> DivertInfo {
        DivertInfo {
            name: name.into(),
            address: from.into(),
            forwarding_address: to.into(),
            routing_type: "STRIP".into(),
            ..Default::default()
        }
    }

    /// Issue 49: the declared delivery state is planned like an attribute (and only when
    /// declared: unset leaves a hand-made pause alone); its consequence is said first.
    #[test]
    fn delivery_is_planned_only_when_declared_and_its_consequence_is_said() {
        let mut q = queue("q", "q", "ANYCAST");
        (q.consumer_count, q.message_count) = (2, 5);
        let paused = DesiredQueue::new(
            "q",
            &spec(json!({"clusterRef": {"name": "c"}, "delivery": "Paused"})),
        );
        let active = DesiredQueue::new(
            "q",
            &spec(json!({"clusterRef": {"name": "c"}, "delivery": "Active"})),
        );
        let unset = DesiredQueue::new("q", &spec(json!({"clusterRef": {"name": "c"}})));
        let running = inv(vec![q.clone()], vec![]);
        let stopped = inv(
            vec![QueueInfo {
                paused: true,
                ..q.clone()
            }],
            vec![],
        );
        let update = |changed: &[&str]| NodeAction::Update {
            changed: changed.iter().map(|c| c.to_string()).collect(),
        };
        assert_eq!(plan_node(&paused, &running), update(&[DELIVERY]));
        assert_eq!(plan_node(&paused, &stopped), NodeAction::Converged);
        assert_eq!(plan_node(&active, &stopped), update(&[DELIVERY]));
        assert_eq!(plan_node(&active, &running), NodeAction::Converged);
        assert_eq!(plan_node(&unset, &stopped), NodeAction::Converged);
        let said = delivery_consequence(&paused, &q);
        assert!(
            said.contains("2 consumer(s) stop receiving") && said.contains("5 message(s) waiting"),
            "{said}"
        );
        let said = delivery_consequence(&active, &q);
        assert!(
            said.starts_with("resume delivery") && said.contains("5 waiting"),
            "{said}"
        );
    }

    fn paused_queue(persisted: Option<bool>) -> QueueInfo {
        QueueInfo {
            paused: true,
            pause_persisted: persisted,
            consumer_count: 2,
            message_count: 5,
            ..queue("q", "q", "ANYCAST")
        }
    }

    fn declared_paused() -> DesiredQueue {
        DesiredQueue::new(
            "q",
            &spec(json!({"clusterRef": {"name": "c"}, "delivery": "Paused"})),
        )
    }

    /// Issue 49: declared Paused, a pause the broker reports not persisted (`pause()` by hand)
    /// is not ALREADY: a broker restart would resume delivery. It is written again with
    /// pause(true), and what is said before says why.
    #[test]
    fn a_pause_that_is_not_persisted_is_paused_again_with_persistence() {
        let d = declared_paused();
        let hand_paused = paused_queue(Some(false));
        let node = inv(vec![hand_paused.clone()], vec![]);
        assert_eq!(
            plan_node(&d, &node),
            NodeAction::Update {
                changed: vec![DELIVERY.to_string()]
            }
        );
        assert_eq!(delivery_state(&hand_paused), DeliveryState::PausedNotPersisted);
        let said = delivery_consequence(&d, &hand_paused);
        assert!(
            said.starts_with("persist the pause")
                && said.contains("not persisted")
                && said.contains("pause(true)"),
            "{said}"
        );
        // Unset declares nothing: a hand-made pause, persisted or not, is left alone.
        let unset = DesiredQueue::new("q", &spec(json!({"clusterRef": {"name": "c"}})));
        assert_eq!(plan_node(&unset, &node), NodeAction::Converged);
        // Declared Active: resumed, whatever its persistence.
        let active = DesiredQueue::new(
            "q",
            &spec(json!({"clusterRef": {"name": "c"}, "delivery": "Active"})),
        );
        assert!(matches!(plan_node(&active, &node), NodeAction::Update { .. }));
    }

    /// Issue 49: ALREADY only when paused and persisted — or when persistence cannot be had or
    /// known: a non-durable queue (its pause is never persisted, and it does not outlive a
    /// restart), a broker that does not report it (Artemis 2.40: no PersistedPause).
    #[test]
    fn a_pause_is_already_only_when_persisted_or_not_to_be_known() {
        let d = declared_paused();
        let persisted = paused_queue(Some(true));
        assert_eq!(
            plan_node(&d, &inv(vec![persisted.clone()], vec![])),
            NodeAction::Converged
        );
        assert_eq!(delivery_state(&persisted), DeliveryState::Paused);
        let unknown = paused_queue(None);
        assert_eq!(
            plan_node(&d, &inv(vec![unknown.clone()], vec![])),
            NodeAction::Converged
        );
        assert_eq!(delivery_state(&unknown), DeliveryState::PausedPersistenceUnknown);
        let not_durable = QueueInfo {
            durable: false,
            ..paused_queue(Some(false))
        };
        assert_eq!(
            plan_node(&d, &inv(vec![not_durable], vec![])),
            NodeAction::Converged,
            "no pause(true) every pass on a queue whose pause Artemis never persists"
        );
        // Not paused: written, whatever a stale persistence says.
        let resumed = QueueInfo {
            paused: false,
            ..paused_queue(Some(true))
        };
        assert!(matches!(
            plan_node(&d, &inv(vec![resumed.clone()], vec![])),
            NodeAction::Update { .. }
        ));
        assert_eq!(delivery_state(&resumed), DeliveryState::Active);
    }

    #[test]
    fn a_missing_queue_is_created_with_its_address() {
        let d = DesiredQueue::new(
            "orders",
            &spec(json!({"clusterRef": {"name": "c"}, "filter": "a=1"})),
        );
        assert_eq!(d.routing_type, QueueRoutingType::Anycast.as_broker());
        match plan_node(&d, &NodeInventory::default()) {
            NodeAction::Create {
                create_address,
                document,
            } => {
                assert!(create_address);
                assert_eq!(document["filter-string"], "a=1");
                assert_eq!(document["routing-type"], "ANYCAST");
                assert!(document.get("max-consumers").is_none(), "only what the spec sets");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_update_sends_the_whole_document_with_unmentioned_fields_kept() {
        let mut q = queue("orders", "orders", "ANYCAST");
        q.filter = Some("old=1".into());
        q.consumer_priority = Some(7);
        let s = spec(json!({"clusterRef": {"name": "c"}, "filter": "new=1"}));
        let d = DesiredQueue::new("orders", &s);
        assert_eq!(
            plan_node(&d, &inv(vec![q.clone()], vec![])),
            NodeAction::Update {
                changed: vec!["filter-string".into()]
            }
        );
        let doc = update_document(&q, &s);
        assert_eq!(doc["filter-string"], "new=1");
        assert_eq!(
            doc["consumer-priority"], 7,
            "a field the spec never mentioned survives"
        );
        assert_eq!(doc["routing-type"], "ANYCAST");
    }

    #[test]
    fn an_unset_filter_is_left_alone_and_an_empty_one_clears() {
        let mut q = queue("orders", "orders", "ANYCAST");
        q.filter = Some("keep=1".into());
        let d = DesiredQueue::new("orders", &spec(json!({"clusterRef": {"name": "c"}})));
        assert_eq!(
            plan_node(&d, &inv(vec![q.clone()], vec![])),
            NodeAction::Converged
        );
        let d = DesiredQueue::new(
            "orders",
            &spec(json!({"clusterRef": {"name": "c"}, "filter": ""})),
        );
        assert!(matches!(
            plan_node(&d, &inv(vec![q], vec![])),
            NodeAction::Update { .. }
        ));
    }

    /// A queue of the spec's name on another address is another application's queue (a queue
    /// cannot move): refused, never updated.
    #[test]
    fn the_same_name_on_another_address_is_refused_never_updated() {
        let d = DesiredQueue::new("orders", &spec(json!({"clusterRef": {"name": "c"}})));
        match plan_node(&d, &inv(vec![queue("orders", "elsewhere", "ANYCAST")], vec![])) {
            NodeAction::Refuse { kind, message } => {
                assert_eq!(kind, RefusalKind::NameConflict);
                assert!(
                    message.contains("on address elsewhere") && message.contains("spec.name"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// A key the broker reports as null and a spec's "" are the same absence: converged, no
    /// update sent again at every pass.
    #[test]
    fn an_empty_key_in_the_spec_matches_a_key_the_broker_reports_as_null() {
        let q = queue("orders", "orders", "ANYCAST");
        assert_eq!(q.last_value_key, None);
        let d = DesiredQueue::new(
            "orders",
            &spec(json!({"clusterRef": {"name": "c"}, "lastValueKey": "", "groupFirstKey": ""})),
        );
        assert_eq!(plan_node(&d, &inv(vec![q], vec![])), NodeAction::Converged);
    }

    #[test]
    fn another_routing_type_is_refused_never_recreated() {
        let d = DesiredQueue::new(
            "orders",
            &spec(json!({"clusterRef": {"name": "c"}, "routingType": "ANYCAST"})),
        );
        match plan_node(&d, &inv(vec![queue("orders", "orders", "MULTICAST")], vec![])) {
            NodeAction::Refuse { kind, message } => {
                assert_eq!(kind, RefusalKind::RoutingTypeImmutable);
                assert!(message.contains("spec.routingType"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dependent_diverts_are_those_forwarding_into_the_last_queue() {
        let queues = vec![queue("target", "target", "ANYCAST")];
        let diverts = vec![
            divert("into", "source", "target"),
            divert("out", "target", "elsewhere"),
            divert(&format!("{CAPTURE_PREFIX}studio.target.sub"), "target", "cap"),
        ];
        let facts = PlanFacts {
            declared_diverts: BTreeMap::from([("into".to_string(), "ns/into".to_string())]),
            ..Default::default()
        };
        let (removed, kept) = divert_impact("target", "target", &inv(queues, diverts.clone()), &facts);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].0.name, "into");
        assert!(removed[0].1.note.contains("broker.xml"));
        assert!(removed[0].1.note.contains("does not stick"));
        let config_managed = PlanFacts {
            declaration_mode: DeclarationMode::ConfigManaged,
            ..facts.clone()
        };
        let (removed_cm, _) = divert_impact(
            "target",
            "target",
            &inv(vec![queue("target", "target", "ANYCAST")], diverts.clone()),
            &config_managed,
        );
        assert!(
            removed_cm[0]
                .1
                .note
                .contains("broker.xml rendered from the declaration")
        );
        assert_eq!(removed[0].1.declared_by.as_deref(), Some("ns/into"));
        let kept_names: Vec<&str> = kept.iter().map(|k| k.name.as_str()).collect();
        assert!(kept_names.contains(&"out"));
        assert!(kept.iter().any(|k| k.note.contains("another operator instance")));
        // Our own tap: removed by its subscription's next pass when this is the last matching
        // queue on the address, kept when another matching queue remains.
        let ours = crate::api::capture_names::TapName::new("i1", "ns", "target", "sub");
        let with_tap = |queues: Vec<QueueInfo>| {
            inv(
                queues,
                vec![divert(&ours.divert(), "target", &ours.capture_queue())],
            )
        };
        let mut facts = facts.clone();
        facts.instance_id = "i1".into();
        facts.capture_patterns = BTreeMap::from([("sub".to_string(), "#".to_string())]);
        let (_, kept) = divert_impact(
            "target",
            "target",
            &with_tap(vec![queue("target", "target", "ANYCAST")]),
            &facts,
        );
        assert!(
            kept[0]
                .note
                .contains("removed by that subscription's next capture pass"),
            "{}",
            kept[0].note
        );
        let two = vec![
            queue("target", "target", "ANYCAST"),
            queue("also", "target", "ANYCAST"),
        ];
        let (_, kept) = divert_impact("target", "target", &with_tap(two), &facts);
        assert!(
            kept[0].note.contains("still captures target through also"),
            "{}",
            kept[0].note
        );
        facts.capture_patterns.clear();
        let (_, kept) = divert_impact(
            "target",
            "target",
            &with_tap(vec![queue("target", "target", "ANYCAST")]),
            &facts,
        );
        assert!(kept[0].note.contains("no longer exists"), "{}", kept[0].note);

        // With a second queue on the address, the divert still has a consumer: not dependent.
        let queues = vec![
            queue("target", "target", "ANYCAST"),
            queue("other", "target", "ANYCAST"),
        ];
        let (removed, _) = divert_impact("target", "target", &inv(queues, diverts), &PlanFacts::default());
        assert!(removed.is_empty());
    }

    #[test]
    fn status_lists_the_first_diverts_and_counts_them_all_while_the_delete_removes_every_one() {
        let diverts: Vec<DivertInfo> = (0..2_000)
            .map(|i| divert(&format!("d{i:04}"), &format!("src{i}"), "sink"))
            .collect();
        let d = DesiredQueue::new("sink", &spec(json!({"clusterRef": {"name": "c"}})));
        let inventory = inv(vec![queue("sink", "sink", "ANYCAST")], diverts);
        let (p, removed) = delete_preview(&d, "n1", &inventory, &PlanFacts::default());
        assert_eq!(removed.len(), 2_000, "the delete removes every one");
        let shown = p.listed();
        assert_eq!(shown.dependent_divert_count, 2_000);
        assert_eq!(shown.dependent_diverts.len(), crate::api::queue::LISTED_DIVERTS);
        let bytes = serde_json::to_vec(&shown).map(|v| v.len()).unwrap_or(usize::MAX);
        assert!(bytes < 20_000, "a node's preview is {bytes} bytes");
    }

    /// ADR-0084 §5: the delete preview names the capture taps on the queue's address, and
    /// never a tap on another address (its subscription's business, not this delete's).
    #[test]
    fn the_delete_preview_keeps_only_the_capture_taps_on_the_queues_address() {
        let tap = |address: &str| {
            let t = crate::api::capture_names::TapName::new("i1", "ns", address, "sub");
            divert(&t.divert(), address, &t.forwarding_address())
        };
        let d = DesiredQueue::new("orders", &spec(json!({"clusterRef": {"name": "c"}})));
        let node = inv(
            vec![
                queue("orders", "orders", "ANYCAST"),
                queue("invoices", "invoices", "ANYCAST"),
            ],
            vec![tap("orders"), tap("invoices")],
        );
        let (p, removed) = delete_preview(&d, "n1", &node, &PlanFacts::default());
        assert!(removed.is_empty(), "a delete never removes a tap");
        assert_eq!(
            p.kept_diverts
                .iter()
                .map(|k| k.address.as_str())
                .collect::<Vec<_>>(),
            ["orders"],
            "{:?}",
            p.kept_diverts
        );
    }

    /// A queue without consumers: the preview has nothing to say about consumers, even when
    /// spec.deletion.disconnectConsumers is set.
    #[test]
    fn a_queue_without_consumers_has_no_consumer_message() {
        let d = DesiredQueue::new(
            "orders",
            &spec(json!({"clusterRef": {"name": "c"}, "deletion": {"disconnectConsumers": true}})),
        );
        let (p, _) = delete_preview(
            &d,
            "n1",
            &inv(vec![queue("orders", "orders", "ANYCAST")], vec![]),
            &PlanFacts::default(),
        );
        assert_eq!((p.consumer_count, p.refusal, p.message), (0, None, None));
    }

    #[test]
    fn consumers_refuse_unless_disconnect_is_set() {
        let mut q = queue("orders", "orders", "ANYCAST");
        q.consumer_count = 2;
        q.message_count = 5;
        let d = DesiredQueue::new("orders", &spec(json!({"clusterRef": {"name": "c"}})));
        let (p, _) = delete_preview(&d, "n1", &inv(vec![q.clone()], vec![]), &PlanFacts::default());
        assert_eq!(p.refusal, Some(RefusalKind::HasConsumers));
        assert!(
            p.message
                .as_deref()
                .is_some_and(|m| m.contains("2 consumer") && m.contains("disconnectConsumers"))
        );
        let d = DesiredQueue::new(
            "orders",
            &spec(json!({"clusterRef": {"name": "c"}, "deletion": {"disconnectConsumers": true}})),
        );
        let (p, _) = delete_preview(&d, "n1", &inv(vec![q], vec![]), &PlanFacts::default());
        assert_eq!(p.refusal, None);
        assert_eq!(p.message_count, 5);
    }

    #[test]
    fn a_queue_of_the_same_name_on_another_address_or_routing_type_is_never_deleted() {
        let d = DesiredQueue::new(
            "orders",
            &spec(json!({"clusterRef": {"name": "c"}, "routingType": "ANYCAST"})),
        );
        let mut q = queue("orders", "orders", "MULTICAST");
        q.message_count = 9;
        let i = inv(vec![q], vec![]);
        assert!(matches!(
            plan_delete(&d, &i, &PlanFacts::default()),
            Step::Nothing { .. }
        ));
        assert_eq!(owned_message_count(&d, &i), 0);
        let i = inv(vec![queue("orders", "elsewhere", "ANYCAST")], vec![]);
        assert!(matches!(
            plan_delete(&d, &i, &PlanFacts::default()),
            Step::Nothing { .. }
        ));
        let i = inv(vec![queue("orders", "orders", "ANYCAST")], vec![]);
        assert!(matches!(
            plan_delete(&d, &i, &PlanFacts::default()),
            Step::Write { .. }
        ));
    }

    #[test]
    fn an_unreadable_queue_is_neither_written_nor_destroyed() {
        let d = DesiredQueue::new("orders", &spec(json!({"clusterRef": {"name": "c"}})));
        let mut i = NodeInventory::default();
        i.unreadable_queues.insert(
            "orders".into(),
            Unreadable::AttributeWrongType {
                attribute: "MessageCount",
                expected: Expected::Count,
            },
        );
        assert!(matches!(
            plan_delete(&d, &i, &PlanFacts::default()),
            Step::Refuse {
                kind: RefusalKind::BadResponse,
                ..
            }
        ));
        assert!(matches!(
            plan_node(&d, &i),
            NodeAction::Refuse {
                kind: RefusalKind::BadResponse,
                ..
            }
        ));
    }

    #[test]
    fn names_with_wildcards_or_the_capture_prefix_are_refused() {
        let ok = DesiredQueue::checked("orders", &spec(json!({"clusterRef": {"name": "c"}})));
        assert!(ok.is_ok());
        let wildcard = |field, value: &str, character| BrokerNameError::Wildcard {
            field,
            value: value.into(),
            character,
        };
        for (object, s, refused) in [
            (
                "x",
                json!({"clusterRef": {"name": "c"}, "name": "orders.*"}),
                wildcard("spec.name", "orders.*", '*'),
            ),
            (
                "x",
                json!({"clusterRef": {"name": "c"}, "address": "orders.#"}),
                wildcard("spec.address", "orders.#", '#'),
            ),
            (
                "artemis-studio.capture.x",
                json!({"clusterRef": {"name": "c"}}),
                BrokerNameError::CapturePrefix {
                    field: "metadata.name",
                    value: "artemis-studio.capture.x".into(),
                },
            ),
            (
                "x",
                json!({"clusterRef": {"name": "c"}, "name": ""}),
                BrokerNameError::Empty { field: "spec.name" },
            ),
        ] {
            let e = DesiredQueue::checked(object, &spec(s)).expect_err("refused");
            assert_eq!(e, refused);
        }
        let e = DesiredQueue::checked(
            "x",
            &spec(json!({"clusterRef": {"name": "c"}, "name": "orders.*"})),
        )
        .expect_err("refused");
        assert!(
            e.to_string()
                .starts_with("spec.name 'orders.*' contains '*', an Artemis wildcard character"),
            "the message names the field to fix: {e}"
        );
    }

    /// The bulk cap (ADR-0049) sums the messages a delete destroys: a queue this object owns
    /// counts with all its messages.
    #[test]
    fn an_owned_queue_counts_its_messages_toward_the_bulk_cap() {
        let d = DesiredQueue::new("orders", &spec(json!({"clusterRef": {"name": "c"}})));
        let mut q = queue("orders", "orders", "ANYCAST");
        q.message_count = 9;
        assert_eq!(owned_message_count(&d, &inv(vec![q], vec![])), 9);
        assert_eq!(owned_message_count(&d, &NodeInventory::default()), 0);
    }

    /// ADR-0084 §3: the audit row of a removed divert holds its whole configuration, as
    /// createDivert takes it, so the divert can be recreated exactly.
    #[test]
    fn a_removed_divert_is_recorded_with_everything_needed_to_recreate_it() {
        let d = DivertInfo {
            routing_name: Some("route".into()),
            exclusive: true,
            filter: Some("region = 'eu'".into()),
            ..divert("into", "source", "target")
        };
        assert_eq!(
            divert_document(&d),
            json!({
                "name": "into",
                "routing-name": "route",
                "address": "source",
                "forwarding-address": "target",
                "exclusive": true,
                "filter-string": "region = 'eu'",
                "routing-type": "STRIP",
            })
        );
    }

    #[test]
    fn the_bulk_cap_counts_messages_and_takes_the_override() {
        assert_eq!(bulk_cap_verdict(10_001, 10_000, None), (10_000, true));
        assert_eq!(bulk_cap_verdict(10_000, 10_000, None), (10_000, false));
        assert_eq!(bulk_cap_verdict(50_000, 10_000, Some(50_000)), (50_000, false));
        assert_eq!(bulk_cap_verdict(3, 0, Some(2)), (2, true));
    }

    /// `auto-create-address` makes the broker mark the address auto-created, and so free to
    /// remove it once empty: a create asks for that only when the spec removes an emptied
    /// address anyway (spec.deletion.removeEmptyAddress); otherwise a missing address is created
    /// as an ordinary one (`createAddress`), and an existing one is never touched.
    #[test]
    fn a_missing_address_is_auto_created_only_when_the_spec_removes_it_once_empty() {
        let with_address = inv(vec![queue("other", "orders", "ANYCAST")], vec![]);
        for (remove_empty, address_exists, create_address, auto_created) in [
            (false, false, true, false),
            (true, false, false, true),
            (false, true, false, false),
            (true, true, false, false),
        ] {
            let d = DesiredQueue::new(
                "orders",
                &spec(json!({"clusterRef": {"name": "c"}, "deletion": {"removeEmptyAddress": remove_empty}})),
            );
            let node = if address_exists {
                with_address.clone()
            } else {
                NodeInventory::default()
            };
            let NodeAction::Create {
                create_address: c,
                document,
            } = plan_node(&d, &node)
            else {
                panic!("a missing queue is created")
            };
            let case = format!("removeEmptyAddress {remove_empty}, address exists {address_exists}");
            assert_eq!(c, create_address, "{case}: createAddress");
            assert_eq!(
                document.get("auto-create-address") == Some(&json!(true)),
                auto_created,
                "{case}: {document}"
            );
        }
    }

    /// ADR-0084 §1, §4, §6: a node's delete preview names the node, the consumers the delete
    /// disconnects and the diverts it keeps (their source is the queue's address); a node
    /// without the queue says so. What the user reads in status.deletePreview before arming.
    #[test]
    fn the_delete_preview_names_its_node_the_consumers_it_disconnects_and_the_diverts_it_keeps() {
        let mut q = queue("orders", "orders", "ANYCAST");
        q.consumer_count = 2;
        let d = DesiredQueue::new(
            "orders",
            &spec(json!({"clusterRef": {"name": "c"}, "deletion": {"disconnectConsumers": true}})),
        );
        let node = inv(vec![q], vec![divert("out", "orders", "elsewhere")]);
        let (p, removed) = delete_preview(&d, "n1", &node, &PlanFacts::default());
        assert_eq!(p.node, "n1");
        assert_eq!(p.consumer_count, 2);
        assert!(
            p.message
                .as_deref()
                .is_some_and(|m| m.contains("2 consumer(s) will be disconnected")),
            "{:?}",
            p.message
        );
        assert_eq!(
            p.kept_diverts.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
            ["out"]
        );
        assert!(removed.is_empty() && p.dependent_diverts.is_empty());

        let (p, _) = delete_preview(&d, "n2", &NodeInventory::default(), &PlanFacts::default());
        assert_eq!(p.node, "n2");
        assert!(
            p.message
                .as_deref()
                .is_some_and(|m| m.contains("not on this node")),
            "{:?}",
            p.message
        );
    }
}
