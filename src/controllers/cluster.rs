//! ArtemisCluster: resolve access (credentials, CA, endpoints), poll the topology, publish it
//! to the other controllers, and keep status — logical nodes, conditions, managementWrite.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tokio::sync::Mutex;

use super::runtime::{ClusterRuntime, access_is_current};
use super::{Context, ReconcileError, conditions, key};
use crate::api::RefusalKind;
use crate::api::cluster::{ArtemisCluster, ArtemisClusterStatus, EndpointProblem, LogicalNodeStatus};
use crate::broker::BrokerError;
pub use crate::topology::access::{AccessProblem, resolve_access, secret_names};
use crate::topology::{self, ClusterAccess, Topology, TopologyMemory};

/// Why an endpoint failed, with the fix, for the Degraded/Ready messages.
fn explain_endpoint(url: &str, e: &BrokerError) -> String {
    match e {
        BrokerError::Unreachable(m) => format!(
            "{url} is unreachable ({m}): check the URL in spec.brokers and that the broker's web server listens there"
        ),
        BrokerError::Timeout(s) => format!(
            "{url} did not answer within {s}s: the broker may be overloaded or frozen; raise spec.requestTimeoutSeconds if it is just slow"
        ),
        BrokerError::NotAnswering(n) => format!(
            "{url} is not answering ({}): the broker may be frozen, in a long pause, or overloaded; nothing is sent to it (its objects are SKIPPED_NOT_LIVE) and each poll probes it once, until it answers",
            n.evidence()
        ),
        other => format!("{url}: {other}"),
    }
}

fn node_statuses(t: &Topology) -> Vec<LogicalNodeStatus> {
    t.nodes
        .iter()
        .map(|n| LogicalNodeStatus {
            node_id: n.node_id.clone(),
            active_endpoint: n.active_endpoint().map(str::to_string),
            standby_endpoints: n.standby.clone(),
            role: n.role().into(),
            live: n.is_live(),
            inventory_stale: n
                .inventory_error
                .as_ref()
                .filter(|_| n.inventory.is_some())
                .map(|e| {
                    format!("the last poll could not read the inventory ({e}); the one read before stands")
                }),
        })
        .collect()
}

async fn reconcile(obj: Arc<ArtemisCluster>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ns = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let k = key(&ns, &name);
    let generation = obj.metadata.generation;
    let old = obj.status.clone().unwrap_or_default();
    let poll_interval = Duration::from_secs(obj.spec.poll_interval_seconds.max(1).into());
    if let Some(rt) = recently_polled(&ctx, &ns, &k, generation, poll_interval) {
        let away = ctx.topologies.get(&k).map(|t| away(&t)).unwrap_or_default();
        if away.is_empty() || !topology::any_back(&rt.access, &rt.memory, &away).await {
            report_write_evidence(&ctx, &obj, &old, &rt).await?;
            let age = ctx.topologies.get(&k).map(|t| t.age()).unwrap_or_default();
            let next = next_look(&away, poll_interval.saturating_sub(age));
            return Ok(Action::requeue(next));
        }
        tracing::info!(cluster = %k, ?away, "an endpoint away at the last poll answers: polled now");
    }
    let mut status = ArtemisClusterStatus {
        observed_generation: generation,
        conditions: old.conditions.clone(),
        last_poll_time: old.last_poll_time.clone(),
        trust: Some(crate::topology::access::trust_statement(&obj.spec)),
        // Only when sharded: with one leader there is nothing to say, and an upgrade in place
        // writes no status.
        held_by: ctx
            .holdings
            .is_sharded()
            .then(|| ctx.holdings.replica().to_string()),
        ..Default::default()
    };
    match resolve_access(&ctx.client, &ns, &obj.spec, &ctx.broker).await {
        Err(problem) => {
            forget_access(&ctx, &ns, &name);
            status.management_write = old.management_write.clone();
            let judged = |ok| (ok, problem.reason, problem.message.clone());
            set_ready_and_degraded(&mut status, judged(false), judged(true));
        }
        Ok(access) => {
            let rt = runtime_for(&ctx, &obj, access, &old, poll_interval);
            let management_write = rt.management_write.clone();
            let (refusals, timeout) = (rt.divert_watch_refusals.clone(), rt.request_timeout);
            let (topology, returned) = poll_and_publish(&ctx, &ns, &name, rt).await;
            // Issue 45: a node without the divert watch gets it (its deletes read less).
            let watched = super::divert_watch::ensure(&ctx, &obj, &topology, &refusals, timeout);
            if let Err(e) = watched.await {
                tracing::warn!(cluster = %k, error = %e, "the divert watch could not be created");
            }
            describe_topology(&mut status, &topology);
            announce_return(&ctx, &obj, &returned);
            // Read after the poll: a write reported meanwhile is included.
            status.management_write = management_write.lock().await.clone();
        }
    }
    conditions::kstatus(&mut status.conditions, &[], status.observed_generation);
    // Status is written only when something a user acts on changed (lastPollTime alone is not:
    // no API write per poll; the poll metrics show the cadence).
    if status_changed(&old, &status) {
        super::report::patch_whole_status(&ctx.client, obj.as_ref(), &status).await?;
    }
    let away = ctx.topologies.get(&k).map(|t| away(&t)).unwrap_or_default();
    Ok(Action::requeue(next_look(&away, poll_interval)))
}

