//! The operator's own HTTP surface: `/healthz`, `/readyz` and `/metrics` (Prometheus text).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabels {
    pub command: String,
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub kind: String,
    /// `ok`, or the error's condition reason.
    pub result: String,
}

/// Counters every command updates.
pub struct Metrics {
    registry: Registry,
    pub commands: Family<CommandLabels, Counter>,
    pub node_outcomes: Family<OutcomeLabels, Counter>,
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// `artemis_studio_leader`: 1 while this process leads (holds the Lease, or leader election
    /// is off), 0 as a standby.
    pub leader: Gauge,
    /// What `/readyz` answers. Only set after the migrations ran; then true as a standby that
    /// sees the Lease held by another process (src/leader.rs), and as the leader once the caches
    /// synced (`controllers::run_all`).
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("artemis_studio");
        let commands = Family::<CommandLabels, Counter>::default();
        let node_outcomes = Family::<OutcomeLabels, Counter>::default();
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "Finished reconciles by kind and result",
            reconciles.clone(),
        );
        registry.register("commands", "Audited broker commands by verdict", commands.clone());
        registry.register(
            "node_outcomes",
            "Per-node outcomes of commands",
            node_outcomes.clone(),
        );
        registry.register(
            "leader",
            "1 while this process leads (holds the Lease), 0 as a standby",
            leader.clone(),
        );
        Metrics {
            registry,
            commands,
            node_outcomes,
            reconciles,
            leader,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Finished reconciles of one kind, whatever their result: evidence that a pass ran.
    pub fn reconciles_of(&self, kind: &str) -> u64 {
        ["ok", "error"]
            .iter()
            .map(|r| {
                self.reconciles
                    .get_or_create(&ReconcileLabels {
                        kind: kind.into(),
                        result: (*r).into(),
                    })
                    .get()
            })
            .sum()
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    pub fn set_not_ready(&self) {
        self.ready.store(false, Ordering::Relaxed);
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serve the probes and metrics until the process ends.
pub async fn serve(addr: std::net::SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let ready = metrics.clone();
    let scrape = metrics.clone();
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.ready.load(Ordering::Relaxed);
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "starting")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let body = scrape.encode();
                async move {
                    (
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
