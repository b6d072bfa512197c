//! Settings, from the environment (deploy/dev/bench passes them on). The defaults are issue
//! 16's sizes; development runs set small ones.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Fanout,
    Scale,
    Capture,
    Footprint,
    /// Faults at size (issue 41): only when named, never in `all` (it stops and freezes
    /// brokers of the bed).
    Faults,
    /// Shards (issue 46): three broker clusters on one replica, then on three sharded replicas;
    /// only when named, never in `all`.
    Shards,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Fanout => "fanout",
            Scenario::Scale => "scale",
            Scenario::Capture => "capture",
            Scenario::Footprint => "footprint",
            Scenario::Faults => "faults",
            Scenario::Shards => "shards",
        }
    }

    fn parse(s: &str) -> Result<Vec<Scenario>> {
        Ok(match s {
            "" | "all" => vec![
                Scenario::Fanout,
                Scenario::Scale,
                Scenario::Capture,
                Scenario::Footprint,
            ],
            "fanout" | "1" => vec![Scenario::Fanout],
            "scale" | "2" => vec![Scenario::Scale],
            "capture" | "3" => vec![Scenario::Capture],
            "footprint" | "4" => vec![Scenario::Footprint],
            "faults" | "5" => vec![Scenario::Faults],
            "shards" | "6" => vec![Scenario::Shards],
            other => {
                bail!("unknown scenario {other:?}: fanout, scale, capture, footprint, faults, shards or all")
            }
        })
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub scenarios: Vec<Scenario>,
    pub run_id: String,
    pub out_dir: PathBuf,
    pub repo: PathBuf,
    pub operator_bin: PathBuf,
    /// Scenario 1: rounds of create → update filter → delete, each measured three ways.
    pub fanout_repeats: usize,
    /// Scenario 2: queue counts, and runs per count.
    pub sizes: Vec<usize>,
    /// Scenario 2: rounds of one create, one filter change and one delete at N converged (after
    /// one warm-up round), each next to the same bare Jolokia exec.
    pub single_repeats: usize,
    /// Scenario 2: the directory of the shared floor scripts (`ideal_operator.py`), run once per
    /// size next to the harness's own port of the floor; None when switched off.
    pub shared_floor: Option<PathBuf>,
    /// Runs per size, one per entry of `sizes` (one value given: the same for every size).
    pub scale_repeats: Vec<usize>,
    /// Seconds of the converged window (scenario 2) and the idle windows (scenario 4).
    pub converged_seconds: u64,
    /// A LIST of the queues once a second while a burst is served, as `../shared/bench/
    /// wait_ready.py` and `delete_all.py` wait (the load the operator is judged under).
    pub list_observer: bool,
    pub idle_seconds: u64,
    /// Scenario 4: queues and capture subscriptions at idle.
    pub footprint_queues: usize,
    pub footprint_subscriptions: usize,
    /// Scenario 3: messages per producer round (and twice as many preloaded for ingest), rounds.
    pub capture_messages: usize,
    pub capture_repeats: usize,
    /// Queues in flight in the bare Jolokia baselines (each fanned out to every node).
    pub in_flight: usize,
    /// The harness's API creates and deletes in flight: the operator's input. Apart from
    /// `in_flight`, so that the rate at which the API server takes the input is not what the
    /// operator's figure measures (8 in flight: about 58 creates/s on this bed).
    pub apply_in_flight: usize,
    /// The longest wait for one queue to converge, per queue in the batch (at least 120 s).
    pub wait_ms_per_queue: u64,
    /// Queues are durable (the CRD's default; a journal write per create on every node) unless
    /// ARTEMIS_STUDIO_BENCH_DURABLE=false: the operator's and the bare baselines' alike.
    pub durable: bool,
    /// Creates per POST per node in the bulk baseline (scenario 2).
    pub bulk: usize,
    /// Scenario 5: queues (each with a divert), captured addresses, the producer's messages per
    /// second, seconds c3 stays frozen.
    pub faults_queues: usize,
    pub faults_taps: usize,
    pub faults_rate: f64,
    pub faults_freeze_seconds: u64,
    /// Scenario 6: queues per broker cluster (three clusters), and the replica counts run one
    /// after the other (1: one replica as the chart runs it, unsharded; more: sharded).
    pub shards_queues: usize,
    pub shards_replicas: Vec<usize>,
    /// Scenario 2 without the bare baselines and the floor (a profile of the operator alone:
    /// every ratio then reads NaN): ARTEMIS_STUDIO_BENCH_BASELINES=false.
    pub baselines: bool,
    /// The operator's RUST_LOG (default `warn`): its log is next to the report.
    pub operator_log: String,
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(key) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|e| anyhow::anyhow!("{key}={v}: {e}")),
        _ => Ok(default),
    }
}

/// A comma-separated list of counts from the environment (`default` when unset).
fn env_list(key: &str, default: &str) -> Result<Vec<usize>> {
    std::env::var(key)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<usize>().with_context(|| format!("{key}: {s}")))
        .collect()
}

/// Where the shared floor scripts are: ARTEMIS_STUDIO_BENCH_SHARED_FLOOR (`off` switches them
/// off), else `../shared/bench` next to the checkout. Whether the directory exists is checked
/// when the scenario runs (a clean clone has none: the report says so).
fn shared_floor_dir(repo: &std::path::Path) -> Option<PathBuf> {
    match std::env::var("ARTEMIS_STUDIO_BENCH_SHARED_FLOOR") {
        Ok(v) if matches!(v.trim(), "off" | "none" | "false") => None,
        Ok(v) if !v.trim().is_empty() => Some(PathBuf::from(v.trim())),
        _ => Some(repo.join("../shared/bench")),
    }
}