/// How often, between polls, endpoints that were away are looked at for their return.
pub const RETURN_PROBE: Duration = Duration::from_secs(2);

/// The endpoints that did not answer the last poll.
fn away(t: &Topology) -> Vec<String> {
    t.unreachable.iter().map(|(url, _)| url.clone()).collect()
}

/// The next pass: the next poll, or sooner while an endpoint is away (a look for its return).
fn next_look(away: &[String], until_poll: Duration) -> Duration {
    if away.is_empty() {
        until_poll
    } else {
        until_poll.min(RETURN_PROBE)
    }
}

/// A pass caused by this controller's own status write (or any other change that is not the
/// spec or its Secrets) does not poll again before half the interval: one poll per interval per
/// cluster. The runtime, when this pass is such a one.
fn recently_polled(
    ctx: &Context,
    ns: &str,
    k: &str,
    generation: Option<i64>,
    poll_interval: Duration,
) -> Option<Arc<ClusterRuntime>> {
    let (rt, t) = (ctx.clusters.get(k)?, ctx.topologies.get(k)?);
    (rt.generation == generation && t.age() < poll_interval / 2 && access_is_current(ctx, ns, &rt))
        .then_some(rt)
}

/// Write evidence a command reported since the last status write (`report_write`).
async fn report_write_evidence(
    ctx: &Context,
    obj: &ArtemisCluster,
    old: &ArtemisClusterStatus,
    rt: &ClusterRuntime,
) -> Result<(), ReconcileError> {
    let evidence = rt.management_write.lock().await.clone();
    if evidence != old.management_write {
        let status = ArtemisClusterStatus {
            management_write: evidence,
            ..old.clone()
        };
        super::report::patch_whole_status(&ctx.client, obj, &status).await?;
    }
    Ok(())
}

/// Access could not be resolved: no command uses the old one, and every dependent says so now
/// (ClusterNotReady) rather than at its resync.
fn forget_access(ctx: &Context, ns: &str, name: &str) {
    let k = key(ns, name);
    ctx.clusters.remove(&k);
    if ctx.topologies.get(&k).is_some() {
        ctx.topologies.remove(&k);
        let everything = topology::TopologyChange::everything();
        super::dependents::trigger_dependents(ctx, ns, name, &everything, None);
    }
}

use conditions::Judged;

/// Ready and Degraded, at the status's generation.
fn set_ready_and_degraded(status: &mut ArtemisClusterStatus, ready: Judged<'_>, degraded: Judged<'_>) {
    let judged = [(conditions::READY, ready), (conditions::DEGRADED, degraded)];
    conditions::set_all(&mut status.conditions, status.observed_generation, judged);
}

