//! The per-node request budget: how many Jolokia POSTs the operator (all its controllers and
//! capture) may have in flight to one endpoint, and how often it may start one, adapted to how
//! the node answers.
//!
//! Why: every reconcile (one per ArtemisQueue, up to thousands) talks to the same few brokers.
//! Unbounded, the operator's own traffic was measured collapsing a 2-core broker (load 18,
//! 5 s timeouts), and each timeout made a reconcile retry: the slower the node, the more we sent.
//! The budget inverts that: a slow node gets *less* traffic.
//!
//! The rule (AIMD, as TCP congestion control):
//! - at most `floor(limit)` POSTs in flight to a node (starting at [`MAX_IN_FLIGHT`]) and POST
//!   starts spaced by `1/rate` (starting at [`MAX_POSTS_PER_SECOND`], bursts up to the
//!   permitted concurrency);
//! - every answer updates an EWMA of POST latency ([`EWMA_WEIGHT`]); a timeout counts as a
//!   sample equal to the request timeout;
//! - **decrease** (× [`DECREASE_FACTOR`], never below [`MIN_IN_FLIGHT`] and
//!   [`MIN_POSTS_PER_SECOND`]) on a timeout, or when the EWMA exceeds [`SLOW_FRACTION`] of the
//!   request timeout; only POSTs started after the previous decrease can decrease again (one
//!   cut per round trip, not one per answer of the same slow round);
//! - **increase** slowly (+[`CONCURRENCY_INCREASE_PER_ROUND`] per round of answers, +
//!   [`RATE_INCREASE_PER_ANSWER`] posts/s per answer) only while the EWMA is below
//!   [`RECOVER_FRACTION`] of the timeout; between the two fractions nothing changes;
//! - a connection refused is not a load signal: no change.
//!
//! Beside how fast a node answers, the budget judges *whether* it answers ([`Health`]): a node
//! that leaves POSTs unanswered for [`HUNG_AFTER_MIN`] (or longer, for a node whose answers are
//! slow anyway) with no answer to anything since, or whose POSTs time out with no answer since
//! they were sent, is **not answering**. While it is, no call waits on it: new calls fail at
//! once with [`super::error::BrokerError::NotAnswering`] (nothing sent), calls waiting on the wire are let go
//! (their POST goes on in the background), and one probe at a time — the topology poll's read,
//! sent only when nothing else is on the wire — finds out when it answers again; the first
//! answer to anything clears the judgement. Why: a frozen node (SIGSTOP, a long GC pause, a hung
//! management thread) used to hold every reconcile that wrote to it for a full request timeout
//! (issue 41: one frozen node kept 500 creates from being Ready for 32 s). Timeouts and answers of
//! POSTs that were on the wire during a silence say nothing about load: the AIMD rule ignores
//! them, so a node that comes back gets its full budget at once.
//!
//! The budgets live in the operator's [`super::registry::Registry`] (one per operator, shared by
//! all its clients), keyed by the endpoint URL without user info ([`node_key`]); the batchers
//! (`super::batch`) are kept there too, keyed by [`BatchKey`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::error::NotAnswering;
use crate::telemetry::jolokia::{JolokiaMetrics, NodeLabels};

/// POSTs in flight to one endpoint from the whole process when the node answers quickly. Four
/// keeps a 2-core broker's Jetty and management thread busy without queueing behind us; with
/// batching, four POSTs carry up to 4 × `MAX_BATCH` operations.
pub const MAX_IN_FLIGHT: usize = 4;
/// The floor under backoff: one POST at a time (the operator never stops talking to a node).
pub const MIN_IN_FLIGHT: usize = 1;
/// POST starts per second to one endpoint when the node answers quickly.
pub const MAX_POSTS_PER_SECOND: f64 = 50.0;
/// The floor of the POST rate under backoff.
pub const MIN_POSTS_PER_SECOND: f64 = 1.0;
/// A node is slow when the latency EWMA exceeds this fraction of the request timeout.
pub const SLOW_FRACTION: f64 = 0.5;
/// The budget recovers only while the latency EWMA is below this fraction of the request timeout.
pub const RECOVER_FRACTION: f64 = 0.25;
/// Weight of the newest sample in the latency EWMA.
pub const EWMA_WEIGHT: f64 = 0.3;
/// Multiplicative decrease of both the permitted concurrency and the rate.
pub const DECREASE_FACTOR: f64 = 0.5;
/// Permitted concurrency gained per round of fast answers (a round = as many answers as POSTs
/// permitted): from 1 back to 4 takes about a dozen fast answers.
pub const CONCURRENCY_INCREASE_PER_ROUND: f64 = 0.5;
/// POSTs per second gained per fast answer.
pub const RATE_INCREASE_PER_ANSWER: f64 = 2.0;

/// A node with POSTs on the wire and no answer to anything for this long is not answering: long
/// enough for a busy broker's slowest ordinary POST (64 creates in bulk ≈ 0.4 s, an inventory
/// scrape of 10,000 queues ≈ 1 s), short next to a request timeout (5–30 s).
pub const HUNG_AFTER_MIN: Duration = Duration::from_secs(3);
/// A node whose answers are slow anyway is judged only after this many times its slowest recent
/// answer: a legitimately long POST (a big scrape) is not a silence.
pub const HUNG_FACTOR: f64 = 2.0;
/// The slowest recent answer halves every this long: one long answer an hour ago does not slow
/// down the judgement of a node that answers quickly now.
pub const SLOWEST_HALF_LIFE: Duration = Duration::from_secs(120);

