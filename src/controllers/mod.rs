//! Controllers: one module per kind, sharing one Context. Every mutating reconcile follows the
//! same pipeline: dereference → plan → preflight → command → record (`pipeline/`).
//!
//! What is where in this directory:
//!
//! - the kinds: `cluster` (ArtemisCluster: access, topology polls), `queue` and `divert` (run by
//!   `pipeline`, one stage per module), `connection_close` (one-shot disconnects);
//! - the steps of a reconcile: `access`, `runtime`, `command`, `ownership`, `catch_up`, `dependents`,
//!   `conditions`, `report` (the only status writer), `shared_read`;
//! - what the controllers share: `context` ([`Context`], [`Namespaces`], the caches and the
//!   [`Reflectors`] behind them, [`WrittenStatus`]), `locks` ([`AddressLocks`]), `triggers`
//!   ([`Triggers`], [`trigger_stream`]), `error` ([`ReconcileError`]), `claims` (the claim
//!   indexes a cache keeps), `census` (the metrics read from the caches);
//! - how they run: `runner` (one kind's controller: [`Wiring`], [`Slots`], [`Source`],
//!   [`run_controller`], [`with_finalizer`]), `arrival` (the order of the slots: a reconcile
//!   waiting for one is served in the order its object's change arrived), `watches` (the one
//!   watch per kind and scope that keeps a cache, its indexes and first statuses; `feed`: what
//!   it lets through to the controller), `launch` ([`run_all`]: every controller and watch), `liveness` ([`heartbeat`],
//!   the reaper of abandoned commands), `shards` (with `--sharding`: which broker clusters this
//!   replica holds, by Lease; the design in `src/shards/mod.rs`);
//! - this file: the small helpers every module uses ([`key`], [`actor_of`], [`is_paused`]…) and
//!   the traits of the kinds ([`StatusConditions`], [`OfCluster`], [`Watched`]).
//!
//! Among the shared modules each uses only those to its left: this file, `error`, `locks`,
//! `triggers`, `arrival` → `context` → `runner`, `liveness` → `watches` → `launch`.

mod arrival;
pub mod catch_up;
pub mod census;
pub mod claims;
pub mod cluster;
pub mod command;
pub mod conditions;
pub mod connection_close;
mod context;
pub mod dependents;
pub mod divert;
pub mod divert_watch;
mod error;
pub mod events;
pub mod feed;
#[cfg(test)]
pub mod fixtures;
mod launch;
mod liveness;
mod locks;
pub mod message_replay;
mod one_shot;
pub mod ownership;
pub mod pipeline;
pub mod queue;
pub mod report;
mod runner;
pub mod runtime;
pub mod shards;
pub mod shared_read;
mod triggers;
mod watches;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::{Api, Resource};

use crate::api::{ArtemisCluster, ArtemisDivert, ArtemisQueue};

pub use crate::backoff::Backoff;
pub use context::{
    Cache, Caches, Context, Namespaces, Reflectors, SecretMeta, SecretVersions, WrittenStatus,
};
pub use error::{DeleteRefusal, ReconcileError};
pub use launch::run_all;
pub use liveness::heartbeat;
pub use locks::{AddressHold, AddressLocks, HeldAddress};
pub use runner::{Slots, Source, Wiring, run_controller, with_finalizer};
pub use triggers::{Triggers, trigger_stream};

// The field manager of every write the operator makes, and the parameters that send it.
pub use crate::api::{MANAGER, patch_params, post_params};

/// Whether a namespace is being deleted (or is gone): nothing can be created in it any more, so
/// a delete that waits for its ArtemisCluster or Secret to come back would wait forever. False
/// when it cannot be read (the caller keeps waiting, as before).
pub async fn namespace_being_deleted(client: &kube::Client, ns: &str) -> bool {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    match namespaces.get_opt(ns).await {
        Ok(Some(n)) => n.metadata.deletion_timestamp.is_some(),
        Ok(None) => true,
        Err(e) => {
            tracing::warn!(error = %e, namespace = %ns, "cannot read the namespace of a blocked delete");
            false
        }
    }
}

