//! One capture pass over one cluster (ADR-0062 D6): desired = the subscriptions, actual = our
//! objects per node; converge them. The same pass is the install, the crash recovery, the
//! failover repair and the new-queue path; its orphan sweep is the only thing that removes a
//! tap. Runs only while this process holds the cluster's advisory lock (see `super::worker`).

mod accounting;
mod drain_targets;
mod install;
mod judge;
mod report;
mod survey;
mod sweep;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use tokio::sync::Mutex;

pub use super::window::SourceMark;
pub use drain_targets::DrainTarget;
pub use survey::{ArmState, claimed_elsewhere};

use super::drain::{DrainHealth, DrainKey};
use crate::api::capture::{ArtemisCaptureSubscription, TapState};
use crate::api::capture_names::TapName;
use crate::api::{ArtemisCluster, RefusalKind};
use crate::controllers::pipeline::DereferenceError;
use crate::controllers::{Context, ReconcileError, command, key};
use crate::store::captured::QueueCounters;
use crate::store::{AuditIntent, StoreError};
use crate::topology::access::AccessProblem;
use crate::topology::{Topology, TopologyMemory};
use judge::Judged;
use survey::Survey;

/// Why a pass stopped before its end: what failed — reading the cluster, a command, Postgres,
/// or the Kubernetes API. The log and `capture_pass.result` say it as it displays; a
/// [`PassError::Store`] is also reported as an outage in status (`capture::outage`).
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The cluster's access (its Secrets, its endpoints) could not be resolved.
    #[error("cluster access: {}", .0.message)]
    Access(AccessProblem),
    /// The shared write gate refused: the Secrets, re-read right before a broker write, are
    /// missing or changed.
    #[error("cluster access: {0}")]
    Credentials(#[source] DereferenceError),
    /// An audited command could not be run or recorded (Postgres and the Kubernetes API are
    /// their own variants).
    #[error("{0}")]
    Command(#[source] ReconcileError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl From<ReconcileError> for PassError {
    fn from(e: ReconcileError) -> Self {
        match e {
            // Postgres stays Postgres: the worker reports an outage from it.
            ReconcileError::Store(e) => PassError::Store(e),
            ReconcileError::Kube(e) => PassError::Kube(e),
            other => PassError::Command(other),
        }
    }
}

/// What a process keeps per cluster it serves.
#[derive(Default)]
pub struct ClusterState {
    pub memory: Arc<Mutex<TopologyMemory>>,
    /// (Jolokia endpoint, over TLS) → `amqp[s]://host:port` of its broker's AMQP acceptor
    /// (read once).
    pub amqp: Mutex<BTreeMap<(String, bool), String>>,
    /// Node ID → why its taps have no drain (no acceptor the cluster's transport may use): what
    /// their status says instead of "no drain runs".
    pub no_drain: Mutex<BTreeMap<String, String>>,
    /// The drains of this cluster (they run only while its lock is held).
    pub drains: Mutex<BTreeMap<DrainKey, super::drain::DrainHandle>>,
    /// The last counters of each capture queue (node, queue), as saved in Postgres: a pass
    /// writes only what changed, so an idle tap costs one bulk read per node and no writes.
    pub counters: Mutex<BTreeMap<(String, String), QueueCounters>>,
    /// Per (node, source address): the source's RoutedMessageCount when the capture queue was
    /// last seen there — the baseline of a failover-window estimate.
    pub source_marks: Mutex<BTreeMap<(String, String), SourceMark>>,
    /// Mode Sample: the latest topology, when each subscription was sampled, browse outcomes.
    pub sample: Mutex<super::sample::SampleState>,
    /// Per (node, tap): the last read of the tap's source and capture sides (`reconcile`).
    pub sides: Mutex<BTreeMap<(String, TapName), super::reconcile::Sides>>,
    /// When a pass last wrote to a broker: the next pass judges from a topology polled after it.
    pub wrote_at: Mutex<Option<std::time::Instant>>,
    /// The subscriptions the last pass judged: a pass over others judges from a topology
    /// polled for it.
    pub judged_subs: Mutex<Vec<JudgedSub>>,
}

/// A subscription as a pass judged it: what asks for a pass (spec, annotations, deletion).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct JudgedSub {
    name: String,
    generation: Option<i64>,
    deleting: bool,
    annotations: BTreeMap<String, String>,
}

/// A pass's time budget (issue 42): twice the pass interval, at least 30 s. Status is written
/// at the end of every pass, so it is never older than a budget and an interval.
pub fn budget(pass_interval: Duration) -> Duration {
    (pass_interval * 2).max(Duration::from_secs(30))
}

/// The part of a pass's budget in which it starts installs and removals; what is left of them
/// then waits for the next pass, and the rest of the budget is for the writes in flight, the
/// loss counters, the drains and status.
fn write_window(budget: Duration) -> Duration {
    budget / 2
}

