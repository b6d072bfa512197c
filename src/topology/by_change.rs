//! Inventory by change (issue 45): a converged poll costs the same at 10,000 queues as at 1,000.
//!
//! Between full reads, a poll asks each node its queue and address counts and its divert names
//! (`QueueCount`, `AddressCount`, `DivertNames`: one read, whose size follows the diverts, not
//! the queues) and one page of [`PAGE`] queues in full, the next page at each poll, round the
//! node; it reads the node in full when the counts differ from what the operator knows of it
//! (the last snapshot, with every write's answer laid over it), or when the last full read is
//! older than the cluster's `spec.fullReadIntervalSeconds`. So a setting changed on an existing
//! queue behind the operator's back (another installation's write, a script) is seen within one
//! round of pages — every poll while a node has at most [`PAGE`] queues, 20 polls at 10,000 —
//! and what neither shows (a queue removed and another added between two polls, addresses'
//! and diverts' settings) at the next full read. While the operator's own writes keep a node
//! busy (a burst of creates), a count difference is read in full at most once per
//! [`BUSY_FULL_READ_EVERY`]: the writes in flight explain it, and their answers are laid over
//! the snapshot as they come. Artemis's counts are
//! the management registry's own (`getQueueCount` counts the `QueueControl`s `listQueues`
//! lists; `getAddressCount` the `AddressControl`s the address read finds), so they agree with
//! a full read of an unchanged node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::divert_watch::{self, Watch};
use super::inventory::{self, NodeInventory};
use crate::broker::jolokia::JolokiaRequest;
use crate::broker::{BrokerError, BrokerManagement, mbean};

/// The default of `spec.fullReadIntervalSeconds`.
pub const FULL_READ_INTERVAL: Duration = Duration::from_secs(300);

/// Queues read in full per poll between full reads (Artemis sorts the whole set for a page, so
/// pages are few and large: deploy/dev/inventory-bench).
pub const PAGE: u64 = 500;

/// What a node was last read in full as, and when: the baseline its counts are judged against.
#[derive(Clone, Debug)]
pub struct Baseline {
    /// The node's inventory as the operator knows it now (the snapshot, writes laid over it).
    pub inventory: Arc<NodeInventory>,
    /// When the endpoint was last read in full.
    pub full_read_at: Instant,
    /// The page of queues this poll reads (from 1; one past the last starts again at 1).
    pub page: u64,
    /// This operator's own writes (their answers, its fresh reads) were laid over the inventory
    /// since its poll: the node is busy with our work.
    pub written_since_poll: bool,
}

/// While this operator's own writes keep a node busy, its counts differ from what is known by
/// the writes still in flight at every poll; the node is then read in full at most this often,
/// not at every poll (issue 45: at 10,000 queues a full read costs each broker seconds, and a
/// burst of creates paid it at every poll, so a create cost more the more queues there were).
/// Drift behind the operator's back meanwhile is found by this bound, or at the first poll
/// after the writes stop.
pub const BUSY_FULL_READ_EVERY: Duration = Duration::from_secs(60);

/// Whether a node whose counts were read is read in full now: its counts moved and the move
/// is not (only) our own writes in flight, or they have been for [`BUSY_FULL_READ_EVERY`]. Its
/// divert names are exact, not a count: a different set is always read in full (a capture
/// pass's installs and sweeps, which the controllers' snapshot does not carry, change it).
fn full_read_needed(moved: Moved, b: &Baseline) -> bool {
    match moved {
        Moved::Nothing => false,
        Moved::Counts => !ours_in_flight(b),
        Moved::Diverts => true,
    }
}

/// The node is busy with this operator's own writes and its last full read is recent: a count
/// difference is our writes in flight, and the node's page of queues waits (issue 45: a page
/// sorts every queue of the node, ~180 ms of broker CPU at 10,000, and a burst paid it at every
/// poll). Drift behind our back meanwhile is found by the full read due
/// [`BUSY_FULL_READ_EVERY`] after the last, or by the pages again once that has passed.
fn ours_in_flight(b: &Baseline) -> bool {
    b.written_since_poll && b.full_read_at.elapsed() < BUSY_FULL_READ_EVERY
}

