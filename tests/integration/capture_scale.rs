//! Issue 42 item 1, at the size CI affords: a pattern over 300 addresses on cluster c (a tap on
//! each of the 3 nodes: 900 taps). Judged from the audit rows, the brokers and the capture
//! passes the operator recorded, never from a sleep:
//! - armed at ≥ 100 installs/s (node taps installed over the first intent to the last outcome);
//! - c2 stopped and started (its non-durable capture queues gone with the process): every tap
//!   HEALTHY again within 2 passes of its return, and every node holds every ring queue;
//! - the subscription deleted: no capture divert or ring queue of it on any node within 2 passes.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::DeleteParams;
use serde_json::{Value, json};

use artemis_studio_operator::api::capture::TapState;

use crate::capture::divert_names;
use crate::queue::fixture;
use crate::support::{Broker, TestBed, brokers_exclusive, jolokia_raw, short_id, wait_until};

const ADDRESSES: usize = 300;
const NODES: usize = 3;
/// Issue 42's target (the benchmark's; the suite prints the rate it saw).
const INSTALLS_PER_SECOND: f64 = 100.0;

/// Create `names` as durable anycast queues on one broker, 100 to a POST.
pub(crate) async fn create_queues(bed: &TestBed, broker: &Broker, names: &[String]) {
    let mbean = format!("org.apache.activemq.artemis:broker=\"{}\"", broker.name);
    for chunk in names.chunks(100) {
        let body: Vec<Value> = chunk
            .iter()
            .map(|n| {
                let doc = json!({"name": n, "address": n, "routing-type": "ANYCAST", "durable": true});
                json!({"type": "exec", "mbean": mbean, "operation": "createQueue(java.lang.String,boolean)",
                       "arguments": [doc.to_string(), true]})
            })
            .collect();
        let (_, answer) =
            jolokia_raw(broker, &bed.broker_user(), Some("http://localhost"), json!(body)).await;
        let failed: Vec<&Value> = answer
            .as_array()
            .map(|a| a.iter().filter(|r| r["status"] != 200).collect())
            .unwrap_or_default();
        assert!(failed.is_empty(), "create queues on {}: {failed:?}", broker.name);
    }
}

/// The names of one broker's queues starting with `prefix`.
pub(crate) async fn queues_with(bed: &TestBed, broker: &Broker, prefix: &str) -> BTreeSet<String> {
    let held = crate::support::queue_names(bed, broker).await.unwrap_or_default();
    held.into_iter().filter(|n| n.starts_with(prefix)).collect()
}

#[tokio::test]
async fn three_hundred_addresses_are_tapped_fast_retapped_after_a_restart_and_swept_within_two_passes() {
    let _b = brokers_exclusive().await;
    let f = fixture("cap-scale", None).await;
    let id = short_id();
    f.clean.also(&id);
    let names: Vec<String> = (0..ADDRESSES).map(|i| format!("cap.{id}.s.{i:03}")).collect();
    let brokers = f.bed.cluster_brokers("c");
    for b in &brokers {
        create_queues(&f.bed, b, &names).await;
    }
    let taps = ADDRESSES * NODES;
    arm_at_rate(
        &f,
        json!({"queues": format!("cap.{id}.s.*"), "maxTaps": ADDRESSES}),
        (ADDRESSES, taps),
        Duration::from_secs(240),
    )
    .await;

    // A routine restart: c2's ring queues (non-durable) go with the process. Its return is
    // when the cluster says it is live again (the operator cannot act on it before).
    f.bed.broker_action("stop", "c2");
    wait_live(&f, "c", 2).await;
    f.bed.broker_action("start", "c2");
    wait_live(&f, "c", 3).await;
    let back = chrono::Utc::now();
    let c2 = f.bed.broker("c2");
    let prefix = artemis_studio_operator::api::CAPTURE_PREFIX;
    wait_until(
        "c2 holds every ring queue again",
        Duration::from_secs(240),
        || {
            let (bed, c2) = (&f.bed, &c2);
            async move { (queues_with(bed, c2, prefix).await.len() >= ADDRESSES).then_some(()) }
        },
    )
    .await;
    wait_healthy(&f, "scale", taps, Duration::from_secs(240)).await;
    // The passes that started after the return (one in flight then could not act on it).
    let took = passes_between(&f, "c", back, chrono::Utc::now()).await;
    eprintln!("every tap HEALTHY again {took} passes after c2's return");
    assert!(
        took <= 2,
        "every tap HEALTHY again only {took} passes after c2's return"
    );
    for b in &brokers {
        let rings = queues_with(&f.bed, b, prefix).await;
        let missing = names
            .iter()
            .filter(|n| !rings.iter().any(|r| r.contains(&n.replace('.', "~2E"))))
            .count();
        assert_eq!(
            missing, 0,
            "{} lacks {missing} ring queues after c2's return",
            b.name
        );
    }

    // Deleted: nothing of it is left on any node within 2 passes.
    f.subscriptions()
        .delete("scale", &DeleteParams::default())
        .await
        .expect("delete the subscription");
    let deleted = f.passes().await;
    let mine = format!("cap~2E{id}~2Es~2E");
    wait_until(
        "no tap of the deleted subscription on any node",
        Duration::from_secs(240),
        || {
            let (bed, brokers, mine) = (&f.bed, &brokers, &mine);
            async move { (left_on(bed, brokers, mine).await == 0).then_some(()) }
        },
    )
    .await;
    let took = f.passes().await - deleted;
    eprintln!("no tap left {took} passes after the delete");
    assert!(
        took <= 2,
        "taps left on the brokers until {took} passes after the delete"
    );
    f.wait_subscription_gone("scale").await;
}

