//! Issue 48 (replay): a message captured for real, sent again by a MessageReplay — previewed,
//! held on a wrong confirmation, sent exactly once though three processes of one installation
//! race for it; a row whose body was truncated at capture is refused. Counted on the broker.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use artemis_studio_operator::api::capture::TapState;
use artemis_studio_operator::api::message_replay::{MessageReplay, ReplayPhase};

use crate::capture::{broker_queue, queue_attr, taps_in};
use crate::queue::{Fixture, fixture};
use crate::reading::{Amqp, text, wait_stored};
use crate::support::{brokers_shared, jolokia_raw, short_id, wait_ready, wait_until};

/// A fixture whose subscription `rep` captured one text message (`color=red`) sent to a fresh
/// queue on c1: the fixture, the address and the row.
pub async fn captured(prefix: &str, max_body_bytes: Option<u32>, body: &str) -> (Fixture, String, i64) {
    let f = fixture(prefix, None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("replay.{id}");
    broker_queue(&f.bed, &address).await;
    let mut spec = json!({"queues": address});
    if let Some(max) = max_body_bytes {
        spec["maxBodyBytes"] = json!(max);
    }
    f.subscribe("rep", spec).await;
    f.wait_subscription("rep", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    let mut producer = Amqp::open(&f.bed, "c1", &format!("replay-p-{id}")).await;
    producer
        .send(&address, vec![text(body, &[("color", "red")])])
        .await;
    producer.close().await;
    wait_stored(&f, "rep", 1).await;
    let row: i64 = sqlx::query_scalar("SELECT row_id FROM captured_message WHERE subscription = 'rep'")
        .fetch_one(f.op.store.pool())
        .await
        .expect("the row");
    (f, address, row)
}

fn replays(f: &Fixture) -> Api<MessageReplay> {
    Api::namespaced(f.admin.clone(), &f.ns)
}

async fn create_replay(f: &Fixture, name: &str, row: i64, extra: Value) {
    let mut spec = json!({"clusterRef": {"name": "c"}, "subscription": "rep", "row": row});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let r: MessageReplay = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "MessageReplay",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("replay json");
    replays(f)
        .create(&PostParams::default(), &r)
        .await
        .expect("create MessageReplay");
}

async fn wait_replay(
    f: &Fixture,
    name: &str,
    what: &str,
    check: impl Fn(&MessageReplay) -> bool,
) -> MessageReplay {
    let api = replays(f);
    let check = &check;
    wait_until(
        &format!("MessageReplay {name}: {what}"),
        Duration::from_secs(120),
        || {
            let api = api.clone();
            async move { api.get(name).await.ok().filter(|r| check(r)) }
        },
    )
    .await
}

fn phase(r: &MessageReplay) -> Option<ReplayPhase> {
    r.status.as_ref().map(|s| s.phase)
}

fn observed(r: &MessageReplay) -> bool {
    r.status.as_ref().and_then(|s| s.observed_generation) == r.metadata.generation
}

async fn on_c1(f: &Fixture, address: &str) -> Value {
    queue_attr(&f.bed, &f.bed.broker("c1"), address, "MessageCount").await
}

async fn replay_rows(f: &Fixture) -> Vec<(String, Value, Value)> {
    sqlx::query_as(
        "SELECT outcome, params, outcome_detail FROM audit_event WHERE command = 'message.replay' ORDER BY id",
    )
    .fetch_all(f.op.store.pool())
    .await
    .expect("audit rows")
}

/// The messages on c1's queue that carry this replay's property.
async fn replayed_on_c1(f: &Fixture, address: &str, replay: &str) -> Vec<Value> {
    let c1 = f.bed.broker("c1");
    let mbean = format!(
        "org.apache.activemq.artemis:broker=\"c1\",component=addresses,address=\"{address}\",subcomponent=queues,routing-type=\"anycast\",queue=\"{address}\""
    );
    let filter = format!("ArtemisStudioReplay = '{}/{replay}'", f.ns);
    let (_, body) = jolokia_raw(
        &c1,
        &f.bed.broker_user(),
        Some("http://localhost"),
        json!({"type": "exec", "mbean": mbean, "operation": "listMessagesAsJSON(java.lang.String)", "arguments": [filter]}),
    )
    .await;
    serde_json::from_str(body["value"].as_str().unwrap_or("[]")).unwrap_or_default()
}

#[tokio::test]
async fn a_replay_is_previewed_held_on_a_wrong_confirmation_and_sent_once_by_racing_processes() {
    let _b = brokers_shared().await;
    let (f, address, row) = captured("replay", None, "replay me").await;
    assert_eq!(on_c1(&f, &address).await, json!(1), "the original waits on c1");
    create_replay(&f, "again", row, json!({})).await;
    let r = wait_replay(&f, "again", "previewed, awaiting confirmation", |r| {
        phase(r) == Some(ReplayPhase::AwaitingConfirmation)
    })
    .await;
    let status = r.status.expect("status");
    let preview = status.preview.expect("preview");
    let c1 = crate::cluster_core::node_id_of(&f.bed, "c1").await;
    assert_eq!(
        (preview.address.as_str(), preview.node.as_str()),
        (address.as_str(), c1.as_str())
    );
    assert_eq!((preview.body.as_str(), preview.body_bytes), ("text", 9));
    assert!(!preview.truncated);
    assert_eq!(preview.properties.get("color").map(String::as_str), Some("red"));
    let name = format!("{}/again", f.ns);
    assert_eq!(
        preview.properties.get("ArtemisStudioReplay"),
        Some(&name),
        "{preview:?}"
    );
    assert!(preview.consequence.contains("new message id"), "{preview:?}");

    // A wrong confirmation: seen (generation 2 observed), nothing sent.
    let patch = |confirm: &str| Patch::Merge(json!({"spec": {"confirm": confirm}}));
    replays(&f)
        .patch("again", &PatchParams::default(), &patch("orders"))
        .await
        .expect("confirm wrongly");
    let r = wait_replay(&f, "again", "the wrong confirmation judged", |r| {
        observed(r) && r.metadata.generation == Some(2)
    })
    .await;
    assert_eq!(phase(&r), Some(ReplayPhase::AwaitingConfirmation));
    let message = r.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("spec.confirm says \"orders\""), "{message}");
    assert_eq!(on_c1(&f, &address).await, json!(1), "nothing sent");
    assert!(replay_rows(&f).await.is_empty());

    // Two more processes of this installation, on its database, race the fixture's for it.
    let base = 20_000 + (std::process::id() % 400) as u16;
    let env = [("INSTANCE_ID", f.op.ctx.instance_id.as_str())];
    let _a = f.bed.spawn_operator(&f.ns, &f.op.db, base, &env);
    let _b2 = f.bed.spawn_operator(&f.ns, &f.op.db, base + 400, &env);
    let http = reqwest::Client::new();
    for port in [base, base + 400] {
        wait_ready(&http, port).await;
    }
    replays(&f)
        .patch("again", &PatchParams::default(), &patch(&address))
        .await
        .expect("confirm");
    let r = wait_replay(&f, "again", "Completed", |r| {
        phase(r) == Some(ReplayPhase::Completed)
    })
    .await;
    let sent = r
        .status
        .and_then(|s| s.sent_message_id)
        .expect("the new message's id");
    // Every process has reconciled it (its metrics count MessageReplay passes) ...
    for port in [base, base + 400] {
        wait_until(
            &format!("the process on {port} reconciled the replay"),
            Duration::from_secs(60),
            || {
                let http = http.clone();
                async move {
                    let body = crate::support::metrics(&http, port).await;
                    body.lines()
                        .any(|l| l.starts_with("artemis_studio_reconciles_total{kind=\"MessageReplay\""))
                        .then_some(())
                }
            },
        )
        .await;
    }
    // ... and one message was sent, once, by one audited command.
    assert_eq!(on_c1(&f, &address).await, json!(2), "the original and one replay");
    let copies = replayed_on_c1(&f, &address, "again").await;
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(copies[0]["color"], json!("red"), "{copies:?}");
    let rows = replay_rows(&f).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (outcome, params, detail) = &rows[0];
    assert_eq!(outcome, "succeeded");
    assert_eq!(
        (params["row"].clone(), params["address"].clone()),
        (json!(row), json!(address))
    );
    assert!(
        detail.to_string().contains(&sent),
        "the new message id in the audit row: {detail}"
    );
}

#[tokio::test]
async fn a_row_truncated_at_capture_is_refused_and_nothing_is_sent() {
    let _b = brokers_shared().await;
    let (f, address, row) = captured("replay-cut", Some(8), "a body longer than eight bytes").await;
    let cut: bool = sqlx::query_scalar("SELECT body_truncated FROM captured_message WHERE row_id = $1")
        .bind(row)
        .fetch_one(f.op.store.pool())
        .await
        .expect("the row");
    assert!(cut, "the bed stored the body cut at 8 bytes");
    // Confirmed at creation, without review: only the row's truncation stands in the way.
    let r: MessageReplay = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "MessageReplay",
        "metadata": {"name": "cut", "annotations": {"artemis-studio.io/confirm-without-review": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "subscription": "rep", "row": row, "confirm": address}
    }))
    .expect("replay json");
    replays(&f)
        .create(&PostParams::default(), &r)
        .await
        .expect("create MessageReplay");
    let r = wait_replay(&f, "cut", "Failed", |r| phase(r) == Some(ReplayPhase::Failed)).await;
    let message = r.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains("truncated at capture") && message.contains("never sent"),
        "{message}"
    );
    assert_eq!(on_c1(&f, &address).await, json!(1), "only the original");
    assert!(replay_rows(&f).await.is_empty(), "no command, no audit row");
}

