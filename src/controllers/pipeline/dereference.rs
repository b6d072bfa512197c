//! dereference: what a pass needs before it plans, read from caches and the cluster's snapshot —
//! the ArtemisCluster (no broker write without it), its credentials Secret (read again right
//! before a command), a live node, the facts plans need besides a node's inventory — and the
//! gate (`dryRun`, paused) that says whether the pass may write at all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::{Resource, ResourceExt};

use super::claims::same_brokers;
use super::{PlanFacts, TopologyObject};
use crate::api::{ArtemisCluster, ArtemisQueue, ClusterRef};
use crate::controllers::runtime::ClusterRuntime;
use crate::controllers::shared_read::Asked;
use crate::controllers::{Context, conditions, is_paused, key};
use crate::topology::access::AccessProblem;
use crate::topology::{Topology, TopologyChange};

/// Why an object cannot reach its cluster now.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DereferenceError {
    #[error(
        "ArtemisCluster {0} does not exist: create it (and its credentials Secret), or point spec.clusterRef at an existing one"
    )]
    ClusterNotFound(String),
    #[error("ArtemisCluster {0} is not reachable yet: {1}")]
    ClusterNotReady(String, String),
    /// This process has not polled the cluster yet, and its status (from an earlier process)
    /// says it was Ready: nothing is known that would change the object's status.
    #[error("ArtemisCluster {0} has not been polled by this operator process yet")]
    NotYetPolled(String),
    #[error("ArtemisCluster {0}: {1}")]
    CredentialsMissing(String, String),
    #[error("ArtemisCluster {0}: {1}")]
    CredentialsChanged(String, String),
    #[error("ArtemisCluster {0}: {1}")]
    CredentialsRefused(String, String),
    #[error("ArtemisCluster {0}: {1}")]
    OriginRefused(String, String),
}

impl DereferenceError {
    pub fn reason(&self) -> &'static str {
        match self {
            DereferenceError::ClusterNotFound(_) => "ClusterNotFound",
            DereferenceError::ClusterNotReady(..) | DereferenceError::NotYetPolled(_) => "ClusterNotReady",
            DereferenceError::CredentialsMissing(..) => "CredentialsMissing",
            DereferenceError::CredentialsChanged(..) => "CredentialsChanged",
            DereferenceError::CredentialsRefused(..) => "CredentialsRefused",
            DereferenceError::OriginRefused(..) => "OriginRefused",
        }
    }
}

/// What a reconcile needs, read from caches and the cluster's snapshot.
pub struct Dereferenced {
    pub cluster_key: String,
    pub rt: Arc<ClusterRuntime>,
    pub topology: Arc<Topology>,
    pub facts: PlanFacts,
}

/// How a pass may act on the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Write,
    DryRun,
    Paused,
}

impl Gate {
    pub(in crate::controllers) fn of<K: TopologyObject>(obj: &K) -> Gate {
        if obj.dry_run() {
            Gate::DryRun
        } else if is_paused(obj.meta()) {
            Gate::Paused
        } else {
            Gate::Write
        }
    }

    /// The reason Ready gives when this gate held a change back.
    pub(super) fn held(self) -> Option<conditions::Held> {
        match self {
            Gate::DryRun => Some(conditions::Held::DryRun),
            Gate::Paused => Some(conditions::Held::Paused),
            Gate::Write => None,
        }
    }
}

