//! The drain (ADR-0062 D2, D4, D9; ADR-0066 D2): one AMQP 1.0 receiver per capture queue per
//! node, consuming by FQQN with manual credit in batches, so a slow database slows the drain and
//! the ring absorbs it (the producer never waits). A batch is accepted (settled) only after it is
//! committed: at-least-once into the database, and a redelivered copy is skipped by the store.
//! A drain that stops is visible in [`DrainHealth`], which is what makes a tap HEALTHY.

mod batch;
mod coverage;
mod health;
mod receive;
pub mod supervise;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fe2o3_amqp::link::{DispositionError, IllegalLinkStateError, RecvError};
use futures::FutureExt;
use tokio::sync::watch;

pub use batch::RateCap;
pub use coverage::{COVERAGE_CONFIRM, confirm_coverage};
pub use health::{DrainHealth, DrainProblem, DrainState, NotDraining, STORE_STALLED};

use self::supervise::{Death, DeathCause, Restart};
use super::connection::{LinkError, LinkKey, NodeLinks};
use crate::api::capture_names::TapName;
use crate::store::captured::SubscriptionKey;
use crate::store::{Store, StoreError};

/// Copies asked for at once. The next batch's credit goes out as soon as a batch is in hand, so
/// the broker streams it while Postgres commits; at most two batches (400 copies) are in flight
/// and unsettled at once, which bounds how much the credit window adds to the ring
/// (CAPTURE-NOTES: delivering messages do not count toward the ring size).
pub const BATCH: u32 = 200;

/// One drain: a capture queue on one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DrainKey {
    pub cluster: String,
    pub node: String,
    pub capture_queue: String,
}

