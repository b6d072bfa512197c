//! What the one-shot kinds share (ConnectionClose, ADR-0057 D5; MessageReplay, issue 48): a
//! command armed by compare-and-swap, sent once, never retried. Which step a pass takes is
//! decided from the stored status alone; the cluster's rules every broker write keeps are
//! checked the same way for both.

use std::sync::Arc;
use std::time::Duration;

use super::runtime::{ClusterRuntime, current_topology};
use super::{Context, conditions};
use crate::api::{ClusterRef, Condition};
use crate::topology::Topology;

/// How long a command armed by another process is left alone: that process may be calling
/// the broker right now. After it, the command is Failed with its outcome unknown.
pub const ARMED_GRACE: Duration = Duration::from_secs(30);

/// What a pass does with a one-shot command in its stored phase, decided from the status alone.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Nothing now; look again after this long (None: when the object changes).
    Wait(Option<Duration>),
    /// Finished and past `ttlSecondsAfterFinished`: delete the object.
    DeleteObject,
    /// Armed by a process that did not record the outcome: Failed, outcome unknown, never
    /// called again.
    FailUnknown,
    /// Not armed yet: read the target, show the consequence, arm when confirmed.
    Act,
}

/// The stored status, as far as the step depends on it.
#[derive(Clone, Copy, Debug)]
pub struct Stored<'a> {
    pub finished: bool,
    pub armed: bool,
    pub armed_by: Option<&'a str>,
    pub armed_at: Option<&'a str>,
    pub completed_at: Option<&'a str>,
}

pub fn step(
    stored: Stored<'_>,
    ttl_after_finished: Option<i64>,
    process_id: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Step {
    let since = |t: Option<&str>| {
        t.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| now.signed_duration_since(t))
    };
    if stored.finished {
        let Some(ttl) = ttl_after_finished else {
            return Step::Wait(None);
        };
        let left = since(stored.completed_at).map_or(0, |d| ttl - d.num_seconds());
        return if left <= 0 {
            Step::DeleteObject
        } else {
            Step::Wait(Some(Duration::from_secs(left as u64)))
        };
    }
    if !stored.armed {
        return Step::Act;
    }
    let mine = stored.armed_by == Some(process_id);
    let armed_for = since(stored.armed_at).and_then(|d| d.to_std().ok());
    match armed_for
        .filter(|_| !mine)
        .and_then(|d| ARMED_GRACE.checked_sub(d))
    {
        // Another process armed it moments ago and may be calling the broker now.
        Some(left) => Step::Wait(Some(left + Duration::from_secs(1))),
        None => Step::FailUnknown,
    }
}

/// The rules every broker write keeps: the cluster's current topology, its clients' access
/// read from the Secrets as they are now (a revoked credential is never used). `Err`: the
/// condition reason and message saying why not.
pub async fn usable_cluster(
    ctx: &Context,
    ns: &str,
    cluster: &ClusterRef,
) -> Result<(Arc<ClusterRuntime>, Arc<Topology>), (&'static str, String)> {
    match current_topology(ctx, ns, &cluster.name, None).await {
        Ok((rt, topology)) => {
            let used = &topology.secret_versions;
            match super::pipeline::ensure_credentials(ctx, ns, &cluster.name, used).await {
                Ok(()) => Ok((rt, topology)),
                Err(e) => Err((e.reason(), e.to_string())),
            }
        }
        Err(e) => match super::pipeline::dereference_cluster(ctx, ns, cluster) {
            Err(why) => Err((why.reason(), why.to_string())),
            Ok(_) => Err(("ClusterNotReady", e.to_string())),
        },
    }
}

/// Where a one-shot command is, as far as its conditions go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Pending,
    AwaitingConfirmation,
    /// Armed: being sent.
    InFlight,
    Completed,
    Failed,
}

/// A kind's words for its stages: the reasons of `Complete`, `Failed` and `Ready`.
#[derive(Clone, Copy, Debug)]
pub struct Reasons {
    /// Completed: `Complete`, `Failed` and `Ready` reason.
    pub done: &'static str,
    /// Failed: the `Complete` reason.
    pub not_done: &'static str,
    /// Failed: the `Failed` and `Ready` reason.
    pub failed: &'static str,
    /// Pending or in flight: the `Ready` reason.
    pub in_flight: &'static str,
}

const COMPLETE: &str = "Complete";
const FAILED: &str = "Failed";

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A finished command's `Complete` and `Failed` (what `kubectl wait` reads), both saying
/// `message`.
pub fn set_finished(
    conditions: &mut Vec<Condition>,
    done: bool,
    r: Reasons,
    message: &str,
    generation: Option<i64>,
) {
    let (complete, failed) = if done {
        (r.done, r.done)
    } else {
        (r.not_done, r.failed)
    };
    conditions::set(conditions, COMPLETE, done, complete, message, generation);
    conditions::set(conditions, FAILED, !done, failed, message, generation);
}

/// Ready, Reconciling and Stalled from the stage (Flux, kstatus; `Complete`/`Failed` stay for
/// `kubectl wait`): Completed is Ready; Failed, and a command waiting for its confirmation,
/// need a person; Pending and in flight are on their way — but a command not started because
/// its cluster cannot be used (`Complete=False` while Pending) says why in Ready (a missing
/// cluster is for a person to fix).
pub fn stage_conditions(
    conditions: &mut Vec<Condition>,
    stage: Stage,
    r: Reasons,
    message: String,
    generation: Option<i64>,
) {
    let not_started = conditions::get(conditions, COMPLETE)
        .filter(|c| stage == Stage::Pending && c.status == "False")
        .map(|c| (c.reason.clone(), c.message.clone()));
    let (ready, reason, message) = match (stage, &not_started) {
        (Stage::Completed, _) => (true, r.done, message),
        (Stage::Failed, _) => (false, r.failed, message),
        (Stage::AwaitingConfirmation, _) => (false, "AwaitingConfirmation", message),
        (Stage::Pending, Some((reason, why))) => (false, reason.as_str(), why.clone()),
        (Stage::Pending | Stage::InFlight, _) => (false, r.in_flight, message),
    };
    let judged = [(conditions::READY, (ready, reason, message))];
    conditions::set_all(conditions, generation, judged);
    conditions::kstatus(conditions, &[], generation);
}
