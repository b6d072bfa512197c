//! The batch store (ADR-0062 D4, D9): a batch's copies as rows, the subscription's rate cap,
//! one insert per part of the batch (split to find a copy Postgres refuses), the loss counted,
//! and the batch held unsettled while the database is unavailable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fe2o3_amqp::link::delivery::{Delivery, DeliveryInfo};
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use tokio::sync::watch;

use super::DrainSpec;
use super::health::{DrainHealth, DrainProblem};
use crate::capture::split::{Refusal, Sink, SplitInsert};
use crate::store::captured::{CapturedRow, LossAt};
use crate::store::{NO_PARTITION_OR_CHECK, Store, StoreError};

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

/// A delivered copy, or one the AMQP library could not decode (it is settled with its batch
/// and counted as loss, cause `undecodable`: redelivering it would stop the drain for ever).
pub(super) enum Received {
    Decoded(Box<Delivery<Body<Value>>>),
    Undecodable(DeliveryInfo),
}

impl Received {
    pub(super) fn info(&self) -> DeliveryInfo {
        match self {
            Received::Decoded(d) => DeliveryInfo::from(d.as_ref()),
            Received::Undecodable(i) => i.clone(),
        }
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
            return Err(Refusal::Data { sqlstate: code });
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
        .map(|d| crate::capture::row::row(&spec.key.node, &spec.tap, spec.max_body_bytes, d.message()))
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
pub(super) async fn store_batch(
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
                let held = DrainProblem::BatchHeld(Arc::new(e));
                health.set_holding(&spec.key, true, Some(held), batch.len());
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
    let m = &spec.metrics;
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

    #[test]
    fn the_rate_cap_grants_at_most_its_rate() {
        let mut cap = RateCap::new(10);
        assert_eq!(cap.take(25), 10);
        assert_eq!(cap.take(5), 0);
    }
}
