//! Controllers: one module per kind, sharing one Context. Every mutating reconcile follows the
//! same pipeline: dereference → plan → preflight → command → record (OPERATOR.md).

pub mod cluster;
pub mod command;
pub mod conditions;
pub mod connection_close;
pub mod divert;
pub mod queue;

use std::sync::Arc;

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

use crate::store::Store;
use crate::topology::TopologyCache;

/// Field manager of every write the operator makes.
pub const MANAGER: &str = "artemis-studio-operator";

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Serialization(#[from] serde_json::Error),
    /// A delete that cannot proceed now; the object stays Terminating and is retried.
    #[error("delete refused: {0}")]
    DeleteRefused(String),
    #[error("finalizer: {0}")]
    Finalizer(String),
}

/// What every controller shares.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub store: Store,
    pub instance_id: String,
    pub topologies: TopologyCache,
    pub clusters: cluster::ClusterRegistry,
    pub recorder: Recorder,
    pub metrics: Arc<crate::telemetry::Metrics>,
}

impl Context {
    pub fn new(client: Client, store: Store, instance_id: String) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            store,
            instance_id,
            topologies: TopologyCache::default(),
            clusters: cluster::ClusterRegistry::default(),
            metrics: Arc::new(crate::telemetry::Metrics::default()),
        }
    }

    /// One Event on an object: what a human should see.
    pub async fn event<K>(&self, obj: &K, warning: bool, reason: &str, action: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(truncate(note, 1000)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "could not publish event");
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// Namespaced key of an object.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The actor of a command: the field manager that last changed the object's spec (from
/// `managedFields`), or "unknown".
pub fn actor_of(meta: &kube::api::ObjectMeta) -> String {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|m| m.fields_v1.as_ref().is_some_and(|f| f.0.get("f:spec").is_some()))
        .max_by_key(|m| m.time.as_ref().map(|t| t.0))
        .and_then(|m| m.manager.clone())
        .unwrap_or_else(|| "unknown".into())
}

/// The object is paused: no broker writes (annotation `artemis-studio.io/paused: "true"`).
pub fn is_paused(meta: &kube::api::ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::PAUSED_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// A status with conditions (to compare without transition times).
pub trait StatusConditions: Clone + PartialEq + serde::Serialize + Default {
    fn conditions_mut(&mut self) -> &mut Vec<crate::api::Condition>;
}

impl StatusConditions for crate::api::queue::ArtemisQueueStatus {
    fn conditions_mut(&mut self) -> &mut Vec<crate::api::Condition> {
        &mut self.conditions
    }
}
impl StatusConditions for crate::api::divert::ArtemisDivertStatus {
    fn conditions_mut(&mut self) -> &mut Vec<crate::api::Condition> {
        &mut self.conditions
    }
}

/// Server-side apply the status, only when it changed (condition transition times aside).
pub async fn write_status<K, S>(
    ctx: &Context,
    obj: &K,
    old: Option<&S>,
    status: &S,
) -> Result<(), ReconcileError>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    S: StatusConditions,
{
    let (mut a, mut b) = (old.cloned().unwrap_or_default(), status.clone());
    let same_conditions =
        conditions::comparable(a.conditions_mut()) == conditions::comparable(b.conditions_mut());
    a.conditions_mut().clear();
    b.conditions_mut().clear();
    if a == b && same_conditions {
        return Ok(());
    }
    let api: kube::Api<K> = kube::Api::namespaced(
        ctx.client.clone(),
        &obj.meta().namespace.clone().unwrap_or_default(),
    );
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": status
    });
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch_status(
        &name,
        &kube::api::PatchParams::apply(MANAGER).force(),
        &kube::api::Patch::Apply(patch),
    )
    .await?;
    Ok(())
}

impl From<kube::runtime::finalizer::Error<ReconcileError>> for ReconcileError {
    fn from(e: kube::runtime::finalizer::Error<ReconcileError>) -> Self {
        match e {
            kube::runtime::finalizer::Error::ApplyFailed(e)
            | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
            other => ReconcileError::Finalizer(other.to_string()),
        }
    }
}

/// Run one kind's controller until shutdown (every kind is wired the same way).
pub async fn run_controller<K, Fut>(
    api: kube::Api<K>,
    ctx: Arc<Context>,
    reconcile: impl FnMut(Arc<K>, Arc<Context>) -> Fut,
    error_policy: impl Fn(Arc<K>, &ReconcileError, Arc<Context>) -> kube::runtime::controller::Action,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    Fut: std::future::Future<Output = Result<kube::runtime::controller::Action, ReconcileError>>
        + Send
        + 'static,
{
    use futures::StreamExt;
    kube::runtime::Controller::new(api, kube::runtime::watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, kind = K::kind(&()).as_ref(), "reconcile");
            }
        })
        .await;
}

/// Reconcile through the object's finalizer: `apply` while it lives, `cleanup` once deleted
/// (the finalizer is released only when `cleanup` succeeds).
pub async fn with_finalizer<K, A, AFut, C, CFut>(
    ctx: &Context,
    obj: Arc<K>,
    finalizer_name: &str,
    apply: A,
    cleanup: C,
) -> Result<kube::runtime::controller::Action, ReconcileError>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    A: FnOnce(Arc<K>) -> AFut,
    AFut: std::future::Future<Output = Result<kube::runtime::controller::Action, ReconcileError>>,
    C: FnOnce(Arc<K>) -> CFut,
    CFut: std::future::Future<Output = Result<kube::runtime::controller::Action, ReconcileError>>,
{
    use kube::runtime::finalizer::{Event, finalizer};
    let api: kube::Api<K> = kube::Api::namespaced(
        ctx.client.clone(),
        &obj.meta().namespace.clone().unwrap_or_default(),
    );
    finalizer(&api, finalizer_name, obj, |event| async move {
        match event {
            Event::Apply(o) => apply(o).await,
            Event::Cleanup(o) => cleanup(o).await,
        }
    })
    .await
    .map_err(ReconcileError::from)
}
