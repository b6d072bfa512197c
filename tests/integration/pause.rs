//! The pause rule holds for every kind (issue 24): `artemis-studio.io/paused: "true"` on a
//! ConnectionClose or an ArtemisCaptureSubscription holds every broker write of it, as it does
//! for queues and diverts (`queue::a_paused_object_makes_no_broker_writes`). Each test starts
//! from state on the brokers (a connected client, a queue made behind the operator's back) and
//! proves "nothing was sent" from a status the operator wrote after judging the pause.

use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use artemis_studio_operator::api::Condition;
use artemis_studio_operator::api::capture::{ArtemisCaptureSubscription, TapState};
use artemis_studio_operator::api::connection_close::{ClosePhase, ConnectionClose};

use crate::capture::{broker_queue, divert_names, taps_in};
use crate::queue::{Fixture, fixture};
use crate::support::{amqp_consumer, brokers_shared, connection_of, short_id, wait_until};

const PAUSED: &str = "artemis-studio.io/paused";

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

async fn set_paused<K>(api: &Api<K>, name: &str, paused: bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let value = if paused { json!("true") } else { Value::Null };
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {PAUSED: value}}})),
    )
    .await
    .expect("patch the pause annotation");
}

async fn audit_rows(f: &Fixture, command: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE command = $1 AND object_namespace = $2")
        .bind(command)
        .bind(&f.ns)
        .fetch_one(f.op.store.pool())
        .await
        .expect("count audit rows")
}

/// On how many of cluster c's brokers the divert `divert` is.
async fn diverts_on_every_node(f: &Fixture, divert: &str) -> usize {
    let mut n = 0;
    for b in f.bed.cluster_brokers("c") {
        n += usize::from(divert_names(&f.bed, &b).await.iter().any(|d| d == divert));
    }
    n
}

