//! Scenario 6's section of the report: the replica counts side by side, then per replica and
//! per cluster.

use serde_json::{Value, json};

use crate::install::Ctx;
use crate::report::{Headline, Section, Table};
use crate::shards::{ClusterFigures, Outcome, Phase, ReplicaFigures};

const MIB: f64 = 1024.0 * 1024.0;

fn label(p: &Phase) -> String {
    match (p.replicas, p.sharded) {
        (1, false) => "1 replica".into(),
        (n, false) => format!("{n} replicas"),
        (n, true) => format!("{n} replicas, sharded"),
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / MIB)
}

/// The largest and the sum of one figure over the replicas.
fn max_and_sum(p: &Phase, f: impl Fn(&ReplicaFigures) -> f64) -> (f64, f64) {
    let values: Vec<f64> = p.replica_figures.iter().map(f).collect();
    (
        values.iter().copied().fold(f64::NAN, f64::max),
        values.iter().sum(),
    )
}

/// How far the slowest cluster's last Ready came after the fastest's, seconds (NaN when one
/// did not get there).
pub fn last_ready_spread(p: &Phase) -> f64 {
    let last: Vec<f64> = p.clusters.iter().map(|c| c.last_ready_seconds).collect();
    if last.iter().any(|s| !s.is_finite()) || last.is_empty() {
        return f64::NAN;
    }
    let (lo, hi) = last
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), s| {
            (lo.min(*s), hi.max(*s))
        });
    hi - lo
}

/// One row per figure, one column per replica count.
fn side_by_side(phases: &[&Phase]) -> Table {
    let mut header = vec!["figure".to_string()];
    header.extend(phases.iter().map(|p| label(p)));
    let mut t = Table { header, rows: vec![] };
    let mut row = |what: &str, cell: &dyn Fn(&Phase) -> String| {
        let mut r = vec![what.to_string()];
        r.extend(phases.iter().map(|p| cell(p)));
        t.row(r);
    };
    row("queues (3 clusters)", &|p| p.queues.to_string());
    row("creates/s, first create → last Ready", &|p| {
        format!("{:.1}", p.create_rate)
    });
    row("the harness's creates acknowledged/s (the input)", &|p| {
        format!("{:.1}", p.apply_rate)
    });
    row("create → Ready p50 / p99, s (API timestamps)", &|p| {
        format!("{} / {}", p.api_ready_p50, p.api_ready_p99)
    });
    row("clusters shared out after, s", &|p| {
        p.balanced_seconds.map_or("—".into(), |s| format!("{s:.1}"))
    });
    row("peak RSS, MiB: largest replica / all replicas", &|p| {
        let (max, sum) = max_and_sum(p, |r| r.rss_peak_bytes);
        format!("{} / {}", mib(max), mib(sum))
    });
    row("converged RSS, MiB: largest replica / all replicas", &|p| {
        let (max, sum) = max_and_sum(p, |r| r.rss_converged_bytes);
        format!("{} / {}", mib(max), mib(sum))
    });
    row("CPU s in the burst: largest replica / all replicas", &|p| {
        let (max, sum) = max_and_sum(p, |r| r.cpu_burst_seconds);
        format!("{max:.1} / {sum:.1}")
    });
    row("CPU s in the converged window: all replicas", &|p| {
        format!("{:.1}", max_and_sum(p, |r| r.cpu_window_seconds).1)
    });
    row("last Ready, slowest cluster after the fastest, s", &|p| {
        format!("{:.1}", last_ready_spread(p))
    });
    t
}

/// One row per item of each phase (`items`), the phase's label first, then `cells`.
fn per_phase_table<T>(
    phases: &[&Phase],
    header: &[&str],
    items: impl Fn(&Phase) -> &[T],
    cells: impl Fn(&Phase, &T) -> Vec<String>,
) -> Table {
    let mut t = Table::new(header);
    for p in phases {
        for item in items(p) {
            let mut row = vec![label(p)];
            row.extend(cells(p, item));
            t.row(row);
        }
    }
    t
}

fn replicas_table(phases: &[&Phase]) -> Table {
    let header = [
        "replicas",
        "replica",
        "clusters held (status.heldBy)",
        "clusters_held gauge",
        "peak RSS, MiB",
        "converged RSS, MiB",
        "CPU s, burst",
        "CPU s, window",
    ];
    per_phase_table(
        phases,
        &header,
        |p| &p.replica_figures,
        |p, r| {
            vec![
                r.pod.clone(),
                match (r.held.len(), p.sharded) {
                    (0, _) => "none".into(),
                    (n, true) => format!("{n}: {}", r.held.join(", ")),
                    (n, false) => format!("{n}: every cluster (unsharded)"),
                },
                if p.sharded {
                    format!("{}", r.held_gauge)
                } else {
                    "— (unsharded)".into()
                },
                mib(r.rss_peak_bytes),
                mib(r.rss_converged_bytes),
                format!("{:.1}", r.cpu_burst_seconds),
                format!("{:.1}", r.cpu_window_seconds),
            ]
        },
    )
}

