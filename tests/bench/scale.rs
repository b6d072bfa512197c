//! Scenario 2, scale: for each size, N ArtemisQueues created → all `Ready`, then a converged
//! window, then one create, filter change and delete at a time, then a restart, then all deleted
//! → all gone. Measured in the same run, side by side with it:
//! - the ideal-operator floor (issue 45, `floor.rs`): the least an operator must do per object on
//!   this bed, single and bulk, the faster shape the floor; and in every run the shared script
//!   it is judged with (`floor_shared.rs`), when `../shared/bench` is there, and the operator's N
//!   again under the shared scripts' own load;
//! - bare parallel Jolokia creating and destroying N queues on the same brokers (each queue one
//!   exec per node, the three nodes in parallel, `in_flight` queues at a time), and bulk POSTs.
//!
//! The operator's input is driven as `../shared/bench/create_queues.py` drives it: the harness's
//! creates `apply_in_flight` (32) at a time over keep-alive connections; create → `Ready` p50 and
//! p99 come from the API server's own timestamps, whole seconds, as `wait_ready.py` takes them.
//! Counts: Jolokia operations per queue (the operator's own metrics), API reads and writes per
//! queue (the API server's, less the harness's own, and the operator's client-side count), and
//! in the converged window Jolokia operations per node per poll, API LISTs and writes, the
//! operator's RSS.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::floor::{FloorFigures, IdealOperator};
use crate::floor_shared::{self, JudgedFigures};
use crate::install::{Ctx, Install, settle};
use crate::jolokia::Op;
use crate::objects::{ListObserver, QueueWatch};
use crate::report::Section;
use crate::stats::{self, Summary};

/// One run at one size.
#[derive(Default, Clone)]
pub struct Run {
    pub bare_create_rate: f64,
    pub bare_delete_rate: f64,
    /// Bulk: POSTs of `Config::bulk` creates per node, the nodes in parallel.
    pub bulk_create_rate: f64,
    /// The ideal-operator floor (the harness's port), measured just before the operator's
    /// creates; None when it could not be (`floor_error` says why).
    pub floor: Option<FloorFigures>,
    pub floor_error: Option<String>,
    /// The shared script's floor (`ideal_operator.py`), measured just after the port; None when
    /// it could not be (`shared_floor_error` says why).
    pub shared_floor: Option<FloorFigures>,
    pub shared_floor_error: Option<String>,
    /// The operator's N again, created and observed by the shared scripts themselves, after its
    /// own N; None when they could not be (`judged_error` says why).
    pub judged: Option<JudgedFigures>,
    pub judged_error: Option<String>,
    /// The harness's own input: queues/s of creates (deletes) the API server acknowledged, the
    /// bound every operator rate here is under (the bare baselines do not pay it).
    pub apply_rate: f64,
    pub delete_apply_rate: f64,
    /// Queues/s to all Ready and to all gone; NaN when it did not get there.
    pub create_rate: f64,
    pub delete_rate: f64,
    pub not_ready: usize,
    pub not_deleted: usize,
    pub jolokia_per_create: f64,
    pub jolokia_per_delete: f64,
    pub api_reads_per_queue: f64,
    pub api_writes_per_queue: f64,
    pub op_api_reads_per_queue: f64,
    pub op_api_writes_per_queue: f64,
    /// Converged window.
    pub polls: f64,
    pub jolokia_per_node_per_poll: f64,
    pub apiserver_lists: f64,
    pub apiserver_writes: f64,
    pub op_lists: f64,
    pub op_writes: f64,
    /// The operator's resident set at the end of the converged window, bytes.
    pub rss_converged_bytes: f64,
    /// One object at a time with the N converged.
    pub single: SingleOps,
    /// Restart with the N converged: seconds until every queue was reconciled after the new
    /// process's first poll; broker writes, audit rows and API writes (operator) meanwhile.
    pub restart_known_seconds: f64,
    pub restart_broker_writes: f64,
    pub restart_audit_rows: f64,
    pub restart_api_writes: f64,
    /// Seconds from a create's acknowledgement to the queue's first status (issue 50: written at
    /// first sight, before any broker work), p50 and p99 over the N queues, as the harness's
    /// watch saw it.
    pub first_status_p50: f64,
    pub first_status_p99: f64,
    /// The same to `Ready`, for comparison.
    pub ready_p50: f64,
    pub ready_p99: f64,
    /// Create → `Ready` from the API server's own timestamps (creationTimestamp, the Ready
    /// condition's lastTransitionTime), whole seconds, p50 and p99: the figures that are judged.
    pub api_ready_p50: f64,
    pub api_ready_p99: f64,
    /// The judged observer (`Config::list_observer`): LISTs made while the creates (deletes)
    /// were served, and their mean seconds; 0 and NaN when off.
    pub observer_create_lists: f64,
    pub observer_create_list_s: f64,
    pub observer_delete_lists: f64,
    pub observer_delete_list_s: f64,
}

