//! Loss estimated from independent counters (issue 25 item 3): per tap and node, what the
//! SOURCE address routed (its RoutedMessageCount: every message routed to any binding there, and
//! the unfiltered divert is one, so every message sent there) against what reached the capture
//! queue (its MessagesAdded, or the capture address's RoutedMessageCount when only our queue is
//! bound there: that also counts what a full address DROPped, reported as `address_full`). A
//! shortfall no other cause explains is loss: `tap_missing` when this pass found the divert gone
//! (removed behind the operator's back) and re-created it, else `unexplained`. Stored in
//! `capture_loss`, so a search over the window says LOSSY, never COMPLETE.
//!
//! What makes the comparison honest:
//! - one bulk request per node (`counters`), the source read BEFORE the capture side: a message routed
//!   between the two reads is counted as arrived but not as sent, so the shortfall is never
//!   overstated by the read itself (it is caught up by the next read);
//! - only between two reads of one capture-queue incarnation with the source counter not reset
//!   (a broker restart or failover is estimated by `broker_restart`/`failover_window`);
//! - `unexplained` only where the comparison means something: the tap has no filter (with one,
//!   the source counts messages the divert rightly skips) and no remote binding is on the source
//!   address (a message a cluster bridge brings in is counted by the source and, by design, not
//!   copied by this node's divert — it was copied where it was sent). `tap_missing` is an upper
//!   bound there, as `failover_window` is.
//!
//! The baseline is this process's memory: after an operator restart or a hand-over the first
//! read is a new baseline (the interval in between is not compared; its drains were gone, which
//! the coverage already shows as a gap).

use std::collections::BTreeSet;

use crate::topology::inventory::NodeInventory;

/// One read of both sides of a tap on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sides {
    /// The source address's RoutedMessageCount.
    pub source_routed: i64,
    /// Copies that reached the capture address: max(capture queue MessagesAdded, capture address
    /// RoutedMessageCount when our queue is its only binding).
    pub arrived: i64,
    /// The source address has a binding that is neither a local queue nor a local divert (a
    /// remote queue binding of a cluster connection).
    pub source_clustered: bool,
    /// The shortfall of the interval ending at this read that no cause was claimed for (a
    /// clustered source or a filter): the divert may have gone in it, and the next pass find
    /// it gone — then it counts to `tap_missing` too.
    pub unclaimed: u64,
}

/// A shortfall, by cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub cause: &'static str,
    pub messages: u64,
}

pub const TAP_MISSING: &str = "tap_missing";
pub const UNEXPLAINED: &str = "unexplained";

/// Compare two reads of one tap (and note in `now` what is left unclaimed). `divert_was_missing`:
/// this pass found the divert gone and re-created it (it went after the previous pass's
/// inventory, so perhaps before that pass's read: the previous interval's unclaimed shortfall
/// counts too); `filtered`: the tap's divert has a filter.
pub fn shortfall(
    previous: Option<&Sides>,
    now: &mut Sides,
    divert_was_missing: bool,
    filtered: bool,
) -> Option<Shortfall> {
    now.unclaimed = 0;
    let p = previous?;
    if now.source_routed < p.source_routed || now.arrived < p.arrived {
        // A counter reset: another cause estimates that interval.
        return None;
    }
    let gap = (now.source_routed - p.source_routed) - (now.arrived - p.arrived);
    let gap = u64::try_from(gap).unwrap_or(0);
    if divert_was_missing {
        let messages = gap + p.unclaimed;
        return (messages > 0).then_some(Shortfall {
            cause: TAP_MISSING,
            messages,
        });
    }
    if gap == 0 {
        return None;
    }
    if filtered || p.source_clustered || now.source_clustered {
        now.unclaimed = gap;
        return None;
    }
    Some(Shortfall {
        cause: UNEXPLAINED,
        messages: gap,
    })
}

