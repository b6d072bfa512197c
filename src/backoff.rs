//! Retry delays, one way for every retry: a controller's per-object retries after failed
//! reconciles (or failed nodes), a capture drain's reconnects, the standby's attempts on the
//! Lease and the watches' relists. Doubling from a base to a cap, by `backon`'s exponential
//! backoff. And how a retry loop logs a run of failures ([`Streak`]): not every attempt.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays doubling from `base` to `cap`, for ever.
pub fn doubling(base: Duration, cap: Duration) -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(base)
        .with_max_delay(cap)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

/// A watch's retry delays, for `WatchStreamExt::backoff` in place of `default_backoff()`.
///
/// Why not kube's default: its `StreamBackoff` resets the backoff on every `Ok` item, and a
/// watcher that cannot list yields `Ok(Event::Init)` before each attempt, so the delay never
/// grows past the first one (~1 s per watch, for ever, while the API server is unreachable:
/// issue 41 item 6). Here a reset counts only once the watch has gone [`WatchBackoff::SETTLE`]
/// without an error; the delays are kube's (0.8 s doubling to 30 s, with jitter).
pub fn watch() -> WatchBackoff {
    WatchBackoff::new(
        Duration::from_millis(800),
        Duration::from_secs(30),
        WatchBackoff::SETTLE,
    )
}

/// A watch of `api` (every object, kube's watcher) retried with [`watch`]'s delays: the one
/// way every watch of the operator is made.
pub fn watched<K>(
    api: kube::Api<K>,
) -> impl futures::Stream<Item = kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use kube::runtime::WatchStreamExt;
    kube::runtime::watcher(api, kube::runtime::watcher::Config::default()).backoff(watch())
}

/// See [`watch`].
pub struct WatchBackoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    settle: Duration,
    /// Since when no error came (the first `Ok` after the last error), if any.
    healthy_since: Option<tokio::time::Instant>,
}

impl WatchBackoff {
    /// How long a watch must go without an error for its next failure to start again from
    /// the shortest delay: longer than a list that fails slowly (a connect timeout) takes.
    pub const SETTLE: Duration = Duration::from_secs(60);

