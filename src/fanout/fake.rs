//! An in-memory broker node for unit tests of the execute stage: it keeps a [`NodeInventory`],
//! answers each operation as Artemis 2.40 does (refusals carry the broker's AMQ codes and go
//! through the same [`classify`]), and records every operation it was asked, so a test counts
//! calls the way the integration tests count Jolokia operations. Never used outside tests.

use std::sync::Mutex;

use serde_json::Value;

use super::ops::{BrokerOps, Op, QueueRef};
use crate::broker::BrokerError;
use crate::broker::error::classify;
use crate::topology::inventory::{
    AddressInfo, DivertInfo, DivertsRead, NodeInventory, QueueInfo, ScopedRead,
};

#[derive(Debug, Default)]
pub struct FakeBroker {
    pub state: Mutex<NodeInventory>,
    /// Every operation asked, in order (`createQueue orders`, `read`, …).
    pub calls: Mutex<Vec<String>>,
    /// `updateQueue` fields the broker accepts and ignores (as 2.40 does for some).
    pub ignored_on_update: Vec<&'static str>,
    /// Reports `PersistedPause` (Artemis 2.41+); false: answers as 2.40, which has no such
    /// attribute.
    pub reports_persisted_pause: bool,
}

/// The broker's refusal with its AMQ code, as Jolokia reports it.
fn refusal(code: &str, text: &str) -> BrokerError {
    classify(
        500,
        Some("javax.management.MBeanException"),
        Some(&format!("java.lang.IllegalStateException : {code}: {text}")),
    )
}

impl FakeBroker {
    pub fn with(state: NodeInventory) -> Self {
        FakeBroker {
            state: Mutex::new(state),
            ..Default::default()
        }
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The calls whose operation is `op` (e.g. `"createQueue"`).
    pub fn count(&self, op: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.split(' ').next() == Some(op))
            .count()
    }