/// Whether a source address has bindings other than its local queues and diverts.
pub(super) fn clustered(address: &str, bindings: &[String], inv: &NodeInventory) -> bool {
    let mut local: BTreeSet<&str> = inv
        .addresses
        .get(address)
        .map(|a| a.queue_names.iter().map(String::as_str).collect())
        .unwrap_or_default();
    local.extend(
        inv.diverts
            .values()
            .filter(|d| d.address == address)
            .map(|d| d.name.as_str()),
    );
    bindings.iter().any(|b| !local.contains(b.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::inventory::{AddressInfo, DivertInfo};

    /// Every subscription's loss counters exist at 0 for this module's causes too.
    #[test]
    fn its_causes_are_counted_from_the_first_pass() {
        for cause in [TAP_MISSING, UNEXPLAINED] {
            assert!(crate::telemetry::capture::LOSS_CAUSES.contains(&cause), "{cause}");
        }
    }

    fn sides(source: i64, arrived: i64) -> Sides {
        Sides {
            source_routed: source,
            arrived,
            source_clustered: false,
            unclaimed: 0,
        }
    }

    fn cmp(p: Option<&Sides>, now: Sides, missing: bool, filtered: bool) -> (Option<Shortfall>, Sides) {
        let mut now = now;
        let s = shortfall(p, &mut now, missing, filtered);
        (s, now)
    }

    #[test]
    fn a_shortfall_is_tap_missing_when_the_divert_was_gone_else_unexplained() {
        let (a, b) = (sides(100, 100), sides(160, 130));
        let missing = Shortfall {
            cause: TAP_MISSING,
            messages: 30,
        };
        assert_eq!(cmp(Some(&a), b, true, false).0, Some(missing));
        let unexplained = Shortfall {
            cause: UNEXPLAINED,
            messages: 30,
        };
        assert_eq!(cmp(Some(&a), b, false, false).0, Some(unexplained));
        // Nothing short, the first read, a reset: nothing.
        assert_eq!(cmp(Some(&a), sides(150, 150), false, false).0, None);
        assert_eq!(cmp(None, b, true, false).0, None);
        assert_eq!(cmp(Some(&b), sides(10, 5), true, false).0, None);
        // A message routed between the two reads counts as arrived, not sent: never a loss.
        assert_eq!(cmp(Some(&a), sides(150, 151), false, false).0, None);
    }

    #[test]
    fn unexplained_only_where_the_counters_can_agree() {
        let (a, b) = (sides(100, 100), sides(160, 130));
        // A filter: the source counts what the divert skips; left unclaimed.
        let (s, now) = cmp(Some(&a), b, false, true);
        assert_eq!((s, now.unclaimed), (None, 30));
        // A cluster bridge brings messages this node's divert does not copy.
        let clustered = Sides {
            source_clustered: true,
            ..b
        };
        let (s, now) = cmp(Some(&a), clustered, false, false);
        assert_eq!((s, now.unclaimed), (None, 30));
        // The next pass finds the divert gone: both intervals are tap_missing (an upper bound).
        let (s, after) = cmp(Some(&now), sides(200, 150), true, false);
        assert_eq!(
            s,
            Some(Shortfall {
                cause: TAP_MISSING,
                messages: 20 + 30
            })
        );
        assert_eq!(after.unclaimed, 0);
    }

    #[test]
    fn remote_bindings_are_those_neither_local_queues_nor_local_diverts() {
        let mut inv = NodeInventory::default();
        inv.addresses.insert(
            "orders".into(),
            AddressInfo {
                name: "orders".into(),
                queue_names: vec!["orders".into()],
                ..Default::default()
            },
        );
        inv.diverts.insert(
            "tap".into(),
            DivertInfo {
                name: "tap".into(),
                address: "orders".into(),
                ..Default::default()
            },
        );
        let local = ["orders".to_string(), "tap".to_string()];
        assert!(!clustered("orders", &local, &inv));
        let remote = [
            "orders".to_string(),
            "tap".to_string(),
            "orders5c1b-node2".to_string(),
        ];
        assert!(clustered("orders", &remote, &inv));
    }
}