/// The ArtemisCluster the object names must exist in the cache; its runtime must be resolved.
/// A cluster object that is gone also drops its runtime: nothing keeps writing with cached
/// credentials.
pub fn dereference_cluster(
    ctx: &Context,
    ns: &str,
    cluster: &ClusterRef,
) -> Result<Arc<ClusterRuntime>, DereferenceError> {
    let k = key(ns, &cluster.name);
    let exists = ctx
        .caches
        .clusters
        .get(ns, &cluster.name)
        .is_some_and(|c| c.meta().deletion_timestamp.is_none());
    if !exists {
        ctx.clusters.remove(&k);
        ctx.topologies.remove(&k);
        return Err(DereferenceError::ClusterNotFound(k));
    }
    ctx.clusters.get(&k).ok_or_else(|| {
        if ctx.topologies.get(&k).is_none() && cluster_was_ready(ctx, ns, &cluster.name) {
            return DereferenceError::NotYetPolled(k.clone());
        }
        let why = ctx
            .caches
            .clusters
            .get(ns, &cluster.name)
            .and_then(|c| {
                c.status.as_ref().and_then(|s| {
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == conditions::READY)
                        .map(|c| format!("{} ({})", c.message, c.reason))
                })
            })
            .unwrap_or_else(|| "it has not been polled yet".into());
        DereferenceError::ClusterNotReady(k.clone(), why)
    })
}

/// The cluster object's status says Ready (as the last process that polled it found it).
fn cluster_was_ready(ctx: &Context, ns: &str, cluster: &str) -> bool {
    ctx.caches.clusters.get(ns, cluster).is_some_and(|c| {
        c.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == conditions::READY && c.status == "True")
        })
    })
}

/// Read the cluster's Secrets right before a command: a Secret deleted since the cluster was
/// polled stops every write (its cached copy is never used on its own), and a Secret changed
/// since (rotated or revoked credentials, another CA) stops this command and every other one on
/// the old access: the runtime is dropped and the cluster re-polled with what the Secret holds
/// now, which then triggers its dependents.
///
/// `used` is what the command writes with: the Secrets' versions of the snapshot whose clients
/// send it (`Topology::secret_versions`). Compared with those, never with the runtime now
/// published — a runtime re-polled with new credentials after the pass took its snapshot would
/// otherwise let the snapshot's old credentials through.
pub async fn ensure_credentials(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    used: &BTreeMap<String, String>,
) -> Result<(), DereferenceError> {
    ensure_credentials_asked(ctx, ns, cluster, used, None).await
}

/// A pass's ask for its cluster's Secrets, taken when the pass began (issue 45): the read that
/// answers it may go alongside the pass's other work (a create's finalizer patch), begun after
/// the pass was; [`ensure_credentials_asked`] still ends before any broker write.
#[derive(Clone, Debug)]
pub struct CredentialsAsk {
    slot: String,
    asked: Asked,
}

/// The slot of a cluster's Secret reads: by the spec generation it reads by (the Secrets'
/// names and keys).
fn secrets_slot(ns: &str, c: &ArtemisCluster) -> String {
    format!(
        "{}@{}",
        key(ns, &c.name_any()),
        c.metadata.generation.unwrap_or_default()
    )
}

/// Ask now for the Secrets of `cluster` (None: no such cluster: the pass finds that out itself).
pub fn ask_credentials(ctx: &Context, ns: &str, cluster: &str) -> Option<CredentialsAsk> {
    let c = ctx.caches.clusters.get(ns, cluster)?;
    let slot = secrets_slot(ns, &c);
    let asked = ctx.secret_reads.ask(&slot);
    Some(CredentialsAsk { slot, asked })
}

/// Read the Secrets for `ask` now, alongside other work; the answer waits in the shared slot
/// for the pass's [`ensure_credentials_asked`].
pub async fn read_credentials(ctx: &Context, ns: &str, cluster: &str, ask: &CredentialsAsk) {
    if let Some(c) = ctx.caches.clusters.get(ns, cluster) {
        let _ = ctx
            .secret_reads
            .answer(&ask.slot, ask.asked, || read_secrets(ctx, ns, &c))
            .await;
    }
}

async fn read_secrets(
    ctx: &Context,
    ns: &str,
    c: &ArtemisCluster,
) -> Result<BTreeMap<String, String>, Arc<AccessProblem>> {
    let read = crate::topology::access::read_secrets(&ctx.client, ns, &c.spec).await;
    read.map(|m| m.versions).map_err(Arc::new)
}

