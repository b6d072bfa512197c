//! Shards (issue 46): broker clusters shared out between the replicas of one installation, each
//! reconciled by exactly one of them.
//!
//! The unit is the ArtemisCluster (`namespace/name`, the key capture's lock uses): its poll, its
//! request coalescing, its budget and its ownership judgements are all per cluster. With
//! `--sharding`, every replica runs the controllers and watches everything, and a reconcile of
//! an object whose cluster this replica does not hold ends at once, writing nothing
//! ([`Holdings::enter`]). Which replica holds which cluster:
//!
//! - every replica renews a Lease of its own (`…-replica-<identity>`), the way the leader renews
//!   the leader Lease (`src/leader.rs`): its liveness, seen by the others;
//! - every replica computes the same assignment from the live replicas and the ArtemisClusters
//!   ([`assign`]: rendezvous hashing with bounded loads, so three clusters on three replicas are
//!   1/1/1 and four on two are 2/2), and takes the clusters assigned to it;
//! - a cluster is held through a Lease of its own (`…-cluster-<hash>`), taken with the
//!   resourceVersion just read as the precondition (of two racing replicas one wins), only when
//!   it is free: never held, released, or held by a replica whose own Lease this replica has
//!   seen unrenewed for the lease duration (by its own monotonic clock);
//! - a holder is valid for as long as its own Lease is renewed: a replica that has not renewed
//!   within the renew deadline holds nothing ([`Holdings::holds`] turns false) and its process
//!   exits, before any other may take its clusters over (fenced, as the leader is);
//! - a cluster assigned elsewhere (a replica came) is released by its holder once the
//!   reconciles in flight for it have finished (or the shutdown grace passed): it takes no new
//!   reconcile of it meanwhile, so two replicas never write for one cluster. On SIGTERM every
//!   cluster is released that way and the others take them at their next look.
//!
//! A command in flight when its holder died is finished as after a leader's death: its audit
//! row is completed as `unknown` by the reaper, and the new holder's first poll re-reads the
//! cluster and triggers every object of it, whose plan from the broker's evidence sends only
//! what is missing (ADR-0049: "already exists" is evidence).
//!
//! Without `--sharding` (the default: one replica, or leader election) this process holds every
//! cluster ([`Holdings::everything`]) and the leader Lease decides whether it runs at all: the
//! same gates, always open.

pub mod assign;
mod leases;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

pub use leases::{ShardLeases, View};

/// Which broker clusters this replica holds, shared by every reconcile and capture pass.
#[derive(Clone)]
pub struct Holdings(Arc<Inner>);

struct Inner {
    /// What `status.heldBy` names: the pod's name (or the host's).
    replica: String,
    /// `None`: every cluster is held (no sharding).
    sharded: Option<Sharded>,
}

struct Sharded {
    state: Mutex<State>,
    /// A release waits on this for the last reconcile in flight.
    idle: tokio::sync::Notify,
    /// Past this long since this replica's own Lease was renewed, it holds nothing.
    renew_deadline: Duration,
}

#[derive(Default)]
struct State {
    held: BTreeMap<String, Holding>,
    renewed_at: Option<Instant>,
}

#[derive(Default)]
struct Holding {
    /// Assigned elsewhere or stopping: no new reconcile; released once none is in flight.
    releasing: bool,
    in_flight: usize,
}

impl Holdings {
    /// Every cluster held: no sharding (one replica, or the leader Lease decides).
    pub fn everything(replica: impl Into<String>) -> Self {
        Holdings(Arc::new(Inner {
            replica: replica.into(),
            sharded: None,
        }))
    }

    /// Nothing held until the shard loop takes it (see the module documentation).
    pub fn sharded(replica: impl Into<String>, renew_deadline: Duration) -> Self {
        Holdings(Arc::new(Inner {
            replica: replica.into(),
            sharded: Some(Sharded {
                state: Mutex::new(State::default()),
                idle: tokio::sync::Notify::new(),
                renew_deadline,
            }),
        }))
    }

    /// The replica `status.heldBy` names.
    pub fn replica(&self) -> &str {
        &self.0.replica
    }

    pub fn is_sharded(&self) -> bool {
        self.0.sharded.is_some()
    }

    /// This replica may act for the cluster now: it holds it, is not releasing it, and renewed
    /// its own Lease within the renew deadline.
    pub fn holds(&self, cluster: &str) -> bool {
        let Some(s) = &self.0.sharded else {
            return true;
        };
        let state = s.lock();
        state.fresh(s.renew_deadline) && state.held.get(cluster).is_some_and(|h| !h.releasing)
    }

