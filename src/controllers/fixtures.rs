//! The mock-API tier of the unit tests (after kube-rs/controller-rs's `fixtures.rs`): a
//! [`Context`] whose kube client talks to an in-process mock API server. A test says how the
//! server answers and reads back every request the operator sent (verb, path and query, body),
//! so a stage's API cost and its status documents are checked without a bed. The broker side
//! is `fanout::fake`; Postgres is not connected (a stage that writes audit rows needs the bed).

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use serde_json::Value;

use kube::runtime::watcher;

use super::{Context, Namespaces};
use crate::api::ArtemisCluster;

/// One request the operator sent.
#[derive(Clone, Debug)]
pub struct Sent {
    pub method: String,
    /// Path and query, e.g. `/apis/…/artemisqueues/q/status?&force=true&fieldManager=…`.
    pub uri: String,
    pub body: Value,
}

/// What the mock API server answers: a status code and a JSON body.
pub type Answer = Box<dyn Fn(&Sent) -> (u16, Value) + Send + Sync>;

/// The requests the server received, in order.
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<Vec<Sent>>>);

impl Received {
    pub fn all(&self) -> Vec<Sent> {
        self.0.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// A context on a mock API server that answers every request with `answer`.
pub fn context(answer: Answer) -> (Arc<Context>, Received) {
    with_clusters(answer, vec![])
}

/// A context like [`context`] whose cache holds these ArtemisClusters (namespace `ns`).
pub fn with_clusters(answer: Answer, clusters: Vec<ArtemisCluster>) -> (Arc<Context>, Received) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let received = Received::default();
    let log = received.clone();
    tokio::spawn(async move {
        while let Some((request, respond)) = handle.next_request().await {
            let uri = request.uri().to_string();
            let method = request.method().to_string();
            let bytes = http_body_util::BodyExt::collect(request.into_body())
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let sent = Sent { method, uri, body };
            let (status, reply) = answer(&sent);
            if let Ok(mut l) = log.0.lock() {
                l.push(sent);
            }
            let response = Response::builder()
                .status(status)
                .body(Body::from(reply.to_string().into_bytes()))
                .unwrap_or_else(|e| panic!("response: {e}"));
            respond.send_response(response);
        }
    });
    let client = kube::Client::new(service, "default");
    let (ctx, mut reflectors) = Context::new(
        client,
        crate::store::Store::unconnected(),
        "test".into(),
        Namespaces::from_list(vec!["ns".into()]),
        Default::default(),
    );
    if let Some(scoped) = reflectors.clusters.first_mut() {
        for c in clusters {
            scoped.writer.apply_watcher_event(&watcher::Event::Apply(c));
        }
    }
    (Arc::new(ctx), received)
}
