//! Every broker counter a capture pass judges loss from, read once per node per pass in one
//! bulk request whose size does not follow the number of taps (issue 42: capture pays per node,
//! not per tap). In this order, so that a message routed while the request runs is counted as
//! arrived rather than as lost (`reconcile`):
//! 1. the taps' source addresses (`RoutedMessageCount`, `BindingNames`): by name while they are
//!    few, else every address MBean of the node in one wildcard read;
//! 2. this instance's capture rings (one wildcard read of the queues named with its prefix):
//!    `MessagesAdded`, `MessagesAcknowledged`, `MessagesKilled`, `MessagesExpired`,
//!    `MessageCount`;
//! 3. their capture addresses (one wildcard read): `RoutedMessageCount`, `BindingNames`.
//!
//! What the reads mean is judged elsewhere: the ring's own loss in `loss`, the two sides of a
//! tap in `reconcile`, a failover window in `window`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::loss::CounterRead;
use super::reconcile::Sides;
use crate::api::capture_names::TapName;
use crate::broker::jolokia::JolokiaRequest;
use crate::broker::{BrokerError, BrokerManagement, mbean};
use crate::topology::inventory::{NodeInventory, matches};

/// Up to this many source addresses are read by name; more, and the node's address MBeans are
/// read in one wildcard read (one operation, whose answer follows the node's addresses).
pub const SOURCES_BY_NAME: usize = 32;

const ADDRESS: [&str; 3] = ["Address", "RoutedMessageCount", "BindingNames"];
const RING: [&str; 6] = [
    "Name",
    "MessagesAdded",
    "MessagesAcknowledged",
    "MessagesKilled",
    "MessagesExpired",
    "MessageCount",
];

/// An address's routed count and bindings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressRead {
    pub routed: i64,
    pub bindings: Vec<String>,
}

/// A capture ring's counters: added, acknowledged, killed, expired, held.
type RingRead = [i64; 5];

/// One node's read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeCounters {
    sources: BTreeMap<String, AddressRead>,
    rings: BTreeMap<String, RingRead>,
    capture_addresses: BTreeMap<String, AddressRead>,
}

impl NodeCounters {
    /// The source address's routed count (None: the address is not there).
    pub fn source_routed(&self, address: &str) -> Option<i64> {
        self.sources.get(address).map(|a| a.routed)
    }

    /// The tap's ring counters for `loss` (None: the ring is not there). In a cluster whose
    /// connection covers the capture prefix, the other nodes' rings (each with its drain as a
    /// consumer) are remote bindings of this capture address and copies are load-balanced to
    /// them — routed here, added there — so the address's routed count stands for what was
    /// added (no drop is claimed) unless the ring is its only binding.
    pub fn ring(&self, tap: &TapName) -> Option<CounterRead> {
        let q = tap.capture_queue();
        let [added, acked, killed, expired, count] = *self.rings.get(&q)?;
        let routed = match self.capture_addresses.get(&q) {
            Some(a) if a.bindings.len() <= 1 => a.routed,
            _ => added,
        };
        Some(CounterRead {
            messages_added: added,
            messages_acknowledged: acked,
            messages_killed: killed,
            messages_expired: expired,
            message_count: count,
            address_routed: routed,
        })
    }

    /// Both sides of the tap for `reconcile` (None: its source or its ring is not there).
    pub fn sides(&self, tap: &TapName, inv: &NodeInventory) -> Option<Sides> {
        let source = self.sources.get(&tap.address)?;
        let q = tap.capture_queue();
        let added = self.rings.get(&q)?[0];
        let only_ours = self
            .capture_addresses
            .get(&q)
            .filter(|a| a.bindings == [q.clone()]);
        Some(Sides {
            source_routed: source.routed,
            arrived: only_ours.map_or(added, |a| a.routed.max(added)),
            source_clustered: super::reconcile::clustered(&tap.address, &source.bindings, inv),
            unclaimed: 0,
        })
    }
}