/// The runtime for freshly resolved access, keeping the topology memory, the poll lock and
/// the write evidence of the one before it across spec changes.
fn runtime_for(
    ctx: &Context,
    obj: &ArtemisCluster,
    access: ClusterAccess,
    old: &ArtemisClusterStatus,
    poll_interval: Duration,
) -> ClusterRuntime {
    let previous = ctx
        .clusters
        .get(&key(&obj.namespace().unwrap_or_default(), &obj.name_any()));
    let (memory, poll_lock, management_write, divert_watch_refusals) = match &previous {
        Some(p) => (
            p.memory.clone(),
            p.poll_lock.clone(),
            p.management_write.clone(),
            p.divert_watch_refusals.clone(),
        ),
        None => (
            Arc::new(Mutex::new(TopologyMemory::default())),
            Arc::new(Mutex::new(())),
            Arc::new(Mutex::new(old.management_write.clone())),
            Arc::default(),
        ),
    };
    ClusterRuntime {
        access,
        memory,
        management_write,
        bulk_cap: obj.spec.bulk_cap,
        message_loss_cap: obj.spec.message_loss_cap,
        declaration_mode: obj.spec.declaration_mode,
        poll_interval,
        request_timeout: Duration::from_secs(obj.spec.request_timeout_seconds.into()),
        poll_lock,
        generation: obj.metadata.generation,
        divert_watch_refusals,
    }
}

/// Poll with the new access first, then publish both: a command never sees the new access with
/// a topology polled under the old one (e.g. other credentials). Dependents are triggered by
/// what changed, never by a timer: a node that went live or down concerns every object, a
/// changed broker object only the objects naming it. A node that came back — live again, or
/// judged not answering and answering again since the last poll (a silence between two polls
/// leaves no trace in either) — gets everything it missed now: every dependent is retried at
/// once, its backoff for failures while the node was away forgotten. Returns the topology as
/// polled.
async fn poll_and_publish(ctx: &Context, ns: &str, name: &str, rt: ClusterRuntime) -> (Topology, Returned) {
    let k = key(ns, name);
    let previous = ctx.clusters.get(&k);
    let respecified = previous.as_ref().is_none_or(|p| p.generation != rt.generation);
    // New credentials or trust roots: every dependent is looked at now, and a node that failed
    // under the old ones is retried at once instead of after its backoff.
    let reauthorised = previous
        .as_ref()
        .is_some_and(|p| p.access.secret_versions != rt.access.secret_versions);
    tracing::debug!(cluster = %k, "poll by the cluster controller");
    let polling = rt.poll_lock.clone();
    let poll_interval = rt.poll_interval;
    let in_flight = polling.lock().await;
    let started = std::time::Instant::now();
    // Issue 45: nodes whose counts match the last snapshot are not read in full (a new spec or
    // new credentials read everything).
    let baseline = ctx.topologies.get(&k).filter(|_| !respecified && !reauthorised);
    let topology = topology::poll_since(&rt.access, &rt.memory, baseline.as_deref()).await;
    let silenced = rt.memory.lock().await.silenced_since_last_look(&rt.access);
    record_poll_metrics(ctx, &k, &topology, started);
    // Inventories are shared (Arc): the copy kept for status costs the node list only.
    let polled = topology.clone();
    // Fresh reads made while the poll ran are newer than it: carried over, not lost. A node that
    // came back is published live only once what it missed is on it (catch_up.rs).
    let (mut change, returned, merged) = ctx
        .topologies
        .put_with(&k, |previous| {
            let merged = polled
                .carrying_reads(previous, started)
                .keeping_stale_inventories(previous);
            let change = topology::changes(previous, &merged);
            let returned = with_silenced(topology::returned(previous, &merged), &silenced, &merged);
            let published = merged.catching_up(&returned);
            (published, (change, returned, Some(merged)))
        })
        .unwrap_or_default();
    let came_back = !returned.is_empty();
    change.everything |= respecified || reauthorised || came_back;
    ctx.clusters.put(&k, rt);
    let mut caught_up = super::catch_up::Summary::default();
    if let Some(merged) = merged.filter(|_| came_back) {
        caught_up = super::catch_up::catch_up_returned(ctx, ns, name, merged, &returned).await;
        tracing::info!(cluster = %k, ?returned, ?caught_up, "a node came back: what it missed was sent in bulk; every dependent is retried now");
    }
    drop(in_flight);
    if reauthorised || came_back {
        super::dependents::retry_dependents_now(ctx, ns, name, &caught_up.lacking);
    } else if !change.is_empty() {
        super::dependents::trigger_dependents(ctx, ns, name, &change, None);
    }
    if !caught_up.lacking.is_empty() {
        // Objects the node still lacks (a failed or untaken catch-up) report on it before the
        // cluster's status says it is live: no object reads Ready over a live node without it.
        let bound = poll_interval.max(Duration::from_secs(5));
        super::catch_up::passes_reported::<crate::api::ArtemisQueue>(
            ctx,
            &caught_up.lacking,
            &returned,
            bound,
        )
        .await;
    }
    (
        topology,
        Returned {
            nodes: returned,
            caught_up,
        },
    )
}

