//! Issue 48's decisions for one MessageReplay, pure: what a captured row becomes when sent
//! again (or why it is never sent), the preview a person confirms, and the status each stage
//! ends in. No broker, API server or database is touched here.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::super::conditions;
use super::super::one_shot::{self, Step, now};
use crate::api::message_replay::{
    MessageReplay, MessageReplayStatus, REPLAY_PROPERTY, ReplayPhase, ReplayPreview,
};
use crate::api::{NodeOutcome, Outcome};
use crate::broker::messages::SentBody;
use crate::store::replay::ReplaySource;

const COMPLETE: &str = "Complete";

/// The broker's own properties (`_AMQ_` prefix) are never sent again: a copied duplicate id
/// (`_AMQ_DUPL_ID`) would make the broker drop the replay as a duplicate, and the original's
/// routing marks describe the original, not the new message.
const BROKER_PROPERTY_PREFIX: &str = "_AMQ_";

/// How a pass ends: the status to write and when to look again.
#[derive(Debug, PartialEq)]
pub struct Verdict {
    pub status: MessageReplayStatus,
    pub then: Action,
}

pub fn step(
    status: &MessageReplayStatus,
    ttl_after_finished: Option<i64>,
    process_id: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Step {
    let stored = one_shot::Stored {
        finished: matches!(status.phase, ReplayPhase::Completed | ReplayPhase::Failed),
        armed: status.phase == ReplayPhase::Sending,
        armed_by: status.armed_by.as_deref(),
        armed_at: status.armed_at.as_deref(),
        completed_at: status.completed_at.as_deref(),
    };
    one_shot::step(stored, ttl_after_finished, process_id, now)
}

/// What is sent: the body, the properties, where.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub node: String,
    pub address: String,
    pub body: SentBody,
    pub properties: BTreeMap<String, String>,
}

/// Why a captured row is never sent: it is not the message as it was routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsendable {
    #[error("row {0} was sampled (a browse saw it), not captured: only a captured copy is replayed")]
    Sampled(i64),
    #[error(
        "row {0}'s body was truncated at capture (the subscription's maxBodyBytes): a partial body is never sent"
    )]
    Truncated(i64),
    #[error(
        "row {row} was changed so that Postgres could store it ({changes}): it is not the message as sent, and is never replayed"
    )]
    Changed { row: i64, changes: String },
    #[error(
        "row {0}'s body is an AMQP sequence: the broker's management sendMessage carries text or bytes only"
    )]
    Sequence(i64),
    #[error(
        "row {0} does not record how its body was stored (stored before body kinds were recorded): it is never replayed"
    )]
    BodyKindUnknown(i64),
}

/// The captured row as it will be sent, or why it never is: a body cut at capture, changed to
/// be stored, or of a kind the broker's `sendMessage` cannot carry is refused, never sent in
/// part.
pub fn plan(o: &MessageReplay, row: &ReplaySource) -> Result<Planned, Unsendable> {
    let id = row.row_id;
    if row.origin == "sampled" {
        return Err(Unsendable::Sampled(id));
    }
    if row.body_truncated {
        return Err(Unsendable::Truncated(id));
    }
    if let Some(changed) = row.escaped.as_ref().filter(|e| !e.is_empty()) {
        return Err(Unsendable::Changed {
            row: id,
            changes: changed.join("; "),
        });
    }
    let body = match (row.body_kind.as_deref(), &row.body_text, &row.body_binary) {
        (Some("data"), _, bytes) => SentBody::Bytes(bytes.clone().unwrap_or_default()),
        (Some("amqp-value"), Some(text), _) => SentBody::Text(text.clone()),
        (Some("amqp-value"), None, Some(bytes)) => SentBody::Bytes(bytes.clone()),
        (Some("amqp-value" | "empty"), None, None) => SentBody::Empty,
        (Some("amqp-sequence"), ..) => return Err(Unsendable::Sequence(id)),
        _ => return Err(Unsendable::BodyKindUnknown(id)),
    };
    Ok(Planned {
        node: o.spec.node.clone().unwrap_or_else(|| row.node.clone()),
        address: o
            .spec
            .address
            .clone()
            .unwrap_or_else(|| row.original_address.clone()),
        body,
        properties: properties_of(o, row),
    })
}

