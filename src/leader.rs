//! Leader election on a `coordination.k8s.io/v1` Lease, and the shutdown the controllers obey.
//!
//! Only the holder of the Lease `artemis-studio-operator-<instance ID>` runs the controllers; the
//! other replicas are ready standbys that write nothing but their attempts on the Lease. A
//! leader that has not renewed within the renew deadline (shorter than the lease duration)
//! stops its controllers at once and the process exits non-zero, so its writes stop before a
//! standby may take the Lease over. On SIGTERM/SIGINT the controllers take no new reconcile,
//! the in-flight ones get the shutdown grace to finish, then the Lease is released (a standby
//! takes it at its next try) and the process exits 0. With nothing in flight the stop is at
//! once: before the controllers have started (caches not synced) there is nothing to wait for,
//! and a standby stops even in the middle of an attempt on the Lease.
//!
//! While the Lease cannot be read (API server unreachable), a standby retries with a growing
//! delay, from the retry period to the lease duration, and logs a summary of the failures
//! rather than every one ([`crate::backoff::Streak`]).
//!
//! # Why no crate
//!
//! Checked against kube 5 / k8s-openapi 0.29 (the crates.io index, November 2026):
//! - `kube-leader-election` 0.44 depends on kube 4, `kube-coordinate` 2.0.0-rc.0 on kube 2:
//!   neither builds with kube 5.
//! - `kube-lease-manager` 0.13.1 supports kube 5 / k8s-openapi 0.29, but does not give the
//!   guarantee needed here: while renewals fail (API server unreachable, timeouts) its watch
//!   channel keeps saying "leader" with no deadline, so a partitioned leader would go on writing
//!   to brokers after a standby took over; it derives expiry from the holder's `renewTime`
//!   compared with the local clock (clock skew between nodes becomes double leadership), and
//!   it takes over and renews with patches that carry no resourceVersion precondition.
//!
//! So the loop is written here, the way client-go's leaderelection does it, on `Api<Lease>`:
//! read the Lease; another holder's lease counts as expired only when this process has seen
//! its record unchanged for `leaseDurationSeconds` of its own monotonic clock (no comparison of
//! clocks across nodes); every take-over, renewal and release is a `replace` carrying the
//! resourceVersion just read, so of two racing processes exactly one wins (the other gets 409
//! Conflict). The chart grants exactly the verbs used: get, create, update.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta};
use tokio::time::Instant;

use crate::telemetry::Metrics;

/// A request to stop, shared by the binary (which requests it on SIGTERM/SIGINT) and the
/// controllers (which then take no new reconcile and end once the in-flight ones finish).
#[derive(Clone, Debug)]
pub struct Shutdown(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl Shutdown {
    /// Ask everything watching this to stop (idempotent).
    pub fn request(&self) {
        self.0.send_replace(true);
    }

    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once a stop was requested (at once if it already was).
    pub fn requested(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        use futures::FutureExt;
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
        .boxed()
        .shared()
    }
}

/// The Lease's timing, checked: retry period < renew deadline < lease duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a Lease stays valid after its last renewal, as seen by a standby.
    pub lease_duration: Duration,
    /// The leader stops when it has not renewed for this long.
    pub renew_deadline: Duration,
    /// Time between two attempts (renewal as leader, take-over as standby).
    pub retry_period: Duration,
}

/// Lease timings that could let two leaders act (refused before anything starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "LEASE_RENEW_DEADLINE_SECONDS ({renew_deadline_seconds}) must be less than \
         LEASE_DURATION_SECONDS ({lease_duration_seconds}): a leader must stop before a \
         standby may take the Lease over"
    )]
    DeadlineNotUnderDuration {
        renew_deadline_seconds: u32,
        lease_duration_seconds: u32,
    },
    #[error(
        "LEASE_RETRY_PERIOD_SECONDS ({retry_period_seconds}) must be less than \
         LEASE_RENEW_DEADLINE_SECONDS ({renew_deadline_seconds}): a leader needs more \
         than one try to renew"
    )]
    RetryNotUnderDeadline {
        retry_period_seconds: u32,
        renew_deadline_seconds: u32,
    },
}