/// One create, one filter change and one delete at a time with the N converged: medians over
/// the rounds, milliseconds, in `Op::ALL`'s order; the operator's (applied → `Ready`, a delete:
/// → gone) and the bare parallel Jolokia exec's, measured back to back.
#[derive(Default, Clone, Copy)]
pub struct SingleOps {
    pub operator_ms: [f64; 3],
    pub bare_ms: [f64; 3],
}

/// Every run at one size.
pub struct SizeResult {
    pub n: usize,
    pub runs: Vec<Run>,
}

/// The `p`-th percentile (0–100) of `values`, nearest rank; NaN when empty.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Create → the instant `when` gives (first status, Ready), p50 and p99, of the queues that got
/// there.
fn latency(
    watch: &QueueWatch,
    acknowledged: &HashMap<String, Instant>,
    when: impl Fn(crate::objects::QueueState) -> Option<Instant>,
) -> (f64, f64) {
    let mut seconds: Vec<f64> = acknowledged
        .iter()
        .filter_map(|(name, at)| {
            let seen = when(watch.state(name)?)?;
            Some(seen.saturating_duration_since(*at).as_secs_f64())
        })
        .collect();
    (percentile(&mut seconds, 50.0), percentile(&mut seconds, 99.0))
}

/// Where a burst's time went, by tenths: the rate at which each tenth of the queues became
/// `Ready` (in the order they did), and the median create → `Ready` of each tenth in arrival
/// order. A rate that falls across the burst is what puts p99 above 2× p50 (issue 45).
fn by_tenth(watch: &QueueWatch, acknowledged: &HashMap<String, Instant>, start: Instant) -> String {
    let mut arrivals: Vec<(Instant, Instant)> = acknowledged
        .iter()
        .filter_map(|(name, at)| {
            let s = watch.state(name)?;
            Some((*at, s.since.filter(|_| s.ready)?))
        })
        .collect();
    if arrivals.len() < 10 {
        return "too few Ready queues to split in tenths".into();
    }
    arrivals.sort();
    let mut readies: Vec<Instant> = arrivals.iter().map(|(_, r)| *r).collect();
    readies.sort();
    let tenth = readies.len() / 10;
    let rates: Vec<String> = (0..10)
        .map(|i| {
            let (a, b) = (
                readies[i * tenth],
                readies[((i + 1) * tenth).min(readies.len() - 1)],
            );
            format!(
                "{:.0}",
                tenth as f64 / b.saturating_duration_since(a).as_secs_f64().max(0.001)
            )
        })
        .collect();
    let lags: Vec<String> = arrivals
        .chunks(tenth)
        .take(10)
        .map(|c| {
            let mut s: Vec<f64> = c
                .iter()
                .map(|(a, r)| r.saturating_duration_since(*a).as_secs_f64())
                .collect();
            format!("{:.1}", percentile(&mut s, 50.0))
        })
        .collect();
    format!(
        "Ready/s by tenth of the burst: {}; create → Ready p50 s by tenth in arrival order: {}; first Ready {:.1} s after the first create",
        rates.join(" "),
        lags.join(" "),
        readies[0].saturating_duration_since(start).as_secs_f64()
    )
}

