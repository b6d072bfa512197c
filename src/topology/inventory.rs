//! Per-node inventory, scraped in the topology poll with one bulk request per node (three
//! wildcard reads): queues with their configuration and counts, addresses with their bindings,
//! diverts with their attributes. Controllers compare desired state against it instead of
//! reading per object; fresh reads stay where an ADR says "re-read" or "preflight".

use std::collections::BTreeMap;

use serde_json::Value;

use crate::broker::{BrokerError, BrokerManagement, JolokiaRequest, mbean};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueInfo {
    pub name: String,
    pub address: String,
    /// ANYCAST or MULTICAST.
    pub routing_type: String,
    pub filter: Option<String>,
    pub durable: bool,
    pub max_consumers: i64,
    pub exclusive: bool,
    pub last_value: bool,
    pub last_value_key: Option<String>,
    pub non_destructive: bool,
    pub purge_on_no_consumers: bool,
    pub enabled: bool,
    pub consumers_before_dispatch: i64,
    pub delay_before_dispatch: i64,
    pub consumer_priority: i64,
    pub ring_size: i64,
    pub group_rebalance: bool,
    pub group_buckets: i64,
    pub group_first_key: Option<String>,
    pub auto_delete: bool,
    pub auto_delete_delay: i64,
    pub auto_delete_message_count: i64,
    pub temporary: bool,
    pub message_count: u64,
    pub consumer_count: u64,
    pub delivering_count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DivertInfo {
    pub name: String,
    pub address: String,
    pub forwarding_address: String,
    pub exclusive: bool,
    pub filter: Option<String>,
    /// STRIP, PASS, ANYCAST or MULTICAST.
    pub routing_type: String,
    pub routing_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressInfo {
    pub name: String,
    pub routing_types: Vec<String>,
    pub queue_names: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInventory {
    pub queues: BTreeMap<String, QueueInfo>,
    pub addresses: BTreeMap<String, AddressInfo>,
    pub diverts: BTreeMap<String, DivertInfo>,
}

impl NodeInventory {
    /// Queues bound to an address on this node.
    pub fn queues_on(&self, address: &str) -> impl Iterator<Item = &QueueInfo> {
        self.queues.values().filter(move |q| q.address == address)
    }
}

const QUEUE_ATTRIBUTES: &[&str] = &[
    "Name",
    "Address",
    "RoutingType",
    "Filter",
    "Durable",
    "MaxConsumers",
    "Exclusive",
    "LastValue",
    "LastValueKey",
    "NonDestructive",
    "PurgeOnNoConsumers",
    "Enabled",
    "ConsumersBeforeDispatch",
    "DelayBeforeDispatch",
    "ConsumerPriority",
    "RingSize",
    "GroupRebalance",
    "GroupBuckets",
    "GroupFirstKey",
    "AutoDelete",
    "AutoDeleteDelay",
    "AutoDeleteMessageCount",
    "Temporary",
    "MessageCount",
    "ConsumerCount",
    "DeliveringCount",
];
const DIVERT_ATTRIBUTES: &[&str] = &[
    "UniqueName",
    "Address",
    "ForwardingAddress",
    "Exclusive",
    "Filter",
    "RoutingType",
    "RoutingName",
];
const ADDRESS_ATTRIBUTES: &[&str] = &["Address", "RoutingTypes", "QueueNames"];

fn s(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or_default().to_string()
}
fn opt_s(v: &Value, k: &str) -> Option<String> {
    v.get(k)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}
fn b(v: &Value, k: &str) -> bool {
    v.get(k).and_then(Value::as_bool).unwrap_or(false)
}
fn i(v: &Value, k: &str) -> i64 {
    v.get(k).and_then(Value::as_i64).unwrap_or(0)
}
fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}
fn strings(v: &Value, k: &str) -> Vec<String> {
    v.get(k)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// A wildcard read answers `{objectName: {attribute: value}}`; no match answers an error 404.
fn matches(result: Result<Value, BrokerError>) -> Result<Vec<Value>, BrokerError> {
    match result {
        Ok(Value::Object(m)) => Ok(m.into_iter().map(|(_, v)| v).collect()),
        Ok(_) => Ok(vec![]),
        Err(BrokerError::BadResponse(m)) if m.starts_with("status 404") => Ok(vec![]),
        Err(e) => Err(e),
    }
}

pub fn parse_queue(v: &Value) -> QueueInfo {
    QueueInfo {
        name: s(v, "Name"),
        address: s(v, "Address"),
        routing_type: s(v, "RoutingType"),
        filter: opt_s(v, "Filter"),
        durable: b(v, "Durable"),
        max_consumers: i(v, "MaxConsumers"),
        exclusive: b(v, "Exclusive"),
        last_value: b(v, "LastValue"),
        last_value_key: opt_s(v, "LastValueKey"),
        non_destructive: b(v, "NonDestructive"),
        purge_on_no_consumers: b(v, "PurgeOnNoConsumers"),
        enabled: b(v, "Enabled"),
        consumers_before_dispatch: i(v, "ConsumersBeforeDispatch"),
        delay_before_dispatch: i(v, "DelayBeforeDispatch"),
        consumer_priority: i(v, "ConsumerPriority"),
        ring_size: i(v, "RingSize"),
        group_rebalance: b(v, "GroupRebalance"),
        group_buckets: i(v, "GroupBuckets"),
        group_first_key: opt_s(v, "GroupFirstKey"),
        auto_delete: b(v, "AutoDelete"),
        auto_delete_delay: i(v, "AutoDeleteDelay"),
        auto_delete_message_count: i(v, "AutoDeleteMessageCount"),
        temporary: b(v, "Temporary"),
        message_count: u(v, "MessageCount"),
        consumer_count: u(v, "ConsumerCount"),
        delivering_count: u(v, "DeliveringCount"),
    }
}

pub fn parse_divert(v: &Value) -> DivertInfo {
    DivertInfo {
        name: s(v, "UniqueName"),
        address: s(v, "Address"),
        forwarding_address: s(v, "ForwardingAddress"),
        exclusive: b(v, "Exclusive"),
        filter: opt_s(v, "Filter"),
        routing_type: s(v, "RoutingType"),
        routing_name: opt_s(v, "RoutingName"),
    }
}

/// Scrape one node: one bulk request with three wildcard reads.
pub async fn scrape(m: &BrokerManagement) -> Result<NodeInventory, BrokerError> {
    let name = m.broker_name();
    let mut r = m
        .client()
        .bulk(&[
            JolokiaRequest::read_many(mbean::all_queues(name), QUEUE_ATTRIBUTES),
            JolokiaRequest::read_many(mbean::all_addresses(name), ADDRESS_ATTRIBUTES),
            JolokiaRequest::read_many(mbean::all_diverts(name), DIVERT_ATTRIBUTES),
        ])
        .await?
        .into_iter();
    let mut next = || {
        r.next()
            .unwrap_or_else(|| Err(BrokerError::BadResponse("short bulk response".into())))
    };
    let mut inv = NodeInventory::default();
    for q in matches(next())? {
        let q = parse_queue(&q);
        inv.queues.insert(q.name.clone(), q);
    }
    for a in matches(next())? {
        let a = AddressInfo {
            name: s(&a, "Address"),
            routing_types: strings(&a, "RoutingTypes"),
            queue_names: strings(&a, "QueueNames"),
        };
        inv.addresses.insert(a.name.clone(), a);
    }
    for d in matches(next())? {
        let d = parse_divert(&d);
        inv.diverts.insert(d.name.clone(), d);
    }
    Ok(inv)
}
