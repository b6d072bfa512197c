//! What this process knows of its drains (ADR-0066 D2): each one's state, its open coverage
//! interval, and whether coverage can be recorded at all. A tap is HEALTHY only while its drain
//! is [`DrainHealth::draining`]; [`NotDraining`] says why it is not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{DrainError, DrainKey};
use crate::capture::drain::supervise::{Death, DeathCause, Restart};
use crate::store::StoreError;
use crate::store::captured::SubscriptionKey;

/// A batch that has waited on the database this long makes its drain not draining (the
/// drain's own state, seen without asking Postgres anything).
pub const STORE_STALLED: Duration = Duration::from_secs(5);

/// What the pass knows of a drain.
#[derive(Clone, Debug)]
pub struct DrainState {
    pub connected: bool,
    /// The last committed batch, idle heartbeat, or attempt to store.
    pub alive_at: Instant,
    /// `alive_at` on the wall clock, for status (a fixed instant, so a message that names it
    /// does not change from pass to pass).
    pub alive_at_wall: chrono::DateTime<chrono::Utc>,
    /// Why it is not draining now, when it is not.
    pub problem: Option<DrainProblem>,
    /// Since when it has had a problem (the first of an unbroken run of them).
    pub problem_since: Option<chrono::DateTime<chrono::Utc>>,
    /// Copies held unsettled, waiting for the database to take them.
    pub held: usize,
}

/// Every drain of this process, and the coverage interval each has open.
#[derive(Clone, Default)]
pub struct DrainHealth {
    inner: Arc<Mutex<HashMap<DrainKey, DrainState>>>,
    open: Arc<Mutex<HashMap<DrainKey, (SubscriptionKey, i64)>>>,
    /// Why the last confirmation of coverage failed, and since when (None: it succeeded): no
    /// drain is draining while nothing it copies can be recorded.
    store_problem: Arc<Mutex<Option<StoreProblem>>>,
}

/// Why coverage cannot be confirmed, and since when.
type StoreProblem = (Arc<StoreError>, chrono::DateTime<chrono::Utc>);

