//! Scenario 1, fan-out latency on the 3-node cluster, per operation (create queue, update
//! filter, delete): (a) one bare Jolokia exec to all three nodes in parallel — the physical
//! limit; (b) the same calls node after node — the existing operator's approach; (c) this
//! operator end to end, object applied → `Ready` in status (a delete: → the object gone).
//! Reported: (c)/(a) and (b)/(a) per round, median and spread. Target: (c) ≤ 1.5 × (a).

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use crate::install::{Ctx, Install, settle};
use crate::jolokia::Op;
use crate::objects::{QueueState, QueueWatch};
use crate::report::{Bar, Chart, Headline, Section, Table};
use crate::stats::{self, Summary};

const TARGET: f64 = 1.5;

#[derive(Default)]
struct Series {
    parallel: Vec<f64>,
    sequential: Vec<f64>,
    operator: Vec<f64>,
    /// Jolokia operations the operator sent per operation, less its polls meanwhile.
    jolokia: Vec<f64>,
}

pub async fn run(ctx: &Ctx) -> Result<Section> {
    let install = Install::up(ctx, "fanout", &[]).await?;
    let result = measure(ctx, &install).await;
    install.down(ctx).await;
    let (series, per_poll) = result?;
    Ok(section(ctx, &series, per_poll))
}

/// One operation through the operator, object applied → `Ready` (a delete: → gone), seen through
/// `watch`; the elapsed time.
pub async fn operator_op(install: &Install, watch: &QueueWatch, op: Op, queue: &str) -> Result<Duration> {
    let o = &install.objects;
    let start = Instant::now();
    let names = [queue.to_string()];
    let timeout = Duration::from_secs(120);
    let done = match op {
        Op::Create => {
            o.create_queue(queue).await?;
            watch.wait_all(&names, timeout, "Ready", |s| s.ready).await?
        }
        Op::UpdateFilter => {
            let generation = watch.state(queue).map_or(1, |s| s.generation);
            o.set_filter(queue, "bench = 1").await?;
            watch
                .wait_all(&names, timeout, "Ready with the new filter", |s: &QueueState| {
                    s.ready && s.generation > generation
                })
                .await?
        }
        Op::Delete => {
            o.delete_queue(queue).await?;
            watch.wait_all(&names, timeout, "deleted", |s| s.deleted).await?
        }
    };
    Ok(done.saturating_duration_since(start))
}

async fn measure(ctx: &Ctx, install: &Install) -> Result<([Series; 3], f64)> {
    let watch = QueueWatch::start(&install.objects);
    // The operator's Jolokia cost of one poll (idle, nothing to do), to take polls out of the
    // per-operation counts.
    let idle_start = install.operator.counts().await?;
    settle(Duration::from_secs(21)).await;
    let idle = install.operator.counts().await?.since(&idle_start);
    let per_poll = if idle.polls > 0.0 {
        idle.jolokia() / idle.polls
    } else {
        0.0
    };
    let j = &ctx.jolokia;
    let mut series: [Series; 3] = Default::default();
    // Round 0 warms connections and caches; it is not reported.
    for round in 0..=ctx.cfg.fanout_repeats {
        let names = ctx.queue_names(&format!("f{round}"), 3);
        for (k, op) in Op::ALL.into_iter().enumerate() {
            let a = j.parallel(op, &names[0]).await?;
            let b = j.sequential(op, &names[1]).await?;
            let before = install.operator.counts().await?;
            let c = operator_op(install, &watch, op, &names[2]).await?;
            // Let the verify and status write finish before counting.
            settle(Duration::from_millis(300)).await;
            let spent = install.operator.counts().await?.since(&before);
            if round == 0 {
                continue;
            }
            let s = &mut series[k];
            s.parallel.push(a.as_secs_f64() * 1000.0);
            s.sequential.push(b.as_secs_f64() * 1000.0);
            s.operator.push(c.as_secs_f64() * 1000.0);
            s.jolokia.push(spent.jolokia() - spent.polls * per_poll);
        }
        // The bare queues' addresses (auto-created) are removed by the end-of-scenario cleanup.
        if round % 5 == 4 {
            println!("bench: fanout round {round}/{}", ctx.cfg.fanout_repeats);
        }
    }
    Ok((series, per_poll))
}

