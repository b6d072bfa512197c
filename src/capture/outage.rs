//! Status while Postgres cannot be used (issue 25 item 4). No pass runs then — a pass needs the
//! cluster's advisory lock, the install records and the audit log, all in Postgres — but status
//! lives in Kubernetes, so it is still written: every tap the last pass found installed is
//! DEGRADED, because nothing it copies can be stored. The message is the drain's own state
//! (batches refused, copies held, since when) when it has a problem, else the outage itself.
//! Nothing here reads Postgres or writes to a broker.

use std::sync::Arc;

use kube::ResourceExt;

use super::drain::DrainKey;
use super::pass::DrainView;
use super::status::{not_drained, same_status, set_tap_conditions};
use crate::api::capture::{ArtemisCaptureSubscription, TapState};
use crate::controllers::Context;

/// Mark the installed taps of these subscriptions (of cluster `cluster_key`) DEGRADED, naming
/// `cause` (why Postgres cannot be used) where the drain itself reports nothing wrong yet.
pub async fn report(
    ctx: &Context,
    cluster_key: &str,
    subs: &[Arc<ArtemisCaptureSubscription>],
    drains: &DrainView<'_>,
    cause: &str,
) {
    for s in subs {
        if s.metadata.deletion_timestamp.is_some() || super::sample::is_sampling(s) {
            continue;
        }
        let Some(old) = s.status.clone() else { continue };
        let mut status = old.clone();
        for t in status
            .taps
            .iter_mut()
            .filter(|t| matches!(t.state, TapState::Healthy | TapState::Degraded))
        {
            let Some(queue) = t.capture_queue.clone() else {
                continue;
            };
            let key = DrainKey {
                cluster: cluster_key.to_string(),
                node: t.node.clone(),
                capture_queue: queue,
            };
            let why = drains.health.draining(&key, drains.within).err();
            t.state = TapState::Degraded;
            t.message = Some(not_drained(&why.unwrap_or_else(|| cause.to_string())));
        }
        // The taps not listed are HEALTHY ones (the list puts the others first): none is now.
        let c = &mut status.tap_counts;
        c.degraded += c.healthy;
        c.healthy = 0;
        let generation = s.metadata.generation;
        let no_taps = status.tap_counts.total() == 0;
        set_tap_conditions(&mut status, &s.spec.queues, no_taps, generation);
        crate::controllers::conditions::kstatus(&mut status.conditions, &[], generation);
        if same_status(&old, &status) {
            continue;
        }
        if let Err(e) = crate::controllers::report::apply_status(&ctx.client, s.as_ref(), &status).await {
            tracing::warn!(subscription = %s.name_any(), error = %e, "capture: cannot write the outage status");
        }
    }
}
