//! Kubernetes-convention conditions: one per type, `lastTransitionTime` kept while the status
//! does not change, `observedGeneration` on each.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{Condition, NodeOutcome, Outcome};

pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
pub const DIVERGED: &str = "Diverged";
/// kstatus (Flux, `kstatus`-based tools): "abnormal-true" conditions, False when all is well.
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
/// A write the broker accepted and did not apply; not re-sent: a person changes the spec.
pub const NOT_CONVERGING: &str = "NotConverging";
/// A delete that cannot finish; the finalizer stays.
pub const DELETE_BLOCKED: &str = "DeleteBlocked";
/// The pause annotation holds every broker write of the object (queue, divert, close, capture).
pub const PAUSED: &str = "Paused";

/// Ready=False reasons that no retry resolves: a person must change the spec, the Secret, the
/// broker or the permissions. Stalled=True (Flux: Failed; Argo CD: Degraded). Anything else that
/// is not [`HELD`] is still converging (Reconciling=True: InProgress, Progressing).
const NEEDS_A_PERSON: &[&str] = &[
    "InvalidSpec",
    "ClusterNotFound",
    "CredentialsMissing",
    "SecretMissing",
    "SecretKeyMissing",
    "SecretUnreadable",
    "CredentialsRefused",
    "OriginRefused",
    "NotJolokia",
    "InvalidTls",
    "NoEndpoints",
    "DeleteRefused",
    "DeleteBlocked",
    "BulkCapExceeded",
    "Refused",
    "NodesRefused",
    "ResourceConflict",
    "Contested",
    "CloseFailed",
    "ReplayFailed",
    "TapCapExceeded",
    "Failed",
];

/// Ready=False reasons the user asked for: a dry run, a pause, a confirmation or an arming only
/// the user can give. Neither Reconciling nor Stalled (Argo CD: Suspended; Flux with the shipped
/// healthCheckExprs: Current; plain kstatus: InProgress, from Ready=False). README, GitOps.
pub const HELD: &[&str] = &[
    "DryRun",
    "Paused",
    "DryRunDelete",
    "PausedDelete",
    "AwaitingConfirmation",
    "ConfirmationMismatch",
    "ConfirmedBeforeShown",
];

/// Where a Ready=False reason stands: asked for by the user, waiting for a person, or on its way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Held,
    NeedsAPerson,
    OnItsWay,
}

/// The standing of a Ready=False (or DeleteBlocked) reason.
pub fn standing(reason: &str) -> Standing {
    if HELD.contains(&reason) {
        Standing::Held
    } else if NEEDS_A_PERSON.contains(&reason) {
        Standing::NeedsAPerson
    } else {
        Standing::OnItsWay
    }
}

/// A node refusal that retrying can clear (the broker was slow or away); every other refusal
/// waits for a person (NOT_CONVERGING included: the write is not re-sent for this generation).
fn transient(kind: Option<crate::api::RefusalKind>) -> bool {
    use crate::api::RefusalKind as R;
    matches!(kind, None | Some(R::Unreachable | R::Timeout | R::BadResponse))
}

