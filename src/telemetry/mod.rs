//! The operator's own HTTP surface: `/healthz`, `/readyz` and `/metrics` (Prometheus text).

pub mod capture;
pub mod census;
pub mod jolokia;
pub mod kube_api;

#[cfg(test)]
mod contract;

pub use kube_api::{api_client, api_client_with};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabels {
    pub command: String,
    pub verdict: String,
    /// `namespace/name` of the ArtemisCluster the command went to.
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub kind: String,
    /// `namespace/name` of the ArtemisCluster the object names (its own for a cluster).
    pub cluster: String,
    /// `ok`, or the error's condition reason.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindClusterLabels {
    pub kind: String,
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    /// `namespace/name` of the ArtemisCluster.
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapturePassLabels {
    /// `ok` or `failed`.
    pub result: String,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.005, 2.0, 14)
}

/// Counters every command updates.
pub struct Metrics {
    registry: Registry,
    pub commands: Family<CommandLabels, Counter>,
    pub node_outcomes: Family<OutcomeLabels, Counter>,
    pub reconciles: Family<ReconcileLabels, Counter>,
    pub reconcile_seconds: Family<KindClusterLabels, Histogram>,
    /// Finished reconciles per kind, whatever the result (not exported: the sum of `reconciles`).
    finished: Family<KindLabels, Counter>,
    /// Passes that judged an object against its cluster's snapshot (not those that waited for a
    /// first poll or stopped earlier): evidence that the object's state is known.
    pub planned: Family<KindLabels, Counter>,
    pub poll_seconds: Family<ClusterLabels, Histogram>,
    /// Broker objects (queues, addresses, diverts) in the latest poll, over every node.
    pub inventory_objects: Family<ClusterLabels, Gauge>,
    /// Capture passes this process ran (it held the cluster's advisory lock), by result.
    pub capture_passes: Family<CapturePassLabels, Counter>,
    /// Events not published: the publisher's queue did not take them (`controllers::events`).
    pub events_dropped: Counter,
    /// Kubernetes API requests made through `api_client`.
    pub kube_api: kube_api::ApiMetrics,
    /// `artemis_studio_leader`: 1 while this process leads (holds the Lease, or leader election
    /// is off), 0 as a standby.
    pub leader: Gauge,
    /// `artemis_studio_clusters_held`: the broker clusters this replica holds (sharding,
    /// issue 46; without it, unset).
    pub clusters_held: Gauge,
    /// `artemis_studio_sharding`: 1 when replicas share the clusters by Lease (`--sharding`),
    /// 0 with one leader (what the unheld-cluster alert keys on).
    pub sharding: Gauge,
    /// Objects by Ready reason, Stalled objects, nodes per cluster, taps by state: counted from
    /// the controllers' caches at scrape time (`controllers::census`).
    pub census: census::Census,
    /// The Jolokia families the operator's broker registry counts into (`broker::Registry`).
    pub jolokia: std::sync::Arc<jolokia::JolokiaMetrics>,
    /// The capture families (drains, sampling, loss).
    pub capture: std::sync::Arc<capture::CaptureMetrics>,
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
        let reconcile_seconds =
            Family::<KindClusterLabels, Histogram>::new_with_constructor(
                || Histogram::new(seconds_buckets()),
            );
        let poll_seconds =
            Family::<ClusterLabels, Histogram>::new_with_constructor(|| Histogram::new(seconds_buckets()));
        let inventory_objects = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration by kind",
            reconcile_seconds.clone(),
        );
        registry.register(
            "inventory_poll_duration_seconds",
            "Duration of one cluster's topology and inventory poll",
            poll_seconds.clone(),
        );
        registry.register(
            "inventory_objects",
            "Queues, addresses and diverts in a cluster's latest poll, summed over its live nodes",
            inventory_objects.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "Finished reconciles by kind and result",
            reconciles.clone(),
        );
        registry.register("commands", "Audited broker commands by verdict", commands.clone());
        let planned = Family::<KindLabels, Counter>::default();
        registry.register(
            "planned_passes",
            "Reconciles that judged an object against its cluster's latest snapshot, by kind",
            planned.clone(),
        );
        registry.register(
            "node_outcomes",
            "Per-node outcomes of commands",
            node_outcomes.clone(),
        );
        let capture_passes = Family::<CapturePassLabels, Counter>::default();
        registry.register(
            "capture_passes",
            "Capture passes run by this process (holding the cluster's advisory lock), by result",
            capture_passes.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            "Events not published: the publisher's queue did not take them (1,024 waiting, or the publisher ended)",
            events_dropped.clone(),
        );
        let jolokia = std::sync::Arc::new(jolokia::JolokiaMetrics::default());
        jolokia.register(&mut registry);
        let capture = std::sync::Arc::new(capture::CaptureMetrics::default());
        capture.register(&mut registry);
        let kube_api = kube_api::ApiMetrics::default();
        kube_api.register(&mut registry);
        registry.register(
            "leader",
            "1 while this process leads (holds the Lease), 0 as a standby",
            leader.clone(),
        );
        let clusters_held = Gauge::default();
        registry.register(
            "clusters_held",
            "Broker clusters this replica holds by Lease and acts for (sharding)",
            clusters_held.clone(),
        );
        let sharding = Gauge::default();
        registry.register(
            "sharding",
            "1 when replicas share the broker clusters out by Lease (--sharding), 0 with one leader",
            sharding.clone(),
        );
        let census = census::Census::default();
        registry.register_collector(Box::new(census.clone()));
        Metrics {
            registry,
            census,
            commands,
            node_outcomes,
            reconciles,
            reconcile_seconds,
            finished: Family::default(),
            planned,
            poll_seconds,
            inventory_objects,
            capture_passes,
            events_dropped,
            kube_api,
            leader,
            clusters_held,
            sharding,
            jolokia,
            capture,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Passes of one kind that judged an object against its cluster's snapshot.
    pub fn planned_of(&self, kind: &str) -> u64 {
        self.planned
            .get_or_create(&KindLabels { kind: kind.into() })
            .get()
    }

    /// Finished reconciles of one kind, whatever their result: evidence that a pass ran.
    pub fn reconciles_of(&self, kind: &str) -> u64 {
        self.finished
            .get_or_create(&KindLabels { kind: kind.into() })
            .get()
    }

    /// Count one finished reconcile of `kind` (of `cluster`) with its result (`ok` or the
    /// condition reason).
    pub fn reconciled(&self, kind: &str, cluster: &str, result: &str, seconds: f64) {
        let of = KindClusterLabels {
            kind: kind.into(),
            cluster: cluster.into(),
        };
        self.reconcile_seconds.get_or_create(&of).observe(seconds);
        self.finished
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
        self.reconciles
            .get_or_create(&ReconcileLabels {
                kind: kind.into(),
                cluster: cluster.into(),
                result: result.into(),
            })
            .inc();
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn set_not_ready(&self) {
        self.ready.store(false, Ordering::Release);
    }

    /// What `/readyz` answers now. As the leader (or with leader election off), false means the
    /// controllers have not started: `controllers::run_all` sets it only once the caches
    /// synced, just before it starts them, so no reconcile can be in flight (src/leader.rs).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn set_clusters_held(&self, held: usize) {
        self.clusters_held.set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// The metrics in the Prometheus text format (what `/metrics` serves).
    pub fn encode_text(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serve the probes and metrics until the process ends. A supervised task that ended unasked,
/// or stopped beating, makes both probes fail, naming it (issue 43).
pub async fn serve(
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
    supervisor: crate::supervisor::Supervisor,
) -> std::io::Result<()> {
    use axum::routing::get;
    let ready = metrics.clone();
    let scrape = metrics.clone();
    let live = supervisor.clone();
    let app = axum::Router::new()
        .route("/healthz", get(move || async move { probe(&live, true, "ok") }))
        .route(
            "/readyz",
            get(move || {
                let answer = probe(&supervisor, ready.ready.load(Ordering::Relaxed), "ready");
                async move { answer }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let body = scrape.encode_text();
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

/// A probe's answer: failing with the task that ended, else as `ok` says.
fn probe(
    supervisor: &crate::supervisor::Supervisor,
    ok: bool,
    ok_text: &str,
) -> (axum::http::StatusCode, String) {
    use axum::http::StatusCode;
    match supervisor.unhealthy() {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        None if ok => (StatusCode::OK, ok_text.into()),
        None => (StatusCode::SERVICE_UNAVAILABLE, "starting".into()),
    }
}

#[cfg(test)]
mod probes {
    use super::*;

    /// GET `path` on the served probes: (status, body).
    async fn get(port: u16, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
            .await
            .expect("the probes answer");
        (r.status().as_u16(), r.text().await.expect("a body"))
    }

    /// Issue 43: what a kubelet sees — `/readyz` 503 "starting" until the controllers start,
    /// then 200; a supervised task that ended unasked fails both probes with 503, naming it.
    #[tokio::test]
    async fn readyz_is_503_until_ready_and_both_probes_503_naming_a_task_that_ended() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let metrics = Arc::new(Metrics::default());
        let supervisor = crate::supervisor::Supervisor::default();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        tokio::spawn(serve(addr, metrics.clone(), supervisor.clone()));
        // Until the server listens (at most 2 s).
        for _ in 0..100 {
            if reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(
            get(port, "/readyz").await,
            (503, "starting".into()),
            "not ready before the controllers start"
        );
        assert_eq!(get(port, "/healthz").await, (200, "ok".into()));
        metrics.set_ready();
        assert_eq!(get(port, "/readyz").await, (200, "ready".into()));
        supervisor.spawn("capture", async { panic!("boom") });
        supervisor.first_end().await;
        for path in ["/readyz", "/healthz"] {
            let (status, why) = get(port, path).await;
            assert_eq!(status, 503, "{path}: {why}");
            assert!(why.contains("capture") && why.contains("boom"), "{path}: {why}");
        }
    }
}
