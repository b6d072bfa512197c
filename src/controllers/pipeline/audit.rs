//! audit: the audit row a command of an object writes (who, what, on which cluster and broker
//! object), and each node's outcome stamped with the command it received.

use kube::ResourceExt;
use serde_json::Value;

use super::TopologyObject;
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::controllers::{Context, actor_of, key};
use crate::store::AuditIntent;

/// The audit intent of `command` on this object: who, on which cluster and broker object, with
/// what parameters.
pub(in crate::controllers) fn intent<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: &K::Desired,
    command: &str,
    params: Value,
) -> AuditIntent {
    let ns = obj.namespace().unwrap_or_default();
    // Kubernetes records who last wrote the spec, not who deleted the object: a delete's actor
    // says exactly that much (the API server's audit log has the deleter).
    let actor = match obj.meta().deletion_timestamp {
        Some(_) => format!(
            "deleter not recorded by Kubernetes (the API server's audit log has it); last spec writer: {}",
            actor_of(obj.meta())
        ),
        None => actor_of(obj.meta()),
    };
    let mut params = params;
    let follows = ctx.take_abandoned(&obj.uid().unwrap_or_default());
    if !follows.is_empty() {
        // The commands of a stopped process on this object, recorded `unknown`: this one acts
        // on what the broker shows now, after them.
        params["follows"] = serde_json::json!(follows);
    }
    AuditIntent {
        instance_id: ctx.instance_id.clone(),
        actor,
        command: command.into(),
        cluster: key(&ns, &obj.cluster_ref().name),
        target: K::audit_target(d),
        object_kind: K::kind(&()).to_string(),
        object_namespace: ns,
        object_name: obj.name_any(),
        object_uid: obj.uid().unwrap_or_default(),
        object_generation: obj.meta().generation,
        params,
    }
}

/// The node outcomes of a command, each with the command it received.
pub(in crate::controllers) fn stamp(nodes: &mut [NodeOutcome], command: &str, audit_id: i64) {
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    for n in nodes.iter_mut().filter(|n| n.outcome != Outcome::SkippedNotLive) {
        let not_applied = if n.refusal == Some(RefusalKind::NotConverging) {
            n.detail.clone()
        } else {
            vec![]
        };
        n.last_command = Some(crate::api::LastCommand {
            command: command.to_string(),
            audit_id,
            outcome: n.outcome,
            at: at.clone(),
            not_applied,
        });
    }
}