/// A judgement with nothing on the wire to the node and no timeout for this long has no evidence
/// left (its POSTs were abandoned, or the last probe timed out long ago): it is forgotten, and the
/// next call finds out again (let go within [`HUNG_AFTER_MIN`] if the node is still silent).
/// Longer than a poll interval: while the cluster is polled, each poll's probe keeps a hung
/// node's evidence fresh.
pub const EVIDENCE_TTL: Duration = Duration::from_secs(20);

/// Who asks for a POST: what happens when the node is judged not answering.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum Purpose {
    /// A command's or a reader's call: fails at once while the node is not answering, and is let
    /// go unanswered when the node is judged while it waits.
    #[default]
    Work,
    /// The topology poll's reads: the one probe that may go to a node judged not answering (when
    /// nothing else is on the wire), and waits for its own answer or timeout.
    Probe,
}

/// What one POST told the budget about the node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Observation {
    /// The node answered (whatever it said) after this long.
    Answered(Duration),
    /// No answer within the request timeout.
    TimedOut,
    /// No connection (refused, DNS): not a load signal.
    NoAnswer,
}

/// The AIMD controller: pure, so its rule is unit-tested without time passing.
#[derive(Clone, Debug)]
pub struct Aimd {
    /// Permitted concurrency, fractional; `floor` is what is granted.
    limit: f64,
    /// POST starts per second.
    rate: f64,
    /// Smoothed POST latency, seconds.
    ewma: Option<f64>,
    last_decrease: Option<Instant>,
}

impl Default for Aimd {
    fn default() -> Self {
        Aimd {
            limit: MAX_IN_FLIGHT as f64,
            rate: MAX_POSTS_PER_SECOND,
            ewma: None,
            last_decrease: None,
        }
    }
}

impl Aimd {
    pub fn permitted(&self) -> usize {
        (self.limit.floor() as usize).clamp(MIN_IN_FLIGHT, MAX_IN_FLIGHT)
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn latency_ewma(&self) -> Option<Duration> {
        self.ewma.map(Duration::from_secs_f64)
    }

    /// Feed one POST's outcome (it started at `started`; `timeout` is its request timeout).
    /// Returns true when the budget backed off.
    pub fn observe(
        &mut self,
        started: Instant,
        observation: Observation,
        timeout: Duration,
        now: Instant,
    ) -> bool {
        let t = timeout.as_secs_f64().max(0.001);
        let sample = match observation {
            Observation::NoAnswer => return false,
            Observation::TimedOut => t,
            Observation::Answered(d) => d.as_secs_f64(),
        };
        let ewma = match self.ewma {
            None => sample,
            Some(prev) => EWMA_WEIGHT * sample + (1.0 - EWMA_WEIGHT) * prev,
        };
        self.ewma = Some(ewma);
        let slow = observation == Observation::TimedOut || ewma > SLOW_FRACTION * t;
        if slow {
            // One cut per round: answers to POSTs sent before the last cut already had their say.
            if self.last_decrease.is_some_and(|d| started < d) {
                return false;
            }
            self.limit = (self.limit * DECREASE_FACTOR).max(MIN_IN_FLIGHT as f64);
            self.rate = (self.rate * DECREASE_FACTOR).max(MIN_POSTS_PER_SECOND);
            self.last_decrease = Some(now);
            return true;
        }
        if ewma < RECOVER_FRACTION * t {
            let round = self.limit.floor().max(1.0);
            self.limit = (self.limit + CONCURRENCY_INCREASE_PER_ROUND / round).min(MAX_IN_FLIGHT as f64);
            self.rate = (self.rate + RATE_INCREASE_PER_ANSWER).min(MAX_POSTS_PER_SECOND);
        }
        false
    }
}

/// A silence the budget judged: since when the node left POSTs unanswered.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Silence {
    since: Instant,
    since_utc: chrono::DateTime<chrono::Utc>,
}

/// Whether a node answers at all (how fast is [`Aimd`]'s business), judged from the POSTs of the
/// whole process: pure, so the rule is unit-tested with time injected.
///
/// The rule: the node is **not answering** once a POST timed out with no answer to anything
/// since it was sent, or once POSTs have been on the wire for [`Health::hung_after`] while
/// nothing at all was answered. The judgement holds until the node answers anything (a probe,
/// or a late answer to a POST it had left waiting).
#[derive(Clone, Debug, Default)]
pub struct Health {
    /// When each POST now on the wire went out.
    on_wire: Vec<Instant>,
    last_answer: Option<Instant>,
    /// The slowest recent answer and when it was seen (decays by [`SLOWEST_HALF_LIFE`]).
    slowest: Option<(Duration, Instant)>,
    /// POSTs that timed out since the last answer, none answered after it was sent; and the
    /// earliest of them went out at `timed_out_since`.
    timed_out: u32,
    timed_out_since: Option<Instant>,
    /// When the last of those timeouts was seen.
    last_timeout: Option<Instant>,
    silence: Option<Silence>,
    /// When the last silence ended: a POST sent before then was on the wire during it.
    last_recovery: Option<Instant>,
    /// Silences judged so far: a poll tells one that came and went since the previous poll.
    silences: u64,
}

/// What one POST's end did to the judgement.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Judged {
    /// The node answered and had been judged not answering.
    pub recovered: bool,
    /// The POST's latency or timeout is evidence of load (it did not overlap a silence).
    pub counts_for_load: bool,
}

