//! What capture costs (issue 25 item 6), counted on the real test bed: one AMQP connection per
//! node for all of a process's drains there, closed with the last one; their idle coverage
//! confirmed in one statement; and no pass caused by capture's own status writes.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use artemis_studio_operator::api::capture::TapState;
use artemis_studio_operator::capture::connection::container_prefix;

use crate::capture::{amqp_send, broker_queue, exec, taps_in};
use crate::queue::{Fixture, fixture};
use crate::support::{
    Broker, TestBed, brokers_exclusive, brokers_shared, config_from, create_cluster, short_id,
    wait_cluster_condition, wait_until,
};

/// The connections on `broker` whose client (container) ID starts with `prefix`, and the
/// sessions of each.
pub async fn connections(bed: &TestBed, broker: &Broker, prefix: &str) -> Vec<i64> {
    let options = json!({"field": "clientID", "operation": "CONTAINS", "value": prefix}).to_string();
    let r = exec(
        bed,
        broker,
        "listConnections(java.lang.String,int,int)",
        json!([options, 1, 100]),
    )
    .await;
    let page: serde_json::Value = r["value"]
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_else(|| panic!("listConnections on {}: {r}", broker.name));
    page["data"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|c| c["sessionCount"].as_i64().unwrap_or(-1))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_drains_of_a_node_share_one_amqp_connection_which_closes_with_the_last() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-conn", None).await;
    let id = short_id();
    f.clean.also(&id);
    let addresses: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|x| format!("cap.{id}.{x}"))
        .collect();
    for a in &addresses {
        broker_queue(&f.bed, a).await;
    }
    f.subscribe("conn", json!({"queues": format!("cap.{id}.#")}))
        .await;
    f.wait_subscription("conn", "12 taps drained", |s| taps_in(s, TapState::Healthy) == 12)
        .await;
    let prefix = container_prefix(&f.op.ctx.instance_id);
    for b in f.bed.cluster_brokers("c") {
        assert_eq!(
            connections(&f.bed, &b, &prefix).await,
            vec![1],
            "{}: one connection with one session for its 4 drains",
            b.name
        );
    }
    // Idle, their 12 open coverage intervals are confirmed per node (issue 42): each attached
    // to its node's heartbeat row, the 3 rows beating in one statement (one `now()`), and no
    // interval written while nothing changes.
    let pool = f.op.store.pool().clone();
    let cluster = format!("{}/c", f.ns);
    let beat = || {
        let (pool, cluster) = (pool.clone(), cluster.clone());
        async move {
            let (open, heartbeats, instants, at): (i64, i64, i64, Option<chrono::DateTime<chrono::Utc>>) =
                sqlx::query_as(
                    "SELECT count(*), count(DISTINCT c.heartbeat_id), count(DISTINCT h.confirmed_until), \
                     max(h.confirmed_until) FROM capture_coverage c \
                     LEFT JOIN capture_drain_heartbeat h ON h.id = c.heartbeat_id \
                     WHERE c.cluster = $1 AND c.ended_at IS NULL",
                )
                .bind(&cluster)
                .fetch_one(&pool)
                .await
                .ok()?;
            (open == 12 && heartbeats == 3 && instants == 1).then_some(at?)
        }
    };
    let first = wait_until(
        "12 intervals on 3 heartbeats beating together",
        Duration::from_secs(30),
        beat,
    )
    .await;
    let own = || {
        let (pool, cluster) = (pool.clone(), cluster.clone());
        async move {
            sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
                "SELECT confirmed_until FROM capture_coverage WHERE cluster = $1 AND ended_at IS NULL ORDER BY id",
            )
            .bind(&cluster)
            .fetch_all(&pool)
            .await
            .expect("intervals")
        }
    };
    let before = own().await;
    wait_until("two more beats", Duration::from_secs(30), || async {
        beat()
            .await
            .filter(|at| *at > first + chrono::Duration::seconds(6))
    })
    .await;
    assert_eq!(own().await, before, "an idle beat writes no interval");
    let confirmed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM capture_coverage_confirmed WHERE cluster = $1 AND ended_at IS NULL \
         AND confirmed_until > $2",
    )
    .bind(&cluster)
    .bind(first)
    .fetch_one(&pool)
    .await
    .expect("confirmed");
    assert_eq!(
        confirmed, 12,
        "a reader sees every idle interval confirmed by its heartbeat"
    );

    // Every drain works on it: one message to each address is stored.
    for a in &addresses {
        amqp_send(&f.bed, "c2", a, 1, &short_id()).await.expect("send");
    }
    f.wait_rows("conn", addresses.len()).await;

    f.subscriptions()
        .delete("conn", &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_subscription_gone("conn").await;
    for b in f.bed.cluster_brokers("c") {
        let (bed, b, prefix) = (&f.bed, &b, &prefix);
        wait_until(
            &format!("{}: the capture connection closed with its last drain", b.name),
            Duration::from_secs(30),
            || async move { connections(bed, b, prefix).await.is_empty().then_some(()) },
        )
        .await;
    }
}

