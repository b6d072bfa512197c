//! Supervised drains (issue 42): a drain whose task ended without being stopped — it panicked,
//! or it returned — has died. The death is logged and counted when it happens
//! (`capture_drain_restarts_total`), its taps' status says so until it runs again, and the next
//! converge restarts it after a backoff that doubles with each death in a row, from
//! [`RESTART_FIRST`] to [`RESTART_MAX`], and starts from the first again once a drain has run
//! [`RAN_A_WHILE`]. A drain stopped on purpose ([`DrainHandle::stop`]) has not died.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{DrainHandle, DrainHealth, DrainKey};

/// The backoff after a first death.
pub const RESTART_FIRST: Duration = Duration::from_secs(1);
/// The longest backoff, however many deaths in a row.
pub const RESTART_MAX: Duration = Duration::from_secs(60);
/// A drain that ran this long before it died counts as a first death again.
pub const RAN_A_WHILE: Duration = Duration::from_secs(60);

/// How a drain's task ended when nobody stopped it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeathCause {
    /// With the panic's message when it was a literal (`panic!("…")`): a formatted message may
    /// quote what the drain was handling (a captured copy), so it is never shown.
    Panicked(Option<&'static str>),
    /// The task returned while not asked to stop.
    Returned,
}

impl DeathCause {
    /// The cause of a panic, from its payload.
    pub fn of_panic(payload: &(dyn std::any::Any + Send)) -> Self {
        DeathCause::Panicked(payload.downcast_ref::<&'static str>().copied())
    }

    /// One word, for a log field.
    pub fn kind(&self) -> &'static str {
        match self {
            DeathCause::Panicked(_) => "panicked",
            DeathCause::Returned => "returned",
        }
    }
}

impl std::fmt::Display for DeathCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeathCause::Panicked(Some(message)) => write!(f, "it panicked: {message}"),
            DeathCause::Panicked(None) => {
                write!(
                    f,
                    "it panicked (the message is not shown: it may quote captured data)"
                )
            }
            DeathCause::Returned => write!(f, "its task ended without being stopped"),
        }
    }
}

/// A drain's death.
#[derive(Clone, Debug)]
pub struct Death {
    pub at: Instant,
    /// `at` on the wall clock, for status (a fixed instant: the message does not change from
    /// pass to pass).
    pub at_wall: chrono::DateTime<chrono::Utc>,
    /// How long the drain had run (from its start, after any backoff, to its death).
    pub ran_for: Duration,
    pub cause: DeathCause,
}

/// When a drain starts: at once (a first start, `Restart::default()`), or after a death.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restart {
    /// Deaths in a row, the last one included (0: not a restart).
    pub deaths_in_a_row: u32,
    /// The backoff those deaths earn, counted from the last one.
    pub backoff: Duration,
    /// What is left of it now: how long the new drain waits before it runs.
    pub wait: Duration,
}

/// The backoff after `deaths_in_a_row` deaths: [`RESTART_FIRST`] doubling to [`RESTART_MAX`].
pub fn backoff(deaths_in_a_row: u32) -> Duration {
    let nth = deaths_in_a_row.saturating_sub(1).min(16) as usize;
    crate::backoff::doubling(RESTART_FIRST, RESTART_MAX)
        .nth(nth)
        .unwrap_or(RESTART_MAX)
}

/// The restart of a drain that died after running `ran_for`, `dead_for` ago, with
/// `deaths_before` deaths in a row before this one (pure: the whole decision).
pub fn restart_after(deaths_before: u32, ran_for: Duration, dead_for: Duration) -> Restart {
    let deaths_in_a_row = if ran_for >= RAN_A_WHILE {
        1
    } else {
        deaths_before.saturating_add(1)
    };
    let backoff = backoff(deaths_in_a_row);
    Restart {
        deaths_in_a_row,
        backoff,
        wait: backoff.saturating_sub(dead_for),
    }
}

/// A death, when it happens: logged (no payload) and counted.
pub fn record_death(
    key: &DrainKey,
    subscription: &str,
    death: &Death,
    metrics: &crate::telemetry::capture::CaptureMetrics,
) {
    tracing::error!(
        cluster = %key.cluster,
        subscription,
        node = %key.node,
        queue = %key.capture_queue,
        cause = death.cause.kind(),
        detail = %death.cause,
        ran_for_ms = death.ran_for.as_millis() as u64,
        "capture drain died; the next capture pass restarts it"
    );
    let labels = crate::telemetry::capture::SubscriptionLabels {
        cluster: key.cluster.clone(),
        subscription: subscription.to_string(),
    };
    metrics.drain_restarts.get_or_create(&labels).inc();
}