impl Health {
    /// A POST went on the wire at `at`.
    pub fn sent(&mut self, at: Instant) {
        self.on_wire.push(at);
    }

    /// The POST that went out at `started` is off the wire (answered, failed or abandoned).
    pub fn ended(&mut self, started: Instant) {
        if let Some(i) = self.on_wire.iter().position(|t| *t == started) {
            self.on_wire.swap_remove(i);
        }
    }

    /// How long POSTs may wait with no answer to anything before the node is judged: at least
    /// [`HUNG_AFTER_MIN`], and [`HUNG_FACTOR`] times the slowest recent answer.
    pub fn hung_after(&self, now: Instant) -> Duration {
        let slowest = self.slowest.map_or(0.0, |(d, at)| {
            let age = now.saturating_duration_since(at).as_secs_f64();
            d.as_secs_f64() * 0.5f64.powf(age / SLOWEST_HALF_LIFE.as_secs_f64())
        });
        HUNG_AFTER_MIN.max(Duration::from_secs_f64(HUNG_FACTOR * slowest))
    }

    /// Feed one POST's end (it went out at `started`; `ended` was called for it already).
    pub fn observe(
        &mut self,
        started: Instant,
        observation: Observation,
        now: Instant,
        wall: chrono::DateTime<chrono::Utc>,
    ) -> Judged {
        let mut judged = Judged::default();
        match observation {
            Observation::Answered(latency) => {
                if self.silence.take().is_some() {
                    self.last_recovery = Some(now);
                    judged.recovered = true;
                }
                judged.counts_for_load = !self.overlapped_a_silence(started);
                if judged.counts_for_load {
                    self.note_latency(latency, now);
                }
                self.last_answer = Some(now);
                self.timed_out = 0;
                self.timed_out_since = None;
                self.last_timeout = None;
            }
            Observation::TimedOut if self.last_answer.is_some_and(|a| a > started) => {
                // Other POSTs were answered meanwhile: a slow node, not a silent one.
                judged.counts_for_load = !self.overlapped_a_silence(started);
            }
            Observation::TimedOut => {
                self.timed_out += 1;
                self.last_timeout = Some(now);
                self.timed_out_since = Some(self.timed_out_since.map_or(started, |t| t.min(started)));
                self.judge(now, wall);
            }
            Observation::NoAnswer => judged.counts_for_load = true,
        }
        judged
    }

    /// Sent before the last silence ended, or during the current one.
    fn overlapped_a_silence(&self, started: Instant) -> bool {
        self.silence.is_some() || self.last_recovery.is_some_and(|r| started < r)
    }

    fn note_latency(&mut self, latency: Duration, now: Instant) {
        let decayed = self.slowest.map_or(Duration::ZERO, |(d, at)| {
            let age = now.saturating_duration_since(at).as_secs_f64();
            d.mul_f64(0.5f64.powf(age / SLOWEST_HALF_LIFE.as_secs_f64()))
        });
        self.slowest = Some((latency.max(decayed), now));
    }

    /// When the node's silence began, if it is one: the oldest POST it left unanswered, or its
    /// last answer if that came later.
    fn silent_from(&self) -> Option<Instant> {
        let oldest = self.on_wire.iter().min().copied();
        let unanswered = match (oldest, self.timed_out_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(self.last_answer.map_or(unanswered, |a| a.max(unanswered)))
    }

    /// The judgement at `now` (latched: it holds until the node answers). `wall` is the wall
    /// clock at `now`, for the evidence's timestamp.
    pub fn judge(&mut self, now: Instant, wall: chrono::DateTime<chrono::Utc>) -> Option<NotAnswering> {
        self.forget_stale(now);
        if self.silence.is_none() {
            let since = self.silent_from()?;
            let waited = now.saturating_duration_since(since);
            if self.timed_out == 0 && waited < self.hung_after(now) {
                return None;
            }
            let since_utc = chrono::Duration::from_std(waited)
                .ok()
                .and_then(|w| wall.checked_sub_signed(w))
                .unwrap_or(wall);
            self.silence = Some(Silence { since, since_utc });
            self.silences += 1;
        }
        self.silence.map(|s| NotAnswering {
            sent: false,
            timed_out: self.timed_out,
            unanswered: self.on_wire.len(),
            since: s.since_utc,
        })
    }

    /// Nothing on the wire and no timeout within [`EVIDENCE_TTL`]: no evidence is left, the
    /// node is not known to be silent any more.
    fn forget_stale(&mut self, now: Instant) {
        let stale = self.on_wire.is_empty()
            && self
                .last_timeout
                .is_none_or(|t| now.saturating_duration_since(t) >= EVIDENCE_TTL);
        if stale {
            self.silence = None;
            self.timed_out = 0;
            self.timed_out_since = None;
            self.last_timeout = None;
        }
    }

    /// When the judgement may change if nothing else happens (None: only an event changes it).
    pub fn next_check(&self, now: Instant) -> Option<Instant> {
        if self.silence.is_some() {
            return None;
        }
        let since = self.silent_from()?;
        Some((since + self.hung_after(now)).max(now))
    }

    /// Whether a probe may go out to a node judged not answering: nothing else is on the wire
    /// (a POST on the wire is a probe already: its answer clears the judgement).
    pub fn may_probe(&self) -> bool {
        self.on_wire.is_empty()
    }

    /// Silences judged so far.
    pub fn silences(&self) -> u64 {
        self.silences
    }
}

struct State {
    aimd: Aimd,
    /// Slots taken against the permitted concurrency (waiting for a rate slot, or sending).
    reserved: usize,
    /// POSTs on the wire.
    in_flight: usize,
    max_in_flight: usize,
    /// Rate limiting (GCRA): the theoretical time of the next POST start.
    next_start: Instant,
    posts: u64,
    backoffs: u64,
    health: Health,
}

/// The budget of one node (endpoint), shared by every client and controller of the process.
pub struct NodeBudget {
    node: String,
    metrics: Arc<JolokiaMetrics>,
    state: Mutex<State>,
    changed: Notify,
}

impl std::fmt::Debug for NodeBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBudget")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// A snapshot of one node's budget, for tests and diagnostics.
#[derive(Clone, Debug)]
pub struct NodeStats {
    pub permitted: usize,
    pub rate: f64,
    pub in_flight: usize,
    /// The most POSTs ever on the wire at once to this node.
    pub max_in_flight: usize,
    pub posts: u64,
    pub backoffs: u64,
    pub latency_ewma: Option<Duration>,
    /// The judgement that the node does not answer, while it stands.
    pub not_answering: Option<NotAnswering>,
    /// Silences judged so far.
    pub silences: u64,
}

impl NodeBudget {
    pub(crate) fn new(node: String, metrics: Arc<JolokiaMetrics>) -> Self {
        let aimd = Aimd::default();
        metrics
            .permitted_concurrency
            .get_or_create(&NodeLabels { node: node.clone() })
            .set(aimd.permitted() as i64);
        NodeBudget {
            node,
            metrics,
            state: Mutex::new(State {
                aimd,
                reserved: 0,
                in_flight: 0,
                max_in_flight: 0,
                next_start: Instant::now(),
                posts: 0,
                backoffs: 0,
                health: Health::default(),
            }),
            changed: Notify::new(),
        }
    }

