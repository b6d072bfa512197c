//! The shared scripts (`../shared/bench`), in every run: the floor as it is judged
//! (`ideal_operator.py`), next to the harness's own port (`floor.rs`), so the report shows
//! whether the two agree; and the operator under the load that goes with it (`create_queues.py`,
//! then `wait_ready.py`), since the harness drives its own bursts from Rust and the script's
//! floor from Python takes more of the bed's cores. A clean clone has no `../shared/bench`: the
//! report then says neither was measured, and the harness's port stands alone.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// Run the shared script for `n` objects in a scratch namespace, with `status` (a status the
/// operator wrote in this run) as its STATUS_JSON and the harness's creates in flight as its W:
/// what it gave, or why it gave nothing.
pub async fn run(ctx: &Ctx, tag: &str, n: usize, status: &Value) -> Result<FloorFigures, String> {
    let Some(dir) = ctx.cfg.shared_floor.as_deref() else {
        return Err("switched off (ARTEMIS_STUDIO_BENCH_SHARED_FLOOR=off)".into());
    };
    if !dir.join(SCRIPT).is_file() {
        return Err(format!(
            "floor not measured: {} absent (the harness's port of it is the floor)",
            dir.display()
        ));
    }
    let ns = match ctx.scratch_namespace(tag).await {
        Ok(ns) => ns,
        Err(e) => return Err(format!("no namespace for it: {e:#}")),
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
        Ok(figures) => Ok(figures),
        Err(e) => {
            eprintln!("[bench] shared floor: {e:#}");
            Err(format!("the script failed: {e:#}"))
        }
    }
}

async fn run_script(ctx: &Ctx, dir: &Path, ns: &str, n: usize, status: &Value) -> Result<FloorFigures> {
    let status_file = ctx.cfg.out_dir.join(format!("{ns}-status.json"));
    std::fs::create_dir_all(&ctx.cfg.out_dir)?;
    std::fs::write(&status_file, serde_json::to_vec(status)?)
        .with_context(|| format!("write {}", status_file.display()))?;
    let kubeconfig = ctx.bed.var("TESTBED_KUBECONFIG")?;
    let args = [
        kubeconfig,
        ns.to_string(),
        n.to_string(),
        status_file.display().to_string(),
        ctx.cfg.apply_in_flight.to_string(),
    ];
    // Three passes over n objects and their cleanups: as long as the operator may take, thrice.
    let out = python(dir, SCRIPT, &args, ctx.cfg.wait_for(n) * 3).await;
    let _ = std::fs::remove_file(&status_file);
    parse_figures(&out?)
}

/// Run one of the shared scripts in `dir` and give its standard output, or why it failed.
async fn python(dir: &Path, script: &str, args: &[String], limit: Duration) -> Result<String> {
    let child = Command::new("python3")
        .arg(dir.join(script))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start python3 (the shared scripts need Python 3 with PyYAML)")?;
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .map_err(|_| anyhow!("{script}: no answer after {limit:?}"))??;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        bail!(
            "{script}: {}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The operator's creates under the shared scripts' own load: creates/s from the first create to
/// the second `wait_ready.py` saw them all Ready, and create → Ready p50 and p99 from the API's
/// timestamps (whole seconds), as it prints them.
#[derive(Debug, Clone, Copy)]
pub struct JudgedFigures {
    pub rate: f64,
    pub p50: f64,
    pub p99: f64,
}

impl JudgedFigures {
    pub fn json(&self) -> Value {
        json!({"createsPerSecond": self.rate, "p50": self.p50, "p99": self.p99})
    }
}

/// The scripts the judged creates need.
const JUDGE_SCRIPTS: [&str; 3] = ["create_queues.py", "wait_ready.py", "delete_all.py"];

/// `n` ArtemisQueues created in `ns` (the operator's, empty) by `create_queues.py`, waited for by
/// `wait_ready.py`, then removed by `delete_all.py` and their addresses from the brokers: what
/// the scripts measured, or why they did not.
pub async fn judged(ctx: &Ctx, ns: &str, n: usize) -> Result<JudgedFigures, String> {
    let Some(dir) = ctx.cfg.shared_floor.as_deref() else {
        return Err("switched off (ARTEMIS_STUDIO_BENCH_SHARED_FLOOR=off)".into());
    };
    if let Some(absent) = JUDGE_SCRIPTS.iter().find(|s| !dir.join(s).is_file()) {
        return Err(format!("{} absent", dir.join(absent).display()));
    }
    let prefix = format!("judged-{}-{n}", ctx.cfg.run_id);
    let measured = judged_creates(ctx, dir, ns, &prefix, n).await;
    let removed = match ctx.bed.var("TESTBED_KUBECONFIG") {
        Ok(kc) => {
            let limit = ctx.cfg.wait_for(n);
            let args = [kc, ns.to_string(), limit.as_secs().to_string()];
            python(dir, "delete_all.py", &args, limit + Duration::from_secs(60)).await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = removed {
        eprintln!("[bench] judged creates: delete_all.py: {e:#}");
    }
    // The addresses a delete keeps (the CRD's default), and whatever a failed run left.
    match ctx.jolokia.remove_by_prefix(&[prefix]).await {
        Ok(removed) => println!("bench: removed {removed} broker objects the judged creates left"),
        Err(e) => eprintln!("[bench] judged creates cleanup: {e:#}"),
    }
    measured.map_err(|e| format!("the scripts failed: {e:#}"))
}

async fn judged_creates(ctx: &Ctx, dir: &Path, ns: &str, prefix: &str, n: usize) -> Result<JudgedFigures> {
    let kubeconfig = ctx.bed.var("TESTBED_KUBECONFIG")?;
    let limit = ctx.cfg.wait_for(n);
    let started = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    let create = [
        kubeconfig.clone(),
        ns.to_string(),
        prefix.to_string(),
        n.to_string(),
        ctx.cfg.apply_in_flight.to_string(),
    ];
    python(dir, "create_queues.py", &create, limit).await?;
    let wait = [
        kubeconfig,
        ns.to_string(),
        prefix.to_string(),
        n.to_string(),
        limit.as_secs().to_string(),
    ];
    let out = python(dir, "wait_ready.py", &wait, limit + Duration::from_secs(60)).await?;
    let numbers = last_numbers(&out)?;
    match numbers.as_slice() {
        [ready_at, p50, p99] if *ready_at > started => Ok(JudgedFigures {
            rate: n as f64 / (ready_at - started),
            p50: *p50,
            p99: *p99,
        }),
        _ => bail!("wait_ready.py printed {out:?}"),
    }
}

/// The numbers of a script's last non-empty line.
fn last_numbers(stdout: &str) -> Result<Vec<f64>> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| anyhow!("the script printed nothing"))?;
    line.split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("not numbers: {line:?}"))
}

/// The script's last line: `single_qps bulk_qps latency_ms`.
fn parse_figures(stdout: &str) -> Result<FloorFigures> {
    match last_numbers(stdout)?.as_slice() {
        [single_rate, bulk_rate, one_object_ms] => Ok(FloorFigures {
            single_rate: *single_rate,
            bulk_rate: *bulk_rate,
            one_object_ms: *one_object_ms,
        }),
        _ => bail!("not three numbers: {stdout:?}"),
    }
}