impl Config {
    pub fn from_env() -> Result<Config> {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let sizes = env_list("ARTEMIS_STUDIO_BENCH_SIZES", "500,10000")?;
        let repeats = env_list("ARTEMIS_STUDIO_BENCH_SCALE_REPEATS", "3")?;
        let scale_repeats = match repeats.as_slice() {
            [one] => vec![*one; sizes.len()],
            many if many.len() == sizes.len() => many.to_vec(),
            _ => anyhow::bail!(
                "ARTEMIS_STUDIO_BENCH_SCALE_REPEATS: give one count, or one per size of ARTEMIS_STUDIO_BENCH_SIZES ({} sizes)",
                sizes.len()
            ),
        };
        let run_id = format!("r{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
        let shared_floor = shared_floor_dir(&repo);
        Ok(Config {
            scenarios: Scenario::parse(&std::env::var("ARTEMIS_STUDIO_BENCH_SCENARIO").unwrap_or_default())?,
            run_id,
            out_dir: std::env::var("ARTEMIS_STUDIO_BENCH_OUT")
                .map(PathBuf::from)
                .unwrap_or_else(|_| repo.join("target/bench")),
            operator_bin: std::env::var("ARTEMIS_STUDIO_BENCH_OPERATOR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_artemis-studio-operator"))),
            repo,
            fanout_repeats: env_or("ARTEMIS_STUDIO_BENCH_FANOUT_REPEATS", 20)?,
            sizes,
            single_repeats: env_or("ARTEMIS_STUDIO_BENCH_SINGLE_REPEATS", 5)?,
            shared_floor,
            scale_repeats,
            converged_seconds: env_or("ARTEMIS_STUDIO_BENCH_CONVERGED_SECONDS", 60)?,
            list_observer: env_or("ARTEMIS_STUDIO_BENCH_LIST_OBSERVER", true)?,
            idle_seconds: env_or("ARTEMIS_STUDIO_BENCH_IDLE_SECONDS", 60)?,
            footprint_queues: env_or("ARTEMIS_STUDIO_BENCH_FOOTPRINT_QUEUES", 1000)?,
            footprint_subscriptions: env_or("ARTEMIS_STUDIO_BENCH_FOOTPRINT_SUBSCRIPTIONS", 334)?,
            capture_messages: env_or("ARTEMIS_STUDIO_BENCH_CAPTURE_MESSAGES", 2000)?,
            capture_repeats: env_or("ARTEMIS_STUDIO_BENCH_CAPTURE_REPEATS", 5)?,
            in_flight: env_or("ARTEMIS_STUDIO_BENCH_IN_FLIGHT", 8)?,
            apply_in_flight: env_or("ARTEMIS_STUDIO_BENCH_APPLY_IN_FLIGHT", 32)?,
            wait_ms_per_queue: env_or("ARTEMIS_STUDIO_BENCH_WAIT_MS_PER_QUEUE", 500)?,
            durable: env_or("ARTEMIS_STUDIO_BENCH_DURABLE", true)?,
            bulk: env_or("ARTEMIS_STUDIO_BENCH_BULK", 64)?,
            faults_queues: env_or("ARTEMIS_STUDIO_BENCH_FAULTS_QUEUES", 2000)?,
            faults_taps: env_or("ARTEMIS_STUDIO_BENCH_FAULTS_TAPS", 300)?,
            faults_rate: env_or("ARTEMIS_STUDIO_BENCH_FAULTS_RATE", 60.0)?,
            faults_freeze_seconds: env_or("ARTEMIS_STUDIO_BENCH_FAULTS_FREEZE_SECONDS", 45)?,
            shards_queues: env_or("ARTEMIS_STUDIO_BENCH_SHARDS_QUEUES", 2000)?,
            shards_replicas: env_list("ARTEMIS_STUDIO_BENCH_SHARDS_REPLICAS", "1,3")?,
            baselines: env_or("ARTEMIS_STUDIO_BENCH_BASELINES", true)?,
            operator_log: std::env::var("ARTEMIS_STUDIO_BENCH_OPERATOR_LOG")
                .unwrap_or_else(|_| "warn".into()),
        })
    }

    pub fn json(&self) -> Value {
        json!({
            "fanoutRepeats": self.fanout_repeats, "sizes": self.sizes, "scaleRepeats": self.scale_repeats,
            "singleRepeats": self.single_repeats,
            "sharedFloor": self.shared_floor.as_ref().map(|d| d.display().to_string()),
            "convergedSeconds": self.converged_seconds, "idleSeconds": self.idle_seconds,
            "captureMessages": self.capture_messages, "captureRepeats": self.capture_repeats,
            "footprintQueues": self.footprint_queues, "footprintSubscriptions": self.footprint_subscriptions,
            "faultsQueues": self.faults_queues, "faultsTaps": self.faults_taps,
            "faultsRate": self.faults_rate, "faultsFreezeSeconds": self.faults_freeze_seconds,
            "shardsQueues": self.shards_queues, "shardsReplicas": self.shards_replicas,
            "baselines": self.baselines, "listObserver": self.list_observer, "operatorLog": self.operator_log,
            "inFlight": self.in_flight, "applyInFlight": self.apply_in_flight, "operator": self.operator_bin.display().to_string(),
        })
    }

    pub fn wait_for(&self, queues: usize) -> std::time::Duration {
        std::time::Duration::from_millis((self.wait_ms_per_queue * queues as u64).max(120_000))
    }
}