pub async fn run(ctx: &Ctx) -> Result<Section> {
    let mut results = vec![];
    for (&n, &repeats) in ctx.cfg.sizes.iter().zip(&ctx.cfg.scale_repeats) {
        let mut runs = vec![];
        for r in 0..repeats {
            println!("bench: scale {n} queues, run {}/{repeats}", r + 1);
            runs.push(one(ctx, n, r).await?);
        }
        results.push(SizeResult { n, runs });
    }
    Ok(crate::scale_report::section(ctx, &results))
}

/// One run: the bare baselines, then an installation whose first queue gives the status the
/// floor writes, the floor (the harness's port, then the shared script), then the operator's N,
/// then its N again under the shared scripts' load. Every run measures both floors and the
/// judged creates, so each has its median: at 500 a burst lasts seconds, and one reading is
/// noise (issue 45). The floor's namespace is not the one the operator watches.
async fn one(ctx: &Ctx, n: usize, repeat: usize) -> Result<Run> {
    let mut run = Run::default();
    if ctx.cfg.baselines {
        bare(ctx, n, repeat, &mut run).await?;
    } else {
        // Not measured: shown as "—", not as 0/s.
        (run.bare_create_rate, run.bare_delete_rate, run.bulk_create_rate) = (f64::NAN, f64::NAN, f64::NAN);
    }
    let install = Install::up(ctx, &format!("s{n}r{repeat}"), &[]).await?;
    let watch = QueueWatch::start(&install.objects);
    let status = probe_status(ctx, &install, &watch, &format!("p{n}r{repeat}")).await?;
    if ctx.cfg.baselines {
        measure_floor(ctx, n, repeat, &status, &mut run).await;
        let tag = format!("shared-floor{n}r{repeat}");
        match floor_shared::run(ctx, &tag, n, &status).await {
            Ok(f) => {
                println!(
                    "bench: floor at {n}, the shared script: single {:.1}/s, bulk {:.1}/s, one object {:.1} ms",
                    f.single_rate, f.bulk_rate, f.one_object_ms
                );
                run.shared_floor = Some(f);
            }
            Err(why) => {
                println!("bench: floor at {n}, the shared script: {why}");
                run.shared_floor_error = Some(why);
            }
        }
    }
    let install = operator_run(ctx, install, &watch, n, repeat, &mut run).await?;
    if ctx.cfg.baselines {
        match judged_creates(ctx, &install, n).await {
            Ok(j) => run.judged = Some(j),
            Err(why) => run.judged_error = Some(why),
        }
    }
    install.down(ctx).await;
    Ok(run)
}

/// The operator's N again, created and observed by the shared scripts themselves.
async fn judged_creates(ctx: &Ctx, install: &Install, n: usize) -> Result<JudgedFigures, String> {
    let judged = floor_shared::judged(ctx, install.namespace(), n).await;
    match &judged {
        Ok(j) => println!(
            "bench: {n} creates driven by the shared scripts → all Ready: {:.1}/s, p50 {} s, p99 {} s",
            j.rate, j.p50, j.p99
        ),
        Err(why) => println!("bench: {n} creates driven by the shared scripts: {why}"),
    }
    judged
}

/// Bare parallel Jolokia creating and destroying N queues, then bulk POSTs creating them.
async fn bare(ctx: &Ctx, n: usize, repeat: usize, run: &mut Run) -> Result<()> {
    ctx.jolokia.wait_up(crate::install::BROKERS_DOWN_LIMIT).await?;
    let bare = ctx.queue_names(&format!("b{n}r{repeat}"), n);
    let took = ctx
        .jolokia
        .many(Op::Create, &bare, ctx.cfg.in_flight, true)
        .await?;
    run.bare_create_rate = n as f64 / took.as_secs_f64();
    let took = ctx
        .jolokia
        .many(Op::Delete, &bare, ctx.cfg.in_flight, true)
        .await?;
    run.bare_delete_rate = n as f64 / took.as_secs_f64();
    let bulk = ctx.queue_names(&format!("k{n}r{repeat}"), n);
    let took = ctx.jolokia.bulk_many(Op::Create, &bulk, ctx.cfg.bulk).await?;
    run.bulk_create_rate = n as f64 / took.as_secs_f64();
    ctx.jolokia.bulk_many(Op::Delete, &bulk, ctx.cfg.bulk).await?;
    ctx.clean_brokers().await;
    Ok(())
}

