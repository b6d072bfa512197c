//! The Leases of sharding: one per replica (its liveness) and one per broker cluster (who holds
//! it), all in the leader Lease's namespace, named after it. One LIST per look reads them all.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Preconditions};
use tokio::time::Instant;

use crate::leader::{Attempt, LeaseLock, Timing};

/// The annotation on a cluster Lease naming its ArtemisCluster (`namespace/name`).
pub const CLUSTER_ANNOTATION: &str = "artemis-studio.io/cluster";

/// A replica's Lease unrenewed for this many lease durations is deleted by whoever sees it (a
/// replica killed without its stop leaves one behind).
const STALE_AFTER_DURATIONS: u32 = 10;

/// This replica's view of, and writes on, the shard Leases.
pub struct ShardLeases {
    api: Api<Lease>,
    prefix: String,
    identity: String,
    timing: Timing,
    own: LeaseLock,
    /// Each replica Lease's resourceVersion as last seen, and since when (this process's
    /// monotonic clock): no comparison of clocks across nodes.
    seen: BTreeMap<String, (String, Instant)>,
}

/// What one look found.
pub struct View {
    /// The live replicas' identities, this one's included.
    pub live: Vec<String>,
    /// Each cluster Lease, by the cluster it names.
    pub clusters: BTreeMap<String, Lease>,
    /// Replica Leases long unrenewed (name, resourceVersion).
    stale: Vec<(String, String)>,
}

impl ShardLeases {
    /// `prefix`: the leader Lease's name (`artemis-studio-operator-<instance ID>`).
    pub fn new(api: Api<Lease>, prefix: String, identity: String, timing: Timing) -> Self {
        let own = LeaseLock::new(
            api.clone(),
            replica_lease(&prefix, &identity),
            identity.clone(),
            timing,
        );
        ShardLeases {
            api,
            prefix,
            identity,
            timing,
            own,
            seen: BTreeMap::new(),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Renew this replica's own Lease (created at the first call): true when renewed.
    pub async fn renew_own(&mut self) -> Result<bool, kube::Error> {
        Ok(self.own.try_acquire_or_renew().await? == Attempt::Leading)
    }

    /// Read every shard Lease (one LIST) and judge the replicas' liveness.
    pub async fn look(&mut self) -> Result<View, kube::Error> {
        let leases = self.api.list(&ListParams::default()).await?.items;
        let now = Instant::now();
        let replicas = format!("{}-replica-", self.prefix);
        let clusters = format!("{}-cluster-", self.prefix);
        let mut view = View {
            live: vec![self.identity.clone()],
            clusters: BTreeMap::new(),
            stale: vec![],
        };
        let mut seen = BTreeMap::new();
        for l in leases {
            let name = l.name_any();
            let rv = l.resource_version().unwrap_or_default();
            if name.starts_with(&clusters) {
                if let Some(c) = l.annotations().get(CLUSTER_ANNOTATION).cloned() {
                    view.clusters.insert(c, l);
                }
                continue;
            }
            if !name.starts_with(&replicas) {
                continue;
            }
            let since = match self.seen.get(&name) {
                Some((was, at)) if *was == rv => *at,
                _ => now,
            };
            let holder = l.spec.as_ref().and_then(|s| s.holder_identity.clone());
            // The duration the replica itself recorded (replicas may be configured apart).
            let valid_for = l
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0)
                .map_or(self.timing.lease_duration, Duration::from_secs);
            let unrenewed = now.saturating_duration_since(since);
            match holder.filter(|h| !h.is_empty() && *h != self.identity) {
                Some(h) if unrenewed < valid_for => view.live.push(h),
                _ if unrenewed >= valid_for * STALE_AFTER_DURATIONS => {
                    view.stale.push((name.clone(), rv.clone()))
                }
                _ => {}
            }
            seen.insert(name, (rv, since));
        }
        self.seen = seen;
        Ok(view)
    }

    /// Take the cluster's Lease (`current`: as the look read it, None when there is none),
    /// with the resourceVersion read as the precondition: false when another replica won.
    pub async fn take(&self, cluster: &str, current: Option<&Lease>) -> Result<bool, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let transitions = current
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.lease_transitions)
            .map_or(0, |t| t.saturating_add(1));
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        };
        let result = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(cluster_lease(&self.prefix, cluster)),
                        annotations: Some([(CLUSTER_ANNOTATION.to_string(), cluster.to_string())].into()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&crate::api::post_params(), &lease).await
            }
            Some(l) => {
                let mut next = l.clone();
                next.spec = Some(spec);
                self.api
                    .replace(&l.name_any(), &crate::api::post_params(), &next)
                    .await
            }
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Give the cluster's Lease up (deleted when the cluster is gone): another replica takes it
    /// at its next look. Nothing when this replica no longer holds it.
    pub async fn release(&self, cluster: &str, cluster_gone: bool) -> Result<(), kube::Error> {
        let name = cluster_lease(&self.prefix, cluster);
        let Some(mut lease) = self.api.get_opt(&name).await? else {
            return Ok(());
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        let result = if cluster_gone {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: lease.resource_version(),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            self.api.delete(&name, &dp).await.map(|_| ())
        } else {
            spec.holder_identity = None;
            spec.acquire_time = None;
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            lease.spec = Some(spec);
            self.api
                .replace(&name, &crate::api::post_params(), &lease)
                .await
                .map(|_| ())
        };
        match result {
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
            other => other,
        }
    }

    /// Delete the replica Leases a look found long unrenewed (best effort).
    pub async fn delete_stale(&self, view: &View) {
        for (name, rv) in &view.stale {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(rv.clone()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match self.api.delete(name, &dp).await {
                Ok(_) => {
                    tracing::info!(lease = %name, "shards: deleted the Lease of a replica gone for long")
                }
                Err(e) => {
                    tracing::debug!(lease = %name, error = %e, "shards: stale replica Lease not deleted")
                }
            }
        }
    }

    /// On a stop: this replica's own Lease deleted, so the others count it gone at once.
    pub async fn leave(&self, within: Duration) {
        let name = replica_lease(&self.prefix, &self.identity);
        let dp = DeleteParams::default();
        match tokio::time::timeout(within, self.api.delete(&name, &dp)).await {
            Ok(Ok(_)) => tracing::info!(lease = %name, "shards: left (replica Lease deleted)"),
            Ok(Err(e)) => {
                tracing::warn!(lease = %name, error = %e, "shards: replica Lease not deleted; it expires")
            }
            Err(_) => tracing::warn!(lease = %name, "shards: replica Lease not deleted in time; it expires"),
        }
    }
}

impl View {
    /// The identity holding the cluster's Lease, if any.
    pub fn holder(&self, cluster: &str) -> Option<&str> {
        self.clusters
            .get(cluster)
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.as_deref())
            .filter(|h| !h.is_empty())
    }

    pub fn is_live(&self, identity: &str) -> bool {
        self.live.iter().any(|l| l == identity)
    }
}