/// A SIGKILL between arming (Sending and the audit intent persisted) and the send: the next
/// process finds it armed by a process that is gone — Failed, outcome unknown, its audit row
/// `unknown` — and never sends (the broker holds only the original).
#[tokio::test]
async fn a_sigkill_after_arming_fails_the_replay_with_an_unknown_outcome_and_never_sends() {
    let _b = brokers_shared().await;
    let (f, address, row) = captured("replay-kill", None, "replay me once").await;
    // Only spawned processes act from here: the fixture's stops (the row is stored).
    f.op.stop();
    let marker = std::env::temp_dir().join(format!("replay-armed-{}", short_id()));
    let marker_path = marker.to_string_lossy().to_string();
    let port = 20_800 + (std::process::id() % 300) as u16;
    let instance = f.op.ctx.instance_id.clone();
    let env = [
        ("INSTANCE_ID", instance.as_str()),
        ("ARTEMIS_STUDIO_TEST_PAUSE_AFTER_ARM", marker_path.as_str()),
    ];
    let mut first = f.bed.spawn_operator(&f.ns, &f.op.db, port, &env);
    let r: MessageReplay = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "MessageReplay",
        "metadata": {"name": "armed", "annotations": {"artemis-studio.io/confirm-without-review": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "subscription": "rep", "row": row, "confirm": address}
    }))
    .expect("replay json");
    replays(&f)
        .create(&PostParams::default(), &r)
        .await
        .expect("create MessageReplay");
    wait_until(
        "the first process armed the replay and paused",
        Duration::from_secs(120),
        || {
            let marker = marker.clone();
            async move { marker.exists().then_some(()) }
        },
    )
    .await;
    let armed = replays(&f).get("armed").await.expect("get");
    assert_eq!(phase(&armed), Some(ReplayPhase::Sending));
    assert!(
        armed.status.and_then(|s| s.audit_id).is_some(),
        "the audit id is in status before the send"
    );
    first.0.kill().expect("SIGKILL");
    let _ = first.0.wait();
    let _second = f.bed.spawn_operator(&f.ns, &f.op.db, port + 1, &env[..1]);
    let r = wait_replay(&f, "armed", "Failed", |r| phase(r) == Some(ReplayPhase::Failed)).await;
    let message = r.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("outcome unknown, not retried"), "{message}");
    let rows = replay_rows(&f).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, "unknown");
    assert_eq!(
        on_c1(&f, &address).await,
        json!(1),
        "never sent: only the original"
    );
    let _ = std::fs::remove_file(&marker);
}