/// Take the drains whose task has ended out of `drains`: each death with the restart it earns
/// (a drain that ended because it was stopped has none).
pub async fn take_ended(
    drains: &mut BTreeMap<DrainKey, DrainHandle>,
) -> BTreeMap<DrainKey, (Death, Restart)> {
    let ended: Vec<DrainKey> = drains
        .iter()
        .filter(|(_, h)| h.has_ended())
        .map(|(k, _)| k.clone())
        .collect();
    let mut deaths = BTreeMap::new();
    for k in ended {
        let Some(h) = drains.remove(&k) else {
            continue;
        };
        let before = h.deaths_in_a_row();
        if let Some(death) = h.death().await {
            let restart = restart_after(before, death.ran_for, death.at.elapsed());
            deaths.insert(k, (death, restart));
        }
    }
    deaths
}

/// How the drain `key` of `subscription` starts: at once, or, after `dead`, when its backoff
/// ends — which its health says meanwhile (the death is in status until the drain runs again).
/// A restart due now starts like a first start: its pass's report waits for it to connect.
pub fn restart_of(
    health: &DrainHealth,
    key: &DrainKey,
    subscription: &str,
    dead: Option<(Death, Restart)>,
) -> Restart {
    let Some((death, restart)) = dead else {
        return Restart::default();
    };
    tracing::warn!(
        cluster = %key.cluster,
        subscription,
        node = %key.node,
        queue = %key.capture_queue,
        deaths_in_a_row = restart.deaths_in_a_row,
        backoff_ms = restart.backoff.as_millis() as u64,
        wait_ms = restart.wait.as_millis() as u64,
        "capture drain restarted after its backoff"
    );
    if restart.wait.is_zero() {
        health.forget(key);
    } else {
        let at = death.at_wall + chrono::Duration::from_std(restart.backoff).unwrap_or_default();
        health.restarts_at(key, &death, &restart, at);
    }
    restart
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_backoff_doubles_per_death_in_a_row_up_to_a_minute() {
        let got: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX), RESTART_MAX, "no overflow however many");
    }

    #[test]
    fn deaths_in_a_row_grow_the_backoff_and_a_drain_that_ran_a_while_starts_again_from_the_first() {
        // Dies at once, again and again: 1 s, 2 s, 4 s …
        let mut deaths = 0;
        let mut waits = vec![];
        for _ in 0..4 {
            let r = restart_after(deaths, S(0), S(0));
            deaths = r.deaths_in_a_row;
            waits.push(r.wait.as_secs());
        }
        assert_eq!(waits, [1, 2, 4, 8]);
        assert_eq!(deaths, 4);
        // A drain that ran a while before it died is a first death again.
        let r = restart_after(deaths, RAN_A_WHILE, S(0));
        assert_eq!((r.deaths_in_a_row, r.backoff), (1, RESTART_FIRST));
        // One that ran less does not reset the run.
        let r = restart_after(deaths, RAN_A_WHILE - S(1), S(0));
        assert_eq!((r.deaths_in_a_row, r.backoff), (5, S(16)));
    }

    #[test]
    fn the_wait_is_what_is_left_of_the_backoff_since_the_death() {
        let r = restart_after(2, S(0), S(1));
        assert_eq!((r.deaths_in_a_row, r.backoff, r.wait), (3, S(4), S(3)));
        // Found dead longer ago than its backoff (passes are seconds apart): restarted now.
        let r = restart_after(0, S(5), S(30));
        assert_eq!((r.deaths_in_a_row, r.backoff, r.wait), (1, S(1), S(0)));
        assert_eq!(Restart::default().wait, S(0), "a first start waits for nothing");
    }

    #[test]
    fn a_panic_message_is_shown_only_when_it_is_a_literal() {
        let literal: Box<dyn std::any::Any + Send> = Box::new("no credit");
        assert_eq!(
            DeathCause::of_panic(literal.as_ref()).to_string(),
            "it panicked: no credit"
        );
        let formatted: Box<dyn std::any::Any + Send> = Box::new(String::from("body `secret` is bad"));
        let shown = DeathCause::of_panic(formatted.as_ref()).to_string();
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.starts_with("it panicked"), "{shown}");
    }
}
