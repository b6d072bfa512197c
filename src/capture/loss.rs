//! Loss, estimated from the broker's counters (CAPTURE-NOTES): the broker exposes no
//! ring-overwrite or DROP counter, so they are derived from the capture queue's and capture
//! address's counters, read in one bulk request per node. The counters live in broker memory: a
//! reset (a broker restart, or the queue re-created after a failover) starts a new baseline and
//! counts what the queue held before it as lost. Pure.

use crate::store::captured::QueueCounters;

/// One read of a capture queue and its address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterRead {
    pub messages_added: i64,
    pub messages_acknowledged: i64,
    pub messages_killed: i64,
    pub messages_expired: i64,
    pub message_count: i64,
    /// The capture address's RoutedMessageCount.
    pub address_routed: i64,
}

impl CounterRead {
    /// What the read says was lost since the queue was created: overwritten by the ring (plus
    /// expired and killed copies), and dropped at the full address (routed there, never added).
    pub fn counters(&self) -> QueueCounters {
        QueueCounters {
            ring_evicted: (self.messages_added - self.messages_acknowledged - self.message_count).max(0),
            address_dropped: (self.address_routed - self.messages_added).max(0),
            messages_added: self.messages_added,
            message_count: self.message_count,
        }
    }
}

/// Loss since the previous read, by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossDelta {
    /// Overwritten by the ring, expired or killed (`ring_overwrite`).
    pub ring: u64,
    /// Dropped at the full capture address (`address_full`).
    pub address: u64,
    /// Held by the queue when its counters reset (`broker_restart`).
    pub reset: u64,
}

/// Compare a new read with the previous one (None: the first read of this queue).
pub fn delta(previous: Option<&QueueCounters>, now: &QueueCounters) -> LossDelta {
    let pos = |n: i64| u64::try_from(n.max(0)).unwrap_or(0);
    match previous {
        None => LossDelta {
            ring: pos(now.ring_evicted),
            address: pos(now.address_dropped),
            reset: 0,
        },
        Some(p) if now.messages_added < p.messages_added => LossDelta {
            ring: pos(now.ring_evicted),
            address: pos(now.address_dropped),
            reset: pos(p.message_count),
        },
        Some(p) => LossDelta {
            ring: pos(now.ring_evicted - p.ring_evicted),
            address: pos(now.address_dropped - p.address_dropped),
            reset: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(added: i64, acked: i64, count: i64, routed: i64) -> QueueCounters {
        CounterRead {
            messages_added: added,
            messages_acknowledged: acked,
            message_count: count,
            address_routed: routed,
            ..Default::default()
        }
        .counters()
    }

    #[test]
    fn overwrites_are_what_was_added_and_neither_acknowledged_nor_held() {
        // 100 added, 30 drained, ring of 10 full: 60 overwritten.
        let c = read(100, 30, 10, 100);
        assert_eq!(c.ring_evicted, 60);
        assert_eq!(delta(None, &c).ring, 60);
        let later = read(150, 60, 10, 160);
        let d = delta(Some(&c), &later);
        assert_eq!((d.ring, d.address, d.reset), (20, 10, 0));
    }

    #[test]
    fn a_counter_reset_counts_what_the_queue_held_and_starts_over() {
        let before = read(1000, 990, 10, 1000);
        let after_restart = read(5, 5, 0, 5);
        let d = delta(Some(&before), &after_restart);
        assert_eq!((d.ring, d.address, d.reset), (0, 0, 10));
    }

    /// CAPTURE-NOTES: only counters that went back (a broker restart, a queue re-created) are a
    /// reset. A read that saw nothing new reports no loss at all: a quiet tap is never reported
    /// as having lost what its ring holds.
    #[test]
    fn a_read_that_saw_nothing_new_reports_no_loss() {
        let c = read(100, 30, 10, 120);
        assert_eq!(delta(Some(&c), &c), LossDelta::default());
        // Drained since, nothing added: still nothing lost.
        let drained = read(100, 40, 0, 120);
        assert_eq!(delta(Some(&c), &drained), LossDelta::default());
    }
}
