//! Issue 48 (MCP) on the real test bed: `kubectl artemis mcp` driven over stdio by a real MCP
//! client, the official Python SDK's ClientSession (tests/fixtures/mcp/client.py, run by
//! `deploy/dev/testbed mcp-client` from its pinned venv), with the bed's admin kubeconfig and
//! the fixture operator's database, against a real operator and real brokers.

use std::process::Stdio;
use std::time::Duration;

use artemis_studio_operator::api::capture::TapState;
use artemis_studio_operator::api::message_replay::MessageReplay;
use fe2o3_amqp::types::messaging::{Message, Properties};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::capture::{broker_queue, queue_attr, taps_in};
use crate::queue::{Fixture, fixture, ready};
use crate::reading::{Amqp, wait_stored};
use crate::support::{brokers_shared, send_messages, short_id, wait_until};

/// The user the bed's admin kubeconfig authenticates as (deploy/dev/testbed's token file).
const BED_ADMIN: &str = "testbed-admin";

/// One MCP session: the Python client, which runs the plugin's `mcp` as its stdio server.
struct Session {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Session {
    async fn start(f: &Fixture, client: &str, extra: &[&str]) -> Session {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dev/testbed");
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/client.py");
        let mut child = tokio::process::Command::new(script)
            .arg("mcp-client")
            .arg(fixture)
            .arg(env!("CARGO_BIN_EXE_kubectl-artemis"))
            .args(["mcp", "-n", f.ns.as_str(), "--wait-seconds", "90"])
            .args(extra)
            .env("KUBECONFIG", f.bed.var("TESTBED_KUBECONFIG"))
            .env("DATABASE_URL", &f.op.db)
            .env("MCP_CLIENT_NAME", client)
            .env("MCP_CLIENT_VERSION", "9.9")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the MCP client (deploy/dev/testbed mcp-client)");
        let stdin = child.stdin.take().expect("client stdin");
        let lines = BufReader::new(child.stdout.take().expect("client stdout")).lines();
        let mut s = Session { child, stdin, lines };
        let hello = s.next().await;
        assert_eq!(hello["initialized"]["server"], "kubectl-artemis", "{hello}");
        s
    }