    fn record(&self, call: String) {
        if let Ok(mut c) = self.calls.lock() {
            c.push(call);
        }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut NodeInventory) -> T) -> T {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s)
    }

    fn do_create_queue(&self, configuration: &Value) -> Result<Value, BrokerError> {
        let answer = Value::String(configuration.to_string());
        let q = crate::topology::answers::created_queue(&answer)
            .ok_or_else(|| BrokerError::BadResponse("not a queue configuration".into()))?;
        let auto_address = configuration
            .get("auto-create-address")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        self.with_state(|s| {
            if s.queues.contains_key(&q.name) {
                return Err(refusal("AMQ229019", &format!("Queue {} already exists", q.name)));
            }
            let address = match s.addresses.get_mut(&q.address) {
                Some(a) => a,
                None if auto_address => s.addresses.entry(q.address.clone()).or_insert(AddressInfo {
                    name: q.address.clone(),
                    routing_types: vec![q.routing_type.clone()],
                    queue_names: vec![],
                }),
                None => {
                    return Err(refusal(
                        "AMQ229203",
                        &format!("Address Does Not Exist: {}", q.address),
                    ));
                }
            };
            if !address.routing_types.contains(&q.routing_type) {
                return Err(refusal("AMQ229207", "Routing type not supported"));
            }
            address.queue_names.push(q.name.clone());
            s.queues.insert(q.name.clone(), q);
            Ok(answer)
        })
    }

    fn do_create_address(&self, address: &str, routing_types: &str) -> Result<(), BrokerError> {
        self.with_state(|s| {
            if s.addresses.contains_key(address) {
                return Err(refusal(
                    "AMQ229204",
                    &format!("Address already exists: {address}"),
                ));
            }
            let types = routing_types.split(',').map(str::to_string).collect();
            s.addresses.insert(
                address.to_string(),
                AddressInfo {
                    name: address.to_string(),
                    routing_types: types,
                    queue_names: vec![],
                },
            );
            Ok(())
        })
    }

    /// Answers as Artemis 2.40 does: the configuration after the update, where the fields it
    /// ignored keep their values and the filter-string is the one the queue was created with
    /// (`QueueImpl.setFilter` leaves the configuration's alone).
    fn do_update_queue(&self, configuration: &Value) -> Result<Value, BrokerError> {
        let mut next = crate::topology::answers::created_queue(&Value::String(configuration.to_string()))
            .ok_or_else(|| BrokerError::BadResponse("not a queue configuration".into()))?;
        self.with_state(|s| {
            let Some(current) = s.queues.get(&next.name).cloned() else {
                return Err(refusal(
                    "AMQ229017",
                    &format!("Queue {} does not exist", next.name),
                ));
            };
            let mut answer = configuration.clone();
            // Accepted, and ignored: the value stays what it was.
            for field in &self.ignored_on_update {
                match *field {
                    "filter-string" => next.filter = current.filter.clone(),
                    "exclusive" => next.exclusive = current.exclusive,
                    "ring-size" => next.ring_size = current.ring_size,
                    _ => {}
                }
            }
            answer["exclusive"] = Value::from(next.exclusive);
            answer["ring-size"] = Value::from(next.ring_size);
            answer["filter-string"] = Value::from(current.filter.clone().unwrap_or_default());
            next.message_count = current.message_count;
            next.consumer_count = current.consumer_count;
            s.queues.insert(next.name.clone(), next);
            Ok(Value::String(answer.to_string()))
        })
    }

    fn do_destroy_queue(&self, name: &str, remove_consumers: bool) -> Result<(), BrokerError> {
        self.with_state(|s| {
            let Some(q) = s.queues.get(name) else {
                return Err(refusal("AMQ229017", &format!("Queue {name} does not exist")));
            };
            if q.consumer_count > 0 && !remove_consumers {
                return Err(refusal(
                    "AMQ229025",
                    &format!("Cannot delete queue {name} on binding - it has consumers"),
                ));
            }
            let address = q.address.clone();
            s.queues.remove(name);
            if let Some(a) = s.addresses.get_mut(&address) {
                a.queue_names.retain(|n| n != name);
            }
            Ok(())
        })
    }

    fn do_divert(&self, configuration: &Value, update: bool) -> Result<(), BrokerError> {
        let text = |k: &str| configuration.get(k).and_then(Value::as_str).map(str::to_string);
        let name = text("divert-name").or_else(|| text("name")).unwrap_or_default();
        let divert = DivertInfo {
            name: name.clone(),
            address: text("address").unwrap_or_default(),
            forwarding_address: text("forwarding-address").unwrap_or_default(),
            exclusive: configuration
                .get("exclusive")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            filter: text("filter-string").filter(|f| !f.is_empty()),
            routing_type: text("routing-type").unwrap_or_else(|| "STRIP".into()),
            routing_name: text("routing-name"),
        };
        self.with_state(|s| {
            match (update, s.diverts.contains_key(&name)) {
                (true, false) => return Err(refusal("AMQ229012", &format!("Divert {name} does not exist"))),
                // 2.40 ignores a duplicate create silently, and a divert on a missing address.
                (false, true) => return Ok(()),
                _ => {}
            }
            if s.addresses.contains_key(&divert.address) {
                s.diverts.insert(name, divert);
            }
            Ok(())
        })
    }

    fn read(&self, scope: &ScopedRead<'_>) -> NodeInventory {
        self.with_state(|s| NodeInventory {
            queues: s
                .queues
                .iter()
                .filter(|(n, _)| scope.queues.iter().any(|q| q.name == n.as_str()))
                // The strict read does not ask PersistedPause (a 2.40 broker would refuse it).
                .map(|(n, q)| {
                    let q = QueueInfo {
                        pause_persisted: None,
                        ..q.clone()
                    };
                    (n.clone(), q)
                })
                .collect(),
            addresses: s
                .addresses
                .iter()
                .filter(|(n, _)| scope.addresses.contains(&n.as_str()))
                .map(|(n, a)| (n.clone(), a.clone()))
                .collect(),
            diverts: match scope.diverts {
                DivertsRead::None => Default::default(),
                DivertsRead::Named { name, .. } => s
                    .diverts
                    .iter()
                    .filter(|(n, _)| n.as_str() == name)
                    .map(|(n, d)| (n.clone(), d.clone()))
                    .collect(),
                DivertsRead::All | DivertsRead::Listed { .. } | DivertsRead::Watched { .. } => {
                    s.diverts.clone()
                }
            },
            unreadable_queues: Default::default(),
            scope: Some(scope.covers()),
            read_at: None,
            divert_watch: Default::default(),
        })
    }
}

fn ready<'a, T: Send + 'a>(v: T) -> futures::future::BoxFuture<'a, T> {
    Box::pin(std::future::ready(v))
}

