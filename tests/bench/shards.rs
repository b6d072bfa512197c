//! Scenario 6, shards (issue 46): three broker clusters, each in a namespace of its own — `c`
//! (the bed's 3-node static cluster), `ha` (the replicated primary/backup pair and its third
//! node) and another namespace's `c` over c's brokers — with `shards_queues` queues each,
//! declared at once over the three (`apply_in_flight` creates in flight in all). First on one
//! operator replica as the chart runs one (unsharded), then on three sharded replicas
//! (`--sharding`: one database, one instance ID, POD_NAME `bench-replica-0..2`), each count in
//! fresh namespaces and a fresh database. Measured for each count, side by side: creates/s
//! (first create → last Ready), create → Ready p50/p99 (the API server's timestamps), per replica
//! its peak and converged RSS, its CPU seconds and the clusters it holds (`status.heldBy`, and
//! its `artemis_studio_clusters_held`), and per cluster the time to its own last Ready and its
//! polls during the burst: whether one cluster waited on another.
//!
//! Only when named (`deploy/dev/bench shards`), never in `all`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::future::{join_all, try_join_all};

use crate::bed;
use crate::install::{BROKERS_DOWN_LIMIT, Ctx, settle};
use crate::jolokia::Jolokia;
use crate::metrics::OperatorCounts;
use crate::objects::{Objects, QueueWatch};
use crate::operator::{Launch, Operator};
use crate::report::Section;
use crate::stats;

/// The three clusters: namespace tag, ArtemisCluster name, the bed's cluster of its brokers.
const CLUSTERS: [(&str, &str, &str); 3] = [("c", "c", "c"), ("ha", "ha", "ha"), ("c2", "c", "c")];

/// How long the sharded replicas get to share the clusters out before the creates start.
const BALANCE_LIMIT: Duration = Duration::from_secs(120);

/// What one replica held and cost.
#[derive(Default, Clone)]
pub struct ReplicaFigures {
    pub pod: String,
    /// The clusters (`namespace/name`) whose `status.heldBy` names this replica, after the
    /// converged window; unsharded, every cluster (the one replica acts for them all, and
    /// heldBy is written only when sharded).
    pub held: Vec<String>,
    /// Its `artemis_studio_clusters_held` then (0 unsharded: the gauge is the shard loop's).
    pub held_gauge: f64,
    /// Peak resident set since it started (VmHWM), and at the end of the converged window.
    pub rss_peak_bytes: f64,
    pub rss_converged_bytes: f64,
    /// CPU seconds (user + system) from the first create to the last Ready, and in the window.
    pub cpu_burst_seconds: f64,
    pub cpu_window_seconds: f64,
}

/// One cluster's queues.
#[derive(Default, Clone)]
pub struct ClusterFigures {
    /// `namespace/name`.
    pub key: String,
    pub held_by: Option<String>,
    /// Seconds from the first create (of any cluster) to this cluster's last queue Ready; NaN
    /// when not every queue got there (`not_ready` of them did not).
    pub last_ready_seconds: f64,
    pub not_ready: usize,
    /// Create → Ready from the API server's timestamps, whole seconds.
    pub api_ready_p50: f64,
    pub api_ready_p99: f64,
    /// Polls of this cluster from the first create to the last Ready (every replica's), and
    /// their mean duration, seconds.
    pub burst_polls: f64,
    pub mean_poll_seconds: f64,
}

/// One replica count.
#[derive(Default, Clone)]
pub struct Phase {
    pub replicas: usize,
    pub sharded: bool,
    /// Queues over the three clusters.
    pub queues: usize,
    /// The harness's creates the API server acknowledged, per second: the input's bound.
    pub apply_rate: f64,
    /// Queues/s from the first create to the last Ready (NaN when not every queue got there).
    pub create_rate: f64,
    /// Seconds from the first create to the last Ready (or to giving up).
    pub burst_seconds: f64,
    pub api_ready_p50: f64,
    pub api_ready_p99: f64,
    /// Seconds (after the clusters were created) until every cluster was held and no replica
    /// held more than its share; None unsharded or when it did not happen within the limit.
    pub balanced_seconds: Option<f64>,
    pub replica_figures: Vec<ReplicaFigures>,
    pub clusters: Vec<ClusterFigures>,
}

/// A replica count's result, or why it could not run.
pub struct Outcome {
    pub replicas: usize,
    pub phase: std::result::Result<Phase, String>,
}

/// One cluster of a fleet: its namespace's objects, the queues declared on it, their watch.
struct Member {
    objects: Objects,
    key: String,
    names: Vec<String>,
    prefix: String,
    watch: QueueWatch,
}

/// The operator replicas watching the three namespaces, and the clusters.
struct Fleet {
    replicas: Vec<Operator>,
    pods: Vec<String>,
    members: Vec<Member>,
    namespaces: Vec<String>,
    db: String,
    sharded: bool,
}

