//! What the one-shot kinds share (ConnectionClose, ADR-0057 D5; MessageReplay, issue 48): a
//! command armed by compare-and-swap, sent once, never retried. Which step a pass takes is
//! decided from the stored status alone; the cluster's rules every broker write keeps are
//! checked the same way for both.

use std::sync::Arc;
use std::time::Duration;

use super::Context;
use super::runtime::{ClusterRuntime, current_topology};
use crate::api::ClusterRef;
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