fn section(ctx: &Ctx, series: &[Series; 3], per_poll: f64) -> Section {
    let mut s = Section::new(
        "fanout",
        "1. Fan-out latency",
        "Cluster `c` (3 nodes). Per operation: (a) one bare Jolokia exec to the three nodes in parallel (the physical limit), (b) the same execs node after node (the existing operator's approach), (c) this operator, object applied → `Ready` in status (delete: → object gone), seen through a watch. Ratios are per round (a, b and c measured back to back), then median and spread. Target: (c) ≤ 1.5 × (a).",
    );
    let mut t = Table::new(&[
        "operation",
        "(a) parallel ms",
        "(b) sequential ms",
        "(c) operator ms",
        "(c)/(a)",
        "(b)/(a)",
        "operator Jolokia ops",
    ]);
    let mut bars = vec![];
    let mut json_ops = serde_json::Map::new();
    for (op, x) in Op::ALL.into_iter().zip(series) {
        let c_over_a = Summary::of(&stats::ratios(&x.operator, &x.parallel));
        let b_over_a = Summary::of(&stats::ratios(&x.sequential, &x.parallel));
        t.row(vec![
            op.label().into(),
            stats::show(Summary::of(&x.parallel), 1),
            stats::show(Summary::of(&x.sequential), 1),
            stats::show(Summary::of(&x.operator), 1),
            stats::show(c_over_a, 2),
            stats::show(b_over_a, 2),
            stats::show(Summary::of(&x.jolokia), 1),
        ]);
        if let Some(r) = b_over_a {
            bars.push(Bar {
                label: format!("{}: (b) sequential / (a)", op.label()),
                value: r,
            });
        }
        if let Some(r) = c_over_a {
            bars.push(Bar {
                label: format!("{}: (c) operator / (a)", op.label()),
                value: r,
            });
            s.headlines.push(Headline {
                what: format!("{}: operator / bare parallel", op.label()),
                measured: r.show(2),
                target: format!("≤ {TARGET}"),
                met: Some(r.median <= TARGET),
            });
        }
        json_ops.insert(
            op.label().into(),
            json!({
                "parallelMs": stats::json(Summary::of(&x.parallel)),
                "sequentialMs": stats::json(Summary::of(&x.sequential)),
                "operatorMs": stats::json(Summary::of(&x.operator)),
                "operatorOverParallel": stats::json(c_over_a),
                "sequentialOverParallel": stats::json(b_over_a),
                "operatorJolokiaOps": stats::json(Summary::of(&x.jolokia)),
                "raw": {"parallelMs": x.parallel, "sequentialMs": x.sequential, "operatorMs": x.operator},
            }),
        );
    }
    s.tables.push(t);
    s.chart = Some(Chart {
        title: "Fan-out latency, ratio to one bare parallel Jolokia exec (3 nodes)".into(),
        axis: "× bare parallel".into(),
        bars,
        target: Some((TARGET, format!("target {TARGET}×"))),
    });
    s.notes.push(format!(
        "Operator Jolokia ops: operations the operator sent for one object operation (its own `artemis_studio_jolokia_requests_total`), less its polls meanwhile ({per_poll:.1} operations per poll of the cluster, measured idle first). The bare calls are one operation per node: 3."
    ));
    s.notes.push(format!(
        "{} rounds after one warm-up round.",
        ctx.cfg.fanout_repeats
    ));
    s.json = json!({"operations": json_ops, "jolokiaOpsPerPoll": per_poll, "rounds": ctx.cfg.fanout_repeats});
    s
}
