//! Whether a window was captured, per tap (subscription, node, address): ADR-0062's
//! Consequences — completeness is true only for a captured window on a captured node, and every
//! answer says exactly where it holds, where the gaps are and what was estimated lost.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::store::reading::{CoverageSession, LossTally, TapIncarnation};

/// An open drain session confirmed this recently covers up to now (it confirms every few
/// seconds while alive); an older confirmation ends the coverage there: the drain went silent.
pub const LIVE_SLACK: Duration = Duration::seconds(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Window {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CoverageVerdict {
    /// Drained over the whole window and no loss counted in it: every message routed to the
    /// address on this node in the window is stored.
    Complete,
    /// Drained over part of the window only: messages routed in the gaps are not stored.
    Gaps,
    /// Drained over the whole window, but loss was counted in it (see `lost`).
    Lossy,
    /// A tap was there but never drained in the window: nothing routed here is stored.
    NotDrained,
}

impl CoverageVerdict {
    /// As printed and serialised.
    pub fn label(self) -> &'static str {
        match self {
            CoverageVerdict::Complete => "COMPLETE",
            CoverageVerdict::Gaps => "GAPS",
            CoverageVerdict::Lossy => "LOSSY",
            CoverageVerdict::NotDrained => "NOT_DRAINED",
        }
    }
}

/// Estimated loss of one cause at a tap (cumulative since the subscription began).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Loss {
    pub cause: String,
    pub messages: i64,
    /// When the operator last saw this count grow.
    pub last_grew_at: DateTime<Utc>,
    /// It grew at or after the window's start.
    pub in_window: bool,
    /// Which bound the count is (`exact`, `upperBound`, `lowerBound`); null: an estimate that
    /// claims neither.
    pub bound: Option<crate::store::captured::LossBound>,
}

/// The coverage of one tap over the window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TapCoverage {
    pub subscription: String,
    /// Logical node (broker node ID).
    pub node: String,
    pub address: String,
    pub verdict: CoverageVerdict,
    /// The parts of the window with no drain, oldest first.
    pub gaps: Vec<Window>,
    /// When the first drain in the window began (None: never drained in it).
    pub first_drained: Option<DateTime<Utc>>,
    pub lost: Vec<Loss>,
}

type TapKey = (String, String, String);
/// Drained intervals of one tap, clipped to the window.
type Intervals = Vec<(DateTime<Utc>, DateTime<Utc>)>;

fn key(sub: &str, node: &str, address: &str) -> TapKey {
    (sub.into(), node.into(), address.into())
}

/// Judge every tap seen in the window (installed, drained, or with loss counted).
pub fn assess(
    window: Window,
    now: DateTime<Utc>,
    sessions: &[CoverageSession],
    taps: &[TapIncarnation],
    losses: &[LossTally],
) -> Vec<TapCoverage> {
    let mut intervals = drained_intervals(window, now, sessions, taps);
    let mut lost = losses_by_tap(window, losses);
    for k in lost.keys() {
        intervals.entry(k.clone()).or_default();
    }
    intervals
        .into_iter()
        .map(|(k, mut list)| {
            list.sort();
            let lost = lost.remove(&k).unwrap_or_default();
            tap_coverage(window, k, &list, lost)
        })
        .collect()
}

/// Every installed or drained tap, with the parts of the window its drain sessions covered.
fn drained_intervals(
    window: Window,
    now: DateTime<Utc>,
    sessions: &[CoverageSession],
    taps: &[TapIncarnation],
) -> BTreeMap<TapKey, Intervals> {
    let mut intervals: BTreeMap<TapKey, Intervals> = BTreeMap::new();
    for t in taps {
        intervals
            .entry(key(&t.subscription, &t.node, &t.source_address))
            .or_default();
    }
    for s in sessions {
        let end = match s.ended_at {
            Some(end) => end,
            None if s.confirmed_until >= now - LIVE_SLACK => now.max(s.confirmed_until),
            None => s.confirmed_until,
        };
        let (start, end) = (s.started_at.max(window.from), end.min(window.to));
        let list = intervals
            .entry(key(&s.subscription, &s.node, &s.source_address))
            .or_default();
        if start < end {
            list.push((start, end));
        }
    }
    intervals
}