    /// The node this budget is for (its endpoint URL without user info): the metrics' label.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent under a panic elsewhere (every update is a few assignments).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn stats(&self) -> NodeStats {
        let not_answering = self.not_answering();
        let s = self.lock();
        NodeStats {
            permitted: s.aimd.permitted(),
            rate: s.aimd.rate(),
            in_flight: s.in_flight,
            max_in_flight: s.max_in_flight,
            posts: s.posts,
            backoffs: s.backoffs,
            latency_ewma: s.aimd.latency_ewma(),
            not_answering,
            silences: s.health.silences(),
        }
    }

    /// The judgement now, and when it may change if nothing else happens. A silence judged
    /// here for the first time is logged once.
    fn judge(&self, s: &mut State, now: Instant) -> (Option<NotAnswering>, Option<Instant>) {
        let before = s.health.silences();
        let judged = s.health.judge(now, chrono::Utc::now());
        if let Some(e) = judged.as_ref().filter(|_| s.health.silences() > before) {
            tracing::warn!(node = %self.node, evidence = %e.evidence(), "jolokia: the node does not answer; calls to it fail at once until it answers again");
        }
        (judged, s.health.next_check(now))
    }

    /// The node is judged not answering now: the evidence.
    pub fn not_answering(&self) -> Option<NotAnswering> {
        let mut s = self.lock();
        self.judge(&mut s, Instant::now()).0
    }

    /// Silences judged so far (a poll compares it with the count it saw before).
    pub fn silences(&self) -> u64 {
        self.lock().health.silences()
    }

