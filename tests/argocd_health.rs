//! The Argo CD health checks (deploy/argocd/health/<Kind>.lua) give the right verdict on status
//! documents built from the operator's own types and condition helpers (so they cannot drift
//! from what the controllers write), and deploy/argocd/argocd-cm-patch.yaml carries exactly
//! those scripts, one per kind.

#[path = "common/argocd_lua.rs"]
mod argocd_lua;

use argocd_lua::{argocd_dir, argocd_fixtures, health, script};
use artemis_studio_operator::api::{
    ArtemisCaptureSubscription, ArtemisCluster, ArtemisDivert, ArtemisQueue, Condition, ConnectionClose,
    MessageReplay, NodeOutcome, Outcome, RefusalKind,
};
use artemis_studio_operator::controllers::conditions;
use kube::Resource;
use serde::Serialize;
use serde_json::{Value, json};

/// An object of kind K as the API server returns it: metadata.generation and the status the
/// controllers wrote.
fn object<K: Resource<DynamicType = ()>, S: Serialize>(
    generation: i64,
    spec: Value,
    status: Option<S>,
) -> Value {
    let mut o = json!({
        "apiVersion": K::api_version(&()), "kind": K::kind(&()),
        "metadata": {"name": "x", "namespace": "ns", "generation": generation},
        "spec": spec,
    });
    if let Some(s) = status {
        o["status"] = as_written(serde_json::to_value(s).expect("status json"));
    }
    o
}

/// A status as the controllers write it: Reconciling and Stalled derived (and a blocked delete
/// put in Ready) by `conditions::kstatus` just before every status write.
fn as_written(mut status: Value) -> Value {
    let mut conds: Vec<Condition> = serde_json::from_value(status["conditions"].clone()).unwrap_or_default();
    let nodes: Vec<NodeOutcome> = serde_json::from_value(status["nodes"].clone()).unwrap_or_default();
    conditions::kstatus(&mut conds, &nodes, status["observedGeneration"].as_i64());
    status["conditions"] = serde_json::to_value(conds).expect("conditions json");
    status
}

fn node(name: &str, outcome: Outcome, refusal: Option<RefusalKind>, message: &str) -> NodeOutcome {
    NodeOutcome {
        last_command: None,
        node: name.into(),
        endpoint: Some(format!("http://{name}:8161/console/jolokia")),
        outcome,
        refusal,
        message: message.into(),
        detail: vec![],
    }
}

fn queue_spec() -> Value {
    json!({"clusterRef": {"name": "prod"}})
}

type QueueStatus = artemis_studio_operator::api::queue::ArtemisQueueStatus;

fn queue_status(generation: i64, nodes: Vec<NodeOutcome>, dry_run: bool) -> QueueStatus {
    let mut s = QueueStatus {
        observed_generation: Some(generation),
        queue_name: Some("orders".into()),
        ..Default::default()
    };
    let held = dry_run.then_some(conditions::Held::DryRun);
    conditions::from_outcomes(&mut s.conditions, &nodes, Some(generation), held, "queue");
    s.nodes = nodes;
    s
}