/// A condition besides Ready that only a person can clear: a write the broker did not apply, or
/// a delete blocked for a reason no retry resolves.
fn needs_a_person(conditions: &[Condition]) -> Option<(String, String)> {
    conditions
        .iter()
        .find(|c| {
            c.status == "True"
                && (c.type_ == NOT_CONVERGING
                    || (c.type_ == DELETE_BLOCKED && NEEDS_A_PERSON.contains(&c.reason.as_str())))
        })
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// What Reconciling and Stalled say: at rest, held by the user, waiting for a person, on its way.
enum Verdict {
    Settled,
    Held(String, String),
    Stalled(String, String),
    Reconciling(String, String),
}

/// Reconciling and Stalled, derived from Ready (and the per-node outcomes) just before a status
/// is written, so Flux's and kstatus's health agrees with Ready: Ready=True → both False;
/// Ready=False for a reason the user asked for ([`HELD`]) → both False; for a reason only a
/// person can fix (or every failed live node refused for good) → Stalled=True; otherwise →
/// Reconciling=True. A blocked delete first makes Ready False ([`blocked_delete_in_ready`]).
pub fn kstatus(conditions: &mut Vec<Condition>, nodes: &[NodeOutcome], generation: Option<i64>) {
    blocked_delete_in_ready(conditions, generation);
    let ready = get(conditions, READY).cloned();
    let refused_for_good = {
        let failed: Vec<&NodeOutcome> = nodes.iter().filter(|n| n.outcome == Outcome::Failed).collect();
        !failed.is_empty() && failed.iter().all(|n| !transient(n.refusal))
    };
    let verdict = match (&ready, needs_a_person(conditions)) {
        (_, Some((reason, message))) => Verdict::Stalled(reason, message),
        (Some(r), None) if r.status == "True" => Verdict::Settled,
        (Some(r), None) if standing(&r.reason) == Standing::Held => {
            Verdict::Held(r.reason.clone(), r.message.clone())
        }
        (Some(r), None) if standing(&r.reason) == Standing::NeedsAPerson || refused_for_good => {
            Verdict::Stalled(r.reason.clone(), r.message.clone())
        }
        (Some(r), None) => Verdict::Reconciling(r.reason.clone(), r.message.clone()),
        (None, None) => Verdict::Reconciling("Pending".into(), "not reconciled yet".into()),
    };
    let (reconciling, stalled) = match verdict {
        Verdict::Settled => (
            (false, "Settled".to_string(), SETTLED.to_string()),
            (false, "Progressing".to_string(), NOBODY_NEEDED.to_string()),
        ),
        Verdict::Held(reason, message) => (
            (false, reason.clone(), format!("held as asked: {message}")),
            (false, reason, format!("held as asked, nothing to fix: {message}")),
        ),
        Verdict::Stalled(reason, message) => (
            (false, "Settled".to_string(), SETTLED.to_string()),
            (true, reason, message),
        ),
        Verdict::Reconciling(reason, message) => (
            (true, reason, message),
            (false, "Progressing".to_string(), NOBODY_NEEDED.to_string()),
        ),
    };
    set(
        conditions,
        RECONCILING,
        reconciling.0,
        &reconciling.1,
        reconciling.2,
        generation,
    );
    set(conditions, STALLED, stalled.0, &stalled.1, stalled.2, generation);
}

const SETTLED: &str = "nothing left to do until the spec or the brokers change";
const NOBODY_NEEDED: &str = "nothing needs a person";

/// A delete that cannot finish shows in Ready (and so in `kubectl get`'s READY column and in
/// every tool that reads Ready): Ready=False `DeleteBlocked` when a person must act, the held
/// reason (`DryRunDelete`, `PausedDelete`) when the user asked for it, `DeleteWaiting` while it
/// waits for a node to come back.
pub fn blocked_delete_in_ready(conditions: &mut Vec<Condition>, generation: Option<i64>) {
    let Some(blocked) = get(conditions, DELETE_BLOCKED)
        .filter(|c| c.status == "True")
        .cloned()
    else {
        return;
    };
    let reason = match standing(&blocked.reason) {
        Standing::NeedsAPerson => "DeleteBlocked",
        Standing::Held => blocked.reason.as_str(),
        Standing::OnItsWay => "DeleteWaiting",
    };
    let message = format!("delete blocked ({}): {}", blocked.reason, blocked.message);
    set(conditions, READY, false, reason, message, generation);
}

/// A condition's status, reason and message, as judged.
pub type Judged<'a> = (bool, &'a str, String);

/// Set each `(type, judged)` at one generation.
pub fn set_all<'a>(
    conditions: &mut Vec<Condition>,
    generation: Option<i64>,
    judged: impl IntoIterator<Item = (&'a str, Judged<'a>)>,
) {
    for (type_, (status, reason, message)) in judged {
        set(conditions, type_, status, reason, message, generation);
    }
}

/// What a pause holds, as conditions say it: `artemis-studio.io/paused is "true": {waits}`.
pub fn paused_message(waits: &str) -> String {
    format!("{} is \"true\": {waits}", crate::api::PAUSED_ANNOTATION)
}

/// Paused: True while the pause annotation is "true", its message saying what waits.
pub fn set_paused(conditions: &mut Vec<Condition>, paused: bool, waits: &str, generation: Option<i64>) {
    if paused {
        set(
            conditions,
            PAUSED,
            true,
            "Annotated",
            paused_message(waits),
            generation,
        );
    } else {
        set(
            conditions,
            PAUSED,
            false,
            "NotPaused",
            "broker writes allowed",
            generation,
        );
    }
}

/// [`set_paused`] for the kinds that gained the condition later (closes, capture): set while
/// paused and kept current once set, never added as False to a status that had none (an
/// upgraded operator writes nothing to an object whose status is current).
pub fn note_paused(conditions: &mut Vec<Condition>, paused: bool, waits: &str, generation: Option<i64>) {
    if paused || get(conditions, PAUSED).is_some() {
        set_paused(conditions, paused, waits, generation);
    }
}

/// The condition of `type_`, if set.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

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

