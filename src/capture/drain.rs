//! The drain (ADR-0062 D2, D4, D9; ADR-0066 D2): one AMQP 1.0 receiver per capture queue per
//! node, consuming by FQQN with manual credit in batches, so a slow database slows the drain and
//! the ring absorbs it (the producer never waits). A batch is accepted (settled) only after it is
//! committed: at-least-once into the database, and a redelivered copy is skipped by the store.
//! A drain that stops is visible in [`DrainHealth`], which is what makes a tap HEALTHY.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fe2o3_amqp::Receiver;
use fe2o3_amqp::link::RecvError;
use fe2o3_amqp::link::delivery::Delivery;
use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use futures::FutureExt;
use tokio::sync::watch;

use super::connection::{LinkKey, NodeLinks};
use super::names::TapName;
use super::split::{Refusal, Sink, SplitInsert};
use super::supervise::{Death, DeathCause, Restart};
use crate::store::captured::{CapturedRow, CoverageBeat, LossAt, SubscriptionKey};
use crate::store::{NO_PARTITION_OR_CHECK, Store, StoreError};

/// Copies asked for at once. The next batch's credit goes out as soon as a batch is in hand, so
/// the broker streams it while Postgres commits; at most two batches (400 copies) are in flight
/// and unsettled at once, which bounds how much the credit window adds to the ring
/// (CAPTURE-NOTES: delivering messages do not count toward the ring size).
pub const BATCH: u32 = 200;

/// How often the open coverage intervals of idle drains are confirmed in Postgres (all of the
/// process's in one statement, [`confirm_coverage`]): the precision of a coverage gap's end
/// when the operator dies.
pub const COVERAGE_CONFIRM: Duration = Duration::from_secs(5);

/// One drain: a capture queue on one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DrainKey {
    pub cluster: String,
    pub node: String,
    pub capture_queue: String,
}

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
    pub problem: Option<String>,
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
    store_problem: Arc<Mutex<Option<Problem>>>,
}