/// A status the operator wrote in this run (the floor writes the same bytes): one queue
/// created until `Ready`, its status read, the queue deleted until gone.
async fn probe_status(ctx: &Ctx, install: &Install, watch: &QueueWatch, tag: &str) -> Result<Value> {
    let names = ctx.queue_names(tag, 1);
    let name = names.first().context("one probe name")?;
    let o = &install.objects;
    let timeout = Duration::from_secs(120);
    o.create_queue(name).await?;
    watch.wait_all(&names, timeout, "Ready", |s| s.ready).await?;
    let status = o.status_of(name).await?;
    o.delete_queue(name).await?;
    watch.wait_all(&names, timeout, "deleted", |s| s.deleted).await?;
    Ok(status)
}

/// The harness's port of the floor, in a namespace of its own; an error is reported, not
/// returned (the operator's figures are still worth having).
async fn measure_floor(ctx: &Ctx, n: usize, repeat: usize, status: &Value, run: &mut Run) {
    let tag = format!("floor{n}r{repeat}");
    let ns = match ctx.scratch_namespace(&tag).await {
        Ok(ns) => ns,
        Err(e) => {
            run.floor_error = Some(format!("no namespace for it: {e:#}"));
            return;
        }
    };
    let ideal = IdealOperator::new(&ctx.admin, &ns, &ctx.jolokia, status.clone())
        .in_flight(ctx.cfg.apply_in_flight)
        .bulk(ctx.cfg.bulk);
    match ideal.measure(&ctx.prefix(&tag), n).await {
        Ok(f) => {
            println!(
                "bench: floor at {n}, the harness's port: single {:.1}/s, bulk {:.1}/s, one object {:.1} ms",
                f.single_rate, f.bulk_rate, f.one_object_ms
            );
            run.floor = Some(f);
        }
        Err(e) => {
            eprintln!("[bench] floor at {n}: {e:#}");
            run.floor_error = Some(format!("{e:#}"));
            // What the failed floor left on the brokers goes before anything else is measured
            // (at 10,000 two floors' leftovers exhausted a broker's heap).
            ctx.clean_brokers().await;
        }
    }
    ctx.drop_scratch_namespace(&ns).await;
}