/// Read one node's counters for the taps of `instance` whose sources are `sources`.
pub async fn read(
    m: &BrokerManagement,
    instance: &str,
    sources: &BTreeSet<&str>,
) -> Result<NodeCounters, BrokerError> {
    let b = m.broker_name();
    let by_name = sources.len() <= SOURCES_BY_NAME;
    let mut requests: Vec<JolokiaRequest> = if by_name {
        sources
            .iter()
            .map(|a| JolokiaRequest::read_many(mbean::address(b, a), &ADDRESS))
            .collect()
    } else {
        vec![JolokiaRequest::read_many(mbean::all_addresses(b), &ADDRESS)]
    };
    let prefix = TapName::instance_prefix(instance);
    requests.push(JolokiaRequest::read_many(
        mbean::own_address_queues_starting_with(b, &prefix),
        &RING,
    ));
    requests.push(JolokiaRequest::read_many(
        mbean::addresses_starting_with(b, &prefix),
        &ADDRESS,
    ));
    let answers = m.client().bulk(&requests).await?;
    let sources_read = if by_name {
        SourcesRead::ByName(sources.len())
    } else {
        SourcesRead::Wildcard
    };
    parse(answers, sources_read)
}

/// How the sources were read: one answer per address, or one wildcard answer.
#[derive(Clone, Copy, Debug)]
enum SourcesRead {
    ByName(usize),
    Wildcard,
}

/// The answers of [`read`]: the sources', then the rings', then the capture addresses'. A
/// source that is not there (or unreadable) is absent; a wildcard read that matched nothing is
/// empty; one refused otherwise fails the node's read.
fn parse(
    answers: Vec<Result<Value, BrokerError>>,
    sources: SourcesRead,
) -> Result<NodeCounters, BrokerError> {
    let source_answers = match sources {
        SourcesRead::ByName(n) => n,
        SourcesRead::Wildcard => 1,
    };
    if answers.len() != source_answers + 2 {
        return Err(BrokerError::BadResponse("short bulk response".into()));
    }
    let mut it = answers.into_iter();
    let mut out = NodeCounters::default();
    for answer in it.by_ref().take(source_answers) {
        let found = match (sources, answer) {
            (SourcesRead::Wildcard, answer) => matches(answer)?,
            (SourcesRead::ByName(_), Ok(v)) => vec![v],
            (SourcesRead::ByName(_), Err(_)) => continue,
        };
        out.sources.extend(found.iter().filter_map(address_read));
    }
    let rings = matches(it.next().unwrap_or(Ok(Value::Null)))?;
    out.rings = rings.iter().filter_map(ring_read).collect();
    let captures = matches(it.next().unwrap_or(Ok(Value::Null)))?;
    out.capture_addresses = captures.iter().filter_map(address_read).collect();
    Ok(out)
}

