//! A cluster's runtime: what the other controllers need of an ArtemisCluster between polls
//! (access, topology memory, write evidence), how a command gets the current topology, and how
//! a command's write evidence reaches the cluster's status (ADR-0049) — through the runtime and
//! the cluster's own reconcile, the only writer of that status.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::{Context, ReconcileError, key};
use crate::api::cluster::{ManagementWrite, ManagementWriteState, WriteEvidence};
use crate::broker::BrokerError;
use crate::topology::{self, ClusterAccess, Topology, TopologyMemory};

/// What the other controllers need of a cluster, kept between polls.
pub struct ClusterRuntime {
    pub access: ClusterAccess,
    /// Shared across runtimes of this cluster (like the write evidence): a poll racing a spec
    /// change still knows which node an endpoint that stopped answering was.
    pub memory: Arc<Mutex<TopologyMemory>>,
    /// Shared by every runtime of this cluster across spec changes, so a write reported while
    /// the cluster is re-polled is never lost.
    pub management_write: Arc<Mutex<ManagementWrite>>,
    /// Connections one close may close (ADR-0022).
    pub bulk_cap: u64,
    /// Messages one queue delete may destroy unless the object names more (issue 41).
    pub message_loss_cap: u64,
    /// ADR-0084 §2: what brings a removed declared divert back.
    pub declaration_mode: crate::api::cluster::DeclarationMode,
    pub poll_interval: Duration,
    pub request_timeout: Duration,
    /// One poll in flight per cluster (shared across runtimes of this cluster, like `memory`).
    pub poll_lock: Arc<Mutex<()>>,
    /// The spec generation this runtime was resolved from.
    pub generation: Option<i64>,
    /// The nodes that refused the divert watch (shared across runtimes, like `memory`).
    pub divert_watch_refusals: Arc<Mutex<WatchRefusals>>,
}

/// The nodes that refused the divert watch, and when (controllers/divert_watch.rs).
#[derive(Debug, Default)]
pub struct WatchRefusals(pub std::collections::HashMap<String, std::time::Instant>);

/// Every cluster's runtime, for the other controllers.
pub type ClusterRegistry = crate::topology::ByCluster<ClusterRuntime>;

/// Whether the Secrets a runtime's access was read from are still as they were, by the Secret
/// metadata the operator watches (a Secret it has not seen yet counts as unchanged: the command
/// gate reads it fresh anyway).
pub fn access_is_current(ctx: &Context, ns: &str, rt: &ClusterRuntime) -> bool {
    rt.access.secret_versions.iter().all(|(name, version)| {
        ctx.caches
            .secrets
            .get(ns, name)
            .is_none_or(|s| s.metadata.resource_version.as_deref() == Some(version.as_str()))
    })
}

/// The `management.xml` entry that grants a role every management operation on the broker.
pub fn grant_snippet(username: &str) -> String {
    format!(
        "<!-- management.xml, under <authorisation><role-access>: replace ROLE with a role of user '{username}' -->\n<match domain=\"org.apache.activemq.artemis\">\n  <access method=\"*\" roles=\"ROLE\"/>\n</match>"
    )
}

/// Every controller reports its broker writes here (ADR-0049): a success is evidence for
/// AVAILABLE, an authorization refusal for UNAVAILABLE; any other failure changes nothing.
pub async fn report_write(
    ctx: &Context,
    cluster_ns: &str,
    cluster_name: &str,
    command: &str,
    node: &str,
    result: Result<(), &BrokerError>,
) -> Result<(), ReconcileError> {
    let Some(rt) = ctx.clusters.get(&key(cluster_ns, cluster_name)) else {
        return Ok(());
    };
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let next = match result {
        Ok(()) => ManagementWrite {
            state: ManagementWriteState::Available,
            evidence: Some(WriteEvidence {
                at: now,
                command: command.into(),
                node: node.into(),
                message: "the broker accepted a management write".into(),
            }),
            grant: None,
        },
        Err(e) if e.is_authorization() => ManagementWrite {
            state: ManagementWriteState::Unavailable,
            evidence: Some(WriteEvidence {
                at: now,
                command: command.into(),
                node: node.into(),
                message: e.to_string(),
            }),
            grant: Some(grant_snippet(&rt.access.credentials.username)),
        },
        Err(_) => return Ok(()),
    };
    {
        let mut current = rt.management_write.lock().await;
        if current.state == next.state
            && next.state == ManagementWriteState::Available
            && current.evidence.is_some()
        {
            // Already AVAILABLE on evidence: no status write per command.
            return Ok(());
        }
        *current = next.clone();
    }
    // The cluster's own reconcile writes it to status (the only writer of the cluster's status).
    let _ = ctx
        .triggers
        .clusters
        .send(kube::runtime::reflector::ObjectRef::new(cluster_name).within(cluster_ns));
    Ok(())
}

/// Why a command cannot go to a cluster now.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "ArtemisCluster {0} is not usable yet: it does not exist in this namespace, or the operator could not reach it (see its Ready condition)"
)]
pub struct ClusterUnavailable(pub String);

/// The cluster's latest topology. Commands read the cached one; it is polled inline only when
/// older than the cluster's poll interval (or `max_age`, for a fresher read).
pub async fn current_topology(
    ctx: &Context,
    cluster_ns: &str,
    cluster_name: &str,
    max_age: Option<Duration>,
) -> Result<(Arc<ClusterRuntime>, Arc<Topology>), ClusterUnavailable> {
    let k = key(cluster_ns, cluster_name);
    let rt = ctx
        .clusters
        .get(&k)
        .ok_or_else(|| ClusterUnavailable(k.clone()))?;
    let max_age = max_age.unwrap_or(rt.poll_interval);
    if let Some(t) = ctx.topologies.get(&k).filter(|t| t.age() <= max_age) {
        return Ok((rt, t));
    }
    // One poll in flight per cluster: a concurrent caller waits and takes its result.
    let lock = rt.poll_lock.clone();
    let _in_flight = lock.lock().await;
    if let Some(t) = ctx.topologies.get(&k).filter(|t| t.age() <= max_age) {
        return Ok((rt, t));
    }
    tracing::debug!(cluster = %k, "poll inline");
    let polled = topology::poll(&rt.access, &rt.memory).await;
    // What this poll saw first concerns the dependents as much as when the cluster's own poll
    // sees it: announced here, or the next poll (diffing against this one) never would (a
    // message count that moved while a command polled inline left delete previews stale).
    let change = ctx
        .topologies
        .put_with(&k, |previous| {
            let change = topology::changes(previous, &polled);
            (polled.clone(), change)
        })
        .unwrap_or_default();
    if !change.is_empty() {
        super::dependents::trigger_dependents(ctx, cluster_ns, cluster_name, &change, None);
    }
    let t = ctx
        .topologies
        .get(&k)
        .ok_or_else(|| ClusterUnavailable(k.clone()))?;
    Ok((rt, t))
}
