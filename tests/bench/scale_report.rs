//! Scenario 2's section of the report: every figure of the operator next to the ideal-operator
//! floor (issue 45) and bare Jolokia, measured in the same run, as ratios side by side.

use serde_json::{Value, json};

use crate::floor::FloorFigures;
use crate::install::Ctx;
use crate::report::{Bar, Chart, Headline, Section, Table};
use crate::scale::{Run, SizeResult};
use crate::stats::{self, Summary};

/// Issue 45's targets: creates/s against the floor, p99 against p50, an update and a delete
/// against a create.
const FLOOR_TARGET: f64 = 0.8;
const P99_OVER_P50_TARGET: f64 = 2.0;
const CHANGE_OVER_CREATE_TARGET: f64 = 1.5;

fn col(runs: &[Run], f: impl Fn(&Run) -> f64) -> Vec<f64> {
    runs.iter().map(f).collect()
}

fn summary(runs: &[Run], f: impl Fn(&Run) -> f64) -> Option<Summary> {
    Summary::of(&col(runs, f))
}

/// Paired ratios (each run's figure over the same run's baseline), summarised.
fn ratio(runs: &[Run], num: impl Fn(&Run) -> f64, den: impl Fn(&Run) -> f64) -> Option<Summary> {
    Summary::of(&stats::ratios(&col(runs, num), &col(runs, den)))
}

fn floor_rate(r: &Run) -> f64 {
    r.floor.map_or(f64::NAN, |f| f.rate())
}

fn shared_floor_rate(r: &Run) -> f64 {
    r.shared_floor.map_or(f64::NAN, |f| f.rate())
}

fn judged_rate(r: &Run) -> f64 {
    r.judged.map_or(f64::NAN, |j| j.rate)
}

/// A figure of the shared script's floor over the runs, or "not measured".
fn shared_cell(runs: &[Run], figure: impl Fn(&FloorFigures) -> f64) -> String {
    match summary(runs, |r| r.shared_floor.as_ref().map_or(f64::NAN, &figure)) {
        Some(s) => s.show(1),
        None => "not measured (see the notes)".into(),
    }
}

/// Every figure of one size, and its ratios.
struct Figures {
    create_rate: Option<Summary>,
    floor_rate: Option<Summary>,
    over_floor: Option<Summary>,
    over_shared_floor: Option<Summary>,
    /// The operator driven by the shared scripts ÷ the shared script's floor, run by run.
    judged_over_shared: Option<Summary>,
    over_bare: Option<Summary>,
    over_bulk: Option<Summary>,
    delete_over_bare: Option<Summary>,
    p99_over_p50: Option<Summary>,
    /// Every run's p99 ≤ 2 × its p50 (None when no run has both).
    p99_within_target: Option<bool>,
    update_over_create: Option<Summary>,
    delete_over_create: Option<Summary>,
    one_create_over_floor: Option<Summary>,
    one_create_over_bare: Option<Summary>,
    never_ready: usize,
    never_gone: usize,
}

impl Figures {
    fn of(size: &SizeResult) -> Figures {
        let runs = &size.runs;
        let pairs: Vec<(f64, f64)> = runs
            .iter()
            .map(|r| (r.api_ready_p50, r.api_ready_p99))
            .filter(|(p50, p99)| p50.is_finite() && p99.is_finite())
            .collect();
        let single = |k: usize| move |r: &Run| r.single.operator_ms[k];
        let bare_single = |k: usize| move |r: &Run| r.single.bare_ms[k];
        Figures {
            create_rate: summary(runs, |r| r.create_rate),
            floor_rate: summary(runs, floor_rate),
            over_floor: ratio(runs, |r| r.create_rate, floor_rate),
            over_shared_floor: ratio(runs, |r| r.create_rate, shared_floor_rate),
            judged_over_shared: ratio(runs, judged_rate, shared_floor_rate),
            over_bare: ratio(runs, |r| r.create_rate, |r| r.bare_create_rate),
            over_bulk: ratio(runs, |r| r.create_rate, |r| r.bulk_create_rate),
            delete_over_bare: ratio(runs, |r| r.delete_rate, |r| r.bare_delete_rate),
            p99_over_p50: ratio(runs, |r| r.api_ready_p99, |r| r.api_ready_p50),
            p99_within_target: (!pairs.is_empty())
                .then(|| pairs.iter().all(|(p50, p99)| *p99 <= P99_OVER_P50_TARGET * p50)),
            update_over_create: ratio(runs, single(1), single(0)),
            delete_over_create: ratio(runs, single(2), single(0)),
            one_create_over_floor: ratio(runs, single(0), |r| r.floor.map_or(f64::NAN, |f| f.one_object_ms)),
            one_create_over_bare: ratio(runs, single(0), bare_single(0)),
            never_ready: runs.iter().map(|r| r.not_ready).sum(),
            never_gone: runs.iter().map(|r| r.not_deleted).sum(),
        }
    }
}