/// The pause rule holds for a replay (issue 24): confirmed and paused, it sends nothing and says
/// so (a status written after the pause was judged); the annotation removed, it is sent.
#[tokio::test]
async fn a_paused_replay_sends_nothing_until_the_annotation_goes() {
    let _b = brokers_shared().await;
    let (f, address, row) = captured("replay-pause", None, "held back").await;
    let r: MessageReplay = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "MessageReplay",
        "metadata": {"name": "held", "annotations": {
            "artemis-studio.io/confirm-without-review": "true", "artemis-studio.io/paused": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "subscription": "rep", "row": row, "confirm": address}
    }))
    .expect("replay json");
    replays(&f)
        .create(&PostParams::default(), &r)
        .await
        .expect("create MessageReplay");
    let paused = |r: &MessageReplay| {
        r.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Paused" && c.status == "True")
        })
    };
    let r = wait_replay(&f, "held", "paused, judged", paused).await;
    assert_eq!(phase(&r), Some(ReplayPhase::AwaitingConfirmation));
    assert_eq!(on_c1(&f, &address).await, json!(1), "nothing sent");
    assert!(replay_rows(&f).await.is_empty());
    let resume = json!({"metadata": {"annotations": {"artemis-studio.io/paused": null}}});
    replays(&f)
        .patch("held", &PatchParams::default(), &Patch::Merge(resume))
        .await
        .expect("resume");
    wait_replay(&f, "held", "Completed", |r| {
        phase(r) == Some(ReplayPhase::Completed)
    })
    .await;
    assert_eq!(on_c1(&f, &address).await, json!(2), "the original and one replay");
}
