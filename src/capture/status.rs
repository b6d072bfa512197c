//! What capture's status writers share (pass, sample, outage): the Ready/Degraded conditions
//! from the taps' states, "nothing changed" (so a pass writes only what changed), the capture
//! finalizer, and the words of a tap not drained. Depends on no other capture module, so the
//! writers never depend on each other.

use kube::api::Patch;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::capture::{
    ArtemisCaptureSubscription, ArtemisCaptureSubscriptionStatus, CAPTURE_FINALIZER, TapCounts, TapState,
    TapStatus,
};
use crate::controllers::conditions;

pub fn not_drained(why: &str) -> String {
    format!(
        "installed, not drained ({why}): copies wait in the ring (oldest overwritten first) and this node is not covered until the drain runs (ADR-0066 D2)"
    )
}

/// Whether the subscription is armed (issue 25 item 5).
pub const ARMED: &str = "Armed";

/// The most taps and addresses a status lists (issue 25: a status stays far below etcd's
/// object limit whatever a pattern matches; 2,000 listed taps take ~560 KB, past etcd's 1.5 MiB at ~5,500).
pub const MOST_LISTED: usize = 100;

/// Set `taps` (every tap) and `addresses` (every captured address) bounded: the counts of
/// all of them, and at most [`MOST_LISTED`] of each listed — every tap a person must look at
/// (REFUSED, DEGRADED, PENDING) before the HEALTHY ones.
pub fn set_taps(
    status: &mut ArtemisCaptureSubscriptionStatus,
    mut taps: Vec<TapStatus>,
    addresses: Vec<String>,
) {
    let counts = count_taps(&taps);
    let attention = |s: TapState| match s {
        TapState::Refused => 0,
        TapState::Degraded => 1,
        TapState::Pending => 2,
        TapState::Healthy => 3,
    };
    taps.sort_by_key(|t| attention(t.state));
    status.taps_omitted = most_listed(&mut taps);
    status.taps = taps;
    status.tap_counts = counts;
    set_addresses(status, addresses);
}

/// How many of `taps` are in each state.
pub fn count_taps(taps: &[TapStatus]) -> TapCounts {
    let mut counts = TapCounts::default();
    for t in taps {
        *match t.state {
            TapState::Healthy => &mut counts.healthy,
            TapState::Degraded => &mut counts.degraded,
            TapState::Pending => &mut counts.pending,
            TapState::Refused => &mut counts.refused,
        } += 1;
    }
    counts
}

/// Keep at most [`MOST_LISTED`] of `items` (in their order); how many were left out.
pub fn most_listed<T>(items: &mut Vec<T>) -> u64 {
    let omitted = items.len().saturating_sub(MOST_LISTED) as u64;
    items.truncate(MOST_LISTED);
    omitted
}

/// `addresses` bounded: all of them counted, at most [`MOST_LISTED`] listed.
pub fn set_addresses(status: &mut ArtemisCaptureSubscriptionStatus, mut addresses: Vec<String>) {
    status.address_count = addresses.len() as u64;
    most_listed(&mut addresses);
    status.addresses = addresses;
}

/// Ready and Degraded from the taps' states (`no_taps`: no queue matches `queues` anywhere).
pub fn set_tap_conditions(
    status: &mut ArtemisCaptureSubscriptionStatus,
    queues: &str,
    no_taps: bool,
    generation: Option<i64>,
) {
    let c = status.tap_counts;
    let (healthy, degraded, refused, pending) = (c.healthy, c.degraded, c.refused, c.pending);
    let total = c.total();
    let (ready, reason, message) = if no_taps {
        (
            false,
            "NoMatchingQueues",
            format!(
                "no queue matches {:?} on any live node: nothing to capture yet",
                queues
            ),
        )
    } else if healthy == total {
        (
            true,
            "Draining",
            format!("{total} taps installed and being drained"),
        )
    } else if refused > 0 {
        (
            false,
            "Refused",
            format!("{refused} of {total} taps refused (see taps[].refusal); {healthy} healthy"),
        )
    } else if degraded > 0 {
        (
            false,
            "NotDrained",
            format!("{degraded} of {total} taps installed and not drained; {healthy} healthy"),
        )
    } else {
        (
            false,
            "Pending",
            format!("{pending} of {total} taps pending; {healthy} healthy"),
        )
    };
    let degraded_now = degraded + refused > 0;
    let degraded_reason = if refused > 0 {
        "Refused"
    } else if degraded > 0 {
        "NotDrained"
    } else {
        "AsExpected"
    };
    let degraded_message = if degraded_now {
        format!("{degraded} taps installed and not drained, {refused} refused")
    } else {
        "no tap is degraded or refused".to_string()
    };
    let judged = [
        (conditions::READY, (ready, reason, message)),
        (
            conditions::DEGRADED,
            (degraded_now, degraded_reason, degraded_message),
        ),
    ];
    conditions::set_all(&mut status.conditions, generation, judged);
}

/// A subscription whose ArtemisCluster does not exist (issue 50: never "waiting for its turn"
/// for ever): Ready=False `ClusterNotFound`, Stalled, naming the fix. Written when it changes.
pub async fn report_missing_cluster(
    client: &kube::Client,
    s: &crate::api::ArtemisCaptureSubscription,
) -> Result<(), kube::Error> {
    use kube::ResourceExt;
    let old = s.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.observed_generation = s.metadata.generation;
    status.mode = Some(s.spec.mode);
    let message = format!(
        "ArtemisCluster {}/{} does not exist: create it (and its credentials Secret), or point spec.clusterRef at an existing one; nothing is installed until then",
        s.namespace().unwrap_or_default(),
        s.spec.cluster_ref.name
    );
    let ready = (false, "ClusterNotFound", message);
    conditions::set_all(
        &mut status.conditions,
        status.observed_generation,
        [(conditions::READY, ready)],
    );
    conditions::kstatus(&mut status.conditions, &[], status.observed_generation);
    if same_status(&old, &status) && old.observed_generation == status.observed_generation {
        return Ok(());
    }
    crate::controllers::report::patch_whole_status(client, s, &status)
        .await
        .map(|_| ())
}