pub fn section(ctx: &Ctx, results: &[SizeResult]) -> Section {
    let mut s = Section::new("scale", "2. Scale", &intro(ctx));
    let mut tables = Tables::new();
    let mut bars = vec![];
    let mut sizes_json = vec![];
    let mut floor_notes = vec![];
    for size in results {
        let f = Figures::of(size);
        floor_notes.push(floor_note(size, &f));
        tables.add(size, &f);
        s.headlines.extend(headlines(ctx, size, &f));
        bars.extend(bars_of(size.n, &f));
        sizes_json.push(size_json(size, &f));
    }
    s.tables = tables.into_vec();
    s.chart = Some(Chart {
        title: "Scale: operator creates/s over the ideal-operator floor and over bare parallel Jolokia"
            .into(),
        axis: "× the baseline".into(),
        bars,
        target: Some((FLOOR_TARGET, format!("target {FLOOR_TARGET}× the floor"))),
    });
    s.notes = notes(ctx, floor_notes);
    s.json = json!({"sizes": sizes_json});
    s
}

fn intro(ctx: &Ctx) -> String {
    format!(
        "N ArtemisQueues ({}) on cluster `c` (3 nodes), created through the API server ({} in flight over keep-alive connections, as `../shared/bench/create_queues.py` does) until all are `Ready`, then a converged window, then one create, one filter change and one delete at a time ({} rounds after a warm-up), then an operator restart, then deleted ({} in flight) until all are gone. \
Side by side, in the same run: **the ideal-operator floor** (issue 45; `../shared/bench/ideal_operator.py`, ported to the harness): per object its create, one finalizer patch, one `createQueue` per node, one status patch with a status the operator wrote in this run, in a namespace no operator watches; single ({} objects in flight, one exec per node each) and bulk (groups of {}, one bulk POST per node), the faster shape is the floor; its one-object latency is ten objects one after another, median. **Bare parallel Jolokia**: the same N queues created and destroyed with one exec per node, the nodes in parallel, {} queues at a time; bulk: POSTs of {} creates per node. \
Targets (issue 45): creates/s ≥ {FLOOR_TARGET}× the floor; create → `Ready` p99 ≤ {P99_OVER_P50_TARGET}× p50 (the API server's timestamps: creationTimestamp and the Ready condition's lastTransitionTime, whole seconds, as `wait_ready.py` reads them); a filter change and a delete within {CHANGE_OVER_CREATE_TARGET}× a create; cost per queue flat in N; converged: a small constant of Jolokia operations per node per poll, no API LIST, no API write; a restart writes nothing. The bare ratios (issue 16's baseline) are reported beside the floor's: on this bed the API server, etcd, Postgres and the brokers share the cores, so bare Jolokia is not a limit an operator can reach here.",
        if ctx.cfg.durable {
            "durable, the CRD's default"
        } else {
            "non-durable"
        },
        ctx.cfg.apply_in_flight,
        ctx.cfg.single_repeats,
        ctx.cfg.apply_in_flight,
        ctx.cfg.apply_in_flight,
        ctx.cfg.bulk,
        ctx.cfg.in_flight,
        ctx.cfg.bulk,
    )
}