/// A problem and since when.
type Problem = (String, chrono::DateTime<chrono::Utc>);

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl DrainHealth {
    fn set(&self, key: &DrainKey, connected: bool, problem: Option<String>) {
        self.set_holding(key, connected, problem, 0);
    }

    /// As `set`, with `held` copies held unsettled on their way into the database.
    fn set_holding(&self, key: &DrainKey, connected: bool, problem: Option<String>, held: usize) {
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
    pub(super) fn forget(&self, key: &DrainKey) {
        if let Ok(mut m) = self.inner.lock() {
            m.remove(key);
        }
        self.set_coverage(key, None);
    }

    /// The drain died: not draining (its coverage claims nothing past its death), and says so
    /// until the next converge restarts it.
    fn died(&self, key: &DrainKey, death: &Death) {
        self.set_coverage(key, None);
        let why = format!("drain died: {}; the next capture pass restarts it", death.cause);
        self.set(key, false, Some(why));
    }

    /// The drain that died restarts at `at`, when its backoff ends.
    pub(super) fn restarts_at(
        &self,
        key: &DrainKey,
        death: &Death,
        restart: &Restart,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        let in_a_row = match restart.deaths_in_a_row {
            0 | 1 => String::new(),
            n => format!(", {n} deaths in a row"),
        };
        let why = format!(
            "drain died: {}{in_a_row}; restarts at {}",
            death.cause,
            rfc3339(at)
        );
        self.set(key, false, Some(why));
    }

    /// The drain's coverage interval is open (or, with None, ends now).
    fn set_coverage(&self, key: &DrainKey, open: Option<(SubscriptionKey, i64)>) {
        if let Ok(mut m) = self.open.lock() {
            match open {
                Some(c) => m.insert(key.clone(), c),
                None => m.remove(key),
            };
        }
    }

    fn set_store_problem(&self, problem: Option<String>) {
        if let Ok(mut p) = self.store_problem.lock() {
            *p = match (problem, p.take()) {
                (None, _) => None,
                (Some(why), Some((_, since))) => Some((why, since)),
                (Some(why), None) => Some((why, chrono::Utc::now())),
            };
        }
    }

    /// The open intervals of the drains that are alive now: what may be confirmed (judged
    /// without the confirmations' own failure: a confirmation is how Postgres is found back).
    fn coverage_to_confirm(&self) -> Vec<(DrainKey, (SubscriptionKey, i64))> {
        let open: Vec<(DrainKey, (SubscriptionKey, i64))> = self
            .open
            .lock()
            .map(|m| m.iter().map(|(k, c)| (k.clone(), c.clone())).collect())
            .unwrap_or_default();
        open.into_iter()
            .filter(|(k, _)| self.drain_alive(k, COVERAGE_CONFIRM).is_ok())
            .collect()
    }

    /// Being drained: connected, no problem, no batch waiting on the database longer than
    /// [`STORE_STALLED`], alive within `within` (ADR-0066 D2's definition of a healthy tap).
    /// Err carries why not: the drain's own problem, since when, and the copies it holds.
    pub fn draining(&self, key: &DrainKey, within: Duration) -> Result<(), String> {
        let runs = self.inner.lock().is_ok_and(|m| m.contains_key(key));
        if let (true, Some((why, since))) = (runs, self.store_problem.lock().ok().and_then(|p| p.clone())) {
            return Err(format!(
                "its coverage cannot be recorded: {why} (since {})",
                rfc3339(since)
            ));
        }
        self.drain_alive(key, within)
    }

    /// The drain's own state, whatever the coverage confirmations found.
    fn drain_alive(&self, key: &DrainKey, within: Duration) -> Result<(), String> {
        let m = self
            .inner
            .lock()
            .map_err(|_| "drain state unavailable".to_string())?;
        let Some(s) = m.get(key) else {
            return Err("no drain runs for this capture queue (yet)".into());
        };
        let since = s
            .problem_since
            .map(|t| format!(" (since {})", rfc3339(t)))
            .unwrap_or_default();
        let held = if s.held > 0 {
            format!("; {} copies held unsettled", s.held)
        } else {
            String::new()
        };
        match &s.problem {
            Some(p) => Err(format!("{p}{since}{held}")),
            None if !s.connected => Err("drain not connected".into()),
            None if s.held > 0 && s.alive_at.elapsed() > STORE_STALLED => Err(format!(
                "a batch of {} copies has waited on the database since {}, held unsettled",
                s.held,
                rfc3339(s.alive_at_wall)
            )),
            None if s.alive_at.elapsed() > within => {
                Err(format!("drain silent for {}s", s.alive_at.elapsed().as_secs()))
            }
            None => Ok(()),
        }
    }
}

/// Confirm, every [`COVERAGE_CONFIRM`], the open coverage of every drain of this process that
/// is draining: per node, not per tap (issue 42). Each open interval of a draining drain is
/// attached to its node's heartbeat row, and one statement beats every heartbeat; an interval
/// is written only when its drain starts or stops draining. A drain that is not draining is
/// detached, so its interval claims nothing past its last sign of life. While confirmations
/// fail, no drain counts as draining (nothing it copies can be recorded); the next one that
/// succeeds, or a batch's insert, catches up.
pub async fn confirm_coverage(store: Store, health: DrainHealth, holder: String) {
    let mut every = tokio::time::interval(COVERAGE_CONFIRM);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heartbeats = Heartbeats::default();
    loop {
        every.tick().await;
        let alive = health.coverage_to_confirm();
        match heartbeats.beat(&store, &holder, &alive).await {
            Ok(()) => health.set_store_problem(None),
            Err(e) => {
                tracing::warn!(error = %e, intervals = alive.len(), "capture: coverage not confirmed this time");
                health.set_store_problem(Some(format!("Postgres: {e}")));
            }
        }
    }
}

/// The heartbeat rows of this process's nodes, and which open interval is attached to which.
#[derive(Default)]
struct Heartbeats {
    /// (cluster, node) → heartbeat row.
    rows: HashMap<(String, String), i64>,
    /// Interval → the heartbeat it is attached to, as written.
    attached: HashMap<(SubscriptionKey, i64), i64>,
}

impl Heartbeats {
    /// One beat: a heartbeat row for each node first drained, then the beat's writes.
    async fn beat(
        &mut self,
        store: &Store,
        holder: &str,
        alive: &[(DrainKey, (SubscriptionKey, i64))],
    ) -> Result<(), StoreError> {
        for (k, _) in alive {
            if let std::collections::hash_map::Entry::Vacant(row) =
                self.rows.entry((k.cluster.clone(), k.node.clone()))
            {
                row.insert(store.heartbeat_start(&k.cluster, &k.node, holder).await?);
            }
        }
        let beat = self.plan(alive);
        if beat == CoverageBeat::default() {
            return Ok(());
        }
        store.coverage_beat(&beat).await?;
        for i in &beat.detach {
            self.attached.remove(i);
        }
        for (k, id, h) in beat.attach {
            self.attached.insert((k, id), h);
        }
        Ok(())
    }

    /// What to write for the intervals alive now (pure).
    fn plan(&self, alive: &[(DrainKey, (SubscriptionKey, i64))]) -> CoverageBeat {
        let now: HashMap<&(SubscriptionKey, i64), i64> = alive
            .iter()
            .filter_map(|(k, i)| Some((i, *self.rows.get(&(k.cluster.clone(), k.node.clone()))?)))
            .collect();
        let mut detach: Vec<(SubscriptionKey, i64)> = self
            .attached
            .iter()
            .filter(|(i, h)| now.get(i) != Some(h))
            .map(|(i, _)| i.clone())
            .collect();
        let mut attach: Vec<(SubscriptionKey, i64, i64)> = now
            .iter()
            .filter(|(i, h)| self.attached.get(**i) != Some(*h))
            .map(|((k, id), h)| (k.clone(), *id, *h))
            .collect();
        let mut beat: Vec<i64> = now.values().copied().collect();
        beat.sort_unstable();
        beat.dedup();
        detach.sort();
        attach.sort();
        CoverageBeat { detach, attach, beat }
    }
}

/// A per-subscription token bucket (D9): one firehose cannot starve the others; the excess is
/// dropped after it leaves the ring, and counted.
#[derive(Debug)]
pub struct RateCap {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl RateCap {
    pub fn new(per_second: u32) -> Self {
        RateCap {
            rate: f64::from(per_second.max(1)),
            tokens: f64::from(per_second.max(1)),
            at: Instant::now(),
        }
    }

    pub fn set_rate(&mut self, per_second: u32) {
        self.rate = f64::from(per_second.max(1));
    }

    /// How many of `n` may be stored now.
    pub fn take(&mut self, n: u64) -> u64 {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.rate);
        self.at = now;
        let granted = (self.tokens.floor() as u64).min(n);
        self.tokens -= granted as f64;
        granted
    }
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
    /// This drain's receiver's link name (unique on its connection).
    pub link_name: String,
}

/// A running drain. [`DrainHandle::stop`] stops it after the batch in hand; dropping the handle
/// (the worker is gone) aborts it, and its unsettled copies go back to the queue. A drain whose
/// task ended while nobody stopped it has died ([`DrainHandle::has_ended`],
/// [`super::supervise`]).
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
struct Running(&'static prometheus_client::metrics::gauge::Gauge);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A drain's task: after `wait`, [`run`] until stopped. A run that ends otherwise — a panic, or
/// a return — is the drain's death: recorded ([`super::supervise::record_death`]), in its
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
    let started = Instant::now();
    let outcome = {
        let drains = &crate::telemetry::capture::metrics().drains;
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
    super::supervise::record_death(&key, &subscription, &death);
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
        match session(&store, &health, &links, &spec, &mut stopped).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(queue = %spec.key.capture_queue, node = %spec.key.node, error = %e, "capture drain stopped; reconnecting");
                health.set(&spec.key, false, Some(format!("drain stopped: {e}")));
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

/// One receiver's life on the node's shared connection: attach, then batches until stopped
/// or broken.
async fn session(
    store: &Store,
    health: &DrainHealth,
    links: &NodeLinks,
    spec: &DrainSpec,
    stopped: &mut watch::Receiver<bool>,
) -> Result<(), String> {
    let queue = spec.tap.capture_queue();
    let (mut receiver, lease) = links
        .attach(&spec.link, &spec.link_name, &format!("{queue}::{queue}"))
        .await?;
    store
        .ensure_partitions(&spec.subscription)
        .await
        .map_err(|e| format!("partitions: {e}"))?;
    let coverage = store
        .coverage_start(&spec.subscription, &spec.key.node, &spec.tap.address, &queue)
        .await
        .map_err(|e| format!("coverage: {e}"))?;
    health.set(&spec.key, true, None);
    health.set_coverage(&spec.key, Some((spec.subscription.clone(), coverage)));
    let result = batches(store, health, spec, &mut receiver, coverage, stopped).await;
    health.set_coverage(&spec.key, None);
    let _ = store.coverage_end(&spec.subscription, coverage).await;
    let _ = receiver.close().await;
    drop(lease);
    result
}

/// A delivered copy, or one the AMQP library could not decode (it is settled with its batch
/// and counted as loss, cause `undecodable`: redelivering it would stop the drain for ever).
enum Received {
    Decoded(Box<Delivery<Body<Value>>>),
    Undecodable(DeliveryInfo),
}

impl Received {
    fn info(&self) -> DeliveryInfo {
        match self {
            Received::Decoded(d) => DeliveryInfo::from(d.as_ref()),
            Received::Undecodable(i) => i.clone(),
        }
    }
}

async fn receive(receiver: &mut Receiver) -> Result<Received, String> {
    match receiver.recv::<Body<Value>>().await {
        Ok(d) => Ok(Received::Decoded(Box::new(d))),
        Err(RecvError::MessageDecode(e)) => Ok(Received::Undecodable(e.info)),
        Err(e) => Err(format!("receive: {e}")),
    }
}

/// The first copy (or nothing within a second: an idle heartbeat), then whatever follows
/// within a short linger, up to BATCH.
async fn collect(
    receiver: &mut Receiver,
    stopped: &mut watch::Receiver<bool>,
) -> Result<Vec<Received>, String> {
    let mut batch = vec![];
    tokio::select! {
        r = receive(receiver) => batch.push(r?),
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        _ = stopped.changed() => {}
    }
    while !batch.is_empty() && batch.len() < BATCH as usize {
        match tokio::time::timeout(Duration::from_millis(20), receive(receiver)).await {
            Ok(r) => batch.push(r?),
            Err(_) => break,
        }
    }
    Ok(batch)
}

async fn batches(
    store: &Store,
    health: &DrainHealth,
    spec: &DrainSpec,
    receiver: &mut Receiver,
    coverage: i64,
    stopped: &mut watch::Receiver<bool>,
) -> Result<(), String> {
    // Credit is granted again only after a batch used it: an idle drain sends nothing to the
    // broker and nothing to the database (its coverage is confirmed with every other drain's,
    // [`confirm_coverage`]). It is granted before the batch
    // is committed (the broker streams the next batch meanwhile), never while a batch is held
    // for a database that refuses: at most two batches are unsettled.
    receiver
        .set_credit(BATCH)
        .await
        .map_err(|e| format!("credit: {e}"))?;
    loop {
        if *stopped.borrow() {
            return Ok(());
        }
        // A drain that dies (test builds only): what supervision restarts.
        if crate::crash_window::drain_dies() {
            panic!("test hook ARTEMIS_STUDIO_TEST_DRAIN_DIES");
        }
        let batch = collect(receiver, stopped).await?;
        if batch.is_empty() {
            health.set(&spec.key, true, None);
            continue;
        }
        receiver
            .set_credit(BATCH)
            .await
            .map_err(|e| format!("credit: {e}"))?;
        let Some(stored) = store_batch(store, health, spec, coverage, &batch, stopped).await else {
            // Stopped while the batch was held: it goes back to the queue unsettled.
            return Ok(());
        };
        // The crash window between commit and settle (test builds only): a SIGKILL here must
        // not make a second row of any copy redelivered to the next drain.
        crate::crash_window::pause(crate::crash_window::Window::AfterInsert, &stored.to_string()).await;
        receiver
            .accept_all(batch.iter().map(Received::info))
            .await
            .map_err(|e| format!("settle: {e}"))?;
        health.set(&spec.key, true, None);
    }
}

/// The drain's store: one statement per part of a batch, which also confirms its coverage.
struct DrainSink<'a> {
    store: &'a Store,
    spec: &'a DrainSpec,
    coverage: i64,
}

impl Sink<CapturedRow> for DrainSink<'_> {
    type Error = StoreError;

    async fn insert(&mut self, rows: &[CapturedRow]) -> Result<u64, Refusal<StoreError>> {
        let e = match self
            .store
            .insert_captured(&self.spec.subscription, rows, self.coverage)
            .await
        {
            Ok(n) => return Ok(n),
            Err(e) => e,
        };
        if let Some(code) = e.data_refusal() {
            return Err(Refusal::Data(code));
        }
        if e.sqlstate().as_deref() == Some(NO_PARTITION_OR_CHECK) {
            // No partition for today (yet): made, and the batch retried as it is.
            let _ = self.store.ensure_partitions(&self.spec.subscription).await;
        }
        Err(Refusal::Unavailable(e))
    }

    fn salvage(&self, row: &CapturedRow, sqlstate: &str) -> Option<CapturedRow> {
        crate::store::storable::salvage(row, sqlstate)
    }
}

/// A batch as rows, and what of it will not be stored.
struct Prepared {
    rows: Vec<CapturedRow>,
    /// Copies the AMQP library could not decode.
    undecodable: u64,
    /// Copies over the subscription's rate cap (D9).
    capped: u64,
    oldest: Option<chrono::DateTime<chrono::Utc>>,
}

fn prepare(spec: &DrainSpec, batch: &[Received]) -> Prepared {
    let decoded: Vec<&Delivery<Body<Value>>> = batch
        .iter()
        .filter_map(|c| match c {
            Received::Decoded(d) => Some(d.as_ref()),
            Received::Undecodable(_) => None,
        })
        .collect();
    let undecodable = (batch.len() - decoded.len()) as u64;
    let allowed = spec
        .rate_cap
        .lock()
        .map(|mut b| b.take(decoded.len() as u64))
        .unwrap_or(decoded.len() as u64) as usize;
    let rows: Vec<CapturedRow> = decoded
        .iter()
        .take(allowed)
        .map(|d| super::row::row(&spec.key.node, &spec.tap, spec.max_body_bytes, d.message()))
        .collect();
    let capped = (decoded.len() - allowed) as u64;
    let oldest = rows.iter().filter_map(|r| r.routed_at).min();
    Prepared {
        rows,
        undecodable,
        capped,
        oldest,
    }
}

/// Commit first; settle after. A copy Postgres refuses for what it is is found by splitting
/// the batch, salvaged or counted as loss (`unstorable`), never retried; while the database is
/// unavailable the batch is held (no new credit: the ring absorbs, the producer never waits)
/// and retried where it stopped. Returns the rows stored, or None when stopped while held.
async fn store_batch(
    store: &Store,
    health: &DrainHealth,
    spec: &DrainSpec,
    coverage: i64,
    batch: &[Received],
    stopped: &mut watch::Receiver<bool>,
) -> Option<u64> {
    let Prepared {
        rows,
        undecodable,
        capped,
        oldest,
    } = prepare(spec, batch);
    // Until it is committed, the batch is held: a database that does not answer shows in the
    // drain's state after STORE_STALLED, without asking the database.
    health.set_holding(&spec.key, true, None, batch.len());
    let mut work = SplitInsert::new(rows);
    let mut sink = DrainSink {
        store,
        spec,
        coverage,
    };
    let mut losses: Option<Vec<(&str, u64)>> = None;
    let mut wait = Duration::from_millis(200);
    let started = Instant::now();
    loop {
        let result = match work.run(&mut sink).await {
            Ok(()) => {
                let pending = losses.get_or_insert_with(|| {
                    vec![
                        ("rate_cap", capped),
                        ("unstorable", work.unstorable),
                        ("undecodable", undecodable),
                    ]
                });
                record_losses(store, spec, pending).await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                if work.unstorable + undecodable > 0 {
                    tracing::warn!(queue = %spec.key.capture_queue, node = %spec.key.node, unstorable = work.unstorable, sqlstates = ?work.causes, undecodable, "capture: copies that cannot be stored were skipped and counted as loss");
                }
                let lost = [
                    ("rate_cap", capped),
                    ("unstorable", work.unstorable),
                    ("undecodable", undecodable),
                ];
                record_batch(
                    spec,
                    batch.len() as u64,
                    work.stored,
                    &lost,
                    oldest,
                    started.elapsed(),
                );
                return Some(work.stored);
            }
            Err(e) => {
                tracing::warn!(queue = %spec.key.capture_queue, node = %spec.key.node, error = %e, held = batch.len(), "capture: batch not stored; held unsettled and retried");
                health.set_holding(
                    &spec.key,
                    true,
                    Some(format!("database unavailable, batch held: {e}")),
                    batch.len(),
                );
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stopped.changed() => {}
                }
                if *stopped.borrow() {
                    return None;
                }
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Record each pending loss; one recorded is not recorded again when a later one fails.
async fn record_losses(
    store: &Store,
    spec: &DrainSpec,
    pending: &mut Vec<(&str, u64)>,
) -> Result<(), StoreError> {
    let at = LossAt {
        cluster: &spec.key.cluster,
        subscription: &spec.tap.subscription,
        node: &spec.key.node,
        source_address: &spec.tap.address,
    };
    while let Some((cause, n)) = pending.last().copied() {
        store.add_loss(&at, cause, n).await?;
        pending.pop();
    }
    Ok(())
}

/// The metrics of one committed batch of `received` copies.
fn record_batch(
    spec: &DrainSpec,
    received: u64,
    stored: u64,
    lost: &[(&str, u64)],
    oldest: Option<chrono::DateTime<chrono::Utc>>,
    took: Duration,
) {
    let m = crate::telemetry::capture::metrics();
    let labels = crate::telemetry::capture::SubscriptionLabels {
        cluster: spec.key.cluster.clone(),
        subscription: spec.tap.subscription.clone(),
    };
    m.stored.get_or_create(&labels).inc_by(stored);
    m.batch_size.get_or_create(&labels).observe(received as f64);
    m.insert_seconds
        .get_or_create(&labels)
        .observe(took.as_secs_f64());
    if let Some(oldest) = oldest {
        let lag = (chrono::Utc::now() - oldest).num_milliseconds().max(0) as f64 / 1000.0;
        m.drain_lag_seconds.get_or_create(&labels).set(lag);
    }
    for (cause, n) in lost {
        m.dropped(&spec.key.cluster, &spec.tap.subscription, cause, *n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(node: &str, id: i64) -> (DrainKey, (SubscriptionKey, i64)) {
        let key = DrainKey {
            cluster: "ns/c".into(),
            node: node.into(),
            capture_queue: format!("q{id}"),
        };
        let sub = SubscriptionKey {
            cluster: "ns/c".into(),
            subscription: "s".into(),
            id: 1,
        };
        (key, (sub, id))
    }

    #[test]
    fn an_idle_beat_writes_one_row_per_node_and_an_interval_only_when_its_drain_changes() {
        let mut h = Heartbeats::default();
        h.rows.insert(("ns/c".into(), "n1".into()), 10);
        h.rows.insert(("ns/c".into(), "n2".into()), 20);
        let now = [alive("n1", 1), alive("n1", 2), alive("n2", 3)];
        let first = h.plan(&now);
        assert_eq!(first.beat, vec![10, 20], "one heartbeat per node");
        assert_eq!(first.attach.len(), 3);
        assert!(first.detach.is_empty());
        for (k, id, hb) in first.attach {
            h.attached.insert((k, id), hb);
        }
        let idle = h.plan(&now);
        assert!(
            idle.attach.is_empty() && idle.detach.is_empty(),
            "idle: no interval written"
        );
        assert_eq!(idle.beat, vec![10, 20]);
        // Drain 2 stops draining: detached (its interval claims nothing past the last beat).
        let later = h.plan(&[alive("n1", 1), alive("n2", 3)]);
        assert_eq!(
            later.detach.iter().map(|(_, id)| *id).collect::<Vec<_>>(),
            vec![2]
        );
        assert!(later.attach.is_empty());
        // Nothing drains on n2: its heartbeat does not beat.
        assert_eq!(h.plan(&[alive("n1", 1)]).beat, vec![10]);
    }

    fn key() -> DrainKey {
        DrainKey {
            cluster: "ns/c".into(),
            node: "n1".into(),
            capture_queue: "q".into(),
        }
    }

    #[test]
    fn a_refused_batch_makes_the_drain_not_draining_naming_since_when_and_what_it_holds() {
        let health = DrainHealth::default();
        health.set(&key(), true, None);
        assert_eq!(health.draining(&key(), Duration::from_secs(60)), Ok(()));
        health.set_holding(&key(), true, Some("database unavailable".into()), 200);
        let first = health
            .draining(&key(), Duration::from_secs(60))
            .expect_err("refused");
        assert!(first.contains("database unavailable (since "), "{first}");
        assert!(first.ends_with("200 copies held unsettled"), "{first}");
        // The same run of refusals keeps its start, so the message does not change.
        health.set_holding(&key(), true, Some("database unavailable".into()), 200);
        assert_eq!(
            health.draining(&key(), Duration::from_secs(60)).err(),
            Some(first)
        );
        health.set(&key(), true, None);
        assert_eq!(health.draining(&key(), Duration::from_secs(60)), Ok(()));
    }

    #[test]
    fn a_batch_waiting_on_the_database_too_long_makes_the_drain_not_draining() {
        let health = DrainHealth::default();
        health.set_holding(&key(), true, None, 7);
        assert_eq!(
            health.draining(&key(), Duration::from_secs(60)),
            Ok(()),
            "just started"
        );
        if let Ok(mut m) = health.inner.lock()
            && let Some(s) = m.get_mut(&key())
        {
            s.alive_at = Instant::now() - STORE_STALLED - Duration::from_secs(1);
        }
        let why = health
            .draining(&key(), Duration::from_secs(60))
            .expect_err("stalled");
        assert!(
            why.starts_with("a batch of 7 copies has waited on the database since"),
            "{why}"
        );
    }

    fn death(cause: DeathCause) -> Death {
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
        let why = health
            .draining(&key(), Duration::from_secs(60))
            .expect_err("dead");
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
        let why = health
            .draining(&key(), Duration::from_secs(60))
            .expect_err("dead");
        assert!(
            why.starts_with("drain died: its task ended without being stopped, 3 deaths in a row; restarts at 2027-01-15T08:00:04Z"),
            "{why}"
        );
    }

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
        let taken = super::super::supervise::take_ended(&mut drains).await;
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

    #[test]
    fn the_rate_cap_grants_at_most_its_rate() {
        let mut cap = RateCap::new(10);
        assert_eq!(cap.take(25), 10);
        assert_eq!(cap.take(5), 0);
    }
}
