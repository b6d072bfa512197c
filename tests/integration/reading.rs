//! Capture, part 3 (ADR-0062 D2, D10; ADR-0049) on the real test bed: the reading commands run as
//! a user runs them — `kubectl artemis …` through the bed's kubectl, which finds the
//! `kubectl-artemis` plugin on PATH — against the Postgres of a real operator that captured real
//! messages from real brokers. Each test starts from queues made behind the operator's back.

use std::process::Stdio;
use std::time::Duration;

use fe2o3_amqp::types::messaging::{ApplicationProperties, Message, Outcome as Delivery, Properties, Source};
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use artemis_studio_operator::api::capture::TapState;

use crate::capture::{broker_queue, taps_in};
use crate::queue::{Fixture, fixture, ready};
use crate::support::{TestBed, brokers_shared, short_id, wait_until};

/// `kubectl artemis <args>` with the bed's kubectl and this build's plugin on PATH, reading the
/// fixture operator's database.
fn kubectl_artemis(f: &Fixture, args: &[&str]) -> tokio::process::Command {
    let plugin = std::path::Path::new(env!("CARGO_BIN_EXE_kubectl-artemis"));
    let dir = plugin.parent().expect("plugin directory");
    let mut c = tokio::process::Command::new(f.bed.var("TESTBED_KUBECTL"));
    c.arg("artemis")
        .args(args)
        .env(
            "PATH",
            format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default()),
        )
        .env("DATABASE_URL", &f.op.db)
        .env("KUBECONFIG", f.bed.var("TESTBED_KUBECONFIG"))
        .kill_on_drop(true);
    c
}