/// A fixture whose operator passes only every 10 minutes on its own: any other pass was asked
/// for by a change.
async fn rarely_passing(prefix: &str) -> Fixture {
    let bed = TestBed::get();
    let ns = bed.fresh_namespace(prefix).await;
    let db = bed.fresh_database().await;
    bed.install_operator_rbac().await;
    let clean = bed.clean_up(&[]);
    let config = config_from(&bed.var("TESTBED_OPERATOR_KUBECONFIG")).await;
    let op = bed
        .start_operator_passing_every(
            &[&ns],
            &db,
            &format!("test-{}", short_id()),
            config,
            Duration::from_secs(600),
        )
        .await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    Fixture {
        bed,
        ns,
        admin,
        op,
        clean,
    }
}

#[tokio::test]
async fn capture_status_writes_under_traffic_cause_no_pass_and_a_change_does() {
    let _shared = brokers_shared().await;
    let f = rarely_passing("cap-quiet").await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.quiet");
    broker_queue(&f.bed, &address).await;
    f.subscribe("quiet", json!({"queues": address})).await;
    // The creation and the finalizer it gets are changes: they make the passes that install
    // the taps and see them drained (each spec or metadata change asks for one).
    let mut asked = 0;
    loop {
        let s = f.subscriptions().get("quiet").await.expect("get");
        if taps_in(&s, TapState::Healthy) == 3 {
            break;
        }
        assert!(asked < 10, "taps never drained: {:?}", s.status);
        asked += 1;
        asked_pass(&f, "quiet", asked).await;
    }
    // Traffic for a few seconds; while it flows, every pass has new counts to write to status.
    // A change asks for one pass in the middle of it: were capture's own status write to wake
    // the worker, that pass would start a chain of passes until the traffic ends.
    let producer = tokio::spawn(paced_send(TestBed::get(), address.clone(), 100));
    stored_at_least(&f, "quiet", 5).await;
    asked_pass(&f, "quiet", 50).await;
    // The asked-for pass started before its status was seen; any pass starting after that,
    // until every row is stored, was asked for by nothing but capture's own writes.
    let seen = chrono::Utc::now();
    producer.await.expect("producer");
    f.wait_rows("quiet", 100).await;
    let during: i64 =
        sqlx::query_scalar("SELECT count(*) FROM capture_pass WHERE cluster = $1 AND started_at > $2")
            .bind(format!("{}/c", f.ns))
            .bind(seen)
            .fetch_one(f.op.store.pool())
            .await
            .expect("count passes");
    assert_eq!(during, 0, "passes while only capture's own status changed");

    // A change asks for a pass: it runs, and status has the counts.
    asked_pass(&f, "quiet", 100).await;
    f.wait_subscription("quiet", "the counts after the asked-for pass", |s| {
        s.status
            .as_ref()
            .is_some_and(|st| st.taps.iter().map(|t| t.captured).sum::<u64>() == 100)
    })
    .await;
    f.subscriptions()
        .delete("quiet", &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_subscription_gone("quiet").await;
}

/// Issue 42: capture pays per node, not per tap. With 40 taps on each node, a pass reads every
/// node's loss counters in one request of a few operations (the sources in one wildcard read,
/// the rings and their addresses in one each), not several reads per tap (counted: 7 per tap
/// before). The operations are counted in the operator's own `jolokia_requests_total` for c1,
/// with every other test's operator kept off the brokers.
#[tokio::test]
async fn a_pass_reads_a_nodes_counters_in_a_few_operations_whatever_its_taps() {
    const TAPS: usize = 40;
    let _alone = brokers_exclusive().await;
    let f = rarely_passing("cap-reads").await;
    let id = short_id();
    f.clean.also(&id);
    for k in 0..TAPS {
        broker_queue(&f.bed, &format!("cap.{id}.r{k}")).await;
    }
    f.subscribe("quiet", json!({"queues": format!("cap.{id}.*")}))
        .await;
    let mut asked = 0;
    loop {
        let s = f.subscriptions().get("quiet").await.expect("get");
        // Status lists a bounded number of taps; the counts are of every tap.
        let counts = s.status.map(|st| st.tap_counts).unwrap_or_default();
        if counts.healthy == 3 * TAPS as u64 {
            break;
        }
        assert!(asked < 10, "taps never drained: {counts:?}");
        asked += 1;
        asked_pass(&f, "quiet", asked).await;
    }
    let c1 = f.bed.cluster_brokers("c")[0].jolokia.clone();
    let ops = || f.op.ctx.broker.requests_of(&c1);
    let mut per_pass = vec![];
    for n in 0..3 {
        let before = ops();
        asked_pass(&f, "quiet", 20 + n).await;
        per_pass.push(ops() - before);
    }
    // A pass: the inventory (3), the counters (3); a cluster poll meanwhile adds its own few.
    let least = per_pass.iter().copied().min().unwrap_or(u64::MAX);
    assert!(
        least < TAPS as u64 / 2,
        "Jolokia operations on c1 per pass with {TAPS} taps there: {per_pass:?}"
    );
    f.subscriptions()
        .delete("quiet", &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_subscription_gone("quiet").await;
}

/// A change that asks for a pass (a spec field mode Capture does not use), and the pass that
/// saw it: the status it writes carries the change's generation. (A count of passes would not
/// say which pass: a pass asked for just before may still be running when the change arrives.)
async fn asked_pass(f: &Fixture, name: &str, n: usize) {
    let patched = f
        .subscriptions()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sampleIntervalSeconds": 10 + n}})),
        )
        .await
        .expect("patch");
    let generation = patched.metadata.generation;
    f.wait_subscription(name, "the pass the change asked for", |s| {
        s.status
            .as_ref()
            .is_some_and(|st| st.observed_generation >= generation)
    })
    .await;
}

/// Wait until the subscription has stored at least `n` rows.
async fn stored_at_least(f: &Fixture, subscription: &str, n: i64) {
    let pool = f.op.store.pool().clone();
    wait_until(
        &format!("{n} rows of {subscription}"),
        Duration::from_secs(60),
        || {
            let pool = pool.clone();
            async move {
                let stored: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE subscription = $1")
                        .bind(subscription)
                        .fetch_one(&pool)
                        .await
                        .ok()?;
                (stored >= n).then_some(())
            }
        },
    )
    .await;
}

/// `n` messages to `address` on c1, 40 ms apart, each accepted.
async fn paced_send(bed: TestBed, address: String, n: usize) {
    use fe2o3_amqp::types::messaging::Outcome;
    let mut producer = crate::support::amqp_producer(&bed, "c1", &address, &short_id())
        .await
        .expect("producer");
    for i in 0..n {
        let sent = producer.sender.send(format!("m {i}")).await;
        assert!(matches!(sent, Ok(Outcome::Accepted(_))), "message {i}: {sent:?}");
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    producer.close().await;
}