/// Nodes that came back at a poll, and what was sent to them in bulk.
#[derive(Default)]
struct Returned {
    nodes: Vec<String>,
    caught_up: super::catch_up::Summary,
}

/// The nodes that came back: live again at this poll, or behind an endpoint judged not
/// answering since the last one and live now.
fn with_silenced(mut returned: Vec<String>, silenced: &[String], topology: &Topology) -> Vec<String> {
    for n in topology.live_nodes() {
        let was_silent = n
            .active_endpoint()
            .is_some_and(|e| silenced.iter().any(|s| s == e));
        if was_silent && !returned.contains(&n.node_id) {
            returned.push(n.node_id.clone());
        }
    }
    returned
}

/// One Event on the ArtemisCluster per return that sent something: which nodes, how many
/// objects, and where their audit rows are (each object's own status reports its command).
fn announce_return(ctx: &Context, obj: &ArtemisCluster, returned: &Returned) {
    let s = &returned.caught_up;
    let Some((first, last)) = s.audit_ids else {
        return;
    };
    let note = format!(
        "node(s) {} came back: {} queue(s) they missed were sent in bulk ({} failed; audit #{first}–#{last}); each object's status reports its own",
        returned.nodes.join(", "),
        s.objects,
        s.failed
    );
    ctx.event(obj, s.failed > 0, "NodeCaughtUp", "queue.apply", note);
}

fn record_poll_metrics(ctx: &Context, k: &str, topology: &Topology, started: std::time::Instant) {
    let labels = crate::telemetry::ClusterLabels {
        cluster: k.to_string(),
    };
    ctx.metrics
        .poll_seconds
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    let objects: usize = topology
        .nodes
        .iter()
        .filter_map(|n| n.inventory.as_ref())
        .map(|i| i.queues.len() + i.addresses.len() + i.diverts.len())
        .sum();
    ctx.metrics
        .inventory_objects
        .get_or_create(&labels)
        .set(objects as i64);
}

/// Nodes, endpoints, Ready and Degraded, and the poll time, from one poll.
fn describe_topology(status: &mut ArtemisClusterStatus, topology: &Topology) {
    status.nodes = node_statuses(topology);
    status.total_nodes = topology.nodes.len() as u32;
    status.live_nodes = topology.live_nodes().count() as u32;
    status.unreachable_endpoints = topology
        .unreachable
        .iter()
        .map(|(url, e)| EndpointProblem {
            endpoint: url.clone(),
            message: explain_endpoint(url, e),
        })
        .collect();
    let ready = readiness(status, topology);
    let degraded = if status.unreachable_endpoints.is_empty() {
        (
            false,
            "AllEndpointsAnswer",
            "every endpoint answered the last poll".to_string(),
        )
    } else {
        let names: Vec<&str> = status
            .unreachable_endpoints
            .iter()
            .map(|p| p.message.as_str())
            .collect();
        (true, "EndpointsUnreachable", names.join("; "))
    };
    set_ready_and_degraded(status, ready, degraded);
    status.last_poll_time = Some(
        topology
            .polled_at_utc
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    );
}