/// The section's tables, a row per size each.
struct Tables {
    rates: Table,
    latency: Table,
    one_at_a_time: Table,
    deletes: Table,
    cost: Table,
    idle: Table,
    restarts: Table,
}

impl Tables {
    fn new() -> Tables {
        Tables {
            rates: Table::new(&[
                "queues",
                "create/s operator",
                "floor/s: faster shape (single; bulk)",
                "÷ floor",
                "floor/s, the shared script (single; bulk)",
                "÷ shared floor",
                "bare parallel/s",
                "÷ bare parallel",
                "bulk Jolokia/s",
                "÷ bulk",
                "input: creates acknowledged by the API server /s",
            ]),
            latency: Table::new(&[
                "queues",
                "create → Ready p50; p99, s (API timestamps)",
                "p99 ÷ p50",
                "as the harness's watch saw it: p50; p99, s",
                "create → first status p50; p99, s",
            ]),
            one_at_a_time: Table::new(&[
                "queues (converged)",
                "one create → Ready, ms",
                "floor's one object, ms (port; shared)",
                "÷ floor",
                "bare parallel create, ms",
                "÷ bare",
                "filter change → Ready, ms",
                "÷ create",
                "÷ bare update",
                "delete → gone, ms",
                "÷ create",
                "÷ bare delete",
            ]),
            deletes: Table::new(&[
                "queues",
                "delete/s operator",
                "delete/s bare parallel",
                "÷ bare parallel",
                "input: deletes acknowledged by the API server /s",
            ]),
            cost: Table::new(&[
                "queues",
                "Jolokia ops per create",
                "Jolokia ops per delete",
                "API reads per queue (server / operator)",
                "API writes per queue (server / operator)",
            ]),
            idle: Table::new(&[
                "queues",
                "converged window: polls",
                "Jolokia ops per node per poll",
                "API LISTs (server / operator)",
                "API writes (server / operator)",
                "operator RSS, MiB",
            ]),
            restarts: Table::new(&[
                "queues",
                "restart: s from ready until every queue judged against a snapshot",
                "restart: broker writes; audit rows; operator API writes",
            ]),
        }
    }

    fn into_vec(self) -> Vec<Table> {
        vec![
            self.rates,
            self.latency,
            self.one_at_a_time,
            self.deletes,
            self.cost,
            self.idle,
            self.restarts,
        ]
    }

    fn add(&mut self, size: &SizeResult, f: &Figures) {
        let (n, runs) = (size.n.to_string(), &size.runs);
        self.rates.row(rates_row(size, f));
        self.latency.row(vec![
            n.clone(),
            p50_p99(runs, |r| r.api_ready_p50, |r| r.api_ready_p99, 0),
            stats::show(f.p99_over_p50, 2),
            p50_p99(runs, |r| r.ready_p50, |r| r.ready_p99, 2),
            p50_p99(runs, |r| r.first_status_p50, |r| r.first_status_p99, 2),
        ]);
        self.one_at_a_time.row(one_at_a_time_row(size, f));
        let mut delete_cell = stats::show(summary(runs, |r| r.delete_rate), 1);
        if f.never_gone > 0 {
            delete_cell.push_str(&format!(" ({} never gone)", f.never_gone));
        }
        self.deletes.row(vec![
            n.clone(),
            delete_cell,
            stats::show(summary(runs, |r| r.bare_delete_rate), 1),
            stats::show(f.delete_over_bare, 2),
            stats::show(summary(runs, |r| r.delete_apply_rate), 1),
        ]);
        self.cost.row(vec![
            n.clone(),
            stats::show(summary(runs, |r| r.jolokia_per_create), 1),
            stats::show(summary(runs, |r| r.jolokia_per_delete), 1),
            pair(runs, |r| r.api_reads_per_queue, |r| r.op_api_reads_per_queue, 2),
            pair(runs, |r| r.api_writes_per_queue, |r| r.op_api_writes_per_queue, 2),
        ]);
        self.idle.row(vec![
            n.clone(),
            stats::show(summary(runs, |r| r.polls), 0),
            stats::show(summary(runs, |r| r.jolokia_per_node_per_poll), 1),
            pair(runs, |r| r.apiserver_lists, |r| r.op_lists, 0),
            pair(runs, |r| r.apiserver_writes, |r| r.op_writes, 0),
            stats::show(summary(runs, rss_mib), 1),
        ]);
        self.restarts.row(vec![
            n,
            stats::show(summary(runs, |r| r.restart_known_seconds), 1),
            restart_writes(runs),
        ]);
    }
}