pub async fn run(ctx: &Ctx) -> Result<Section> {
    if ctx.cfg.shards_replicas.is_empty() || ctx.cfg.shards_replicas.contains(&0) {
        bail!("ARTEMIS_STUDIO_BENCH_SHARDS_REPLICAS: replica counts of 1 or more");
    }
    let ha = ha_brokers(ctx).await?;
    let mut outcomes = vec![];
    for &replicas in &ctx.cfg.shards_replicas {
        println!(
            "bench: shards, {} clusters × {} queues on {replicas} replica(s)",
            CLUSTERS.len(),
            ctx.cfg.shards_queues
        );
        let phase = phase(ctx, &ha, replicas).await.map_err(|e| {
            eprintln!("[bench] shards on {replicas} replica(s): {e:#}");
            format!("{e:#}")
        });
        outcomes.push(Outcome { replicas, phase });
    }
    Ok(crate::shards_report::section(ctx, &outcomes))
}

/// Bare Jolokia to the live brokers of the bed's cluster `ha` (not the backup), registered
/// so the run's cleanup removes the run's queues from them too.
async fn ha_brokers(ctx: &Ctx) -> Result<Jolokia> {
    let live: Vec<bed::Broker> = ctx
        .bed
        .cluster_brokers("ha")?
        .into_iter()
        .filter(|b| b.role != "backup")
        .collect();
    if live.is_empty() {
        bail!("the test bed has no cluster ha");
    }
    let ha = Jolokia::connect(&live, ctx.bed.broker_user()?).await?;
    ctx.register_brokers(ha.clone())?;
    Ok(ha)
}

/// One replica count in fresh namespaces and database: up, measured, down.
async fn phase(ctx: &Ctx, ha: &Jolokia, replicas: usize) -> Result<Phase> {
    let fleet = Fleet::up(ctx, ha, &format!("sh{replicas}"), replicas).await?;
    let measured = measure(ctx, &fleet).await;
    fleet.down(ctx).await;
    measured
}

impl Fleet {
    /// Three namespaces, one database, the replicas watching the namespaces, then the three
    /// ArtemisClusters (each waited until its nodes are live).
    async fn up(ctx: &Ctx, ha: &Jolokia, tag: &str, replicas: usize) -> Result<Fleet> {
        ctx.jolokia.wait_up(BROKERS_DOWN_LIMIT).await?;
        ha.wait_up(BROKERS_DOWN_LIMIT).await?;
        let db = ctx.database_name(tag);
        let namespaces: Vec<String> = CLUSTERS
            .iter()
            .map(|(label, _, _)| format!("bench-{}-{tag}-{label}", ctx.cfg.run_id))
            .collect();
        for (i, ns) in namespaces.iter().enumerate() {
            ctx.create_namespace(ns, (i == 0).then_some(db.as_str())).await?;
        }
        let url = ctx.bed.create_database(&db).await?;
        std::fs::create_dir_all(&ctx.cfg.out_dir)?;
        let sharded = replicas > 1;
        let pods: Vec<String> = (0..replicas).map(|i| format!("bench-replica-{i}")).collect();
        let mut started = vec![];
        for pod in &pods {
            started.push(start_replica(ctx, &url, &namespaces.join(","), pod, sharded, tag).await?);
        }
        let members = create_clusters(ctx, tag, &namespaces).await?;
        Ok(Fleet {
            replicas: started,
            pods,
            members,
            namespaces,
            db,
            sharded,
        })
    }

    /// Every replica stopped at once (SIGTERM: a sharded one releases its clusters), the
    /// namespaces and the database removed, the run's broker objects and Leases too.
    async fn down(self, ctx: &Ctx) {
        for stopped in join_all(self.replicas.into_iter().map(Operator::stop)).await {
            if let Err(e) = stopped {
                eprintln!("[bench] stop a replica: {e:#}");
            }
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            ctx.remove_namespace(ns, (i == 0).then_some(self.db.as_str()))
                .await;
        }
        ctx.clean_brokers().await;
        ctx.delete_leases().await;
    }

    async fn counts(&self) -> Result<Vec<OperatorCounts>> {
        try_join_all(self.replicas.iter().map(Operator::counts)).await
    }

    fn cpu_seconds(&self) -> Vec<f64> {
        self.replicas
            .iter()
            .map(|r| r.cpu_seconds().unwrap_or(f64::NAN))
            .collect()
    }

    /// `status.heldBy` of each cluster, in `members`' order.
    async fn held_by(&self) -> Result<Vec<Option<String>>> {
        try_join_all(self.members.iter().map(|m| m.objects.cluster_held_by())).await
    }