/// Namespaced key of an object.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// What the audit row says when Kubernetes recorded no writer of the spec.
pub const ACTOR_NOT_RECORDED: &str = "unknown (Kubernetes recorded no writer of the spec)";

/// The `managedFields` entry of the last writer of the object's spec: the field manager that
/// wrote `spec` most recently, never the operator itself (its finalizer and status entries
/// own no spec field, and its own manager is excluded in case a future write does).
fn last_spec_writer(meta: &kube::api::ObjectMeta) -> Option<&ManagedFieldsEntry> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() != Some(MANAGER))
        .filter(|m| m.fields_v1.as_ref().is_some_and(|f| f.0.get("f:spec").is_some()))
        .max_by_key(|m| m.time.as_ref().map(|t| t.0))
}

/// The actor of a command (issue 41): the field manager that last wrote the spec (from
/// `managedFields`: `kubectl-client-side-apply`, `kubectl`, `argocd-controller`…), or
/// [`ACTOR_NOT_RECORDED`]. A spec last written by `kubectl artemis mcp` (issue 48) names the
/// Kubernetes user and the MCP client its annotations record.
pub fn actor_of(meta: &kube::api::ObjectMeta) -> String {
    match last_spec_writer(meta).and_then(|m| m.manager.clone()) {
        Some(m) if m == crate::api::MCP_MANAGER => mcp_actor(meta),
        Some(m) => m,
        None => ACTOR_NOT_RECORDED.into(),
    }
}

/// `<user> via MCP client <client> (kubectl-artemis-mcp)`, as the MCP server annotated the
/// object with each write.
fn mcp_actor(meta: &kube::api::ObjectMeta) -> String {
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map_or("unknown", String::as_str)
            .to_string()
    };
    format!(
        "{} via MCP client {} ({})",
        annotation(crate::api::MCP_USER_ANNOTATION),
        annotation(crate::api::MCP_CLIENT_ANNOTATION),
        crate::api::MCP_MANAGER
    )
}

/// What a cache keeps of `managedFields`: only the last spec writer's entry, reduced to its
/// manager, operation and time (its field set only marks `spec`). Caches hold what decisions
/// need, and the audit row's actor is one; the full field sets only cost memory.
pub fn keep_spec_writer(meta: &mut kube::api::ObjectMeta) {
    let writer = last_spec_writer(meta).map(|m| ManagedFieldsEntry {
        fields_v1: Some(FieldsV1(serde_json::json!({ "f:spec": {} }))),
        ..m.clone()
    });
    meta.managed_fields = writer.map(|w| vec![w]);
}