/// Restart the operator with the N converged queues: how long until it has reconciled every
/// queue after its first poll, and what it wrote meanwhile (issue 23: nothing).
async fn restart(ctx: &Ctx, install: Install, n: usize, run: &mut Run) -> Result<Install> {
    let audit0 = install.audit_rows(ctx).await?;
    let api0 = crate::metrics::apiserver(&ctx.admin).await?;
    let install = install.restarted(ctx).await?;
    // From the new process's readiness (its caches synced).
    let start = Instant::now();
    let deadline = start + ctx.cfg.wait_for(n);
    // Every queue judged against the new process's snapshot (only its own polls make one).
    let counts = loop {
        let c = install.operator.counts().await?;
        if c.queue_planned >= n as f64 {
            run.restart_known_seconds = start.elapsed().as_secs_f64();
            break c;
        }
        if Instant::now() > deadline {
            run.restart_known_seconds = f64::NAN;
            break c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // One more poll, so its consequences are counted too.
    let polls = counts.polls;
    while install.operator.counts().await?.polls < polls + 1.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let counts = install.operator.counts().await?;
    run.restart_broker_writes = counts.jolokia_writes();
    run.restart_api_writes = counts.api(&["create", "update", "patch", "delete"]);
    run.restart_audit_rows = (install.audit_rows(ctx).await? - audit0) as f64;
    let api = crate::metrics::apiserver(&ctx.admin).await?.since(&api0);
    println!(
        "bench: restart with {n} converged: known in {:.1} s; broker writes {}, audit rows {}, operator API writes {} (API server writes, all clients: {})",
        run.restart_known_seconds,
        run.restart_broker_writes,
        run.restart_audit_rows,
        run.restart_api_writes,
        api.sum(&["create", "update", "patch", "delete"])
    );
    Ok(install)
}

/// The operator's N: created → all `Ready`, converged, one at a time, restarted, deleted.
async fn operator_run(
    ctx: &Ctx,
    install: Install,
    watch: &QueueWatch,
    n: usize,
    repeat: usize,
    run: &mut Run,
) -> Result<Install> {
    let tag = format!("s{n}r{repeat}");
    let names = ctx.queue_names(&tag, n);
    // Let the first polls pass, so the counts start from an idle operator.
    settle(Duration::from_secs(3)).await;
    creates(ctx, &install, watch, &names, &ctx.prefix(&tag), run).await?;
    run.single = single_ops(ctx, &install, watch, &format!("o{n}r{repeat}")).await?;
    let install = restart(ctx, install, n, run).await?;
    deletes(ctx, &install, watch, &names, run).await?;
    Ok(install)
}

/// Stop the judged observer, if on; print and return its LISTs and their mean seconds.
async fn observed(observer: Option<ListObserver>) -> (f64, f64) {
    let Some(observer) = observer else {
        return (0.0, f64::NAN);
    };
    let (lists, mean) = observer.stop().await;
    println!("bench: observer (a LIST a second, as wait_ready.py): {lists} LISTs, {mean:.2} s each");
    (lists as f64, mean)
}

/// N creates, `apply_in_flight` at a time, until all are `Ready`; what they cost; then the
/// converged window.
async fn creates(
    ctx: &Ctx,
    install: &Install,
    watch: &QueueWatch,
    names: &[String],
    prefix: &str,
    run: &mut Run,
) -> Result<()> {
    let (o, n) = (&install.objects, names.len());
    let s0 = install.snapshot(ctx).await?;
    let start = Instant::now();
    let observer = ctx.cfg.list_observer.then(|| ListObserver::start(o));
    let acknowledged = o.create_queues_timed(names).await?;
    run.apply_rate = n as f64 / start.elapsed().as_secs_f64();
    match watch
        .wait_all(names, ctx.cfg.wait_for(n), "Ready", |s| s.ready)
        .await
    {
        Ok(at) => {
            run.create_rate = n as f64 / at.saturating_duration_since(start).as_secs_f64();
            println!("bench: {n} creates → all Ready: {:.1}/s", run.create_rate);
        }
        Err(e) => {
            run.create_rate = f64::NAN;
            run.not_ready = watch.pending(names, |s| s.ready);
            eprintln!("[bench] {e:#}");
        }
    }
    (run.observer_create_lists, run.observer_create_list_s) = observed(observer).await;
    (run.first_status_p50, run.first_status_p99) = latency(watch, &acknowledged, |s| s.first_status);
    (run.ready_p50, run.ready_p99) = latency(watch, &acknowledged, |s| s.since.filter(|_| s.ready));
    (run.api_ready_p50, run.api_ready_p99) = stats::whole_second_p50_p99(&o.ready_lags(prefix).await?);
    println!("bench: {}", by_tenth(watch, &acknowledged, start));
    println!(
        "bench: {n} creates → first status: p50 {:.2} s, p99 {:.2} s; → Ready: p50 {:.2} s, p99 {:.2} s (API timestamps: p50 {} s, p99 {} s)",
        run.first_status_p50,
        run.first_status_p99,
        run.ready_p50,
        run.ready_p99,
        run.api_ready_p50,
        run.api_ready_p99
    );
    let s1 = install.snapshot(ctx).await?;
    let created = s1.since(&s0);
    let nf = n as f64;
    run.jolokia_per_create = created.operator.jolokia() / nf;
    run.api_reads_per_queue = created.apiserver_reads() / nf;
    run.api_writes_per_queue = created.apiserver_writes() / nf;
    run.op_api_reads_per_queue = created.operator_reads() / nf;
    run.op_api_writes_per_queue = created.operator_writes() / nf;

    // The converged window: nothing to do but poll.
    settle(Duration::from_secs(ctx.cfg.converged_seconds)).await;
    let idle = install.snapshot(ctx).await?.since(&s1);
    let nodes = ctx.jolokia.nodes.len() as f64;
    run.polls = idle.operator.polls;
    run.jolokia_per_node_per_poll = if idle.operator.polls > 0.0 {
        idle.operator.jolokia() / idle.operator.polls / nodes
    } else {
        f64::NAN
    };
    run.apiserver_lists = idle.apiserver_lists();
    run.apiserver_writes = idle.apiserver_writes();
    run.op_lists = idle.operator.api(&["list"]);
    run.op_writes = idle.operator_writes();
    run.rss_converged_bytes = install.operator.rss_bytes().map_or(f64::NAN, |b| b as f64);
    Ok(())
}

/// With the N converged, rounds of one create, one filter change and one delete through the
/// operator, each next to the same bare parallel exec (one warm-up round first, not counted).
async fn single_ops(ctx: &Ctx, install: &Install, watch: &QueueWatch, tag: &str) -> Result<SingleOps> {
    let mut operator: [Vec<f64>; 3] = Default::default();
    let mut bare: [Vec<f64>; 3] = Default::default();
    for round in 0..=ctx.cfg.single_repeats {
        let names = ctx.queue_names(&format!("{tag}x{round}"), 2);
        let (bare_name, name) = match names.as_slice() {
            [a, b] => (a, b),
            _ => anyhow::bail!("two names for a round"),
        };
        for (k, op) in Op::ALL.into_iter().enumerate() {
            let a = ctx.jolokia.parallel(op, bare_name).await?;
            let c = crate::fanout::operator_op(install, watch, op, name).await?;
            if round > 0 {
                bare[k].push(a.as_secs_f64() * 1000.0);
                operator[k].push(c.as_secs_f64() * 1000.0);
            }
        }
    }
    let median = |v: &Vec<f64>| Summary::of(v).map_or(f64::NAN, |s| s.median);
    let single = SingleOps {
        operator_ms: operator.each_ref().map(median),
        bare_ms: bare.each_ref().map(median),
    };
    println!(
        "bench: one at a time, {} rounds: create {:.1} ms, filter change {:.1} ms, delete {:.1} ms (bare parallel: {:.1}, {:.1}, {:.1} ms)",
        ctx.cfg.single_repeats,
        single.operator_ms[0],
        single.operator_ms[1],
        single.operator_ms[2],
        single.bare_ms[0],
        single.bare_ms[1],
        single.bare_ms[2]
    );
    Ok(single)
}

/// Every queue deleted, `apply_in_flight` at a time, until all are gone; what they cost.
async fn deletes(
    ctx: &Ctx,
    install: &Install,
    watch: &QueueWatch,
    names: &[String],
    run: &mut Run,
) -> Result<()> {
    let o = &install.objects;
    let nf = names.len() as f64;
    let s2 = install.snapshot(ctx).await?;
    let start = Instant::now();
    let observer = ctx.cfg.list_observer.then(|| ListObserver::start(o));
    o.delete_queues(names).await?;
    run.delete_apply_rate = nf / start.elapsed().as_secs_f64();
    match watch
        .wait_all(names, ctx.cfg.wait_for(names.len()), "deleted", |s| s.deleted)
        .await
    {
        Ok(at) => run.delete_rate = nf / at.saturating_duration_since(start).as_secs_f64(),
        Err(e) => {
            run.delete_rate = f64::NAN;
            run.not_deleted = watch.pending(names, |s| s.deleted);
            eprintln!("[bench] {e:#}");
        }
    }
    (run.observer_delete_lists, run.observer_delete_list_s) = observed(observer).await;
    let s3 = install.snapshot(ctx).await?;
    run.jolokia_per_delete = s3.since(&s2).operator.jolokia() / nf;
    Ok(())
}
