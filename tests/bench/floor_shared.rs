//! The shared floor script (`../shared/bench/ideal_operator.py`, the floor as it is judged), run
//! once per size next to the harness's own port (`floor.rs`), so the report shows whether the
//! two agree. A clean clone has no `../shared/bench`: the report then says the shared floor was
//! not measured, and the harness's port stands alone.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use tokio::process::Command;

use crate::floor::FloorFigures;
use crate::install::Ctx;

/// The script, relative to the shared directory.
const SCRIPT: &str = "ideal_operator.py";
/// The names the script gives its objects (and queues on the brokers): removed from the brokers
/// when it did not finish.
const SCRIPT_PREFIXES: [&str; 3] = ["ideal-lat-", "ideal-s-", "ideal-b-"];

/// What the shared script gave, or why it gave nothing.
#[derive(Debug, Clone)]
pub enum SharedFloor {
    Measured(FloorFigures),
    NotMeasured(String),
}

impl SharedFloor {
    pub fn figures(&self) -> Option<&FloorFigures> {
        match self {
            SharedFloor::Measured(f) => Some(f),
            SharedFloor::NotMeasured(_) => None,
        }
    }

    pub fn json(&self) -> Value {
        match self {
            SharedFloor::Measured(f) => f.json(),
            SharedFloor::NotMeasured(why) => json!({"notMeasured": why}),
        }
    }
}

/// Run the shared script for `n` objects in a scratch namespace, with `status` (a status the
/// operator wrote in this run) as its STATUS_JSON and the harness's creates in flight as its W.
pub async fn run(ctx: &Ctx, tag: &str, n: usize, status: &Value) -> SharedFloor {
    let Some(dir) = ctx.cfg.shared_floor.as_deref() else {
        return SharedFloor::NotMeasured("switched off (ARTEMIS_STUDIO_BENCH_SHARED_FLOOR=off)".into());
    };
    if !dir.join(SCRIPT).is_file() {
        return SharedFloor::NotMeasured(format!(
            "floor not measured: {} absent (the harness's port of it is the floor)",
            dir.display()
        ));
    }
    let ns = match ctx.scratch_namespace(tag).await {
        Ok(ns) => ns,
        Err(e) => return SharedFloor::NotMeasured(format!("no namespace for it: {e:#}")),
    };
    let result = run_script(ctx, dir, &ns, n, status).await;
    ctx.drop_scratch_namespace(&ns).await;
    // Always, not only after a failure: the script destroys its queues but most of their
    // auto-created addresses stay (13,500 per node after two runs at 10,000, which slowed
    // every later read of those brokers that walks their management objects).
    let prefixes: Vec<String> = SCRIPT_PREFIXES.iter().map(|p| p.to_string()).collect();
    match ctx.jolokia.remove_by_prefix(&prefixes).await {
        Ok(removed) => println!("bench: removed {removed} broker objects the shared floor script left"),
        Err(e) => eprintln!("[bench] shared floor cleanup: {e:#}"),
    }
    match result {
        Ok(figures) => SharedFloor::Measured(figures),
        Err(e) => {
            eprintln!("[bench] shared floor: {e:#}");
            SharedFloor::NotMeasured(format!("the script failed: {e:#}"))
        }
    }
}

async fn run_script(ctx: &Ctx, dir: &Path, ns: &str, n: usize, status: &Value) -> Result<FloorFigures> {
    let status_file = ctx.cfg.out_dir.join(format!("{ns}-status.json"));
    std::fs::create_dir_all(&ctx.cfg.out_dir)?;
    std::fs::write(&status_file, serde_json::to_vec(status)?)
        .with_context(|| format!("write {}", status_file.display()))?;
    let kubeconfig = ctx.bed.var("TESTBED_KUBECONFIG")?;
    let child = Command::new("python3")
        .arg(dir.join(SCRIPT))
        .args([kubeconfig.as_str(), ns, &n.to_string()])
        .arg(&status_file)
        .arg(ctx.cfg.apply_in_flight.to_string())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start python3 (the shared floor needs Python 3 with PyYAML)")?;
    // Three passes over n objects and their cleanups: as long as the operator may take, thrice.
    let limit = ctx.cfg.wait_for(n) * 3;
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .map_err(|_| anyhow!("no answer after {limit:?}"))??;
    let _ = std::fs::remove_file(&status_file);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        bail!(
            "{}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    parse_figures(&String::from_utf8_lossy(&out.stdout))
}

/// The script's last line: `single_qps bulk_qps latency_ms`.
fn parse_figures(stdout: &str) -> Result<FloorFigures> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| anyhow!("the script printed nothing"))?;
    let numbers: Vec<f64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("not three numbers: {line:?}"))?;
    match numbers.as_slice() {
        [single_rate, bulk_rate, one_object_ms] => Ok(FloorFigures {
            single_rate: *single_rate,
            bulk_rate: *bulk_rate,
            one_object_ms: *one_object_ms,
        }),
        _ => bail!("not three numbers: {line:?}"),
    }
}
