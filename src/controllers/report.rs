//! Report: the only code that writes status and publishes Events. Every kind's status goes to
//! the API server from here — one JSON Patch replacing the whole typed status under the operator's
//! field manager, only when something a user acts on changed (condition transition times and
//! poll timestamps aside) — except a one-shot command's arming, which is a compare-and-swap on
//! the object's resourceVersion (ADR-0057 D4), also here. Before the first write an object
//! shows the CRD's default status, `observedGeneration: 0` (`api::unobserved_until_seen`).

use kube::api::Patch;
use kube::core::NamespaceResourceScope;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Context, ReconcileError, StatusConditions, conditions};

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

/// Write `status` as the object's whole status (fields the operator no longer sets are
/// removed): one JSON Patch `add /status`, which replaces the member when it exists (RFC 6902
/// §4.1). Not a server-side apply: the operator is the status's only writer, so field ownership
/// buys nothing, and on the bed's API server an apply of a queue's status cost 7.3–7.8 ms of
/// its CPU against 6.1–6.4 ms for this patch (issue 45: under a burst of creates the API
/// server is the busiest process, and this is one of a create's two writes).
pub async fn patch_whole_status<K: Reported>(
    client: &kube::Client,
    obj: &K,
    status: &impl Serialize,
) -> Result<K, kube::Error> {
    let value = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::json!([{"op": "add", "path": "/status", "value": value}]))
            .map_err(kube::Error::SerdeError)?;
    let name = obj.meta().name.clone().unwrap_or_default();
    api_of(client, obj)
        .patch_status(&name, &super::patch_params(), &Patch::Json::<()>(patch))
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
    match api.replace_status(&name, &super::post_params(), &next).await {
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
    let written = patch_whole_status(&ctx.client, obj, &status).await?;
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
    /// Queued, not awaited: it is published after the Events queued before it (`events.rs`).
    pub fn event<K>(&self, obj: &K, warning: bool, reason: &str, action: &str, note: String)
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
        self.events.publish(ev, obj.object_ref(&()));
    }
}

fn truncated(mut s: String, max: usize) -> String {
    if s.len() > max {
        crate::store::storable::truncate_at_char_boundary(&mut s, max);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod on_a_mock_api {
    use serde_json::json;

    use super::*;
    use crate::api::ArtemisQueue;
    use crate::api::queue::ArtemisQueueStatus;
    use crate::controllers::{MANAGER, fixtures};

    fn queue(status: Option<ArtemisQueueStatus>) -> ArtemisQueue {
        let mut q: ArtemisQueue = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": "orders", "namespace": "ns", "uid": "u1", "resourceVersion": "7", "generation": 2},
            "spec": {"clusterRef": {"name": "c"}}
        }))
        .unwrap_or_else(|e| panic!("queue: {e}"));
        q.status = status;
        q
    }

    fn ready(message: &str) -> ArtemisQueueStatus {
        let mut s = ArtemisQueueStatus {
            observed_generation: Some(2),
            ..Default::default()
        };
        conditions::set(
            &mut s.conditions,
            conditions::READY,
            true,
            "Applied",
            message,
            Some(2),
        );
        // As the API server has it: with the kstatus conditions the last write added.
        conditions::kstatus(&mut s.conditions, &[], Some(2));
        s
    }

    /// The server answers a status write with the object as written.
    fn echo() -> fixtures::Answer {
        Box::new(|sent| {
            let mut q = serde_json::to_value(queue(None)).unwrap_or_default();
            // The status patch: `[{"op": "add", "path": "/status", "value": …}]`.
            q["status"] = sent.body[0]["value"].clone();
            q["metadata"]["resourceVersion"] = json!("8");
            (200, q)
        })
    }

    #[tokio::test]
    async fn an_unchanged_status_is_not_written() {
        let (ctx, received) = fixtures::context(echo());
        let old = ready("on every live node");
        let mut same = old.clone();
        // Only a transition time differs: nothing a user acts on.
        same.conditions[0].last_transition_time =
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        write_status(&ctx, &queue(Some(old.clone())), Some(&old), &same)
            .await
            .expect("nothing to write");
        assert!(received.all().is_empty(), "no API call: {:?}", received.all());
    }

    #[tokio::test]
    async fn a_changed_status_is_one_patch_replacing_the_whole_status() {
        let (ctx, received) = fixtures::context(echo());
        let old = ready("on every live node");
        let new = ready("on 2 of 3 live nodes");
        write_status(&ctx, &queue(Some(old.clone())), Some(&old), &new)
            .await
            .expect("written");
        let sent = received.all();
        assert_eq!(sent.len(), 1, "{sent:?}");
        let s = &sent[0];
        assert_eq!(s.method, "PATCH");
        assert!(
            s.uri
                .starts_with("/apis/artemis-studio.io/v1alpha1/namespaces/ns/artemisqueues/orders/status?"),
            "{}",
            s.uri
        );
        assert!(s.uri.contains(&format!("fieldManager={MANAGER}")), "{}", s.uri);
        // One operation: the whole status member replaced (fields no longer set go with it).
        let ops = s.body.as_array().expect("a JSON Patch");
        assert_eq!(ops.len(), 1, "{ops:?}");
        assert_eq!(
            (ops[0]["op"].as_str(), ops[0]["path"].as_str()),
            (Some("add"), Some("/status"))
        );
        let status = &ops[0]["value"];
        assert_eq!(status["conditions"][0]["message"], "on 2 of 3 live nodes");
        // kstatus conditions follow Ready in the same write.
        let types: Vec<&str> = status["conditions"]
            .as_array()
            .map(|c| c.iter().filter_map(|c| c["type"].as_str()).collect())
            .unwrap_or_default();
        assert!(
            types.contains(&"Reconciling") && types.contains(&"Stalled"),
            "{types:?}"
        );
        // The cache's older copy is not planned from again.
        let cached = queue(Some(old));
        assert!(
            ctx.written
                .newer_than::<ArtemisQueueStatus>(&cached.metadata)
                .is_some()
        );
    }

    #[tokio::test]
    async fn arming_is_a_compare_and_swap_that_loses_to_another_writer() {
        let (ctx, received) = fixtures::context(Box::new(|_| {
            (
                409,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
            )
        }));
        let won = replace_status_if_unchanged(&ctx.client, queue(Some(ready("x"))))
            .await
            .expect("answered");
        assert!(!won);
        let sent = received.all();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].method, "PUT");
        assert_eq!(
            sent[0].body["metadata"]["resourceVersion"], "7",
            "the precondition"
        );
        assert!(
            sent[0].uri.contains(&format!("fieldManager={MANAGER}")),
            "{}",
            sent[0].uri
        );
    }
}