fn rss_mib(r: &Run) -> f64 {
    r.rss_converged_bytes / 1024.0 / 1024.0
}

/// Two figures of the runs, `a / b` (server / operator).
fn pair(runs: &[Run], a: impl Fn(&Run) -> f64, b: impl Fn(&Run) -> f64, digits: usize) -> String {
    format!(
        "{} / {}",
        stats::show(summary(runs, a), digits),
        stats::show(summary(runs, b), digits)
    )
}

/// p50 and p99 of the runs, `p50; p99`.
fn p50_p99(runs: &[Run], p50: impl Fn(&Run) -> f64, p99: impl Fn(&Run) -> f64, digits: usize) -> String {
    format!(
        "{}; {}",
        stats::show(summary(runs, p50), digits),
        stats::show(summary(runs, p99), digits)
    )
}

fn restart_writes(runs: &[Run]) -> String {
    format!(
        "{}; {}; {}",
        stats::show(summary(runs, |r| r.restart_broker_writes), 0),
        stats::show(summary(runs, |r| r.restart_audit_rows), 0),
        stats::show(summary(runs, |r| r.restart_api_writes), 0)
    )
}

fn rates_row(size: &SizeResult, f: &Figures) -> Vec<String> {
    let runs = &size.runs;
    let mut rate_cell = stats::show(f.create_rate, 1);
    if f.never_ready > 0 {
        rate_cell.push_str(&format!(" ({} never Ready)", f.never_ready));
    }
    let floor_cell = format!(
        "{} ({}; {})",
        stats::show(f.floor_rate, 1),
        stats::show(summary(runs, |r| r.floor.map_or(f64::NAN, |x| x.single_rate)), 1),
        stats::show(summary(runs, |r| r.floor.map_or(f64::NAN, |x| x.bulk_rate)), 1)
    );
    vec![
        size.n.to_string(),
        rate_cell,
        floor_cell,
        stats::show(f.over_floor, 2),
        format!(
            "{} ({}; {})",
            shared_cell(runs, FloorFigures::rate),
            shared_cell(runs, |x| x.single_rate),
            shared_cell(runs, |x| x.bulk_rate)
        ),
        stats::show(f.over_shared_floor, 2),
        stats::show(summary(runs, |r| r.bare_create_rate), 1),
        stats::show(f.over_bare, 2),
        stats::show(summary(runs, |r| r.bulk_create_rate), 1),
        stats::show(f.over_bulk, 2),
        stats::show(summary(runs, |r| r.apply_rate), 1),
    ]
}

fn one_at_a_time_row(size: &SizeResult, f: &Figures) -> Vec<String> {
    let runs = &size.runs;
    let ms = |k: usize| stats::show(summary(runs, |r| r.single.operator_ms[k]), 1);
    let over_bare = |k: usize| {
        stats::show(
            ratio(runs, |r| r.single.operator_ms[k], |r| r.single.bare_ms[k]),
            2,
        )
    };
    let floor_ms = format!(
        "{}; {}",
        stats::show(
            summary(runs, |r| r.floor.map_or(f64::NAN, |x| x.one_object_ms)),
            1
        ),
        shared_cell(runs, |x| x.one_object_ms)
    );
    vec![
        size.n.to_string(),
        ms(0),
        floor_ms,
        stats::show(f.one_create_over_floor, 2),
        stats::show(summary(runs, |r| r.single.bare_ms[0]), 1),
        stats::show(f.one_create_over_bare, 2),
        ms(1),
        stats::show(f.update_over_create, 2),
        over_bare(1),
        ms(2),
        stats::show(f.delete_over_create, 2),
        over_bare(2),
    ]
}