/// [`ensure_credentials`], answered by a read begun after `ask` when the pass asked early.
pub async fn ensure_credentials_asked(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    used: &BTreeMap<String, String>,
    ask: Option<&CredentialsAsk>,
) -> Result<(), DereferenceError> {
    let k = key(ns, cluster);
    let c = ctx
        .caches
        .clusters
        .get(ns, cluster)
        .ok_or_else(|| DereferenceError::ClusterNotFound(k.clone()))?;
    // Shared with the commands asking at the same time: a read that began after this one asked.
    let slot = secrets_slot(ns, &c);
    let asked = match ask {
        Some(a) if a.slot == slot => a.asked,
        _ => ctx.secret_reads.ask(&slot),
    };
    let read = || read_secrets(ctx, ns, &c);
    let now = match ctx.secret_reads.answer(&slot, asked, read).await {
        Ok(versions) => versions,
        Err(problem) => {
            // Withdrawn (a Secret or a key gone): nothing uses the access read from it.
            if problem.reason != "SecretUnreadable" {
                ctx.clusters.remove(&k);
            }
            let message = format!(
                "{}: nothing is written to the brokers without it",
                problem.message
            );
            return Err(DereferenceError::CredentialsMissing(k, message));
        }
    };
    let Some(rt) = ctx.clusters.get(&k) else {
        return Err(DereferenceError::ClusterNotReady(
            k,
            "it is being polled again".into(),
        ));
    };
    if *used == now {
        return Ok(());
    }
    let changed: Vec<&str> = now
        .iter()
        .filter(|(name, version)| used.get(*name) != Some(*version))
        .map(|(name, _)| name.as_str())
        .collect();
    // A runtime already re-polled with what the Secrets hold now stays (its poll triggered the
    // dependents, this object's next pass among them); an older one goes.
    if rt.access.secret_versions != now {
        ctx.clusters.remove(&k);
        let _ = ctx
            .triggers
            .clusters
            .send(kube::runtime::reflector::ObjectRef::new(cluster).within(ns));
    }
    Err(DereferenceError::CredentialsChanged(
        k,
        format!(
            "Secret {} changed since the last poll: nothing was sent with what it held before; the cluster is polled again with what it holds now",
            changed.join(", ")
        ),
    ))
}

pub(super) fn dereference<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
) -> Result<(Arc<ClusterRuntime>, String), DereferenceError> {
    let ns = obj.namespace().unwrap_or_default();
    let rt = dereference_cluster(ctx, &ns, obj.cluster_ref())?;
    Ok((rt, key(&ns, &obj.cluster_ref().name)))
}