#[test]
fn queue_health_follows_generation_nodes_and_conditions() {
    let q =
        |generation, status: Option<QueueStatus>| object::<ArtemisQueue, _>(generation, queue_spec(), status);
    let applied = || {
        vec![
            node("n1", Outcome::Applied, None, "created"),
            node("n2", Outcome::Already, None, "exists"),
            node("n3", Outcome::SkippedNotLive, None, "not live"),
        ]
    };

    assert_eq!(health(&q(1, None)).0, "Progressing", "no status yet");

    let (s, m) = health(&q(1, Some(queue_status(1, applied(), false))));
    assert_eq!(s, "Healthy", "{m}");

    let (s, m) = health(&q(2, Some(queue_status(1, applied(), false))));
    assert_eq!(
        (s.as_str(), m.contains("generation 2")),
        ("Progressing", true),
        "{m}"
    );

    let failed = vec![
        node("n1", Outcome::Applied, None, "created"),
        node(
            "n2",
            Outcome::Failed,
            Some(RefusalKind::NotAuthorized),
            "management.xml refuses createQueue",
        ),
    ];
    let (s, m) = health(&q(3, Some(queue_status(3, failed, false))));
    assert_eq!(s, "Degraded");
    assert!(m.contains("n2") && m.contains("refuses createQueue"), "{m}");

    let mut blocked = queue_status(4, applied(), false);
    conditions::set(
        &mut blocked.conditions,
        "DeleteBlocked",
        true,
        "BulkCapExceeded",
        "the delete would destroy 12000 messages, above the bulk cap 10000: set spec.deletion.allowMessageLoss",
        Some(4),
    );
    let (s, m) = health(&q(4, Some(blocked)));
    assert_eq!(s, "Degraded");
    assert!(
        m.contains("BulkCapExceeded") && m.contains("allowMessageLoss"),
        "{m}"
    );

    let dry = vec![node("n1", Outcome::WouldApply, None, "would create")];
    assert_eq!(
        health(&q(5, Some(queue_status(5, dry.clone(), true)))).0,
        "Suspended",
        "dry run"
    );

    let mut paused = queue_status(6, dry, true);
    conditions::set(
        &mut paused.conditions,
        "Paused",
        true,
        "Annotated",
        "artemis-studio.io/paused is true: no broker writes",
        Some(6),
    );
    let (s, m) = health(&q(6, Some(paused)));
    assert_eq!((s.as_str(), m.contains("paused")), ("Suspended", true), "{m}");

    let mut conflict = queue_status(7, vec![], false);
    conditions::set(
        &mut conflict.conditions,
        conditions::READY,
        false,
        "ResourceConflict",
        "queue orders on cluster prod is declared by the older ArtemisQueue ns/a",
        Some(7),
    );
    assert_eq!(health(&q(7, Some(conflict))).0, "Degraded");

    let mut waiting = queue_status(8, vec![], false);
    conditions::set(
        &mut waiting.conditions,
        conditions::READY,
        false,
        "ClusterNotReady",
        "ArtemisCluster prod has no live node yet",
        Some(8),
    );
    assert_eq!(health(&q(8, Some(waiting))).0, "Progressing");

    let none_live = vec![node("n1", Outcome::SkippedNotLive, None, "not live")];
    assert_eq!(
        health(&q(9, Some(queue_status(9, none_live, false)))).0,
        "Progressing"
    );
}

#[test]
fn divert_health_follows_generation_nodes_and_conditions() {
    type DivertStatus = artemis_studio_operator::api::divert::ArtemisDivertStatus;
    let spec = json!({"clusterRef": {"name": "prod"}, "address": "a", "forwardingAddress": "b"});
    let status = |generation: i64, nodes: Vec<NodeOutcome>| {
        let mut s = DivertStatus {
            observed_generation: Some(generation),
            ..Default::default()
        };
        conditions::from_outcomes(&mut s.conditions, &nodes, Some(generation), None, "divert");
        s.nodes = nodes;
        s
    };
    let d = |generation, s: DivertStatus| object::<ArtemisDivert, _>(generation, spec.clone(), Some(s));

    assert_eq!(
        health(&d(
            1,
            status(1, vec![node("n1", Outcome::Applied, None, "created")])
        ))
        .0,
        "Healthy"
    );
    let refused = vec![node(
        "n1",
        Outcome::Failed,
        Some(RefusalKind::NothingConsumes),
        "Nothing consumes at b",
    )];
    let (s, m) = health(&d(2, status(2, refused)));
    assert_eq!(
        (s.as_str(), m.contains("Nothing consumes")),
        ("Degraded", true),
        "{m}"
    );
    assert_eq!(
        health(&d(3, status(2, vec![]))).0,
        "Progressing",
        "generation 3 not observed"
    );
}

