//! The coverage confirmation (issue 42): every [`COVERAGE_CONFIRM`], one statement beats the
//! heartbeat row of every node this process drains, and the open coverage intervals of its
//! draining drains are attached to those rows — per node, not per tap.

use std::collections::HashMap;
use std::time::Duration;

use super::DrainKey;
use super::health::DrainHealth;
use crate::store::captured::{CoverageBeat, SubscriptionKey};
use crate::store::{Store, StoreError};

/// How often the open coverage intervals of idle drains are confirmed in Postgres (all of the
/// process's in one statement, [`confirm_coverage`]): the precision of a coverage gap's end
/// when the operator dies.
pub const COVERAGE_CONFIRM: Duration = Duration::from_secs(5);

/// Confirm, every [`COVERAGE_CONFIRM`], the open coverage of every drain of this process that
/// is draining: per node, not per tap (issue 42). Each open interval of a draining drain is
/// attached to its node's heartbeat row, and one statement beats every heartbeat; an interval
/// is written only when its drain starts or stops draining. A drain that is not draining is
/// detached, so its interval claims nothing past its last sign of life. While confirmations
/// fail, no drain counts as draining (nothing it copies can be recorded); the next one that
/// succeeds, or a batch's insert, catches up.
pub async fn confirm_coverage(store: Store, health: DrainHealth, holder: String) {
    let mut every = tokio::time::interval(COVERAGE_CONFIRM);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heartbeats = Heartbeats::default();
    loop {
        every.tick().await;
        let alive = health.coverage_to_confirm(COVERAGE_CONFIRM);
        match heartbeats.beat(&store, &holder, &alive).await {
            Ok(()) => health.set_store_problem(None),
            Err(e) => {
                tracing::warn!(error = %e, intervals = alive.len(), "capture: coverage not confirmed this time");
                health.set_store_problem(Some(e));
            }
        }
    }
}

/// The heartbeat rows of this process's nodes, and which open interval is attached to which.
#[derive(Default)]
struct Heartbeats {
    /// (cluster, node) → heartbeat row.
    rows: HashMap<(String, String), i64>,
    /// Interval → the heartbeat it is attached to, as written.
    attached: HashMap<(SubscriptionKey, i64), i64>,
}

impl Heartbeats {
    /// One beat: a heartbeat row for each node first drained, then the beat's writes.
    async fn beat(
        &mut self,
        store: &Store,
        holder: &str,
        alive: &[(DrainKey, (SubscriptionKey, i64))],
    ) -> Result<(), StoreError> {
        for (k, _) in alive {
            if let std::collections::hash_map::Entry::Vacant(row) =
                self.rows.entry((k.cluster.clone(), k.node.clone()))
            {
                row.insert(store.heartbeat_start(&k.cluster, &k.node, holder).await?);
            }
        }
        let beat = self.plan(alive);
        if beat == CoverageBeat::default() {
            return Ok(());
        }
        store.coverage_beat(&beat).await?;
        for i in &beat.detach {
            self.attached.remove(i);
        }
        for (k, id, h) in beat.attach {
            self.attached.insert((k, id), h);
        }
        Ok(())
    }

    /// What to write for the intervals alive now (pure).
    fn plan(&self, alive: &[(DrainKey, (SubscriptionKey, i64))]) -> CoverageBeat {
        let now: HashMap<&(SubscriptionKey, i64), i64> = alive
            .iter()
            .filter_map(|(k, i)| Some((i, *self.rows.get(&(k.cluster.clone(), k.node.clone()))?)))
            .collect();
        let mut detach: Vec<(SubscriptionKey, i64)> = self
            .attached
            .iter()
            .filter(|(i, h)| now.get(i) != Some(h))
            .map(|(i, _)| i.clone())
            .collect();
        let mut attach: Vec<(SubscriptionKey, i64, i64)> = now
            .iter()
            .filter(|(i, h)| self.attached.get(**i) != Some(*h))
            .map(|((k, id), h)| (k.clone(), *id, *h))
            .collect();
        let mut beat: Vec<i64> = now.values().copied().collect();
        beat.sort_unstable();
        beat.dedup();
        detach.sort();
        attach.sort();
        CoverageBeat { detach, attach, beat }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(node: &str, id: i64) -> (DrainKey, (SubscriptionKey, i64)) {
        let key = DrainKey {
            cluster: "ns/c".into(),
            node: node.into(),
            capture_queue: format!("q{id}"),
        };
        let sub = SubscriptionKey {
            cluster: "ns/c".into(),
            subscription: "s".into(),
            id: 1,
        };
        (key, (sub, id))
    }

    #[test]
    fn an_idle_beat_writes_one_row_per_node_and_an_interval_only_when_its_drain_changes() {
        let mut h = Heartbeats::default();
        h.rows.insert(("ns/c".into(), "n1".into()), 10);
        h.rows.insert(("ns/c".into(), "n2".into()), 20);
        let now = [alive("n1", 1), alive("n1", 2), alive("n2", 3)];
        let first = h.plan(&now);
        assert_eq!(first.beat, vec![10, 20], "one heartbeat per node");
        assert_eq!(first.attach.len(), 3);
        assert!(first.detach.is_empty());
        for (k, id, hb) in first.attach {
            h.attached.insert((k, id), hb);
        }
        let idle = h.plan(&now);
        assert!(
            idle.attach.is_empty() && idle.detach.is_empty(),
            "idle: no interval written"
        );
        assert_eq!(idle.beat, vec![10, 20]);
        // Drain 2 stops draining: detached (its interval claims nothing past the last beat).
        let later = h.plan(&[alive("n1", 1), alive("n2", 3)]);
        assert_eq!(
            later.detach.iter().map(|(_, id)| *id).collect::<Vec<_>>(),
            vec![2]
        );
        assert!(later.attach.is_empty());
        // Nothing drains on n2: its heartbeat does not beat.
        assert_eq!(h.plan(&[alive("n1", 1)]).beat, vec![10]);
    }
}
