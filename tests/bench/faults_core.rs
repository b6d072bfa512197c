//! Faults at size (issue 41, last item): one scenario, one implementation, a size parameter.
//! `deploy/dev/bench faults` runs it at full size (2,000 queues with a divert each, 300 capture
//! taps); the integration test `faults::faults_at_reduced_size_…` runs it reduced (200 queues,
//! 30 taps) in CI. Both include this file (the bench as `mod faults_core`, the integration test
//! by `#[path]`): it depends on nothing of either harness, only on the test bed's env file, the
//! operator's crate and the operator binary it is given.
//!
//! What it does, on cluster `c` (c1, c2, c3) of the test bed:
//! 1. Behind any operator's back: a few queues that the operator will declare (adopted), and a
//!    few it never will (bystanders), each holding messages on every node.
//! 2. Installation A (the operator binary as a process, its own namespace, database and
//!    instance ID) declares N queues (filter `v = '1'`), a divert on each queue's address into
//!    a sink queue, and capture subscriptions tapping T of the queues' addresses (at most 100
//!    per subscription); a producer then sends to every tapped address, round-robin over the
//!    three nodes, for the rest of the run.
//! 3. In turn: a broker (c2) stops and starts again; a node (c3) freezes (SIGSTOP) for longer
//!    than a poll's timeout and thaws; a burst changes every queue's and divert's filter and
//!    the operator is SIGKILLed mid-burst and started again on its database and instance ID;
//!    a second installation (another namespace, database and instance ID) declares every
//!    tenth queue with another filter, over queues that hold messages.
//! 4. After each fault, from the brokers (Jolokia reads of every node) and the databases (SQL),
//!    never from the operator's status alone, and timed from the fault's end:
//!    - brokers = specs on every node: every declared queue (address, routing type,
//!      durability, filter — a queue both installations declare may hold either side's), the
//!      sink, every divert (source, target, filter, routing type, not exclusive), and nothing
//!      else of this run but the bystanders and the taps;
//!    - no audit row `pending` in either installation's database;
//!    - nothing destroyed that no object asked to destroy: no `*.delete` and no
//!      `capture.remove` command was sent, and every queue that held messages still holds them
//!      (the adopted ones, the bystanders, the contested ones);
//!    - every tap HEALTHY within two capture passes after the fault's end: the subscription's
//!      status says so, and so do the brokers (the tap's divert, its ring queue with the drain
//!      attached, on every node) and the database (an open install record and a drain
//!      session confirmed in the last 20 s, per address and node);
//!    - with the producer paused and the rings drained: rows stored + loss reported =
//!      messages the brokers accepted (±20 %);
//!    - after the second installation: each side records `status.notOwned` for every queue
//!      both declare (issue 41: neither side's plain delete would destroy it).
//!
//! Every wait is bounded (a bound on a broken system, not a speed target); a check that does not
//! hold is a failure in the report, never a panic, so one run reports every failure.
#![allow(dead_code)]

use crate::testbed_env;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use artemis_studio_operator::api::capture_names::{TapName, escape};
use artemis_studio_operator::api::{
    ArtemisCaptureSubscription, ArtemisCluster, ArtemisDivert, ArtemisQueue, CAPTURE_PREFIX,
};

/// A's queue filter before the burst, and after it.
const FILTER_BEFORE: &str = "v = '1'";
const FILTER_AFTER: &str = "v = '2'";
/// The filter a tenth of A's queues get while c3 is frozen (c3 must get it after the thaw).
const FILTER_WHILE_FROZEN: &str = "v = '3'";
/// The second installation's filter on the queues both declare.
const FILTER_B: &str = "side = 'b'";
/// The diverts' filter before and after the burst: the producer's messages never match it, so
/// the sink stays empty (the diverts are there to be kept, not to carry the load).
const DIVERT_BEFORE: &str = "route = 'sink'";
const DIVERT_AFTER: &str = "route = 'sink2'";

/// The scenario's size and pace.
#[derive(Clone, Debug)]
pub struct Size {
    /// ArtemisQueues of installation A.
    pub queues: usize,
    /// ArtemisDiverts (one on each of the first `diverts` queues' addresses, into the sink).
    pub diverts: usize,
    /// Captured addresses (the addresses of the first `taps` queues): each one tap, installed
    /// on every node (the unit of a subscription's `maxTaps`).
    pub taps: usize,
    /// Taps per ArtemisCaptureSubscription (its `maxTaps`, 100 by default).
    pub taps_per_subscription: usize,
    /// The second installation declares every `contested_every`-th queue.
    pub contested_every: usize,
    /// Every `adopted_every`-th queue exists, with messages, before the operator starts.
    pub adopted_every: usize,
    /// Queues with messages that no object declares.
    pub bystanders: usize,
    /// Messages per node in each queue made behind the operator's back.
    pub messages_kept: usize,
    /// The producer's messages per second, over the three nodes.
    pub rate: f64,
    /// CAPTURE_PASS_SECONDS of the operator processes.
    pub pass_seconds: u32,
    /// The ArtemisCluster's poll interval and poll timeout.
    pub poll_seconds: u32,
    pub poll_timeout_seconds: u32,
    /// How long c3 stays frozen: longer than a poll's timeout, so the operator sees it gone.
    pub freeze_seconds: u64,
    /// API creates and patches in flight.
    pub in_flight: usize,
    /// Stored + reported loss may differ from what was sent by this fraction of it.
    pub loss_tolerance: f64,
    /// Seconds the producer runs after convergence before the first accounting.
    pub warm_up_seconds: u64,
}

impl Size {
    /// Issue 41's size: 2,000 queues with diverts, 300 taps.
    pub fn full() -> Size {
        Size {
            queues: 2000,
            diverts: 2000,
            taps: 300,
            taps_per_subscription: 100,
            contested_every: 10,
            adopted_every: 50,
            bystanders: 5,
            messages_kept: 3,
            rate: 60.0,
            pass_seconds: 10,
            poll_seconds: 5,
            poll_timeout_seconds: 20,
            freeze_seconds: 45,
            in_flight: 16,
            loss_tolerance: 0.2,
            warm_up_seconds: 20,
        }
    }

    /// The CI size: 200 queues with diverts, 30 taps.
    pub fn reduced() -> Size {
        Size {
            queues: 200,
            diverts: 200,
            taps: 30,
            taps_per_subscription: 100,
            contested_every: 10,
            adopted_every: 50,
            bystanders: 3,
            messages_kept: 3,
            rate: 30.0,
            pass_seconds: 5,
            poll_seconds: 2,
            poll_timeout_seconds: 8,
            freeze_seconds: 15,
            in_flight: 16,
            loss_tolerance: 0.2,
            warm_up_seconds: 10,
        }
    }

    /// The longest wait for a convergence: a bound on a broken system.
    pub fn wait(&self) -> Duration {
        let objects = self.queues + self.diverts + 3 * self.taps;
        Duration::from_secs(150) + Duration::from_millis(150 * objects as u64)
    }

    pub fn json(&self) -> Value {
        json!({
            "queues": self.queues, "diverts": self.diverts, "taps": self.taps,
            "tapsPerSubscription": self.taps_per_subscription, "contestedEvery": self.contested_every,
            "adoptedEvery": self.adopted_every, "bystanders": self.bystanders,
            "rate": self.rate, "passSeconds": self.pass_seconds, "pollSeconds": self.poll_seconds,
            "pollTimeoutSeconds": self.poll_timeout_seconds, "freezeSeconds": self.freeze_seconds,
            "lossTolerance": self.loss_tolerance,
        })
    }
}

/// One run: who it is and where its names and logs go.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub size: Size,
    /// The operator binary (run as a process, so it can be SIGKILLed).
    pub operator_bin: PathBuf,
    /// In every broker object name of the run (a clean-up token): lowercase letters and digits.
    pub token: String,
    /// The first words of every broker object name, e.g. `faults.<token>.` (contains `token`).
    pub prefix: String,
    /// Installation A's instance ID (B's is this with `-b`).
    pub instance: String,
    /// Where the operators' logs go.
    pub log_dir: PathBuf,
}

/// One fault, what it took and what did not hold.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    pub name: String,
    /// The fault itself (from its start to its end: the broker ready again, thawed, the
    /// operator ready again, the objects declared).
    pub fault_seconds: f64,
    /// From the fault's end until each check first held (None: it did not, within the bound).
    pub specs_seconds: Option<f64>,
    pub audit_seconds: Option<f64>,
    pub taps_seconds: Option<f64>,
    /// Capture passes that finished between the fault's end and every tap healthy.
    pub taps_passes: Option<i64>,
    /// Phase-specific (the second installation: both sides record status.notOwned).
    pub extra_seconds: Option<f64>,
    /// The accounting (producer paused, rings drained, loss read by later passes).
    pub accounting_seconds: Option<f64>,
    pub sent: u64,
    pub stored: i64,
    pub lost: i64,
    pub notes: Vec<String>,
    pub failures: Vec<String>,
}