#[test]
fn cluster_health_reads_ready_and_its_terminal_reasons() {
    type ClusterStatus = artemis_studio_operator::api::cluster::ArtemisClusterStatus;
    let spec = json!({"brokers": [{"url": "http://b0:8161/console/jolokia"}], "credentials": {"secretName": "creds"}});
    let status = |generation: i64, ready: bool, reason: &str, message: &str| {
        let mut s = ClusterStatus {
            observed_generation: Some(generation),
            live_nodes: u32::from(ready),
            total_nodes: 1,
            ..Default::default()
        };
        conditions::set(
            &mut s.conditions,
            conditions::READY,
            ready,
            reason,
            message,
            Some(generation),
        );
        s
    };
    let c = |generation, s: ClusterStatus| object::<ArtemisCluster, _>(generation, spec.clone(), Some(s));

    assert_eq!(
        health(&c(1, status(1, true, "NodesLive", "1 live logical node"))).0,
        "Healthy"
    );

    let mut degraded = status(1, true, "NodesLive", "1 live logical node");
    conditions::set(
        &mut degraded.conditions,
        conditions::DEGRADED,
        true,
        "EndpointsUnreachable",
        "http://b1:8161 does not answer",
        Some(1),
    );
    let (s, m) = health(&c(1, degraded));
    assert_eq!((s.as_str(), m.contains("b1")), ("Healthy", true), "{m}");

    for reason in [
        "SecretMissing",
        "SecretKeyMissing",
        "SecretUnreadable",
        "InvalidTls",
        "CredentialsRefused",
        "OriginRefused",
        "NotJolokia",
        "NoEndpoints",
    ] {
        let (s, m) = health(&c(2, status(2, false, reason, "the fix")));
        assert_eq!(s, "Degraded", "{reason}: {m}");
    }
    for reason in ["Unreachable", "NoLiveNode", "DiscoveryFailed"] {
        let (s, m) = health(&c(2, status(2, false, reason, "wait")));
        assert_eq!(s, "Progressing", "{reason}: {m}");
    }
    assert_eq!(
        health(&c(3, status(2, true, "NodesLive", "ok"))).0,
        "Progressing",
        "generation 3 not observed"
    );
}

#[test]
fn capture_subscription_health_reads_its_taps() {
    use artemis_studio_operator::api::capture::{ArtemisCaptureSubscriptionStatus, TapState, TapStatus};
    let spec = json!({"clusterRef": {"name": "prod"}, "queues": "orders*"});
    let tap = |state: TapState, refusal: Option<RefusalKind>| TapStatus {
        address: "orders".into(),
        node: "n1".into(),
        state,
        refusal,
        message: refusal.map(|_| "an exclusive divert on orders would starve the tap".to_string()),
        ..Default::default()
    };
    let status = |taps: Vec<TapStatus>, ready: Option<bool>| {
        let mut s = ArtemisCaptureSubscriptionStatus {
            observed_generation: Some(1),
            taps,
            ..Default::default()
        };
        if let Some(r) = ready {
            conditions::set(
                &mut s.conditions,
                conditions::READY,
                r,
                "Taps",
                "every tap drains",
                Some(1),
            );
        }
        s
    };
    let sub = |s| object::<ArtemisCaptureSubscription, _>(1, spec.clone(), Some(s));

    let refused = status(
        vec![
            tap(TapState::Healthy, None),
            tap(TapState::Refused, Some(RefusalKind::ExclusiveDivertPresent)),
        ],
        Some(false),
    );
    let (s, m) = health(&sub(refused));
    assert_eq!((s.as_str(), m.contains("REFUSED")), ("Degraded", true), "{m}");
    assert_eq!(
        health(&sub(status(vec![tap(TapState::Degraded, None)], Some(false)))).0,
        "Degraded"
    );
    assert_eq!(
        health(&sub(status(vec![tap(TapState::Pending, None)], None))).0,
        "Progressing"
    );
    assert_eq!(
        health(&sub(status(vec![tap(TapState::Healthy, None)], Some(true)))).0,
        "Healthy"
    );
    // Paused: Suspended, with what waits.
    let mut paused = status(vec![tap(TapState::Healthy, None)], Some(false));
    conditions::set_paused(&mut paused.conditions, true, "no tap is installed", Some(1));
    let (s, m) = health(&sub(paused));
    assert_eq!(
        (s.as_str(), m.contains("no tap is installed")),
        ("Suspended", true),
        "{m}"
    );
    // Mode Sample: no taps; browses that fail make it Degraded, not Progressing.
    let mut failing = status(vec![], Some(false));
    conditions::set(
        &mut failing.conditions,
        conditions::DEGRADED,
        true,
        "BrowseFailed",
        "1 queue browses failed",
        Some(1),
    );
    let (s, m) = health(&sub(failing));
    assert_eq!(
        (s.as_str(), m.contains("BrowseFailed")),
        ("Degraded", true),
        "{m}"
    );
}