/// The cluster's latest snapshot. Only the cluster controller polls (one poll in flight per
/// cluster); a reconcile plans from the snapshot and confirms with a fresh read of its own object.
pub(super) fn with_topology(
    ctx: &Context,
    rt: Arc<ClusterRuntime>,
    cluster_key: String,
    addresses: &[String],
) -> Result<Dereferenced, DereferenceError> {
    let topology = ctx
        .topologies
        .get(&cluster_key)
        .ok_or_else(|| DereferenceError::NotYetPolled(cluster_key.clone()))?;
    // No live node because Jolokia's access policy refused the operator's requests: the
    // cluster's spec.origin (or the broker's jolokia-access.xml), not the credentials.
    if topology.live_nodes().next().is_none()
        && let Some((_, e)) = topology
            .unreachable
            .iter()
            .find(|(_, e)| e.refusal_kind() == crate::api::RefusalKind::OriginRefused)
    {
        return Err(DereferenceError::OriginRefused(
            cluster_key.clone(),
            e.to_string(),
        ));
    }
    // No live node because every endpoint refused the credentials: say that, not "no live node".
    if topology.live_nodes().next().is_none()
        && let Some((url, e)) = topology.unreachable.iter().find(|(_, e)| e.is_authorization())
    {
        return Err(DereferenceError::CredentialsRefused(
            cluster_key.clone(),
            format!(
                "{url} refused the credentials in the cluster's Secret ({e}): fix the Secret or the broker's users"
            ),
        ));
    }
    // No live node because no endpoint answered as a broker (down, or a URL that is not
    // Jolokia): the cluster's cause, not a bare "no live node" (issue 41 item 6).
    if topology.live_nodes().next().is_none() && !topology.unreachable.is_empty() {
        let causes: Vec<String> = topology
            .unreachable
            .iter()
            .map(|(url, e)| format!("{url}: {e}"))
            .collect();
        return Err(DereferenceError::ClusterNotReady(
            cluster_key.clone(),
            format!(
                "no endpoint answered as a live broker ({}): check the ArtemisCluster's spec.brokers (each a Jolokia URL, e.g. http://host:8161/console/jolokia) or spec.discovery, and that the brokers run",
                causes.join("; ")
            ),
        ));
    }
    let facts = facts(ctx, &cluster_key, &rt, Some(addresses));
    Ok(Dereferenced {
        cluster_key,
        rt,
        topology,
        facts,
    })
}

/// What every plan on the cluster may consult. `addresses`: the broker addresses the object
/// being planned touches, the only ones whose deleting queues it can be held by (None: every
/// address, for a pass over every object of the cluster).
pub(in crate::controllers) fn facts(
    ctx: &Context,
    cluster_key: &str,
    rt: &ClusterRuntime,
    addresses: Option<&[String]>,
) -> PlanFacts {
    PlanFacts {
        declared_diverts: declared_diverts(ctx, cluster_key),
        declaration_mode: rt.declaration_mode,
        message_loss_cap: rt.message_loss_cap,
        instance_id: ctx.instance_id.clone(),
        deleting_addresses: deleting_addresses(ctx, cluster_key, addresses),
        capture_patterns: ctx
            .caches
            .subscriptions
            .state()
            .iter()
            .filter(|s| {
                s.metadata.deletion_timestamp.is_none()
                    && key(
                        s.metadata.namespace.as_deref().unwrap_or_default(),
                        &s.spec.cluster_ref.name,
                    ) == cluster_key
            })
            .map(|s| (s.metadata.name.clone().unwrap_or_default(), s.spec.queues.clone()))
            .collect(),
    }
}

/// The ArtemisDivert objects declaring diverts on the same broker cluster (from the cache).
fn declared_diverts(ctx: &Context, cluster_key: &str) -> BTreeMap<String, String> {
    ctx.caches
        .diverts
        .state()
        .iter()
        .filter(|d| ctx.watches(&d.namespace().unwrap_or_default()))
        .filter(|d| {
            let other = key(&d.namespace().unwrap_or_default(), &d.spec.cluster_ref.name);
            same_brokers(ctx, cluster_key, &other) == Some(true)
        })
        .map(|d| {
            (
                d.spec.name.clone().unwrap_or_else(|| d.name_any()),
                key(&d.namespace().unwrap_or_default(), &d.name_any()),
            )
        })
        .collect()
}

