//! The ArtemisQueue plan: a pure function of (spec, node inventory, cluster limits). All the ADR
//! judgement lives here — the read-overlay-send merge (ADR-0049), the routing-type refusal, the
//! dependent-divert analysis, the consumer check and the bulk cap (ADR-0084).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::api::queue::{ArtemisQueueSpec, DivertImpact, NodeDeletePreview};
use crate::api::{CAPTURE_PREFIX, RefusalKind};
use crate::topology::inventory::{DivertInfo, NodeInventory, QueueInfo};

/// The queue a spec asks for, with its broker names resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredQueue {
    pub name: String,
    pub address: String,
    pub routing_type: &'static str,
    pub spec: ArtemisQueueSpec,
}

impl DesiredQueue {
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

/// The broker's current configuration of a queue as a QueueConfiguration document.
pub fn current_document(q: &QueueInfo) -> Value {
    json!({
        "name": q.name,
        "address": q.address,
        "routing-type": q.routing_type,
        "filter-string": q.filter.clone().unwrap_or_default(),
        "durable": q.durable,
        "max-consumers": q.max_consumers,
        "exclusive": q.exclusive,
        "last-value": q.last_value,
        "last-value-key": q.last_value_key,
        "non-destructive": q.non_destructive,
        "purge-on-no-consumers": q.purge_on_no_consumers,
        "enabled": q.enabled,
        "consumers-before-dispatch": q.consumers_before_dispatch,
        "delay-before-dispatch": q.delay_before_dispatch,
        "consumer-priority": q.consumer_priority,
        "ring-size": q.ring_size,
        "group-rebalance": q.group_rebalance,
        "group-buckets": q.group_buckets,
        "group-first-key": q.group_first_key,
        "auto-delete": q.auto_delete,
        "auto-delete-delay": q.auto_delete_delay,
        "auto-delete-message-count": q.auto_delete_message_count,
    })
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

/// Fields whose value differs between two documents (null and "" are the same absence).
pub fn differing_fields(current: &Value, desired: &Value) -> Vec<String> {
    let absent = |v: Option<&Value>| matches!(v, None | Some(Value::Null)) || v == Some(&Value::from(""));
    let (Some(c), Some(d)) = (current.as_object(), desired.as_object()) else {
        return vec![];
    };
    let mut out: Vec<String> = d
        .iter()
        .filter(|(k, dv)| {
            let cv = c.get(*k);
            !(cv == Some(dv) || (absent(cv) && absent(Some(dv))))
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

/// Decide what one node needs, from its inventory.
pub fn plan_node(d: &DesiredQueue, inv: &NodeInventory) -> NodeAction {
    match inv.queues.get(&d.name) {
        None => NodeAction::Create {
            create_address: !inv.addresses.contains_key(&d.address),
            document: create_document(d),
        },
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
            let changed = differing_fields(&current_document(q), &update_document(q, &d.spec));
            if changed.is_empty() {
                NodeAction::Converged
            } else {
                NodeAction::Update { changed }
            }
        }
    }
}

/// Diverts a queue delete removes with the queue on a node, and those it keeps (ADR-0084 §1, §4, §5).
pub fn divert_impact(
    queue: &str,
    address: &str,
    inv: &NodeInventory,
    declared: &BTreeMap<String, String>,
) -> (Vec<(DivertInfo, DivertImpact)>, Vec<DivertImpact>) {
    let last_queue_on_address = inv.queues_on(address).all(|q| q.name == queue);
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
                kept.push(impact(
                    "capture tap: kept; its capture subscription removes it once no queue it matches remains on the address (ADR-0084 §5)".into(),
                ));
            }
            continue;
        }
        if d.forwarding_address == address && last_queue_on_address {
            let mut note = format!(
                "removed with the queue: it forwards into {address} and this is the last queue bound there. If this divert is in the node's broker.xml, the broker creates it again at the next restart and the queue can come back with it"
            );
            if let Some(by) = declared.get(&d.name) {
                note.push_str(&format!(
                    ". Declared by ArtemisDivert {by}: the ArtemisDivert will act again; remove it from the declaration"
                ));
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

/// The delete preflight of one node (ADR-0084 §1, §6), from an inventory.
pub fn delete_preview(
    d: &DesiredQueue,
    node: &str,
    inv: &NodeInventory,
    declared: &BTreeMap<String, String>,
) -> (NodeDeletePreview, Vec<DivertInfo>) {
    let Some(q) = inv.queues.get(&d.name) else {
        return (
            NodeDeletePreview {
                node: node.into(),
                message: Some("the queue is not on this node: nothing to delete (ALREADY)".into()),
                ..Default::default()
            },
            vec![],
        );
    };
    let (removed, kept) = divert_impact(&d.name, &d.address, inv, declared);
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
    };
    (preview, removed.into_iter().map(|(d, _)| d).collect())
}

/// The bulk cap (ADR-0049, ADR-0022): the summed MessageCount against the cap or the override.
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
    use super::*;
    use crate::api::queue::QueueRoutingType;

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
        q.consumer_priority = 7;
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
        let declared = BTreeMap::from([("into".to_string(), "ns/into".to_string())]);
        let (removed, kept) = divert_impact("target", "target", &inv(queues, diverts.clone()), &declared);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].0.name, "into");
        assert!(removed[0].1.note.contains("broker.xml"));
        assert!(removed[0].1.note.contains("will act again"));
        assert_eq!(removed[0].1.declared_by.as_deref(), Some("ns/into"));
        let kept_names: Vec<&str> = kept.iter().map(|k| k.name.as_str()).collect();
        assert!(kept_names.contains(&"out"));
        assert!(kept.iter().any(|k| k.note.contains("capture subscription")));

        // With a second queue on the address, the divert still has a consumer: not dependent.
        let queues = vec![
            queue("target", "target", "ANYCAST"),
            queue("other", "target", "ANYCAST"),
        ];
        let (removed, _) = divert_impact("target", "target", &inv(queues, diverts), &BTreeMap::new());
        assert!(removed.is_empty());
    }

    #[test]
    fn consumers_refuse_unless_disconnect_is_set() {
        let mut q = queue("orders", "orders", "ANYCAST");
        q.consumer_count = 2;
        q.message_count = 5;
        let d = DesiredQueue::new("orders", &spec(json!({"clusterRef": {"name": "c"}})));
        let (p, _) = delete_preview(&d, "n1", &inv(vec![q.clone()], vec![]), &BTreeMap::new());
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
        let (p, _) = delete_preview(&d, "n1", &inv(vec![q], vec![]), &BTreeMap::new());
        assert_eq!(p.refusal, None);
        assert_eq!(p.message_count, 5);
    }

    #[test]
    fn the_bulk_cap_counts_messages_and_takes_the_override() {
        assert_eq!(bulk_cap_verdict(10_001, 10_000, None), (10_000, true));
        assert_eq!(bulk_cap_verdict(10_000, 10_000, None), (10_000, false));
        assert_eq!(bulk_cap_verdict(50_000, 10_000, Some(50_000)), (50_000, false));
        assert_eq!(bulk_cap_verdict(3, 0, Some(2)), (2, true));
    }
}