fn headlines(ctx: &Ctx, size: &SizeResult, f: &Figures) -> Vec<Headline> {
    let (n, runs) = (size.n, &size.runs);
    let mut h = vec![
        Headline {
            what: format!(
                "{n} queues: creates/s ÷ the ideal-operator floor (side by side: ÷ the shared script's floor; driven by the shared scripts, ÷ the shared script's floor; ÷ bare parallel Jolokia)"
            ),
            measured: format!(
                "{} / {} = {} (÷ the shared script's floor: {}; driven by the shared scripts: {}; ÷ bare parallel: {})",
                stats::show(f.create_rate, 1),
                stats::show(f.floor_rate, 1),
                stats::show(f.over_floor, 2),
                stats::show(f.over_shared_floor, 2),
                stats::show(f.judged_over_shared, 2),
                stats::show(f.over_bare, 2)
            ),
            target: format!("≥ {FLOOR_TARGET}× the floor"),
            met: f
                .over_floor
                .map(|r| r.median >= FLOOR_TARGET && f.never_ready == 0),
        },
        Headline {
            what: format!("{n} queues: create → Ready p99 ÷ p50 (API timestamps, whole seconds)"),
            measured: format!(
                "{} s ÷ {} s = {}",
                stats::show(summary(runs, |r| r.api_ready_p99), 0),
                stats::show(summary(runs, |r| r.api_ready_p50), 0),
                stats::show(f.p99_over_p50, 2)
            ),
            target: format!("≤ {P99_OVER_P50_TARGET}×"),
            met: f.p99_within_target,
        },
        Headline {
            what: format!("{n} queues converged, one at a time: filter change ÷ create; delete ÷ create"),
            measured: format!(
                "{}; {}",
                stats::show(f.update_over_create, 2),
                stats::show(f.delete_over_create, 2)
            ),
            target: format!("≤ {CHANGE_OVER_CREATE_TARGET}× each"),
            met: match (f.update_over_create, f.delete_over_create) {
                (Some(u), Some(d)) => Some(u.median.max(d.median) <= CHANGE_OVER_CREATE_TARGET),
                _ => None,
            },
        },
        Headline {
            what: format!(
                "{n} queues converged: one create → Ready ÷ the floor's one object (÷ one bare parallel exec); operator RSS"
            ),
            measured: format!(
                "{} (÷ bare: {}); {} MiB",
                stats::show(f.one_create_over_floor, 2),
                stats::show(f.one_create_over_bare, 2),
                stats::show(summary(runs, rss_mib), 1)
            ),
            target: "reported".into(),
            met: None,
        },
    ];
    h.extend(cost_headlines(ctx, n, runs));
    h
}

/// What a queue costs, idle and at a restart (issue 16's and 23's targets).
fn cost_headlines(ctx: &Ctx, n: usize, runs: &[Run]) -> Vec<Headline> {
    let restart_writes = summary(runs, |r| {
        r.restart_broker_writes + r.restart_audit_rows + r.restart_api_writes
    });
    let (lists, writes) = (summary(runs, |r| r.op_lists), summary(runs, |r| r.op_writes));
    vec![
        Headline {
            what: format!(
                "{n} converged, operator restart: broker writes + audit rows + API writes; s to know every queue"
            ),
            measured: format!(
                "{}; {}",
                stats::show(restart_writes, 0),
                stats::show(summary(runs, |r| r.restart_known_seconds), 1)
            ),
            target: "0; reported".into(),
            met: restart_writes.map(|w| w.max == 0.0),
        },
        Headline {
            what: format!("{n} queues: Jolokia ops per create / API writes per queue (operator)"),
            measured: format!(
                "{} / {}",
                stats::show(summary(runs, |r| r.jolokia_per_create), 1),
                stats::show(summary(runs, |r| r.op_api_writes_per_queue), 2)
            ),
            target: "flat in N (bare: 3 ops)".into(),
            met: None,
        },
        Headline {
            what: format!(
                "{n} queues converged, {} s: Jolokia ops per node per poll; operator API LISTs; writes",
                ctx.cfg.converged_seconds
            ),
            measured: format!(
                "{}; {}; {}",
                stats::show(summary(runs, |r| r.jolokia_per_node_per_poll), 1),
                stats::show(lists, 0),
                stats::show(writes, 0)
            ),
            target: "small constant; 0; 0".into(),
            met: match (lists, writes) {
                (Some(l), Some(w)) => Some(l.max == 0.0 && w.max == 0.0),
                _ => None,
            },
        },
    ]
}