/// Why a pass wrote nothing on purpose: the reason Ready gives while a change waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// `spec.dryRun`: status shows what would change.
    DryRun,
    /// The paused annotation: broker writes stop until it goes.
    Paused,
}

impl Held {
    fn reason_and_message(self) -> (&'static str, String) {
        match self {
            Held::DryRun => (
                "DryRun",
                "dry run: nothing is written; see status.nodes for what would change".into(),
            ),
            Held::Paused => (
                "Paused",
                format!(
                    "paused ({}): nothing is written; see status.nodes for what would change",
                    crate::api::PAUSED_ANNOTATION
                ),
            ),
        }
    }
}

/// Ready and Diverged from a command's per-node outcomes (ADR-0049): Ready only when every live
/// node is APPLIED or ALREADY; Diverged names the nodes that are not, not-live ones included.
pub fn from_outcomes(
    conditions: &mut Vec<Condition>,
    nodes: &[NodeOutcome],
    generation: Option<i64>,
    held: Option<Held>,
    what: &str,
) {
    let in_state = |n: &&NodeOutcome| matches!(n.outcome, Outcome::Applied | Outcome::Already);
    let live: Vec<&NodeOutcome> = nodes
        .iter()
        .filter(|n| n.outcome != Outcome::SkippedNotLive)
        .collect();
    let ready = !live.is_empty() && live.iter().all(in_state);
    let (reason, message) = if ready {
        (
            "OnEveryLiveNode",
            format!(
                "the {what} is in the requested state on {} live node(s)",
                live.len()
            ),
        )
    } else if live.is_empty() {
        ("NoLiveNode", format!("no live node: nothing received the {what}"))
    } else if let Some(held) = held {
        held.reason_and_message()
    } else {
        let bad: Vec<String> = live
            .iter()
            .filter(|n| !in_state(n))
            .map(|n| format!("{}: {}", n.node, n.message))
            .collect();
        ("NotOnEveryLiveNode", bad.join("; "))
    };
    set(conditions, READY, ready, reason, message, generation);
    let diverged: Vec<String> = nodes
        .iter()
        .filter(|n| !in_state(n))
        .map(|n| match n.outcome {
            Outcome::SkippedNotLive => match &n.last_command {
                Some(lc) => format!(
                    "{} (not live; last received {} {:?})",
                    n.node, lc.command, lc.outcome
                ),
                None => format!("{} (not live)", n.node),
            },
            other => format!("{} ({other:?})", n.node),
        })
        .collect();
    if diverged.is_empty() {
        set(
            conditions,
            DIVERGED,
            false,
            "Converged",
            "every node matches the spec",
            generation,
        );
    } else {
        set(
            conditions,
            DIVERGED,
            true,
            "NodesDiffer",
            diverged.join(", "),
            generation,
        );
    }
}

#[cfg(test)]
mod kstatus_tests {
    use super::*;
    use crate::api::RefusalKind;

    fn node(outcome: Outcome, refusal: Option<RefusalKind>) -> NodeOutcome {
        NodeOutcome {
            node: "n".into(),
            endpoint: None,
            outcome,
            refusal,
            message: String::new(),
            detail: vec![],
            last_command: None,
        }
    }

