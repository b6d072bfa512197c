//! Coalescing: single `JolokiaClient::call`s from concurrent tasks to the same endpoint (same
//! URL, credentials, trust roots, Origin and timeout) travel together in one bulk POST.
//!
//! One batcher task per endpoint key receives `(request, reply)` pairs on a channel. When one of
//! its POSTs is still on the wire it waits [`BUSY_LINGER`] after the first request for others (or
//! until [`MAX_BATCH`]), so a burst travels in fewer, fuller POSTs; otherwise the request leaves
//! at once with whoever is already waiting (see [`linger`]). It then
//! takes a permit from the node's budget — while it waits for one, further requests queue and
//! join the batch, so a slow node gets fewer, larger POSTs — and sends the batch on a task of its
//! own, so up to the permitted concurrency of batches are in flight. Each caller gets its own
//! element's result (Jolokia answers one element per request, each with its own status); a
//! transport error or a refusal of the whole request goes to every caller of that batch.
//!
//! A caller awaits its result before it sends its next request, so the order of one caller's
//! operations is preserved (a ConnectionClose's re-read, then its close). A caller that gave up
//! (its future dropped) before the batch left is not sent at all.
//!
//! While the node is judged not answering (`super::budget::Health`), a batch of work fails at
//! once with the evidence, and a batch on the wire when the node is judged is let go (its POST
//! goes on in the background): no caller waits a request timeout on a node that answers nothing.
//!
//! The task ends after [`IDLE_EXIT`] without requests (or when its runtime shuts down); the next
//! call starts a new one.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::budget::{BatchKey, NodeBudget, Permit, Purpose};
use super::error::BrokerError;
use super::jolokia::{JolokiaClient, JolokiaRequest};

/// How long the first request of a batch waits for company when a POST of the same batcher is
/// still on the wire (the node is busy with our work): a burst travels in fewer, fuller POSTs, at
/// most about one per this long beyond those in flight. A lone request (nothing of its batcher on
/// the wire) does not wait: see [`linger`].
///
/// Issue 45: a POST costs a 2.40 broker about 3.7 ms of CPU before its first operation (the
/// servlet, authentication, the management guard) and a create about 0.6 ms more (measured on
/// the bed: one create per POST 4.9 ms a queue, 32 per POST 1.2 ms). On a bed whose cores the
/// brokers share with the API server, 2,000 creates in a burst went in POSTs of 7–9 operations
/// with a 3 ms linger alone, and of 18–20 with this: the brokers' CPU fell by about a tenth and the
/// creates/s rose by as much (docs/performance.md).
pub const BUSY_LINGER: Duration = Duration::from_millis(150);
/// The most operations in one POST. Jolokia runs a bulk request's elements one after another, so
/// a POST's latency grows with its size: 64 keeps a batch of writes well inside a request timeout
/// (measured: ~170 queue creates/s in bulk, so 64 creates ≈ 0.4 s).
pub const MAX_BATCH: usize = 64;
/// Requests that may wait for a batcher before callers wait to hand theirs over (backpressure).
pub const QUEUE: usize = 1024;
/// A batcher with nothing to do for this long ends its task.
pub const IDLE_EXIT: Duration = Duration::from_secs(60);

/// One caller's requests waiting for a batch: they travel in the same POST, in order (Jolokia
/// runs a bulk request's elements one after another), e.g. `createAddress` then `createQueue`.
pub(crate) struct Pending {
    /// The caller's client: same key as every other in the batch (trust roots included); the
    /// first one sends.
    client: JolokiaClient,
    requests: Vec<JolokiaRequest>,
    reply: oneshot::Sender<Vec<Result<Value, BrokerError>>>,
}

fn key_of(client: &JolokiaClient) -> BatchKey {
    let credentials = client.credentials();
    BatchKey {
        // The node, not the URL as written: user info in a URL stays out of the key too (it is
        // part of the hashed credentials, as the exact URL is).
        node: client.node().to_string(),
        purpose: client.purpose(),
        credentials: client.registry().credentials_hash(
            &credentials.username,
            &credentials.password,
            client.url(),
        ),
        trust: client.trust(),
        origin: client.origin().to_string(),
        timeout: client.timeout(),
        runtime: tokio::runtime::Handle::current().id(),
    }
}