/// What a poll by change asks a node: its counts, and its next page of queues unless the node
/// is busy with our writes.
fn by_change_requests(broker_name: &str, b: &Baseline) -> Vec<JolokiaRequest> {
    // The divert watch first: a divert added after it is counted (divert_watch.rs).
    let mut asks = vec![divert_watch::request(broker_name), counts_request(broker_name)];
    if !ours_in_flight(b) {
        asks.push(inventory::list_queues(
            broker_name,
            b.page.max(1) as i64,
            PAGE as i64,
        ));
    }
    asks
}

/// What a node's counts say moved against what is known of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Moved {
    Nothing,
    /// The queue or address count, not the divert names.
    Counts,
    Diverts,
}

/// A node's inventory as this poll found it.
#[derive(Clone, Debug)]
pub enum Read {
    /// Read in full now.
    Full(Arc<NodeInventory>),
    /// The counts match the baseline: it stands, with one page of queues read afresh; the
    /// next poll reads page `next_page`.
    ByChange {
        inventory: Arc<NodeInventory>,
        next_page: u64,
    },
}

impl Read {
    pub fn inventory(&self) -> &Arc<NodeInventory> {
        match self {
            Read::Full(i) | Read::ByChange { inventory: i, .. } => i,
        }
    }
}

/// The node's inventory: the baseline when it is recent and the node's counts match it, else a
/// full read.
pub async fn read(
    m: &BrokerManagement,
    baseline: Option<Baseline>,
    interval: Duration,
) -> Result<Read, BrokerError> {
    let node = crate::broker::budget::node_key(m.client().url());
    let metrics = m.client().registry().metrics();
    if let Some(b) = baseline.filter(|b| b.full_read_at.elapsed() < interval) {
        let asks = by_change_requests(m.broker_name(), &b);
        let mut answers = m.client().bulk(&asks).await?.into_iter();
        let short = || BrokerError::BadResponse("short bulk response".into());
        let watch = divert_watch::judge(answers.next().ok_or_else(short)?);
        let counts = answers.next().ok_or_else(short)?;
        // No page when none was asked (a node busy with our writes).
        let listing = answers.next().transpose();
        // An element the broker refuses (a role without `listQueues`, say) is read in full: the
        // scrape has its own way around it.
        if let (Ok(counts), Ok(listing)) = (counts, listing)
            && !full_read_needed(moved(&counts, &b.inventory)?, &b)
        {
            metrics.record_inventory_read(&node, false);
            return with_page(b, listing.as_ref(), watch);
        }
    }
    let full = inventory::scrape(m).await?;
    metrics.record_inventory_read(&node, true);
    Ok(Read::Full(Arc::new(full)))
}

/// The baseline with a page of queues and the divert watch now laid over it (the same `Arc`
/// when nothing in it moved: the poll then sees no change), and the page to read next; without
/// a page, the same page next.
fn with_page(b: Baseline, listing: Option<&Value>, watch: Watch) -> Result<Read, BrokerError> {
    let watch = divert_watch::kept(&b.inventory.divert_watch, watch);
    let mut paged = (*b.inventory).clone();
    let mut changed = paged.divert_watch != watch;
    paged.divert_watch = watch;
    let Some(listing) = listing else {
        let inventory = if changed { Arc::new(paged) } else { b.inventory };
        return Ok(Read::ByChange {
            inventory,
            next_page: b.page,
        });
    };
    changed |= paged.add_listed_queues(listing)?;
    let known = (b.inventory.queues.len() + b.inventory.unreadable_queues.len()) as u64;
    let pages = known.div_ceil(PAGE).max(1);
    let next_page = if b.page >= pages { 1 } else { b.page + 1 };
    let inventory = if changed { Arc::new(paged) } else { b.inventory };
    Ok(Read::ByChange { inventory, next_page })
}

/// The one read that says whether a node's inventory moved.
fn counts_request(broker_name: &str) -> JolokiaRequest {
    JolokiaRequest::read_strict(
        mbean::broker(broker_name),
        &["QueueCount", "AddressCount", "DivertNames"],
    )
}

