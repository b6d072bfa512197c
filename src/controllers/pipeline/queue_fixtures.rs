//! The queue the execute stage's tests on a fake broker node (`fanout::fake`) work on, and the
//! node inventories they start from.

use serde_json::{Value, json};

use crate::controllers::queue::plan::{DesiredQueue, create_document};
use crate::topology::answers::created_queue;
use crate::topology::inventory::{AddressInfo, NodeInventory, QueueInfo};

pub(super) fn desired(spec: serde_json::Value) -> DesiredQueue {
    let mut spec = spec;
    spec["clusterRef"] = json!({"name": "c"});
    let spec = serde_json::from_value(spec).unwrap_or_else(|e| panic!("spec: {e}"));
    DesiredQueue::checked("orders", &spec).unwrap_or_else(|e| panic!("desired: {e}"))
}

pub(super) fn node_with_address() -> NodeInventory {
    let mut inv = NodeInventory::default();
    inv.addresses.insert(
        "orders".into(),
        AddressInfo {
            name: "orders".into(),
            routing_types: vec!["ANYCAST".into()],
            queue_names: vec![],
        },
    );
    inv
}

pub(super) fn existing(d: &DesiredQueue) -> NodeInventory {
    let mut inv = node_with_address();
    let answer = Value::String(create_document(d).to_string());
    let q: QueueInfo = created_queue(&answer).unwrap_or_default();
    inv.addresses
        .entry("orders".into())
        .or_default()
        .queue_names
        .push(q.name.clone());
    inv.queues.insert(q.name.clone(), q);
    inv
}