    pub fn new(base: Duration, cap: Duration, settle: Duration) -> WatchBackoff {
        let builder = ExponentialBuilder::new()
            .with_min_delay(base)
            .with_max_delay(cap)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        WatchBackoff {
            delays: builder.build(),
            builder,
            settle,
            healthy_since: None,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    /// The delay after an error; the doubling starts again only if the watch had settled.
    fn next(&mut self) -> Option<Duration> {
        if self
            .healthy_since
            .take()
            .is_some_and(|since| since.elapsed() >= self.settle)
        {
            self.delays = self.builder.build();
        }
        self.delays.next()
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    /// Called on every `Ok` item: remembered, and honoured by the next failure if it comes
    /// after the settle time.
    fn reset(&mut self) {
        self.healthy_since.get_or_insert_with(tokio::time::Instant::now);
    }
}

/// A run of consecutive failures of one retry loop, for its log: a failure is worth a line
/// when it is the 1st, 2nd, 4th, 8th… in a row, or when the loop has said nothing for
/// [`Streak::QUIET_AT_MOST`]; the recovery is worth one line. So a loop logs at most one line
/// per attempt, and a long outage a few lines that say how long it has lasted.
#[derive(Debug, Default)]
pub struct Streak {
    failures: u64,
    since: Option<Instant>,
    logged_at: Option<Instant>,
}

/// What a [`Streak`] says about a failure or a recovery worth a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Failures in a row, this one included (for a recovery: before it).
    pub failures: u64,
    /// Since the first of them.
    pub lasting: Duration,
}

impl Streak {
    /// The longest a failing loop goes without a line.
    pub const QUIET_AT_MOST: Duration = Duration::from_secs(300);

    /// One more failure: `Some` when it is worth a line.
    pub fn failed(&mut self) -> Option<Run> {
        let now = Instant::now();
        self.failures += 1;
        let since = *self.since.get_or_insert(now);
        let quiet_too_long = self
            .logged_at
            .is_some_and(|at| now.duration_since(at) >= Self::QUIET_AT_MOST);
        if !self.failures.is_power_of_two() && !quiet_too_long {
            return None;
        }
        self.logged_at = Some(now);
        Some(Run {
            failures: self.failures,
            lasting: now.duration_since(since),
        })
    }

    /// A success: `Some` (once) when failures came before it.
    pub fn succeeded(&mut self) -> Option<Run> {
        let since = self.since.take()?;
        let run = Run {
            failures: self.failures,
            lasting: since.elapsed(),
        };
        *self = Streak::default();
        Some(run)
    }
}

/// One watch's failures for its log: a [`Streak`] behind a lock (a watch's event handler is
/// shared by reference). Each failure worth a line is a warning naming the watch; the first
/// complete list after failures is one line saying so.
#[derive(Debug, Default)]
pub struct WatchFailures(Mutex<Streak>);

impl WatchFailures {
    /// A watch event was an error: logged when worth a line.
    pub fn failed(&self, watch: &str, error: &dyn std::fmt::Display) {
        let Some(run) = self.0.lock().ok().and_then(|mut s| s.failed()) else {
            return;
        };
        tracing::warn!(watch, %error, failures = run.failures, failing_for = ?run.lasting,
            "a watch failed; retrying with a growing delay");
    }

    /// One item of the watch: an error is a failure, a complete list the recovery.
    pub fn saw<K>(
        &self,
        watch: &str,
        item: &kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>,
    ) {
        match item {
            Err(e) => self.failed(watch, e),
            Ok(kube::runtime::watcher::Event::InitDone) => self.listed(watch),
            Ok(_) => {}
        }
    }

    /// The watch listed everything again (`Event::InitDone`): the recovery, once.
    pub fn listed(&self, watch: &str) {
        if let Some(run) = self.0.lock().ok().and_then(|mut s| s.succeeded()) {
            tracing::info!(watch, failures = run.failures, failed_for = ?run.lasting, "a watch works again");
        }
    }
}

/// Per-key retry delays: doubled at each failure in a row, reset on success, capped; a retry
/// is not due before its delay has passed.
#[derive(Clone, Default)]
pub struct Backoff {
    failures: Arc<Mutex<HashMap<String, (ExponentialBackoff, Instant)>>>,
}

impl Backoff {
    /// The delay before the next attempt after one more failure of `key`.
    pub fn next(&self, key: &str, base: Duration, cap: Duration) -> Duration {
        let Ok(mut m) = self.failures.lock() else {
            return base;
        };
        let (delays, due) = m
            .entry(key.to_string())
            .or_insert_with(|| (doubling(base, cap), Instant::now()));
        let delay = delays.next().unwrap_or(cap);
        *due = Instant::now() + delay;
        delay
    }

    /// What is left of `key`'s delay (None: no failure is waiting).
    pub fn remaining(&self, key: &str) -> Option<Duration> {
        let m = self.failures.lock().ok()?;
        let (_, at) = m.get(key)?;
        at.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
    }

    /// No failure of `key` is waiting out its delay.
    pub fn due(&self, key: &str) -> bool {
        self.remaining(key).is_none()
    }

    pub fn reset(&self, key: &str) {
        if let Ok(mut m) = self.failures.lock() {
            m.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_cap_and_start_again_after_a_success() {
        let b = Backoff::default();
        let (base, cap) = (Duration::from_secs(1), Duration::from_secs(5));
        let got: Vec<u64> = (0..5).map(|_| b.next("k", base, cap).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 5, 5]);
        assert!(!b.due("k"));
        b.reset("k");
        assert!(b.due("k"));
        assert_eq!(b.next("k", base, cap), base);
    }

    /// The calls kube's `StreamBackoff` makes on a watch that cannot list: `reset` on the
    /// `Ok(Init)` the watcher yields before each attempt, `next` on the attempt's error.
    fn failing_watch(
        b: &mut (impl kube::runtime::utils::Backoff + ?Sized),
        attempts: usize,
    ) -> Vec<Duration> {
        (0..attempts)
            .map(|_| {
                b.reset();
                b.next().expect("a delay")
            })
            .collect()
    }

    #[test]
    fn a_watch_that_keeps_failing_waits_longer_each_time_up_to_the_cap() {
        let delays = failing_watch(&mut watch(), 8);
        // Jitter adds up to one delay's worth: the k-th is at least 0.8 s × 2^k (to 30 s).
        for (k, d) in delays.iter().enumerate() {
            let floor = Duration::from_millis(800)
                .saturating_mul(1 << k)
                .min(Duration::from_secs(30));
            assert!(*d >= floor, "attempt {k}: {d:?} < {floor:?} ({delays:?})");
            assert!(*d < Duration::from_secs(60), "{delays:?}");
        }
        // kube's default under the same calls, for the record: it never grows.
        let kube_default = failing_watch(&mut kube::runtime::watcher::DefaultBackoff::default(), 8);
        assert!(
            kube_default.iter().all(|d| *d < Duration::from_millis(1600)),
            "{kube_default:?}"
        );
    }

    #[test]
    fn a_watch_that_settled_starts_again_from_the_shortest_delay() {
        use kube::runtime::utils::Backoff as _;
        let settle = Duration::from_millis(50);
        let mut b = WatchBackoff::new(Duration::from_millis(100), Duration::from_secs(30), settle);
        let grown = failing_watch(&mut b, 4);
        assert!(grown[3] >= Duration::from_millis(800), "{grown:?}");
        b.reset();
        std::thread::sleep(settle * 2);
        let again = b.next().expect("a delay");
        assert!(again < Duration::from_millis(200), "{again:?}");
    }

    #[test]
    fn a_streak_logs_the_1st_2nd_4th_8th_failures_and_the_recovery_once() {
        let mut s = Streak::default();
        assert_eq!(s.succeeded(), None, "no failure, nothing to say");
        let logged: Vec<u64> = (0..20).filter_map(|_| s.failed()).map(|r| r.failures).collect();
        assert_eq!(logged, [1, 2, 4, 8, 16]);
        let recovered = s.succeeded().expect("a recovery after failures");
        assert_eq!(recovered.failures, 20);
        assert_eq!(s.succeeded(), None, "said once");
        assert_eq!(s.failed().map(|r| r.failures), Some(1), "a new run");
    }
}