#[test]
fn connection_close_health_follows_its_phase() {
    use artemis_studio_operator::api::connection_close::{ClosePhase, ConnectionCloseStatus, TargetSnapshot};
    let spec = json!({"clusterRef": {"name": "prod"}, "target": {"node": "n1", "connectionId": "c1"}});
    let status = |observed: i64, phase: ClosePhase, message: &str| ConnectionCloseStatus {
        observed_generation: Some(observed),
        phase,
        target_description: Some("connection c1".into()),
        snapshot: Some(TargetSnapshot {
            client_id: Some("orders-app".into()),
            ..Default::default()
        }),
        message: Some(message.into()),
        ..Default::default()
    };
    let cc = |generation, s: ConnectionCloseStatus| {
        object::<ConnectionClose, _>(generation, spec.clone(), Some(s))
    };

    let (s, m) = health(&cc(
        1,
        status(
            1,
            ClosePhase::AwaitingConfirmation,
            "set spec.confirm to orders-app to close connection c1",
        ),
    ));
    assert_eq!(
        (s.as_str(), m.contains("spec.confirm")),
        ("Suspended", true),
        "{m}"
    );
    assert_eq!(
        health(&cc(2, status(1, ClosePhase::AwaitingConfirmation, "…"))).0,
        "Progressing",
        "confirm patched, not yet observed"
    );
    assert_eq!(
        health(&cc(2, status(2, ClosePhase::Closing, "closing"))).0,
        "Progressing"
    );
    assert_eq!(
        health(&cc(1, status(1, ClosePhase::Pending, ""))).0,
        "Progressing"
    );

    let mut done = status(2, ClosePhase::Completed, "closed connection c1 of orders-app");
    conditions::set(
        &mut done.conditions,
        "Complete",
        true,
        "Closed",
        "closed",
        Some(2),
    );
    assert_eq!(health(&cc(2, done.clone())).0, "Healthy");
    // A finished close is final (never retried): a later spec change does not make it pending.
    assert_eq!(health(&cc(3, done)).0, "Healthy");

    let mut gone = status(1, ClosePhase::Completed, "connection c1 is gone already");
    gone.already_gone = true;
    let (s, m) = health(&cc(1, gone));
    assert_eq!(
        (s.as_str(), m.starts_with("Already gone")),
        ("Healthy", true),
        "{m}"
    );

    let (s, m) = health(&cc(
        1,
        status(1, ClosePhase::Failed, "Failed: outcome unknown, not retried"),
    ));
    assert_eq!((s.as_str(), m.contains("not retried")), ("Degraded", true), "{m}");
    // A close that cannot start because its cluster is missing: for a person (issue 50).
    let mut lost = status(1, ClosePhase::Pending, "");
    let why = "ArtemisCluster ns/prod does not exist";
    conditions::set(
        &mut lost.conditions,
        "Ready",
        false,
        "ClusterNotFound",
        why,
        Some(1),
    );
    conditions::kstatus(&mut lost.conditions, &[], Some(1));
    let (s, m) = health(&cc(1, lost));
    assert_eq!(
        (s.as_str(), m.contains("ClusterNotFound")),
        ("Degraded", true),
        "{m}"
    );
}