    async fn next(&mut self) -> Value {
        // Generous: the first start may install the SDK into its venv (PyPI).
        let line = tokio::time::timeout(Duration::from_secs(600), self.lines.next_line())
            .await
            .expect("the MCP client answers")
            .expect("read the MCP client")
            .expect("the MCP client is still running");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    async fn ask(&mut self, request: Value) -> Value {
        let mut line = request.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to the MCP client");
        self.next().await
    }

    /// Every tool the server lists, by name.
    async fn tool_names(&mut self) -> Vec<String> {
        let listed = self.ask(json!({"op": "list"})).await;
        listed["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("no tools: {listed}"))
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .collect()
    }

    /// A tool's structured answer; panics on a tool error.
    async fn call(&mut self, name: &str, arguments: Value) -> Value {
        let r = self
            .ask(json!({"op": "call", "name": name, "arguments": arguments}))
            .await;
        assert_eq!(r["isError"], false, "{name} {arguments}: {r}");
        r["structured"].clone()
    }

    /// A tool's error text; panics when the tool succeeded.
    async fn refused(&mut self, name: &str, arguments: Value) -> String {
        let r = self
            .ask(json!({"op": "call", "name": name, "arguments": arguments}))
            .await;
        assert!(
            r["isError"] == true || r.get("error").is_some(),
            "{name} was not refused: {r}"
        );
        r["text"]
            .as_array()
            .map(|t| t.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"))
            .or_else(|| r["error"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    async fn close(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
        let _ = self.child.kill().await;
    }
}

fn outcomes(doc: &Value) -> Vec<String> {
    doc["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["outcome"].as_str().map(str::to_string))
        .collect()
}

/// Read tools answer from the real objects and database; without --allow-writes no write tool
/// is listed, nor served.
#[tokio::test]
async fn read_tools_answer_and_write_tools_are_absent_without_allow_writes() {
    let _shared = brokers_shared().await;
    let f = fixture("mcp-read", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("mcp.read.{id}");
    f.create(&name, json!({})).await;
    f.wait_for(&name, "Ready", ready).await;
    let mut s = Session::start(&f, "read-only-agent", &[]).await;

    let tools = s.tool_names().await;
    for t in [
        "list_clusters",
        "list_queues",
        "get_queue",
        "list_diverts",
        "capture_search",
        "capture_tail",
        "capture_requests",
        "capture_coverage",
        "capture_verify",
        "audit",
    ] {
        assert!(tools.iter().any(|n| n == t), "{t} is listed: {tools:?}");
    }
    assert!(
        !tools
            .iter()
            .any(|n| n.starts_with("preview_") || n.starts_with("apply_")),
        "no write tool without --allow-writes: {tools:?}"
    );
    s.refused("preview_queue", json!({"name": name, "cluster": "c"}))
        .await;

    let clusters = s.call("list_clusters", json!({})).await;
    let c = &clusters["clusters"][0];
    assert_eq!(
        (&c["name"], &c["liveNodes"]),
        (&json!("c"), &json!(3)),
        "{clusters}"
    );
    let live = c["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["live"] == true)
        .count();
    assert_eq!(live, 3, "{clusters}");

    let queues = s.call("list_queues", json!({"cluster": "c"})).await;
    let q = queues["queues"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|q| q["name"] == json!(name))
        .unwrap_or_else(|| panic!("{name} listed: {queues}"));
    assert_eq!(outcomes(q), ["APPLIED"; 3], "{q}");
    assert_eq!(q["ready"]["status"], "True", "{q}");
    let full = s.call("get_queue", json!({"name": name})).await;
    assert_eq!(full["deletePreview"]["totalMessages"], 0, "{full}");

    let audit = s.call("audit", json!({"object": format!("queue/{name}")})).await;
    assert_eq!(audit["commands"][0]["command"], "queue.apply", "{audit}");
    let search = s
        .call("capture_search", json!({"cluster": "c", "since": "5m"}))
        .await;
    assert_eq!(search["messages"], json!([]), "{search}");
    assert_eq!(search["coverage"]["kind"], "Coverage", "{search}");
    assert!(
        s.refused("capture_search", json!({"cluster": "c", "since": "soon"}))
            .await
            .contains("is not a duration")
    );
    s.close().await;
    f.queues()
        .delete(&name, &Default::default())
        .await
        .expect("delete");
    f.wait_gone(&name).await;
}

/// The first preview writes the object as a dry run (WOULD_APPLY on every node, nothing on the
/// brokers); a change made by someone else after it makes its token stale, and its apply is
/// refused with nothing applied.
async fn preview_then_refuse_when_stale(f: &Fixture, s: &mut Session, name: &str) {
    let first = s
        .call(
            "preview_queue",
            json!({"name": name, "cluster": "c", "spec": {"filter": "a = 1"}}),
        )
        .await;
    assert_eq!(outcomes(&first), ["WOULD_APPLY"; 3], "{first}");
    assert_eq!(first["blastRadius"]["nodesThatWouldBeWritten"], 3, "{first}");
    let stale = first["confirmationToken"].as_str().expect("a token").to_string();
    let c1 = f.bed.broker("c1");
    assert_eq!(
        queue_attr(&f.bed, &c1, name, "MessageCount").await,
        Value::Null,
        "a dry run writes no broker"
    );

    // The object changes after the preview: its token no longer applies.
    f.queues()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"filter": "a = 2"}})),
        )
        .await
        .expect("change the spec");
    // The audit's actor is the spec's last writer by managedFields time, whole seconds: keep the
    // apply out of this change's second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let refused = s.refused("apply_queue", json!({"token": stale})).await;
    assert!(refused.contains("stale"), "{refused}");
    let q = f.queues().get(name).await.expect("read");
    assert!(q.spec.dry_run, "a refused apply applies nothing");
}

/// A queue created through MCP: the preview writes the object as a dry run (WOULD_APPLY on
/// every node, nothing on the brokers); a wrong token and a stale one are refused; the apply
/// makes it Ready, and its audit row names the kube user and the MCP client.
#[tokio::test]
async fn a_queue_is_created_by_preview_then_apply_and_wrong_or_stale_tokens_are_refused() {
    let _shared = brokers_shared().await;
    let f = fixture("mcp-write", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("mcp.write.{id}");
    let mut s = Session::start(&f, "claude-test", &["--allow-writes"]).await;
    let tools = s.tool_names().await;
    for t in [
        "preview_queue",
        "apply_queue",
        "preview_queue_delete",
        "apply_queue_delete",
    ] {
        assert!(tools.iter().any(|n| n == t), "{t} is listed: {tools:?}");
    }

    let wrong = s
        .refused("apply_queue", json!({"token": "queue-not-a-token"}))
        .await;
    assert!(wrong.contains("not issued by this server"), "{wrong}");

    preview_then_refuse_when_stale(&f, &mut s, &name).await;

    let second = s.call("preview_queue", json!({"name": name})).await;
    assert_eq!(outcomes(&second), ["WOULD_APPLY"; 3], "{second}");
    let token = second["confirmationToken"].as_str().expect("a token").to_string();
    let wrong_step = s.refused("apply_queue_delete", json!({"token": token})).await;
    assert!(wrong_step.contains("not apply_queue_delete"), "{wrong_step}");
    let applied = s.call("apply_queue", json!({"token": token})).await;
    assert_eq!(applied["applied"], true, "{applied}");
    let q = f.wait_for(&name, "Ready", ready).await;
    assert!(!q.spec.dry_run);
    let annotations = q.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("artemis-studio.io/mcp-client")
            .map(String::as_str),
        Some("claude-test 9.9")
    );
    assert_eq!(
        annotations.get("artemis-studio.io/mcp-user").map(String::as_str),
        Some(BED_ADMIN)
    );
    let again = s.refused("apply_queue", json!({"token": token})).await;
    assert!(
        again.contains("not issued by this server"),
        "a token applies once: {again}"
    );

    let audit = s.call("audit", json!({"object": format!("queue/{name}")})).await;
    let row = &audit["commands"][0];
    assert_eq!(row["command"], "queue.apply", "{audit}");
    let actor = row["actor"].as_str().unwrap_or_default();
    assert!(
        actor.starts_with(BED_ADMIN) && actor.contains("MCP client claude-test 9.9"),
        "{row}"
    );

    // Through MCP too: a queue without messages goes with nothing destroyed.
    let preview = s.call("preview_queue_delete", json!({"name": name})).await;
    assert_eq!(preview["totalMessages"], 0, "{preview}");
    let token = preview["confirmationToken"]
        .as_str()
        .expect("a token")
        .to_string();
    s.call("apply_queue_delete", json!({"token": token})).await;
    f.wait_gone(&name).await;
    s.close().await;
}

/// The delete preview answers with the messages per node before anything is destroyed: the
/// queue and its messages are still there after it; the apply then deletes through the object.
#[tokio::test]
async fn a_delete_preview_returns_the_message_count_before_anything_is_destroyed() {
    let _shared = brokers_shared().await;
    let f = fixture("mcp-delete", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("mcp.delete.{id}");
    f.create(&name, json!({})).await;
    f.wait_for(&name, "Ready", ready).await;
    // One message on each of two nodes: each count moves 0 → 1, a change the preview shows.
    send_messages(&f.bed, "c1", &name, 1).await;
    send_messages(&f.bed, "c2", &name, 1).await;
    f.wait_for(&name, "the delete preview counts 2 messages", |q| {
        q.status
            .as_ref()
            .and_then(|s| s.delete_preview.as_ref())
            .is_some_and(|p| p.total_messages == 2)
    })
    .await;
    let mut s = Session::start(&f, "claude-test", &["--allow-writes"]).await;

    let preview = s.call("preview_queue_delete", json!({"name": name})).await;
    assert_eq!(preview["totalMessages"], 2, "{preview}");
    let c1 = crate::cluster_core::node_id_of(&f.bed, "c1").await;
    let c3 = crate::cluster_core::node_id_of(&f.bed, "c3").await;
    let per_node = preview["messagesPerNode"].as_array().cloned().unwrap_or_default();
    let on = |node: &str| {
        per_node
            .iter()
            .find(|n| n["node"] == json!(node))
            .map(|n| n["messages"].clone())
    };
    assert_eq!((on(&c1), on(&c3)), (Some(json!(1)), Some(json!(0))), "{preview}");
    let consequence = preview["consequence"].as_str().unwrap_or_default();
    assert!(
        consequence.contains("DESTROYS") && consequence.contains("2 message(s)"),
        "{preview}"
    );

    // Nothing was destroyed, nor asked to be.
    let q = f.queues().get(&name).await.expect("the queue is still there");
    assert!(q.metadata.deletion_timestamp.is_none());
    let c1_broker = f.bed.broker("c1");
    assert_eq!(
        queue_attr(&f.bed, &c1_broker, &name, "MessageCount").await,
        json!(1)
    );

    let token = preview["confirmationToken"]
        .as_str()
        .expect("a token")
        .to_string();
    let deleted = s.call("apply_queue_delete", json!({"token": token})).await;
    assert_eq!(deleted["allowMessageLoss"], 2, "{deleted}");
    f.wait_gone(&name).await;
    wait_until("the queue gone from c1", Duration::from_secs(60), || {
        let b = c1_broker.clone();
        let (bed, name) = (&f.bed, &name);
        async move { (queue_attr(bed, &b, name, "MessageCount").await == Value::Null).then_some(()) }
    })
    .await;
    let audit = s.call("audit", json!({"object": format!("queue/{name}")})).await;
    let row = &audit["commands"][0];
    assert_eq!(row["command"], "queue.delete", "{audit}");
    assert!(
        row["actor"]
            .as_str()
            .is_some_and(|a| a.contains(BED_ADMIN) && a.contains("MCP client")),
        "{row}"
    );
    s.close().await;
}

/// The capture tools read what a real subscription captured, with what each row claims: a
/// bounded tail, verify (the message still waiting on c1), and the window's coverage.
#[tokio::test]
async fn capture_tools_tail_verify_and_cover_a_captured_message() {
    let _shared = brokers_shared().await;
    let f = fixture("mcp-capture", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("mcp.capture.{id}");
    broker_queue(&f.bed, &address).await;
    f.subscribe("cap", json!({"queues": address})).await;
    f.wait_subscription("cap", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    let mut producer = Amqp::open(&f.bed, "c1", &format!("mcp-p-{id}")).await;
    let message = Message::builder()
        .properties(Properties::builder().message_id(format!("m-{id}")).build())
        .value(format!("mcp {id}"))
        .build();
    producer.send(&address, vec![message]).await;
    producer.close().await;
    wait_stored(&f, "cap", 1).await;
    let mut s = Session::start(&f, "capture-agent", &[]).await;

    let tail = s
        .call("capture_tail", json!({"subscription": "cap", "limit": 5}))
        .await;
    let rows = tail["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 1, "{tail}");
    assert_eq!(rows[0]["kind"], "Message", "{tail}");
    assert!(
        rows[0]["claim"]
            .as_str()
            .is_some_and(|c| c.starts_with("captured")),
        "{tail}"
    );
    assert_eq!(tail["coverage"]["kind"], "Coverage", "{tail}");
    let row = rows[0]["rowId"].clone();

    let v = s
        .call("capture_verify", json!({"subscription": "cap", "row": row}))
        .await;
    let c1 = crate::cluster_core::node_id_of(&f.bed, "c1").await;
    assert_eq!(
        v["verdict"],
        json!(format!("present: {address} on {c1} (waiting)")),
        "{v}"
    );

    let coverage = s
        .call("capture_coverage", json!({"subscription": "cap", "since": "10m"}))
        .await;
    assert_eq!(coverage["kind"], "Coverage", "{coverage}");
    assert_eq!(coverage["taps"].as_array().map(Vec::len), Some(3), "{coverage}");
    let search = s
        .call(
            "capture_search",
            json!({"subscription": "cap", "text": format!("mcp {id}")}),
        )
        .await;
    assert_eq!(search["messages"].as_array().map(Vec::len), Some(1), "{search}");
    s.close().await;
    f.subscriptions()
        .delete("cap", &Default::default())
        .await
        .expect("delete the subscription");
}

/// preview_replay's answer: the operator's preview of the captured message (on c1, to its own
/// address, its text body and property) and the consequence in plain words.
async fn shows_the_captured_message(f: &Fixture, preview: &Value, address: &str) {
    assert_eq!(preview["phase"], "AwaitingConfirmation", "{preview}");
    let shown = &preview["preview"];
    let c1 = crate::cluster_core::node_id_of(&f.bed, "c1").await;
    assert_eq!(
        (&shown["address"], &shown["node"]),
        (&json!(address), &json!(c1)),
        "{preview}"
    );
    assert_eq!(
        (&shown["body"], &shown["bodyBytes"], &shown["truncated"]),
        (&json!("text"), &json!(9), &json!(false)),
        "{preview}"
    );
    assert_eq!(shown["properties"]["color"], "red", "{preview}");
    let consequence = preview["consequence"].as_str().unwrap_or_default();
    assert!(
        consequence.contains("SENDS one new message") && consequence.contains("never retried"),
        "{preview}"
    );
}

/// A captured message sent again through MCP: preview_replay creates the MessageReplay and
/// returns the operator's preview with a token; a wrong token is refused and nothing is sent;
/// the right one confirms it, the operator sends one copy (counted on c1), and its audit row
/// names the kube user and the MCP client. A row the operator refuses gets its reason, no token.
#[tokio::test]
async fn a_captured_message_is_replayed_once_by_preview_then_apply_and_a_wrong_token_sends_nothing() {
    let _shared = brokers_shared().await;
    let (f, address, row) = crate::replay::captured("mcp-replay", None, "replay me").await;
    let c1_broker = f.bed.broker("c1");
    let on_c1 = || queue_attr(&f.bed, &c1_broker, &address, "MessageCount");
    assert_eq!(on_c1().await, json!(1), "the original waits on c1");
    let mut s = Session::start(&f, "claude-test", &["--allow-writes"]).await;
    let tools = s.tool_names().await;
    for t in ["preview_replay", "apply_replay"] {
        assert!(tools.iter().any(|n| n == t), "{t} is listed: {tools:?}");
    }

    let asked = json!({"name": "again", "cluster": "c", "subscription": "rep", "row": row});
    let preview = s.call("preview_replay", asked).await;
    shows_the_captured_message(&f, &preview, &address).await;
    let token = preview["confirmationToken"]
        .as_str()
        .expect("a token")
        .to_string();

    // A wrong token: refused, the object untouched, nothing sent.
    let wrong = s
        .refused("apply_replay", json!({"token": "replay-not-a-token"}))
        .await;
    assert!(wrong.contains("not issued by this server"), "{wrong}");
    let replays: kube::Api<MessageReplay> = kube::Api::namespaced(f.admin.clone(), &f.ns);
    let r = replays.get("again").await.expect("the MessageReplay");
    assert_eq!(r.spec.confirm, None, "a refused apply confirms nothing");
    assert_eq!(on_c1().await, json!(1), "nothing sent");

    let applied = s.call("apply_replay", json!({"token": token})).await;
    assert_eq!(
        (&applied["phase"], &applied["confirm"]),
        (&json!("Completed"), &json!(address)),
        "{applied}"
    );
    assert!(applied["sentMessageId"].is_string(), "{applied}");
    let again = s.refused("apply_replay", json!({"token": token})).await;
    assert!(
        again.contains("not issued by this server"),
        "a token applies once: {again}"
    );
    wait_until("the replay on c1", Duration::from_secs(30), || {
        let count = on_c1();
        async move { (count.await == json!(2)).then_some(()) }
    })
    .await;

    let audit = s.call("audit", json!({"object": "replay/again"})).await;
    let commands = audit["commands"].as_array().cloned().unwrap_or_default();
    assert_eq!(commands.len(), 1, "one command: {audit}");
    let row = &commands[0];
    assert_eq!(
        (&row["command"], &row["id"]),
        (&json!("message.replay"), &applied["auditId"]),
        "{audit}"
    );
    let actor = row["actor"].as_str().unwrap_or_default();
    assert!(
        actor.starts_with(BED_ADMIN) && actor.contains("MCP client claude-test 9.9"),
        "{row}"
    );
    // A row the operator refuses is answered with its reason, and no token.
    let missing = json!({"name": "no-row", "cluster": "c", "subscription": "rep", "row": 999_999});
    let refused = s.refused("preview_replay", missing).await;
    assert!(
        refused.contains("has no row 999999") && refused.contains("no token"),
        "{refused}"
    );
    assert_eq!(on_c1().await, json!(2), "the original and exactly one replay");
    s.close().await;
}
