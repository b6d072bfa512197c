//! The operator under test: the release binary as a deployment runs it (the chart's RBAC
//! identity, one watched namespace, leader election off), started as a local process the way
//! tests/integration/support.rs `spawn_operator` does; read through its `/metrics` and /proc.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::process::{Child, Command};

use crate::metrics::OperatorCounts;

pub struct Operator {
    child: Child,
    pid: u32,
    port: u16,
    http: reqwest::Client,
}

/// How the operator process is started.
pub struct Launch<'a> {
    pub binary: &'a Path,
    pub kubeconfig: &'a str,
    pub database_url: &'a str,
    pub namespace: &'a str,
    pub instance_id: &'a str,
    pub log: PathBuf,
    /// The operator's RUST_LOG.
    pub rust_log: &'a str,
    pub extra_env: &'a [(&'a str, &'a str)],
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

impl Operator {
    /// Start the process and wait until `/readyz` answers 200.
    pub async fn start(l: Launch<'_>) -> Result<Operator> {
        let port = free_port()?;
        let log = std::fs::File::create(&l.log).with_context(|| format!("create {}", l.log.display()))?;
        let mut cmd = Command::new(l.binary);
        cmd.args([
            "run",
            "--database-url",
            l.database_url,
            "--namespaces",
            l.namespace,
        ])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", l.kubeconfig)
        .env("RUST_LOG", l.rust_log)
        .env("LEADER_ELECTION", "false")
        .env("INSTANCE_ID", l.instance_id)
        // The log (tracing writes to stdout) next to the report: the first place to look when a
        // size does not converge.
        .stdout(Stdio::from(
            log.try_clone().with_context(|| format!("{}", l.log.display()))?,
        ))
        .stderr(Stdio::from(log))
        .kill_on_drop(true);
        for (k, v) in l.extra_env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", l.binary.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("the operator exited at once"))?;
        let mut op = Operator {
            child,
            pid,
            port,
            http: reqwest::Client::new(),
        };
        op.wait_ready().await?;
        Ok(op)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the operator exited ({status}) before it was ready; see its log");
            }
            let url = format!("http://127.0.0.1:{}/readyz", self.port);
            if let Ok(r) = self.http.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the operator was not ready after 120 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn counts(&self) -> Result<OperatorCounts> {
        let url = format!("http://127.0.0.1:{}/metrics", self.port);
        let text = self
            .http
            .get(&url)
            .send()
            .await
            .context("GET the operator's /metrics")?
            .text()
            .await?;
        Ok(OperatorCounts::from_text(&text))
    }

    /// Resident set size, bytes (VmRSS of /proc/<pid>/status).
    pub fn rss_bytes(&self) -> Result<u64> {
        self.status_bytes("VmRSS")
    }

    /// The peak resident set size since the process started, bytes (VmHWM).
    pub fn peak_rss_bytes(&self) -> Result<u64> {
        self.status_bytes("VmHWM")
    }

    /// A size field of /proc/<pid>/status (given in kB), bytes.
    fn status_bytes(&self, field: &str) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| anyhow!("no {field} for pid {}", self.pid))?;
        Ok(kb * 1024)
    }

    /// CPU time used so far (user + system), seconds.
    pub fn cpu_seconds(&self) -> Result<f64> {
        crate::cpu::process_seconds(self.pid)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Send a signal by name (`STOP` pauses the whole process, `CONT` resumes it).
    pub fn signal(&self, name: &str) -> Result<()> {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -{name} {} failed", self.pid);
        }
        Ok(())
    }

    /// SIGTERM (graceful: in-flight reconciles finish), then SIGKILL after 30 s.
    pub async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                status?;
            }
            Err(_) => {
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}