impl Timing {
    pub fn new(
        lease_duration_seconds: u32,
        renew_deadline_seconds: u32,
        retry_period_seconds: u32,
    ) -> Result<Timing, TimingError> {
        if renew_deadline_seconds >= lease_duration_seconds {
            return Err(TimingError::DeadlineNotUnderDuration {
                renew_deadline_seconds,
                lease_duration_seconds,
            });
        }
        if retry_period_seconds >= renew_deadline_seconds {
            return Err(TimingError::RetryNotUnderDeadline {
                retry_period_seconds,
                renew_deadline_seconds,
            });
        }
        Ok(Timing {
            lease_duration: Duration::from_secs(lease_duration_seconds.into()),
            renew_deadline: Duration::from_secs(renew_deadline_seconds.into()),
            retry_period: Duration::from_secs(retry_period_seconds.into()),
        })
    }

    /// Releasing is a read and a replace; it must fit in the pod's termination grace (the
    /// chart gives 10 s past SHUTDOWN_GRACE_SECONDS).
    fn release_timeout(&self) -> Duration {
        self.renew_deadline.min(Duration::from_secs(5))
    }
}

/// Name of the Lease the replicas of one installation share.
pub fn lease_name(instance_id: &str) -> String {
    format!("artemis-studio-operator-{instance_id}")
}

/// Namespace of the Lease: LEASE_NAMESPACE, else POD_NAMESPACE, else `default`.
pub fn lease_namespace(lease_namespace: Option<&str>, pod_namespace: Option<&str>) -> String {
    [lease_namespace, pod_namespace]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|n| !n.is_empty())
        .unwrap_or("default")
        .to_string()
}

/// This process's holder identity: the pod's name (or the host's), and a suffix unique to the
/// process, so a restarted pod is a new holder.
pub fn holder_identity(pod_name: Option<&str>) -> String {
    let host = replica_name(pod_name);
    let unique = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}", &unique[..12])
}

/// This replica's name as status shows it (`status.heldBy`): the pod's name, else the host's.
pub fn replica_name(pod_name: Option<&str>) -> String {
    pod_name
        .map(str::to_string)
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".into())
}

/// What one attempt on the Lease found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// This process holds the Lease (just took it over or renewed it).
    Leading,
    /// Another process holds it, or won a race for it (its identity when known).
    Standby { holder: Option<String> },
}

/// The fields of a Lease whose change shows that its holder is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    transitions: Option<i32>,
    duration_seconds: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Record {
        Record {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.clone(),
            transitions: spec.lease_transitions,
            duration_seconds: spec.lease_duration_seconds,
        }
    }
}

/// One process's view of, and attempts on, the Lease.
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The record last read and when (this process's monotonic clock) it was first seen.
    observed: Option<(Record, Instant)>,
    /// This process may hold the Lease: it last read itself as the holder, took or renewed it,
    /// or sent a write whose answer it did not see (an attempt cut short). When false, a stop
    /// need not release anything (and does not wait on an API server that may be unreachable).
    may_hold: bool,
}

impl LeaseLock {
    pub fn new(api: Api<Lease>, name: String, identity: String, timing: Timing) -> LeaseLock {
        LeaseLock {
            api,
            name,
            identity,
            timing,
            observed: None,
            may_hold: false,
        }
    }

