//! The per-node request budget: how many Jolokia POSTs this whole process may have in flight to
//! one endpoint, and how often it may start one, adapted to how the node answers.
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
//! The budgets live in a process-wide registry ([`budget_for`]), keyed by the endpoint URL
//! without user info ([`node_key`]); the per-endpoint batchers (`super::batch`) keep their own map, keyed by [`BatchKey`].

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::telemetry::jolokia::{NodeLabels, metrics};

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
}

/// The budget of one node (endpoint), shared by every client and controller of the process.
pub struct NodeBudget {
    node: String,
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
}

impl NodeBudget {
    fn new(node: String) -> Self {
        let aimd = Aimd::default();
        metrics()
            .permitted_concurrency
            .get_or_create(&NodeLabels { node: node.clone() })
            .set(aimd.permitted() as i64);
        NodeBudget {
            node,
            state: Mutex::new(State {
                aimd,
                reserved: 0,
                in_flight: 0,
                max_in_flight: 0,
                next_start: Instant::now(),
                posts: 0,
                backoffs: 0,
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
        let s = self.lock();
        NodeStats {
            permitted: s.aimd.permitted(),
            rate: s.aimd.rate(),
            in_flight: s.in_flight,
            max_in_flight: s.max_in_flight,
            posts: s.posts,
            backoffs: s.backoffs,
            latency_ewma: s.aimd.latency_ewma(),
        }
    }

    /// A slot if the permitted concurrency has one: the time the POST may start (rate).
    fn try_reserve(&self, now: Instant) -> Option<Instant> {
        let mut s = self.lock();
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

    /// Wait for permission to send one POST to this node.
    pub async fn acquire(self: &Arc<Self>) -> Permit {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(start) = self.try_reserve(Instant::now()) {
                let mut permit = Permit {
                    budget: self.clone(),
                    on_wire: false,
                    released: false,
                    started: Instant::now(),
                };
                tokio::time::sleep_until(start).await;
                permit.start();
                return permit;
            }
            notified.await;
        }
    }

    fn release(&self, on_wire: bool, outcome: Option<(Instant, Observation, Duration)>) {
        let node = NodeLabels {
            node: self.node.clone(),
        };
        let (permitted, in_flight, backed_off) = {
            let mut s = self.lock();
            s.reserved = s.reserved.saturating_sub(1);
            if on_wire {
                s.in_flight = s.in_flight.saturating_sub(1);
            }
            let backed_off = match outcome {
                Some((started, observation, timeout)) => {
                    s.aimd.observe(started, observation, timeout, Instant::now())
                }
                None => false,
            };
            if backed_off {
                s.backoffs += 1;
            }
            (s.aimd.permitted(), s.in_flight, backed_off)
        };
        let m = metrics();
        m.permitted_concurrency.get_or_create(&node).set(permitted as i64);
        m.in_flight.get_or_create(&node).set(in_flight as i64);
        if backed_off {
            m.backoffs.get_or_create(&node).inc();
            tracing::info!(node = %self.node, permitted, "jolokia: the node answers slowly; backing off");
        }
        self.changed.notify_waiters();
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
        let in_flight = {
            let mut s = self.budget.lock();
            s.in_flight += 1;
            s.posts += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
            s.in_flight
        };
        self.on_wire = true;
        self.started = Instant::now();
        metrics()
            .in_flight
            .get_or_create(&NodeLabels {
                node: self.budget.node.clone(),
            })
            .set(in_flight as i64);
    }

    /// When the POST was allowed on the wire.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The POST is done: feed the budget what it showed.
    pub fn finish(mut self, observation: Observation, timeout: Duration) {
        self.released = true;
        self.budget
            .release(self.on_wire, Some((self.started, observation, timeout)));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.released {
            self.budget.release(self.on_wire, None);
        }
    }
}

/// The process-wide registry of node budgets.
///
/// A `OnceLock` static rather than a handle threaded through callers: the budget must be shared
/// by *every* Jolokia client in the process (topology polls, every controller, tests), clients
/// are built in several places from plain values (`JolokiaClient::new`), and a broker node is a
/// process-wide resource — two handles would mean two budgets for one node, which is the bug
/// this prevents. Entries are small; a batcher whose task ended is pruned when a new one starts.
pub(crate) struct Registry {
    budgets: Mutex<HashMap<String, Arc<NodeBudget>>>,
    /// Keys credentials for the batcher map; random per process, so a key reveals nothing.
    hasher: RandomState,
}

/// What requests must share to travel in one POST: the endpoint, who asks (credentials, hashed),
/// what the connection trusts (a cluster's CA: a request never goes out over another cluster's
/// trust roots), the Origin, the timeout, and the tokio runtime (the operator has one; tests have one per test,
/// and a batch sent from another test's runtime would die with it, connections included).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct BatchKey {
    pub node: String,
    pub credentials: u64,
    pub trust: u64,
    pub origin: String,
    pub timeout: Duration,
    pub runtime: tokio::runtime::Id,
}

pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        budgets: Mutex::new(HashMap::new()),
        hasher: RandomState::new(),
    })
}