/// The original's application properties as the strings the broker will hold, without the
/// broker's own, plus the one naming this replay.
fn properties_of(o: &MessageReplay, row: &ReplaySource) -> BTreeMap<String, String> {
    let mut properties: BTreeMap<String, String> = row
        .properties
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| !k.starts_with(BROKER_PROPERTY_PREFIX) && !v.is_null())
        .map(|(k, v)| {
            let text = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
            (k.clone(), text)
        })
        .collect();
    let name = format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
    properties.insert(REPLAY_PROPERTY.to_string(), name);
    properties
}

/// The preview a person confirms (stated before the replay can be armed).
pub fn preview(planned: &Planned, row: &ReplaySource) -> ReplayPreview {
    ReplayPreview {
        node: planned.node.clone(),
        address: planned.address.clone(),
        source_address: row.original_address.clone(),
        body: planned.body.kind().to_string(),
        body_bytes: i64::try_from(planned.body.len()).unwrap_or(i64::MAX),
        properties: planned.properties.clone(),
        truncated: row.body_truncated,
        consequence: consequence(&planned.body),
    }
}

fn consequence(body: &SentBody) -> String {
    let body = match body {
        SentBody::Text(_) => "a text body",
        SentBody::Bytes(_) => "a bytes body",
        SentBody::Empty => "no body",
    };
    format!(
        "sends one new durable message with {body}, a new message id and the properties listed (as strings; the broker's own _AMQ_ properties are not copied), once: it is not the original message, and consumers of the address receive it as any other. Never retried"
    )
}

/// The row was not found or cannot be sent: Failed for good (a replay is never retried).
pub fn refuse(status: &mut MessageReplayStatus, message: String, generation: Option<i64>) -> Verdict {
    finish(status, ReplayPhase::Failed, message, generation);
    Verdict {
        status: status.clone(),
        then: Action::await_change(),
    }
}

/// The rules every broker write keeps did not hold (cluster, Secrets, topology, the node not
/// live): nothing is sent; look again soon. The replay is Pending again, Ready saying why (its
/// confirmation still holds: it depends on the preview shown and the generation).
pub fn not_usable(
    status: &mut MessageReplayStatus,
    generation: Option<i64>,
    reason: &str,
    message: String,
) -> Verdict {
    status.phase = ReplayPhase::Pending;
    status.message = Some(message.clone());
    conditions::set(
        &mut status.conditions,
        COMPLETE,
        false,
        reason,
        message,
        generation,
    );
    Verdict {
        status: status.clone(),
        then: Action::requeue(Duration::from_secs(5)),
    }
}