    /// Resolves when the node is judged not answering (at once if it is).
    pub async fn until_not_answering(&self) -> NotAnswering {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let recheck = {
                let mut s = self.lock();
                match self.judge(&mut s, Instant::now()) {
                    (Some(e), _) => return e,
                    (None, recheck) => recheck,
                }
            };
            wait(notified, recheck).await;
        }
    }

    /// A slot if the permitted concurrency has one: the time the POST may start (rate).
    fn try_reserve(&self, s: &mut State, now: Instant) -> Option<Instant> {
        let permitted = s.aimd.permitted();
        if s.reserved >= permitted {
            return None;
        }
        let interval = Duration::from_secs_f64(1.0 / s.aimd.rate().max(MIN_POSTS_PER_SECOND));
        let tolerance = interval * (permitted as u32 - 1);
        let earliest = s.next_start.checked_sub(tolerance).unwrap_or(now);
        let start = earliest.max(now);
        s.next_start = s.next_start.max(start) + interval;
        s.reserved += 1;
        Some(start)
    }

    /// What `acquire` may do now: go at a time (a slot), go now as the probe, fail, or wait
    /// (until a change, or the time the judgement may change).
    fn admit(&self, purpose: Purpose, now: Instant) -> Admission {
        let mut s = self.lock();
        let (judged, recheck) = self.judge(&mut s, now);
        match judged {
            Some(_) if purpose == Purpose::Probe && s.health.may_probe() => {
                // The probe: past the AIMD limits (nothing is on the wire), on the wire now,
                // under this lock so no second probe sees the wire empty.
                s.reserved += 1;
                s.in_flight += 1;
                s.posts += 1;
                s.max_in_flight = s.max_in_flight.max(s.in_flight);
                s.health.sent(now);
                Admission::Probe
            }
            Some(e) => Admission::Refused(e),
            None => match self.try_reserve(&mut s, now) {
                Some(start) => Admission::At(start),
                None => Admission::Wait(recheck),
            },
        }
    }

    /// Permission to send one POST to this node: waits for a slot of the budget, or fails at
    /// once with the evidence while the node is judged not answering (a [`Purpose::Probe`] goes
    /// when nothing else is on the wire).
    pub async fn acquire(self: &Arc<Self>, purpose: Purpose) -> Result<Permit, NotAnswering> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = Instant::now();
            let recheck = match self.admit(purpose, now) {
                Admission::Refused(e) => return Err(e),
                Admission::Probe => return Ok(self.permit(true, now)),
                Admission::At(start) => {
                    let mut permit = self.permit(false, now);
                    // A slot free now goes now: a sleep until now still waits for the timer's
                    // next tick, up to a millisecond more on every POST (issue 45).
                    if start > Instant::now() {
                        tokio::time::sleep_until(start).await;
                    }
                    // Judged while this one waited for its rate slot: it is not sent.
                    if purpose == Purpose::Work
                        && let Some(e) = self.not_answering()
                    {
                        return Err(e);
                    }
                    permit.start();
                    return Ok(permit);
                }
                Admission::Wait(recheck) => recheck,
            };
            wait(notified, recheck).await;
        }
    }

    fn permit(self: &Arc<Self>, on_wire: bool, now: Instant) -> Permit {
        Permit {
            budget: self.clone(),
            on_wire,
            released: false,
            started: now,
        }
    }

    fn release(&self, on_wire: bool, started: Instant, outcome: Option<(Observation, Duration)>) {
        let node = NodeLabels {
            node: self.node.clone(),
        };
        let now = Instant::now();
        let (permitted, in_flight, backed_off, recovered) = {
            let mut s = self.lock();
            s.reserved = s.reserved.saturating_sub(1);
            if on_wire {
                s.in_flight = s.in_flight.saturating_sub(1);
                s.health.ended(started);
            }
            let (backed_off, recovered) = match outcome {
                Some((observation, timeout)) => {
                    let judged = s.health.observe(started, observation, now, chrono::Utc::now());
                    let cut = judged.counts_for_load && s.aimd.observe(started, observation, timeout, now);
                    (cut, judged.recovered)
                }
                None => (false, false),
            };
            if backed_off {
                s.backoffs += 1;
            }
            (s.aimd.permitted(), s.in_flight, backed_off, recovered)
        };
        let m = &self.metrics;
        m.permitted_concurrency.get_or_create(&node).set(permitted as i64);
        m.in_flight.get_or_create(&node).set(in_flight as i64);
        if backed_off {
            m.backoffs.get_or_create(&node).inc();
            tracing::info!(node = %self.node, permitted, "jolokia: the node answers slowly; backing off");
        }
        if recovered {
            tracing::info!(node = %self.node, "jolokia: the node answers again");
        }
        self.changed.notify_waiters();
    }
}

/// What `acquire` may do now.
enum Admission {
    /// Take a slot; the POST may start at this time (rate).
    At(Instant),
    /// Go now as the probe of a node judged not answering.
    Probe,
    /// Fail: the node is judged not answering.
    Refused(NotAnswering),
    /// No slot: wait for a change, or until this time (the judgement may change then).
    Wait(Option<Instant>),
}

/// Wait for `notified`, or until `until` when there is one.
async fn wait(notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>, until: Option<Instant>) {
    match until {
        Some(t) => {
            let _ = tokio::time::timeout_at(t, notified).await;
        }
        None => notified.await,
    }
}

/// Permission to have one POST in flight. Report how it went with [`Permit::finish`]; a permit
/// dropped without (a cancelled caller) only frees its slot.
pub struct Permit {
    budget: Arc<NodeBudget>,
    on_wire: bool,
    released: bool,
    started: Instant,
}

impl Permit {
    fn start(&mut self) {
        let now = Instant::now();
        let in_flight = {
            let mut s = self.budget.lock();
            s.in_flight += 1;
            s.posts += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
            s.health.sent(now);
            s.in_flight
        };
        self.on_wire = true;
        self.started = now;
        self.budget
            .metrics
            .in_flight
            .get_or_create(&NodeLabels {
                node: self.budget.node.clone(),
            })
            .set(in_flight as i64);
        // A POST on the wire is evidence the judgement may need (its age).
        self.budget.changed.notify_waiters();
    }

    /// When the POST was allowed on the wire.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The budget this permit is of.
    pub fn budget(&self) -> &Arc<NodeBudget> {
        &self.budget
    }

    /// The POST is done: feed the budget what it showed.
    pub fn finish(mut self, observation: Observation, timeout: Duration) {
        self.released = true;
        self.budget
            .release(self.on_wire, self.started, Some((observation, timeout)));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.released {
            self.budget.release(self.on_wire, self.started, None);
        }
    }
}

/// What requests must share to travel in one POST: the endpoint, who asks (credentials, hashed),
/// what the connection trusts (a cluster's CA: a request never goes out over another cluster's
/// trust roots), the Origin, the timeout, and the tokio runtime (the operator has one; tests have one per test,
/// and a batch sent from another test's runtime would die with it, connections included).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct BatchKey {
    pub node: String,
    /// Probes never share a POST with work: they go to a node that work may not reach.
    pub purpose: Purpose,
    pub credentials: u64,
    pub trust: u64,
    pub origin: String,
    pub timeout: Duration,
    pub runtime: tokio::runtime::Id,
}