/// Why a drain's receiver stopped: what failed, on the broker's side or the database's. The
/// drain reconnects after a backoff, and says so in its state ([`DrainProblem::Stopped`]).
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// No receiver: the connection, its session, or the attach failed.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The subscription's partitions could not be made before draining.
    #[error("partitions: {0}")]
    Partitions(#[source] StoreError),
    /// The drain's coverage interval could not be opened.
    #[error("coverage: {0}")]
    Coverage(#[source] StoreError),
    /// The next batch's credit could not be granted (the link is gone).
    #[error("credit: {0}")]
    Credit(#[source] IllegalLinkStateError),
    /// A transfer failed (not one that only would not decode: that one is loss).
    #[error("receive: {0}")]
    Receive(#[source] RecvError),
    /// A committed batch could not be accepted: it is redelivered, and skipped by the store.
    #[error("settle: {0}")]
    Settle(#[source] DispositionError),
}

/// Everything one drain needs.
#[derive(Clone)]
pub struct DrainSpec {
    pub key: DrainKey,
    pub tap: TapName,
    pub subscription: SubscriptionKey,
    /// The node's active broker and the credentials: the shared connection it attaches to.
    pub link: LinkKey,
    pub max_body_bytes: usize,
    pub rate_cap: Arc<Mutex<RateCap>>,
    /// The operator's capture metric families.
    pub metrics: Arc<crate::telemetry::capture::CaptureMetrics>,
    /// This drain's receiver's link name (unique on its connection).
    pub link_name: String,
}

/// A running drain. [`DrainHandle::stop`] stops it after the batch in hand; dropping the handle
/// (the worker is gone) aborts it, and its unsettled copies go back to the queue. A drain whose
/// task ended while nobody stopped it has died ([`DrainHandle::has_ended`],
/// [`supervise`]).
pub struct DrainHandle {
    /// Where it is attached, and as whom: a drain whose node or credentials changed is replaced.
    pub link: LinkKey,
    key: DrainKey,
    health: DrainHealth,
    /// The deaths in a row before this drain started (0: not a restart).
    deaths_in_a_row: u32,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<Option<Death>>>,
}

impl DrainHandle {
    /// Stop after the batch in hand is committed and settled (unsettled copies go back to the
    /// queue head); waits up to `grace`. Not a death, whenever the task ends.
    pub async fn stop(mut self, grace: Duration) {
        let _ = self.stop.send(true);
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(grace, &mut task).await.is_err()
        {
            task.abort();
        }
        self.health.forget(&self.key);
    }

    /// Its task has ended (a drain that was not stopped: it died).
    pub fn has_ended(&self) -> bool {
        self.task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
    }

    pub fn deaths_in_a_row(&self) -> u32 {
        self.deaths_in_a_row
    }

    /// How the task ended, once [`DrainHandle::has_ended`]: its death, or None when it was
    /// stopped.
    pub async fn death(mut self) -> Option<Death> {
        let task = self.task.take()?;
        match task.await {
            Ok(death) => death,
            Err(e) if e.is_panic() => Some(Death {
                at: Instant::now(),
                at_wall: chrono::Utc::now(),
                ran_for: Duration::ZERO,
                cause: DeathCause::of_panic(e.into_panic().as_ref()),
            }),
            Err(_) => None,
        }
    }
}

impl Drop for DrainHandle {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Start a drain: at once, or after `restart.wait` (the backoff of a drain that died).
pub fn spawn(
    store: Store,
    health: DrainHealth,
    links: NodeLinks,
    spec: DrainSpec,
    restart: Restart,
) -> DrainHandle {
    let (stop, stopped) = watch::channel(false);
    let (link, key) = (spec.link.clone(), spec.key.clone());
    // Supervision: its end is recorded (`supervised`) and the next capture pass restarts it
    // after a backoff (`supervise`).
    let task = tokio::spawn(supervised(
        store,
        health.clone(),
        links,
        spec,
        stopped,
        restart.wait,
    ));
    DrainHandle {
        link,
        key,
        health,
        deaths_in_a_row: restart.deaths_in_a_row,
        stop,
        task: Some(task),
    }
}

/// Counts a running drain down however its task ends (stopped, died, or aborted with its
/// handle).
struct Running(prometheus_client::metrics::gauge::Gauge);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A drain's task: after `wait`, [`run`] until stopped. A run that ends otherwise — a panic, or
/// a return — is the drain's death: recorded ([`supervise::record_death`]), in its
/// health, and returned to the converge that restarts it.
async fn supervised(
    store: Store,
    health: DrainHealth,
    links: NodeLinks,
    spec: DrainSpec,
    stopped: watch::Receiver<bool>,
    wait: Duration,
) -> Option<Death> {
    let mut stop = stopped.clone();
    if !wait.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
    if *stop.borrow() {
        return None;
    }
    let (key, subscription) = (spec.key.clone(), spec.tap.subscription.clone());
    let metrics = spec.metrics.clone();
    let started = Instant::now();
    let outcome = {
        let drains = spec.metrics.drains.clone();
        drains.inc();
        let _running = Running(drains);
        std::panic::AssertUnwindSafe(run(store, health.clone(), links, spec, stopped))
            .catch_unwind()
            .await
    };
    if *stop.borrow() {
        return None;
    }
    let death = Death {
        at: Instant::now(),
        at_wall: chrono::Utc::now(),
        ran_for: started.elapsed(),
        cause: match outcome {
            Ok(()) => DeathCause::Returned,
            Err(payload) => DeathCause::of_panic(payload.as_ref()),
        },
    };
    supervise::record_death(&key, &subscription, &death, &metrics);
    health.died(&key, &death);
    Some(death)
}

async fn run(
    store: Store,
    health: DrainHealth,
    links: NodeLinks,
    spec: DrainSpec,
    mut stopped: watch::Receiver<bool>,
) {
    let mut delays = crate::backoff::doubling(Duration::from_millis(500), Duration::from_secs(30));
    while !*stopped.borrow() {
        match receive::session(&store, &health, &links, &spec, &mut stopped).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(queue = %spec.key.capture_queue, node = %spec.key.node, error = %e, "capture drain stopped; reconnecting");
                let stopped_because = DrainProblem::Stopped(Arc::new(e));
                health.set(&spec.key, false, Some(stopped_because));
            }
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stopped.changed() => {}
        }
    }
    health.forget(&spec.key);
}

#[cfg(test)]
mod tests {
    use super::health::tests::{death, key};
    use super::*;

    fn handle_of(
        node: &str,
        task: tokio::task::JoinHandle<Option<Death>>,
        deaths: u32,
    ) -> (DrainKey, DrainHandle) {
        let k = DrainKey {
            node: node.into(),
            ..key()
        };
        let handle = DrainHandle {
            link: LinkKey {
                url: "amqp://127.0.0.1:5672".into(),
                username: "u".into(),
                password: "p".into(),
                trust: crate::capture::connection::Trust::SystemRoots,
            },
            key: k.clone(),
            health: DrainHealth::default(),
            deaths_in_a_row: deaths,
            stop: watch::channel(false).0,
            task: Some(task),
        };
        (k, handle)
    }

    /// What a converge does with its drains first: every one whose task ended is taken out
    /// with the restart its death earns; one that was stopped has no death, and one still
    /// running stays.
    #[tokio::test]
    async fn ended_drains_are_taken_out_with_their_restart_and_a_running_one_stays() {
        let returned = death(DeathCause::Returned);
        let mut drains: std::collections::BTreeMap<DrainKey, DrainHandle> = [
            handle_of("returned", tokio::spawn(async move { Some(returned) }), 2),
            handle_of("panicked", tokio::spawn(async { panic!("boom") }), 0),
            handle_of("stopped", tokio::spawn(async { None }), 0),
            handle_of("running", tokio::spawn(std::future::pending()), 0),
        ]
        .into_iter()
        .collect();
        while drains.values().filter(|h| h.has_ended()).count() < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let taken = super::supervise::take_ended(&mut drains).await;
        let running: Vec<&str> = drains.keys().map(|k| k.node.as_str()).collect();
        assert_eq!(running, ["running"]);
        let summary: Vec<(&str, u32, Duration, &DeathCause)> = taken
            .iter()
            .map(|(k, (d, r))| (k.node.as_str(), r.deaths_in_a_row, r.backoff, &d.cause))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "panicked",
                    1,
                    Duration::from_secs(1),
                    &DeathCause::Panicked(Some("boom"))
                ),
                ("returned", 3, Duration::from_secs(4), &DeathCause::Returned),
            ]
        );
    }
}