/// The loss counted at each tap, per cause, and whether it grew in the window.
fn losses_by_tap(window: Window, losses: &[LossTally]) -> BTreeMap<TapKey, Vec<Loss>> {
    let mut lost: BTreeMap<TapKey, Vec<Loss>> = BTreeMap::new();
    for l in losses {
        lost.entry(key(&l.subscription, &l.node, &l.source_address))
            .or_default()
            .push(Loss {
                cause: l.cause.clone(),
                messages: l.messages,
                last_grew_at: l.updated_at,
                in_window: l.updated_at >= window.from,
                bound: crate::store::captured::LossBound::from_db(l.bound.as_deref()),
            });
    }
    lost
}

/// The parts of the window no interval covers, oldest first (`drained` sorted by start).
fn gaps(window: Window, drained: &Intervals) -> Vec<Window> {
    let mut gaps = vec![];
    let mut cursor = window.from;
    for (start, end) in drained {
        if *start > cursor {
            gaps.push(Window {
                from: cursor,
                to: *start,
            });
        }
        cursor = cursor.max(*end);
    }
    if cursor < window.to {
        gaps.push(Window {
            from: cursor,
            to: window.to,
        });
    }
    gaps
}

/// One tap's verdict over the window from its sorted drained intervals and its loss.
fn tap_coverage(window: Window, k: TapKey, drained: &Intervals, lost: Vec<Loss>) -> TapCoverage {
    let gaps = gaps(window, drained);
    let verdict = if drained.is_empty() {
        CoverageVerdict::NotDrained
    } else if !gaps.is_empty() {
        CoverageVerdict::Gaps
    } else if lost.iter().any(|l| l.in_window) {
        CoverageVerdict::Lossy
    } else {
        CoverageVerdict::Complete
    };
    TapCoverage {
        subscription: k.0,
        node: k.1,
        address: k.2,
        verdict,
        gaps,
        first_drained: drained.first().map(|(start, _)| *start),
        lost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).expect("time")
    }

    fn session(node: &str, start: i64, confirmed: i64, ended: Option<i64>) -> CoverageSession {
        CoverageSession {
            subscription: "s".into(),
            node: node.into(),
            source_address: "a".into(),
            started_at: t(start),
            confirmed_until: t(confirmed),
            ended_at: ended.map(t),
        }
    }

    fn tap(node: &str) -> TapIncarnation {
        TapIncarnation {
            subscription: "s".into(),
            node: node.into(),
            source_address: "a".into(),
            installed_at: t(0),
            removed_at: None,
        }
    }

    #[test]
    fn a_live_drain_over_the_whole_window_is_complete() {
        let w = Window {
            from: t(100),
            to: t(200),
        };
        let c = assess(w, t(200), &[session("n1", 50, 195, None)], &[tap("n1")], &[]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].verdict, CoverageVerdict::Complete);
        assert!(c[0].gaps.is_empty());
    }

    #[test]
    fn a_restart_between_sessions_is_a_gap_and_a_silent_drain_ends_at_its_last_confirmation() {
        let w = Window {
            from: t(100),
            to: t(300),
        };
        let sessions = [session("n1", 50, 150, Some(150)), session("n1", 180, 220, None)];
        let c = assess(w, t(300), &sessions, &[tap("n1")], &[]);
        assert_eq!(c[0].verdict, CoverageVerdict::Gaps);
        assert_eq!(
            c[0].gaps,
            vec![
                Window {
                    from: t(150),
                    to: t(180)
                },
                Window {
                    from: t(220),
                    to: t(300)
                }
            ],
            "the second drain last confirmed 80 s ago: silent since"
        );
    }

    #[test]
    fn an_installed_tap_never_drained_is_not_drained_and_loss_in_the_window_makes_it_lossy() {
        let w = Window {
            from: t(100),
            to: t(200),
        };
        let loss = LossTally {
            subscription: "s".into(),
            node: "n1".into(),
            source_address: "a".into(),
            cause: "ring_overwrite".into(),
            messages: 7,
            updated_at: t(150),
            bound: None,
        };
        let c = assess(
            w,
            t(200),
            &[session("n1", 0, 199, None)],
            &[tap("n1"), tap("n2")],
            std::slice::from_ref(&loss),
        );
        assert_eq!(c[0].verdict, CoverageVerdict::Lossy);
        assert!(c[0].lost[0].in_window);
        assert_eq!(c[1].node, "n2");
        assert_eq!(c[1].verdict, CoverageVerdict::NotDrained);
        // Loss that stopped growing before the window does not taint it.
        let old = LossTally {
            updated_at: t(50),
            ..loss
        };
        let c = assess(w, t(200), &[session("n1", 0, 199, None)], &[tap("n1")], &[old]);
        assert_eq!(c[0].verdict, CoverageVerdict::Complete);
        assert!(!c[0].lost[0].in_window);
    }
}