/// The budget key of an endpoint: its URL without user info (credentials never become a label).
pub fn node_key(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            if !u.username().is_empty() || u.password().is_some() {
                let _ = u.set_username("");
                let _ = u.set_password(None);
            }
            u.to_string()
        }
        Err(_) => "invalid-url".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn answered(ms: u64) -> Observation {
        Observation::Answered(Duration::from_millis(ms))
    }

    #[test]
    fn a_fast_node_keeps_the_full_budget() {
        let mut a = Aimd::default();
        let t0 = Instant::now();
        for _ in 0..100 {
            assert!(!a.observe(t0, answered(20), TIMEOUT, t0));
        }
        assert_eq!(a.permitted(), MAX_IN_FLIGHT);
        assert_eq!(a.rate(), MAX_POSTS_PER_SECOND);
    }

    #[test]
    fn a_timeout_halves_the_budget_once_per_round() {
        let mut a = Aimd::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(5);
        // Four POSTs sent at t0 all time out at t1: one cut, not four.
        assert!(a.observe(t0, Observation::TimedOut, TIMEOUT, t1));
        for _ in 0..3 {
            assert!(!a.observe(t0, Observation::TimedOut, TIMEOUT, t1));
        }
        assert_eq!(a.permitted(), MAX_IN_FLIGHT / 2);
        assert_eq!(a.rate(), MAX_POSTS_PER_SECOND / 2.0);
        // A POST sent after the cut that times out cuts again, down to the floor, never below.
        let t2 = t1 + Duration::from_millis(1);
        for i in 0..10u64 {
            let sent = t2 + Duration::from_secs(6 * i);
            a.observe(sent, Observation::TimedOut, TIMEOUT, sent + TIMEOUT);
        }
        assert_eq!(a.permitted(), MIN_IN_FLIGHT);
        assert_eq!(a.rate(), MIN_POSTS_PER_SECOND);
    }

    #[test]
    fn slow_answers_back_off_and_a_slow_node_never_gets_more() {
        let mut a = Aimd::default();
        let mut now = Instant::now();
        let mut cut = false;
        // Answers at 90% of the timeout: the EWMA crosses half the timeout within a few.
        for _ in 0..5 {
            now += Duration::from_secs(5);
            cut |= a.observe(now, answered(4500), TIMEOUT, now);
        }
        assert!(cut);
        assert!(a.permitted() < MAX_IN_FLIGHT);
        let (permitted, rate) = (a.permitted(), a.rate());
        // Between the thresholds (here 35% of the timeout) nothing increases.
        for _ in 0..50 {
            now += Duration::from_secs(2);
            a.observe(now, answered(1750), TIMEOUT, now);
            assert!(a.permitted() <= permitted && a.rate() <= rate);
        }
    }

    #[test]
    fn recovery_is_gradual_and_only_when_fast_again() {
        let mut a = Aimd::default();
        let mut now = Instant::now();
        for _ in 0..10 {
            now += Duration::from_secs(6);
            a.observe(now, Observation::TimedOut, TIMEOUT, now);
        }
        assert_eq!(a.permitted(), MIN_IN_FLIGHT);
        // Fast answers: the EWMA must first fall below a quarter of the timeout.
        let mut answers = 0;
        while a.permitted() < MAX_IN_FLIGHT {
            now += Duration::from_millis(10);
            a.observe(now, answered(10), TIMEOUT, now);
            answers += 1;
            assert!(answers < 100, "never recovered");
        }
        assert!(answers >= 8, "recovered after only {answers} answers");
        assert!(a.rate() < MAX_POSTS_PER_SECOND + f64::EPSILON);
    }

    #[test]
    fn refused_connections_change_nothing() {
        let mut a = Aimd::default();
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(!a.observe(t0, Observation::NoAnswer, TIMEOUT, t0));
        }
        assert_eq!(a.permitted(), MAX_IN_FLIGHT);
        assert!(a.latency_ewma().is_none());
    }

    #[test]
    fn node_keys_drop_user_info() {
        assert_eq!(
            node_key("http://admin:s3cret@localhost:8261/console/jolokia"),
            "http://localhost:8261/console/jolokia"
        );
        assert_eq!(
            node_key("http://localhost:8261/console/jolokia"),
            "http://localhost:8261/console/jolokia"
        );
        assert_eq!(node_key("not a url"), "invalid-url");
    }

    #[tokio::test(start_paused = true)]
    async fn permits_never_exceed_the_permitted_concurrency() {
        let budget = Arc::new(NodeBudget::new("test://permits".into(), Default::default()));
        let mut held = Vec::new();
        for _ in 0..MAX_IN_FLIGHT {
            held.push(budget.acquire(Purpose::Work).await.expect("the node answers"));
        }
        assert_eq!(budget.stats().in_flight, MAX_IN_FLIGHT);
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(Purpose::Work).await.is_ok() }
        });
        // Paused time: just under the silence that judges the node not answering (the held
        // permits are unanswered POSTs) passes with every task idle, and the fifth still waits.
        tokio::time::sleep(HUNG_AFTER_MIN - Duration::from_millis(1)).await;
        assert!(!waiting.is_finished(), "a fifth permit was granted");
        drop(held.pop());
        let fifth = tokio::time::timeout(Duration::from_secs(1), waiting).await;
        assert!(matches!(fifth, Ok(Ok(true))), "the freed slot was not handed on");
        assert_eq!(budget.stats().max_in_flight, MAX_IN_FLIGHT);
    }

    /// Issue 45: a slot free now is granted at once, not at the timer's next tick (a sleep until
    /// now is pending on its first poll).
    #[tokio::test]
    async fn a_free_slot_is_granted_without_waiting_for_the_timer() {
        use futures::FutureExt;
        let budget = Arc::new(NodeBudget::new("test://free".into(), Default::default()));
        let permit = budget.acquire(Purpose::Work).now_or_never();
        assert!(matches!(permit, Some(Ok(_))), "a free slot waited for the timer");
    }

    #[tokio::test(start_paused = true)]
    async fn post_starts_are_spaced_by_the_rate() {
        let budget = Arc::new(NodeBudget::new("test://rate".into(), Default::default()));
        let t0 = Instant::now();
        // Sequential POSTs: the first MAX_IN_FLIGHT go at once (burst), then 1/rate apart.
        let n = 20;
        for _ in 0..n {
            let p = budget.acquire(Purpose::Work).await.expect("the node answers");
            p.finish(answered(1), TIMEOUT);
        }
        let elapsed = t0.elapsed().as_secs_f64();
        let expected = (n - MAX_IN_FLIGHT) as f64 / MAX_POSTS_PER_SECOND;
        // Paused time: the spacing is exactly the rate's, not a wall-clock approximation.
        assert!(
            (elapsed - expected).abs() < 0.01,
            "{elapsed}s for {n} POSTs, expected {expected}s"
        );
    }

    fn wall() -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_default()
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_node_that_leaves_posts_unanswered_for_seconds_is_not_answering_until_it_answers() {
        let mut h = Health::default();
        let t0 = Instant::now();
        h.sent(t0);
        h.sent(t0 + secs(0.5));
        assert_eq!(
            h.judge(t0 + secs(2.9), wall()),
            None,
            "not yet: under {HUNG_AFTER_MIN:?}"
        );
        assert_eq!(h.next_check(t0 + secs(2.9)), Some(t0 + HUNG_AFTER_MIN));
        let judged = h
            .judge(t0 + HUNG_AFTER_MIN, wall())
            .expect("judged after the threshold");
        assert_eq!((judged.sent, judged.timed_out, judged.unanswered), (false, 0, 2));
        // The silence began when the oldest POST went out (wall clock at the judgement − 3 s).
        assert_eq!(judged.since, wall() - chrono::Duration::seconds(3));
        assert_eq!(h.silences(), 1);
        // Latched while the POSTs wait, and once one timed out.
        assert!(h.judge(t0 + secs(10.0), wall()).is_some());
        h.ended(t0);
        h.observe(t0, Observation::TimedOut, t0 + secs(30.0), wall());
        h.ended(t0 + secs(0.5));
        h.observe(t0 + secs(0.5), Observation::TimedOut, t0 + secs(30.5), wall());
        let judged = h.judge(t0 + secs(31.0), wall()).expect("still judged");
        assert_eq!((judged.timed_out, judged.unanswered), (2, 0));
        assert!(h.may_probe(), "nothing on the wire: a probe may go");
        // The probe is answered: the judgement clears at once, and it was a recovery.
        let probe = t0 + secs(32.0);
        h.sent(probe);
        h.ended(probe);
        let j = h.observe(probe, answered(5), probe + secs(0.005), wall());
        assert!(j.recovered && !j.counts_for_load, "{j:?}");
        assert_eq!(h.judge(probe + secs(0.005), wall()), None);
        assert_eq!(h.silences(), 1, "one silence, counted once");
    }

    #[test]
    fn a_judgement_with_no_evidence_left_is_forgotten() {
        let t0 = Instant::now();
        // Its POSTs were abandoned (their callers' runtime ended): nothing says it is silent.
        let mut h = Health::default();
        h.sent(t0);
        assert!(h.judge(t0 + secs(3.0), wall()).is_some());
        h.ended(t0);
        assert_eq!(h.judge(t0 + secs(3.1), wall()), None);
        // Its last timeout is older than the evidence's lifetime and nothing is on the wire.
        let mut h = Health::default();
        h.sent(t0);
        h.ended(t0);
        h.observe(t0, Observation::TimedOut, t0 + secs(5.0), wall());
        assert!(
            h.judge(t0 + secs(5.0) + EVIDENCE_TTL - secs(0.1), wall())
                .is_some()
        );
        assert_eq!(h.judge(t0 + secs(5.0) + EVIDENCE_TTL, wall()), None);
        assert_eq!(h.silences(), 1);
    }

    #[test]
    fn a_node_that_answers_other_posts_is_slow_not_silent() {
        let mut h = Health::default();
        let t0 = Instant::now();
        h.sent(t0);
        h.sent(t0 + secs(1.0));
        h.ended(t0 + secs(1.0));
        h.observe(t0 + secs(1.0), answered(1000), t0 + secs(2.0), wall());
        // The first POST has waited 4 s, but the node answered 2 s ago: not silent yet.
        assert_eq!(h.judge(t0 + secs(4.0), wall()), None);
        // Silent for the threshold since its last answer, with a POST still waiting: judged.
        assert!(h.judge(t0 + secs(5.0), wall()).is_some());
    }

    #[test]
    fn a_timeout_is_evidence_at_once_unless_the_node_answered_meanwhile() {
        let t0 = Instant::now();
        // Short request timeout (1 s): no answer since the POST went out.
        let mut h = Health::default();
        h.sent(t0);
        h.ended(t0);
        let j = h.observe(t0, Observation::TimedOut, t0 + secs(1.0), wall());
        assert!(
            !j.counts_for_load,
            "a timeout of a silent node is not load: {j:?}"
        );
        let judged = h.judge(t0 + secs(1.0), wall()).expect("judged at once");
        assert_eq!((judged.timed_out, judged.unanswered), (1, 0));
        // Another POST answered after this one went out: a slow node, the AIMD rule's business.
        let mut h = Health::default();
        h.sent(t0);
        h.sent(t0 + secs(0.1));
        h.ended(t0 + secs(0.1));
        h.observe(t0 + secs(0.1), answered(400), t0 + secs(0.5), wall());
        h.ended(t0);
        let j = h.observe(t0, Observation::TimedOut, t0 + secs(1.0), wall());
        assert!(j.counts_for_load, "{j:?}");
        assert_eq!(h.judge(t0 + secs(1.0), wall()), None);
    }

    #[test]
    fn what_overlapped_a_silence_is_not_evidence_of_load() {
        let mut h = Health::default();
        let t0 = Instant::now();
        for i in 0..4 {
            h.sent(t0 + secs(0.01 * f64::from(i)));
        }
        assert!(h.judge(t0 + secs(3.5), wall()).is_some());
        // Timeouts of the hung POSTs: no cut.
        h.ended(t0);
        assert!(
            !h.observe(t0, Observation::TimedOut, t0 + secs(30.0), wall())
                .counts_for_load
        );
        // The node comes back: the late answers of POSTs sent before say nothing of load, and do
        // not make the node look slow (the threshold stays at its minimum).
        for i in 1..4 {
            let sent = t0 + secs(0.01 * f64::from(i));
            h.ended(sent);
            let j = h.observe(sent, answered(40_000), t0 + secs(40.0), wall());
            assert_eq!(j.recovered, i == 1, "{i}: {j:?}");
            assert!(!j.counts_for_load, "{i}: {j:?}");
        }
        assert_eq!(h.hung_after(t0 + secs(40.0)), HUNG_AFTER_MIN);
        // A POST sent after the recovery counts again.
        let later = t0 + secs(41.0);
        h.sent(later);
        h.ended(later);
        assert!(
            h.observe(later, answered(20), later + secs(0.02), wall())
                .counts_for_load
        );
    }

    #[test]
    fn a_node_slow_anyway_is_given_longer_and_that_fades() {
        let mut h = Health::default();
        let t0 = Instant::now();
        h.sent(t0);
        h.ended(t0);
        // A 4 s scrape: the threshold is twice that.
        h.observe(t0, answered(4000), t0 + secs(4.0), wall());
        assert_eq!(h.hung_after(t0 + secs(4.0)), secs(8.0));
        let t1 = t0 + secs(5.0);
        h.sent(t1);
        assert_eq!(
            h.judge(t1 + secs(7.0), wall()),
            None,
            "within twice its slowest answer"
        );
        assert!(h.judge(t1 + secs(8.5), wall()).is_some());
        // Two half-lives later the slow answer counts a quarter: back near the minimum.
        let mut fresh = Health::default();
        fresh.observe(t0, answered(4000), t0 + secs(4.0), wall());
        let later = t0 + secs(4.0) + 2 * SLOWEST_HALF_LIFE;
        assert_eq!(fresh.hung_after(later), HUNG_AFTER_MIN);
    }

    #[test]
    fn nothing_on_the_wire_is_never_a_silence() {
        let mut h = Health::default();
        let t0 = Instant::now();
        assert_eq!(h.judge(t0 + secs(3600.0), wall()), None);
        assert_eq!(h.next_check(t0), None);
        h.observe(t0, Observation::NoAnswer, t0, wall());
        assert_eq!(
            h.judge(t0 + secs(3600.0), wall()),
            None,
            "a refused connection is no silence"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_judged_not_answering_fails_work_at_once_and_lets_one_probe_through() {
        let budget = Arc::new(NodeBudget::new("test://silent".into(), Default::default()));
        let hung = budget.acquire(Purpose::Work).await.expect("answering so far");
        let judged = tokio::spawn({
            let budget = budget.clone();
            async move { budget.until_not_answering().await }
        });
        tokio::time::sleep(secs(2.9)).await;
        assert!(!judged.is_finished(), "judged before the threshold");
        tokio::time::sleep(secs(0.2)).await;
        let evidence = judged.await.expect("task");
        assert_eq!((evidence.unanswered, evidence.sent), (1, false));
        // Work fails at once; a probe waits for nothing but may not go while a POST is out.
        let work = budget.acquire(Purpose::Work).await;
        assert!(
            matches!(work, Err(ref e) if e.unanswered == 1),
            "{:?}",
            work.is_ok()
        );
        assert!(
            budget.acquire(Purpose::Probe).await.is_err(),
            "the hung POST is the probe"
        );
        // The hung POST times out: nothing on the wire now, the judgement stands on its timeout.
        hung.finish(Observation::TimedOut, TIMEOUT);
        let probe = budget
            .acquire(Purpose::Probe)
            .await
            .expect("nothing on the wire: the probe goes");
        assert!(
            budget.acquire(Purpose::Probe).await.is_err(),
            "one probe at a time"
        );
        assert!(budget.stats().not_answering.is_some());
        probe.finish(answered(3), TIMEOUT);
        assert!(
            budget.stats().not_answering.is_none(),
            "one answer clears the judgement"
        );
        let p = budget.acquire(Purpose::Work).await.expect("work goes again");
        p.finish(answered(3), TIMEOUT);
        assert_eq!(budget.stats().permitted, MAX_IN_FLIGHT, "the silence cut nothing");
    }
}
