//! Scenario 5, faults at size (issue 41): 2,000 queues with a divert each and 300 capture taps
//! on cluster c, under a producer, while in turn a broker restarts, a node freezes and thaws,
//! the operator is SIGKILLed mid-burst and restarted, and a second installation declares a
//! tenth of the queues. After each fault the brokers and the audit databases are checked (not
//! the operator's status alone), and the time each check took to hold is reported.
//!
//! The scenario itself is faults_core.rs, shared with the integration test that runs it reduced
//! in CI (tests/integration/faults.rs). Unlike the other scenarios this one has pass/fail checks:
//! a failed check is in the report (and a headline marked not met), never a stopped run.

use anyhow::Result;

use crate::faults_core::{self, Report, RunSpec, Size};
use crate::install::Ctx;
use crate::report::{Headline, Section, Table};

pub async fn run(ctx: &Ctx) -> Result<Section> {
    let mut size = Size::full();
    size.queues = ctx.cfg.faults_queues;
    size.diverts = ctx.cfg.faults_queues;
    size.taps = ctx.cfg.faults_taps;
    size.rate = ctx.cfg.faults_rate;
    size.freeze_seconds = ctx.cfg.faults_freeze_seconds;
    let spec = RunSpec {
        size: size.clone(),
        operator_bin: ctx.cfg.operator_bin.clone(),
        token: ctx.cfg.run_id.clone(),
        // Under the run's prefix and instance ID, so the run's own clean-up also sweeps it.
        prefix: ctx.prefix("faults"),
        instance: format!("bench{}", ctx.cfg.run_id),
        log_dir: ctx.cfg.out_dir.clone(),
    };
    println!(
        "bench: faults with {} queues, {} diverts, {} taps",
        size.queues, size.diverts, size.taps
    );
    let report = faults_core::run(&spec).await?;
    Ok(section(&size, &report))
}

fn section(size: &Size, report: &Report) -> Section {
    let mut s = Section::new(
        "faults",
        "5. Faults at size",
        &format!(
            "{} queues (a divert each, into one sink queue) and {} capture taps (captured addresses, each on every node) on cluster c, declared by one installation, under a producer of {:.0} messages/s over the three nodes to the tapped addresses. In turn: c2 stops and starts; c3 freezes for {} s (over the cluster's {} s poll timeout) and thaws; a burst changes every queue's and divert's filter and the operator is SIGKILLed once a quarter of the burst's commands are written, then started again on its database and instance ID; a second installation declares every tenth queue with another filter, over queues holding messages. Each time is seconds from the fault's end until the check first held, read from the brokers (every node, over Jolokia) and the audit databases: brokers = specs, no audit row pending, every tap HEALTHY (status, broker and database agree; `passes` = capture passes finished meanwhile, at most 2), notOwned on both sides (the second installation). The accounting pauses the producer, waits for the rings to drain and two passes, and compares rows stored + loss reported with the messages the brokers accepted (±{:.0} %).",
            size.queues,
            size.taps,
            size.rate,
            size.freeze_seconds,
            size.poll_timeout_seconds,
            100.0 * size.loss_tolerance
        ),
    );
    let mut table = Table::new(&Report::HEADER);
    for r in report.rows() {
        table.row(r);
    }
    s.tables.push(table);
    for p in &report.phases {
        for n in &p.notes {
            s.notes.push(format!("{}: {n}", p.name));
        }
        for f in &p.failures {
            s.notes.push(format!("{}: **FAILED** {f}", p.name));
        }
        s.headlines.push(Headline {
            what: format!("faults: {}", p.name),
            measured: format!(
                "converged in {} s, accounted in {} s",
                [p.specs_seconds, p.audit_seconds, p.taps_seconds, p.extra_seconds]
                    .iter()
                    .flatten()
                    .fold(None::<f64>, |m, v| Some(m.map_or(*v, |m| m.max(*v))))
                    .map_or("—".into(), |v| format!("{v:.1}")),
                p.accounting_seconds.map_or("—".into(), |v| format!("{v:.1}"))
            ),
            target: "every check holds".into(),
            met: Some(p.failures.is_empty()),
        });
    }
    if let Some(a) = &report.aborted {
        s.notes.push(format!("the run stopped early: {a}"));
        s.headlines.push(Headline {
            what: "faults: the whole sequence ran".into(),
            measured: "stopped early".into(),
            target: "every fault".into(),
            met: Some(false),
        });
    }
    s.notes.push(format!("total {:.0} s", report.total_seconds));
    s.json = serde_json::json!({"size": size.json(), "report": report.json()});
    s
}