#[tokio::test]
async fn a_paused_close_is_confirmed_and_shown_but_never_sent_until_the_annotation_goes() {
    let _b = brokers_shared().await;
    let f = fixture("pause-close", None).await;
    let queue = f.queue_on("paused").await;
    let client = format!("paused-app-{}", short_id());
    let _consumer = amqp_consumer(&f.bed, "c1", &queue, &client).await;
    let (node, m) = f.broker("c1").await;
    let connection = connection_of(&m, &client).await.expect("connection");
    let close: ConnectionClose = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
        "metadata": {"name": "held", "annotations": {
            PAUSED: "true", "artemis-studio.io/confirm-without-review": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "target": {"node": node, "connectionId": connection},
                 "confirm": client},
    }))
    .expect("close json");
    let api = f.closes();
    api.create(&PostParams::default(), &close)
        .await
        .expect("create close");
    // Positive evidence: the pass that read the target and judged the pause wrote Paused=True.
    let held = wait_until("the close judged paused", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let c = api.get("held").await.ok()?;
            let s = c.status.clone()?;
            condition(&s.conditions, "Paused").filter(|p| p.status == "True")?;
            Some(s)
        }
    })
    .await;
    assert_eq!(held.phase, ClosePhase::AwaitingConfirmation);
    assert!(held.snapshot.is_some(), "who it would disconnect is shown");
    assert!(held.audit_id.is_none() && held.armed_by.is_none(), "{held:?}");
    assert_eq!(audit_rows(&f, "connection.close").await, 0);
    assert!(connection_of(&m, &client).await.is_some(), "still connected");

    set_paused(&api, "held", false).await;
    let done = f.wait_phase("held", ClosePhase::Completed).await;
    let status = done.status.expect("status");
    assert!(status.audit_id.is_some());
    let p = condition(&status.conditions, "Paused").expect("Paused");
    assert_eq!(p.status, "False");
    assert_eq!(audit_rows(&f, "connection.close").await, 1);
    wait_until("the client is disconnected", Duration::from_secs(30), || async {
        connection_of(&m, &client).await.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_paused_subscription_installs_and_removes_no_tap_until_the_annotation_goes() {
    let _b = brokers_shared().await;
    let f = fixture("pause-cap", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("pause.{id}.orders");
    broker_queue(&f.bed, &address).await;
    let sub: ArtemisCaptureSubscription = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
        "metadata": {"name": "held", "annotations": {
            PAUSED: "true", "artemis-studio.io/confirm-without-review": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "queues": format!("pause.{id}.#"), "ringSize": 50},
    }))
    .expect("subscription json");
    let api = f.subscriptions();
    api.create(&PostParams::default(), &sub)
        .await
        .expect("create subscription");
    let divert = f.tap(&address, "held").divert();
    let diverts_present = || diverts_on_every_node(&f, &divert);

    // Paused from its creation: a pass judged it (Ready=False, reason Paused) and installed nothing.
    f.wait_subscription("held", "held by the pause", |s| {
        s.status.as_ref().is_some_and(|st| {
            condition(&st.conditions, "Ready").is_some_and(|r| r.reason == "Paused")
                && condition(&st.conditions, "Paused").is_some_and(|p| p.status == "True")
        })
    })
    .await;
    f.later_passes(2).await;
    assert_eq!(diverts_present().await, 0, "no tap installed while paused");
    assert_eq!(f.capture_audit_rows("capture.install").await.len(), 0);

    // Unpaused: installed on every node.
    set_paused(&api, "held", false).await;
    f.wait_subscription("held", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    assert_eq!(diverts_present().await, 3);

    // Paused, then deleted: the taps stay and the finalizer waits.
    set_paused(&api, "held", true).await;
    f.wait_subscription("held", "Paused=True", |s| {
        s.status
            .as_ref()
            .is_some_and(|st| condition(&st.conditions, "Paused").is_some_and(|p| p.status == "True"))
    })
    .await;
    api.delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    f.later_passes(2).await;
    let still = api
        .get("held")
        .await
        .expect("the subscription waits for its finalizer");
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(diverts_present().await, 3, "no tap removed while paused");
    assert_eq!(f.capture_audit_rows("capture.remove").await.len(), 0);

    // Unpaused: swept, then gone.
    set_paused(&api, "held", false).await;
    f.wait_subscription_gone("held").await;
    assert_eq!(diverts_present().await, 0);
    assert_eq!(f.capture_audit_rows("capture.remove").await.len(), 1);
}

/// Mode Sample writes nothing to a broker but the sweep of the taps the subscription had: a
/// paused one switched to Sample keeps them, and says so (Paused, and Ready=False for the held
/// sweep) until the annotation goes — then they are swept and Paused is False again.
#[tokio::test]
async fn a_paused_subscription_switched_to_sample_keeps_its_taps_and_says_why() {
    let _b = brokers_shared().await;
    let f = fixture("pause-sample", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("pause.{id}.sampled");
    broker_queue(&f.bed, &address).await;
    let sub: ArtemisCaptureSubscription = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
        "metadata": {"name": "sampled", "annotations": {
            "artemis-studio.io/confirm-without-review": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "queues": format!("pause.{id}.#"), "ringSize": 50},
    }))
    .expect("subscription json");
    let api = f.subscriptions();
    api.create(&PostParams::default(), &sub)
        .await
        .expect("create subscription");
    f.wait_subscription("sampled", "3 taps drained", |s| {
        taps_in(s, TapState::Healthy) == 3
    })
    .await;
    let divert = f.tap(&address, "sampled").divert();
    let diverts_present = || diverts_on_every_node(&f, &divert);
    assert_eq!(diverts_present().await, 3);

    // Paused and switched to Sample in one change: the sweep is held, and the status says why.
    api.patch(
        "sampled",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {PAUSED: "true"}},
                              "spec": {"mode": "Sample", "sampleIntervalSeconds": 1}})),
    )
    .await
    .expect("pause and switch to Sample");
    let paused = |st: &artemis_studio_operator::api::capture::ArtemisCaptureSubscriptionStatus| {
        condition(&st.conditions, "Paused").map(|p| p.status.clone())
    };
    f.wait_subscription("sampled", "sampling, its sweep held by the pause", |s| {
        s.status.as_ref().is_some_and(|st| {
            st.mode == Some(artemis_studio_operator::api::capture::CaptureMode::Sample)
                && paused(st).as_deref() == Some("True")
                && condition(&st.conditions, "Ready").is_some_and(|r| r.reason == "Paused")
        })
    })
    .await;
    f.later_passes(2).await;
    assert_eq!(diverts_present().await, 3, "no tap removed while paused");
    assert_eq!(f.capture_audit_rows("capture.remove").await.len(), 0);

    // Unpaused: swept, and no longer claimed paused.
    set_paused(&api, "sampled", false).await;
    f.wait_subscription("sampled", "Paused=False in mode Sample", |s| {
        s.status
            .as_ref()
            .is_some_and(|st| paused(st).as_deref() == Some("False"))
    })
    .await;
    wait_until("the taps swept", Duration::from_secs(60), || async {
        (diverts_present().await == 0).then_some(())
    })
    .await;
    assert_eq!(f.capture_audit_rows("capture.remove").await.len(), 1);
    api.delete("sampled", &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_subscription_gone("sampled").await;
}