fn clusters_table(phases: &[&Phase]) -> Table {
    let header = [
        "replicas",
        "cluster",
        "held by",
        "first create → its last Ready, s",
        "p50 / p99, s",
        "polls in the burst",
        "s between polls",
        "mean poll, s",
        "not Ready",
    ];
    per_phase_table(
        phases,
        &header,
        |p| &p.clusters,
        |p, c| {
            vec![
                c.key.clone(),
                match (&c.held_by, p.sharded) {
                    (None, _) => "—".into(),
                    (Some(by), true) => by.clone(),
                    (Some(by), false) => format!("{by} (unsharded)"),
                },
                format!("{:.1}", c.last_ready_seconds),
                format!("{} / {}", c.api_ready_p50, c.api_ready_p99),
                format!("{}", c.burst_polls),
                if c.burst_polls > 0.0 {
                    format!("{:.1}", p.burst_seconds / c.burst_polls)
                } else {
                    "—".into()
                },
                format!("{:.2}", c.mean_poll_seconds),
                c.not_ready.to_string(),
            ]
        },
    )
}

fn headlines(phases: &[&Phase]) -> Vec<Headline> {
    let mut h = vec![];
    for p in phases {
        let (peak, _) = max_and_sum(p, |r| r.rss_peak_bytes);
        h.push(Headline {
            what: format!("shards, {}: creates/s; largest replica's peak RSS", label(p)),
            measured: format!("{:.1}/s; {} MiB", p.create_rate, mib(peak)),
            target: "reported".into(),
            met: None,
        });
        h.push(Headline {
            what: format!("shards, {}: no cluster waits on another", label(p)),
            measured: format!(
                "slowest cluster's last Ready {:.1} s after the fastest's",
                last_ready_spread(p)
            ),
            target: "reported".into(),
            met: None,
        });
    }
    h
}

pub fn section(ctx: &Ctx, outcomes: &[Outcome]) -> Section {
    let mut s = Section::new(
        "shards",
        "6. Shards",
        &format!(
            "Three broker clusters, each in a namespace of its own: `c` (the bed's 3-node static cluster), `ha` (the replicated primary/backup pair and its third node) and a second namespace's `c` over c's brokers, {} queues each, created at once over the three ({} creates in flight in all); first on one replica as the chart runs one (unsharded), then on sharded replicas (`--sharding`, one database and instance ID, each its own POD_NAME), each count in fresh namespaces. Creates/s from the first create to the last Ready; create → Ready from the API server's timestamps; peak RSS is each process's VmHWM, converged RSS and the replicas' CPU after a {} s converged window; the clusters each sharded replica holds from `status.heldBy` and its `artemis_studio_clusters_held` (one replica, unsharded, acts for every cluster). A cluster that waited on another's poll shows as a late last Ready, or as fewer polls (more seconds between them) than its poll interval (the CRD's default, 10 s) gives.",
            ctx.cfg.shards_queues, ctx.cfg.apply_in_flight, ctx.cfg.converged_seconds
        ),
    );
    let phases: Vec<&Phase> = outcomes.iter().filter_map(|o| o.phase.as_ref().ok()).collect();
    for o in outcomes {
        if let Err(e) = &o.phase {
            s.notes
                .push(format!("{} replica(s): could not run: {e}", o.replicas));
            s.headlines.push(Headline {
                what: format!("shards, {} replica(s)", o.replicas),
                measured: "could not run".into(),
                target: "ran".into(),
                met: Some(false),
            });
        }
    }
    s.tables = vec![
        side_by_side(&phases),
        replicas_table(&phases),
        clusters_table(&phases),
    ];
    s.headlines.extend(headlines(&phases));
    s.json = json!({
        "queuesPerCluster": ctx.cfg.shards_queues,
        "phases": outcomes.iter().map(outcome_json).collect::<Vec<_>>(),
    });
    s
}

fn outcome_json(o: &Outcome) -> Value {
    let p = match &o.phase {
        Ok(p) => p,
        Err(e) => return json!({"replicas": o.replicas, "error": e}),
    };
    json!({
        "replicas": p.replicas, "sharded": p.sharded, "queues": p.queues,
        "createRate": p.create_rate, "applyRate": p.apply_rate, "burstSeconds": p.burst_seconds,
        "apiReadyP50": p.api_ready_p50, "apiReadyP99": p.api_ready_p99,
        "balancedSeconds": p.balanced_seconds, "lastReadySpreadSeconds": last_ready_spread(p),
        "replicaFigures": p.replica_figures.iter().map(replica_json).collect::<Vec<_>>(),
        "clusters": p.clusters.iter().map(cluster_json).collect::<Vec<_>>(),
    })
}

fn replica_json(r: &ReplicaFigures) -> Value {
    json!({
        "pod": r.pod, "held": r.held, "heldGauge": r.held_gauge,
        "rssPeakBytes": r.rss_peak_bytes, "rssConvergedBytes": r.rss_converged_bytes,
        "cpuBurstSeconds": r.cpu_burst_seconds, "cpuWindowSeconds": r.cpu_window_seconds,
    })
}

fn cluster_json(c: &ClusterFigures) -> Value {
    json!({
        "cluster": c.key, "heldBy": c.held_by, "lastReadySeconds": c.last_ready_seconds,
        "notReady": c.not_ready, "apiReadyP50": c.api_ready_p50, "apiReadyP99": c.api_ready_p99,
        "burstPolls": c.burst_polls, "meanPollSeconds": c.mean_poll_seconds,
    })
}
