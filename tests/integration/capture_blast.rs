//! Capture's blast radius before arming (issue 25 item 5) on the real test bed: a subscription
//! over many queues shows what it would install and installs nothing until that preview was
//! shown and armed (the "shown, then armed" rule of a ConnectionClose), or the annotation says
//! automation accepts it; the per-subscription cap refuses past it with a condition naming the
//! field and the fix; broker-internal addresses and another installation's capture prefix are
//! never tapped. "Nothing installed" is proven from later passes recorded in `capture_pass`.

use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use artemis_studio_operator::api::capture::TapState;

use crate::capture::{divert_names, taps_in};
use crate::queue::fixture;
use crate::sampling::condition;
use crate::support::{Broker, TestBed, brokers_shared, jolokia_raw, short_id};

const ORIGIN: Option<&str> = Some("http://localhost");

/// Queues made (or destroyed) on every node of cluster c in one bulk Jolokia request per node.
async fn bulk_queues(bed: &TestBed, queues: &[(String, String)], create: bool) {
    for b in bed.cluster_brokers("c") {
        let body: Vec<Value> = queues
            .iter()
            .map(|(name, address)| {
                let (operation, arguments) = if create {
                    let doc = json!({"name": name, "address": address, "routing-type": "ANYCAST", "durable": false});
                    ("createQueue(java.lang.String,boolean)", json!([doc.to_string(), true]))
                } else {
                    ("destroyQueue(java.lang.String,boolean,boolean)", json!([name, true, true]))
                };
                json!({"type": "exec", "mbean": format!("org.apache.activemq.artemis:broker=\"{}\"", b.name),
                       "operation": operation, "arguments": arguments})
            })
            .collect();
        let (status, r) = jolokia_raw(&b, &bed.broker_user(), ORIGIN, Value::Array(body)).await;
        assert_eq!(status, 200, "bulk on {}: {r}", b.name);
        if create {
            let failed: Vec<&Value> = r
                .as_array()
                .map(|a| a.iter().filter(|x| x["status"] != 200).collect())
                .unwrap_or_default();
            assert!(failed.is_empty(), "create on {}: {failed:?}", b.name);
        }
    }
}

/// Every divert of this operator instance's subscription `sub`, on every node of cluster c.
async fn diverts_of(bed: &TestBed, brokers: &[Broker], instance: &str, sub: &str) -> Vec<String> {
    let mut out = vec![];
    for b in brokers {
        out.extend(
            divert_names(bed, b)
                .await
                .into_iter()
                .filter(|d| d.starts_with(&format!("artemis-studio.capture.{instance}.")) && d.contains(sub)),
        );
    }
    out
}

/// (object name, params) of each capture.install audit row of this test's namespace.
async fn install_rows(f: &crate::queue::Fixture) -> Vec<(String, Value)> {
    sqlx::query_as::<_, (String, Value)>(
        "SELECT object_name, params FROM audit_event WHERE command = 'capture.install' AND object_namespace = $1 ORDER BY id",
    )
    .bind(&f.ns)
    .fetch_all(f.op.store.pool())
    .await
    .expect("audit rows")
}

