//! Retry delays, one way for every retry: a controller's per-object retries after failed
//! reconciles (or failed nodes) and a capture drain's reconnects. Doubling from a base to a
//! cap, by `backon`'s exponential backoff.

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
}