/// What moved on the node against the known inventory, by its counts and divert names.
fn moved(answer: &Value, known: &NodeInventory) -> Result<Moved, BrokerError> {
    let names: Vec<&str> = answer
        .get("DivertNames")
        .and_then(Value::as_array)
        .ok_or_else(|| BrokerError::BadResponse("the broker's DivertNames is not a list".into()))?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let same_diverts =
        names.len() == known.diverts.len() && names.iter().all(|n| known.diverts.contains_key(*n));
    let same_counts = same_counts(answer, known)?;
    Ok(match (same_diverts, same_counts) {
        (false, _) => Moved::Diverts,
        (true, false) => Moved::Counts,
        (true, true) => Moved::Nothing,
    })
}

/// Whether the node's queue and address counts are those of the known inventory.
fn same_counts(answer: &Value, known: &NodeInventory) -> Result<bool, BrokerError> {
    let count = |k: &str| {
        answer
            .get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| BrokerError::BadResponse(format!("the broker's {k} is not a count")))
    };
    let queues = (known.queues.len() + known.unreadable_queues.len()) as u64;
    Ok(count("QueueCount")? == queues && count("AddressCount")? == known.addresses.len() as u64)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::topology::inventory::{AddressInfo, DivertInfo, QueueInfo};

    fn known() -> NodeInventory {
        let mut inv = NodeInventory::default();
        inv.queues.insert("q".into(), QueueInfo::default());
        inv.addresses.insert("q".into(), AddressInfo::default());
        inv.diverts.insert("d".into(), DivertInfo::default());
        inv
    }

    /// The known inventory as a baseline read in full `ago` seconds ago, with our writes laid
    /// over it since (`written_since_poll`) or not.
    fn baseline_of(ago: u64, written_since_poll: bool) -> Baseline {
        Baseline {
            inventory: Arc::new(known()),
            full_read_at: Instant::now() - Duration::from_secs(ago),
            page: 1,
            written_since_poll,
        }
    }

    #[test]
    fn counts_that_match_what_is_known_leave_it_standing_any_difference_reads_in_full() {
        let same = json!({"QueueCount": 1, "AddressCount": 1, "DivertNames": ["d"]});
        assert_eq!(moved(&same, &known()).expect("read"), Moved::Nothing);
        for answer in [
            json!({"QueueCount": 2, "AddressCount": 1, "DivertNames": ["d"]}),
            json!({"QueueCount": 1, "AddressCount": 0, "DivertNames": ["d"]}),
            json!({"QueueCount": 1, "AddressCount": 1, "DivertNames": ["e"]}),
            json!({"QueueCount": 1, "AddressCount": 1, "DivertNames": []}),
        ] {
            let m = moved(&answer, &known()).expect("read");
            assert!(full_read_needed(m, &baseline_of(0, false)), "{answer}: {m:?}");
        }
        let broken = json!({"QueueCount": "many", "AddressCount": 1, "DivertNames": ["d"]});
        assert!(moved(&broken, &known()).is_err(), "never judged on a guess");
    }

    #[test]
    fn a_node_busy_with_our_writes_is_read_in_full_once_a_minute_an_idle_one_at_any_move() {
        let at = baseline_of;
        assert!(!full_read_needed(Moved::Nothing, &at(0, false)), "nothing moved");
        assert!(
            !full_read_needed(Moved::Nothing, &at(120, true)),
            "nothing moved, busy or not"
        );
        assert!(
            full_read_needed(Moved::Counts, &at(0, false)),
            "moved, and not by us: read now"
        );
        assert!(
            !full_read_needed(Moved::Counts, &at(5, true)),
            "counts moved while we write: in flight"
        );
        let bound = BUSY_FULL_READ_EVERY.as_secs();
        assert!(
            full_read_needed(Moved::Counts, &at(bound, true)),
            "busy, but the bound is reached"
        );
        assert!(
            full_read_needed(Moved::Diverts, &at(5, true)),
            "other divert names: read now, busy or not"
        );
        let answer = |q: u64, d: &[&str]| json!({"QueueCount": q, "AddressCount": 1, "DivertNames": d});
        assert_eq!(moved(&answer(1, &["d"]), &known()).expect("read"), Moved::Nothing);
        assert_eq!(moved(&answer(2, &["d"]), &known()).expect("read"), Moved::Counts);
        assert_eq!(
            moved(&answer(2, &["d", "tap"]), &known()).expect("read"),
            Moved::Diverts
        );
        assert_eq!(moved(&answer(1, &[]), &known()).expect("read"), Moved::Diverts);
    }

    #[test]
    fn a_page_that_moves_nothing_keeps_the_baseline_and_one_that_does_replaces_it() {
        let row = |filter: &str| {
            json!({"name":"q","address":"q","filter":filter,"durable":"true","paused":"false",
                "temporary":"false","purgeOnNoConsumers":"false","consumerCount":"0","maxConsumers":"-1",
                "routingType":"ANYCAST","messageCount":"0","deliveringCount":"0","exclusive":"false",
                "lastValue":"false","lastValueKey":"","groupRebalance":"false","groupBuckets":"-1",
                "groupFirstKey":"","enabled":"true","ringSize":"-1","consumersBeforeDispatch":"0",
                "delayBeforeDispatch":"-1","autoDelete":"false"})
        };
        let listing = |filter: &str| Value::String(json!({"data": [row(filter)], "count": 1}).to_string());
        let mut known = NodeInventory::default();
        known.add_listed_queues(&listing("a = 1")).expect("a listing");
        let baseline = |page| Baseline {
            inventory: Arc::new(known.clone()),
            full_read_at: Instant::now(),
            page,
            written_since_poll: false,
        };
        let b = baseline(1);
        let same = b.inventory.clone();
        match with_page(b, Some(&listing("a = 1")), Watch::Unread).expect("a page") {
            Read::ByChange { inventory, next_page } => {
                assert!(Arc::ptr_eq(&inventory, &same), "nothing moved: the same snapshot");
                assert_eq!(next_page, 1, "one page: round again");
            }
            other => panic!("{other:?}"),
        }
        let b = baseline(3);
        let same = b.inventory.clone();
        match with_page(b, None, Watch::Unread).expect("no page") {
            Read::ByChange { inventory, next_page } => {
                assert!(Arc::ptr_eq(&inventory, &same), "no page: the same snapshot");
                assert_eq!(next_page, 3, "no page read: the same page next");
            }
            other => panic!("{other:?}"),
        }
        match with_page(baseline(1), Some(&listing("a = 2")), Watch::Unread).expect("a page") {
            Read::ByChange { inventory, .. } => {
                assert_eq!(inventory.queues["q"].filter.as_deref(), Some("a = 2"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_busy_with_our_writes_waits_for_its_page_until_its_full_read_is_due() {
        let asks = |ago, busy| by_change_requests("b1", &baseline_of(ago, busy)).len();
        assert_eq!(
            asks(5, true),
            2,
            "busy with our writes: the watch and the counts alone"
        );
        assert_eq!(asks(5, false), 3, "idle: the watch, the counts and a page");
        let bound = BUSY_FULL_READ_EVERY.as_secs();
        assert_eq!(asks(bound, true), 3, "busy past the bound: the page again");
        let idle = by_change_requests("b1", &baseline_of(0, false));
        let watch = serde_json::to_value(&idle[0]).expect("json");
        assert!(
            watch["mbean"]
                .as_str()
                .is_some_and(|m| m.contains(divert_watch::QUEUE))
        );
        let page = serde_json::to_value(&idle[2]).expect("json");
        assert_eq!(page["operation"], "listQueues(java.lang.String,int,int)");
    }

    #[test]
    fn the_counts_are_one_strict_read_of_the_broker() {
        let r = serde_json::to_value(counts_request("b1")).expect("json");
        assert_eq!(r["type"], "read");
        assert!(r.get("config").is_none());
        assert_eq!(r["attribute"].as_array().map(Vec::len), Some(3));
    }
}