#[test]
fn message_replay_health_follows_its_phase() {
    use artemis_studio_operator::api::message_replay::{MessageReplayStatus, ReplayPhase, ReplayPreview};
    let spec = json!({"clusterRef": {"name": "prod"}, "subscription": "orders-capture", "row": 42});
    let status = |observed: i64, phase: ReplayPhase, message: &str| MessageReplayStatus {
        observed_generation: Some(observed),
        phase,
        preview: Some(ReplayPreview {
            node: "n1".into(),
            address: "orders".into(),
            source_address: "orders".into(),
            body: "text".into(),
            body_bytes: 18,
            ..Default::default()
        }),
        shown_generation: Some(1),
        message: Some(message.into()),
        ..Default::default()
    };
    let mr =
        |generation, s: MessageReplayStatus| object::<MessageReplay, _>(generation, spec.clone(), Some(s));

    let (s, m) = health(&mr(
        1,
        status(
            1,
            ReplayPhase::AwaitingConfirmation,
            "preview shown in status.preview: set spec.confirm to \"orders\" to send it",
        ),
    ));
    assert_eq!(
        (s.as_str(), m.contains("spec.confirm")),
        ("Suspended", true),
        "{m}"
    );
    assert_eq!(
        health(&mr(2, status(1, ReplayPhase::AwaitingConfirmation, "…"))).0,
        "Progressing",
        "confirm patched, not yet observed"
    );
    let (s, m) = health(&mr(
        2,
        status(
            2,
            ReplayPhase::Sending,
            "confirmed: sending now; the outcome follows, never retried",
        ),
    ));
    assert_eq!(
        (s.as_str(), m.starts_with("Sending")),
        ("Progressing", true),
        "{m}"
    );
    assert_eq!(
        health(&mr(1, status(1, ReplayPhase::Pending, ""))).0,
        "Progressing"
    );

    let mut done = status(
        2,
        ReplayPhase::Completed,
        "sent to orders as a new message, broker message ID 8589934612",
    );
    done.sent_message_id = Some("8589934612".into());
    conditions::set(&mut done.conditions, "Complete", true, "Sent", "sent", Some(2));
    let (s, m) = health(&mr(2, done.clone()));
    assert_eq!((s.as_str(), m.contains("8589934612")), ("Healthy", true), "{m}");
    // A finished replay is final (never retried): a later spec change does not make it pending.
    assert_eq!(health(&mr(3, done)).0, "Healthy");

    let failed = status(
        1,
        ReplayPhase::Failed,
        "row 42's body was truncated at capture (the subscription's body limit): a partial body is never sent",
    );
    let (s, m) = health(&mr(1, failed.clone()));
    assert_eq!((s.as_str(), m.contains("never sent")), ("Degraded", true), "{m}");
    assert_eq!(
        health(&mr(2, failed)).0,
        "Degraded",
        "final, whatever its generation"
    );
    let (s, m) = health(&mr(
        2,
        status(
            2,
            ReplayPhase::Failed,
            "Failed: outcome unknown, not retried: the operator process that armed the replay stopped before recording its outcome",
        ),
    ));
    assert_eq!((s.as_str(), m.contains("not retried")), ("Degraded", true), "{m}");
    // A replay that cannot start because its cluster is missing: for a person.
    let mut lost = status(1, ReplayPhase::Pending, "");
    let why = "ArtemisCluster ns/prod does not exist";
    conditions::set(
        &mut lost.conditions,
        "Ready",
        false,
        "ClusterNotFound",
        why,
        Some(1),
    );
    conditions::kstatus(&mut lost.conditions, &[], Some(1));
    let (s, m) = health(&mr(1, lost));
    assert_eq!(
        (s.as_str(), m.contains("ClusterNotFound")),
        ("Degraded", true),
        "{m}"
    );
}