#[tokio::test]
async fn a_broad_pattern_is_previewed_installs_nothing_until_armed_and_the_cap_refuses_past_it() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-blast", None).await;
    let brokers = f.bed.cluster_brokers("c");
    let instance = f.op.ctx.instance_id.clone();
    let id = short_id();
    f.clean.also(&id);
    // 300 ordinary queues: three in group g0, 297 in g1; and in g0 two queues whose addresses
    // are never tapped: a broker-internal one and another installation's capture address.
    let mut queues: Vec<(String, String)> = (0..3)
        .map(|i| format!("kb.{id}.g0.q{i}"))
        .chain((0..297).map(|i| format!("kb.{id}.g1.q{i:03}")))
        .map(|q| (q.clone(), q))
        .collect();
    let internal = format!("$sys.kb.{id}");
    let foreign = format!("artemis-studio.capture.other-install.kb~2E{id}.theirs");
    queues.push((format!("kb.{id}.g0.internal"), internal.clone()));
    queues.push((format!("kb.{id}.g0.foreign"), foreign.clone()));
    bulk_queues(&f.bed, &queues, true).await;

    // 1. The broad pattern: 300 addresses, past the default cap of 100. The preview says what
    // it would install; the condition names the field and the fix; nothing is installed, not
    // even with the annotation of automation.
    f.subscribe("wide", json!({"queues": format!("kb.{id}.#")})).await;
    let wide = f
        .wait_subscription("wide", "refused past spec.maxTaps", |s| {
            condition(s, "Ready").is_some_and(|c| c.1 == "TapCapExceeded")
        })
        .await;
    let p = wide.status.clone().and_then(|s| s.preview).expect("preview");
    assert_eq!((p.taps, p.nodes.len(), p.max_taps), (300, 3, 100), "{p:?}");
    assert_eq!(p.broker_objects, 300 * 3 * 4, "{p:?}");
    assert_eq!(p.addresses.len(), 50, "the preview lists a bounded number: {p:?}");
    assert!(
        p.never_tapped.contains(&internal) && p.never_tapped.contains(&foreign),
        "{p:?}"
    );
    let (_, _, m) = condition(&wide, "Ready").expect("Ready");
    assert!(m.contains("spec.maxTaps") && m.contains("at least 300"), "{m}");
    let (stalled, ..) = condition(&wide, "Stalled").expect("Stalled");
    assert_eq!(stalled, "True", "only a person can act: {:?}", wide.status);

    // 2. A narrower pattern, for review (no annotation): preview first, nothing installed.
    f.subscribe_for_review("narrow", json!({"queues": format!("kb.{id}.g0.*")}))
        .await;
    let narrow = f
        .wait_subscription("narrow", "awaiting its confirmation", |s| {
            condition(s, "Armed").is_some_and(|c| c.0 == "False" && c.1 == "AwaitingConfirmation")
        })
        .await;
    let p = narrow.status.clone().and_then(|s| s.preview).expect("preview");
    assert_eq!(
        (p.taps, p.nodes.len(), p.broker_objects),
        (3, 3, 3 * 3 * 4),
        "{p:?}"
    );
    assert!(
        p.addresses.iter().all(|a| a != &internal && a != &foreign),
        "never tapped: {p:?}"
    );
    assert_eq!(p.never_tapped.len(), 2, "{p:?}");
    let token = p.confirmation.clone();
    let (_, reason, m) = condition(&narrow, "Ready").expect("Ready");
    assert_eq!(reason, "AwaitingConfirmation");
    assert!(m.contains(&token) && m.contains("confirm-without-review"), "{m}");

    // A confirmation set before its preview was shown does not count (another subscription of
    // the same pattern: the same preview, confirmed at creation).
    f.subscribe_for_review(
        "early",
        json!({"queues": format!("kb.{id}.g0.*"), "confirm": token.clone()}),
    )
    .await;
    f.wait_subscription("early", "confirmed before shown", |s| {
        condition(s, "Armed").is_some_and(|c| c.1 == "ConfirmedBeforeShown")
    })
    .await;
    f.later_passes(2).await;
    for sub in ["wide", "narrow", "early"] {
        assert!(
            diverts_of(&f.bed, &brokers, &instance, sub).await.is_empty(),
            "{sub}: nothing installed before it is armed"
        );
    }
    assert!(
        install_rows(&f).await.is_empty(),
        "no install command before arming"
    );

    // 3. Armed after the preview: the three taps on every node, the audit rows say how.
    f.subscriptions()
        .patch(
            "narrow",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"confirm": token}})),
        )
        .await
        .expect("arm");
    let armed = f
        .wait_subscription("narrow", "9 taps healthy", |s| taps_in(s, TapState::Healthy) == 9)
        .await;
    let a = armed.status.clone().and_then(|s| s.armed).expect("armed");
    assert_eq!((a.how.as_str(), a.taps), ("ConfirmedAfterPreview", 3), "{a:?}");
    let rows = install_rows(&f).await;
    assert!(!rows.is_empty());
    assert!(
        rows.iter().all(|(o, p)| o == "narrow"
            && p["armed"]["how"] == "ConfirmedAfterPreview"
            && p["confirmWithoutReview"] == false),
        "{rows:?}"
    );
    let d = diverts_of(&f.bed, &brokers, &instance, "narrow").await;
    assert_eq!(d.len(), 9, "{d:?}");
    let escaped = |a: &str| artemis_studio_operator::api::capture_names::escape(a);
    assert!(
        d.iter()
            .all(|x| !x.contains(&escaped(&internal)) && !x.contains(&escaped(&foreign))),
        "internal and foreign addresses are never tapped: {d:?}"
    );

    // 4. The annotation arms "early" (automation accepts it), recorded in its audit rows.
    f.subscriptions()
        .patch(
            "early",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"artemis-studio.io/confirm-without-review": "true"}}}),
            ),
        )
        .await
        .expect("annotate");
    f.wait_subscription("early", "9 taps healthy", |s| taps_in(s, TapState::Healthy) == 9)
        .await;
    let rows = install_rows(&f).await;
    let early: Vec<&(String, Value)> = rows.iter().filter(|r| r.0 == "early").collect();
    assert!(!early.is_empty());
    assert!(
        early
            .iter()
            .all(|(_, p)| p["armed"]["how"] == "ConfirmWithoutReview" && p["confirmWithoutReview"] == true),
        "{early:?}"
    );
    // 18 drains, one AMQP connection per node (issue 25: capture pays per node).
    let prefix = artemis_studio_operator::capture::connection::container_prefix(&instance);
    for b in &brokers {
        let sessions = crate::capture_cost::connections(&f.bed, b, &prefix).await;
        assert_eq!(
            sessions,
            vec![1],
            "{}: one connection, one session for its 6 drains",
            b.name
        );
    }
    // The wide one still has nothing, many passes later.
    assert!(diverts_of(&f.bed, &brokers, &instance, "wide").await.is_empty());

    // Tidy the shared brokers: the subscriptions (their taps swept), then the queues.
    for sub in ["wide", "narrow", "early"] {
        let _ = f.subscriptions().delete(sub, &DeleteParams::default()).await;
    }
    for sub in ["wide", "narrow", "early"] {
        f.wait_subscription_gone(sub).await;
    }
    for sub in ["narrow", "early"] {
        assert!(diverts_of(&f.bed, &brokers, &instance, sub).await.is_empty());
    }
    bulk_queues(&f.bed, &queues, false).await;
}