fn address_read(v: &Value) -> Option<(String, AddressRead)> {
    let name = v.get("Address")?.as_str()?.to_string();
    let routed = v.get("RoutedMessageCount")?.as_i64()?;
    let bindings = v
        .get("BindingNames")?
        .as_array()?
        .iter()
        .map(|b| b.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()?;
    Some((name, AddressRead { routed, bindings }))
}

fn ring_read(v: &Value) -> Option<(String, RingRead)> {
    let name = v.get(RING[0])?.as_str()?.to_string();
    let n = |k: &str| v.get(k).and_then(Value::as_i64);
    let read = [n(RING[1])?, n(RING[2])?, n(RING[3])?, n(RING[4])?, n(RING[5])?];
    Some((name, read))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::topology::inventory::AddressInfo;

    fn tap() -> TapName {
        TapName::new("i1", "ns", "orders", "audit")
    }

    /// The answers Artemis 2.40's Jolokia gives a node with one tap (shapes read on the bed).
    fn answers(ring_bindings: Vec<&str>, source_bindings: Vec<&str>) -> Vec<Result<Value, BrokerError>> {
        let q = tap().capture_queue();
        vec![
            Ok(json!({"Address": "orders", "RoutedMessageCount": 120, "BindingNames": source_bindings})),
            Ok(
                json!({format!("…queue=\"{q}\""): {"Name": q, "MessagesAdded": 100, "MessagesAcknowledged": 70,
                "MessagesKilled": 0, "MessagesExpired": 0, "MessageCount": 10}}),
            ),
            Ok(
                json!({format!("…address=\"{q}\""): {"Address": q, "RoutedMessageCount": 104, "BindingNames": ring_bindings}}),
            ),
        ]
    }

    fn inventory() -> NodeInventory {
        let mut inv = NodeInventory::default();
        let orders = AddressInfo {
            name: "orders".into(),
            queue_names: vec!["orders".into()],
            ..Default::default()
        };
        inv.addresses.insert("orders".into(), orders);
        inv
    }

    #[test]
    fn a_ring_alone_on_its_address_counts_what_the_full_address_dropped() {
        let q = tap().capture_queue();
        let c = parse(answers(vec![&q], vec!["orders"]), SourcesRead::ByName(1)).expect("read");
        let r = c.ring(&tap()).expect("the ring is there");
        assert_eq!((r.messages_added, r.address_routed), (100, 104));
        assert_eq!(r.counters().address_dropped, 4);
        let s = c.sides(&tap(), &inventory()).expect("both sides");
        assert_eq!(
            (s.source_routed, s.arrived, s.source_clustered),
            (120, 104, false)
        );
    }

    #[test]
    fn a_ring_with_remote_bindings_claims_no_drop() {
        // The other nodes' rings are remote bindings of this capture address: copies routed
        // here were added there.
        let q = tap().capture_queue();
        let remote = format!("{q}-c2");
        let c = parse(answers(vec![&q, &remote], vec!["orders"]), SourcesRead::ByName(1)).expect("read");
        let r = c.ring(&tap()).expect("the ring is there");
        assert_eq!(r.address_routed, r.messages_added);
        assert_eq!(c.sides(&tap(), &inventory()).expect("both sides").arrived, 100);
    }

    #[test]
    fn a_source_with_a_binding_neither_local_queue_nor_divert_is_clustered() {
        let q = tap().capture_queue();
        let c = parse(
            answers(vec![&q], vec!["orders", "orders-c2"]),
            SourcesRead::ByName(1),
        )
        .expect("read");
        assert!(
            c.sides(&tap(), &inventory())
                .expect("both sides")
                .source_clustered
        );
    }

    #[test]
    fn what_is_not_there_is_absent_and_a_refused_wildcard_read_fails_the_node() {
        let gone = || Err(BrokerError::BadResponse("x".into()));
        let mut a = answers(vec![], vec!["orders"]);
        a[0] = gone();
        let c = parse(a, SourcesRead::ByName(1)).expect("read");
        assert_eq!(c.source_routed("orders"), None);
        assert!(
            c.sides(&tap(), &inventory()).is_none(),
            "no side without its source"
        );
        assert!(c.ring(&tap()).is_some());
        let mut a = answers(vec![], vec!["orders"]);
        a[1] = gone();
        assert!(parse(a, SourcesRead::ByName(1)).is_err());
        assert!(
            parse(vec![], SourcesRead::Wildcard).is_err(),
            "a short answer is never an empty node"
        );
    }

    #[test]
    fn every_source_comes_from_one_wildcard_read_when_they_are_many() {
        let q = tap().capture_queue();
        let mut a = answers(vec![&q], vec![]);
        a[0] = Ok(json!({
            "…address=\"orders\"": {"Address": "orders", "RoutedMessageCount": 120, "BindingNames": ["orders"]},
            "…address=\"other\"": {"Address": "other", "RoutedMessageCount": 7, "BindingNames": []},
        }));
        let c = parse(a, SourcesRead::Wildcard).expect("read");
        assert_eq!(
            (c.source_routed("orders"), c.source_routed("other")),
            (Some(120), Some(7))
        );
    }
}
