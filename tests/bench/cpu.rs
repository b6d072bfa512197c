//! CPU time by process, read from /proc: where a scenario's cost goes on the bed's shared cores.
//! The groups are the benchmark process itself (the producer and consumers it runs), each broker
//! of the cluster, the operator, Postgres (every process named `postgres`, plus what the
//! postmaster's reaped children used), and the machine's total busy time (/proc/stat), of which
//! the rest is "everything else" (the API server, etcd, the other brokers).

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};

/// utime + stime (and, with `children`, cutime + cstime) of one process, in clock ticks.
fn process_ticks(pid: &str, children: bool) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse::<f64>().unwrap_or(0.0))
        .collect();
    let own = fields.first()? + fields.get(1)?;
    Some(if children {
        own + fields.get(2)? + fields.get(3)?
    } else {
        own
    })
}

/// Clock ticks per second (`getconf CLK_TCK`, asked once).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU seconds used so far by one process (user + system).
pub fn process_seconds(pid: u32) -> Result<f64> {
    process_ticks(&pid.to_string(), false)
        .map(|t| t / clock_ticks())
        .ok_or_else(|| anyhow!("unreadable /proc/{pid}/stat"))
}

/// Every process named `name` (its `comm`), each with whether its parent is of another name
/// (the postmaster, whose reaped children's time counts too).
fn named(name: &str) -> Vec<(String, bool)> {
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((comm, rest)) = stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')) else {
            continue;
        };
        if comm == name
            && let Some(ppid) = rest.split_whitespace().nth(1)
        {
            found.push((pid, ppid.to_string()));
        }
    }
    let pids: Vec<String> = found.iter().map(|(p, _)| p.clone()).collect();
    found
        .into_iter()
        .map(|(pid, ppid)| (pid, !pids.contains(&ppid)))
        .collect()
}

/// What to account for, by group name.
pub struct Accounts {
    pub groups: Vec<(String, Vec<u32>)>,
}

/// CPU seconds by group at one instant, plus `machine busy` and `machine total`.
#[derive(Clone, Debug, Default)]
pub struct Snapshot(pub BTreeMap<String, f64>);

fn machine() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<f64> = cpu
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap_or(0.0))
        .collect();
    let total: f64 = v.iter().take(8).sum();
    // idle and iowait are fields 4 and 5.
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, total))
}

impl Accounts {
    pub fn snapshot(&self) -> Snapshot {
        let hz = clock_ticks();
        let mut out = BTreeMap::new();
        for (name, pids) in &self.groups {
            let t: f64 = pids
                .iter()
                .filter_map(|p| process_ticks(&p.to_string(), false))
                .sum();
            out.insert(name.clone(), t / hz);
        }
        let t: f64 = named("postgres")
            .iter()
            .filter_map(|(pid, root)| process_ticks(pid, *root))
            .sum();
        out.insert("postgres".into(), t / hz);
        if let Some((busy, total)) = machine() {
            out.insert("machine busy".into(), busy / hz);
            out.insert("machine total".into(), total / hz);
        }
        Snapshot(out)
    }
}

impl Snapshot {
    /// CPU seconds per group between `self` (earlier) and `later`, with "everything else" (the
    /// machine's busy time no group accounts for) and the machine's idle share.
    pub fn until(&self, later: &Snapshot) -> BTreeMap<String, f64> {
        let mut d: BTreeMap<String, f64> = later
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v - self.0.get(k).copied().unwrap_or(0.0)))
            .collect();
        let total = d.remove("machine total").unwrap_or(0.0);
        let busy = d.remove("machine busy").unwrap_or(0.0);
        let accounted: f64 = d.values().sum();
        d.insert("everything else".into(), (busy - accounted).max(0.0));
        d.insert("idle".into(), (total - busy).max(0.0));
        d
    }
}
