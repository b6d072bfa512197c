//! What the MCP tools read of the operator's objects: documents of clusters, queues, diverts and
//! replays with their per-node truth, the wait for the operator to report on a generation, the check of
//! a spec's field names, and who the server acts as.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;
use kube::{Api, CustomResourceExt, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::ToolError;
use crate::api::message_replay::MessageReplay;
use crate::api::{ArtemisCluster, ArtemisDivert, ArtemisQueue, Condition, NodeOutcome};
use crate::controllers::StatusConditions;
use crate::controllers::conditions::{self, READY};

/// A condition as an agent reads it: status, reason, message.
fn condition(c: Option<&Condition>) -> Value {
    c.map_or(
        Value::Null,
        |c| json!({"status": c.status, "reason": c.reason, "message": c.message}),
    )
}

/// A cluster and its logical nodes, which are live, and whether writes are permitted.
pub fn cluster_doc(c: &ArtemisCluster) -> Value {
    let s = c.status.clone().unwrap_or_default();
    json!({
        "name": c.name_any(),
        "namespace": c.namespace(),
        "ready": condition(conditions::get(&s.conditions, READY)),
        "liveNodes": s.live_nodes,
        "totalNodes": s.total_nodes,
        "nodes": s.nodes,
        "unreachableEndpoints": s.unreachable_endpoints,
        "managementWrite": s.management_write,
        "lastPollTime": s.last_poll_time,
        "heldBy": s.held_by,
        "messageLossCap": c.spec.message_loss_cap,
        "bulkCap": c.spec.bulk_cap,
    })
}

/// One line per node: what the operator did (or would do) there, and why.
fn node_lines(nodes: &[NodeOutcome]) -> Value {
    nodes
        .iter()
        .map(|n| {
            json!({
                "node": n.node,
                "outcome": n.outcome,
                "refusal": n.refusal,
                "message": n.message,
                "detail": n.detail,
                "auditId": n.last_command.as_ref().map(|c| c.audit_id),
            })
        })
        .collect()
}

/// The per-node truth of a queue or divert: Ready, every node's outcome, and whether the
/// operator has acted on the latest spec yet.
fn outcome_doc<S: StatusConditions>(
    meta: &kube::api::ObjectMeta,
    status: Option<&S>,
    dry_run: bool,
    full: bool,
) -> Value {
    let conditions: Vec<Condition> = status
        .cloned()
        .map(|mut s| std::mem::take(s.conditions_mut()))
        .unwrap_or_default();
    json!({
        "name": meta.name,
        "namespace": meta.namespace,
        "paused": crate::controllers::is_paused(meta),
        "annotations": if full { json!(meta.annotations) } else { Value::Null },
        "generation": meta.generation,
        "observedGeneration": status.and_then(|s| s.observed_generation()),
        "nodesGeneration": status.and_then(|s| s.nodes_generation()),
        "dryRun": dry_run,
        "ready": condition(conditions::get(&conditions, READY)),
        "conditions": conditions
            .iter()
            .map(|c| json!({"type": c.type_, "status": c.status, "reason": c.reason, "message": c.message}))
            .collect::<Vec<_>>(),
        "nodes": node_lines(status.map(|s| s.nodes()).unwrap_or_default()),
        "lastAuditId": status.and_then(|s| s.last_audit_id()),
        "notOwned": status.and_then(|s| s.not_owned()),
    })
}

/// A queue: what it declares, its per-node outcomes and, with `full`, everything else its
/// status says (the delete preview, each node's delivery).
pub fn queue_doc(q: &ArtemisQueue, full: bool) -> Value {
    let mut doc = outcome_doc(&q.metadata, q.status.as_ref(), q.spec.dry_run, full);
    let broker_name = q.spec.name.clone().unwrap_or_else(|| q.name_any());
    doc["cluster"] = json!(q.spec.cluster_ref.name);
    doc["address"] = json!(q.spec.address.clone().unwrap_or_else(|| broker_name.clone()));
    doc["queue"] = json!(broker_name);
    doc["routingType"] = json!(q.spec.routing_type);
    doc["nodesSummary"] = json!(q.status.as_ref().and_then(|s| s.nodes_summary.clone()));
    if full {
        doc["spec"] = json!(q.spec);
        let status = q.status.clone().unwrap_or_default();
        doc["deletePreview"] = json!(status.delete_preview);
        doc["delivery"] = json!(status.delivery);
    }
    doc
}

/// A divert: what it declares and its per-node outcomes.
pub fn divert_doc(d: &ArtemisDivert, full: bool) -> Value {
    let mut doc = outcome_doc(&d.metadata, d.status.as_ref(), d.spec.dry_run, full);
    doc["cluster"] = json!(d.spec.cluster_ref.name);
    doc["address"] = json!(d.spec.address);
    doc["forwardingAddress"] = json!(d.spec.forwarding_address);
    doc["nodesSummary"] = json!(d.status.as_ref().and_then(|s| s.nodes_summary.clone()));
    if full {
        doc["spec"] = json!(d.spec);
    }
    doc
}

/// A MessageReplay: the row it names, where it is (phase, what it waits for), the preview the
/// operator shows and what the send did.
pub fn replay_doc(r: &MessageReplay) -> Value {
    let s = r.status.clone().unwrap_or_default();
    json!({
        "name": r.name_any(),
        "namespace": r.namespace(),
        "generation": r.metadata.generation,
        "observedGeneration": s.observed_generation,
        "cluster": r.spec.cluster_ref.name,
        "subscription": r.spec.subscription,
        "row": r.spec.row,
        "confirm": r.spec.confirm,
        "phase": s.phase,
        "message": s.message,
        "conditions": s.conditions
            .iter()
            .map(|c| json!({"type": c.type_, "status": c.status, "reason": c.reason, "message": c.message}))
            .collect::<Vec<_>>(),
        "preview": s.preview,
        "nodes": node_lines(&s.nodes),
        "sentMessageId": s.sent_message_id,
        "auditId": s.audit_id,
        "completedAt": s.completed_at,
    })
}

/// The operator has reported on this generation of the queue: its status describes it and its
/// nodes were judged for it.
pub fn reported(q: &ArtemisQueue, generation: i64) -> bool {
    q.status.as_ref().is_some_and(|s| {
        s.observed_generation() == Some(generation) && s.nodes_generation().is_none_or(|g| g == generation)
    })
}

/// Poll the object until `done` holds (the operator has reported on what was written), at most
/// `within`; returns it then, or what it last was (None: it is gone).
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    within: Duration,
    done: impl Fn(&K) -> bool,
) -> Result<Option<K>, ToolError>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let now = api.get_opt(name).await.map_err(|source| ToolError::Kube {
            what: format!("reading {} {name}", K::kind(&())),
            source,
        })?;
        let Some(q) = now else { return Ok(None) };
        if done(&q) || tokio::time::Instant::now() >= deadline {
            return Ok(Some(q));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The field names in `given` (a spec, or a part of one) that the kind's schema does not
/// have, as dotted paths; an open object (`x-kubernetes-preserve-unknown-fields`, or one with
/// no properties) takes any.
fn unknown_fields(given: &serde_json::Map<String, Value>, schema: &Value, prefix: &str) -> Vec<String> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return vec![];
    };
    let mut unknown = vec![];
    for (key, value) in given {
        let path = format!("{prefix}{key}");
        match (properties.get(key), value.as_object()) {
            (None, _) => unknown.push(path),
            (Some(inner), Some(object)) => unknown.extend(unknown_fields(object, inner, &format!("{path}."))),
            _ => {}
        }
    }
    unknown
}

