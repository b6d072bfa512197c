//! Capture metrics (ADR-0062 D9): what the drains stored and dropped, by subscription and cause,
//! batch sizes, insert latency and drain lag. Counted process-wide (drains run in their own tasks
//! and have no handle to [`super::Metrics`]); every replica exports what its own drains did.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SubscriptionLabels {
    /// `namespace/cluster`
    pub cluster: String,
    pub subscription: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    pub cluster: String,
    pub subscription: String,
    /// `rate_cap`, `ring_overwrite`, `address_full` or `broker_restart` (as in `capture_loss`).
    pub cause: String,
}

type HistogramFamily = Family<SubscriptionLabels, Histogram, fn() -> Histogram>;

fn batch_histogram() -> Histogram {
    // 1 … 256 copies: a batch is at most `capture::drain::BATCH`.
    Histogram::new(exponential_buckets(1.0, 2.0, 9))
}

fn seconds_histogram() -> Histogram {
    // 1 ms … ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The capture metric families (one per process).
pub struct CaptureMetrics {
    /// Copies stored in Postgres (a redelivered copy already stored is not counted again).
    pub stored: Family<SubscriptionLabels, Counter>,
    /// Copies lost, by cause: dropped by the rate cap here, or estimated from the broker's
    /// counters (ring overwrites, a full capture address, a counter reset).
    pub dropped: Family<DropLabels, Counter>,
    /// Copies per committed batch.
    pub batch_size: HistogramFamily,
    /// Seconds one batch insert took (commit included).
    pub insert_seconds: HistogramFamily,
    /// Seconds from the broker routing the oldest copy of the latest batch to its commit.
    pub drain_lag_seconds: Family<SubscriptionLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Drains running in this process.
    pub drains: Gauge,
    /// Messages a browse saw and stored (mode Sample, rows marked origin=sampled): what was
    /// still on a queue when it was browsed, never a count of what was sent.
    pub sampled: Family<SubscriptionLabels, Counter>,
}

impl CaptureMetrics {
    fn new() -> Self {
        CaptureMetrics {
            stored: Family::default(),
            dropped: Family::default(),
            batch_size: Family::new_with_constructor(batch_histogram),
            insert_seconds: Family::new_with_constructor(seconds_histogram),
            drain_lag_seconds: Family::default(),
            drains: Gauge::default(),
            sampled: Family::default(),
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "capture_stored",
            "Captured copies stored in Postgres, by subscription",
            self.stored.clone(),
        );
        registry.register(
            "capture_dropped",
            "Captured copies lost, by subscription and cause (rate_cap, ring_overwrite, address_full, broker_restart)",
            self.dropped.clone(),
        );
        registry.register(
            "capture_batch_size",
            "Copies per committed capture batch",
            self.batch_size.clone(),
        );
        registry.register(
            "capture_insert_duration_seconds",
            "Duration of one capture batch insert",
            self.insert_seconds.clone(),
        );
        registry.register(
            "capture_drain_lag_seconds",
            "Seconds from routing the oldest copy of the latest batch to its commit",
            self.drain_lag_seconds.clone(),
        );
        registry.register(
            "capture_drains",
            "Capture drains running in this process",
            self.drains.clone(),
        );
        registry.register(
            "capture_sampled",
            "Messages stored by sampling (a browse saw them still on the queue; never complete), by subscription",
            self.sampled.clone(),
        );
    }

    pub fn dropped(&self, cluster: &str, subscription: &str, cause: &str, n: u64) {
        if n > 0 {
            self.dropped
                .get_or_create(&DropLabels {
                    cluster: cluster.into(),
                    subscription: subscription.into(),
                    cause: cause.into(),
                })
                .inc_by(n);
        }
    }
}

pub fn metrics() -> &'static CaptureMetrics {
    static METRICS: OnceLock<CaptureMetrics> = OnceLock::new();
    METRICS.get_or_init(CaptureMetrics::new)
}
