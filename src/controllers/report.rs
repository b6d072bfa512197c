//! Report: the only code that writes status and publishes Events. Every kind's status goes to
//! the API server from here — a server-side apply of the whole typed status under the operator's
//! field manager, only when something a user acts on changed (condition transition times and
//! poll timestamps aside) — except a one-shot command's arming, which is a compare-and-swap on
//! the object's resourceVersion (ADR-0057 D4), also here.

use kube::api::{Patch, PatchParams, PostParams};
use kube::core::NamespaceResourceScope;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Context, MANAGER, ReconcileError, StatusConditions, conditions};

/// A namespaced kind whose status the operator writes.
pub trait Reported:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug
{
}

impl<K> Reported for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
{
}

fn api_of<K: Reported>(client: &kube::Client, obj: &K) -> Api<K> {
    Api::namespaced(
        client.clone(),
        obj.meta().namespace.as_deref().unwrap_or_default(),
    )
}

/// Server-side apply `status` as the object's whole status (fields the operator no longer sets
/// are removed), forced: the operator owns status.
pub async fn apply_status<K: Reported>(
    client: &kube::Client,
    obj: &K,
    status: &impl Serialize,
) -> Result<K, kube::Error> {
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": status
    });
    let name = obj.meta().name.clone().unwrap_or_default();
    api_of(client, obj)
        .patch_status(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(patch))
        .await
}

/// Replace the status only if the object is still at the resourceVersion `next` carries (a
/// compare-and-swap): `Ok(false)` when another writer got there first.
pub async fn replace_status_if_unchanged<K: Reported + Serialize>(
    client: &kube::Client,
    mut next: K,
) -> Result<bool, kube::Error> {
    next.meta_mut().managed_fields = None;
    let name = next.meta().name.clone().unwrap_or_default();
    let api = api_of(client, &next);
    match api.replace_status(&name, &PostParams::default(), &next).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// A queue's or divert's status: kstatus conditions follow Ready and the nodes, and the status
/// is applied only when it changed (condition transition times aside).
pub async fn write_status<K: Reported, S: StatusConditions>(
    ctx: &Context,
    obj: &K,
    old: Option<&S>,
    status: &S,
) -> Result<(), ReconcileError> {
    let mut status = status.clone();
    let nodes = status.nodes().to_vec();
    let generation = status.observed_generation();
    conditions::kstatus(status.conditions_mut(), &nodes, generation);
    if unchanged(&old.cloned().unwrap_or_default(), &status) {
        return Ok(());
    }
    let written = apply_status(&ctx.client, obj, &status).await?;
    ctx.written.record(written.meta(), &status);
    Ok(())
}

/// Equal but for the conditions' transition times.
pub fn unchanged<S: StatusConditions>(old: &S, new: &S) -> bool {
    let (mut a, mut b) = (old.clone(), new.clone());
    let same_conditions =
        conditions::comparable(a.conditions_mut()) == conditions::comparable(b.conditions_mut());
    a.conditions_mut().clear();
    b.conditions_mut().clear();
    a == b && same_conditions
}

impl Context {
    /// One Event on an object: what a human should see (kube's recorder aggregates repeats).
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
            note: Some(truncated(note, 1000)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "could not publish event");
        }
    }
}

fn truncated(mut s: String, max: usize) -> String {
    if s.len() > max {
        crate::store::storable::truncate_at_char_boundary(&mut s, max);
        s.push('…');
    }
    s
}
