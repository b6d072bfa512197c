//! The seam between the pipeline's execute stage and a broker node: what a queue's, a divert's
//! or a close's per-node step asks of the broker. The real implementation is
//! [`BrokerManagement`] (Jolokia); unit tests use [`fake::FakeBroker`], an in-memory node that
//! answers as Artemis 2.40 does (the same AMQ codes, classified by the same code).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::broker::messages::SentBody;
use crate::broker::{BrokerError, BrokerManagement};
use crate::topology::inventory::{self, NodeInventory, ScopedRead};

/// A queue as its MBean names it: address, routing type (ANYCAST or MULTICAST), name.
#[derive(Clone, Copy, Debug)]
pub struct QueueRef<'a> {
    pub address: &'a str,
    pub routing_type: &'a str,
    pub name: &'a str,
}

/// A management operation's future.
pub type Op<'a, T> = BoxFuture<'a, Result<T, BrokerError>>;

/// One node's management operations used by the execute stage.
pub trait BrokerOps: Send + Sync + std::fmt::Debug {
    /// A fresh read of just these objects (ADR-0049's read before an update, ADR-0084's preflight).
    fn read_scoped<'a>(&'a self, scope: ScopedRead<'a>) -> Op<'a, NodeInventory>;
    /// `createQueue(json, false)`: the created configuration.
    fn create_queue<'a>(&'a self, configuration: &'a Value) -> Op<'a, Value>;
    /// `createAddress` then `createQueue` in one request: one result each.
    fn create_address_and_queue<'a>(
        &'a self,
        address: &'a str,
        routing_types: &'a str,
        configuration: &'a Value,
    ) -> BoxFuture<'a, (Result<(), BrokerError>, Result<Value, BrokerError>)>;
    fn update_queue<'a>(&'a self, configuration: &'a Value) -> Op<'a, Value>;
    /// Pause (persisted) or resume delivery of one queue (issue 49).
    fn set_paused<'a>(&'a self, queue: QueueRef<'a>, paused: bool) -> Op<'a, ()>;
    /// Whether the queue's pause is persisted (Artemis 2.41+; None: not reported, or no such
    /// queue at that MBean).
    fn pause_persisted<'a>(&'a self, queue: QueueRef<'a>) -> Op<'a, Option<bool>>;
    fn destroy_queue<'a>(&'a self, name: &'a str, remove_consumers: bool) -> Op<'a, ()>;
    fn delete_address<'a>(&'a self, name: &'a str) -> Op<'a, ()>;
    fn create_divert<'a>(&'a self, configuration: &'a Value) -> Op<'a, ()>;
    fn update_divert<'a>(&'a self, configuration: &'a Value) -> Op<'a, ()>;
    fn destroy_divert<'a>(&'a self, name: &'a str) -> Op<'a, ()>;
    fn close_connection<'a>(&'a self, connection_id: &'a str) -> Op<'a, bool>;
    fn close_session<'a>(&'a self, connection_id: &'a str, session_id: &'a str) -> Op<'a, bool>;
    fn close_consumer<'a>(&'a self, session_id: &'a str, consumer_id: i64) -> Op<'a, bool>;
    fn close_consumer_connections_for_address<'a>(&'a self, address: &'a str) -> Op<'a, bool>;
    /// `AddressControl.sendMessage`: one new durable message; the broker's ID of it.
    fn send_message<'a>(
        &'a self,
        address: &'a str,
        properties: &'a BTreeMap<String, String>,
        body: &'a SentBody,
    ) -> Op<'a, String>;
}

impl BrokerOps for BrokerManagement {
    fn read_scoped<'a>(&'a self, scope: ScopedRead<'a>) -> Op<'a, NodeInventory> {
        Box::pin(async move { inventory::read_scoped(self, &scope).await })
    }
    fn create_queue<'a>(&'a self, configuration: &'a Value) -> Op<'a, Value> {
        Box::pin(BrokerManagement::create_queue(self, configuration))
    }
    fn create_address_and_queue<'a>(
        &'a self,
        address: &'a str,
        routing_types: &'a str,
        configuration: &'a Value,
    ) -> BoxFuture<'a, (Result<(), BrokerError>, Result<Value, BrokerError>)> {
        Box::pin(BrokerManagement::create_address_and_queue(
            self,
            address,
            routing_types,
            configuration,
        ))
    }
    fn update_queue<'a>(&'a self, configuration: &'a Value) -> Op<'a, Value> {
        Box::pin(BrokerManagement::update_queue(self, configuration))
    }
    fn set_paused<'a>(&'a self, q: QueueRef<'a>, paused: bool) -> Op<'a, ()> {
        Box::pin(BrokerManagement::set_paused(
            self,
            q.address,
            q.routing_type,
            q.name,
            paused,
        ))
    }
    fn pause_persisted<'a>(&'a self, q: QueueRef<'a>) -> Op<'a, Option<bool>> {
        Box::pin(BrokerManagement::pause_persisted(
            self,
            q.address,
            q.routing_type,
            q.name,
        ))
    }
    fn destroy_queue<'a>(&'a self, name: &'a str, remove_consumers: bool) -> Op<'a, ()> {
        Box::pin(BrokerManagement::destroy_queue(self, name, remove_consumers))
    }
    fn delete_address<'a>(&'a self, name: &'a str) -> Op<'a, ()> {
        Box::pin(BrokerManagement::delete_address(self, name))
    }
    fn create_divert<'a>(&'a self, configuration: &'a Value) -> Op<'a, ()> {
        Box::pin(BrokerManagement::create_divert(self, configuration))
    }
    fn update_divert<'a>(&'a self, configuration: &'a Value) -> Op<'a, ()> {
        Box::pin(BrokerManagement::update_divert(self, configuration))
    }
    fn destroy_divert<'a>(&'a self, name: &'a str) -> Op<'a, ()> {
        Box::pin(BrokerManagement::destroy_divert(self, name))
    }
    fn close_connection<'a>(&'a self, connection_id: &'a str) -> Op<'a, bool> {
        Box::pin(BrokerManagement::close_connection(self, connection_id))
    }
    fn close_session<'a>(&'a self, connection_id: &'a str, session_id: &'a str) -> Op<'a, bool> {
        Box::pin(BrokerManagement::close_session(self, connection_id, session_id))
    }
    fn close_consumer<'a>(&'a self, session_id: &'a str, consumer_id: i64) -> Op<'a, bool> {
        Box::pin(BrokerManagement::close_consumer(self, session_id, consumer_id))
    }
    fn close_consumer_connections_for_address<'a>(&'a self, address: &'a str) -> Op<'a, bool> {
        Box::pin(BrokerManagement::close_consumer_connections_for_address(
            self, address,
        ))
    }
    fn send_message<'a>(
        &'a self,
        address: &'a str,
        properties: &'a BTreeMap<String, String>,
        body: &'a SentBody,
    ) -> Op<'a, String> {
        Box::pin(BrokerManagement::send_message(self, address, properties, body))
    }
}