/// Refuse a spec naming a field ArtemisQueue does not have (the API server would drop it
/// silently, and the preview would not show what the agent meant).
pub fn check_queue_fields(spec: &serde_json::Map<String, Value>) -> Result<(), ToolError> {
    let crd = serde_json::to_value(ArtemisQueue::crd()).map_err(|source| ToolError::InvalidSpec {
        kind: "ArtemisQueue",
        source,
    })?;
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let unknown = unknown_fields(spec, schema, "");
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(ToolError::UnknownFields {
            kind: "ArtemisQueue",
            fields: unknown,
        })
    }
}

/// Who the API server says this server's kubeconfig is (SelfSubjectReview), or why it cannot
/// tell.
pub async fn kube_user(client: &kube::Client) -> String {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    match reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(r) => r
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_else(|| "unknown (the API server named no user)".into()),
        Err(e) => format!("unknown (SelfSubjectReview: {})", super::kube_message(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_spec_field_is_named_with_its_path_and_known_ones_pass() {
        let spec =
            json!({"filter": "a = 1", "maxConsumer": 3, "deletion": {"policy": "Delete", "allowLoss": 1}});
        let err = check_queue_fields(spec.as_object().expect("object")).map_err(|e| e.to_string());
        let message = err.expect_err("two unknown fields");
        assert!(
            message.contains("maxConsumer") && message.contains("deletion.allowLoss"),
            "{message}"
        );
        assert!(!message.contains("filter"), "{message}");
        let fine = json!({"filter": "a = 1", "durable": true, "deletion": {"allowMessageLoss": 3}});
        assert!(check_queue_fields(fine.as_object().expect("object")).is_ok());
    }
}
