//! Kubernetes-convention conditions: one per type, `lastTransitionTime` kept while the status
//! does not change, `observedGeneration` on each.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::Condition;

pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
pub const DIVERGED: &str = "Diverged";

/// Set (or replace) the condition of `type_`.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let message = message.into();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time: now,
        }),
    }
}

/// The conditions without their transition times (to decide whether status changed).
pub fn comparable(conditions: &[Condition]) -> Vec<(String, String, String, String, Option<i64>)> {
    conditions
        .iter()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
                c.observed_generation,
            )
        })
        .collect()
}