/// Run to completion; the JSON documents it printed (one per line).
async fn documents(f: &Fixture, args: &[&str]) -> Vec<Value> {
    let out = kubectl_artemis(f, args)
        .output()
        .await
        .expect("run kubectl artemis");
    assert!(
        out.status.success(),
        "kubectl artemis {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

async fn text_output(f: &Fixture, args: &[&str]) -> String {
    let out = kubectl_artemis(f, args)
        .output()
        .await
        .expect("run kubectl artemis");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// One AMQP connection and session to a broker of the bed.
pub struct Amqp {
    connection: fe2o3_amqp::connection::ConnectionHandle<()>,
    session: fe2o3_amqp::session::SessionHandle<()>,
}

impl Amqp {
    pub async fn open(bed: &TestBed, broker: &str, container: &str) -> Amqp {
        let b = bed.broker(broker);
        let (u, p) = bed.broker_user();
        let url = b.amqp.replace("amqp://", &format!("amqp://{u}:{p}@"));
        let mut connection = fe2o3_amqp::Connection::open(container.to_string(), url.as_str())
            .await
            .expect("AMQP connection");
        let session = fe2o3_amqp::Session::begin(&mut connection)
            .await
            .expect("AMQP session");
        Amqp { connection, session }
    }

    pub async fn send(
        &mut self,
        address: &str,
        messages: Vec<Message<fe2o3_amqp::types::messaging::AmqpValue<String>>>,
    ) {
        let mut sender = fe2o3_amqp::Sender::attach(&mut self.session, format!("tx-{}", short_id()), address)
            .await
            .expect("attach sender");
        for m in messages {
            match sender.send(m).await {
                Ok(Delivery::Accepted(_)) => {}
                other => panic!("send to {address}: {other:?}"),
            }
        }
        let _ = sender.close().await;
    }

    pub async fn close(mut self) {
        let _ = self.session.end().await;
        let _ = self.connection.close().await;
    }
}

pub fn text(
    body: &str,
    properties: &[(&str, &str)],
) -> Message<fe2o3_amqp::types::messaging::AmqpValue<String>> {
    let mut app = ApplicationProperties::builder();
    for (k, v) in properties {
        app = app.insert(k.to_string(), v.to_string());
    }
    Message::builder()
        .application_properties(app.build())
        .value(body.to_string())
        .build()
}

/// Captured rows of one subscription, stored.
async fn stored(f: &Fixture, subscription: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE subscription = $1")
        .bind(subscription)
        .fetch_one(f.op.store.pool())
        .await
        .expect("count")
}

pub async fn wait_stored(f: &Fixture, subscription: &str, n: i64) {
    wait_until(
        &format!("{n} rows of {subscription} stored"),
        Duration::from_secs(90),
        || async move { (stored(f, subscription).await >= n).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn tail_under_kubectl_shows_only_what_was_sent_after_it_started_and_reports_complete_coverage() {
    let _shared = brokers_shared().await;
    let f = fixture("read-tail", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("read.{id}.tail");
    broker_queue(&f.bed, &address).await;
    f.subscribe("tail", json!({"queues": address})).await;
    f.wait_subscription("tail", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    // Already stored before the tail starts: never shown by it.
    let mut amqp = Amqp::open(&f.bed, "c1", &format!("tail-{}", short_id())).await;
    amqp.send(
        &address,
        (0..3).map(|i| text(&format!("before {i}"), &[])).collect(),
    )
    .await;
    wait_stored(&f, "tail", 3).await;

    let mut child = kubectl_artemis(
        &f,
        &[
            "capture",
            "tail",
            "tail",
            "-n",
            &f.ns,
            "-o",
            "json",
            "--count",
            "5",
            "--for",
            "120s",
            "--interval",
            "200ms",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start the tail");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the tail starts")
        .expect("read")
        .expect("a first line");
    let started: Value = serde_json::from_str(&first).expect("json");
    assert_eq!(started["kind"], "TailStarted", "{started}");
    assert_eq!(started["mode"], "capture");

    amqp.send(
        &address,
        (0..5).map(|i| text(&format!("after {i}"), &[])).collect(),
    )
    .await;
    amqp.close().await;
    let mut docs = vec![];
    let collected = tokio::time::timeout(Duration::from_secs(150), async {
        while let Some(l) = lines.next_line().await.expect("read") {
            docs.push(serde_json::from_str::<Value>(&l).expect("json line"));
        }
    })
    .await;
    assert!(collected.is_ok(), "the tail ends after --count: {docs:?}");
    let status = child.wait().await.expect("exit");
    assert!(status.success(), "{status}");

    let messages = of_kind(&docs, "Message");
    let mut bodies: Vec<&str> = messages.iter().filter_map(|m| m["bodyText"].as_str()).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        ["after 0", "after 1", "after 2", "after 3", "after 4"],
        "exactly the messages sent after the tail started: {docs:?}"
    );
    assert!(
        messages
            .iter()
            .all(|m| m["origin"] == "captured" && m["originalAddress"] == address.as_str()),
        "{messages:?}"
    );
    assert!(messages.iter().all(|m| {
        m["claim"]
            .as_str()
            .is_some_and(|c| c.contains("not evidence of delivery"))
    }));
    let coverage = docs.last().expect("a last document");
    assert_eq!(
        coverage["kind"], "Coverage",
        "the tail ends with its coverage: {coverage}"
    );
    let taps = coverage["taps"].as_array().expect("taps");
    assert_eq!(taps.len(), 3, "one tap per node: {coverage}");
    assert!(
        taps.iter()
            .all(|t| t["verdict"] == "COMPLETE" && t["address"] == address.as_str()),
        "{coverage}"
    );
    assert_eq!(coverage["complete"], true, "{coverage}");
    f.subscriptions()
        .delete("tail", &DeleteParams::default())
        .await
        .expect("delete");
}

#[tokio::test]
async fn search_by_property_and_text_returns_exactly_the_matching_captured_rows_page_by_page() {
    let _shared = brokers_shared().await;
    let f = fixture("read-search", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("read.{id}.search");
    broker_queue(&f.bed, &address).await;
    f.subscribe("search", json!({"queues": address})).await;
    f.wait_subscription("search", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    let mut amqp = Amqp::open(&f.bed, "c2", &format!("search-{}", short_id())).await;
    let mut batch = vec![];
    for i in 0..3 {
        batch.push(text(&format!("blue order {i}"), &[("region", "eu")]));
    }
    for i in 0..2 {
        batch.push(text(&format!("blue order us{i}"), &[("region", "us")]));
    }
    for i in 0..2 {
        batch.push(text(&format!("red order {i}"), &[("region", "eu")]));
    }
    amqp.send(&address, batch).await;
    amqp.close().await;
    wait_stored(&f, "search", 7).await;

    // What matches, read straight from the table.
    let mut expected: Vec<i64> = sqlx::query_scalar(
        "SELECT row_id FROM captured_message WHERE subscription = 'search' \
         AND properties ->> 'region' = 'eu' AND body_text LIKE '%blue%' ORDER BY row_id",
    )
    .fetch_all(f.op.store.pool())
    .await
    .expect("expected rows");
    assert_eq!(expected.len(), 3);
    let args = |extra: &[&str]| {
        let mut a: Vec<String> = [
            "capture",
            "search",
            "--subscription",
            "search",
            "-n",
            &f.ns,
            "--where",
            "region=eu",
            "--text",
            "blue",
            "--since",
            "1h",
            "-o",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let first_args = args(&["--limit", "2"]);
    let first = documents(&f, &first_args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let page1: Vec<i64> = of_kind(&first, "Message")
        .iter()
        .filter_map(|m| m["rowId"].as_i64())
        .collect();
    let next = of_kind(&first, "NextPage");
    assert_eq!(next.len(), 1, "a full page says where the next starts: {first:?}");
    let after = next[0]["after"].as_i64().expect("after").to_string();
    let second_args = args(&["--limit", "2", "--after", &after]);
    let second = documents(&f, &second_args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let page2: Vec<i64> = of_kind(&second, "Message")
        .iter()
        .filter_map(|m| m["rowId"].as_i64())
        .collect();
    assert!(of_kind(&second, "NextPage").is_empty(), "{second:?}");
    let mut got: Vec<i64> = page1.iter().chain(page2.iter()).copied().collect();
    got.sort();
    expected.sort();
    assert_eq!(got, expected, "exactly the matching rows, over two pages");
    for m in of_kind(&first, "Message")
        .iter()
        .chain(of_kind(&second, "Message").iter())
    {
        assert_eq!(m["properties"]["region"], "eu");
        assert!(
            m["bodyText"].as_str().is_some_and(|b| b.starts_with("blue")),
            "{m}"
        );
        assert_eq!(m["origin"], "captured");
    }
    let coverage = of_kind(&second, "Coverage");
    assert_eq!(coverage.len(), 1);
    assert_eq!(
        coverage[0]["taps"].as_array().map(Vec::len),
        Some(3),
        "{}",
        coverage[0]
    );

    // The table a person reads: captured rows, never marked sampled, and the coverage statement.
    let table = text_output(
        &f,
        &[
            "capture",
            "search",
            "--cluster",
            "c",
            "-n",
            &f.ns,
            "--address",
            &address,
            "--text",
            "red",
        ],
    )
    .await;
    assert!(
        table.contains("red order 0") && table.contains("red order 1"),
        "{table}"
    );
    assert!(!table.contains("blue order"), "{table}");
    assert!(
        table.contains("captured") && !table.contains("SAMPLED"),
        "{table}"
    );
    assert!(table.contains("coverage "), "{table}");
    f.subscriptions()
        .delete("search", &DeleteParams::default())
        .await
        .expect("delete");
}

/// Issue 42: two subscriptions capturing one address store each message twice, and the table
/// showed the two rows alike. Each row names its subscription: the table's SUBSCRIPTION column,
/// `subscription` in JSON.
#[tokio::test]
async fn overlapping_subscriptions_show_a_message_once_per_subscription_told_apart() {
    let _shared = brokers_shared().await;
    let f = fixture("read-overlap", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("read.{id}.overlap");
    broker_queue(&f.bed, &address).await;
    for s in ["audit", "billing"] {
        f.subscribe(s, json!({"queues": address})).await;
    }
    for s in ["audit", "billing"] {
        f.wait_subscription(s, "3 taps drained", |x| taps_in(x, TapState::Healthy) == 3)
            .await;
    }
    let mut amqp = Amqp::open(&f.bed, "c1", &format!("overlap-{id}")).await;
    amqp.send(&address, vec![text("one order", &[])]).await;
    amqp.close().await;
    wait_stored(&f, "audit", 1).await;
    wait_stored(&f, "billing", 1).await;

    let table = text_output(&f, &["capture", "search", "--cluster", "c", "-n", &f.ns]).await;
    let column = table
        .lines()
        .next()
        .and_then(|head| head.find("SUBSCRIPTION"))
        .unwrap_or_else(|| panic!("no SUBSCRIPTION column:\n{table}"));
    let mut named: Vec<&str> = table
        .lines()
        .filter(|l| l.contains("one order"))
        .filter_map(|l| l.get(column..)?.split_whitespace().next())
        .collect();
    named.sort();
    assert_eq!(
        named,
        ["audit", "billing"],
        "one row per subscription, named:\n{table}"
    );

    let docs = documents(
        &f,
        &["capture", "search", "--cluster", "c", "-n", &f.ns, "-o", "json"],
    )
    .await;
    let mut named: Vec<&str> = of_kind(&docs, "Message")
        .iter()
        .filter_map(|m| m["subscription"].as_str())
        .collect();
    named.sort();
    assert_eq!(named, ["audit", "billing"], "{docs:?}");
    for s in ["audit", "billing"] {
        f.subscriptions()
            .delete(s, &DeleteParams::default())
            .await
            .expect("delete");
    }
}

#[tokio::test]
async fn requests_pairs_replies_with_latency_and_marks_a_temporary_reply_queue_not_capturable() {
    let _shared = brokers_shared().await;
    let f = fixture("read-rr", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (requests, replies) = (format!("rr.{id}.req"), format!("rr.{id}.replies"));
    broker_queue(&f.bed, &requests).await;
    broker_queue(&f.bed, &replies).await;
    f.subscribe("rr", json!({"queues": format!("rr.{id}.#")})).await;
    f.wait_subscription("rr", "6 taps drained", |s| taps_in(s, TapState::Healthy) == 6)
        .await;

    // The requester: two requests answered on a captured address (one gets no answer), one on a
    // temporary reply queue (a dynamic node the broker names).
    let mut requester = Amqp::open(&f.bed, "c1", &format!("requester-{id}")).await;
    let temporary = fe2o3_amqp::Receiver::builder()
        .name(format!("reply-rx-{id}"))
        .source(Source::builder().dynamic(true).build())
        .attach(&mut requester.session)
        .await
        .expect("a temporary reply queue");
    let temporary_address = temporary
        .source()
        .as_ref()
        .and_then(|s| s.address.clone())
        .expect("the broker names the temporary queue");
    let request = |message_id: &str, reply_to: &str| {
        Message::builder()
            .properties(
                Properties::builder()
                    .message_id(message_id.to_string())
                    .reply_to(reply_to.to_string())
                    .build(),
            )
            .value(format!("request {message_id}"))
            .build()
    };
    let (answered, unanswered, via_temporary) = (format!("a-{id}"), format!("b-{id}"), format!("c-{id}"));
    requester
        .send(
            &requests,
            vec![
                request(&answered, &replies),
                request(&unanswered, &replies),
                request(&via_temporary, &temporary_address),
            ],
        )
        .await;

    // The replier: a real consumer of the request queue that answers a and c.
    let mut replier = Amqp::open(&f.bed, "c1", &format!("replier-{id}")).await;
    let mut rx =
        fe2o3_amqp::Receiver::attach(&mut replier.session, format!("svc-rx-{id}"), requests.as_str())
            .await
            .expect("replier receiver");
    for _ in 0..3 {
        let d: fe2o3_amqp::link::delivery::Delivery<
            fe2o3_amqp::types::messaging::Body<fe2o3_amqp::types::primitives::Value>,
        > = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a request arrives")
            .expect("receive");
        let props = d.message().properties.clone().expect("properties");
        rx.accept(&d).await.expect("accept");
        let Some(fe2o3_amqp::types::messaging::MessageId::String(mid)) = props.message_id else {
            panic!("request without a string message ID: {props:?}");
        };
        if mid == unanswered {
            continue;
        }
        let to = props.reply_to.expect("reply-to");
        let reply = Message::builder()
            .properties(Properties::builder().correlation_id(mid.clone()).build())
            .value(format!("reply to {mid}"))
            .build();
        replier.send(&to, vec![reply]).await;
    }
    let _ = rx.close().await;
    replier.close().await;
    let _ = temporary.close().await;
    requester.close().await;
    // Three requests and one captured reply are stored (the temporary queue's reply never is).
    wait_stored(&f, "rr", 4).await;

    let docs = documents(
        &f,
        &[
            "capture",
            "requests",
            &requests,
            "-n",
            &f.ns,
            "--cluster",
            "c",
            "-o",
            "json",
        ],
    )
    .await;
    let exchanges = of_kind(&docs, "Exchange");
    assert_eq!(exchanges.len(), 3, "{docs:?}");
    let by_id = |mid: &str| -> &Value {
        exchanges
            .iter()
            .find(|x| x["requestMessageId"] == mid)
            .unwrap_or_else(|| panic!("request {mid}: {exchanges:?}"))
    };
    let a = by_id(&answered);
    assert_eq!(a["verdict"], "REPLIED", "{a}");
    assert!(a["latencyMs"].as_i64().is_some_and(|ms| ms >= 0), "{a}");
    assert_eq!(a["replyAddress"], replies.as_str());
    let b = by_id(&unanswered);
    assert_eq!(b["verdict"], "NO_REPLY_CAPTURED", "{b}");
    let c = by_id(&via_temporary);
    assert_eq!(
        c["verdict"], "REPLY_NOT_CAPTURABLE",
        "a reply over a temporary queue is never reported as no reply: {c}"
    );
    assert!(
        c["reason"].as_str().is_some_and(|r| r.contains("not capturable")),
        "{c}"
    );
    assert_eq!(of_kind(&docs, "Coverage").len(), 1, "{docs:?}");
    f.subscriptions()
        .delete("rr", &DeleteParams::default())
        .await
        .expect("delete");
}

#[tokio::test]
async fn audit_tells_a_queues_create_filter_change_and_delete_with_every_nodes_outcome() {
    let _shared = brokers_shared().await;
    let f = fixture("read-audit", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("audited.{id}");
    f.create(&name, json!({"filter": "color='red'"})).await;
    f.wait_for(&name, "Ready", ready).await;
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"filter": "color='blue'"}})),
        )
        .await
        .expect("patch filter");
    f.wait_for(&name, "the filter change applied", |q| {
        ready(q) && q.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
    })
    .await;
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_gone(&name).await;

    let object = format!("queue/{name}");
    let docs = documents(&f, &["audit", &object, "-n", &f.ns, "-o", "json"]).await;
    let commands: Vec<&str> = of_kind(&docs, "Audit")
        .iter()
        .filter_map(|a| a["command"].as_str())
        .collect();
    assert_eq!(
        commands,
        ["queue.delete", "queue.apply", "queue.apply"],
        "newest first: the delete, the filter change, the create: {docs:?}"
    );
    for a in of_kind(&docs, "Audit") {
        assert_eq!(a["outcome"], "succeeded", "{a}");
        let nodes = a["outcomeDetail"]["nodes"].as_array().expect("per-node outcomes");
        assert_eq!(nodes.len(), 3, "{a}");
        assert!(nodes.iter().all(|n| n["outcome"] == "APPLIED"), "{a}");
        assert!(a["actor"].as_str().is_some_and(|s| !s.is_empty()), "{a}");
    }
    assert!(
        docs.iter()
            .any(|a| a["params"].to_string().contains("color='blue'")),
        "the filter change's parameters are in its row: {docs:?}"
    );
    // The table a person reads, and the cluster-wide view.
    let table = text_output(&f, &["audit", &object, "-n", &f.ns]).await;
    assert!(
        table.contains("queue.delete") && table.contains("=APPLIED"),
        "{table}"
    );
    let cluster = documents(&f, &["audit", "--cluster", "c", "-n", &f.ns, "-o", "json"]).await;
    assert!(
        of_kind(&cluster, "Audit").len() >= 3,
        "the cluster's story includes the queue's commands: {cluster:?}"
    );
    // A typo names the fix.
    let out = kubectl_artemis(&f, &["audit", "pods/x", "-n", &f.ns])
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("use queue, divert, cluster, capture or connectionclose"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn sampled_and_captured_rows_are_never_rendered_alike_and_a_sampled_tail_says_so_from_its_start() {
    let _shared = brokers_shared().await;
    let f = fixture("read-sample", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (sampled, captured) = (format!("read.{id}.sampled"), format!("read.{id}.captured"));
    broker_queue(&f.bed, &sampled).await;
    broker_queue(&f.bed, &captured).await;
    // Messages already sitting on the sampled queue (no consumer): a browse sees them.
    let mut amqp = Amqp::open(&f.bed, "c1", &format!("sample-{id}")).await;
    amqp.send(
        &sampled,
        (0..3).map(|i| text(&format!("resting {i}"), &[])).collect(),
    )
    .await;
    f.subscribe(
        "peek",
        json!({"queues": sampled, "mode": "Sample", "sampleIntervalSeconds": 1}),
    )
    .await;
    f.subscribe("all", json!({"queues": captured})).await;
    f.wait_subscription("all", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    amqp.send(
        &captured,
        (0..3).map(|i| text(&format!("routed {i}"), &[])).collect(),
    )
    .await;
    amqp.close().await;
    wait_stored(&f, "peek", 3).await;
    wait_stored(&f, "all", 3).await;

    let docs = documents(
        &f,
        &[
            "capture",
            "search",
            "--cluster",
            "c",
            "-n",
            &f.ns,
            "--since",
            "1h",
            "-o",
            "json",
        ],
    )
    .await;
    let messages = of_kind(&docs, "Message");
    assert_eq!(messages.len(), 6, "{docs:?}");
    for m in &messages {
        let body = m["bodyText"].as_str().unwrap_or_default();
        if body.starts_with("resting") {
            assert_eq!(m["origin"], "sampled", "{m}");
            assert!(
                m["claim"].as_str().is_some_and(|c| c.starts_with("SAMPLED")),
                "{m}"
            );
        } else {
            assert_eq!(m["origin"], "captured", "{m}");
            assert!(
                m["claim"].as_str().is_some_and(|c| c.starts_with("captured")),
                "{m}"
            );
        }
    }
    let coverage = of_kind(&docs, "Coverage");
    assert_eq!(
        coverage[0]["sampledSubscriptions"],
        json!(["peek"]),
        "{}",
        coverage[0]
    );
    assert_eq!(
        coverage[0]["complete"], false,
        "a sampled subscription is never complete"
    );

    let table = text_output(&f, &["capture", "search", "--cluster", "c", "-n", &f.ns]).await;
    let line = |needle: &str| -> String {
        table
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle}: {table}"))
            .to_string()
    };
    assert!(line("resting 0").contains("~SAMPLED"), "{table}");
    assert!(
        line("routed 0").contains("captured") && !line("routed 0").contains("SAMPLED"),
        "{table}"
    );
    assert!(table.contains("only sample: never complete"), "{table}");

    // A sampled tail states its sampling from its first line and in its coverage.
    let tail = documents(
        &f,
        &[
            "capture", "tail", "peek", "-n", &f.ns, "-o", "json", "--for", "2s", "--last", "3",
        ],
    )
    .await;
    assert_eq!(tail[0]["kind"], "TailStarted");
    assert_eq!(tail[0]["mode"], "sample", "{:?}", tail[0]);
    assert!(
        tail[0]["claim"]
            .as_str()
            .is_some_and(|c| c.starts_with("SAMPLED"))
    );
    assert!(
        of_kind(&tail, "Message").iter().all(|m| m["origin"] == "sampled"),
        "{tail:?}"
    );
    assert_eq!(of_kind(&tail, "Message").len(), 3, "--last 3: {tail:?}");
    let tail_table = text_output(&f, &["capture", "tail", "peek", "-n", &f.ns, "--for", "1s"]).await;
    assert!(
        tail_table.lines().nth(1).is_some_and(|l| l.contains("SAMPLED")),
        "{tail_table}"
    );
    for s in ["peek", "all"] {
        f.subscriptions()
            .delete(s, &DeleteParams::default())
            .await
            .expect("delete");
    }
}

/// Issue 42: a database nothing listens on made the plugin wait 31–33 s and then say only "pool
/// timed out". Now: an error naming the server (host and port) and the cause within 5 s, with
/// the password from DATABASE_PASSWORD or from the URL never shown. No bed needed.
#[tokio::test]
async fn an_unreachable_database_is_named_with_its_cause_within_five_seconds() {
    // A port on 127.0.0.1 that was free a moment ago: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let plugin = env!("CARGO_BIN_EXE_kubectl-artemis");
    let cases = [
        (
            format!("postgres://reader@127.0.0.1:{port}/studio"),
            Some("Qxq@Zzy/secret"),
        ),
        (
            format!("postgres://reader:Qxq%40Zzy@127.0.0.1:{port}/studio"),
            None,
        ),
    ];
    for (url, password) in cases {
        let mut c = tokio::process::Command::new(plugin);
        c.args(["capture", "search", "--subscription", "orders", "--since", "1h"])
            .env("DATABASE_URL", &url)
            .env_remove("DATABASE_PASSWORD")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(p) = password {
            c.env("DATABASE_PASSWORD", p);
        }
        let started = std::time::Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(10), c.output())
            .await
            .expect("the plugin ends within 10 s")
            .expect("run kubectl-artemis");
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}: exited 0\n{stderr}");
        assert!(took < Duration::from_secs(5), "{url}: took {took:?}\n{stderr}");
        assert!(
            stderr.contains(&format!("127.0.0.1:{port}")),
            "{url}: no host:port in\n{stderr}"
        );
        assert!(stderr.contains("refused"), "{url}: no cause in\n{stderr}");
        assert!(!stderr.contains("pool timed out"), "{stderr}");
        for secret in ["Qxq", "Zzy", "secret"] {
            assert!(!stderr.contains(secret), "{url}: the password shows in\n{stderr}");
        }
    }
}

/// Issue 48 (verify): a captured message still waiting on its queue is found there (on the node
/// it was sent to, asked with the bed user's kubeconfig); once consumed it is "not found on any
/// live node" — never called consumed as a fact.
#[tokio::test]
async fn verify_finds_a_captured_message_on_its_queue_and_not_once_consumed() {
    let _shared = brokers_shared().await;
    let f = fixture("read-verify", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("verify.{id}");
    broker_queue(&f.bed, &address).await;
    f.subscribe("ver", json!({"queues": address})).await;
    f.wait_subscription("ver", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    let mut producer = Amqp::open(&f.bed, "c1", &format!("verify-p-{id}")).await;
    let message = Message::builder()
        .properties(Properties::builder().message_id(format!("v-{id}")).build())
        .value(format!("verify {id}"))
        .build();
    producer.send(&address, vec![message]).await;
    producer.close().await;
    wait_stored(&f, "ver", 1).await;
    let row: i64 = sqlx::query_scalar("SELECT row_id FROM captured_message WHERE subscription = 'ver'")
        .fetch_one(f.op.store.pool())
        .await
        .expect("the row");
    let row = row.to_string();
    let args = [
        "capture",
        "verify",
        row.as_str(),
        "--subscription",
        "ver",
        "-n",
        f.ns.as_str(),
        "-o",
        "json",
    ];
    let c1 = crate::cluster_core::node_id_of(&f.bed, "c1").await;

    let docs = documents(&f, &args).await;
    let v = &of_kind(&docs, "Verification")[0];
    assert_eq!(
        v["verdict"],
        json!(format!("present: {address} on {c1} (waiting)")),
        "{v}"
    );
    let answers = v["answers"].as_array().cloned().unwrap_or_default();
    assert_eq!(answers.len(), 3, "one queue per node: {answers:?}");
    // On demand, the same answer as a column of search.
    let search = [
        "capture",
        "search",
        "--subscription",
        "ver",
        "--verify",
        "-n",
        f.ns.as_str(),
    ];
    let docs = documents(&f, &[&search[..], &["-o", "json"]].concat()).await;
    let rows = of_kind(&docs, "Message");
    assert_eq!(rows.len(), 1, "{docs:?}");
    assert_eq!(rows[0]["verified"], v["verdict"], "{docs:?}");
    let table = text_output(&f, &search).await;
    assert!(
        table.lines().any(|l| l.contains("VERIFIED"))
            && table
                .lines()
                .any(|l| l.ends_with(&format!("present: {address} on {c1} (waiting)"))),
        "{table}"
    );

    let mut consumer = Amqp::open(&f.bed, "c1", &format!("verify-c-{id}")).await;
    let mut rx =
        fe2o3_amqp::Receiver::attach(&mut consumer.session, format!("verify-rx-{id}"), address.as_str())
            .await
            .expect("receiver");
    let d: fe2o3_amqp::link::delivery::Delivery<
        fe2o3_amqp::types::messaging::Body<fe2o3_amqp::types::primitives::Value>,
    > = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the message arrives")
        .expect("receive");
    rx.accept(&d).await.expect("accept");
    let _ = rx.close().await;
    consumer.close().await;
    let docs = documents(&f, &args).await;
    let v = &of_kind(&docs, "Verification")[0];
    let verdict = v["verdict"].as_str().unwrap_or_default();
    assert!(
        verdict.starts_with(
            "not found on any live node: consumed, expired, moved, or on a node that was not live"
        ),
        "{v}"
    );
    f.subscriptions()
        .delete("ver", &DeleteParams::default())
        .await
        .expect("delete");
}

/// Issue 48 (verify): a node that cannot be asked is named with why, and the verdict leaves the
/// message possibly there; a row whose message carried no id is offered verify, disabled, with
/// the reason (ADR-0062 D4).
#[tokio::test]
async fn verify_names_a_node_it_could_not_ask_and_a_row_without_an_id_says_why() {
    let _exclusive = crate::support::brokers_exclusive().await;
    let f = fixture("read-verify-not", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("verify.{id}.not");
    broker_queue(&f.bed, &address).await;
    f.subscribe("ver", json!({"queues": address})).await;
    f.wait_subscription("ver", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    let mut on_c2 = Amqp::open(&f.bed, "c2", &format!("verify-c2-{id}")).await;
    let with_id = Message::builder()
        .properties(Properties::builder().message_id(format!("n-{id}")).build())
        .value(format!("on c2 {id}"))
        .build();
    on_c2.send(&address, vec![with_id]).await;
    on_c2.close().await;
    let mut on_c1 = Amqp::open(&f.bed, "c1", &format!("verify-c1-{id}")).await;
    on_c1.send(&address, vec![text("no id", &[])]).await;
    on_c1.close().await;
    wait_stored(&f, "ver", 2).await;
    let rows: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT row_id, message_id FROM captured_message WHERE subscription = 'ver' ORDER BY row_id",
    )
    .fetch_all(f.op.store.pool())
    .await
    .expect("rows");
    let row_of = |has_id: bool| {
        rows.iter()
            .find(|(_, m)| m.is_some() == has_id)
            .map(|(r, _)| r.to_string())
            .expect("the row")
    };
    let v = verification_of(&f, &row_of(false)).await;
    let verdict = v["verdict"].as_str().unwrap_or_default();
    assert!(
        verdict.starts_with("cannot verify: the message carried no message id"),
        "{v}"
    );

    let c2 = crate::cluster_core::node_id_of(&f.bed, "c2").await;
    let _thaw = crate::support::Thaw(&f.bed, "c2");
    f.bed.broker_action("freeze", "c2");
    let v = verification_of(&f, &row_of(true)).await;
    let answers = v["answers"].as_array().cloned().unwrap_or_default();
    let on_c2: Vec<&Value> = answers.iter().filter(|a| a["node"] == json!(c2)).collect();
    assert!(
        on_c2.len() == 1 && on_c2[0]["state"] == "could-not-ask" && on_c2[0]["why"].is_string(),
        "{v}"
    );
    assert_eq!(
        v["verdict"],
        json!("not found on the nodes that answered; 1 could not be asked (see why): it may be there"),
        "{v}"
    );
    drop(_thaw);
    f.subscriptions()
        .delete("ver", &DeleteParams::default())
        .await
        .expect("delete");
}

async fn verification_of(f: &Fixture, row: &str) -> Value {
    let args = [
        "capture",
        "verify",
        row,
        "--subscription",
        "ver",
        "-n",
        &f.ns,
        "-o",
        "json",
    ];
    of_kind(&documents(f, &args).await, "Verification")[0].clone()
}