impl Registry {
    /// Who asks, as a key: the credentials and the exact URL (which may carry user info).
    pub(crate) fn credentials_hash(&self, username: &str, password: &str, url: &str) -> u64 {
        self.hasher.hash_one((username, password, url))
    }

    /// What a client trusts, as a key (never 0: 0 is the system roots alone).
    pub(crate) fn trust_hash(&self, ca_pem: &[u8]) -> u64 {
        self.hasher.hash_one(("trust", ca_pem)).max(1)
    }
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

/// The budget of the node behind this endpoint URL (created on first use).
pub fn budget_for(url: &str) -> Arc<NodeBudget> {
    let node = node_key(url);
    let mut budgets = registry().budgets.lock().unwrap_or_else(|p| p.into_inner());
    budgets
        .entry(node.clone())
        .or_insert_with(|| Arc::new(NodeBudget::new(node)))
        .clone()
}

/// The budget state of the node behind this URL, if anything was ever sent there.
pub fn node_stats(url: &str) -> Option<NodeStats> {
    let node = node_key(url);
    let budgets = registry().budgets.lock().unwrap_or_else(|p| p.into_inner());
    budgets.get(&node).map(|b| b.stats())
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

    #[tokio::test]
    async fn permits_never_exceed_the_permitted_concurrency() {
        let budget = Arc::new(NodeBudget::new("test://permits".into()));
        let mut held = Vec::new();
        for _ in 0..MAX_IN_FLIGHT {
            held.push(budget.acquire().await);
        }
        assert_eq!(budget.stats().in_flight, MAX_IN_FLIGHT);
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "a fifth permit was granted");
        drop(held.pop());
        let fifth = tokio::time::timeout(Duration::from_secs(1), waiting).await;
        assert!(matches!(fifth, Ok(Ok(_))), "the freed slot was not handed on");
        assert_eq!(budget.stats().max_in_flight, MAX_IN_FLIGHT);
    }

    #[tokio::test]
    async fn post_starts_are_spaced_by_the_rate() {
        let budget = Arc::new(NodeBudget::new("test://rate".into()));
        let t0 = Instant::now();
        // Sequential POSTs: the first MAX_IN_FLIGHT go at once (burst), then 1/rate apart.
        let n = 20;
        for _ in 0..n {
            let p = budget.acquire().await;
            p.finish(answered(1), TIMEOUT);
        }
        let elapsed = t0.elapsed().as_secs_f64();
        let expected = (n - MAX_IN_FLIGHT) as f64 / MAX_POSTS_PER_SECOND;
        assert!(
            elapsed >= expected * 0.9,
            "{elapsed}s for {n} POSTs, expected ≥ {expected}s"
        );
    }
}
