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
            let why = match drains.health.draining(&key, drains.within) {
                Err(not) => not.to_string(),
                Ok(()) => cause.to_string(),
            };
            t.state = TapState::Degraded;
            t.message = Some(not_drained(&why));
        }
        degrade_counts(&mut status);
        let generation = s.metadata.generation;
        let no_taps = status.tap_counts.total() == 0;
        set_tap_conditions(&mut status, &s.spec.queues, no_taps, generation);
        crate::controllers::conditions::kstatus(&mut status.conditions, &[], generation);
        if same_status(&old, &status) {
            continue;
        }
        if let Err(e) = crate::controllers::report::patch_whole_status(&ctx.client, s.as_ref(), &status).await
        {
            tracing::warn!(subscription = %s.name_any(), error = %e, "capture: cannot write the outage status");
        }
    }
}

/// The tap counts once every installed tap is DEGRADED (its listed taps already are). The taps
/// not listed are HEALTHY ones (the list puts the others first): none is now. A status written
/// before `tapCounts` existed (an older operator's) has none: they are counted from the list,
/// the taps not listed as the HEALTHY ones they were.
fn degrade_counts(status: &mut crate::api::capture::ArtemisCaptureSubscriptionStatus) {
    if status.tap_counts.total() < status.taps.len() as u64 {
        let mut c = super::status::count_taps(&status.taps);
        c.healthy += status.taps_omitted;
        status.tap_counts = c;
    }
    let c = &mut status.tap_counts;
    c.degraded += c.healthy;
    c.healthy = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capture::{ArtemisCaptureSubscriptionStatus, TapCounts, TapStatus};

    fn tap(state: TapState) -> TapStatus {
        TapStatus {
            address: "orders".into(),
            node: "n1".into(),
            state,
            ..Default::default()
        }
    }

    #[test]
    fn an_outage_counts_every_installed_tap_degraded_also_in_a_status_without_counts() {
        // As the last pass wrote it: 2 degraded (listed, already marked), 1 pending, 3 healthy
        // not listed.
        let listed = vec![
            tap(TapState::Degraded),
            tap(TapState::Degraded),
            tap(TapState::Pending),
        ];
        let mut current = ArtemisCaptureSubscriptionStatus {
            taps: listed.clone(),
            taps_omitted: 3,
            tap_counts: TapCounts {
                healthy: 3,
                degraded: 0,
                pending: 1,
                refused: 0,
            },
            ..Default::default()
        };
        // The listed degraded ones were healthy in the counts before the outage marked them.
        current.tap_counts.healthy += 2;
        degrade_counts(&mut current);
        let expected = TapCounts {
            healthy: 0,
            degraded: 5,
            pending: 1,
            refused: 0,
        };
        assert_eq!(current.tap_counts, expected);
        // An older operator's status: taps listed, no counts at all.
        let mut older = ArtemisCaptureSubscriptionStatus {
            taps: listed,
            taps_omitted: 3,
            ..Default::default()
        };
        degrade_counts(&mut older);
        assert_eq!(older.tap_counts, expected);
    }
}