/// The sender of the batcher for this client's key, starting one if none runs.
fn batcher_for(client: &JolokiaClient) -> mpsc::Sender<Pending> {
    client
        .registry()
        .batcher(key_of(client), mpsc::Sender::is_closed, || {
            let (tx, rx) = mpsc::channel(QUEUE);
            // Supervision: a batcher that ended (its channel closed) is replaced at the next call.
            tokio::spawn(run(
                rx,
                client.registry().budget_for(client.url()),
                client.purpose(),
            ));
            tx
        })
}

impl JolokiaClient {
    /// One operation. Concurrent calls to the same endpoint (same credentials and Origin) share
    /// a POST; the result is this request's own element.
    pub async fn call(&self, request: JolokiaRequest) -> Result<Value, BrokerError> {
        call(self, request).await
    }

    /// Several operations that travel in the same POST, in this order, coalesced with concurrent
    /// ones to the same endpoint: one result per request.
    pub async fn call_together(&self, requests: Vec<JolokiaRequest>) -> Vec<Result<Value, BrokerError>> {
        together(self, requests).await
    }
}

/// One operation, coalesced with concurrent ones to the same endpoint.
pub(crate) async fn call(client: &JolokiaClient, request: JolokiaRequest) -> Result<Value, BrokerError> {
    together(client, vec![request])
        .await
        .pop()
        .unwrap_or_else(|| Err(BrokerError::BadResponse("empty bulk response".into())))
}

/// Several operations in one POST, in this order, coalesced with concurrent ones to the same
/// endpoint: one result per request.
pub(crate) async fn together(
    client: &JolokiaClient,
    requests: Vec<JolokiaRequest>,
) -> Vec<Result<Value, BrokerError>> {
    let n = requests.len();
    let (reply, answer) = oneshot::channel();
    let mut pending = Pending {
        client: client.clone(),
        requests,
        reply,
    };
    // A batcher that just ended (idle, or its runtime stopped) refuses the hand-over: start
    // another and hand it there.
    for _ in 0..3 {
        match batcher_for(client).send(pending).await {
            Ok(()) => {
                return answer.await.unwrap_or_else(|_| {
                    let e = BrokerError::Unreachable(format!(
                        "{}: the request batcher stopped before an answer arrived (the process is shutting down); the effect of the call is unknown",
                        client.node()
                    ));
                    vec![Err(e); n]
                });
            }
            Err(mpsc::error::SendError(p)) => pending = p,
        }
    }
    // Not reached in practice; never lose a request over it.
    match client.bulk(&pending.requests).await {
        Ok(results) => results,
        Err(e) => vec![Err(e); n],
    }
}