    /// Work for the cluster, counted until the returned guard drops (a release waits for it);
    /// None when this replica does not hold the cluster (the caller does nothing).
    pub fn enter(&self, cluster: &str) -> Option<Work> {
        let Some(s) = &self.0.sharded else {
            return Some(Work(None));
        };
        let mut state = s.lock();
        if !state.fresh(s.renew_deadline) {
            return None;
        }
        let h = state.held.get_mut(cluster).filter(|h| !h.releasing)?;
        h.in_flight += 1;
        Some(Work(Some((self.clone(), cluster.to_string()))))
    }

    /// The clusters held now (not releasing).
    pub fn held(&self) -> Vec<String> {
        let Some(s) = &self.0.sharded else {
            return vec![];
        };
        let state = s.lock();
        state
            .held
            .iter()
            .filter(|(_, h)| !h.releasing)
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn shard_state(&self) -> Option<&Sharded> {
        self.0.sharded.as_ref()
    }

    /// The shard loop renewed this replica's Lease (the attempt started at `at`).
    pub(crate) fn renewed(&self, at: Instant) {
        if let Some(s) = self.shard_state() {
            s.lock().renewed_at = Some(at);
        }
    }

    /// The shard loop took the cluster's Lease.
    pub(crate) fn take(&self, cluster: &str) {
        if let Some(s) = self.shard_state() {
            s.lock().held.insert(cluster.to_string(), Holding::default());
        }
    }

    /// No new work for the cluster; true when none is in flight (it may be released now).
    pub(crate) fn start_release(&self, cluster: &str) -> bool {
        let Some(s) = self.shard_state() else {
            return false;
        };
        let mut state = s.lock();
        match state.held.get_mut(cluster) {
            Some(h) => {
                h.releasing = true;
                h.in_flight == 0
            }
            None => true,
        }
    }

    /// Wait (at most `within`) until no work for `cluster` is in flight; true when none is.
    pub(crate) async fn idle(&self, cluster: &str, within: Duration) -> bool {
        let Some(s) = self.shard_state() else {
            return true;
        };
        let until = Instant::now() + within;
        loop {
            let notified = s.idle.notified();
            if s.lock().held.get(cluster).is_none_or(|h| h.in_flight == 0) {
                return true;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return false;
            }
        }
    }

    /// The cluster's Lease was released (or lost): nothing of it is held any more.
    pub(crate) fn forget(&self, cluster: &str) {
        if let Some(s) = self.shard_state() {
            s.lock().held.remove(cluster);
        }
    }

    /// Every cluster held or being released.
    pub(crate) fn all_held(&self) -> Vec<String> {
        self.shard_state()
            .map(|s| s.lock().held.keys().cloned().collect())
            .unwrap_or_default()
    }
}

impl Sharded {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn fresh(&self, renew_deadline: Duration) -> bool {
        self.renewed_at.is_some_and(|at| at.elapsed() < renew_deadline)
    }
}

/// Work for a held cluster, counted while it lives (see [`Holdings::enter`]).
pub struct Work(Option<(Holdings, String)>);

impl Drop for Work {
    fn drop(&mut self) {
        let Some((holdings, cluster)) = self.0.take() else {
            return;
        };
        if let Some(s) = holdings.shard_state() {
            let mut state = s.lock();
            if let Some(h) = state.held.get_mut(&cluster) {
                h.in_flight = h.in_flight.saturating_sub(1);
            }
            drop(state);
            s.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_sharding_every_cluster_is_held() {
        let h = Holdings::everything("pod-a");
        assert!(h.holds("ns/c"));
        assert!(h.enter("ns/c").is_some());
        assert!(!h.is_sharded());
    }

    #[tokio::test]
    async fn a_sharded_replica_holds_only_what_it_took_and_only_while_renewed() {
        let h = Holdings::sharded("pod-a", Duration::from_secs(10));
        h.take("ns/c");
        assert!(!h.holds("ns/c"), "never renewed: holds nothing");
        h.renewed(Instant::now());
        assert!(h.holds("ns/c"));
        assert!(!h.holds("ns/other"));
        assert!(h.enter("ns/other").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_renew_deadline_nothing_is_held() {
        let h = Holdings::sharded("pod-a", Duration::from_secs(10));
        h.take("ns/c");
        h.renewed(Instant::now());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!h.holds("ns/c"));
        assert!(h.enter("ns/c").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_takes_no_new_work_and_waits_for_the_work_in_flight() {
        let h = Holdings::sharded("pod-a", Duration::from_secs(3600));
        h.renewed(Instant::now());
        h.take("ns/c");
        let work = h.enter("ns/c").expect("held");
        assert!(!h.start_release("ns/c"), "one reconcile in flight");
        assert!(h.enter("ns/c").is_none(), "releasing: no new work");
        assert!(!h.holds("ns/c"));
        assert!(!h.idle("ns/c", Duration::from_secs(1)).await);
        let waiting = {
            let h = h.clone();
            tokio::spawn(async move { h.idle("ns/c", Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        drop(work);
        assert!(waiting.await.expect("joined"));
        h.forget("ns/c");
        assert!(h.all_held().is_empty());
    }
}