fn bars_of(n: usize, f: &Figures) -> Vec<Bar> {
    [
        ("create ÷ floor", f.over_floor),
        ("create ÷ bare parallel", f.over_bare),
        ("delete ÷ bare parallel", f.delete_over_bare),
    ]
    .into_iter()
    .filter_map(|(what, r)| {
        r.map(|value| Bar {
            label: format!("{n} queues: {what}"),
            value,
        })
    })
    .collect()
}

/// The section's notes: each size's floor note, then what every size shares.
fn notes(ctx: &Ctx, floor_notes: Vec<String>) -> Vec<String> {
    let mut notes = floor_notes;
    notes.push("API server figures are every client's requests for the operator's API group, Secrets and Events (the API server's `apiserver_request_total`), less the harness's own; other users of the shared API server (e.g. a concurrent integration test run) add to them. The operator's own client-side count (`artemis_studio_api_requests_total`) is next to them.".into());
    notes.push(format!(
        "Converged window: {} s after all were Ready; Jolokia ops per node per poll include the poll itself (identity and inventory: 8 operations per node); the RSS is read at its end.",
        ctx.cfg.converged_seconds
    ));
    notes.push("One at a time: with the N converged, rounds of one create (applied → `Ready`), one filter change (→ `Ready` for the new generation) and one delete (→ gone) through the operator, each just after the same bare parallel exec; medians per run. The floor's one object is measured on the empty bed, just before the N creates.".into());
    notes
}

/// Whether the harness's port of the floor and the shared script agree, per size, and the
/// operator driven by the shared scripts.
fn floor_note(size: &SizeResult, f: &Figures) -> String {
    let (n, runs) = (size.n, &size.runs);
    let errors = |e: fn(&Run) -> Option<&String>| -> Vec<&str> {
        runs.iter().filter_map(|r| e(r).map(String::as_str)).collect()
    };
    let port = summary(runs, floor_rate);
    let shared = summary(runs, shared_floor_rate);
    let mut note = format!(
        "Floor at {n}: the harness's port {}/s, the shared script {}/s (single {}, bulk {}, one object {} ms); port ÷ shared, run by run, {}.",
        stats::show(port, 1),
        stats::show(shared, 1),
        shared_cell(runs, |x| x.single_rate),
        shared_cell(runs, |x| x.bulk_rate),
        shared_cell(runs, |x| x.one_object_ms),
        stats::show(ratio(runs, floor_rate, shared_floor_rate), 2)
    );
    let port_errors = errors(|r| r.floor_error.as_ref());
    if !port_errors.is_empty() {
        note.push_str(&format!(
            " The port could not measure: {}.",
            port_errors.join("; ")
        ));
    }
    let shared_errors = errors(|r| r.shared_floor_error.as_ref());
    if !shared_errors.is_empty() {
        note.push_str(&format!(" The shared script: {}.", shared_errors.join("; ")));
    }
    note.push_str(" Both run with the operator under test up and idle (it watches another namespace), just before its N creates.");
    note.push_str(&format!(
        " The operator's {n} creates again in every run, driven and observed by the shared scripts themselves (`create_queues.py`, `wait_ready.py`, after its own N): {}/s, p50 {} s, p99 {} s; ÷ the same run's shared floor {}.",
        stats::show(summary(runs, judged_rate), 1),
        stats::show(summary(runs, |r| r.judged.map_or(f64::NAN, |j| j.p50)), 0),
        stats::show(summary(runs, |r| r.judged.map_or(f64::NAN, |j| j.p99)), 0),
        stats::show(f.judged_over_shared, 2)
    ));
    let judged_errors = errors(|r| r.judged_error.as_ref());
    if !judged_errors.is_empty() {
        note.push_str(&format!(" Not measured: {}.", judged_errors.join("; ")));
    }
    note
}