/// Whether a tap's install or removal may start now, or must wait for the next pass.
fn may_start(until: std::time::Instant) -> bool {
    std::time::Instant::now() < until
}

/// What one pass did.
#[derive(Default)]
pub struct PassSummary {
    /// Audited broker commands (install and remove).
    pub commands: i32,
    /// Taps whose install or removal was left for the next pass (the budget's time for writes
    /// was spent).
    pub deferred: i32,
    /// The drains that should run now: one per installed capture queue per live node.
    pub drains: Vec<DrainTarget>,
    /// What the pass judged, for [`report`] once those drains run.
    pub judgement: Option<Judgement>,
}

/// What a pass judged, written to the subscriptions' status by [`report`] once the drains it
/// wants run: a tap found installed is judged by its drain then, not a moment before its drain
/// could connect (issue 26: a restarted process, or one that took the cluster over, reported
/// every tap DEGRADED for one pass).
pub struct Judgement {
    cluster_key: String,
    seen: Survey,
    found: BTreeMap<(TapName, String), Found>,
    /// (tap, node) found installed: HEALTHY or DEGRADED by their drain, at report time.
    installed: Vec<(TapName, String)>,
    /// The paused subscriptions whose installs or removals the pass held.
    held: BTreeSet<String>,
}

/// The longest a report waits for the drains its pass started to connect (or fail).
const DRAIN_SETTLE: Duration = Duration::from_secs(5);

/// Write the subscriptions' status from a pass's judgement; `started`: the drains started for
/// it, each judged once it connected or failed (at most [`DRAIN_SETTLE`]).
pub async fn report(
    ctx: &Context,
    state: &ClusterState,
    subs: &[Arc<ArtemisCaptureSubscription>],
    j: Judgement,
    drains: &DrainView<'_>,
    started: &[DrainKey],
) -> Result<(), PassError> {
    let deadline = std::time::Instant::now() + DRAIN_SETTLE;
    while started.iter().any(|k| !drains.health.settled(k)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut found = j.found;
    for (name, node) in &j.installed {
        let key = DrainKey {
            cluster: j.cluster_key.clone(),
            node: node.clone(),
            capture_queue: name.capture_queue(),
        };
        use super::drain::NotDraining;
        let why = match drains.health.draining(&key, drains.within) {
            Ok(()) => None,
            Err(NotDraining::NotRunning) => Some(
                state
                    .no_drain
                    .lock()
                    .await
                    .get(node)
                    .cloned()
                    .unwrap_or_else(|| NotDraining::NotRunning.to_string()),
            ),
            Err(e) => Some(e.to_string()),
        };
        let found_now = judge::found_installed(why);
        found.insert((name.clone(), node.clone()), found_now);
    }
    report::write_statuses(ctx, state, &j.cluster_key, subs, &j.seen, &found, &j.held).await
}

/// What the pass knows of this process's drains.
pub struct DrainView<'a> {
    pub health: &'a DrainHealth,
    /// A drain silent longer than this is not draining.
    pub within: Duration,
}

/// What the pass found for one tap on one node, for status.
#[derive(Clone, Debug)]
struct Found {
    state: TapState,
    refusal: Option<RefusalKind>,
    message: String,
}

