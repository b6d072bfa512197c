//! Scenario 2, scale: for each size, N ArtemisQueues created → all `Ready`, then a converged
//! window, then all deleted → all gone; next to bare parallel Jolokia creating and destroying
//! N queues on the same brokers in the same run (each queue one exec per node, the three nodes
//! in parallel, `in_flight` queues at a time). Counts: Jolokia operations per queue (the
//! operator's own metrics), API reads and writes per queue (the API server's, less the
//! harness's own, and the operator's client-side count), and in the converged window Jolokia
//! operations per node per poll, API LISTs and writes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use crate::install::{Ctx, Install, settle};
use crate::jolokia::Op;
use crate::objects::QueueWatch;
use crate::report::{Bar, Chart, Headline, Section, Table};
use crate::stats::{self, Summary};

/// One run at one size.
#[derive(Default, Clone)]
struct Run {
    bare_create_rate: f64,
    bare_delete_rate: f64,
    /// Bulk: POSTs of `Config::bulk` creates per node, the nodes in parallel.
    bulk_create_rate: f64,
    /// The harness's own input: queues/s of creates (deletes) the API server acknowledged, the
    /// bound every operator rate here is under (the bare baselines do not pay it).
    apply_rate: f64,
    delete_apply_rate: f64,
    /// Queues/s to all Ready and to all gone; NaN when it did not get there.
    create_rate: f64,
    delete_rate: f64,
    not_ready: usize,
    not_deleted: usize,
    jolokia_per_create: f64,
    jolokia_per_delete: f64,
    api_reads_per_queue: f64,
    api_writes_per_queue: f64,
    op_api_reads_per_queue: f64,
    op_api_writes_per_queue: f64,
    /// Converged window.
    polls: f64,
    jolokia_per_node_per_poll: f64,
    apiserver_lists: f64,
    apiserver_writes: f64,
    op_lists: f64,
    op_writes: f64,
    /// Restart with the N converged: seconds until every queue was reconciled after the new
    /// process's first poll; broker writes, audit rows and API writes (operator) meanwhile.
    restart_known_seconds: f64,
    restart_broker_writes: f64,
    restart_audit_rows: f64,
    restart_api_writes: f64,
    /// Seconds from a create's acknowledgement to the queue's first status (issue 50: written at
    /// first sight, before any broker work), p50 and p99 over the N queues.
    first_status_p50: f64,
    first_status_p99: f64,
    /// The same to `Ready`, for comparison.
    ready_p50: f64,
    ready_p99: f64,
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

pub async fn run(ctx: &Ctx) -> Result<Section> {
    let mut results: Vec<(usize, Vec<Run>)> = vec![];
    for (&n, &repeats) in ctx.cfg.sizes.iter().zip(&ctx.cfg.scale_repeats) {
        let mut runs = vec![];
        for r in 0..repeats {
            println!("bench: scale {n} queues, run {}/{repeats}", r + 1);
            runs.push(one(ctx, n, r).await?);
        }
        results.push((n, runs));
    }
    Ok(section(ctx, &results))
}

async fn one(ctx: &Ctx, n: usize, repeat: usize) -> Result<Run> {
    let mut run = Run::default();
    // Bare parallel Jolokia first, then the operator, back to back.
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

    let install = Install::up(ctx, &format!("s{n}r{repeat}"), &[]).await?;
    let install = match operator_run(ctx, install, n, repeat, &mut run).await {
        Ok(install) => install,
        // The namespace and database are left to the run's cleanup.
        Err(e) => return Err(e),
    };
    install.down(ctx).await;
    Ok(run)
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

async fn operator_run(
    ctx: &Ctx,
    install: Install,
    n: usize,
    repeat: usize,
    run: &mut Run,
) -> Result<Install> {
    let names = ctx.queue_names(&format!("s{n}r{repeat}"), n);
    let watch = QueueWatch::start(&install.objects);
    let o = &install.objects;
    let wait = ctx.cfg.wait_for(n);
    // Let the first polls pass, so the counts start from an idle operator.
    settle(Duration::from_secs(3)).await;
    let s0 = install.snapshot(ctx).await?;
    let start = Instant::now();
    let acknowledged = o.create_queues_timed(&names).await?;
    run.apply_rate = n as f64 / start.elapsed().as_secs_f64();
    match watch.wait_all(&names, wait, "Ready", |s| s.ready).await {
        Ok(at) => run.create_rate = n as f64 / at.saturating_duration_since(start).as_secs_f64(),
        Err(e) => {
            run.create_rate = f64::NAN;
            run.not_ready = watch.pending(&names, |s| s.ready);
            eprintln!("[bench] {e:#}");
        }
    }
    (run.first_status_p50, run.first_status_p99) = latency(&watch, &acknowledged, |s| s.first_status);
    (run.ready_p50, run.ready_p99) = latency(&watch, &acknowledged, |s| s.since.filter(|_| s.ready));
    println!(
        "bench: {n} creates → first status: p50 {:.2} s, p99 {:.2} s; → Ready: p50 {:.2} s, p99 {:.2} s",
        run.first_status_p50, run.first_status_p99, run.ready_p50, run.ready_p99
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
    let s2 = install.snapshot(ctx).await?;
    let idle = s2.since(&s1);
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

    let install = restart(ctx, install, n, run).await?;
    let o = &install.objects;
    let s2 = install.snapshot(ctx).await?;
    let start = Instant::now();
    o.delete_queues(&names).await?;
    run.delete_apply_rate = nf / start.elapsed().as_secs_f64();
    match watch.wait_all(&names, wait, "deleted", |s| s.deleted).await {
        Ok(at) => run.delete_rate = nf / at.saturating_duration_since(start).as_secs_f64(),
        Err(e) => {
            run.delete_rate = f64::NAN;
            run.not_deleted = watch.pending(&names, |s| s.deleted);
            eprintln!("[bench] {e:#}");
        }
    }
    let s3 = install.snapshot(ctx).await?;
    run.jolokia_per_delete = s3.since(&s2).operator.jolokia() / nf;
    Ok(install)
}

fn col(runs: &[Run], f: impl Fn(&Run) -> f64) -> Vec<f64> {
    runs.iter().map(f).collect()
}

fn section(ctx: &Ctx, results: &[(usize, Vec<Run>)]) -> Section {
    let mut s = Section::new(
        "scale",
        "2. Scale",
        &format!(
            "N ArtemisQueues ({}) on cluster `c` (3 nodes), created through the API server ({} at a time) until all are `Ready`, then a converged window, then an operator restart, then deleted until all are gone. Bare parallel: the same N queues created and destroyed with one bare Jolokia exec per node, the three nodes in parallel, {} queues at a time, just before; bulk: POSTs of {} creates per node, the nodes in parallel. Targets: create ≥ 100 queues/s, ≥ 1.0 × bare parallel and ≥ 0.5 × bulk; cost per queue flat from 100 to 10,000; converged: a small constant of Jolokia operations per node per poll, no API LIST, no API write; a restart writes nothing.",
            if ctx.cfg.durable {
                "durable, the CRD's default"
            } else {
                "non-durable"
            },
            ctx.cfg.apply_in_flight,
            ctx.cfg.in_flight,
            ctx.cfg.bulk
        ),
    );
    let mut rates = Table::new(&[
        "queues",
        "create/s operator",
        "create/s bare parallel",
        "create ratio",
        "delete/s operator",
        "delete/s bare parallel",
        "delete ratio",
        "input: creates; deletes acknowledged by the API server /s",
    ]);
    let mut cost = Table::new(&[
        "queues",
        "Jolokia ops per create",
        "Jolokia ops per delete",
        "API reads per queue (server / operator)",
        "API writes per queue (server / operator)",
    ]);
    let mut idle = Table::new(&[
        "queues",
        "converged window: polls",
        "Jolokia ops per node per poll",
        "API LISTs (server / operator)",
        "API writes (server / operator)",
    ]);
    let mut restarts = Table::new(&[
        "queues",
        "bulk create/s (POSTs of the bulk size per node)",
        "operator create ÷ bulk",
        "restart: s from ready until every queue judged against a snapshot",
        "restart: broker writes; audit rows; operator API writes",
    ]);
    let mut bars = vec![];
    let mut json_sizes = vec![];
    for (n, runs) in results {
        let create_ratio = Summary::of(&stats::ratios(
            &col(runs, |r| r.create_rate),
            &col(runs, |r| r.bare_create_rate),
        ));
        let delete_ratio = Summary::of(&stats::ratios(
            &col(runs, |r| r.delete_rate),
            &col(runs, |r| r.bare_delete_rate),
        ));
        let create_rate = Summary::of(&col(runs, |r| r.create_rate));
        let failed: usize = runs.iter().map(|r| r.not_ready).sum();
        let failed_del: usize = runs.iter().map(|r| r.not_deleted).sum();
        let mut rate_cell = stats::show(create_rate, 1);
        if failed > 0 {
            rate_cell.push_str(&format!(" ({failed} never Ready)"));
        }
        let mut del_cell = stats::show(Summary::of(&col(runs, |r| r.delete_rate)), 1);
        if failed_del > 0 {
            del_cell.push_str(&format!(" ({failed_del} never gone)"));
        }
        rates.row(vec![
            n.to_string(),
            rate_cell,
            stats::show(Summary::of(&col(runs, |r| r.bare_create_rate)), 1),
            stats::show(create_ratio, 2),
            del_cell,
            stats::show(Summary::of(&col(runs, |r| r.bare_delete_rate)), 1),
            stats::show(delete_ratio, 2),
            format!(
                "{}; {}",
                stats::show(Summary::of(&col(runs, |r| r.apply_rate)), 1),
                stats::show(Summary::of(&col(runs, |r| r.delete_apply_rate)), 1)
            ),
        ]);
        let pair = |a: &dyn Fn(&Run) -> f64, b: &dyn Fn(&Run) -> f64, d: usize| {
            format!(
                "{} / {}",
                stats::show(Summary::of(&col(runs, a)), d),
                stats::show(Summary::of(&col(runs, b)), d)
            )
        };
        cost.row(vec![
            n.to_string(),
            stats::show(Summary::of(&col(runs, |r| r.jolokia_per_create)), 1),
            stats::show(Summary::of(&col(runs, |r| r.jolokia_per_delete)), 1),
            pair(&|r| r.api_reads_per_queue, &|r| r.op_api_reads_per_queue, 2),
            pair(&|r| r.api_writes_per_queue, &|r| r.op_api_writes_per_queue, 2),
        ]);
        idle.row(vec![
            n.to_string(),
            stats::show(Summary::of(&col(runs, |r| r.polls)), 0),
            stats::show(Summary::of(&col(runs, |r| r.jolokia_per_node_per_poll)), 1),
            pair(&|r| r.apiserver_lists, &|r| r.op_lists, 0),
            pair(&|r| r.apiserver_writes, &|r| r.op_writes, 0),
        ]);
        let bulk_ratio = Summary::of(&stats::ratios(
            &col(runs, |r| r.create_rate),
            &col(runs, |r| r.bulk_create_rate),
        ));
        restarts.row(vec![
            n.to_string(),
            stats::show(Summary::of(&col(runs, |r| r.bulk_create_rate)), 1),
            stats::show(bulk_ratio, 2),
            stats::show(Summary::of(&col(runs, |r| r.restart_known_seconds)), 1),
            format!(
                "{}; {}; {}",
                stats::show(Summary::of(&col(runs, |r| r.restart_broker_writes)), 0),
                stats::show(Summary::of(&col(runs, |r| r.restart_audit_rows)), 0),
                stats::show(Summary::of(&col(runs, |r| r.restart_api_writes)), 0)
            ),
        ]);
        s.headlines.push(Headline {
            what: format!(
                "{n} queues: create rate ÷ the bulk limit (POSTs of {} per node)",
                ctx.cfg.bulk
            ),
            measured: stats::show(bulk_ratio, 2),
            target: "≥ 0.5×".into(),
            met: bulk_ratio.map(|r| r.median >= 0.5),
        });
        let restart_writes = Summary::of(&col(runs, |r| {
            r.restart_broker_writes + r.restart_audit_rows + r.restart_api_writes
        }));
        s.headlines.push(Headline {
            what: format!("{n} converged, operator restart: broker writes + audit rows + API writes; s to know every queue"),
            measured: format!(
                "{}; {}",
                stats::show(restart_writes, 0),
                stats::show(Summary::of(&col(runs, |r| r.restart_known_seconds)), 1)
            ),
            target: "0; reported".into(),
            met: restart_writes.map(|w| w.max == 0.0),
        });
        if let Some(r) = create_ratio {
            bars.push(Bar {
                label: format!("{n} queues: create, operator / bare"),
                value: r,
            });
        }
        if let Some(r) = delete_ratio {
            bars.push(Bar {
                label: format!("{n} queues: delete, operator / bare"),
                value: r,
            });
        }
        let met_rate = create_rate.map(|c| c.median >= 100.0 && failed == 0);
        s.headlines.push(Headline {
            what: format!("{n} queues: create rate, queues/s (operator / bare parallel)"),
            measured: format!(
                "{} / {} = {}",
                stats::show(create_rate, 1),
                stats::show(Summary::of(&col(runs, |r| r.bare_create_rate)), 1),
                stats::show(create_ratio, 2)
            ),
            target: "≥ 100/s and ≥ 1.0×".into(),
            met: match (met_rate, create_ratio) {
                (Some(rate), Some(ratio)) => Some(rate && ratio.median >= 1.0),
                _ => Some(false),
            },
        });
        s.headlines.push(Headline {
            what: format!("{n} queues: Jolokia ops per create / API writes per queue (operator)"),
            measured: format!(
                "{} / {}",
                stats::show(Summary::of(&col(runs, |r| r.jolokia_per_create)), 1),
                stats::show(Summary::of(&col(runs, |r| r.op_api_writes_per_queue)), 2)
            ),
            target: "flat in N (bare: 3 ops)".into(),
            met: None,
        });
        let lists = Summary::of(&col(runs, |r| r.op_lists));
        let writes = Summary::of(&col(runs, |r| r.op_writes));
        s.headlines.push(Headline {
            what: format!(
                "{n} queues converged, {} s: Jolokia ops per node per poll; operator API LISTs; writes",
                ctx.cfg.converged_seconds
            ),
            measured: format!(
                "{}; {}; {}",
                stats::show(Summary::of(&col(runs, |r| r.jolokia_per_node_per_poll)), 1),
                stats::show(lists, 0),
                stats::show(writes, 0)
            ),
            target: "small constant; 0; 0".into(),
            met: match (lists, writes) {
                (Some(l), Some(w)) => Some(l.max == 0.0 && w.max == 0.0),
                _ => None,
            },
        });
        json_sizes.push(json!({
            "queues": n,
            "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
            "createRatio": stats::json(create_ratio),
            "deleteRatio": stats::json(delete_ratio),
        }));
    }
    s.tables = vec![rates, cost, idle, restarts];
    s.chart = Some(Chart {
        title: "Scale: operator queues/s over bare parallel Jolokia queues/s".into(),
        axis: "× bare parallel".into(),
        bars,
        target: Some((1.0, "target 1.0×".into())),
    });
    let first: Vec<String> = results
        .iter()
        .map(|(n, runs)| {
            let p99 = stats::show(Summary::of(&col(runs, |r| r.first_status_p99)), 2);
            let ready = stats::show(Summary::of(&col(runs, |r| r.ready_p99)), 2);
            format!("{n}: {p99} s (to Ready: {ready} s)")
        })
        .collect();
    s.notes.push(format!(
        "Create → first status (written at first sight, before any broker work), p99 over the N queues, per size: {}.",
        first.join("; ")
    ));
    s.notes.push("API server figures are every client's requests for the operator's API group, Secrets and Events (the API server's `apiserver_request_total`), less the harness's own; other users of the shared API server (e.g. a concurrent integration test run) add to them. The operator's own client-side count (`artemis_studio_api_requests_total`) is next to them.".into());
    s.notes.push(format!(
        "Converged window: {} s after all were Ready; Jolokia ops per node per poll include the poll itself (identity and inventory: 8 operations per node).",
        ctx.cfg.converged_seconds
    ));
    s.json = json!({"sizes": json_sizes});
    s
}

fn run_json(r: &Run) -> Value {
    let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    json!({
        "bareCreatePerSecond": num(r.bare_create_rate), "bareDeletePerSecond": num(r.bare_delete_rate),
        "createPerSecond": num(r.create_rate), "deletePerSecond": num(r.delete_rate),
        "appliedCreatesPerSecond": num(r.apply_rate), "appliedDeletesPerSecond": num(r.delete_apply_rate),
        "neverReady": r.not_ready, "neverDeleted": r.not_deleted,
        "jolokiaOpsPerCreate": num(r.jolokia_per_create), "jolokiaOpsPerDelete": num(r.jolokia_per_delete),
        "apiServerReadsPerQueue": num(r.api_reads_per_queue), "apiServerWritesPerQueue": num(r.api_writes_per_queue),
        "operatorApiReadsPerQueue": num(r.op_api_reads_per_queue), "operatorApiWritesPerQueue": num(r.op_api_writes_per_queue),
        "converged": {"polls": num(r.polls), "jolokiaOpsPerNodePerPoll": num(r.jolokia_per_node_per_poll),
            "apiServerLists": num(r.apiserver_lists), "apiServerWrites": num(r.apiserver_writes),
            "operatorLists": num(r.op_lists), "operatorWrites": num(r.op_writes)},
        "bulkCreatePerSecond": num(r.bulk_create_rate),
        "restart": {"knownSeconds": num(r.restart_known_seconds), "brokerWrites": num(r.restart_broker_writes),
            "auditRows": num(r.restart_audit_rows), "operatorApiWrites": num(r.restart_api_writes)},
        "createToFirstStatusSeconds": {"p50": num(r.first_status_p50), "p99": num(r.first_status_p99)},
        "createToReadySeconds": {"p50": num(r.ready_p50), "p99": num(r.ready_p99)},
    })
}