/// Capture passes over the fixture's `cluster` that started after `from` and finished by `to`.
pub(crate) async fn passes_between(
    f: &crate::queue::Fixture,
    cluster: &str,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM capture_pass WHERE cluster = $1 AND started_at > $2 AND finished_at <= $3",
    )
    .bind(format!("{}/{cluster}", f.ns))
    .bind(from)
    .bind(to)
    .fetch_one(f.op.store.pool())
    .await
    .expect("count passes")
}

/// Until the fixture's ArtemisCluster `cluster` reports `n` live nodes.
pub(crate) async fn wait_live(f: &crate::queue::Fixture, cluster: &str, n: usize) {
    let api: kube::Api<artemis_studio_operator::api::ArtemisCluster> =
        kube::Api::namespaced(f.admin.clone(), &f.ns);
    wait_until(&format!("{n} live nodes"), Duration::from_secs(120), || {
        let api = api.clone();
        async move {
            let c = api.get(cluster).await.ok()?;
            (c.status?.nodes.iter().filter(|x| x.live).count() == n).then_some(())
        }
    })
    .await;
}

/// Capture diverts and ring queues whose names contain `mine`, over `brokers`.
pub(crate) async fn left_on(bed: &TestBed, brokers: &[Broker], mine: &str) -> usize {
    let prefix = artemis_studio_operator::api::CAPTURE_PREFIX;
    let mut n = 0;
    for b in brokers {
        n += divert_names(bed, b)
            .await
            .iter()
            .filter(|d| d.contains(mine))
            .count();
        n += queues_with(bed, b, prefix)
            .await
            .iter()
            .filter(|q| q.contains(mine))
            .count();
    }
    n
}

/// Until every one of `taps` taps of subscription `name` is HEALTHY (by tapCounts), at most `bound`.
pub(crate) async fn wait_healthy(f: &crate::queue::Fixture, name: &str, taps: usize, bound: Duration) {
    let api = f.subscriptions();
    let seen = std::sync::Mutex::new(String::new());
    let done = tokio::time::timeout(bound, async {
        loop {
            if let Ok(s) = api.get(name).await {
                // status.taps lists a bounded number; tapCounts counts them all.
                if s.status.as_ref().is_some_and(|st| {
                    st.tap_counts.healthy == taps as u64 && st.tap_counts.total() == taps as u64
                }) {
                    return;
                }
                let st = s.status.as_ref();
                let other = st.and_then(|st| st.taps.iter().find(|t| t.state != TapState::Healthy));
                if let Ok(mut seen) = seen.lock() {
                    *seen = format!("{:?}; e.g. {other:?}", st.map(|st| st.tap_counts));
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    let last = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(done.is_ok(), "{taps} taps not HEALTHY after {bound:?}: {last}");
}

/// Subscription "scale" with `spec`: every one of its `taps` HEALTHY within `bound`, each tap
/// installed by exactly one audited command that applied it on every node (no retry, no
/// second install: counted from the audit rows). The rate is measured and printed (issue 42's
/// target, at least 100 installs/s, is the benchmark's figure: a rate in the suite would judge
/// the machine's load, not the operator).
pub(crate) async fn arm_at_rate(
    f: &crate::queue::Fixture,
    spec: Value,
    (addresses, taps): (usize, usize),
    bound: Duration,
) {
    f.subscribe("scale", spec).await;
    wait_healthy(f, "scale", taps, bound).await;
    let (commands, applied, seconds) = installs(f).await;
    eprintln!(
        "{taps} taps armed: {commands} install commands, {applied} node taps applied in {seconds:.1} s ({:.0} installs/s; issue 42's target {INSTALLS_PER_SECOND})",
        applied as f64 / seconds.max(0.001)
    );
    assert_eq!(applied, taps as i64, "node taps applied by the installs");
    assert_eq!(
        commands, addresses as i64,
        "one install command per address (all its nodes), no retry"
    );
}

/// The `capture.install` rows of the fixture's namespace: commands, node taps they applied, and
/// the seconds from the first intent to the last outcome.
async fn installs(f: &crate::queue::Fixture) -> (i64, i64, f64) {
    sqlx::query_as(
        "SELECT count(*), COALESCE(SUM(jsonb_array_length(COALESCE(outcome_detail->'appliedNodes', '[]'::jsonb))), 0)::bigint, \
                COALESCE(EXTRACT(EPOCH FROM max(completed_at) - min(occurred_at)), 0)::float8 \
         FROM audit_event WHERE command = 'capture.install' AND object_namespace = $1",
    )
    .bind(&f.ns)
    .fetch_one(f.op.store.pool())
    .await
    .expect("install rows")
}