fn size_json(size: &SizeResult, f: &Figures) -> Value {
    json!({
        "queues": size.n,
        "runs": size.runs.iter().map(run_json).collect::<Vec<_>>(),
        "judgedOverSharedFloor": stats::json(f.judged_over_shared),
        "createOverFloor": stats::json(f.over_floor),
        "createOverSharedFloor": stats::json(f.over_shared_floor),
        "createOverBareParallel": stats::json(f.over_bare),
        "createOverBulk": stats::json(f.over_bulk),
        "deleteOverBareParallel": stats::json(f.delete_over_bare),
        "readyP99OverP50": stats::json(f.p99_over_p50),
        "readyP99WithinTwiceP50": f.p99_within_target,
        "updateOverCreate": stats::json(f.update_over_create),
        "deleteOverCreate": stats::json(f.delete_over_create),
        "oneCreateOverFloorOneObject": stats::json(f.one_create_over_floor),
        "oneCreateOverBareParallel": stats::json(f.one_create_over_bare),
    })
}

fn run_json(r: &Run) -> Value {
    let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    let ops = |ms: &[f64; 3]| json!({"create": num(ms[0]), "updateFilter": num(ms[1]), "delete": num(ms[2])});
    json!({
        "floor": r.floor.map(|f| f.json()), "floorError": r.floor_error,
        "sharedFloor": r.shared_floor.map(|f| f.json()), "sharedFloorError": r.shared_floor_error,
        "judgedBySharedScripts": r.judged.map(|j| j.json()), "judgedError": r.judged_error,
        "bareCreatePerSecond": num(r.bare_create_rate), "bareDeletePerSecond": num(r.bare_delete_rate),
        "createPerSecond": num(r.create_rate), "deletePerSecond": num(r.delete_rate),
        "appliedCreatesPerSecond": num(r.apply_rate), "appliedDeletesPerSecond": num(r.delete_apply_rate),
        "observerCreateLists": num(r.observer_create_lists), "observerCreateListSeconds": num(r.observer_create_list_s),
        "observerDeleteLists": num(r.observer_delete_lists), "observerDeleteListSeconds": num(r.observer_delete_list_s),
        "neverReady": r.not_ready, "neverDeleted": r.not_deleted,
        "jolokiaOpsPerCreate": num(r.jolokia_per_create), "jolokiaOpsPerDelete": num(r.jolokia_per_delete),
        "apiServerReadsPerQueue": num(r.api_reads_per_queue), "apiServerWritesPerQueue": num(r.api_writes_per_queue),
        "operatorApiReadsPerQueue": num(r.op_api_reads_per_queue), "operatorApiWritesPerQueue": num(r.op_api_writes_per_queue),
        "converged": {"polls": num(r.polls), "jolokiaOpsPerNodePerPoll": num(r.jolokia_per_node_per_poll),
            "apiServerLists": num(r.apiserver_lists), "apiServerWrites": num(r.apiserver_writes),
            "operatorLists": num(r.op_lists), "operatorWrites": num(r.op_writes),
            "operatorRssBytes": num(r.rss_converged_bytes)},
        "oneAtATimeMs": {"operator": ops(&r.single.operator_ms), "bareParallel": ops(&r.single.bare_ms)},
        "bulkCreatePerSecond": num(r.bulk_create_rate),
        "restart": {"knownSeconds": num(r.restart_known_seconds), "brokerWrites": num(r.restart_broker_writes),
            "auditRows": num(r.restart_audit_rows), "operatorApiWrites": num(r.restart_api_writes)},
        "createToFirstStatusSeconds": {"p50": num(r.first_status_p50), "p99": num(r.first_status_p99)},
        "createToReadySeconds": {"p50": num(r.ready_p50), "p99": num(r.ready_p99)},
        "createToReadyApiSeconds": {"p50": num(r.api_ready_p50), "p99": num(r.api_ready_p99)},
    })
}