    fn status_of(c: &[Condition], t: &str) -> (String, String) {
        c.iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone()))
            .unwrap_or_default()
    }

    #[test]
    fn ready_means_neither_reconciling_nor_stalled() {
        let mut c = vec![];
        set(&mut c, READY, true, "OnEveryLiveNode", "ok", Some(1));
        kstatus(&mut c, &[node(Outcome::Applied, None)], Some(1));
        assert_eq!(status_of(&c, RECONCILING).0, "False");
        assert_eq!(status_of(&c, STALLED).0, "False");
    }

    #[test]
    fn a_timeout_is_reconciling_a_refusal_is_stalled() {
        let mut c = vec![];
        set(&mut c, READY, false, "NotOnEveryLiveNode", "n: slow", Some(1));
        kstatus(
            &mut c,
            &[node(Outcome::Failed, Some(RefusalKind::Timeout))],
            Some(1),
        );
        assert_eq!(
            status_of(&c, RECONCILING),
            ("True".into(), "NotOnEveryLiveNode".into())
        );
        assert_eq!(status_of(&c, STALLED).0, "False");
        kstatus(
            &mut c,
            &[node(Outcome::Failed, Some(RefusalKind::RoutingTypeImmutable))],
            Some(1),
        );
        assert_eq!(status_of(&c, RECONCILING).0, "False");
        assert_eq!(
            status_of(&c, STALLED),
            ("True".into(), "NotOnEveryLiveNode".into())
        );
    }

    #[test]
    fn a_paused_change_says_paused_and_a_dry_run_says_dry_run() {
        let node = NodeOutcome {
            node: "c1".into(),
            endpoint: None,
            outcome: Outcome::WouldApply,
            refusal: None,
            message: "update: filter".into(),
            detail: vec![],
            last_command: None,
        };
        for (held, reason) in [(Held::Paused, "Paused"), (Held::DryRun, "DryRun")] {
            let mut c = vec![];
            from_outcomes(&mut c, std::slice::from_ref(&node), Some(1), Some(held), "queue");
            let ready = get(&c, READY).expect("Ready");
            assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason));
        }
    }

    #[test]
    fn reasons_a_person_must_fix_are_stalled() {
        for reason in [
            "InvalidSpec",
            "CredentialsRefused",
            "ClusterNotFound",
            "TapCapExceeded",
        ] {
            let mut c = vec![];
            set(&mut c, READY, false, reason, "x", Some(2));
            kstatus(&mut c, &[], Some(2));
            assert_eq!(status_of(&c, STALLED), ("True".into(), reason.into()), "{reason}");
        }
        let mut c = vec![];
        set(&mut c, READY, false, "ClusterNotReady", "x", Some(2));
        kstatus(&mut c, &[], Some(2));
        assert_eq!(status_of(&c, RECONCILING).0, "True");
    }

    #[test]
    fn what_the_user_asked_for_is_neither_reconciling_nor_stalled() {
        for reason in HELD {
            let mut c = vec![];
            set(&mut c, READY, false, reason, "x", Some(2));
            kstatus(&mut c, &[], Some(2));
            assert_eq!(
                status_of(&c, STALLED),
                ("False".into(), (*reason).into()),
                "{reason}"
            );
            assert_eq!(
                status_of(&c, RECONCILING),
                ("False".into(), (*reason).into()),
                "{reason}"
            );
        }
    }

    #[test]
    fn a_blocked_delete_shows_in_ready() {
        for (blocked, ready, stalled) in [
            ("BulkCapExceeded", "DeleteBlocked", "True"),
            ("PausedDelete", "PausedDelete", "False"),
            ("NodesNotLive", "DeleteWaiting", "False"),
        ] {
            let mut c = vec![];
            set(&mut c, READY, true, "OnEveryLiveNode", "ok", Some(2));
            set(&mut c, DELETE_BLOCKED, true, blocked, "why", Some(2));
            kstatus(&mut c, &[], Some(2));
            assert_eq!(status_of(&c, READY), ("False".into(), ready.into()), "{blocked}");
            let message = get(&c, READY).map(|r| r.message.clone()).unwrap_or_default();
            assert!(message.contains(blocked), "{message}");
            assert_eq!(status_of(&c, STALLED).0, stalled, "{blocked}");
        }
    }

    #[test]
    fn a_write_the_broker_ignored_and_a_delete_a_person_must_unblock_are_stalled() {
        let mut c = vec![];
        set(&mut c, READY, false, "NotOnEveryLiveNode", "n: ignored", Some(2));
        set(
            &mut c,
            NOT_CONVERGING,
            true,
            "BrokerDidNotApply",
            "auto-delete",
            Some(2),
        );
        kstatus(
            &mut c,
            &[node(Outcome::Failed, Some(RefusalKind::NotConverging))],
            Some(2),
        );
        assert_eq!(
            status_of(&c, STALLED),
            ("True".into(), "BrokerDidNotApply".into())
        );
        assert_eq!(status_of(&c, RECONCILING).0, "False");
        let mut c = vec![];
        set(&mut c, READY, true, "OnEveryLiveNode", "ok", Some(2));
        set(
            &mut c,
            DELETE_BLOCKED,
            true,
            "BulkCapExceeded",
            "too many",
            Some(2),
        );
        kstatus(&mut c, &[], Some(2));
        assert_eq!(status_of(&c, STALLED), ("True".into(), "BulkCapExceeded".into()));
        // A delete waiting for a node to come back is on its way.
        let mut c = vec![];
        set(&mut c, READY, true, "OnEveryLiveNode", "ok", Some(2));
        set(&mut c, DELETE_BLOCKED, true, "NodesNotLive", "n down", Some(2));
        kstatus(&mut c, &[], Some(2));
        assert_eq!(status_of(&c, STALLED).0, "False");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_is_added_only_while_paused_and_kept_current_once_there() {
        let mut conds = vec![];
        note_paused(&mut conds, false, "nothing", Some(1));
        assert!(
            conds.is_empty(),
            "an unpaused object's status is not written for it"
        );
        note_paused(&mut conds, true, "the close waits", Some(1));
        let p = get(&conds, PAUSED).expect("Paused");
        assert_eq!((p.status.as_str(), p.reason.as_str()), ("True", "Annotated"));
        assert!(p.message.contains("the close waits"));
        note_paused(&mut conds, false, "the close waits", Some(1));
        assert_eq!(get(&conds, PAUSED).map(|p| p.status.as_str()), Some("False"));
    }

    /// Kubernetes convention: `lastTransitionTime` is when the status last changed, kept while
    /// a pass rewrites the same status with a new reason, message or generation.
    #[test]
    fn the_transition_time_moves_only_when_the_status_changes() {
        let then = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let mut conds = vec![];
        set(&mut conds, READY, true, "OnEveryLiveNode", "ok", Some(1));
        if let Some(c) = conds.iter_mut().find(|c| c.type_ == READY) {
            c.last_transition_time = then.clone();
        }
        set(&mut conds, READY, true, "OnEveryLiveNode", "still ok", Some(2));
        let ready = get(&conds, READY).expect("Ready");
        assert_eq!(ready.last_transition_time, then, "same status: the time is kept");
        assert_eq!(
            (ready.message.as_str(), ready.observed_generation),
            ("still ok", Some(2))
        );
        set(&mut conds, READY, false, "NotOnEveryLiveNode", "n: down", Some(2));
        let ready = get(&conds, READY).expect("Ready");
        assert_ne!(ready.last_transition_time, then, "a new status: a new time");
        assert_eq!(conds.len(), 1, "one condition per type");
    }

    fn at(node: &str, outcome: Outcome, message: &str) -> NodeOutcome {
        NodeOutcome {
            node: node.into(),
            endpoint: None,
            outcome,
            refusal: None,
            message: message.into(),
            detail: vec![],
            last_command: None,
        }
    }

    fn said(conds: &[Condition], type_: &str) -> (String, String, String) {
        get(conds, type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
            .unwrap_or_default()
    }

    /// ADR-0049: Ready when every live node is APPLIED or ALREADY (a node that is not live does
    /// not hold it back); Diverged names the nodes that are not in the state, not-live ones
    /// included, and never one that is.
    #[test]
    fn ready_counts_the_live_nodes_and_diverged_names_only_the_nodes_that_differ() {
        let mut down = at("c3", Outcome::SkippedNotLive, "");
        down.last_command = Some(crate::api::LastCommand {
            command: "queue.apply".into(),
            audit_id: 7,
            outcome: Outcome::Applied,
            at: "2026-12-05T08:00:00Z".into(),
            not_applied: vec![],
        });
        let nodes = [
            at("c1", Outcome::Applied, "created"),
            at("c2", Outcome::Already, "in place"),
            down,
            at("c4", Outcome::SkippedNotLive, ""),
        ];
        let mut conds = vec![];
        from_outcomes(&mut conds, &nodes, Some(3), None, "queue");
        assert_eq!(
            said(&conds, READY),
            (
                "True".into(),
                "OnEveryLiveNode".into(),
                "the queue is in the requested state on 2 live node(s)".into()
            )
        );
        assert_eq!(
            said(&conds, DIVERGED),
            (
                "True".into(),
                "NodesDiffer".into(),
                "c3 (not live; last received queue.apply Applied), c4 (not live)".into()
            )
        );

        let nodes = [
            at("c1", Outcome::Applied, "created"),
            at("c2", Outcome::Failed, "refused: AMQ229211"),
        ];
        let mut conds = vec![];
        from_outcomes(&mut conds, &nodes, Some(3), None, "queue");
        assert_eq!(
            said(&conds, READY),
            (
                "False".into(),
                "NotOnEveryLiveNode".into(),
                "c2: refused: AMQ229211".into()
            ),
            "Ready names the live node that failed, and only it"
        );
        assert_eq!(
            said(&conds, DIVERGED),
            ("True".into(), "NodesDiffer".into(), "c2 (Failed)".into())
        );

        let mut conds = vec![];
        from_outcomes(&mut conds, &nodes[..1], Some(3), None, "queue");
        assert_eq!(said(&conds, DIVERGED).0, "False");
        assert_eq!(said(&conds, DIVERGED).1, "Converged");

        let mut conds = vec![];
        from_outcomes(
            &mut conds,
            &[at("c1", Outcome::SkippedNotLive, "")],
            Some(3),
            None,
            "queue",
        );
        assert_eq!(
            said(&conds, READY),
            (
                "False".into(),
                "NoLiveNode".into(),
                "no live node: nothing received the queue".into()
            )
        );
    }
}
