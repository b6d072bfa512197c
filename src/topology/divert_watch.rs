//! The divert watch (issue 45): whether a divert has been added to a node since its diverts
//! were last read, in one read whose cost does not grow with the node's queues.
//!
//! ADR-0084 has a delete read afresh every divert that could forward into the queue's address.
//! Artemis 2.40 keeps no index from a forwarding address to its diverts: its `DivertNames` walks
//! every management object and a pattern read scans every MBean name, ~4 and ~14 ms of a broker
//! at 10,000 queues (measured on the bed). The watch is a non-durable ring queue of one message
//! on the broker's management notification address, filtered to the notification Artemis sends
//! for every divert binding it adds (`PostOfficeImpl.addBinding`: `BINDING_ADDED` with
//! `_AMQ_Binding_Type` 2, `BindingType.DIVERT`) and to its own creation, which proves the
//! notifications reach it. Its `MessagesAdded` counts them whatever the ring keeps.
//!
//! A node's inventory records the watch as read just before its diverts were read in full (the
//! [`Mark`]). A delete's preflight reads the watch beside each divert that inventory holds, by
//! name: the same mark means no divert was added since, so those reads are every divert there
//! is; anything else (the counter moved, the queue is gone or not ours) reads every divert by
//! the pattern, as before. A divert changed in place (`updateDivert`) sends no notification,
//! and is caught by its read by name. The watch is shared by every installation on the broker
//! (one name, created if missing, never destroyed by the operator); a broker restart drops it,
//! and the next poll re-creates it (controllers/divert_watch.rs).

use serde_json::{Value, json};

use crate::broker::jolokia::JolokiaRequest;
use crate::broker::{BrokerError, mbean};

/// The watch queue's name, the same for every installation.
pub const QUEUE: &str = "studio.divert-watch";

/// Artemis's default `management-notification-address`. A broker configured with another
/// never routes its notifications here: the watch then never proves itself (see [`judge`]) and
/// every delete reads the diverts by the pattern.
pub const NOTIFICATION_ADDRESS: &str = "activemq.notifications";

/// The notifications the watch counts: a divert binding added, and its own creation.
pub fn filter() -> String {
    format!("_AMQ_NotifType = 'BINDING_ADDED' AND (_AMQ_Binding_Type = 2 OR _AMQ_RoutingName = '{QUEUE}')")
}

/// The watch queue's configuration: non-durable, a ring of one (it holds at most one message).
pub fn queue_document() -> Value {
    json!({
        "name": QUEUE,
        "address": NOTIFICATION_ADDRESS,
        "routing-type": "MULTICAST",
        "durable": false,
        "filter-string": filter(),
        "ring-size": 1,
        "auto-create-address": false,
    })
}

/// The read of the watch: its identity, its counter and its filter.
pub fn request(broker_name: &str) -> JolokiaRequest {
    JolokiaRequest::read_strict(
        mbean::queue(broker_name, NOTIFICATION_ADDRESS, "MULTICAST", QUEUE),
        &["ID", "MessagesAdded", "Filter"],
    )
}

/// The watch as read: which incarnation of the queue, and how many notifications it counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub id: u64,
    pub added: u64,
}

/// What a node's watch says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Watch {
    /// Not read (an inventory from a scoped read).
    #[default]
    Unread,
    /// No watch queue on the node: the operator creates it.
    Missing,
    /// Present but not to be trusted, and why (not answerable, another filter, never counted
    /// its own creation, or moved since the inventory's diverts were read in full).
    Untrusted(String),
    /// Counting, as of this mark.
    Live(Mark),
}

impl Watch {
    /// The mark, when the watch can be trusted.
    pub fn mark(&self) -> Option<Mark> {
        match self {
            Watch::Live(m) => Some(*m),
            _ => None,
        }
    }
}