/// Ready: a live node, or why there is none, naming the fix.
fn readiness(status: &ArtemisClusterStatus, topology: &Topology) -> (bool, &'static str, String) {
    if status.live_nodes > 0 {
        let message = format!(
            "{} of {} logical nodes live",
            status.live_nodes, status.total_nodes
        );
        return (true, "NodesLive", message);
    }
    let refused = |kind| {
        topology
            .unreachable
            .iter()
            .find(|(_, e)| e.refusal_kind() == kind)
    };
    let auth_refused = refused(RefusalKind::OriginRefused).or_else(|| refused(RefusalKind::NotAuthorized));
    let (reason, message) = match (auth_refused, topology.unreachable.first()) {
        (Some((url, e)), _) if e.refusal_kind() == RefusalKind::OriginRefused => {
            ("OriginRefused", explain_endpoint(url, e))
        }
        (Some((url, e)), _) => ("CredentialsRefused", explain_endpoint(url, e)),
        (None, Some((url, e))) if e.refusal_kind() == RefusalKind::BadResponse => {
            ("NotJolokia", explain_endpoint(url, e))
        }
        (None, Some((url, e))) => ("Unreachable", explain_endpoint(url, e)),
        (None, None) => (
            "NoLiveNode",
            "every endpoint answered but none is active".to_string(),
        ),
    };
    (false, reason, message)
}

/// Anything a user acts on differs (the poll time and condition transition times aside).
fn status_changed(old: &ArtemisClusterStatus, new: &ArtemisClusterStatus) -> bool {
    let (mut a, mut b) = (old.clone(), new.clone());
    a.last_poll_time = None;
    b.last_poll_time = None;
    // `trust` follows from the spec alone: a status written before it existed (an upgrade) is
    // not rewritten for it; it appears with the next write that something else causes.
    if a.trust.is_none() {
        b.trust = None;
    }
    let same_conditions = conditions::comparable(&a.conditions) == conditions::comparable(&b.conditions);
    a.conditions.clear();
    b.conditions.clear();
    a != b || !same_conditions
}

fn error_policy(_obj: Arc<ArtemisCluster>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "ArtemisCluster reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

pub async fn run(ctx: Arc<Context>, wiring: super::Wiring<ArtemisCluster>) {
    super::run_controller(wiring, ctx, reconcile, error_policy).await;
}

#[cfg(test)]
mod status_tests {
    use super::*;
    use crate::api::cluster::{ManagementWrite, ManagementWriteState};

    #[test]
    fn a_poll_that_changes_only_its_time_writes_nothing_and_write_evidence_does() {
        let old = ArtemisClusterStatus {
            last_poll_time: Some("2026-12-01T10:00:00Z".into()),
            live_nodes: 3,
            ..Default::default()
        };
        let polled = ArtemisClusterStatus {
            last_poll_time: Some("2026-12-01T10:00:10Z".into()),
            ..old.clone()
        };
        assert!(!status_changed(&old, &polled));
        let evidence = ArtemisClusterStatus {
            management_write: ManagementWrite {
                state: ManagementWriteState::Available,
                ..Default::default()
            },
            ..polled
        };
        assert!(status_changed(&old, &evidence));
    }

    /// An upgrade writes no status (tests/integration/upgrade.rs): a status from before
    /// `trust` existed is not rewritten for it; once written, a changed statement is.
    #[test]
    fn the_trust_statement_alone_never_rewrites_a_status_written_before_it_existed() {
        let old = ArtemisClusterStatus {
            live_nodes: 3,
            ..Default::default()
        };
        let with = |t: &str| ArtemisClusterStatus {
            trust: Some(t.into()),
            ..old.clone()
        };
        assert!(!status_changed(&old, &with("Jolokia: plain http")));
        assert!(status_changed(
            &with("Jolokia: plain http"),
            &with("Jolokia: TLS")
        ));
        assert!(!status_changed(&with("Jolokia: TLS"), &with("Jolokia: TLS")));
    }
}