/// The object is paused: no broker writes (annotation `artemis-studio.io/paused: "true"`).
pub fn is_paused(meta: &kube::api::ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::PAUSED_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// A status with conditions, per-node outcomes and the last command's audit row.
pub trait StatusConditions: Clone + PartialEq + serde::Serialize + Default {
    fn conditions_mut(&mut self) -> &mut Vec<crate::api::Condition>;
    fn observed_generation(&self) -> Option<i64>;
    /// The generation the per-node outcomes were judged for (issue 41: a report that could not
    /// reach the brokers moves `observedGeneration` on and keeps older nodes).
    fn nodes_generation(&self) -> Option<i64>;
    fn last_audit_id(&self) -> Option<i64>;
    fn nodes(&self) -> &[crate::api::NodeOutcome];
    /// Why a plain delete leaves the broker object in place (issue 41), once recorded.
    fn not_owned(&self) -> Option<&crate::api::NotOwned>;
}

macro_rules! status_conditions {
    ($t:ty) => {
        impl StatusConditions for $t {
            fn conditions_mut(&mut self) -> &mut Vec<crate::api::Condition> {
                &mut self.conditions
            }
            fn observed_generation(&self) -> Option<i64> {
                self.observed_generation
            }
            fn nodes_generation(&self) -> Option<i64> {
                // A status without nodes (a first status, issue 50) judged no node.
                let judged = (!self.nodes.is_empty())
                    .then_some(self.observed_generation)
                    .flatten();
                self.nodes_generation.or(judged)
            }
            fn last_audit_id(&self) -> Option<i64> {
                self.last_audit_id
            }
            fn nodes(&self) -> &[crate::api::NodeOutcome] {
                &self.nodes
            }
            fn not_owned(&self) -> Option<&crate::api::NotOwned> {
                self.not_owned.as_ref()
            }
        }
    };
}
status_conditions!(crate::api::queue::ArtemisQueueStatus);
status_conditions!(crate::api::divert::ArtemisDivertStatus);

/// The cluster (`namespace/name`) an object's reconciles are counted under in the metrics.
pub trait OfCluster {
    fn cluster_key(&self) -> String;

    /// What a replica that does not hold the object's cluster does with it (issue 46): nothing
    /// until triggered — the holder's first poll of a cluster triggers every object of it.
    fn when_not_held() -> kube::runtime::controller::Action
    where
        Self: Sized,
    {
        kube::runtime::controller::Action::await_change()
    }
}

impl OfCluster for ArtemisCluster {
    fn cluster_key(&self) -> String {
        key(
            &kube::ResourceExt::namespace(self).unwrap_or_default(),
            &kube::ResourceExt::name_any(self),
        )
    }
}

/// The kinds that name their cluster in `spec.clusterRef`, in their own namespace.
macro_rules! of_cluster_ref {
    ($($kind:ty),+) => {$(
        impl OfCluster for $kind {
            fn cluster_key(&self) -> String {
                key(
                    &kube::ResourceExt::namespace(self).unwrap_or_default(),
                    &self.spec.cluster_ref.name,
                )
            }
        }
    )+};
}

of_cluster_ref!(ArtemisQueue, ArtemisDivert);

impl OfCluster for crate::api::connection_close::ConnectionClose {
    fn cluster_key(&self) -> String {
        key(
            &kube::ResourceExt::namespace(self).unwrap_or_default(),
            &self.spec.cluster_ref.name,
        )
    }

    /// A close is not among the objects a poll triggers: it looks again a little later.
    fn when_not_held() -> kube::runtime::controller::Action {
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(15))
    }
}

impl OfCluster for crate::api::message_replay::MessageReplay {
    fn cluster_key(&self) -> String {
        key(
            &kube::ResourceExt::namespace(self).unwrap_or_default(),
            &self.spec.cluster_ref.name,
        )
    }

    /// A replay is not among the objects a poll triggers: it looks again a little later.
    fn when_not_held() -> kube::runtime::controller::Action {
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(15))
    }
}

/// What a watch, a cache and a controller need of a kind.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written_by(manager: &str, annotations: &[(&str, &str)]) -> kube::api::ObjectMeta {
        kube::api::ObjectMeta {
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some(manager.into()),
                fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {}}))),
                ..ManagedFieldsEntry::default()
            }]),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// Issue 48: a spec last written through `kubectl artemis mcp` names the Kubernetes user and
    /// the MCP client; the annotations of any other writer are not read.
    #[test]
    fn a_spec_written_through_mcp_names_the_user_and_the_client() {
        let marks = [
            (crate::api::MCP_USER_ANNOTATION, "alice"),
            (crate::api::MCP_CLIENT_ANNOTATION, "claude-code 2.1"),
        ];
        assert_eq!(
            actor_of(&written_by(crate::api::MCP_MANAGER, &marks)),
            "alice via MCP client claude-code 2.1 (kubectl-artemis-mcp)"
        );
        assert_eq!(actor_of(&written_by("kubectl", &marks)), "kubectl");
        assert_eq!(
            actor_of(&written_by(crate::api::MCP_MANAGER, &[])),
            "unknown via MCP client unknown (kubectl-artemis-mcp)"
        );
    }
}