    /// See the field: whether a stop must try to release the Lease.
    pub fn may_hold(&self) -> bool {
        self.may_hold
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn observe(&mut self, record: Record, now: Instant) -> Instant {
        match &self.observed {
            Some((seen, at)) if *seen == record => *at,
            _ => {
                self.observed = Some((record, now));
                now
            }
        }
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// Take the Lease if it is free or expired, renew it if this process holds it.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let Some(current) = self.api.get_opt(&self.name).await? else {
            let spec = LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.lease_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            self.may_hold = true;
            return match self.api.create(&crate::api::post_params(), &lease).await {
                Ok(created) => {
                    let record = Record::of(&created.spec.unwrap_or_default());
                    self.observe(record, Instant::now());
                    Ok(Attempt::Leading)
                }
                // Another process created it first: read it at the next attempt.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    self.may_hold = false;
                    Ok(Attempt::Standby { holder: None })
                }
                Err(e) => Err(e),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let record = Record::of(&spec);
        let seen_since = self.observe(record.clone(), Instant::now());
        let mine = record.holder.as_deref() == Some(self.identity.as_str());
        self.may_hold = mine;
        if let Some(holder) = &record.holder
            && !mine
        {
            let valid_for = record
                .duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0)
                .map(Duration::from_secs)
                .unwrap_or(self.timing.lease_duration);
            if seen_since.elapsed() < valid_for {
                return Ok(Attempt::Standby {
                    holder: Some(holder.clone()),
                });
            }
            tracing::info!(lease = %self.name, %holder, "the Lease expired unrenewed; taking it over");
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        let mut next = current;
        next.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_seconds()),
            acquire_time: if mine {
                spec.acquire_time.clone().or_else(|| Some(now.clone()))
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if mine {
                transitions
            } else {
                transitions.saturating_add(1)
            }),
            ..spec
        });
        // The resourceVersion just read is the precondition: 409 if anyone wrote since.
        self.may_hold = true;
        match self
            .api
            .replace(&self.name, &crate::api::post_params(), &next)
            .await
        {
            Ok(written) => {
                let record = Record::of(&written.spec.unwrap_or_default());
                self.observe(record, Instant::now());
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                self.may_hold = mine;
                Ok(Attempt::Standby {
                    holder: record.holder.filter(|h| *h != self.identity),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Give the Lease up if this process holds it: a standby sees no holder and takes it at its
    /// next attempt. True when released.
    pub async fn release(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            self.may_hold = false;
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        spec.lease_duration_seconds = Some(1);
        lease.spec = Some(spec);
        match self
            .api
            .replace(&self.name, &crate::api::post_params(), &lease)
            .await
        {
            Ok(_) => {
                self.may_hold = false;
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// How a run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// A requested stop: the controllers finished in time (the Lease, if held, was released),
    /// or the process was still a standby.
    Stopped,
    /// A requested stop whose in-flight reconciles outlived the grace: cancelled, and the Lease
    /// left to expire.
    GraceExceeded,
    /// The Lease was lost (not renewed within the deadline, or taken by another process): the
    /// controllers were stopped at once.
    LeaseLost,
    /// The controllers ended without being asked to.
    ControllersEnded,
}

impl Exit {
    /// The process's exit code.
    pub fn code(&self) -> i32 {
        match self {
            Exit::Stopped | Exit::GraceExceeded => 0,
            Exit::LeaseLost | Exit::ControllersEnded => 1,
        }
    }
}

/// Run `controllers` until a requested stop. With a Lease (leader election on): first wait, as a
/// ready standby, until this process holds it, then run them while renewing it (see the module
/// documentation). Without: at once, giving in-flight reconciles the grace to finish.
pub async fn run<F>(
    lock: Option<LeaseLock>,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    grace: Duration,
    controllers: F,
) -> Exit
where
    F: Future<Output = ()> + Send + 'static,
{
    let Some(mut lock) = lock else {
        return run_unelected(shutdown, metrics, grace, controllers).await;
    };
    metrics.set_leader(false);
    let Some(renewed_at) = wait_for_the_lease(&mut lock, &shutdown, &metrics).await else {
        return Exit::Stopped;
    };
    lead(lock, shutdown, metrics, grace, renewed_at, controllers).await
}

/// Standby: try to take the Lease every retry period (longer and longer while attempts fail).
/// When this process holds it, the start of the attempt that took it; None on a requested stop,
/// at once even in the middle of an attempt (the Lease released if it may have been taken).
async fn wait_for_the_lease(lock: &mut LeaseLock, shutdown: &Shutdown, metrics: &Metrics) -> Option<Instant> {
    let timing = lock.timing;
    let mut last_holder: Option<Option<String>> = None;
    let mut failures = Failures::new(timing);
    loop {
        let started = Instant::now();
        let attempt = tokio::select! {
            biased;
            _ = shutdown.requested() => return stop_standing_by(lock).await,
            r = tokio::time::timeout(timing.renew_deadline, lock.try_acquire_or_renew()) => r,
        };
        let wait = match attempt {
            Ok(Ok(Attempt::Leading)) => {
                failures.succeeded(lock);
                return Some(started);
            }
            Ok(Ok(Attempt::Standby { holder })) => {
                failures.succeeded(lock);
                if last_holder.as_ref() != Some(&holder) {
                    tracing::info!(lease = %lock.name, holder = ?holder, identity = %lock.identity, "standby: the Lease is held by another process");
                    last_holder = Some(holder);
                }
                metrics.set_ready();
                timing.retry_period
            }
            Ok(Err(e)) => failures.failed(lock, &e),
            Err(_) => failures.failed(lock, &format_args!("timed out after {:?}", timing.renew_deadline)),
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.requested() => {}
        }
    }
}

/// A standby asked to stop: releases the Lease only if an attempt may have taken it.
async fn stop_standing_by(lock: &mut LeaseLock) -> Option<Instant> {
    if lock.may_hold() {
        let _ = tokio::time::timeout(lock.timing.release_timeout(), lock.release()).await;
    }
    None
}

/// A standby's failed attempts in a row: the delay before the next one doubles from the retry
/// period to the lease duration (a standby that backs off takes an expired Lease over at most
/// one lease duration later), and only some failures are logged (see `Streak`).
struct Failures {
    timing: Timing,
    delays: backon::ExponentialBackoff,
    streak: crate::backoff::Streak,
}

impl Failures {
    fn new(timing: Timing) -> Failures {
        Failures {
            timing,
            delays: crate::backoff::doubling(timing.retry_period, timing.lease_duration),
            streak: crate::backoff::Streak::default(),
        }
    }

    /// One more failure: logged when worth it; the delay before the next attempt.
    fn failed(&mut self, lock: &LeaseLock, error: &dyn std::fmt::Display) -> Duration {
        let wait = self.delays.next().unwrap_or(self.timing.lease_duration);
        if let Some(run) = self.streak.failed() {
            tracing::warn!(%error, lease = %lock.name, failures = run.failures, failing_for = ?run.lasting, next_attempt_in = ?wait,
                "could not read or take the Lease");
        }
        wait
    }

    /// An attempt that reached the Lease: the delays start again, and a recovery is logged.
    fn succeeded(&mut self, lock: &LeaseLock) {
        if let Some(run) = self.streak.succeeded() {
            tracing::info!(lease = %lock.name, failures = run.failures, failed_for = ?run.lasting, "the Lease can be read again");
            self.delays = crate::backoff::doubling(self.timing.retry_period, self.timing.lease_duration);
        }
    }
}

/// As the leader (the Lease renewed at `renewed_at`): run `controllers`, stopped at once when
/// the Lease is not renewed within the renew deadline or another process takes it, and given
/// the grace to finish on a requested stop (none when they have not started: nothing is in
/// flight before the caches synced).
async fn lead<F>(
    mut lock: LeaseLock,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    grace: Duration,
    mut renewed_at: Instant,
    controllers: F,
) -> Exit
where
    F: Future<Output = ()> + Send + 'static,
{
    let timing = lock.timing;
    let release_timeout = timing.release_timeout();
    // Leader: the controllers run while the Lease is renewed every retry period.
    tracing::info!(lease = %lock.name, identity = %lock.identity, "leading: starting the controllers");
    metrics.set_not_ready();
    metrics.set_leader(true);
    // Supervision: awaited by the loop below; an unasked end exits the process non-zero.
    let mut task = tokio::spawn(controllers);
    let mut stop_by: Option<Instant> = None;
    let mut next_try = Instant::now() + timing.retry_period;
    loop {
        let deadline = renewed_at + timing.renew_deadline;
        let grace_over = stop_by.unwrap_or(deadline);
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(deadline) => {
                task.abort();
                metrics.set_leader(false);
                tracing::error!(lease = %lock.name, deadline = ?timing.renew_deadline, "the Lease was not renewed within the renew deadline: controllers stopped");
                return Exit::LeaseLost;
            }
            ended = &mut task => {
                metrics.set_leader(false);
                // The controllers watch the same request: they may end before its arm here ran.
                if stop_by.is_some() || shutdown.is_requested() {
                    release_after_stop(&mut lock, release_timeout).await;
                    return Exit::Stopped;
                }
                tracing::error!(result = ?ended.err(), "the controllers ended unasked");
                let _ = tokio::time::timeout(release_timeout, lock.release()).await;
                return Exit::ControllersEnded;
            }
            _ = tokio::time::sleep_until(grace_over), if stop_by.is_some() => {
                task.abort();
                metrics.set_leader(false);
                tracing::warn!(grace = ?grace, "in-flight reconciles outlived the shutdown grace: cancelled, the Lease left to expire");
                return Exit::GraceExceeded;
            }
            _ = shutdown.requested(), if stop_by.is_none() => {
                if stop_unstarted(&task, &metrics, grace) {
                    release_after_stop(&mut lock, release_timeout).await;
                    return Exit::Stopped;
                }
                stop_by = Some(Instant::now() + grace);
            }
            _ = tokio::time::sleep_until(next_try) => {
                let started = Instant::now();
                next_try = started + timing.retry_period;
                match renew(&mut lock, deadline.saturating_duration_since(started)).await {
                    Renewal::Renewed => renewed_at = started,
                    Renewal::Failed => {}
                    Renewal::Lost => {
                        task.abort();
                        metrics.set_leader(false);
                        return Exit::LeaseLost;
                    }
                }
            }
        }
    }
}

/// On a requested stop: true (the controllers' task ended at once) when the controllers have
/// not started, so nothing can be in flight; false when in-flight reconciles get the grace.
///
/// "Not started" is `/readyz` still false: `controllers::run_all` sets it once the caches
/// synced, just before it starts the controllers, and a controller started after the stop was
/// requested takes no reconcile (`graceful_shutdown_on` has already resolved). Without this,
/// a stop while the caches cannot sync (API server unreachable, a CRD missing) would wait for
/// the whole grace with nothing to wait for.
fn stop_unstarted<T>(task: &tokio::task::JoinHandle<T>, metrics: &Metrics, grace: Duration) -> bool {
    if metrics.is_ready() {
        tracing::info!(grace = ?grace, "stopping: no new reconciles; waiting for the in-flight ones");
        return false;
    }
    task.abort();
    metrics.set_leader(false);
    tracing::info!("stopping: the controllers had not started (caches not synced), nothing in flight");
    true
}

/// How a renewal of a held Lease went.
enum Renewal {
    Renewed,
    /// Not this time (logged); the deadline decides.
    Failed,
    /// Another process holds it (logged).
    Lost,
}

/// One renewal attempt, given what is left before the renew deadline.
async fn renew(lock: &mut LeaseLock, left: Duration) -> Renewal {
    match tokio::time::timeout(left, lock.try_acquire_or_renew()).await {
        Ok(Ok(Attempt::Leading)) => Renewal::Renewed,
        Ok(Ok(Attempt::Standby { holder })) => {
            tracing::error!(lease = %lock.name, holder = ?holder, "the Lease was taken by another process: controllers stopped");
            Renewal::Lost
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, lease = %lock.name, "could not renew the Lease");
            Renewal::Failed
        }
        Err(_) => {
            tracing::warn!(lease = %lock.name, "renewing the Lease timed out");
            Renewal::Failed
        }
    }
}

/// After the controllers stopped on request: release the Lease, saying how that went.
async fn release_after_stop(lock: &mut LeaseLock, release_timeout: Duration) {
    match tokio::time::timeout(release_timeout, lock.release()).await {
        Ok(Ok(true)) => tracing::info!(lease = %lock.name, "controllers stopped; the Lease released"),
        Ok(Ok(false)) => {
            tracing::warn!(lease = %lock.name, "controllers stopped; the Lease was no longer ours")
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, lease = %lock.name, "controllers stopped; could not release the Lease (it expires)")
        }
        Err(_) => {
            tracing::warn!(lease = %lock.name, "controllers stopped; releasing the Lease timed out (it expires)")
        }
    }
}

/// Without leader election: this process acts at once.
async fn run_unelected(
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    grace: Duration,
    controllers: impl Future<Output = ()> + Send + 'static,
) -> Exit {
    metrics.set_leader(true);
    // Supervision: awaited by the loop below; an unasked end exits the process non-zero.
    let mut task = tokio::spawn(controllers);
    tokio::select! {
        ended = &mut task => {
            tracing::error!(result = ?ended.err(), "the controllers ended unasked");
            return Exit::ControllersEnded;
        }
        _ = shutdown.requested() => {}
    }
    if stop_unstarted(&task, &metrics, grace) {
        return Exit::Stopped;
    }
    match tokio::time::timeout(grace, &mut task).await {
        Ok(_) => Exit::Stopped,
        Err(_) => {
            task.abort();
            tracing::warn!(grace = ?grace, "in-flight reconciles outlived the shutdown grace: cancelled");
            Exit::GraceExceeded
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lease_mock::{assert_each_names_the_operator, mock_lease_api};
    use super::*;

    #[test]
    fn timing_orders_retry_deadline_and_duration() {
        let t = Timing::new(15, 10, 2).expect("defaults are valid");
        assert_eq!(t.lease_duration, Duration::from_secs(15));
        assert_eq!(t.renew_deadline, Duration::from_secs(10));
        assert_eq!(t.retry_period, Duration::from_secs(2));
        assert!(
            matches!(
                Timing::new(10, 10, 2),
                Err(TimingError::DeadlineNotUnderDuration { .. })
            ),
            "deadline = duration"
        );
        assert!(
            matches!(
                Timing::new(10, 12, 2),
                Err(TimingError::DeadlineNotUnderDuration { .. })
            ),
            "deadline > duration"
        );
        assert_eq!(
            Timing::new(10, 5, 5),
            Err(TimingError::RetryNotUnderDeadline {
                retry_period_seconds: 5,
                renew_deadline_seconds: 5
            }),
            "retry = deadline"
        );
        assert_eq!(
            Timing::new(10, 10, 2).map_err(|e| e.to_string()),
            Err("LEASE_RENEW_DEADLINE_SECONDS (10) must be less than LEASE_DURATION_SECONDS (10): a leader must stop before a standby may take the Lease over".to_string()),
            "the message names both settings and the rule"
        );
        assert!(Timing::new(3, 2, 1).is_ok());
    }

    #[test]
    fn lease_name_and_namespace() {
        assert_eq!(lease_name("studio"), "artemis-studio-operator-studio");
        assert_eq!(lease_namespace(Some("a"), Some("b")), "a");
        assert_eq!(lease_namespace(None, Some("b")), "b");
        assert_eq!(lease_namespace(Some(" "), Some("b")), "b");
        assert_eq!(lease_namespace(None, None), "default");
    }

    #[test]
    fn holder_identity_is_unique_per_process() {
        let a = holder_identity(Some("op-0"));
        let b = holder_identity(Some("op-0"));
        assert!(a.starts_with("op-0-"), "{a}");
        assert_ne!(a, b);
        assert!(!holder_identity(None).is_empty());
    }

    /// Every Lease write (its create, a renewal, the release) names the operator in
    /// `managedFields`, not "unknown".
    #[tokio::test]
    async fn lease_writes_name_the_operator_as_their_field_manager() {
        let (api, writes) = mock_lease_api();
        let timing = Timing::new(15, 10, 2).expect("valid timings");
        let mut lock = LeaseLock::new(api, "l".into(), "me".into(), timing);
        assert_eq!(
            lock.try_acquire_or_renew().await.expect("created"),
            Attempt::Leading
        );
        assert_eq!(
            lock.try_acquire_or_renew().await.expect("renewed"),
            Attempt::Leading
        );
        assert!(lock.release().await.expect("released"));
        assert_each_names_the_operator(&writes, 3);
    }

    #[tokio::test]
    async fn shutdown_resolves_once_requested() {
        let s = Shutdown::default();
        let waiting = s.requested();
        assert!(!s.is_requested());
        assert!(
            tokio::time::timeout(Duration::from_millis(20), s.requested())
                .await
                .is_err()
        );
        s.clone().request();
        assert!(s.is_requested());
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("resolves after the request");
        tokio::time::timeout(Duration::from_secs(1), s.requested())
            .await
            .expect("resolves at once when already requested");
    }

    #[tokio::test]
    async fn unelected_run_waits_for_in_flight_work_within_the_grace() {
        let metrics = Arc::new(Metrics::default());
        // The controllers have started (their caches synced).
        metrics.set_ready();
        let s = Shutdown::default();
        let trigger = s.requested();
        let work = async move {
            trigger.await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        s.request();
        let exit = run_unelected(s.clone(), metrics.clone(), Duration::from_secs(5), work).await;
        assert_eq!(exit, Exit::Stopped);
        assert_eq!(exit.code(), 0);

        let s = Shutdown::default();
        s.request();
        let stuck = std::future::pending::<()>();
        let exit = run_unelected(s, metrics, Duration::from_millis(20), stuck).await;
        assert_eq!(exit, Exit::GraceExceeded);
    }

    #[tokio::test]
    async fn a_stop_before_the_controllers_started_waits_for_nothing() {
        // Caches that never sync (API server unreachable): the controllers never start.
        let metrics = Arc::new(Metrics::default());
        let s = Shutdown::default();
        s.request();
        let never_synced = std::future::pending::<()>();
        let started = std::time::Instant::now();
        let exit = run_unelected(s, metrics, Duration::from_secs(20), never_synced).await;
        assert_eq!(exit, Exit::Stopped);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
}

/// A mock API server that keeps one Lease (whatever its name) and records every write (method
/// and URI), for the Lease writers' unit tests (this module's and `shards::leases`').
#[cfg(test)]
pub(crate) mod lease_mock {
    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::Api;
    use kube::client::Body;
    use serde_json::{Value, json};

    /// The writes the server received: "METHOD uri".
    pub type Writes = Arc<Mutex<Vec<String>>>;

    pub fn mock_lease_api() -> (Api<Lease>, Writes) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let writes = Writes::default();
        let log = writes.clone();
        tokio::spawn(async move {
            let mut lease = Value::Null;
            while let Some((request, respond)) = handle.next_request().await {
                let (method, uri) = (request.method().to_string(), request.uri().to_string());
                let body = http_body_util::BodyExt::collect(request.into_body()).await;
                let body = body.map(|b| b.to_bytes()).unwrap_or_default();
                let (code, reply) = match method.as_str() {
                    "GET" if lease.is_null() => (404, not_found()),
                    "GET" => (200, lease.clone()),
                    _ => {
                        lease = serde_json::from_slice(&body).unwrap_or_default();
                        lease["metadata"]["resourceVersion"] = "1".into();
                        log.lock().map(|mut l| l.push(format!("{method} {uri}"))).ok();
                        (200, lease.clone())
                    }
                };
                let response = Response::builder()
                    .status(code)
                    .body(Body::from(reply.to_string().into_bytes()));
                respond.send_response(response.unwrap_or_else(|e| panic!("response: {e}")));
            }
        });
        (Api::namespaced(kube::Client::new(service, "ns"), "ns"), writes)
    }

    fn not_found() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
               "code": 404, "message": "not found"})
    }

    /// `n` writes, each under the operator's field manager.
    pub fn assert_each_names_the_operator(writes: &Writes, n: usize) {
        let writes = writes.lock().map(|w| w.clone()).unwrap_or_default();
        assert_eq!(writes.len(), n, "{writes:?}");
        for w in &writes {
            assert!(w.contains("fieldManager=artemis-studio-operator"), "{w}");
        }
    }
}