    /// Who acts for each cluster, in `members`' order: sharded, its `status.heldBy`; else the
    /// one replica, for every cluster.
    async fn holders(&self) -> Result<Vec<Option<String>>> {
        if self.sharded {
            return self.held_by().await;
        }
        Ok(vec![self.pods.first().cloned(); self.members.len()])
    }

    /// Whether every cluster is held and no replica holds more than its share, by the
    /// clusters' `status.heldBy` and by the replicas' own gauges.
    async fn balanced(&self) -> Result<bool> {
        let share = self.members.len().div_ceil(self.replicas.len());
        let held = self.held_by().await?;
        let gauges: Vec<f64> = self.counts().await?.iter().map(|c| c.clusters_held).collect();
        let by_status = held.iter().all(Option::is_some)
            && self
                .pods
                .iter()
                .all(|p| held.iter().filter(|h| h.as_deref() == Some(p)).count() <= share);
        let by_gauges = gauges.iter().sum::<f64>() == self.members.len() as f64
            && gauges.iter().all(|g| *g <= share as f64);
        Ok(by_status && by_gauges)
    }

    /// Seconds until [`Fleet::balanced`] held (None unsharded, or not within the limit).
    async fn wait_balanced(&self) -> Result<Option<f64>> {
        if !self.sharded {
            return Ok(None);
        }
        let start = Instant::now();
        while start.elapsed() < BALANCE_LIMIT {
            if self.balanced().await? {
                return Ok(Some(start.elapsed().as_secs_f64()));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("[bench] shards: the clusters were not shared out within {BALANCE_LIMIT:?}");
        Ok(None)
    }
}

/// One replica, as a pod of the chart would run it: its own POD_NAME, the release's Lease
/// namespace, the run's instance ID; sharded or not.
async fn start_replica(
    ctx: &Ctx,
    database_url: &str,
    namespaces: &str,
    pod: &str,
    sharded: bool,
    tag: &str,
) -> Result<Operator> {
    let mut env = vec![("POD_NAME", pod), ("LEASE_NAMESPACE", bed::OPERATOR_NAMESPACE)];
    if sharded {
        env.push(("SHARDING", "true"));
    }
    Operator::start(Launch {
        rust_log: &ctx.cfg.operator_log,
        binary: &ctx.cfg.operator_bin,
        kubeconfig: &ctx.bed.var("TESTBED_OPERATOR_KUBECONFIG")?,
        database_url,
        namespace: namespaces,
        instance_id: &ctx.instance_id(),
        log: ctx.cfg.out_dir.join(format!("operator-{tag}-{pod}.log")),
        extra_env: &env,
    })
    .await
}

/// The three ArtemisClusters (one per namespace), each with its queue names and a watch; the
/// harness's creates in flight shared between them.
async fn create_clusters(ctx: &Ctx, tag: &str, namespaces: &[String]) -> Result<Vec<Member>> {
    let user = ctx.bed.broker_user()?;
    let mut members = vec![];
    for ((label, name, bed_cluster), ns) in CLUSTERS.iter().zip(namespaces) {
        let brokers = ctx.bed.cluster_brokers(bed_cluster)?;
        let urls: Vec<String> = brokers.iter().map(|b| b.jolokia.clone()).collect();
        // Logical nodes: a backup is one with its primary.
        let live = brokers.iter().filter(|b| b.role != "backup").count() as u32;
        let mut objects = ctx.objects(ns);
        objects.cluster = name.to_string();
        objects.concurrency = ctx.cfg.apply_in_flight.div_ceil(CLUSTERS.len()).max(1);
        objects.create_cluster(&urls, &user, live).await?;
        let queues_tag = format!("{tag}{label}");
        members.push(Member {
            watch: QueueWatch::start(&objects),
            key: format!("{ns}/{name}"),
            names: ctx.queue_names(&queues_tag, ctx.cfg.shards_queues),
            prefix: ctx.prefix(&queues_tag),
            objects,
        });
    }
    Ok(members)
}

/// The clusters shared out, the burst, the converged window; every figure of the count.
async fn measure(ctx: &Ctx, fleet: &Fleet) -> Result<Phase> {
    let balanced_seconds = fleet.wait_balanced().await?;
    // Let the first polls pass, so the burst starts from idle replicas.
    settle(Duration::from_secs(3)).await;
    let mut phase = Phase {
        replicas: fleet.replicas.len(),
        sharded: fleet.sharded,
        balanced_seconds,
        ..Phase::default()
    };
    let cpu_before = fleet.cpu_seconds();
    let counts_before = fleet.counts().await?;
    burst(ctx, fleet, &mut phase).await?;
    let cpu_burst = fleet.cpu_seconds();
    let polls = poll_totals(&counts_before, &fleet.counts().await?);
    for (figures, member) in phase.clusters.iter_mut().zip(&fleet.members) {
        let (count, seconds) = polls.get(&member.key).copied().unwrap_or_default();
        figures.burst_polls = count;
        figures.mean_poll_seconds = if count > 0.0 { seconds / count } else { f64::NAN };
    }
    settle(Duration::from_secs(ctx.cfg.converged_seconds)).await;
    let cpu_window = fleet.cpu_seconds();
    let held = fleet.holders().await?;
    let counts = fleet.counts().await?;
    let cpu = cpu_before.iter().zip(&cpu_burst).zip(&cpu_window);
    for (((replica, pod), counts), ((before, burst), window)) in
        fleet.replicas.iter().zip(&fleet.pods).zip(&counts).zip(cpu)
    {
        let bytes = |b: Result<u64>| b.map_or(f64::NAN, |b| b as f64);
        phase.replica_figures.push(ReplicaFigures {
            pod: pod.clone(),
            held: (fleet.members.iter().zip(&held))
                .filter(|(_, h)| h.as_deref() == Some(pod.as_str()))
                .map(|(m, _)| m.key.clone())
                .collect(),
            held_gauge: counts.clusters_held,
            rss_peak_bytes: bytes(replica.peak_rss_bytes()),
            rss_converged_bytes: bytes(replica.rss_bytes()),
            cpu_burst_seconds: burst - before,
            cpu_window_seconds: window - burst,
        });
    }
    for (figures, holder) in phase.clusters.iter_mut().zip(held) {
        figures.held_by = holder;
    }
    Ok(phase)
}

/// Every cluster's queues created at once, until each is Ready (or the wait ends): the rates,
/// and per cluster its last Ready and its create → Ready percentiles.
async fn burst(ctx: &Ctx, fleet: &Fleet, phase: &mut Phase) -> Result<()> {
    let total: usize = fleet.members.iter().map(|m| m.names.len()).sum();
    phase.queues = total;
    let start = Instant::now();
    try_join_all(fleet.members.iter().map(|m| m.objects.create_queues(&m.names))).await?;
    phase.apply_rate = total as f64 / start.elapsed().as_secs_f64();
    let wait = ctx.cfg.wait_for(total);
    let ready = join_all(
        fleet
            .members
            .iter()
            .map(|m| m.watch.wait_all(&m.names, wait, "Ready", |s| s.ready)),
    )
    .await;
    phase.burst_seconds = start.elapsed().as_secs_f64();
    let mut all_lags = vec![];
    for (member, last) in fleet.members.iter().zip(ready) {
        let lags = member.objects.ready_lags(&member.prefix).await?;
        let (p50, p99) = stats::whole_second_p50_p99(&lags);
        all_lags.extend(lags);
        let (last_ready_seconds, not_ready) = match last {
            Ok(at) => (at.saturating_duration_since(start).as_secs_f64(), 0),
            Err(e) => {
                eprintln!("[bench] {}: {e:#}", member.key);
                (f64::NAN, member.watch.pending(&member.names, |s| s.ready))
            }
        };
        phase.clusters.push(ClusterFigures {
            key: member.key.clone(),
            last_ready_seconds,
            not_ready,
            api_ready_p50: p50,
            api_ready_p99: p99,
            ..ClusterFigures::default()
        });
    }
    let last = phase
        .clusters
        .iter()
        .map(|c| c.last_ready_seconds)
        .fold(0.0, f64::max);
    // f64::max skips NaN: a cluster not all Ready makes the rate NaN.
    let all_ready = phase.clusters.iter().all(|c| c.last_ready_seconds.is_finite());
    phase.create_rate = if all_ready && last > 0.0 {
        total as f64 / last
    } else {
        f64::NAN
    };
    (phase.api_ready_p50, phase.api_ready_p99) = stats::whole_second_p50_p99(&all_lags);
    println!(
        "bench: {total} creates on {} replica(s): {:.1}/s to the last Ready (input {:.1}/s); p50 {} s, p99 {} s; per cluster last Ready {}",
        phase.replicas,
        phase.create_rate,
        phase.apply_rate,
        phase.api_ready_p50,
        phase.api_ready_p99,
        phase
            .clusters
            .iter()
            .map(|c| format!("{} {:.1} s", c.key, c.last_ready_seconds))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// Polls and their seconds by cluster between two readings of every replica, summed over the
/// replicas.
fn poll_totals(before: &[OperatorCounts], after: &[OperatorCounts]) -> HashMap<String, (f64, f64)> {
    let mut totals: HashMap<String, (f64, f64)> = HashMap::new();
    for (b, a) in before.iter().zip(after) {
        let d = a.since(b);
        for (cluster, n) in &d.polls_by_cluster {
            totals.entry(cluster.clone()).or_default().0 += n;
        }
        for (cluster, s) in &d.poll_seconds_by_cluster {
            totals.entry(cluster.clone()).or_default().1 += s;
        }
    }
    totals
}