impl Phase {
    fn new(name: &str) -> Phase {
        Phase {
            name: name.to_string(),
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub phases: Vec<Phase>,
    pub total_seconds: f64,
    /// Problems of the run itself (it could not go on), not of a check.
    pub aborted: Option<String>,
}

fn secs(v: Option<f64>) -> String {
    v.map_or("—".into(), |s| format!("{s:.1}"))
}

impl Report {
    /// Every failed check, by phase (and why the run stopped early, if it did).
    pub fn failures(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .phases
            .iter()
            .flat_map(|p| p.failures.iter().map(move |f| format!("[{}] {f}", p.name)))
            .collect();
        if let Some(a) = &self.aborted {
            out.push(format!("the run stopped early: {a}"));
        }
        out
    }

    pub const HEADER: [&'static str; 11] = [
        "phase",
        "fault s",
        "brokers = specs s",
        "no audit pending s",
        "taps HEALTHY s",
        "passes",
        "notOwned s",
        "accounting s",
        "sent",
        "stored + lost",
        "checks",
    ];

    pub fn rows(&self) -> Vec<Vec<String>> {
        self.phases
            .iter()
            .map(|p| {
                vec![
                    p.name.clone(),
                    format!("{:.1}", p.fault_seconds),
                    secs(p.specs_seconds),
                    secs(p.audit_seconds),
                    secs(p.taps_seconds),
                    p.taps_passes.map_or("—".into(), |n| n.to_string()),
                    secs(p.extra_seconds),
                    secs(p.accounting_seconds),
                    p.sent.to_string(),
                    format!("{} + {}", p.stored, p.lost),
                    if p.failures.is_empty() {
                        "ok".into()
                    } else {
                        format!("{} FAILED", p.failures.len())
                    },
                ]
            })
            .collect()
    }

    /// The table as Markdown, then each phase's notes and failures.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "| {} |\n|{}\n",
            Self::HEADER.join(" | "),
            "---|".repeat(Self::HEADER.len())
        );
        for r in self.rows() {
            s.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        for p in &self.phases {
            for n in &p.notes {
                s.push_str(&format!("- {}: {n}\n", p.name));
            }
            for f in &p.failures {
                s.push_str(&format!("- {}: **FAILED** {f}\n", p.name));
            }
        }
        if let Some(a) = &self.aborted {
            s.push_str(&format!("- the run stopped early: {a}\n"));
        }
        s.push_str(&format!("- total {:.0} s\n", self.total_seconds));
        s
    }

    pub fn json(&self) -> Value {
        json!({
            "totalSeconds": self.total_seconds,
            "aborted": self.aborted,
            "phases": self.phases.iter().map(|p| json!({
                "name": p.name, "faultSeconds": p.fault_seconds, "specsSeconds": p.specs_seconds,
                "auditSeconds": p.audit_seconds, "tapsSeconds": p.taps_seconds, "tapsPasses": p.taps_passes,
                "notOwnedSeconds": p.extra_seconds, "accountingSeconds": p.accounting_seconds,
                "sent": p.sent, "stored": p.stored, "lost": p.lost, "notes": p.notes, "failures": p.failures,
            })).collect::<Vec<_>>(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The test bed, as this scenario needs it (from `deploy/dev/testbed env`'s file).

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub jolokia: String,
    pub amqp: String,
}

pub struct Bed {
    vars: HashMap<String, String>,
}

impl Bed {
    pub fn load() -> Result<Bed> {
        let vars = testbed_env::read().map_err(anyhow::Error::msg)?;
        Ok(Bed { vars })
    }

    fn var(&self, key: &str) -> Result<String> {
        self.vars
            .get(key)
            .cloned()
            .ok_or_else(|| anyhow!("the test bed env has no {key}"))
    }

    fn nodes(&self) -> Result<Vec<Node>> {
        let mut out = vec![];
        for name in self.var("TESTBED_BROKERS")?.split_whitespace() {
            let up = name.to_uppercase();
            if self.var(&format!("TESTBED_{up}_CLUSTER"))? == "c" {
                out.push(Node {
                    name: name.to_string(),
                    jolokia: self.var(&format!("TESTBED_{up}_JOLOKIA"))?,
                    amqp: self.var(&format!("TESTBED_{up}_AMQP"))?,
                });
            }
        }
        if out.len() != 3 {
            bail!("cluster c of the test bed has {} brokers, not 3", out.len());
        }
        Ok(out)
    }

    fn user(&self) -> Result<(String, String)> {
        Ok((
            self.var("TESTBED_BROKER_USER")?,
            self.var("TESTBED_BROKER_PASSWORD")?,
        ))
    }

    /// `testbed broker ACTION NAME` (start returns once the broker is ready).
    fn broker(&self, action: &str, name: &str) -> Result<()> {
        let status = testbed_command(&self.var("TESTBED_SCRIPT")?, &["broker", action, name])
            .status()
            .context("run the testbed script")?;
        if !status.success() {
            bail!("testbed broker {action} {name} failed ({status})");
        }
        Ok(())
    }

    async fn kube(&self, key: &str) -> Result<Client> {
        let path = self.var(key)?;
        let kc = Kubeconfig::read_from(&path).with_context(|| format!("read {path}"))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    async fn create_database(&self, db: &str) -> Result<String> {
        use sqlx::Connection;
        let admin = self.var("TESTBED_DATABASE_URL")?;
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .context("connect to Postgres")?;
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&mut conn)
            .await
            .with_context(|| format!("create database {db}"))?;
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        Ok(format!("{base}/{db}"))
    }

    async fn drop_database(&self, db: &str) -> Result<()> {
        use sqlx::Connection;
        let admin = self.var("TESTBED_DATABASE_URL")?;
        let mut conn = sqlx::PgConnection::connect(&admin).await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .execute(&mut conn)
            .await?;
        Ok(())
    }
}

/// The testbed script with every inherited descriptor above stderr closed first: a broker it
/// starts runs on (setsid) and would keep them open — a `flock` lock the caller holds among
/// them, held by the broker for as long as it runs.
fn testbed_command(script: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg("-c").arg(CLOSE_FDS_AND_EXEC).arg(script).args(args);
    cmd
}

/// `bash -c` this, then the program and its arguments: every descriptor above stderr closed,
/// then the program in bash's place (same pid).
const CLOSE_FDS_AND_EXEC: &str = r#"for fd in $(ls /proc/$BASHPID/fd); do [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null; done; exec "$0" "$@""#;

/// Restores the brokers this scenario moved, however it ends (thaw first: a frozen broker
/// would hold the others' cluster bridges).
struct BrokerGuard {
    script: String,
    frozen: std::sync::Mutex<Option<String>>,
    stopped: std::sync::Mutex<Option<String>>,
}

impl BrokerGuard {
    fn set(slot: &std::sync::Mutex<Option<String>>, v: Option<&str>) {
        if let Ok(mut s) = slot.lock() {
            *s = v.map(str::to_string);
        }
    }
}

impl Drop for BrokerGuard {
    fn drop(&mut self) {
        for (slot, action) in [(&self.frozen, "thaw"), (&self.stopped, "start")] {
            let name = slot.lock().ok().and_then(|mut s| s.take());
            if let Some(name) = name {
                eprintln!("[faults] restoring broker {name} ({action})");
                let _ = testbed_command(&self.script, &["broker", action, &name]).status();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Jolokia: what the brokers hold.

#[derive(Clone, Debug, PartialEq)]
struct QueueRow {
    address: String,
    filter: String,
    routing_type: String,
    durable: bool,
    messages: u64,
    delivering: u64,
    consumers: u64,
}

#[derive(Clone, Debug, PartialEq)]
struct DivertRow {
    address: String,
    forwarding: String,
    filter: String,
    exclusive: bool,
    routing_type: String,
}

#[derive(Clone, Debug, Default)]
struct NodeState {
    queues: HashMap<String, QueueRow>,
    diverts: HashMap<String, DivertRow>,
}

/// Every node's objects of this run, or why a node could not be read.
type Snapshot = BTreeMap<String, Result<NodeState, String>>;

#[derive(Clone)]
struct Jmx {
    http: reqwest::Client,
    user: (String, String),
}

impl Jmx {
    async fn post(&self, node: &Node, body: Value) -> Result<Value> {
        let r = self
            .http
            .post(&node.jolokia)
            .basic_auth(&self.user.0, Some(&self.user.1))
            .header("Origin", "http://localhost")
            .json(&body)
            .send()
            .await
            .with_context(|| format!("Jolokia POST to {}", node.name))?;
        let status = r.status();
        let text = r.text().await?;
        if !status.is_success() {
            bail!("{}: HTTP {status}: {}", node.name, cut(&text, 300));
        }
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON: {}", node.name, cut(&text, 300)))
    }

    fn broker_mbean(node: &Node) -> String {
        format!("org.apache.activemq.artemis:broker=\"{}\"", node.name)
    }

    /// Many execs on the broker's MBean in one POST; each must answer 200.
    async fn execs(&self, node: &Node, calls: &[(String, Value)]) -> Result<()> {
        for chunk in calls.chunks(200) {
            let body: Vec<Value> = chunk
                .iter()
                .map(|(op, args)| json!({"type": "exec", "mbean": Self::broker_mbean(node), "operation": op, "arguments": args}))
                .collect();
            let answers = self.post(node, Value::Array(body)).await?;
            for (i, a) in answers.as_array().into_iter().flatten().enumerate() {
                if a["status"] != 200 {
                    bail!(
                        "{}: {} refused: {}",
                        node.name,
                        chunk[i].0,
                        cut(&a.to_string(), 300)
                    );
                }
            }
        }
        Ok(())
    }

    /// Many execs on address MBeans (`sendMessage`) in one POST; each must answer 200.
    async fn send_many(&self, node: &Node, to: &[(String, Value)], count: usize) -> Result<()> {
        let (u, p) = &self.user;
        let mut body = vec![];
        for (address, properties) in to {
            for i in 0..count {
                body.push(json!({"type": "exec",
                    "mbean": format!("org.apache.activemq.artemis:broker=\"{}\",component=addresses,address=\"{address}\"", node.name),
                    "operation": "sendMessage(java.util.Map,int,java.lang.String,boolean,java.lang.String,java.lang.String)",
                    "arguments": [properties, 3, format!("kept {i}"), true, u, p]}));
            }
        }
        for chunk in body.chunks(200) {
            let answers = self.post(node, Value::Array(chunk.to_vec())).await?;
            for a in answers.as_array().into_iter().flatten() {
                if a["status"] != 200 {
                    bail!("{}: sendMessage refused: {}", node.name, cut(&a.to_string(), 300));
                }
            }
        }
        Ok(())
    }

    /// Every queue whose name contains `token` (listQueues, one page).
    async fn queues(&self, node: &Node, token: &str) -> Result<HashMap<String, QueueRow>> {
        let options = json!({"field": "name", "operation": "CONTAINS", "value": token}).to_string();
        let r = self
            .post(
                node,
                json!({"type": "exec", "mbean": Self::broker_mbean(node),
                       "operation": "listQueues(java.lang.String,int,int)", "arguments": [options, -1, -1]}),
            )
            .await?;
        if r["status"] != 200 {
            bail!("{}: listQueues: {}", node.name, cut(&r.to_string(), 300));
        }
        let doc: Value = serde_json::from_str(r["value"].as_str().unwrap_or("null"))
            .with_context(|| format!("{}: listQueues did not return JSON", node.name))?;
        let s = |row: &Value, k: &str| row[k].as_str().unwrap_or_default().to_string();
        let n = |row: &Value, k: &str| row[k].as_str().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let mut out = HashMap::new();
        for row in doc["data"].as_array().into_iter().flatten() {
            out.insert(
                s(row, "name"),
                QueueRow {
                    address: s(row, "address"),
                    filter: s(row, "filter"),
                    routing_type: s(row, "routingType"),
                    durable: s(row, "durable") == "true",
                    messages: n(row, "messageCount"),
                    delivering: n(row, "deliveringCount"),
                    consumers: n(row, "consumerCount"),
                },
            );
        }
        Ok(out)
    }

    /// Every divert whose name contains `token` (a pattern read; none is a 404).
    async fn diverts(&self, node: &Node, token: &str) -> Result<HashMap<String, DivertRow>> {
        let r = self
            .post(
                node,
                json!({"type": "read",
                       "mbean": format!("org.apache.activemq.artemis:broker=\"{}\",component=addresses,address=*,subcomponent=diverts,divert=\"*{token}*\"", node.name),
                       "attribute": ["UniqueName", "Address", "ForwardingAddress", "Filter", "Exclusive", "RoutingType"]}),
            )
            .await?;
        if r["status"] == 404 {
            return Ok(HashMap::new());
        }
        if r["status"] != 200 {
            bail!("{}: divert read: {}", node.name, cut(&r.to_string(), 300));
        }
        let mut out = HashMap::new();
        for (_, v) in r["value"].as_object().into_iter().flatten() {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            out.insert(
                s("UniqueName"),
                DivertRow {
                    address: s("Address"),
                    forwarding: s("ForwardingAddress"),
                    filter: s("Filter"),
                    exclusive: v["Exclusive"].as_bool().unwrap_or(true),
                    routing_type: s("RoutingType"),
                },
            );
        }
        Ok(out)
    }

    async fn node_state(&self, node: &Node, token: &str) -> Result<NodeState> {
        let (queues, diverts) = tokio::join!(self.queues(node, token), self.diverts(node, token));
        Ok(NodeState {
            queues: queues?,
            diverts: diverts?,
        })
    }

    async fn snapshot(&self, nodes: &[Node], token: &str) -> Snapshot {
        let reads = futures::future::join_all(nodes.iter().map(|n| async move {
            (
                n.name.clone(),
                tokio::time::timeout(Duration::from_secs(60), self.node_state(n, token))
                    .await
                    .map_err(|_| "no answer in 60 s".to_string())
                    .and_then(|r| r.map_err(|e| format!("{e:#}"))),
            )
        }))
        .await;
        reads.into_iter().collect()
    }
}

fn cut(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    }
}

/// At most `n` problems, then how many more.
fn summarize(problems: &[String], n: usize) -> String {
    let mut s = problems.iter().take(n).cloned().collect::<Vec<_>>().join("; ");
    if problems.len() > n {
        s.push_str(&format!("; … and {} more", problems.len() - n));
    }
    s
}

// ---------------------------------------------------------------------------------------------
// The operator as a process.

struct OperatorProc {
    child: tokio::process::Child,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

impl OperatorProc {
    async fn spawn(
        bin: &Path,
        kubeconfig: &str,
        db_url: &str,
        ns: &str,
        instance: &str,
        pass_seconds: u32,
        log: &Path,
    ) -> Result<OperatorProc> {
        let port = free_port()?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open {}", log.display()))?;
        // Through bash, which closes inherited descriptors (a caller's lock) and execs it.
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg("-c")
            .arg(CLOSE_FDS_AND_EXEC)
            .arg(bin)
            .args(["run", "--database-url", db_url, "--namespaces", ns])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn")
            .env("LEADER_ELECTION", "false")
            .env("INSTANCE_ID", instance)
            .env("CAPTURE_PASS_SECONDS", pass_seconds.to_string())
            .stdout(std::process::Stdio::from(file.try_clone()?))
            .stderr(std::process::Stdio::from(file))
            .kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| format!("start {}", bin.display()))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the operator exited ({status}) before it was ready: see {}",
                    log.display()
                );
            }
            if let Ok(r) = http.get(format!("http://127.0.0.1:{port}/readyz")).send().await
                && r.status().is_success()
            {
                return Ok(OperatorProc { child });
            }
            if Instant::now() > deadline {
                bail!("the operator was not ready after 120 s: see {}", log.display());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGKILL, and reap it.
    async fn kill(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

// ---------------------------------------------------------------------------------------------
// The producer: one AMQP connection per node, round-robin over the tapped addresses.

struct Link {
    connection: fe2o3_amqp::connection::ConnectionHandle<()>,
    session: fe2o3_amqp::session::SessionHandle<()>,
    senders: HashMap<String, fe2o3_amqp::Sender>,
}

impl Link {
    async fn open(url: &str, container: &str) -> Result<Link> {
        let mut connection = fe2o3_amqp::Connection::open(container.to_string(), url)
            .await
            .map_err(|e| anyhow!("connect: {e}"))?;
        let session = fe2o3_amqp::Session::begin(&mut connection)
            .await
            .map_err(|e| anyhow!("session: {e}"))?;
        Ok(Link {
            connection,
            session,
            senders: HashMap::new(),
        })
    }

    /// Ok(true) when the broker accepted the message.
    async fn send(&mut self, address: &str, body: String) -> Result<bool> {
        if !self.senders.contains_key(address) {
            let name = format!("tx-{}", self.senders.len());
            let s = fe2o3_amqp::Sender::attach(&mut self.session, name, address.to_string())
                .await
                .map_err(|e| anyhow!("attach {address}: {e}"))?;
            self.senders.insert(address.to_string(), s);
        }
        let sender = self.senders.get_mut(address).ok_or_else(|| anyhow!("sender"))?;
        let outcome = sender.send(body).await.map_err(|e| anyhow!("send: {e}"))?;
        Ok(matches!(
            outcome,
            fe2o3_amqp::types::messaging::Outcome::Accepted(_)
        ))
    }

    async fn close(mut self) {
        for (_, s) in self.senders.drain() {
            let _ = s.close().await;
        }
        let _ = self.session.end().await;
        let _ = self.connection.close().await;
    }
}

struct Producer {
    gate: Arc<tokio::sync::RwLock<()>>,
    sent: Arc<AtomicU64>,
    /// Sends whose outcome is not known (an error or a timeout): not counted as sent.
    unknown: Arc<AtomicU64>,
    /// Sends the broker answered with anything but Accepted.
    refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Producer {
    fn start(
        nodes: &[Node],
        user: &(String, String),
        addresses: Vec<String>,
        rate: f64,
        tag: &str,
    ) -> Producer {
        let gate = Arc::new(tokio::sync::RwLock::new(()));
        let sent = Arc::new(AtomicU64::new(0));
        let unknown = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let addresses = Arc::new(addresses);
        let period = Duration::from_secs_f64(nodes.len() as f64 / rate.max(0.1));
        let tasks = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let url = n
                    .amqp
                    .replace("amqp://", &format!("amqp://{}:{}@", user.0, user.1));
                let container = format!("producer-{tag}-{}", n.name);
                let (gate, sent, unknown, refused, stop, addresses) = (
                    gate.clone(),
                    sent.clone(),
                    unknown.clone(),
                    refused.clone(),
                    stop.clone(),
                    addresses.clone(),
                );
                tokio::spawn(async move {
                    let mut link: Option<Link> = None;
                    let mut next = i * addresses.len() / 3;
                    let mut tick = tokio::time::interval(period);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        let _open = gate.read().await;
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if link.is_none() {
                            match tokio::time::timeout(Duration::from_secs(10), Link::open(&url, &container))
                                .await
                            {
                                Ok(Ok(l)) => link = Some(l),
                                _ => continue,
                            }
                        }
                        let Some(l) = link.as_mut() else { continue };
                        let address = &addresses[next % addresses.len()];
                        next += 1;
                        seq += 1;
                        // Longer than a freeze: a send to a frozen broker completes after the thaw.
                        match tokio::time::timeout(
                            Duration::from_secs(90),
                            l.send(address, format!("{container} {seq}")),
                        )
                        .await
                        {
                            Ok(Ok(true)) => {
                                sent.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Ok(false)) => {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => {
                                unknown.fetch_add(1, Ordering::Relaxed);
                                // Dropped without a close: the broker may be gone.
                                link = None;
                            }
                        }
                    }
                    if let Some(l) = link {
                        let _ = tokio::time::timeout(Duration::from_secs(10), l.close()).await;
                    }
                })
            })
            .collect();
        Producer {
            gate,
            sent,
            unknown,
            refused,
            stop,
            tasks,
        }
    }

    /// Wait for the sends in flight, and hold every further one until the guard is dropped.
    async fn pause(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.gate.clone().write_owned().await
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(100), t).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One installation: namespace, database, operator process, ArtemisCluster `c`.

struct Install {
    ns: String,
    db: String,
    db_url: String,
    instance: String,
    pool: sqlx::PgPool,
    proc: Option<OperatorProc>,
    log: PathBuf,
}

impl Install {
    fn cluster_key(&self) -> String {
        format!("{}/c", self.ns)
    }

    async fn pending(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE outcome = 'pending'")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Commands that destroy: a delete of a queue or divert, a tap removed.
    async fn destroys(&self) -> Result<Vec<(String, String, String)>> {
        Ok(sqlx::query_as(
            "SELECT command, object_name, outcome FROM audit_event \
             WHERE command LIKE '%.delete' OR command = 'capture.remove' ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        Ok(sqlx::query_scalar("SELECT now()").fetch_one(&self.pool).await?)
    }

    /// Capture passes over its cluster that started at or after `from` and finished by `to`.
    async fn passes_between(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM capture_pass WHERE cluster = $1 AND started_at >= $2 AND finished_at <= $3",
        )
        .bind(self.cluster_key())
        .bind(from)
        .bind(to)
        .fetch_one(&self.pool)
        .await?)
    }

    async fn max_audit_id(&self) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM audit_event")
            .fetch_one(&self.pool)
            .await?)
    }
}

/// A queue of installation A.
#[derive(Clone, Debug)]
struct QueueSpec {
    name: String,
    /// The subscription whose pattern matches it.
    subscription: Option<String>,
    contested: bool,
    adopted: bool,
}

struct Scenario<'a> {
    run: &'a RunSpec,
    bed: Bed,
    nodes: Vec<Node>,
    user: (String, String),
    admin: Client,
    operator_kubeconfig: String,
    jmx: Jmx,
    queues: Vec<QueueSpec>,
    /// (divert name, source address)
    diverts: Vec<(String, String)>,
    sink: String,
    bystanders: Vec<String>,
    /// subscription → its captured addresses
    subscriptions: BTreeMap<String, Vec<String>>,
    /// A's filter of each queue now (a tenth change while c3 is frozen, all with the burst).
    queue_filters: HashMap<String, &'static str>,
    divert_filter: &'static str,
    /// The second installation's queues are declared.
    contested_declared: bool,
    /// (node, queue) → messages it held when recorded: it must hold at least as many.
    kept: BTreeMap<(String, String), u64>,
    a: Option<Install>,
    b: Option<Install>,
    producer: Option<Producer>,
    guard: BrokerGuard,
}

/// Run the scenario; the report says what held and what did not. Err only when it could not
/// start; once started it cleans up after itself whatever happened.
pub async fn run(run: &RunSpec) -> Result<Report> {
    let started = Instant::now();
    let bed = Bed::load()?;
    let nodes = bed.nodes()?;
    let user = bed.user()?;
    let admin = bed.kube("TESTBED_KUBECONFIG").await?;
    let jmx = Jmx {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?,
        user: user.clone(),
    };
    std::fs::create_dir_all(&run.log_dir).ok();
    let guard = BrokerGuard {
        script: bed.var("TESTBED_SCRIPT")?,
        frozen: Default::default(),
        stopped: Default::default(),
    };
    let size = &run.size;
    let p = &run.prefix;
    let subscription_of =
        |i: usize| (i < size.taps).then(|| format!("tap{}", i / size.taps_per_subscription.max(1)));
    let queues: Vec<QueueSpec> = (0..size.queues)
        .map(|i| {
            let subscription = subscription_of(i);
            let name = match &subscription {
                Some(s) => format!("{p}{s}.{i:05}"),
                None => format!("{p}q.{i:05}"),
            };
            QueueSpec {
                name,
                subscription,
                contested: i % size.contested_every.max(1) == 0,
                adopted: i % size.adopted_every.max(1) == size.adopted_every / 2,
            }
        })
        .collect();
    let mut subscriptions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for q in &queues {
        if let Some(s) = &q.subscription {
            subscriptions.entry(s.clone()).or_default().push(q.name.clone());
        }
    }
    let sink = format!("{p}sink");
    let diverts = queues
        .iter()
        .take(size.diverts)
        .enumerate()
        .map(|(i, q)| (format!("{p}d.{i:05}"), q.name.clone()))
        .collect();
    let mut s = Scenario {
        run,
        operator_kubeconfig: bed.var("TESTBED_OPERATOR_KUBECONFIG")?,
        bed,
        nodes,
        user,
        admin,
        jmx,
        queues,
        diverts,
        sink,
        bystanders: (0..size.bystanders).map(|i| format!("{p}by.{i:02}")).collect(),
        subscriptions,
        queue_filters: HashMap::new(),
        divert_filter: DIVERT_BEFORE,
        contested_declared: false,
        kept: BTreeMap::new(),
        a: None,
        b: None,
        producer: None,
        guard,
    };
    let mut report = Report::default();
    if let Err(e) = s.phases(&mut report).await {
        eprintln!("[faults] the run stopped early: {e:#}");
        report.aborted = Some(format!("{e:#}"));
    }
    s.teardown().await;
    report.total_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

impl Scenario<'_> {
    fn filter_of(&self, queue: &str) -> &'static str {
        self.queue_filters.get(queue).copied().unwrap_or(FILTER_BEFORE)
    }

    fn a(&self) -> Result<&Install> {
        self.a.as_ref().ok_or_else(|| anyhow!("installation A is not up"))
    }

    fn log(&self, what: &str) {
        println!("[faults] {what}");
    }

    async fn phases(&mut self, report: &mut Report) -> Result<()> {
        let size = self.run.size.clone();

        // Behind any operator's back: adopted queues and bystanders, with messages everywhere.
        let adopted: Vec<String> = self
            .queues
            .iter()
            .filter(|q| q.adopted)
            .map(|q| q.name.clone())
            .collect();
        let behind: Vec<String> = adopted.iter().chain(self.bystanders.iter()).cloned().collect();
        self.log(&format!(
            "{} queues made behind the operator's back ({} to be adopted, {} bystanders), {} messages each per node",
            behind.len(),
            adopted.len(),
            self.bystanders.len(),
            size.messages_kept
        ));
        for n in &self.nodes {
            let calls: Vec<(String, Value)> = behind
                .iter()
                .map(|q| {
                    let doc = json!({"name": q, "address": q, "routing-type": "ANYCAST", "durable": true})
                        .to_string();
                    (
                        "createQueue(java.lang.String,boolean)".to_string(),
                        json!([doc, true]),
                    )
                })
                .collect();
            self.jmx.execs(n, &calls).await?;
            let to: Vec<(String, Value)> = behind.iter().map(|q| (q.clone(), json!({"v": "1"}))).collect();
            self.jmx.send_many(n, &to, size.messages_kept).await?;
        }
        self.record_kept(&behind).await?;

        // Phase 0: installation A declares everything.
        let mut phase = Phase::new("declare (no fault)");
        let t0 = Instant::now();
        let a = self.install("a", &self.run.instance.clone()).await?;
        self.a = Some(a);
        self.declare_queues().await?;
        self.wait_queues_on_brokers().await?;
        self.declare_diverts_and_subscriptions().await?;
        phase.fault_seconds = t0.elapsed().as_secs_f64();
        phase.notes.push(format!(
            "{} queues, {} diverts, {} taps in {} subscriptions declared in {:.1} s",
            self.queues.len(),
            self.diverts.len(),
            self.run.size.taps,
            self.subscriptions.len(),
            phase.fault_seconds
        ));
        let end = Instant::now();
        let end_db = self.a()?.now().await?;
        self.settle(&mut phase, end, end_db, false).await?;
        // The producer starts on healthy taps.
        let addresses: Vec<String> = self.subscriptions.values().flatten().cloned().collect();
        self.producer = Some(Producer::start(
            &self.nodes,
            &self.user,
            addresses,
            size.rate,
            &self.run.token,
        ));
        tokio::time::sleep(Duration::from_secs(size.warm_up_seconds)).await;
        self.account(&mut phase).await?;
        self.finish(report, phase);

        // Phase 1: a broker restarts.
        let mut phase = Phase::new("broker c2 restarts");
        let t0 = Instant::now();
        self.log("stopping c2");
        BrokerGuard::set(&self.guard.stopped, Some("c2"));
        self.bed.broker("stop", "c2")?;
        self.bed.broker("start", "c2")?;
        BrokerGuard::set(&self.guard.stopped, None);
        phase.fault_seconds = t0.elapsed().as_secs_f64();
        let (end, end_db) = (Instant::now(), self.a()?.now().await?);
        self.settle(&mut phase, end, end_db, true).await?;
        self.account(&mut phase).await?;
        self.finish(report, phase);

        // Phase 2: a node freezes and thaws.
        let mut phase = Phase::new(&format!("node c3 frozen {} s", size.freeze_seconds));
        let t0 = Instant::now();
        self.log("freezing c3");
        BrokerGuard::set(&self.guard.frozen, Some("c3"));
        self.bed.broker("freeze", "c3")?;
        // Once the operator's polls of c3 have timed out, a tenth of the queues change their
        // filter: c3 misses the writes, and must get them after the thaw.
        let noticed = Duration::from_secs(u64::from(size.poll_timeout_seconds + size.poll_seconds) + 2);
        tokio::time::sleep(noticed).await;
        let changed: Vec<String> = self
            .queues
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 10 == 5)
            .map(|(_, q)| q.name.clone())
            .collect();
        self.patch_queue_filters(&changed, FILTER_WHILE_FROZEN).await?;
        phase.notes.push(format!(
            "{} queues changed their filter {:.0} s into the freeze",
            changed.len(),
            t0.elapsed().as_secs_f64()
        ));
        let rest = Duration::from_secs(size.freeze_seconds).saturating_sub(t0.elapsed());
        tokio::time::sleep(rest.max(Duration::from_secs(3))).await;
        self.bed.broker("thaw", "c3")?;
        BrokerGuard::set(&self.guard.frozen, None);
        phase.fault_seconds = t0.elapsed().as_secs_f64();
        let (end, end_db) = (Instant::now(), self.a()?.now().await?);
        self.settle(&mut phase, end, end_db, true).await?;
        self.account(&mut phase).await?;
        self.finish(report, phase);

        // Phase 3: the operator is SIGKILLed mid-burst and started again.
        let mut phase = Phase::new("operator SIGKILLed mid-burst");
        let t0 = Instant::now();
        let (end, end_db) = self.kill_mid_burst(&mut phase).await?;
        phase.fault_seconds = (end - t0).as_secs_f64();
        self.settle(&mut phase, end, end_db, true).await?;
        self.account(&mut phase).await?;
        self.finish(report, phase);

        // Phase 4: a second installation declares a tenth of the queues.
        let mut phase = Phase::new("second installation declares 1/10");
        let t0 = Instant::now();
        self.second_installation(&mut phase).await?;
        phase.fault_seconds = t0.elapsed().as_secs_f64();
        let (end, end_db) = (Instant::now(), self.a()?.now().await?);
        self.settle(&mut phase, end, end_db, true).await?;
        self.account(&mut phase).await?;
        self.finish(report, phase);
        Ok(())
    }

    fn finish(&self, report: &mut Report, phase: Phase) {
        self.log(&format!(
            "{}: fault {:.1} s; brokers = specs {} s, no audit pending {} s, taps HEALTHY {} s ({} passes), notOwned {} s, accounting {} s (sent {}, stored {} + lost {}); {} failures",
            phase.name,
            phase.fault_seconds,
            secs(phase.specs_seconds),
            secs(phase.audit_seconds),
            secs(phase.taps_seconds),
            phase.taps_passes.map_or("—".into(), |n| n.to_string()),
            secs(phase.extra_seconds),
            secs(phase.accounting_seconds),
            phase.sent,
            phase.stored,
            phase.lost,
            phase.failures.len()
        ));
        for f in &phase.failures {
            self.log(&format!("  FAILED: {f}"));
        }
        report.phases.push(phase);
    }

    /// Namespace, database, operator process, ArtemisCluster `c` with 3 live nodes.
    async fn install(&self, label: &str, instance: &str) -> Result<Install> {
        let ns = format!("faults-{label}-{}", self.run.token);
        let db = format!("faults_{label}_{}", self.run.token);
        let namespace: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
        }))?;
        Api::<k8s_openapi::api::core::v1::Namespace>::all(self.admin.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("create namespace {ns}"))?;
        let db_url = self.bed.create_database(&db).await?;
        let log = self
            .run
            .log_dir
            .join(format!("faults-operator-{label}-{}.log", self.run.token));
        self.log(&format!(
            "installation {label}: namespace {ns}, instance {instance}, log {}",
            log.display()
        ));
        let proc = OperatorProc::spawn(
            &self.run.operator_bin,
            &self.operator_kubeconfig,
            &db_url,
            &ns,
            instance,
            self.run.size.pass_seconds,
            &log,
        )
        .await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(3)
            .connect(&db_url)
            .await
            .context("connect to the installation's database")?;
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c-credentials"},
            "stringData": {"username": self.user.0, "password": self.user.1}
        }))?;
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.admin.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await
            .context("create the credentials Secret")?;
        let brokers: Vec<Value> = self.nodes.iter().map(|n| json!({"url": n.jolokia})).collect();
        let size = &self.run.size;
        let cluster: ArtemisCluster = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": "c"},
            "spec": {"brokers": brokers, "credentials": {"secretName": "c-credentials"},
                     "pollIntervalSeconds": size.poll_seconds, "requestTimeoutSeconds": 10,
                     "pollTimeoutSeconds": size.poll_timeout_seconds}
        }))?;
        let api: Api<ArtemisCluster> = Api::namespaced(self.admin.clone(), &ns);
        api.create(&PostParams::default(), &cluster)
            .await
            .context("create the ArtemisCluster")?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let c = api.get("c").await?;
            if c.status.as_ref().is_some_and(|s| s.live_nodes == 3) {
                break;
            }
            if Instant::now() > deadline {
                bail!("ArtemisCluster {ns}/c did not report 3 live nodes in 120 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(Install {
            ns,
            db,
            db_url,
            instance: instance.to_string(),
            pool,
            proc: Some(proc),
            log,
        })
    }

    async fn create_all<K>(&self, ns: &str, objects: Vec<K>) -> Result<()>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.admin.clone(), ns);
        stream::iter(objects)
            .map(|o| {
                let api = api.clone();
                async move {
                    api.create(&PostParams::default(), &o)
                        .await
                        .with_context(|| format!("create {}", o.name_any()))
                        .map(|_| ())
                }
            })
            .buffer_unordered(self.run.size.in_flight)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn declare_queues(&self) -> Result<()> {
        let ns = self.a()?.ns.clone();
        let mut objects: Vec<ArtemisQueue> = vec![serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": self.sink}, "spec": {"clusterRef": {"name": "c"}}
        }))?];
        for q in &self.queues {
            objects.push(serde_json::from_value(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
                "metadata": {"name": q.name},
                "spec": {"clusterRef": {"name": "c"}, "filter": self.filter_of(&q.name)}
            }))?);
        }
        self.log(&format!("declaring {} queues", objects.len()));
        self.create_all(&ns, objects).await
    }

    /// Diverts need their source address and a queue at their target: wait for the queues.
    async fn wait_queues_on_brokers(&self) -> Result<()> {
        let deadline = Instant::now() + self.run.size.wait();
        loop {
            let snap = self.jmx.snapshot(&self.nodes, &self.run.token).await;
            let missing: usize = snap
                .values()
                .map(|n| match n {
                    Ok(st) => {
                        self.queues
                            .iter()
                            .filter(|q| !st.queues.contains_key(&q.name))
                            .count()
                            + usize::from(!st.queues.contains_key(&self.sink))
                    }
                    Err(_) => self.queues.len() + 1,
                })
                .sum();
            if missing == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{missing} queue instances still missing on the brokers after {:?}",
                    self.run.size.wait()
                );
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    async fn declare_diverts_and_subscriptions(&self) -> Result<()> {
        let ns = self.a()?.ns.clone();
        let mut diverts: Vec<ArtemisDivert> = vec![];
        for (name, address) in &self.diverts {
            diverts.push(serde_json::from_value(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisDivert",
                "metadata": {"name": name},
                "spec": {"clusterRef": {"name": "c"}, "address": address, "forwardingAddress": self.sink,
                         "filter": self.divert_filter}
            }))?);
        }
        self.log(&format!("declaring {} diverts", diverts.len()));
        self.create_all(&ns, diverts).await?;
        let mut subs: Vec<ArtemisCaptureSubscription> = vec![];
        for (name, addresses) in &self.subscriptions {
            subs.push(serde_json::from_value(json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
                "metadata": {"name": name, "annotations": {"artemis-studio.io/confirm-without-review": "true"}},
                "spec": {"clusterRef": {"name": "c"}, "queues": format!("{}{name}.#", self.run.prefix),
                         "maxTaps": addresses.len().max(1)}
            }))?);
        }
        self.log(&format!("declaring {} capture subscriptions", subs.len()));
        self.create_all(&ns, subs).await
    }

    /// Set these queues' filter (A's), a few in flight.
    async fn patch_queue_filters(&mut self, names: &[String], filter: &'static str) -> Result<()> {
        let api: Api<ArtemisQueue> = Api::namespaced(self.admin.clone(), &self.a()?.ns);
        stream::iter(names)
            .map(|name| {
                let api = api.clone();
                async move {
                    api.patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"filter": filter}})),
                    )
                    .await
                    .with_context(|| format!("patch {name}"))
                    .map(|_| ())
                }
            })
            .buffer_unordered(self.run.size.in_flight)
            .try_collect::<Vec<()>>()
            .await?;
        for n in names {
            self.queue_filters.insert(n.clone(), filter);
        }
        Ok(())
    }

    /// Record what each of these queues holds on every node now.
    async fn record_kept(&mut self, names: &[String]) -> Result<()> {
        let snap = self.jmx.snapshot(&self.nodes, &self.run.token).await;
        for (node, st) in snap {
            let st = st.map_err(|e| anyhow!("{node}: {e}"))?;
            for q in names {
                let held = st.queues.get(q).map_or(0, |r| r.messages);
                self.kept.insert((node.clone(), q.clone()), held);
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // The checks.

    /// What is not as declared on the brokers (empty: brokers = specs on every node).
    fn spec_problems(&self, snap: &Snapshot) -> Vec<String> {
        let mut problems = vec![];
        for (node, st) in snap {
            let st = match st {
                Ok(st) => st,
                Err(e) => {
                    problems.push(format!("{node}: unreadable: {e}"));
                    continue;
                }
            };
            let mut known: BTreeSet<String> = BTreeSet::new();
            let mut check_queue = |name: &str, filters: &[&str]| {
                known.insert(name.to_string());
                match st.queues.get(name) {
                    None => problems.push(format!("{node}: queue {name} missing")),
                    Some(r) => {
                        if r.address != name || r.routing_type != "ANYCAST" || !r.durable {
                            problems.push(format!(
                                "{node}: queue {name} is address {} {} durable={}",
                                r.address, r.routing_type, r.durable
                            ));
                        }
                        if !filters.contains(&r.filter.as_str()) {
                            problems.push(format!(
                                "{node}: queue {name} has filter {:?}, declared {filters:?}",
                                r.filter
                            ));
                        }
                    }
                }
            };
            check_queue(&self.sink, &[""]);
            for q in &self.queues {
                if q.contested && self.contested_declared {
                    check_queue(&q.name, &[self.filter_of(&q.name), FILTER_B]);
                } else {
                    check_queue(&q.name, &[self.filter_of(&q.name)]);
                }
            }
            for b in &self.bystanders {
                // Made with no filter; nobody declares them.
                check_queue(b, &[""]);
            }
            for name in st.queues.keys() {
                if name.starts_with(&self.run.prefix) && !known.contains(name) {
                    problems.push(format!("{node}: queue {name} was never declared"));
                }
            }
            let mut known_diverts: BTreeSet<&str> = BTreeSet::new();
            for (name, address) in &self.diverts {
                known_diverts.insert(name);
                match st.diverts.get(name) {
                    None => problems.push(format!("{node}: divert {name} missing")),
                    Some(d) => {
                        if d.address != *address
                            || d.forwarding != self.sink
                            || d.filter != self.divert_filter
                            || d.exclusive
                            || d.routing_type != "STRIP"
                        {
                            problems.push(format!(
                                "{node}: divert {name} is {d:?}, declared source {address}, target {}, filter {:?}, STRIP, not exclusive",
                                self.sink, self.divert_filter
                            ));
                        }
                    }
                }
            }
            for name in st.diverts.keys() {
                if name.starts_with(&self.run.prefix) && !known_diverts.contains(name.as_str()) {
                    problems.push(format!("{node}: divert {name} was never declared"));
                }
                if name.starts_with(CAPTURE_PREFIX)
                    && !name.starts_with(&TapName::instance_prefix(&self.run.instance))
                {
                    problems.push(format!("{node}: divert {name} is a tap of another instance"));
                }
            }
        }
        problems
    }

    /// Taps that are not HEALTHY, by the subscription's status, the brokers and the database.
    async fn tap_problems(&self, snap: &Snapshot, since: DateTime<Utc>) -> Result<Vec<String>> {
        let a = self.a()?;
        let mut problems = vec![];
        // The subscriptions' word.
        let api: Api<ArtemisCaptureSubscription> = Api::namespaced(self.admin.clone(), &a.ns);
        for (name, addresses) in &self.subscriptions {
            let want = (addresses.len() * self.nodes.len()) as u64;
            match api.get(name).await {
                Ok(s) => {
                    let c = s.status.as_ref().map(|st| st.tap_counts).unwrap_or_default();
                    if c.healthy != want || c.total() != want {
                        problems.push(format!(
                            "subscription {name}: status tapCounts healthy {} degraded {} pending {} refused {} (want {want} HEALTHY)",
                            c.healthy, c.degraded, c.pending, c.refused
                        ));
                    }
                }
                Err(e) => problems.push(format!("subscription {name}: {e}")),
            }
        }
        // The brokers': the divert into the ring queue, the ring queue with a drain attached.
        for (node, st) in snap {
            let Ok(st) = st else {
                problems.push(format!("{node}: unreadable"));
                continue;
            };
            for (sub, addresses) in &self.subscriptions {
                for address in addresses {
                    let tap = TapName::new(&self.run.instance, &a.ns, address, sub);
                    match st.diverts.get(&tap.divert()) {
                        Some(d) if d.address == *address && d.forwarding == tap.forwarding_address() => {}
                        Some(d) => problems.push(format!("{node}: tap divert of {address} is {d:?}")),
                        None => problems.push(format!("{node}: no tap divert on {address} ({sub})")),
                    }
                    match st.queues.get(&tap.capture_queue()) {
                        Some(q) if q.consumers >= 1 => {}
                        Some(_) => {
                            problems.push(format!("{node}: ring queue of {address} ({sub}) has no drain"))
                        }
                        None => problems.push(format!("{node}: no ring queue for {address} ({sub})")),
                    }
                }
            }
        }
        // The database's: one open install record, and a drain confirmed alive lately, per
        // address and node.
        let open: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT subscription, source_address, count(*) FROM capture_tap \
             WHERE cluster = $1 AND removed_at IS NULL GROUP BY 1, 2",
        )
        .bind(a.cluster_key())
        .fetch_all(&a.pool)
        .await?;
        let confirmed: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT subscription, source_address, count(DISTINCT node) FROM capture_coverage_confirmed \
             WHERE cluster = $1 AND ended_at IS NULL \
               AND confirmed_until > greatest($2, now() - interval '20 seconds') GROUP BY 1, 2",
        )
        .bind(a.cluster_key())
        .bind(since)
        .fetch_all(&a.pool)
        .await?;
        let index = |rows: &[(String, String, i64)]| -> HashMap<(String, String), i64> {
            rows.iter()
                .map(|(s, a, n)| ((s.clone(), a.clone()), *n))
                .collect()
        };
        let (open, confirmed) = (index(&open), index(&confirmed));
        let nodes = self.nodes.len() as i64;
        for (sub, addresses) in &self.subscriptions {
            for address in addresses {
                let key = (sub.clone(), address.clone());
                let (o, c) = (
                    open.get(&key).copied().unwrap_or(0),
                    confirmed.get(&key).copied().unwrap_or(0),
                );
                if o != nodes {
                    problems.push(format!(
                        "{address} ({sub}): {o} open install records, want {nodes}"
                    ));
                }
                if c < nodes {
                    problems.push(format!(
                        "{address} ({sub}): a drain confirmed since the fault's end and in the last 20 s on {c} nodes, want {nodes}"
                    ));
                }
            }
        }
        Ok(problems)
    }

    /// Messages gone from a queue that held them, and destroying commands.
    async fn destroyed(&self, snap: &Snapshot) -> Result<Vec<String>> {
        let mut problems = vec![];
        for ((node, queue), held) in &self.kept {
            match snap.get(node) {
                Some(Ok(st)) => match st.queues.get(queue) {
                    Some(r) if r.messages >= *held => {}
                    Some(r) => problems.push(format!(
                        "{node}: {queue} holds {} messages, held {held}",
                        r.messages
                    )),
                    None => problems.push(format!("{node}: {queue} (held {held} messages) is gone")),
                },
                _ => problems.push(format!("{node}: unreadable")),
            }
        }
        for (label, install) in [("A", &self.a), ("B", &self.b)] {
            if let Some(i) = install {
                let rows = i.destroys().await?;
                if !rows.is_empty() {
                    problems.push(format!(
                        "installation {label} sent destroying commands no object asked for: {}",
                        summarize(&rows.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>(), 10)
                    ));
                }
            }
        }
        Ok(problems)
    }

    async fn audit_problems(&self) -> Result<Vec<String>> {
        let mut problems = vec![];
        for (label, install) in [("A", &self.a), ("B", &self.b)] {
            if let Some(i) = install {
                let n = i.pending().await?;
                if n > 0 {
                    problems.push(format!("installation {label}: {n} audit rows pending"));
                }
            }
        }
        Ok(problems)
    }

    /// The queues both installations declare whose status.notOwned is not recorded on a side.
    async fn not_owned_problems(&self) -> Result<Vec<String>> {
        let mut problems = vec![];
        for (label, install) in [("A", &self.a), ("B", &self.b)] {
            let Some(i) = install else { continue };
            let api: Api<ArtemisQueue> = Api::namespaced(self.admin.clone(), &i.ns);
            let list = api.list(&ListParams::default()).await?;
            let recorded: BTreeSet<String> = list
                .items
                .iter()
                .filter(|q| q.status.as_ref().is_some_and(|s| s.not_owned.is_some()))
                .map(|q| q.name_any())
                .collect();
            let missing: Vec<String> = self
                .queues
                .iter()
                .filter(|q| q.contested && !recorded.contains(&q.name))
                .map(|q| q.name.clone())
                .collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "installation {label}: no status.notOwned on {} of the {} queues both declare: {}",
                    missing.len(),
                    self.queues.iter().filter(|q| q.contested).count(),
                    summarize(&missing, 5)
                ));
            }
        }
        Ok(problems)
    }

    /// Wait until brokers = specs, no audit row pending and every tap HEALTHY (and, after the
    /// second installation, notOwned on both sides), timing each from the fault's end; then
    /// check all of them again, and that nothing was destroyed.
    async fn settle(
        &self,
        phase: &mut Phase,
        end: Instant,
        end_db: DateTime<Utc>,
        two_passes: bool,
    ) -> Result<()> {
        let deadline = end + self.run.size.wait();
        let a = self.a()?;
        let mut last: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        loop {
            let snap = self.jmx.snapshot(&self.nodes, &self.run.token).await;
            let at = end.elapsed().as_secs_f64();
            if phase.specs_seconds.is_none() {
                let p = self.spec_problems(&snap);
                if p.is_empty() {
                    phase.specs_seconds = Some(at);
                }
                last.insert("brokers = specs", p);
            }
            if phase.audit_seconds.is_none() {
                let p = self.audit_problems().await?;
                if p.is_empty() {
                    phase.audit_seconds = Some(at);
                }
                last.insert("no audit row pending", p);
            }
            if phase.taps_seconds.is_none() {
                let p = self.tap_problems(&snap, end_db).await?;
                if p.is_empty() {
                    phase.taps_seconds = Some(at);
                    let now = a.now().await?;
                    phase.taps_passes = Some(a.passes_between(end_db, now).await?);
                }
                last.insert("every tap HEALTHY", p);
            }
            if self.contested_declared && phase.extra_seconds.is_none() {
                let p = self.not_owned_problems().await?;
                if p.is_empty() {
                    phase.extra_seconds = Some(at);
                }
                last.insert("status.notOwned on both sides", p);
            }
            let done = phase.specs_seconds.is_some()
                && phase.audit_seconds.is_some()
                && phase.taps_seconds.is_some()
                && (!self.contested_declared || phase.extra_seconds.is_some());
            if done {
                break;
            }
            if Instant::now() > deadline {
                for (what, p) in &last {
                    if !p.is_empty() {
                        phase.failures.push(format!(
                            "{what}: not reached {:.0} s after the fault: {}",
                            self.run.size.wait().as_secs_f64(),
                            summarize(p, 8)
                        ));
                    }
                }
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if two_passes
            && let Some(n) = phase.taps_passes
            && n > 2
        {
            phase.failures.push(format!(
                "every tap HEALTHY only after {n} capture passes since the fault's end ({} s after it), not within two",
                secs(phase.taps_seconds)
            ));
        }
        // Everything again, at once, and nothing destroyed.
        let snap = self.jmx.snapshot(&self.nodes, &self.run.token).await;
        let mut again = vec![];
        if phase.specs_seconds.is_some() {
            again.extend(self.spec_problems(&snap));
        }
        if phase.taps_seconds.is_some() {
            again.extend(self.tap_problems(&snap, end_db).await?);
        }
        if !again.is_empty() {
            phase
                .failures
                .push(format!("held, then no longer: {}", summarize(&again, 8)));
        }
        for p in self.ownership_problems().await? {
            phase.failures.push(format!("ownership: {p}"));
        }
        let destroyed = self.destroyed(&snap).await?;
        if !destroyed.is_empty() {
            phase.failures.push(format!(
                "destroyed what no object asked to destroy: {}",
                summarize(&destroyed, 8)
            ));
        }
        Ok(())
    }

    /// With the producer paused and every ring drained, after two more passes: rows stored +
    /// loss reported = messages accepted (±tolerance).
    async fn account(&self, phase: &mut Phase) -> Result<()> {
        let started = Instant::now();
        let a = self.a()?;
        let producer = self.producer.as_ref().ok_or_else(|| anyhow!("no producer"))?;
        let _paused = producer.pause().await;
        let sent = producer.sent();
        let deadline = Instant::now()
            + Duration::from_secs(120)
            + Duration::from_secs(4 * self.run.size.pass_seconds as u64);
        let ring_prefix = TapName::instance_prefix(&self.run.instance);
        let mut in_rings = u64::MAX;
        while Instant::now() < deadline {
            let snap = self.jmx.snapshot(&self.nodes, &self.run.token).await;
            if snap.values().all(|s| s.is_ok()) {
                in_rings = snap
                    .values()
                    .flatten()
                    .flat_map(|st| st.queues.iter())
                    .filter(|(n, _)| n.starts_with(&ring_prefix))
                    .map(|(_, q)| q.messages + q.delivering)
                    .sum();
                if in_rings == 0 {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if in_rings != 0 {
            phase.notes.push(format!(
                "the rings still held {in_rings} copies when the accounting was read"
            ));
        }
        // Two passes read the counters after the drain.
        let from = a.now().await?;
        while Instant::now() < deadline {
            let now = a.now().await?;
            if a.passes_between(from, now).await? >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let subs: Vec<String> = self.subscriptions.keys().cloned().collect();
        let tolerance = self.run.size.loss_tolerance;
        loop {
            let stored: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM captured_message WHERE cluster = $1 AND subscription = ANY($2)",
            )
            .bind(a.cluster_key())
            .bind(&subs[..])
            .fetch_one(&a.pool)
            .await?;
            let lost: i64 = sqlx::query_scalar(
                "SELECT coalesce(sum(messages), 0)::bigint FROM capture_loss WHERE cluster = $1 AND subscription = ANY($2)",
            )
            .bind(a.cluster_key())
            .bind(&subs[..])
            .fetch_one(&a.pool)
            .await?;
            (phase.sent, phase.stored, phase.lost) = (sent, stored, lost);
            let off = (sent as f64 - (stored + lost) as f64).abs();
            if off <= tolerance * sent as f64 {
                break;
            }
            if Instant::now() > deadline {
                let causes: Vec<(String, i64)> = sqlx::query_as(
                    "SELECT cause, sum(messages)::bigint FROM capture_loss WHERE cluster = $1 GROUP BY 1 ORDER BY 1",
                )
                .bind(a.cluster_key())
                .fetch_all(&a.pool)
                .await?;
                phase.failures.push(format!(
                    "accounting: sent {sent}, stored {stored} + reported lost {lost} = {} ({:+.1} %, tolerance ±{:.0} %); loss by cause {causes:?}; sends with unknown outcome {}, refused {}",
                    stored + lost,
                    100.0 * ((stored + lost) as f64 - sent as f64) / (sent.max(1) as f64),
                    100.0 * tolerance,
                    producer.unknown.load(Ordering::Relaxed),
                    producer.refused.load(Ordering::Relaxed),
                ));
                break;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        if sent == 0 {
            phase
                .failures
                .push("accounting: the producer got no message accepted".into());
        }
        phase.accounting_seconds = Some(started.elapsed().as_secs_f64());
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // The faults that need more than a command.

    /// Change every queue's and divert's filter (the burst); SIGKILL the operator once a
    /// quarter of the burst's commands have been written, then start it again on the same
    /// database and instance ID.
    async fn kill_mid_burst(&mut self, phase: &mut Phase) -> Result<(Instant, DateTime<Utc>)> {
        let a = self
            .a
            .as_mut()
            .ok_or_else(|| anyhow!("installation A is not up"))?;
        let baseline = a.max_audit_id().await?;
        let ns = a.ns.clone();
        let pool = a.pool.clone();
        let burst = self.queues.len() + self.diverts.len();
        let quarter = (burst / 4).max(1) as i64;
        let client = self.admin.clone();
        let in_flight = self.run.size.in_flight;
        let patches: Vec<(bool, String)> = self
            .queues
            .iter()
            .map(|q| (true, q.name.clone()))
            .zip(self.diverts.iter().map(|d| (false, d.0.clone())))
            .flat_map(|(q, d)| [q, d])
            .chain(
                self.queues
                    .iter()
                    .skip(self.diverts.len())
                    .map(|q| (true, q.name.clone())),
            )
            .collect();
        let burst_task = tokio::spawn(async move {
            let queues: Api<ArtemisQueue> = Api::namespaced(client.clone(), &ns);
            let diverts: Api<ArtemisDivert> = Api::namespaced(client, &ns);
            stream::iter(patches)
                .map(|(is_queue, name)| {
                    let (queues, diverts) = (queues.clone(), diverts.clone());
                    async move {
                        let pp = PatchParams::default();
                        let r = if is_queue {
                            queues
                                .patch(
                                    &name,
                                    &pp,
                                    &Patch::Merge(json!({"spec": {"filter": FILTER_AFTER}})),
                                )
                                .await
                                .map(|_| ())
                        } else {
                            diverts
                                .patch(
                                    &name,
                                    &pp,
                                    &Patch::Merge(json!({"spec": {"filter": DIVERT_AFTER}})),
                                )
                                .await
                                .map(|_| ())
                        };
                        r.with_context(|| format!("patch {name}"))
                    }
                })
                .buffer_unordered(in_flight)
                .try_collect::<Vec<()>>()
                .await
        });
        self.queue_filters = self
            .queues
            .iter()
            .map(|q| (q.name.clone(), FILTER_AFTER))
            .collect();
        self.divert_filter = DIVERT_AFTER;
        println!("[faults] burst: {burst} filter changes; SIGKILL after {quarter} commands");
        let deadline = Instant::now() + self.run.size.wait();
        let count = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM audit_event WHERE id > $1 AND (command LIKE 'queue.%' OR command LIKE 'divert.%')",
            )
            .bind(baseline)
            .fetch_one(&pool)
            .await
        };
        loop {
            let n = count().await?;
            if n >= quarter {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the burst wrote {n} commands in {:?}, never {quarter}",
                    self.run.size.wait()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let proc = a.proc.take().ok_or_else(|| anyhow!("no operator process"))?;
        proc.kill().await;
        let at_kill = count().await?;
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE id > $1 AND outcome = 'pending'")
                .bind(baseline)
                .fetch_one(&pool)
                .await?;
        let sent_patches = burst_task.is_finished();
        phase.notes.push(format!(
            "SIGKILL with {at_kill} of the burst's commands written ({pending} of them pending), the API patches {}",
            if sent_patches { "all sent" } else { "still being sent" }
        ));
        self.log(&format!(
            "SIGKILLed with {at_kill} commands written, {pending} pending; restarting"
        ));
        let a = self
            .a
            .as_mut()
            .ok_or_else(|| anyhow!("installation A is not up"))?;
        a.proc = Some(
            OperatorProc::spawn(
                &self.run.operator_bin,
                &self.operator_kubeconfig,
                &a.db_url,
                &a.ns,
                &a.instance,
                self.run.size.pass_seconds,
                &a.log,
            )
            .await?,
        );
        // The fault ends when the operator is back (the rest of the burst is its work).
        let end = (Instant::now(), a.now().await?);
        burst_task.await.map_err(|e| anyhow!("the burst task: {e}"))??;
        Ok(end)
    }

    /// Installation A's word on what it does not own: exactly the queues made behind its back
    /// (adopted), in status.notOwned and as `queue.adopt` audit rows — whatever faults came
    /// since, never a queue it created itself (those a second installation declares too
    /// aside, once it does). With the evidence of the first few that are not as they should be.
    async fn ownership_problems(&self) -> Result<Vec<String>> {
        let a = self.a()?;
        let adopted: BTreeSet<String> = self
            .queues
            .iter()
            .filter(|q| q.adopted)
            .map(|q| q.name.clone())
            .collect();
        let judged: BTreeSet<String> = self
            .queues
            .iter()
            .filter(|q| !(q.contested && self.contested_declared))
            .map(|q| q.name.clone())
            .collect();
        let api: Api<ArtemisQueue> = Api::namespaced(self.admin.clone(), &a.ns);
        let items = api.list(&ListParams::default()).await?.items;
        let evidence_of: HashMap<String, String> = items
            .iter()
            .filter_map(|q| {
                let n = q.status.as_ref()?.not_owned.as_ref()?;
                Some((q.name_any(), serde_json::to_string(n).unwrap_or_default()))
            })
            .collect();
        let not_owned: BTreeSet<String> = evidence_of
            .keys()
            .filter(|n| judged.contains(*n))
            .cloned()
            .collect();
        let audited: BTreeSet<String> = sqlx::query_scalar::<_, String>(
            "SELECT DISTINCT object_name FROM audit_event WHERE command = 'queue.adopt'",
        )
        .fetch_all(&a.pool)
        .await?
        .into_iter()
        .collect();
        let mut problems = vec![];
        for (what, got) in [
            ("status.notOwned", &not_owned),
            ("queue.adopt audit rows", &audited),
        ] {
            let extra: Vec<String> = got.difference(&adopted).cloned().collect();
            let missing: Vec<String> = adopted.difference(got).cloned().collect();
            if !extra.is_empty() {
                let mut evidence = vec![];
                for name in extra.iter().take(2) {
                    let rows: Vec<(i64, String, String, String, Option<Value>)> = sqlx::query_as(
                        "SELECT id, command, outcome, to_char(occurred_at, 'HH24:MI:SS.MS'), outcome_detail \
                         FROM audit_event WHERE object_name = $1 ORDER BY id",
                    )
                    .bind(name)
                    .fetch_all(&a.pool)
                    .await?;
                    let rows: Vec<String> = rows
                        .iter()
                        .map(|(id, c, o, at, d)| {
                            format!(
                                "#{id} {at} {c} {o} {}",
                                cut(&d.as_ref().map(|d| d.to_string()).unwrap_or_default(), 400)
                            )
                        })
                        .collect();
                    evidence.push(format!(
                        "{name}: notOwned {} — its audit rows: {}",
                        cut(evidence_of.get(name).map_or("(none)", |s| s.as_str()), 600),
                        rows.join(" | ")
                    ));
                }
                problems.push(format!(
                    "installation A: {what} on {} queues it created itself: {}. Evidence: {}",
                    extra.len(),
                    summarize(&extra, 5),
                    evidence.join(" ;; ")
                ));
            }
            if !missing.is_empty() {
                problems.push(format!(
                    "installation A: no {what} on {} of the {} queues made behind its back with messages: {}",
                    missing.len(),
                    adopted.len(),
                    summarize(&missing, 5)
                ));
            }
        }
        Ok(problems)
    }

    /// Messages into the queues both will declare, then installation B up and declaring them.
    async fn second_installation(&mut self, phase: &mut Phase) -> Result<()> {
        let contested: Vec<String> = self
            .queues
            .iter()
            .filter(|q| q.contested)
            .map(|q| q.name.clone())
            .collect();
        // Routed by A's filter (`v = '2'` since the burst), on every node.
        let to: Vec<(String, Value)> = contested.iter().map(|q| (q.clone(), json!({"v": "2"}))).collect();
        for n in &self.nodes {
            self.jmx.send_many(n, &to, self.run.size.messages_kept).await?;
        }
        self.record_kept(&contested).await?;
        let empty = self
            .kept
            .iter()
            .filter(|((_, q), held)| contested.contains(q) && **held == 0)
            .count();
        if empty > 0 {
            phase.notes.push(format!(
                "{empty} contested queue instances held no message before B declared them (A's filter did not route them)"
            ));
        }
        let b = self.install("b", &format!("{}-b", self.run.instance)).await?;
        let objects: Vec<ArtemisQueue> = contested
            .iter()
            .map(|name| {
                serde_json::from_value(json!({
                    "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
                    "metadata": {"name": name},
                    "spec": {"clusterRef": {"name": "c"}, "filter": FILTER_B}
                }))
            })
            .collect::<Result<_, _>>()?;
        self.log(&format!("installation b declares {} queues", objects.len()));
        let ns = b.ns.clone();
        self.b = Some(b);
        self.create_all(&ns, objects).await?;
        self.contested_declared = true;
        Ok(())
    }

    /// Stop the producer and both operators, remove every object (finalizers stripped), both
    /// namespaces and databases, and every broker object of the run; restore the brokers.
    async fn teardown(&mut self) {
        if let Some(p) = self.producer.take() {
            p.stop().await;
        }
        let installs: Vec<Install> = [self.a.take(), self.b.take()].into_iter().flatten().collect();
        for mut i in installs {
            if let Some(p) = i.proc.take() {
                p.kill().await;
            }
            i.pool.close().await;
            strip::<ArtemisCaptureSubscription>(&self.admin, &i.ns).await;
            strip::<ArtemisDivert>(&self.admin, &i.ns).await;
            strip::<ArtemisQueue>(&self.admin, &i.ns).await;
            strip::<ArtemisCluster>(&self.admin, &i.ns).await;
            let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.admin.clone())
                .delete(&i.ns, &Default::default())
                .await;
            if let Err(e) = self.bed.drop_database(&i.db).await {
                eprintln!("[faults] drop database {}: {e:#}", i.db);
            }
        }
        // Thaw and start whatever is still moved before sweeping.
        for (slot, action) in [(&self.guard.frozen, "thaw"), (&self.guard.stopped, "start")] {
            let name = slot.lock().ok().and_then(|mut s| s.take());
            if let Some(name) = name {
                let _ = self.bed.broker(action, &name);
            }
        }
        for n in &self.nodes {
            if let Err(e) = sweep(&self.jmx, n, &self.run.token).await {
                eprintln!("[faults] sweeping {}: {e:#}", n.name);
            }
        }
    }
}

/// Remove the finalizers of every object of a kind in a namespace.
async fn strip<K>(client: &Client, ns: &str)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return;
    };
    let patch = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    stream::iter(list.items)
        .map(|o| {
            let (api, patch) = (api.clone(), &patch);
            async move {
                let _ = api.patch(&o.name_any(), &PatchParams::default(), patch).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

/// Every divert, queue and address of the run on one node: diverts first (a divert holds its
/// source address), then queues (with their messages), then the addresses left.
async fn sweep(jmx: &Jmx, node: &Node, token: &str) -> Result<()> {
    let diverts: Vec<String> = jmx.diverts(node, token).await?.into_keys().collect();
    let calls: Vec<(String, Value)> = diverts
        .iter()
        .map(|d| ("destroyDivert(java.lang.String)".to_string(), json!([d])))
        .collect();
    let _ = jmx.execs(node, &calls).await;
    let queues: Vec<String> = jmx.queues(node, token).await?.into_keys().collect();
    let calls: Vec<(String, Value)> = queues
        .iter()
        .map(|q| {
            (
                "destroyQueue(java.lang.String,boolean,boolean)".to_string(),
                json!([q, true, true]),
            )
        })
        .collect();
    let _ = jmx.execs(node, &calls).await;
    let r = jmx
        .post(
            node,
            json!({"type": "read", "mbean": Jmx::broker_mbean(node), "attribute": "AddressNames"}),
        )
        .await?;
    let escaped = escape(token);
    let addresses: Vec<(String, Value)> = r["value"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .filter(|a| a.contains(token) || a.contains(&escaped))
        .map(|a| {
            (
                "deleteAddress(java.lang.String,boolean)".to_string(),
                json!([a, true]),
            )
        })
        .collect();
    let _ = jmx.execs(node, &addresses).await;
    Ok(())
}