/// The addresses of ArtemisQueues being deleted (their finalizer still held) on the same broker
/// cluster (from the cache): after a restart the object is still there, so this survives one.
/// Only at `addresses` when given, looked up in the watch's index of the names each queue
/// touches: one lookup per address, not a walk over every queue (issue 45: at 10,000 queues
/// being deleted, each delete's pass walked and validated all 10,000).
fn deleting_addresses(
    ctx: &Context,
    cluster_key: &str,
    addresses: Option<&[String]>,
) -> BTreeMap<String, String> {
    let cache = &ctx.caches.queues;
    let candidates: Vec<Arc<ArtemisQueue>> = match addresses {
        None => cache.state(),
        Some(addresses) => addresses
            .iter()
            .flat_map(|a| cache.touched.claimants(&TopologyChange::address_key(a)))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|(ns, name)| cache.get(&ns, &name))
            .collect(),
    };
    candidates
        .iter()
        .filter(|q| q.metadata.deletion_timestamp.is_some())
        .filter(|q| ctx.watches(&q.namespace().unwrap_or_default()))
        .filter(|q| {
            let other = key(&q.namespace().unwrap_or_default(), &q.spec.cluster_ref.name);
            same_brokers(ctx, cluster_key, &other) == Some(true)
        })
        .filter_map(|q| {
            let d = q.desired().ok()?;
            let wanted = addresses.is_none_or(|a| a.contains(&d.address));
            wanted.then(|| (d.address, key(&q.namespace().unwrap_or_default(), &q.name_any())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde_json::json;

    use super::{DereferenceError, ensure_credentials};
    use crate::controllers::runtime::ClusterRuntime;
    use crate::controllers::{fixtures, key};

    /// The Secret as the API server holds it now: version 2 of the admin user.
    fn secret_now() -> fixtures::Answer {
        Box::new(|sent| {
            match sent
                .uri
                .starts_with("/api/v1/namespaces/ns/secrets/c-credentials")
            {
                true => (
                    200,
                    json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "c-credentials", "namespace": "ns", "resourceVersion": "2"},
                    "data": {"username": "YWRtaW4=", "password": "YWRtaW4="}}),
                ),
                false => (404, json!({})),
            }
        })
    }

    fn cluster() -> crate::api::ArtemisCluster {
        serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": "c", "namespace": "ns", "uid": "c-uid", "generation": 1},
            "spec": {"brokers": [{"url": "http://127.0.0.1:1/console/jolokia"}],
                "credentials": {"secretName": "c-credentials"}}
        }))
        .unwrap_or_else(|e| panic!("cluster: {e}"))
    }

    fn versions(v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("c-credentials".to_string(), v.to_string())])
    }

    /// The race a full run once lost: a pass took its snapshot (polled with the Secret's
    /// version 1), then the cluster was re-polled with version 2 and published. The gate
    /// compares what the command writes with — the snapshot's version — with the Secret now, so
    /// the old credentials are refused even though the runtime now published is current; that
    /// newer runtime stays.
    #[tokio::test]
    async fn a_snapshot_polled_with_an_older_secret_never_writes_though_the_runtime_is_current() {
        let (ctx, _) = fixtures::with_clusters(secret_now(), vec![cluster()]);
        let access = crate::topology::access::resolve_access(&ctx.client, "ns", &cluster().spec, &ctx.broker)
            .await
            .unwrap_or_else(|e| panic!("access: {e:?}"));
        assert_eq!(access.secret_versions, versions("2"));
        ctx.clusters.put(&key("ns", "c"), runtime(access));

        let stale = ensure_credentials(&ctx, "ns", "c", &versions("1")).await;
        assert!(
            matches!(stale, Err(DereferenceError::CredentialsChanged(..))),
            "{stale:?}"
        );
        assert!(
            ctx.clusters.get(&key("ns", "c")).is_some(),
            "the current runtime stays"
        );
        let current = ensure_credentials(&ctx, "ns", "c", &versions("2")).await;
        assert!(current.is_ok(), "{current:?}");
    }

    fn runtime(access: crate::topology::ClusterAccess) -> ClusterRuntime {
        ClusterRuntime {
            access,
            memory: Arc::default(),
            management_write: Arc::default(),
            bulk_cap: 0,
            message_loss_cap: 0,
            declaration_mode: Default::default(),
            poll_interval: std::time::Duration::from_secs(10),
            request_timeout: std::time::Duration::from_secs(5),
            poll_lock: Arc::default(),
            generation: Some(1),
            divert_watch_refusals: Arc::default(),
        }
    }
}