/// Run one pass over `cluster` with the subscriptions that name it.
pub async fn run(
    ctx: &Context,
    state: &ClusterState,
    cluster: &ArtemisCluster,
    subs: &[Arc<ArtemisCaptureSubscription>],
    holder: &str,
    drains: &DrainView<'_>,
    elsewhere: &BTreeMap<String, String>,
) -> Result<PassSummary, PassError> {
    let budget = budget(ctx.capture_pass_interval);
    let writes_until = std::time::Instant::now() + write_window(budget);
    let ns = cluster.namespace().unwrap_or_default();
    let cluster_key = key(&ns, &cluster.name_any());
    let instance = ctx.instance_id.as_str();
    let mut summary = PassSummary::default();
    let seen = survey::survey(ctx, state, cluster, subs, &cluster_key, elsewhere).await?;
    let mut judged = Judged::default();
    for node in &seen.topology.nodes {
        judge::judge_node(&seen, node, instance, &cluster_key, drains, &mut judged).await;
    }
    let subs_by_name: BTreeMap<String, &Arc<ArtemisCaptureSubscription>> =
        subs.iter().map(|s| (s.name_any(), s)).collect();
    judge::record_unrecorded(ctx, &cluster_key, instance, &seen, &subs_by_name, &judged).await?;
    let scope = PassScope {
        ctx,
        cluster_key: &cluster_key,
        ns: &ns,
        holder,
        topology: &seen.topology,
        timeout: seen.access.request_timeout,
        arms: &seen.arms,
        writes_until,
        budget,
    };
    let divert_missing = judge::divert_missing(&judged.installs);
    let held = judge::hold_paused(&mut judged, subs);
    // Issue 42: status is true while the pass runs (the taps about to be installed say so).
    report::write_before_installs(ctx, state, &cluster_key, subs, (&seen, &judged), &held).await;
    // Before a capture queue is re-created under an existing divert: the window opens.
    let windows = super::window::open(&state.source_marks, &seen.topology, &judged.installs).await;
    let writes = !(judged.installs.is_empty() && judged.sweeps.is_empty());
    if seen.from_runtime && writes {
        // The shared write gate: the Secrets re-read right before a broker write.
        let used = &seen.topology.secret_versions;
        crate::controllers::pipeline::ensure_credentials(ctx, &ns, &cluster.name_any(), used)
            .await
            .map_err(PassError::Credentials)?;
    }
    let installed = install::install_all(&scope, &seen, &subs_by_name, &mut judged).await;
    let sweeps = std::mem::take(&mut judged.sweeps);
    let swept = match &installed {
        Ok(_) => sweep::sweep_all(&scope, state, sweeps, &subs_by_name, elsewhere).await,
        Err(_) => Ok((0, 0)),
    };
    if writes {
        // Done or not, the next pass judges from a topology polled after these writes.
        *state.wrote_at.lock().await = Some(std::time::Instant::now());
    }
    let ((installed, deferred_installs), (swept, deferred_sweeps)) = (installed?, swept?);
    (summary.commands, summary.deferred) = (installed + swept, deferred_installs + deferred_sweeps);
    // Loss counters of every capture queue that existed, and the drains that should run.
    let judgement = (&seen, &judged);
    accounting::count_loss(ctx, state, &cluster_key, judgement, &divert_missing, windows).await;
    let drain_targets = (judged.drain_targets.as_slice(), &judged.fresh_queues);
    summary.drains =
        drain_targets::drains_to_run(state, &cluster_key, &seen, &subs_by_name, drain_targets).await;
    // Mode Sample: browse what is due, on this pass's fresh topology.
    super::sample::sample_due(ctx, &state.sample, &cluster_key, subs).await;
    summary.judgement = Some(Judgement {
        cluster_key,
        seen,
        found: judged.found,
        installed: judged.installed,
        held,
    });
    Ok(summary)
}

/// Where a pass's commands go, and who sends them.
struct PassScope<'a> {
    ctx: &'a Context,
    cluster_key: &'a str,
    ns: &'a str,
    holder: &'a str,
    topology: &'a Topology,
    timeout: Duration,
    /// How each subscription was armed: its installs' audit rows say so.
    arms: &'a BTreeMap<String, ArmState>,
    /// No install or removal starts after this (the pass's budget, `write_window`).
    writes_until: std::time::Instant,
    budget: Duration,
}

fn intent(
    p: &PassScope<'_>,
    command: &str,
    sub: Option<&Arc<ArtemisCaptureSubscription>>,
    tap: &TapName,
    params: serde_json::Value,
) -> AuditIntent {
    AuditIntent {
        instance_id: p.ctx.instance_id.clone(),
        actor: format!("capture-reconciler ({})", p.holder),
        command: command.into(),
        cluster: p.cluster_key.into(),
        target: format!("capture tap {}", tap.capture_queue()),
        object_kind: "ArtemisCaptureSubscription".into(),
        object_namespace: p.ns.into(),
        object_name: tap.subscription.clone(),
        object_uid: sub.and_then(|s| s.metadata.uid.clone()).unwrap_or_default(),
        object_generation: sub.and_then(|s| s.metadata.generation),
        params,
    }
}

/// A capture command tells its subscription of a failure (none for an orphan's sweep; a success
/// is in the subscription's status and the audit log), and is no evidence
/// of the management user's authority over queues (ADR-0049).
fn told(sub: Option<&Arc<ArtemisCaptureSubscription>>) -> command::Told<'_, ArtemisCaptureSubscription> {
    command::Told {
        on: sub.map(|s| s.as_ref()),
        success_event: command::SuccessEvent::Never,
        evidence_for: None,
    }
}

#[cfg(test)]
mod budget_tests {
    use super::{budget, may_start, write_window};
    use std::time::{Duration, Instant};

    #[test]
    fn a_pass_has_twice_its_interval_at_least_30_s_and_starts_writes_in_the_first_half() {
        assert_eq!(budget(Duration::from_secs(30)), Duration::from_secs(60));
        assert_eq!(budget(Duration::from_secs(2)), Duration::from_secs(30));
        assert_eq!(write_window(Duration::from_secs(60)), Duration::from_secs(30));
        assert!(may_start(Instant::now() + Duration::from_secs(1)));
        assert!(!may_start(Instant::now()));
    }
}