fn rfc3339(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Why a drain is not draining now, as its state says.
#[derive(Clone, Debug, thiserror::Error)]
pub enum DrainProblem {
    /// Its task died; the next converge restarts it.
    #[error("drain died: {cause}; the next capture pass restarts it")]
    Died { cause: DeathCause },
    /// Its task died and restarts when its backoff ends.
    #[error("drain died: {cause}{}; restarts at {}", in_a_row(.deaths_in_a_row), rfc3339(.at))]
    Restarting {
        cause: DeathCause,
        deaths_in_a_row: u32,
        at: chrono::DateTime<chrono::Utc>,
    },
    /// Its receiver stopped (connection, attach, transfer, or the database it opens with); it
    /// reconnects after a backoff.
    #[error("drain stopped: {0}")]
    Stopped(#[source] Arc<DrainError>),
    /// Postgres did not take a batch: held unsettled and retried.
    #[error("database unavailable, batch held: {0}")]
    BatchHeld(#[source] Arc<StoreError>),
}

/// Why a drain does not count as draining (ADR-0066 D2): what a DEGRADED tap's status names.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NotDraining {
    /// The last confirmation of coverage failed: nothing any drain copies can be recorded.
    #[error("its coverage cannot be recorded: Postgres: {source} (since {})", rfc3339(.since))]
    CoverageUnrecorded {
        #[source]
        source: Arc<StoreError>,
        since: chrono::DateTime<chrono::Utc>,
    },
    /// The drains' state cannot be read (its lock was poisoned).
    #[error("drain state unavailable")]
    StateUnavailable,
    /// No drain runs for the capture queue (not started yet, or stopped).
    #[error("no drain runs for this capture queue (yet)")]
    NotRunning,
    /// The drain's own problem, since when, and the copies it holds unsettled.
    #[error("{problem}{}{}", since_text(.since), held_text(.held))]
    Problem {
        #[source]
        problem: DrainProblem,
        since: Option<chrono::DateTime<chrono::Utc>>,
        held: usize,
    },
    /// Started, not connected yet.
    #[error("drain not connected")]
    NotConnected,
    /// A batch has waited on the database longer than [`STORE_STALLED`].
    #[error("a batch of {held} copies has waited on the database since {}, held unsettled", rfc3339(.since))]
    StoreStalled {
        held: usize,
        since: chrono::DateTime<chrono::Utc>,
    },
    /// No batch, heartbeat or attempt to store for longer than the pass allows.
    #[error("drain silent for {}s", .silent.as_secs())]
    Silent { silent: Duration },
}

fn in_a_row(deaths: &u32) -> String {
    match deaths {
        0 | 1 => String::new(),
        n => format!(", {n} deaths in a row"),
    }
}

fn since_text(since: &Option<chrono::DateTime<chrono::Utc>>) -> String {
    since
        .map(|t| format!(" (since {})", rfc3339(&t)))
        .unwrap_or_default()
}

fn held_text(held: &usize) -> String {
    if *held > 0 {
        format!("; {held} copies held unsettled")
    } else {
        String::new()
    }
}

impl DrainHealth {
    pub(super) fn set(&self, key: &DrainKey, connected: bool, problem: Option<DrainProblem>) {
        self.set_holding(key, connected, problem, 0);
    }

    /// As `set`, with `held` copies held unsettled on their way into the database.
    pub(super) fn set_holding(
        &self,
        key: &DrainKey,
        connected: bool,
        problem: Option<DrainProblem>,
        held: usize,
    ) {
        if let Ok(mut m) = self.inner.lock() {
            let now = chrono::Utc::now();
            let since = match (&problem, m.get(key)) {
                (None, _) => None,
                (Some(_), Some(old)) if old.problem.is_some() => old.problem_since,
                (Some(_), _) => Some(now),
            };
            m.insert(
                key.clone(),
                DrainState {
                    connected,
                    alive_at: Instant::now(),
                    alive_at_wall: now,
                    problem,
                    problem_since: since,
                    held,
                },
            );
        }
    }

    /// The drain has connected or failed since it started (not still starting).
    pub fn settled(&self, key: &DrainKey) -> bool {
        self.inner
            .lock()
            .is_ok_and(|m| m.get(key).is_some_and(|s| s.connected || s.problem.is_some()))
    }

    /// No drain runs for `key` now: its state and its open coverage are forgotten.
    pub(in crate::capture) fn forget(&self, key: &DrainKey) {
        if let Ok(mut m) = self.inner.lock() {
            m.remove(key);
        }
        self.set_coverage(key, None);
    }

    /// The drain died: not draining (its coverage claims nothing past its death), and says so
    /// until the next converge restarts it.
    pub(super) fn died(&self, key: &DrainKey, death: &Death) {
        self.set_coverage(key, None);
        let why = DrainProblem::Died {
            cause: death.cause.clone(),
        };
        self.set(key, false, Some(why));
    }

    /// The drain that died restarts at `at`, when its backoff ends.
    pub(in crate::capture) fn restarts_at(
        &self,
        key: &DrainKey,
        death: &Death,
        restart: &Restart,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        let why = DrainProblem::Restarting {
            cause: death.cause.clone(),
            deaths_in_a_row: restart.deaths_in_a_row,
            at,
        };
        self.set(key, false, Some(why));
    }

    /// The drain's coverage interval is open (or, with None, ends now).
    pub(super) fn set_coverage(&self, key: &DrainKey, open: Option<(SubscriptionKey, i64)>) {
        if let Ok(mut m) = self.open.lock() {
            match open {
                Some(c) => m.insert(key.clone(), c),
                None => m.remove(key),
            };
        }
    }

    /// Whether the last confirmation of coverage failed, and why.
    pub(super) fn set_store_problem(&self, problem: Option<StoreError>) {
        if let Ok(mut p) = self.store_problem.lock() {
            *p = match (problem, p.take()) {
                (None, _) => None,
                (Some(why), Some((_, since))) => Some((Arc::new(why), since)),
                (Some(why), None) => Some((Arc::new(why), chrono::Utc::now())),
            };
        }
    }

    /// The open intervals of the drains alive `within` now: what may be confirmed (judged
    /// without the confirmations' own failure: a confirmation is how Postgres is found back).
    pub(super) fn coverage_to_confirm(&self, within: Duration) -> Vec<(DrainKey, (SubscriptionKey, i64))> {
        let open: Vec<(DrainKey, (SubscriptionKey, i64))> = self
            .open
            .lock()
            .map(|m| m.iter().map(|(k, c)| (k.clone(), c.clone())).collect())
            .unwrap_or_default();
        open.into_iter()
            .filter(|(k, _)| self.drain_alive(k, within).is_ok())
            .collect()
    }

    /// Being drained: connected, no problem, no batch waiting on the database longer than
    /// [`STORE_STALLED`], alive within `within` (ADR-0066 D2's definition of a healthy tap).
    /// Err carries why not: the drain's own problem, since when, and the copies it holds.
    pub fn draining(&self, key: &DrainKey, within: Duration) -> Result<(), NotDraining> {
        let runs = self.inner.lock().is_ok_and(|m| m.contains_key(key));
        if let (true, Some((source, since))) = (runs, self.store_problem.lock().ok().and_then(|p| p.clone()))
        {
            return Err(NotDraining::CoverageUnrecorded { source, since });
        }
        self.drain_alive(key, within)
    }

    /// The drain's own state, whatever the coverage confirmations found.
    fn drain_alive(&self, key: &DrainKey, within: Duration) -> Result<(), NotDraining> {
        let m = self.inner.lock().map_err(|_| NotDraining::StateUnavailable)?;
        let Some(s) = m.get(key) else {
            return Err(NotDraining::NotRunning);
        };
        match &s.problem {
            Some(p) => Err(NotDraining::Problem {
                problem: p.clone(),
                since: s.problem_since,
                held: s.held,
            }),
            None if !s.connected => Err(NotDraining::NotConnected),
            None if s.held > 0 && s.alive_at.elapsed() > STORE_STALLED => Err(NotDraining::StoreStalled {
                held: s.held,
                since: s.alive_at_wall,
            }),
            None if s.alive_at.elapsed() > within => Err(NotDraining::Silent {
                silent: s.alive_at.elapsed(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::capture::drain) fn key() -> DrainKey {
        DrainKey {
            cluster: "ns/c".into(),
            node: "n1".into(),
            capture_queue: "q".into(),
        }
    }

    /// A refusal of the database, as a batch held or a confirmation that failed sees it.
    fn refused() -> StoreError {
        StoreError::Database(sqlx::Error::PoolTimedOut)
    }

    /// Why the test drain is not draining, as status says it; None while it is.
    fn why_not(health: &DrainHealth) -> Option<String> {
        health
            .draining(&key(), Duration::from_secs(60))
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn a_refused_batch_makes_the_drain_not_draining_naming_since_when_and_what_it_holds() {
        let health = DrainHealth::default();
        health.set(&key(), true, None);
        assert_eq!(why_not(&health), None);
        let held = || Some(DrainProblem::BatchHeld(Arc::new(refused())));
        health.set_holding(&key(), true, held(), 200);
        let first = why_not(&health).expect("refused");
        assert!(
            first.starts_with("database unavailable, batch held: database: pool timed out"),
            "{first}"
        );
        assert!(first.contains(" (since "), "{first}");
        assert!(first.ends_with("; 200 copies held unsettled"), "{first}");
        // The same run of refusals keeps its start, so the message does not change.
        health.set_holding(&key(), true, held(), 200);
        assert_eq!(why_not(&health), Some(first));
        health.set(&key(), true, None);
        assert_eq!(why_not(&health), None);
    }

    #[test]
    fn while_coverage_cannot_be_confirmed_no_running_drain_is_draining() {
        let health = DrainHealth::default();
        health.set(&key(), true, None);
        health.set_store_problem(Some(refused()));
        let why = why_not(&health).expect("unrecorded");
        assert!(
            why.starts_with("its coverage cannot be recorded: Postgres: database: pool timed out"),
            "{why}"
        );
        assert!(why.contains(" (since "), "{why}");
        health.set_store_problem(None);
        assert_eq!(why_not(&health), None);
        let other = DrainKey {
            node: "n2".into(),
            ..key()
        };
        assert_eq!(
            health
                .draining(&other, Duration::from_secs(60))
                .err()
                .map(|e| e.to_string()),
            Some("no drain runs for this capture queue (yet)".to_string())
        );
    }

    #[test]
    fn a_batch_waiting_on_the_database_too_long_makes_the_drain_not_draining() {
        let health = DrainHealth::default();
        health.set_holding(&key(), true, None, 7);
        assert_eq!(why_not(&health), None, "just started");
        if let Ok(mut m) = health.inner.lock()
            && let Some(s) = m.get_mut(&key())
        {
            s.alive_at = Instant::now() - STORE_STALLED - Duration::from_secs(1);
        }
        let why = why_not(&health).expect("stalled");
        assert!(
            why.starts_with("a batch of 7 copies has waited on the database since"),
            "{why}"
        );
    }

    pub(in crate::capture::drain) fn death(cause: DeathCause) -> Death {
        Death {
            at: Instant::now(),
            at_wall: chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time"),
            ran_for: Duration::ZERO,
            cause,
        }
    }

    #[test]
    fn a_dead_drain_is_not_draining_and_says_how_it_died_and_when_it_restarts() {
        let health = DrainHealth::default();
        health.set(&key(), true, None);
        let d = death(DeathCause::Returned);
        health.died(&key(), &d);
        let why = why_not(&health).expect("dead");
        assert!(
            why.starts_with(
                "drain died: its task ended without being stopped; the next capture pass restarts it (since "
            ),
            "{why}"
        );
        assert!(health.settled(&key()), "a report does not wait on a dead drain");
        let restart = Restart {
            deaths_in_a_row: 3,
            backoff: Duration::from_secs(4),
            wait: Duration::from_secs(3),
        };
        let at = d.at_wall + chrono::Duration::seconds(4);
        health.restarts_at(&key(), &d, &restart, at);
        let why = why_not(&health).expect("dead");
        assert!(
            why.starts_with("drain died: its task ended without being stopped, 3 deaths in a row; restarts at 2027-01-15T08:00:04Z"),
            "{why}"
        );
    }
}