/// The batcher task of one endpoint key.
async fn run(mut rx: mpsc::Receiver<Pending>, budget: std::sync::Arc<NodeBudget>, purpose: Purpose) {
    // This batcher's POSTs on the wire: each spawned POST holds one of its strong counts.
    let on_wire = std::sync::Arc::new(());
    loop {
        let first = match tokio::time::timeout(IDLE_EXIT, rx.recv()).await {
            Ok(Some(p)) => p,
            Ok(None) | Err(_) => return,
        };
        let mut batch = vec![first];
        match linger(std::sync::Arc::strong_count(&on_wire) > 1) {
            Some(linger) => {
                let deadline = tokio::time::Instant::now() + linger;
                while batch_size(&batch) < MAX_BATCH {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(p)) => batch.push(p),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            // The tasks woken by the same event hand theirs over before this one runs again.
            None => tokio::task::yield_now().await,
        }
        let permit = match budget.acquire(purpose).await {
            Ok(permit) => permit,
            Err(silence) => {
                // The node is not answering: nothing of this batch is sent, nobody waits.
                for p in batch {
                    let n = p.requests.len();
                    let _ = p
                        .reply
                        .send(vec![Err(BrokerError::NotAnswering(silence.clone())); n]);
                }
                continue;
            }
        };
        // Whoever queued while we waited for the node goes along.
        while batch_size(&batch) < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        // A caller that stopped waiting is not sent: a cancelled reconcile costs the node nothing.
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        // Supervision: one POST; each request in it awaits its reply, which an end drops. It
        // counts as on the wire until its task ends, however it ends.
        tokio::spawn(send(batch, permit, on_wire.clone()));
    }
}

/// How long the first request of a batch waits for company: [`BUSY_LINGER`] when a POST of its
/// batcher is still on the wire (`busy`), otherwise not at all — it leaves with whoever is
/// already waiting. Issue 45: every step of a command that waits on a node paid a linger when
/// the node was idle (an update's read, then its write; a delete's preflight, then its
/// `destroyQueue`): 3 ms, with the timer's rounding about 4, then 1 ms (about 2.3 measured in
/// the operator's trace). Under a burst a batcher is busy and still waits [`BUSY_LINGER`].
fn linger(busy: bool) -> Option<Duration> {
    busy.then_some(BUSY_LINGER)
}

/// How many operations `batch` holds.
fn batch_size(batch: &[Pending]) -> usize {
    batch.iter().map(|p| p.requests.len()).sum()
}

/// Send one batch as one POST and hand every caller its own elements. Identical reads go once
/// (issue 45: the deletes in flight on a node share one read of its diverts). `on_wire`, the
/// batcher's count of POSTs on the wire, is let go when the answer is in, before any caller
/// hears it: a caller's next call (a delete's `destroyQueue` after its preflight read) must not
/// find this POST still counted and wait [`BUSY_LINGER`] for company.
async fn send(batch: Vec<Pending>, permit: Permit, on_wire: std::sync::Arc<()>) {
    let mut client = None;
    let mut shared = SharedReads::default();
    let mut replies = Vec::with_capacity(batch.len());
    for p in batch {
        p.client.mark_sent();
        client.get_or_insert(p.client);
        replies.push((shared.add(p.requests), p.reply));
    }
    let Some(client) = client else { return };
    let answer = client.post(permit, shared.requests).await;
    drop(on_wire);
    match answer {
        Ok(results) => {
            for (slots, reply) in replies {
                let mine = slots
                    .iter()
                    .map(|&i| {
                        results.get(i).cloned().unwrap_or_else(|| {
                            Err(BrokerError::BadResponse(
                                "a bulk response without this element".into(),
                            ))
                        })
                    })
                    .collect();
                let _ = reply.send(mine);
            }
        }
        Err(e) => {
            for (slots, reply) in replies {
                let _ = reply.send(vec![Err(e.clone()); slots.len()]);
            }
        }
    }
}

/// The requests of one POST, a read asked by several callers sent once: each caller's requests
/// become positions in the POST.
#[derive(Default)]
struct SharedReads {
    requests: Vec<JolokiaRequest>,
}

impl SharedReads {
    /// One caller's requests. A read before the caller's first write is answered by an
    /// identical read already in the POST: the callers of one POST are concurrent, so that
    /// answer is one they could have had. A read after the caller's own write is its own (it
    /// must see that write).
    fn add(&mut self, requests: Vec<JolokiaRequest>) -> Vec<usize> {
        let mut wrote = false;
        requests
            .into_iter()
            .map(|r| {
                let is_read = matches!(r, JolokiaRequest::Read { .. });
                wrote |= !is_read;
                let same = (is_read && !wrote)
                    .then(|| self.requests.iter().position(|e| *e == r))
                    .flatten();
                same.unwrap_or_else(|| {
                    self.requests.push(r);
                    self.requests.len() - 1
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    //! The transport mechanics against a tiny local HTTP server that answers like Jolokia: each
    //! element's value is its own MBean name, an MBean named `missing…` gets a 404 element, and
    //! special URLs refuse the whole request or answer something that is not JSON.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::routing::post;
    use serde_json::json;

    use super::*;
    use crate::api::RefusalKind;
    use crate::broker::Registry;
    use crate::broker::budget::MAX_IN_FLIGHT;
    use crate::broker::error::NotAnswering;
    use crate::broker::jolokia::Credentials;

    /// The registry of these tests' clients (each test talks to a server of its own).
    static REGISTRY: std::sync::LazyLock<std::sync::Arc<Registry>> =
        std::sync::LazyLock::new(Registry::standalone);

    #[test]
    fn identical_reads_of_concurrent_callers_go_once_but_a_read_after_a_write_is_its_own() {
        let divert_list = || JolokiaRequest::read_strict("b:divert=*", &["UniqueName"]);
        let queue = |q: &str| JolokiaRequest::read_strict(format!("b:queue={q}"), &["Name"]);
        let destroy = JolokiaRequest::exec("b", "destroyQueue(java.lang.String)", vec![json!("q1")]);
        let mut post = SharedReads::default();
        let first = post.add(vec![queue("q1"), divert_list()]);
        let second = post.add(vec![queue("q2"), divert_list()]);
        let third = post.add(vec![destroy, divert_list()]);
        assert_eq!(first, [0, 1]);
        assert_eq!(second, [2, 1], "the divert list is read once for both");
        assert_eq!(third, [3, 4], "after its own write a caller reads for itself");
        assert_eq!(post.requests.len(), 5);
    }

    #[derive(Default)]
    struct Seen {
        posts: AtomicUsize,
        elements: AtomicUsize,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
        /// `/flaky` answers nothing in time while this is set.
        hung: std::sync::atomic::AtomicBool,
    }

    fn answer(body: &[u8]) -> Value {
        let requests: Vec<Value> = serde_json::from_slice(body).unwrap_or_default();
        Value::Array(
            requests
                .iter()
                .map(|r| {
                    let mbean = r["mbean"].as_str().unwrap_or_default();
                    if mbean.starts_with("missing") {
                        json!({"request": r, "status": 404, "error_type": "javax.management.InstanceNotFoundException",
                               "error": format!("javax.management.InstanceNotFoundException : {mbean}")})
                    } else {
                        json!({"request": r, "status": 200, "value": mbean})
                    }
                })
                .collect(),
        )
    }

    async fn jolokia(State(seen): State<Arc<Seen>>, body: Bytes) -> String {
        seen.posts.fetch_add(1, Ordering::SeqCst);
        let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let v = answer(&body);
        seen.elements
            .fetch_add(v.as_array().map_or(0, Vec::len), Ordering::SeqCst);
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        v.to_string()
    }

    async fn slow(State(seen): State<Arc<Seen>>, body: Bytes) -> String {
        seen.posts.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(400)).await;
        answer(&body).to_string()
    }

    async fn flaky(State(seen): State<Arc<Seen>>, body: Bytes) -> String {
        seen.posts.fetch_add(1, Ordering::SeqCst);
        if seen.hung.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        answer(&body).to_string()
    }

    async fn hang(State(seen): State<Arc<Seen>>) -> String {
        seen.posts.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        String::new()
    }

    /// What the bed's strict-origin broker answers a bulk POST with an https Origin over http
    /// (captured: HTTP 200, one object, no `request`).
    async fn refused() -> &'static str {
        include_str!("../../tests/fixtures/jolokia/bulk_secure_origin_over_http_403.json")
    }

    async fn garbage() -> &'static str {
        "<html>not jolokia</html>"
    }

    /// A fake Jolokia on a free local port; returns its base URL and what it saw.
    async fn server() -> (String, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        let app = axum::Router::new()
            .route("/jolokia", post(jolokia))
            .route("/refused", post(refused))
            .route("/garbage", post(garbage))
            .route("/slow", post(slow))
            .route("/flaky", post(flaky))
            .route("/hang", post(hang))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}"), seen)
    }

    fn client(url: String) -> JolokiaClient {
        JolokiaClient::new(
            crate::broker::jolokia::http_client(&REGISTRY, None).expect("client"),
            url,
            None,
            Credentials {
                username: "u".into(),
                password: "p".into(),
            },
            Duration::from_secs(5),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_posts_and_each_gets_its_own_result() {
        let (base, seen) = server().await;
        let c = client(format!("{base}/jolokia"));
        // The registry is the process's: an earlier test's server on the same (reused) port
        // left its counts under this node. Only what this test adds is compared.
        let node = c.node().to_string();
        let (posts_before, requests_before) = (
            REGISTRY.metrics().posts_of(&node),
            REGISTRY.metrics().requests_of(&node),
        );
        let n = 200;
        let calls = (0..n).map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let mbean = if i % 5 == 0 {
                    format!("missing-{i}")
                } else {
                    format!("mbean-{i}")
                };
                (i, c.call(JolokiaRequest::read(mbean, "X")).await)
            })
        });
        for r in futures::future::join_all(calls).await {
            let (i, result) = r.expect("task");
            if i % 5 == 0 {
                let e = result.expect_err("a missing MBean fails");
                assert!(e.to_string().contains(&format!("missing-{i}")), "{i}: {e}");
            } else {
                assert_eq!(result.expect("ok"), Value::from(format!("mbean-{i}")), "{i}");
            }
        }
        let posts = seen.posts.load(Ordering::SeqCst);
        assert_eq!(seen.elements.load(Ordering::SeqCst), n);
        assert!(posts < n / 4, "{posts} POSTs for {n} calls");
        assert!(seen.max_in_flight.load(Ordering::SeqCst) <= MAX_IN_FLIGHT);
        // The metrics agree with what the server saw.
        assert_eq!(REGISTRY.metrics().posts_of(&node) - posts_before, posts as u64);
        assert_eq!(REGISTRY.metrics().requests_of(&node) - requests_before, n as u64);
        let stats = REGISTRY.node_stats(c.url()).expect("a budget");
        assert!(
            stats.max_in_flight <= MAX_IN_FLIGHT && stats.max_in_flight >= 1,
            "{stats:?}"
        );
    }

    /// Issue 45: while a POST is on the wire, calls that trickle in (one every 10 ms, as the
    /// reconciles of a burst reach the broker) wait for company and go in one POST; without
    /// `BUSY_LINGER`, each would leave on its own, up to the budget's four in flight.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_that_trickle_in_while_a_post_is_on_the_wire_share_the_next_post() {
        let (base, seen) = server().await;
        let c = client(format!("{base}/slow"));
        let call = |i: usize| {
            let c = c.clone();
            tokio::spawn(async move { c.call(JolokiaRequest::read(format!("m{i}"), "X")).await })
        };
        let first = call(0);
        while seen.posts.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut later = Vec::new();
        for i in 1..=8 {
            later.push(call(i));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for (i, r) in futures::future::join_all(later).await.into_iter().enumerate() {
            assert_eq!(r.expect("task").expect("ok"), Value::from(format!("m{}", i + 1)));
        }
        first.await.expect("task").expect("ok");
        let posts = seen.posts.load(Ordering::SeqCst);
        assert!(
            posts <= 3,
            "{posts} POSTs: the first, then the eight calls together"
        );
    }

    /// Issue 45: a caller's next call after its answer (a delete's `destroyQueue` after its
    /// preflight read) finds nothing of its own on the wire and leaves at once, not after
    /// `BUSY_LINGER`: one after another, 20 calls take about 20 round trips.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_call_made_after_an_answer_does_not_wait_for_company() {
        let (base, seen) = server().await;
        let c = client(format!("{base}/jolokia"));
        let mut lingered = 0;
        for i in 0..20 {
            let started = tokio::time::Instant::now();
            c.call(JolokiaRequest::read(format!("m{i}"), "X"))
                .await
                .expect("ok");
            // The server answers after 20 ms; a busy batch would have waited 150 ms first.
            lingered += usize::from(started.elapsed() >= BUSY_LINGER);
        }
        assert_eq!(seen.posts.load(Ordering::SeqCst), 20);
        assert_eq!(
            lingered, 0,
            "calls that waited for company behind an answered POST"
        );
    }

    /// Issue 45: a request to an idle node waits for no timer (each step of a command that
    /// waits on a node would pay it); a busy batcher waits `BUSY_LINGER` for company.
    #[test]
    fn a_request_waits_for_company_only_while_its_batcher_has_a_post_on_the_wire() {
        assert_eq!(super::linger(false), None);
        assert_eq!(super::linger(true), Some(BUSY_LINGER));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refusal_of_the_whole_request_goes_to_every_caller() {
        let (base, _) = server().await;
        let c = client(format!("{base}/refused"));
        let calls = (0..10).map(|i| {
            let c = c.clone();
            async move { c.call(JolokiaRequest::read(format!("m{i}"), "X")).await }
        });
        for r in futures::future::join_all(calls).await {
            let e = r.expect_err("refused");
            // Issue 42: Jolokia's access policy, not the credentials; the message names the fix.
            assert_eq!(e.refusal_kind(), RefusalKind::OriginRefused, "{e}");
            let text = e.to_string();
            assert!(
                text.contains("Secure origin https://localhost should not be processed over HTTP"),
                "{text}"
            );
            assert!(
                text.contains("spec.origin") && text.contains("jolokia-access.xml"),
                "{text}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transport_error_goes_to_every_caller() {
        let (base, _) = server().await;
        let c = client(format!("{base}/garbage"));
        let calls = (0..10).map(|i| {
            let c = c.clone();
            async move { c.call(JolokiaRequest::read(format!("m{i}"), "X")).await }
        });
        for r in futures::future::join_all(calls).await {
            let e = r.expect_err("not jolokia");
            assert_eq!(e.refusal_kind(), RefusalKind::BadResponse, "{e}");
        }

        // Nothing listens: every caller learns the endpoint is unreachable.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let c = client(format!("http://{addr}/jolokia"));
        let calls = (0..10).map(|i| {
            let c = c.clone();
            async move { c.call(JolokiaRequest::read(format!("m{i}"), "X")).await }
        });
        for r in futures::future::join_all(calls).await {
            let e = r.expect_err("nothing listens");
            assert_eq!(e.refusal_kind(), RefusalKind::Unreachable, "{e}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn different_credentials_do_not_share_a_post() {
        let (base, seen) = server().await;
        let url = format!("{base}/jolokia");
        let a = client(url.clone());
        let b = JolokiaClient::new(
            crate::broker::jolokia::http_client(&REGISTRY, None).expect("client"),
            url,
            None,
            Credentials {
                username: "other".into(),
                password: "p2".into(),
            },
            Duration::from_secs(5),
        );
        let (ra, rb) = tokio::join!(
            a.call(JolokiaRequest::read("a", "X")),
            b.call(JolokiaRequest::read("b", "X"))
        );
        assert_eq!(ra.expect("a"), Value::from("a"));
        assert_eq!(rb.expect("b"), Value::from("b"));
        assert_eq!(seen.posts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clients_that_trust_different_roots_never_share_a_post() {
        let (base, seen) = server().await;
        let url = format!("{base}/jolokia");
        let with_ca = |pem: Option<&[u8]>| {
            JolokiaClient::new(
                crate::broker::jolokia::http_client(&REGISTRY, pem).expect("client"),
                url.clone(),
                None,
                Credentials {
                    username: "u".into(),
                    password: "p".into(),
                },
                Duration::from_secs(5),
            )
        };
        let a = with_ca(Some(include_bytes!("../../tests/fixtures/tls/ca-a.pem")));
        let b = with_ca(Some(include_bytes!("../../tests/fixtures/tls/ca-b.pem")));
        let none = with_ca(None);
        let (ra, rb, rn) = tokio::join!(
            a.call(JolokiaRequest::read("a", "X")),
            b.call(JolokiaRequest::read("b", "X")),
            none.call(JolokiaRequest::read("n", "X"))
        );
        assert_eq!(ra.expect("a"), Value::from("a"));
        assert_eq!(rb.expect("b"), Value::from("b"));
        assert_eq!(rn.expect("n"), Value::from("n"));
        assert_eq!(
            seen.posts.load(Ordering::SeqCst),
            3,
            "one POST per trust configuration"
        );
        // The same CA is the same identity: those share.
        let a2 = with_ca(Some(include_bytes!("../../tests/fixtures/tls/ca-a.pem")));
        assert_eq!(key_of(&a), key_of(&a2));
        assert_ne!(key_of(&a), key_of(&b));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn explicit_bulk_requests_go_out_as_they_are_within_the_budget() {
        let (base, seen) = server().await;
        let c = client(format!("{base}/jolokia"));
        let bulks = (0..12).map(|i| {
            let c = c.clone();
            async move {
                c.bulk(&[
                    JolokiaRequest::read(format!("a{i}"), "X"),
                    JolokiaRequest::read(format!("b{i}"), "X"),
                ])
                .await
            }
        });
        for (i, r) in futures::future::join_all(bulks).await.into_iter().enumerate() {
            let values: Vec<Value> = r
                .expect("bulk")
                .into_iter()
                .map(|e| e.expect("element"))
                .collect();
            assert_eq!(
                values,
                vec![Value::from(format!("a{i}")), Value::from(format!("b{i}"))]
            );
        }
        assert_eq!(seen.posts.load(Ordering::SeqCst), 12);
        assert!(seen.max_in_flight.load(Ordering::SeqCst) <= MAX_IN_FLIGHT);
    }

    fn client_with_timeout(url: String, timeout: Duration) -> JolokiaClient {
        JolokiaClient::new(
            crate::broker::jolokia::http_client(&REGISTRY, None).expect("client"),
            url,
            None,
            Credentials {
                username: "u".into(),
                password: "p".into(),
            },
            timeout,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_that_times_out_gets_no_more_posts_until_a_probe_is_answered() {
        let (base, seen) = server().await;
        seen.hung.store(true, Ordering::SeqCst);
        let c = client_with_timeout(format!("{base}/flaky"), Duration::from_millis(100));
        let bulks = (0..12).map(|i| {
            let c = c.clone();
            async move { c.bulk(&[JolokiaRequest::read(format!("m{i}"), "X")]).await }
        });
        for r in futures::future::join_all(bulks).await {
            let e = r.expect_err("no POST is answered in time");
            // Sent and timed out; let go when another's timeout judged the node; or not sent.
            assert!(
                matches!(e, BrokerError::Timeout(_) | BrokerError::NotAnswering(_)),
                "{e}"
            );
        }
        let posts = seen.posts.load(Ordering::SeqCst);
        assert!(
            posts <= MAX_IN_FLIGHT,
            "{posts} POSTs to a node that answers nothing"
        );
        let stats = REGISTRY.node_stats(c.url()).expect("a budget");
        assert!(stats.not_answering.is_some(), "{stats:?}");
        assert_eq!(stats.permitted, MAX_IN_FLIGHT, "a silence is not load: {stats:?}");

        // The node is back. Work still fails at once; the poll's probe finds it answering.
        seen.hung.store(false, Ordering::SeqCst);
        let e = c
            .call(JolokiaRequest::read("w", "X"))
            .await
            .expect_err("judged: not sent");
        assert!(
            matches!(e, BrokerError::NotAnswering(NotAnswering { sent: false, .. })),
            "{e}"
        );
        assert_eq!(e.refusal_kind(), RefusalKind::Unreachable);
        // The POSTs let go when the node was judged go on until their own timeout, and a probe
        // goes only when nothing is on the wire (`Health::may_probe`): wait for that.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while REGISTRY.node_stats(c.url()).is_some_and(|s| s.in_flight > 0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the let-go POSTs end at their 100 ms timeout"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let probe = c.probing().call(JolokiaRequest::read("p", "X")).await;
        assert_eq!(probe.expect("the probe is answered"), Value::from("p"));
        assert_eq!(
            c.call(JolokiaRequest::read("w", "X"))
                .await
                .expect("work goes again"),
            Value::from("w")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_waiting_on_a_hung_node_are_let_go_within_seconds_not_a_timeout() {
        use crate::broker::budget::HUNG_AFTER_MIN;
        let (base, seen) = server().await;
        let c = client_with_timeout(format!("{base}/hang"), Duration::from_secs(60));
        let (tracked, sent) = c.tracked();
        let started = std::time::Instant::now();
        let calls = (0..10).map(|i| {
            let c = tracked.clone();
            async move { c.call(JolokiaRequest::read(format!("m{i}"), "X")).await }
        });
        for r in futures::future::join_all(calls).await {
            let e = r.expect_err("never answered");
            assert!(
                matches!(e, BrokerError::NotAnswering(NotAnswering { sent: true, .. })),
                "{e}"
            );
            assert_eq!(e.refusal_kind(), RefusalKind::Timeout, "its effect is unknown");
        }
        let waited = started.elapsed();
        assert!(
            waited >= HUNG_AFTER_MIN && waited < HUNG_AFTER_MIN + Duration::from_secs(2),
            "let go after {waited:?}"
        );
        assert!(sent.any(), "the calls went on the wire");
        // The next call is not sent, and says why.
        let (tracked, sent) = c.tracked();
        let e = tracked
            .call(JolokiaRequest::read("late", "X"))
            .await
            .expect_err("judged");
        assert!(e.to_string().starts_with("not answering: "), "{e}");
        assert!(!sent.any(), "nothing sent to a node judged not answering");
        assert!(seen.posts.load(Ordering::SeqCst) >= 1);
    }
}