/// Status documents the controllers really wrote on the test bed (tests/fixtures/argocd,
/// recorded by tests/integration/gitops.rs, which asserts each verdict there) keep the verdict
/// they got: a script change that judges a real status differently fails here, without a bed.
/// Every kind has at least one. MessageReplay's are built from its controller's own stages until
/// tests/integration/gitops.rs drives one (their `source` says so).
#[test]
fn recorded_statuses_keep_their_verdicts() {
    let mut kinds = std::collections::BTreeSet::new();
    let mut files: Vec<_> = std::fs::read_dir(argocd_fixtures())
        .expect("tests/fixtures/argocd")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for path in files {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read fixture"))
            .expect("fixture json");
        let obj = &doc["object"];
        let (status, message) = health(obj);
        assert_eq!(
            status,
            doc["verdict"].as_str().expect("verdict"),
            "{}: {message}",
            path.display()
        );
        kinds.insert(obj["kind"].as_str().expect("kind").to_string());
    }
    for crd in artemis_studio_operator::api::all_crds() {
        assert!(
            kinds.contains(&crd.spec.names.kind),
            "no recorded status of {}",
            crd.spec.names.kind
        );
    }
}

/// Every kind has a script, and argocd-cm-patch.yaml carries each one verbatim under its
/// `resource.customizations.health.<group>_<Kind>` key (regenerate with deploy/argocd/generate).
#[test]
fn the_argocd_cm_patch_carries_every_script() {
    let text =
        std::fs::read_to_string(argocd_dir().join("argocd-cm-patch.yaml")).expect("argocd-cm-patch.yaml");
    let cm: Value = serde_saphyr::from_str(&text).expect("argocd-cm-patch.yaml is YAML");
    let data = cm["data"].as_object().expect("data");
    let kinds: Vec<String> = artemis_studio_operator::api::all_crds()
        .iter()
        .map(|c| c.spec.names.kind.clone())
        .collect();
    for kind in &kinds {
        let key = format!("resource.customizations.health.artemis-studio.io_{kind}");
        let in_cm = data.get(&key).and_then(Value::as_str);
        assert!(
            in_cm == Some(script(kind).as_str()),
            "{key} in deploy/argocd/argocd-cm-patch.yaml differs from health/{kind}.lua: run deploy/argocd/generate"
        );
    }
    assert_eq!(
        data.len(),
        kinds.len(),
        "argocd-cm-patch.yaml has keys for kinds that do not exist"
    );
}

/// The reasons a user asked for (`conditions::HELD`) are copied into every Argo CD script's
/// `held` table and every Flux `current` expression: a copy that drifts fails here.
#[test]
fn every_copy_of_the_held_reasons_is_conditions_held() {
    let flux = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/flux/health-check-exprs.yaml"),
    )
    .expect("deploy/flux/health-check-exprs.yaml");
    let quoted: Vec<String> = conditions::HELD.iter().map(|r| format!("'{r}'")).collect();
    let list = format!("c.reason in [{}]", quoted.join(", "));
    let currents: Vec<&str> = flux.lines().filter(|l| l.contains("current:")).collect();
    assert!(!currents.is_empty(), "no current expression in the Flux file");
    for line in currents {
        assert!(
            line.contains(&list),
            "Flux expression without exactly {list}: {line}"
        );
    }
    for kind in [
        "ArtemisQueue",
        "ArtemisDivert",
        "ArtemisCluster",
        "ArtemisCaptureSubscription",
    ] {
        let lua = script(kind);
        let table = lua
            .split("local held = {")
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .unwrap_or_else(|| panic!("{kind}.lua has no held table"));
        let mut in_lua: Vec<&str> = table
            .split(',')
            .filter_map(|e| e.split('=').next())
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        in_lua.sort();
        let mut held: Vec<&str> = conditions::HELD.to_vec();
        held.sort();
        assert_eq!(in_lua, held, "{kind}.lua's held table");
    }
}