/// The documented annotation: automation confirms without review (recorded in the audit row).
pub fn without_review(o: &MessageReplay) -> bool {
    o.annotations()
        .get(crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// Confirmed by a person who saw this preview: `spec.confirm` names the address shown, given
/// after the preview was shown (a later generation) — else the replay waits, saying what to do.
pub fn judge_confirmation(
    o: &MessageReplay,
    preview: ReplayPreview,
    status: &mut MessageReplayStatus,
) -> ControlFlow<Verdict> {
    let generation = o.metadata.generation;
    let shown_before = status.preview.as_ref() == Some(&preview)
        && status
            .shown_generation
            .is_some_and(|s| generation.is_some_and(|g| g > s));
    let wanted = preview.address.clone();
    status.preview = Some(preview);
    let message = match o.spec.confirm.as_deref() {
        Some(c) if c == wanted && (shown_before || without_review(o)) => {
            return ControlFlow::Continue(());
        }
        None => format!("preview shown in status.preview: set spec.confirm to \"{wanted}\" to send it"),
        Some(c) if c != wanted => format!(
            "spec.confirm says \"{c}\", the replay goes to \"{wanted}\": set spec.confirm to \"{wanted}\" to send it"
        ),
        Some(_) => format!(
            "spec.confirm was given before this preview was shown: read status.preview, then set spec.confirm again (remove it and set it to \"{wanted}\"), or annotate {}: \"true\"",
            crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION
        ),
    };
    ControlFlow::Break(awaiting_confirmation(o, status, message))
}

/// The operator-wide pause holds a confirmed replay back.
pub fn judge_pause(o: &MessageReplay, status: &mut MessageReplayStatus) -> ControlFlow<Verdict> {
    let paused = super::super::is_paused(&o.metadata);
    let waits = "confirmed, not sent; the replay goes on when the annotation goes";
    conditions::note_paused(&mut status.conditions, paused, waits, o.metadata.generation);
    if !paused {
        return ControlFlow::Continue(());
    }
    ControlFlow::Break(awaiting_confirmation(
        o,
        status,
        conditions::paused_message(waits),
    ))
}

fn awaiting_confirmation(o: &MessageReplay, status: &mut MessageReplayStatus, message: String) -> Verdict {
    let generation = o.metadata.generation;
    status.phase = ReplayPhase::AwaitingConfirmation;
    status.shown_generation = generation;
    status.message = Some(message.clone());
    conditions::set(
        &mut status.conditions,
        COMPLETE,
        false,
        "AwaitingConfirmation",
        message,
        generation,
    );
    Verdict {
        status: status.clone(),
        then: Action::requeue(Duration::from_secs(30)),
    }
}

/// The status that arms the send (`Sending`, by this process, now), written by
/// compare-and-swap so that exactly one process wins.
pub fn arming(status: &mut MessageReplayStatus, process_id: &str, generation: Option<i64>) {
    status.phase = ReplayPhase::Sending;
    status.armed_by = Some(process_id.to_string());
    status.armed_at = Some(now());
    let message = "confirmed: sending now; the outcome follows, never retried";
    status.message = Some(message.into());
    conditions::set(
        &mut status.conditions,
        COMPLETE,
        false,
        "Sending",
        message,
        generation,
    );
}

/// The send's outcome on its node: Completed with the new message's id, or Failed for good.
pub fn record_result(
    status: &mut MessageReplayStatus,
    outcome: NodeOutcome,
    sent_id: Option<String>,
    generation: Option<i64>,
) {
    let sent = outcome.outcome == Outcome::Applied;
    let message = if sent {
        outcome.message.clone()
    } else {
        format!("{}; not retried", outcome.message)
    };
    status.sent_message_id = sent_id.filter(|_| sent);
    status.nodes = vec![outcome];
    let phase = if sent {
        ReplayPhase::Completed
    } else {
        ReplayPhase::Failed
    };
    finish(status, phase, message, generation);
}

/// The process that armed the send did not finish: Failed with the outcome unknown. Returns
/// why, for the audit row.
pub fn fail_unknown(status: &mut MessageReplayStatus, generation: Option<i64>) -> &'static str {
    let why = "outcome unknown, not retried: the operator process that armed the replay stopped before recording its outcome; look for the message's ArtemisStudioReplay property on the address";
    finish(status, ReplayPhase::Failed, format!("Failed: {why}"), generation);
    why
}

/// A replay's words for its stages.
const REASONS: one_shot::Reasons = one_shot::Reasons {
    done: "Sent",
    not_done: "NotSent",
    failed: "ReplayFailed",
    in_flight: "Sending",
};

fn finish(status: &mut MessageReplayStatus, phase: ReplayPhase, message: String, generation: Option<i64>) {
    status.phase = phase;
    status.completed_at = Some(now());
    let done = phase == ReplayPhase::Completed;
    one_shot::set_finished(&mut status.conditions, done, REASONS, &message, generation);
    status.message = Some(message);
}

/// Ready, Reconciling and Stalled from the phase (`one_shot::stage_conditions`).
pub fn with_phase_conditions(status: &MessageReplayStatus) -> MessageReplayStatus {
    let mut status = status.clone();
    let stage = match status.phase {
        ReplayPhase::Pending => one_shot::Stage::Pending,
        ReplayPhase::AwaitingConfirmation => one_shot::Stage::AwaitingConfirmation,
        ReplayPhase::Sending => one_shot::Stage::InFlight,
        ReplayPhase::Completed => one_shot::Stage::Completed,
        ReplayPhase::Failed => one_shot::Stage::Failed,
    };
    let message = status.message.clone().unwrap_or_default();
    let generation = status.observed_generation;
    one_shot::stage_conditions(&mut status.conditions, stage, REASONS, message, generation);
    status
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn replay(spec: serde_json::Value, generation: i64, annotations: serde_json::Value) -> MessageReplay {
        let mut s = json!({"clusterRef": {"name": "c"}, "subscription": "s", "row": 7});
        if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
            s.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "MessageReplay",
            "metadata": {"name": "r", "namespace": "ns", "generation": generation, "annotations": annotations},
            "spec": s
        }))
        .expect("replay")
    }

    fn row() -> ReplaySource {
        ReplaySource {
            row_id: 7,
            node: "n1".into(),
            original_address: "orders".into(),
            properties: json!({"color": "red", "n": 3, "gone": null, "_AMQ_DUPL_ID": "d1"}),
            body_kind: Some("amqp-value".into()),
            body_text: Some("hello".into()),
            body_binary: None,
            body_truncated: false,
            escaped: None,
            origin: "captured".into(),
        }
    }

    fn planned(r: &ReplaySource) -> Result<Planned, Unsendable> {
        plan(&replay(json!({}), 1, json!({})), r)
    }

    #[test]
    fn a_row_that_is_not_the_message_as_sent_is_refused_with_the_reason() {
        let refused = |change: fn(&mut ReplaySource), why: &str| {
            let mut r = row();
            change(&mut r);
            let e = planned(&r).expect_err("refused").to_string();
            assert!(e.contains(why), "{e}");
        };
        refused(|r| r.body_truncated = true, "truncated at capture");
        refused(|r| r.escaped = Some(vec!["body: U+0000".into()]), "body: U+0000");
        refused(|r| r.origin = "sampled".into(), "sampled");
        refused(|r| r.body_kind = Some("amqp-sequence".into()), "AMQP sequence");
        refused(|r| r.body_kind = None, "does not record how its body was stored");
        let mut unchanged = row();
        unchanged.escaped = Some(vec![]);
        assert!(
            planned(&unchanged).is_ok(),
            "an empty list of changes is no change"
        );
    }

    #[test]
    fn each_body_kind_is_sent_as_the_broker_takes_it() {
        let body = |kind: &str, text: Option<&str>, bytes: Option<&[u8]>| {
            let mut r = row();
            r.body_kind = Some(kind.into());
            r.body_text = text.map(str::to_string);
            r.body_binary = bytes.map(<[u8]>::to_vec);
            planned(&r).expect("sendable").body
        };
        assert_eq!(body("amqp-value", Some("hi"), None), SentBody::Text("hi".into()));
        assert_eq!(body("amqp-value", None, Some(b"\x01")), SentBody::Bytes(vec![1]));
        assert_eq!(body("amqp-value", None, None), SentBody::Empty);
        assert_eq!(body("data", None, Some(b"ab")), SentBody::Bytes(b"ab".to_vec()));
        assert_eq!(body("data", None, None), SentBody::Bytes(vec![]));
        assert_eq!(body("empty", None, None), SentBody::Empty);
    }

    #[test]
    fn properties_are_the_originals_as_strings_without_the_brokers_plus_the_replays_name() {
        let p = planned(&row()).expect("sendable");
        let expected: BTreeMap<String, String> =
            [("ArtemisStudioReplay", "ns/r"), ("color", "red"), ("n", "3")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert_eq!(p.properties, expected);
        assert_eq!((p.node.as_str(), p.address.as_str()), ("n1", "orders"));
        let elsewhere = plan(
            &replay(json!({"node": "n2", "address": "audit"}), 1, json!({})),
            &row(),
        )
        .expect("sendable");
        assert_eq!(
            (elsewhere.node.as_str(), elsewhere.address.as_str()),
            ("n2", "audit")
        );
    }

    fn judged(o: &MessageReplay, status: &mut MessageReplayStatus) -> Result<(), String> {
        let p = preview(&planned(&row()).expect("sendable"), &row());
        match judge_confirmation(o, p, status) {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(v) => {
                assert_eq!(v.status.phase, ReplayPhase::AwaitingConfirmation);
                Err(v.status.message.unwrap_or_default())
            }
        }
    }

    #[test]
    fn only_the_shown_address_typed_after_this_preview_was_shown_confirms() {
        // First pass: the preview is shown, whatever spec.confirm says.
        let mut status = MessageReplayStatus::default();
        let e = judged(&replay(json!({"confirm": "orders"}), 1, json!({})), &mut status);
        assert!(e.expect_err("waits").contains("before this preview was shown"));
        assert_eq!(status.shown_generation, Some(1));
        let mut s = status.clone();
        let e = judged(&replay(json!({}), 2, json!({})), &mut s);
        assert!(e.expect_err("waits").contains("set spec.confirm to \"orders\""));
        let mut s = status.clone();
        let e = judged(&replay(json!({"confirm": "audit"}), 2, json!({})), &mut s);
        assert!(e.expect_err("waits").contains("says \"audit\""));
        let mut s = status.clone();
        assert_eq!(
            judged(&replay(json!({"confirm": "orders"}), 2, json!({})), &mut s),
            Ok(())
        );
        // A preview that changed since it was shown is shown again first.
        let mut s = status.clone();
        if let Some(p) = s.preview.as_mut() {
            p.body_bytes += 1;
        }
        assert!(judged(&replay(json!({"confirm": "orders"}), 2, json!({})), &mut s).is_err());
        // Automation confirms without review.
        let annotated = json!({"artemis-studio.io/confirm-without-review": "true"});
        let mut fresh = MessageReplayStatus::default();
        assert_eq!(
            judged(&replay(json!({"confirm": "orders"}), 1, annotated), &mut fresh),
            Ok(())
        );
    }

    #[test]
    fn a_confirmed_replay_that_cannot_be_sent_says_why_not_that_it_waits_for_confirmation() {
        let ready = |s: &MessageReplayStatus| {
            let s = with_phase_conditions(s);
            let r = conditions::get(&s.conditions, conditions::READY)
                .cloned()
                .expect("Ready");
            let stalled = conditions::get(&s.conditions, "Stalled").map(|c| c.status.clone());
            (r.reason, stalled)
        };
        let mut s = MessageReplayStatus {
            phase: ReplayPhase::AwaitingConfirmation,
            ..Default::default()
        };
        not_usable(&mut s, Some(2), "ClusterNotFound", "no cluster c".into());
        assert_eq!(s.phase, ReplayPhase::Pending);
        assert_eq!(ready(&s), ("ClusterNotFound".into(), Some("True".into())));
        arming(&mut s, "p1", Some(2));
        assert_eq!(ready(&s).0, "Sending");
        let mut failed = MessageReplayStatus::default();
        refuse(&mut failed, "row 7 was truncated".into(), Some(1));
        assert_eq!(
            ready(&failed),
            ("ReplayFailed".into(), Some("True".into())),
            "a person's to see"
        );
    }

    #[test]
    fn a_send_completes_with_its_id_or_fails_for_good() {
        let outcome = |o: Outcome| NodeOutcome {
            node: "n1".into(),
            endpoint: None,
            outcome: o,
            refusal: None,
            message: "m".into(),
            detail: vec![],
            last_command: None,
        };
        let mut s = MessageReplayStatus::default();
        record_result(&mut s, outcome(Outcome::Applied), Some("42".into()), Some(3));
        assert_eq!(
            (s.phase, s.sent_message_id.as_deref()),
            (ReplayPhase::Completed, Some("42"))
        );
        let ready = with_phase_conditions(&s);
        let r = conditions::get(&ready.conditions, conditions::READY).expect("Ready");
        assert_eq!((r.status.as_str(), r.reason.as_str()), ("True", "Sent"));
        let mut s = MessageReplayStatus::default();
        record_result(&mut s, outcome(Outcome::Failed), Some("42".into()), Some(3));
        assert_eq!((s.phase, s.sent_message_id), (ReplayPhase::Failed, None));
        assert!(s.message.unwrap_or_default().ends_with("not retried"));
    }
}