/// The watch from its read's answer.
pub fn judge(answer: Result<Value, BrokerError>) -> Watch {
    let v = match answer {
        Ok(v) => v,
        Err(e) if e.is_no_such_mbean() => return Watch::Missing,
        Err(e) => return Watch::Untrusted(format!("not read: {e}")),
    };
    let (Some(id), Some(added)) = (
        v.get("ID").and_then(Value::as_u64),
        v.get("MessagesAdded").and_then(Value::as_u64),
    ) else {
        return Watch::Untrusted("its ID or MessagesAdded is not a count".into());
    };
    if v.get("Filter").and_then(Value::as_str) != Some(filter().as_str()) {
        return Watch::Untrusted("its filter is not the watch's".into());
    }
    if added == 0 {
        return Watch::Untrusted("it never counted its own creation: notifications do not reach it".into());
    }
    Watch::Live(Mark { id, added })
}

/// A poll by change keeps its baseline's diverts: the watch read now is the baseline's mark
/// only if nothing was counted since. Any other answer leaves no mark until the next full read
/// (a divert destroyed and made again under the same name on another address shows in the
/// counter, not in the names).
pub fn kept(baseline: &Watch, now: Watch) -> Watch {
    match (baseline, now) {
        (Watch::Live(m), Watch::Live(n)) if *m == n => Watch::Live(n),
        (_, Watch::Live(_)) => Watch::Untrusted("counted since the node's last full read".into()),
        (_, other) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(id: u64, added: u64, filter: &str) -> Result<Value, BrokerError> {
        Ok(json!({"ID": id, "MessagesAdded": added, "Filter": filter}))
    }

    #[test]
    fn a_watch_is_trusted_only_with_its_own_filter_and_its_own_creation_counted() {
        let ours = filter();
        assert_eq!(judge(answer(7, 1, &ours)), Watch::Live(Mark { id: 7, added: 1 }));
        assert!(
            matches!(judge(answer(7, 0, &ours)), Watch::Untrusted(_)),
            "never proved itself"
        );
        assert!(
            matches!(judge(answer(7, 3, "a = 1")), Watch::Untrusted(_)),
            "not our filter"
        );
        let missing = Err(BrokerError::NoSuchMBean("gone".into()));
        assert_eq!(judge(missing), Watch::Missing);
        // A read that failed otherwise says nothing of whether it is there: not made again.
        let failed = Err(BrokerError::BadResponse("AttributeNotFoundException".into()));
        assert!(matches!(judge(failed), Watch::Untrusted(_)), "not Missing");
        let odd = Ok(json!({"ID": "x", "MessagesAdded": 1, "Filter": ours}));
        assert!(matches!(judge(odd), Watch::Untrusted(_)));
    }

    #[test]
    fn a_poll_by_change_keeps_a_mark_only_while_nothing_was_counted() {
        let m = Mark { id: 7, added: 2 };
        assert_eq!(kept(&Watch::Live(m), Watch::Live(m)), Watch::Live(m));
        let moved = Watch::Live(Mark { id: 7, added: 3 });
        assert!(matches!(kept(&Watch::Live(m), moved), Watch::Untrusted(_)));
        let other = Watch::Live(Mark { id: 8, added: 2 });
        assert!(
            matches!(kept(&Watch::Live(m), other), Watch::Untrusted(_)),
            "a new queue"
        );
        assert!(
            matches!(kept(&Watch::Missing, Watch::Live(m)), Watch::Untrusted(_)),
            "made since the full read: adopted at the next"
        );
        assert_eq!(kept(&Watch::Live(m), Watch::Missing), Watch::Missing);
    }

    #[test]
    fn the_watch_is_a_ring_of_one_that_never_outlives_its_broker() {
        let d = queue_document();
        assert_eq!(d["ring-size"], 1);
        assert_eq!(d["durable"], false);
        assert_eq!(d["filter-string"], filter());
        assert!(filter().contains(&format!("_AMQ_RoutingName = '{QUEUE}'")));
    }
}