/// Nothing a status write would change (conditions compared without their timestamps).
pub fn same_status(old: &ArtemisCaptureSubscriptionStatus, new: &ArtemisCaptureSubscriptionStatus) -> bool {
    old.taps == new.taps
        && old.tap_counts == new.tap_counts
        && old.taps_omitted == new.taps_omitted
        && old.address_count == new.address_count
        && old.mode == new.mode
        && old.sampled_queues == new.sampled_queues
        && old.sampled_queue_counts == new.sampled_queue_counts
        && old.sampled_queues_omitted == new.sampled_queues_omitted
        && old.sampled == new.sampled
        && old.captured == new.captured
        && old.dropped_estimate == new.dropped_estimate
        && old.addresses == new.addresses
        && old.instance_id == new.instance_id
        && old.observed_generation == new.observed_generation
        && old.preview == new.preview
        && old.armed == new.armed
        && conditions::comparable(&old.conditions) == conditions::comparable(&new.conditions)
}

/// Add (`keep`) or release the capture finalizer, the one place capture writes it: a merge patch
/// of the finalizer list guarded by the resourceVersion the decision was made on (a concurrent
/// change fails the patch, and the next pass decides again). Nothing is sent when the object
/// already is as asked.
pub async fn set_finalizer(
    client: &kube::Client,
    s: &ArtemisCaptureSubscription,
    keep: bool,
) -> Result<(), kube::Error> {
    let has = s.finalizers().iter().any(|f| f == CAPTURE_FINALIZER);
    if has == keep {
        return Ok(());
    }
    let mut list: Vec<String> = s
        .finalizers()
        .iter()
        .filter(|f| *f != CAPTURE_FINALIZER)
        .cloned()
        .collect();
    if keep {
        list.push(CAPTURE_FINALIZER.to_string());
    }
    let api: Api<ArtemisCaptureSubscription> =
        Api::namespaced(client.clone(), &s.namespace().unwrap_or_default());
    api.patch(
        &s.name_any(),
        &crate::controllers::patch_params(),
        &Patch::Merge(json!({"metadata": {"finalizers": list, "resourceVersion": s.resource_version()}})),
    )
    .await?;
    Ok(())
}

/// Paused (`waits`: what the pause holds in the subscription's mode), and when the pause held a
/// write of this pass, not Ready: the held writes say why.
pub(crate) fn set_paused(
    status: &mut ArtemisCaptureSubscriptionStatus,
    s: &ArtemisCaptureSubscription,
    held: bool,
    waits: &str,
) {
    let generation = s.metadata.generation;
    let paused = crate::controllers::is_paused(&s.metadata);
    conditions::note_paused(&mut status.conditions, paused, waits, generation);
    if paused && held {
        let message = conditions::paused_message("taps to install or remove wait for the annotation to go");
        conditions::set(
            &mut status.conditions,
            conditions::READY,
            false,
            "Paused",
            message,
            generation,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap(n: usize, state: TapState) -> TapStatus {
        TapStatus {
            address: format!("orders.{n:05}"),
            node: format!("{:08x}-0000-0000-0000-000000000000", n % 2),
            state,
            capture_queue: Some(format!("$artemis-studio.capture.test-instance.orders.{n:05}.sub")),
            message: Some("installed and being drained".into()),
            captured: 12_345,
            coverage_start: Some("2026-12-01T18:00:00Z".into()),
            ..Default::default()
        }
    }

    #[test]
    fn two_thousand_taps_make_a_bounded_status_that_lists_what_needs_a_person_first() {
        let mut taps: Vec<TapStatus> = (0..2_000).map(|n| tap(n, TapState::Healthy)).collect();
        taps[1_500].state = TapState::Refused;
        taps[1_999].state = TapState::Degraded;
        let addresses: Vec<String> = (0..1_000).map(|n| format!("orders.{n:05}")).collect();
        let mut status = ArtemisCaptureSubscriptionStatus::default();
        set_taps(&mut status, taps, addresses);
        set_tap_conditions(&mut status, "orders.#", false, Some(1));

        assert_eq!(
            status.tap_counts,
            TapCounts {
                healthy: 1_998,
                degraded: 1,
                pending: 0,
                refused: 1
            }
        );
        assert_eq!((status.taps.len(), status.taps_omitted), (MOST_LISTED, 1_900));
        assert_eq!(
            (status.taps[0].state, status.taps[1].state),
            (TapState::Refused, TapState::Degraded)
        );
        assert_eq!(
            (status.addresses.len(), status.address_count),
            (MOST_LISTED, 1_000)
        );
        let ready = crate::controllers::conditions::get(&status.conditions, "Ready").expect("Ready");
        assert_eq!(
            ready.message,
            "1 of 2000 taps refused (see taps[].refusal); 1998 healthy"
        );
        let bytes = serde_json::to_vec(&status).expect("json").len();
        assert!(bytes < 64 * 1024, "{bytes} bytes of status for 2,000 taps");
    }
}