impl BrokerOps for FakeBroker {
    fn read_scoped<'a>(&'a self, scope: ScopedRead<'a>) -> Op<'a, NodeInventory> {
        self.record("read".into());
        ready(Ok(self.read(&scope)))
    }
    fn create_queue<'a>(&'a self, configuration: &'a Value) -> Op<'a, Value> {
        self.record(format!("createQueue {}", configuration["name"]));
        ready(self.do_create_queue(configuration))
    }
    fn create_address_and_queue<'a>(
        &'a self,
        address: &'a str,
        routing_types: &'a str,
        configuration: &'a Value,
    ) -> futures::future::BoxFuture<'a, (Result<(), BrokerError>, Result<Value, BrokerError>)> {
        self.record(format!("createAddress {address}"));
        let a = self.do_create_address(address, routing_types);
        self.record(format!("createQueue {}", configuration["name"]));
        ready((a, self.do_create_queue(configuration)))
    }
    fn update_queue<'a>(&'a self, configuration: &'a Value) -> Op<'a, Value> {
        self.record(format!("updateQueue {}", configuration["name"]));
        ready(self.do_update_queue(configuration))
    }
    fn set_paused<'a>(&'a self, q: QueueRef<'a>, paused: bool) -> Op<'a, ()> {
        self.record(format!("{} {}", if paused { "pause" } else { "resume" }, q.name));
        let r = self.with_state(|s| match s.queues.get(q.name).cloned() {
            Some(mut found) => {
                found.paused = paused;
                // pause(true) persists a durable queue's pause only (QueueImpl.pause).
                found.pause_persisted = (paused && self.reports_persisted_pause).then_some(found.durable);
                s.queues.insert(q.name.to_string(), found);
                Ok(())
            }
            None => Err(refusal("AMQ229017", &format!("Queue {} does not exist", q.name))),
        });
        ready(r)
    }
    fn pause_persisted<'a>(&'a self, q: QueueRef<'a>) -> Op<'a, Option<bool>> {
        self.record(format!("read PersistedPause {}", q.name));
        let persisted = self.with_state(|s| {
            s.queues
                .get(q.name)
                .filter(|_| self.reports_persisted_pause)
                .map(|found| found.paused && found.pause_persisted == Some(true))
        });
        ready(Ok(persisted))
    }
    fn destroy_queue<'a>(&'a self, name: &'a str, remove_consumers: bool) -> Op<'a, ()> {
        self.record(format!("destroyQueue {name}"));
        ready(self.do_destroy_queue(name, remove_consumers))
    }
    fn delete_address<'a>(&'a self, name: &'a str) -> Op<'a, ()> {
        self.record(format!("deleteAddress {name}"));
        let r = self.with_state(|s| match s.addresses.get(name) {
            None => Err(refusal("AMQ229203", &format!("Address Does Not Exist: {name}"))),
            Some(a) if !a.queue_names.is_empty() => Err(refusal("AMQ229205", "Address has bindings")),
            Some(_) => {
                s.addresses.remove(name);
                Ok(())
            }
        });
        ready(r)
    }
    fn create_divert<'a>(&'a self, configuration: &'a Value) -> Op<'a, ()> {
        self.record("createDivert".into());
        ready(self.do_divert(configuration, false))
    }
    fn update_divert<'a>(&'a self, configuration: &'a Value) -> Op<'a, ()> {
        self.record("updateDivert".into());
        ready(self.do_divert(configuration, true))
    }
    fn destroy_divert<'a>(&'a self, name: &'a str) -> Op<'a, ()> {
        self.record(format!("destroyDivert {name}"));
        let r = self.with_state(|s| match s.diverts.remove(name) {
            Some(_) => Ok(()),
            None => Err(refusal("AMQ229012", &format!("Divert {name} does not exist"))),
        });
        ready(r)
    }
    fn close_connection<'a>(&'a self, connection_id: &'a str) -> Op<'a, bool> {
        self.record(format!("closeConnectionWithID {connection_id}"));
        ready(Ok(false))
    }
    fn close_session<'a>(&'a self, _connection_id: &'a str, session_id: &'a str) -> Op<'a, bool> {
        self.record(format!("closeSessionWithID {session_id}"));
        ready(Ok(false))
    }
    fn close_consumer<'a>(&'a self, session_id: &'a str, _consumer_id: i64) -> Op<'a, bool> {
        self.record(format!("closeConsumerWithID {session_id}"));
        ready(Ok(false))
    }
    fn close_consumer_connections_for_address<'a>(&'a self, address: &'a str) -> Op<'a, bool> {
        self.record(format!("closeConsumerConnectionsForAddress {address}"));
        ready(Ok(false))
    }
    fn send_message<'a>(
        &'a self,
        address: &'a str,
        _properties: &'a std::collections::BTreeMap<String, String>,
        _body: &'a crate::broker::messages::SentBody,
    ) -> Op<'a, String> {
        self.record(format!("sendMessage {address}"));
        ready(Ok("1".into()))
    }
}

/// A target whose operations go to `fake` (its `management` points nowhere: capture's direct
/// calls are not on the seam, and a test of the pipeline never makes them).
pub fn target(node_id: &str, fake: std::sync::Arc<FakeBroker>) -> super::Target {
    let http = crate::broker::jolokia::http_client(&crate::broker::Registry::standalone(), None)
        .unwrap_or_else(|e| panic!("http client: {e}"));
    let client = crate::broker::JolokiaClient::new(
        http,
        "http://127.0.0.1:9/console/jolokia",
        None,
        crate::broker::Credentials {
            username: "fake".into(),
            password: "fake".into(),
        },
        std::time::Duration::from_secs(1),
    );
    super::Target {
        node_id: node_id.into(),
        ops: fake,
        management: crate::broker::BrokerManagement::with_name(client, "fake".into()),
    }
}