/// A replica's Lease: `<prefix>-replica-<identity>`, the identity made a DNS name.
pub fn replica_lease(prefix: &str, identity: &str) -> String {
    let dns: String = identity
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("{prefix}-replica-{}", dns.trim_matches('-'));
    name.truncate(253);
    name.trim_end_matches('-').to_string()
}

/// A cluster's Lease: `<prefix>-cluster-<16 hex of SHA-256 of namespace/name>` (the key itself
/// is in an annotation: a namespace and a name do not always fit in a Lease's name).
pub fn cluster_lease(prefix: &str, cluster: &str) -> String {
    format!("{prefix}-cluster-{}", super::assign::short_hash(cluster))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::lease_mock::{assert_each_names_the_operator, mock_lease_api};

    /// A cluster's Lease, taken, taken again and released, names the operator in
    /// `managedFields`, not "unknown".
    #[tokio::test]
    async fn cluster_lease_writes_name_the_operator_as_their_field_manager() {
        let (api, writes) = mock_lease_api();
        let timing = crate::leader::Timing::new(15, 10, 2).expect("valid timings");
        let leases = ShardLeases::new(api.clone(), "p".into(), "me".into(), timing);
        assert!(leases.take("ns/c", None).await.expect("created"));
        let current = api.get("any").await.expect("the Lease");
        assert!(leases.take("ns/c", Some(&current)).await.expect("taken again"));
        leases.release("ns/c", false).await.expect("released");
        assert_each_names_the_operator(&writes, 3);
    }

    #[test]
    fn lease_names_are_dns_names_that_name_the_installation() {
        assert_eq!(
            replica_lease("artemis-studio-operator-prod", "Host_1.local-0a1b2c3d4e5f"),
            "artemis-studio-operator-prod-replica-host-1-local-0a1b2c3d4e5f"
        );
        assert_eq!(
            cluster_lease("artemis-studio-operator-prod", "ns/c"),
            "artemis-studio-operator-prod-cluster-82ab9080ef644892"
        );
        assert!(replica_lease("p", &"x".repeat(400)).len() <= 253);
    }
}
