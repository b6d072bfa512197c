//! The benchmark (`deploy/dev/bench [scenario]`, issue 16): the operator's speed and cost
//! measured side by side with bare Jolokia on the same brokers, in one run, on the local test
//! bed. It reports; it never fails on a target (it exits non-zero only when it could not run).
//!
//! A test target without a harness so it builds with the operator binary
//! (`CARGO_BIN_EXE_artemis-studio-operator`), yet `cargo test` never runs it: without
//! `ARTEMIS_STUDIO_BENCH=1` it exits 0 at once.

#[path = "../common/bed.rs"]
mod bed;
mod capture;
mod config;
mod cpu;
mod fanout;
mod faults;
mod faults_core;
mod floor;
mod floor_shared;
mod footprint;
mod install;
mod jolokia;
mod metrics;
mod objects;
mod operator;
mod report;
mod scale;
mod scale_report;
mod shards;
mod shards_report;
mod stats;
#[path = "../common/testbed_env.rs"]
mod testbed_env;

use std::process::ExitCode;

use anyhow::Result;

use config::{Config, Scenario};
use install::Ctx;
use report::Section;

fn main() -> ExitCode {
    if std::env::var("ARTEMIS_STUDIO_BENCH").as_deref() != Ok("1") {
        println!("bench: skipped (set ARTEMIS_STUDIO_BENCH=1, or run deploy/dev/bench)");
        return ExitCode::SUCCESS;
    }
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(config)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("bench: could not run: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Every scenario asked for; Ok(false) when one could not run (its error is in the report).
async fn run(config: Config) -> Result<bool> {
    let ctx = Ctx::new(config).await?;
    println!(
        "bench: run {} → {} (scenarios: {})",
        ctx.cfg.run_id,
        ctx.cfg.out_dir.display(),
        ctx.cfg
            .scenarios
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut sections = vec![];
    let mut all_ran = true;
    let interrupted = tokio::select! {
        _ = async {
            for s in ctx.cfg.scenarios.clone() {
                println!("bench: scenario {}", s.name());
                let result = match s {
                    Scenario::Fanout => fanout::run(&ctx).await,
                    Scenario::Scale => scale::run(&ctx).await,
                    Scenario::Capture => capture::run(&ctx).await,
                    Scenario::Footprint => footprint::run(&ctx).await,
                    Scenario::Faults => faults::run(&ctx).await,
                    Scenario::Shards => shards::run(&ctx).await,
                };
                match result {
                    Ok(section) => sections.push(section),
                    Err(e) => {
                        eprintln!("bench: scenario {} could not run: {e:#}", s.name());
                        all_ran = false;
                        let mut section = Section::new(s.name(), s.name(), "");
                        section.notes.push(format!("could not run: {e:#}"));
                        section.json = serde_json::json!({"error": format!("{e:#}")});
                        sections.push(section);
                    }
                }
                // Write after every scenario: an interrupted run still leaves a report.
                if let Err(e) = report::write_all(&ctx.cfg.out_dir, &ctx.info(), &sections) {
                    eprintln!("bench: writing the report: {e:#}");
                }
            }
        } => false,
        _ = tokio::signal::ctrl_c() => true,
    };
    // Whatever happened: nothing of this run stays on the brokers, the API server or Postgres.
    ctx.cleanup().await;
    if interrupted {
        eprintln!("bench: interrupted; cleaned up");
        return Ok(false);
    }
    report::write_all(&ctx.cfg.out_dir, &ctx.info(), &sections)?;
    println!("bench: report {}", ctx.cfg.out_dir.join("report.md").display());
    Ok(all_ran)
}
