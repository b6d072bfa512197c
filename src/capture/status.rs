//! What capture's status writers share (pass, sample, outage): the Ready/Degraded conditions
//! from the taps' states, "nothing changed" (so a pass writes only what changed), the capture
//! finalizer, and the words of a tap not drained. Depends on no other capture module, so the
//! writers never depend on each other.

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::capture::{
    ArtemisCaptureSubscription, ArtemisCaptureSubscriptionStatus, CAPTURE_FINALIZER, TapState,
};
use crate::controllers::conditions;

pub fn not_drained(why: &str) -> String {
    format!(
        "installed, not drained ({why}): copies wait in the ring (oldest overwritten first) and this node is not covered until the drain runs (ADR-0066 D2)"
    )
}

/// Whether the subscription is armed (issue 25 item 5).
pub const ARMED: &str = "Armed";

/// Ready and Degraded from the taps' states (`no_taps`: no queue matches `queues` anywhere).
pub fn set_tap_conditions(
    status: &mut ArtemisCaptureSubscriptionStatus,
    queues: &str,
    no_taps: bool,
    generation: Option<i64>,
) {
    let count = |st: TapState| status.taps.iter().filter(|t| t.state == st).count();
    let (healthy, degraded, refused, pending) = (
        count(TapState::Healthy),
        count(TapState::Degraded),
        count(TapState::Refused),
        count(TapState::Pending),
    );
    let total = status.taps.len();
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

/// Nothing a status write would change (conditions compared without their timestamps).
pub fn same_status(old: &ArtemisCaptureSubscriptionStatus, new: &ArtemisCaptureSubscriptionStatus) -> bool {
    old.taps == new.taps
        && old.mode == new.mode
        && old.sampled_queues == new.sampled_queues
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
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": list, "resourceVersion": s.resource_version()}})),
    )
    .await?;
    Ok(())
}
