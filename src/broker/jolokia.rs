//! The Jolokia transport: bulk requests as one POST with an array, concurrent single calls to
//! one endpoint coalesced into one such POST (`super::batch`), every POST within the endpoint's
//! budget (`super::budget`), every element's own `status` checked (the HTTP code says nothing
//! about individual requests).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::budget::{NodeBudget, Observation, Permit, Purpose};
use super::error::{BrokerError, ManagementRefusal, NotAnswering, classify, classify_whole_request};
use super::registry::Registry;
use crate::api::RefusalKind;

/// A management user's credentials. Never logged, never stored.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// One Jolokia operation.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum JolokiaRequest {
    Read {
        mbean: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        attribute: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        config: Option<Value>,
    },
    Exec {
        mbean: String,
        operation: String,
        arguments: Vec<Value>,
    },
    Search {
        mbean: String,
    },
}

impl JolokiaRequest {
    /// What the request does, for logs and metrics (never its arguments).
    pub fn kind(&self) -> String {
        match self {
            JolokiaRequest::Read { .. } => "read".into(),
            JolokiaRequest::Search { .. } => "search".into(),
            JolokiaRequest::Exec { operation, .. } => {
                operation.split('(').next().unwrap_or_default().to_string()
            }
        }
    }
    pub fn read(mbean: impl Into<String>, attribute: &str) -> Self {
        JolokiaRequest::Read {
            mbean: mbean.into(),
            attribute: Some(Value::String(attribute.into())),
            config: None,
        }
    }
    pub fn read_many(mbean: impl Into<String>, attributes: &[&str]) -> Self {
        JolokiaRequest::Read {
            mbean: mbean.into(),
            attribute: Some(Value::Array(
                attributes.iter().map(|a| Value::String((*a).into())).collect(),
            )),
            // One attribute an MBean cannot answer must not fail a whole wildcard read.
            config: Some(serde_json::json!({"ignoreErrors": true})),
        }
    }
    /// Several attributes of one MBean (or pattern) with no `ignoreErrors`: an attribute that
    /// cannot be read fails the read instead of standing in as a value.
    pub fn read_strict(mbean: impl Into<String>, attributes: &[&str]) -> Self {
        JolokiaRequest::Read {
            mbean: mbean.into(),
            attribute: Some(Value::Array(
                attributes.iter().map(|a| Value::String((*a).into())).collect(),
            )),
            config: None,
        }
    }
    pub fn exec(mbean: impl Into<String>, operation: &str, arguments: Vec<Value>) -> Self {
        JolokiaRequest::Exec {
            mbean: mbean.into(),
            operation: operation.into(),
            arguments,
        }
    }
    pub fn search(pattern: impl Into<String>) -> Self {
        JolokiaRequest::Search {
            mbean: pattern.into(),
        }
    }
}

/// A client for one Jolokia endpoint. Every POST goes through the endpoint's [`NodeBudget`] in
/// the operator's registry; single calls are coalesced with concurrent ones (`super::batch`).
#[derive(Clone, Debug)]
pub struct JolokiaClient {
    http: HttpClient,
    url: String,
    origin: String,
    credentials: Credentials,
    timeout: Duration,
    budget: Arc<NodeBudget>,
    /// What a call of this client does while the node is judged not answering.
    purpose: Purpose,
    /// Set once a request of this client (or of a clone made with it) goes on the wire.
    sent: Option<Sent>,
}

/// Whether any request of a tracked client went on the wire: a call that failed because the node
/// is not answering reached the node only if something was sent (the fan-out's SKIPPED_NOT_LIVE
/// means never called).
#[derive(Clone, Debug, Default)]
pub struct Sent(Arc<std::sync::atomic::AtomicBool>);

impl Sent {
    pub fn any(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn mark(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The Origin a broker's default strict checking accepts for this URL: `scheme://host`.
pub fn default_origin(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!("{}://{}", u.scheme(), u.host_str().unwrap_or("localhost")),
        Err(_) => "http://localhost".into(),
    }
}

/// The HTTP client shared by every endpoint of one cluster, with the identity of what it trusts:
/// two clients with different trust roots never share a POST (the coalescing key includes it).
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: reqwest::Client,
    /// A process-local digest of the trust configuration (the CA bundle's bytes; 0: the system
    /// roots only).
    trust: u64,
    /// The operator's per-node state (budgets, batchers, metrics) every client built from this
    /// one shares.
    registry: Arc<Registry>,
}

impl HttpClient {
    pub(crate) fn trust(&self) -> u64 {
        self.trust
    }

    /// The operator's per-node state the clients built from this one share.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
}

/// Why a cluster's TLS settings cannot make a client: always the user's to fix (`InvalidTls`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    #[error(
        "the CA Secret's value is not a PEM certificate bundle (no '-----BEGIN CERTIFICATE-----' block could be read): put the CA certificate in PEM form under the key spec.tls.caKey names"
    )]
    NotPem,
    #[error("the CA certificate could not be used: {0}")]
    Unusable(String),
}

/// The HTTP client of one cluster. Issue 44: a CA bundle given (PEM, one or more certificates;
/// anything else is refused, never silently ignored) is the only trust — no public root — so a
/// cluster naming its private CA never accepts a certificate another CA issued for that name.
/// None given: the system's trust store (the public roots; `SSL_CERT_FILE` / `SSL_CERT_DIR`
/// when set), which the cluster's `status.trust` says.
pub fn http_client(registry: &Arc<Registry>, ca_pem: Option<&[u8]>) -> Result<HttpClient, TlsError> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(4);
    if let Some(pem) = ca_pem {
        let certificates = reqwest::Certificate::from_pem_bundle(pem).map_err(|_| TlsError::NotPem)?;
        if certificates.is_empty() {
            return Err(TlsError::NotPem);
        }
        b = b.tls_built_in_root_certs(false);
        for c in certificates {
            b = b.add_root_certificate(c);
        }
    }
    let client = b.build().map_err(|e| TlsError::Unusable(root_cause(&e)))?;
    let trust = ca_pem.map_or(0, |pem| registry.trust_hash(pem));
    Ok(HttpClient {
        client,
        trust,
        registry: registry.clone(),
    })
}

impl JolokiaClient {
    pub fn new(
        http: HttpClient,
        url: impl Into<String>,
        origin: Option<String>,
        credentials: Credentials,
        timeout: Duration,
    ) -> Self {
        let url = url.into();
        let origin = origin.unwrap_or_else(|| default_origin(&url));
        let budget = http.registry.budget_for(&url);
        JolokiaClient {
            http,
            url,
            origin,
            credentials,
            timeout,
            budget,
            purpose: Purpose::Work,
            sent: None,
        }
    }

    /// The same client for the topology poll's reads: the probe that may reach a node judged not
    /// answering (when nothing else is on the wire), never let go before its own answer.
    pub fn probing(&self) -> Self {
        JolokiaClient {
            purpose: Purpose::Probe,
            ..self.clone()
        }
    }

    /// The same client for work (commands, readers): fails at once while the node is judged not
    /// answering.
    pub fn working(&self) -> Self {
        JolokiaClient {
            purpose: Purpose::Work,
            ..self.clone()
        }
    }

    pub fn purpose(&self) -> Purpose {
        self.purpose
    }

    /// The same client, telling whether any of its requests went on the wire.
    pub fn tracked(&self) -> (Self, Sent) {
        let sent = Sent::default();
        let client = JolokiaClient {
            sent: Some(sent.clone()),
            ..self.clone()
        };
        (client, sent)
    }

    /// Note that a request of this client goes on the wire now.
    pub(crate) fn mark_sent(&self) {
        if let Some(s) = &self.sent {
            s.mark();
        }
    }

    /// The node behind this endpoint is judged not answering now: the evidence.
    pub fn not_answering(&self) -> Option<NotAnswering> {
        self.budget.not_answering()
    }

    /// Silences judged of this endpoint's node so far.
    pub fn silences(&self) -> u64 {
        self.budget.silences()
    }

    /// Resolves when the node behind this endpoint is judged not answering.
    pub async fn until_not_answering(&self) -> NotAnswering {
        self.budget.until_not_answering().await
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The endpoint as metrics and logs name it: the URL without user info.
    pub fn node(&self) -> &str {
        self.budget.node()
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The identity of the trust roots this client's requests go out with.
    pub(crate) fn trust(&self) -> u64 {
        self.http.trust()
    }

    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// The operator's per-node state this client belongs to.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.http.registry
    }

    pub(crate) fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Many operations in one POST, sent as they are (within the node's budget); one result per
    /// request, in order.
    pub async fn bulk(
        &self,
        requests: &[JolokiaRequest],
    ) -> Result<Vec<Result<Value, BrokerError>>, BrokerError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let permit = self
            .budget
            .acquire(self.purpose)
            .await
            .map_err(BrokerError::NotAnswering)?;
        self.post(permit, requests.to_vec()).await
    }

    /// One POST under a permit of this endpoint's budget: the budget learns how the node
    /// answered, the metrics count the POST and each operation's result.
    ///
    /// The POST runs on a task of its own: a work call stops waiting when the node is judged not
    /// answering (it fails with the evidence, `sent`), while its POST goes on to its answer or
    /// timeout, which the budget still learns — the answer of a node that comes back is what
    /// clears the judgement.
    pub(crate) async fn post(
        &self,
        permit: Permit,
        requests: Vec<JolokiaRequest>,
    ) -> Result<Vec<Result<Value, BrokerError>>, BrokerError> {
        self.mark_sent();
        let client = self.clone();
        // Supervision: one exchange, awaited below (a panic there is this call's error).
        let exchange = tokio::spawn(async move { client.exchange(permit, &requests).await });
        let stopped = |e: tokio::task::JoinError| {
            BrokerError::Unreachable(format!(
                "{}: the request stopped before an answer arrived ({e}); the effect of the call is unknown",
                self.node()
            ))
        };
        if self.purpose == Purpose::Probe {
            return exchange.await.map_err(stopped)?;
        }
        tokio::select! {
            biased;
            done = exchange => done.map_err(stopped)?,
            silence = self.budget.until_not_answering() => Err(BrokerError::NotAnswering(NotAnswering {
                sent: true,
                ..silence
            })),
        }
    }

    /// The POST itself, then what it showed to the budget and the metrics.
    async fn exchange(
        &self,
        permit: Permit,
        requests: &[JolokiaRequest],
    ) -> Result<Vec<Result<Value, BrokerError>>, BrokerError> {
        let started = tokio::time::Instant::now();
        let result = self.post_unbudgeted(requests).await;
        let elapsed = started.elapsed();
        let observation = match &result {
            Err(BrokerError::Timeout(_)) => Observation::TimedOut,
            Err(BrokerError::Unreachable(_)) => Observation::NoAnswer,
            _ => Observation::Answered(elapsed),
        };
        permit.finish(observation, self.timeout);
        let m = self.http.registry.metrics();
        let node = self.node();
        m.record_post(node, elapsed.as_secs_f64());
        match &result {
            Ok(results) => {
                for (request, r) in requests.iter().zip(results) {
                    m.record_request(
                        node,
                        request.kind(),
                        r.as_ref().err().map(BrokerError::refusal_kind),
                    );
                }
            }
            Err(e) => {
                for request in requests {
                    m.record_request(node, request.kind(), Some(e.refusal_kind()));
                }
            }
        }
        result
    }

    async fn post_unbudgeted(
        &self,
        requests: &[JolokiaRequest],
    ) -> Result<Vec<Result<Value, BrokerError>>, BrokerError> {
        tracing::debug!(node = %self.node(), requests = requests.len(), first = ?requests.first().map(JolokiaRequest::kind), "jolokia");
        let send = self
            .http
            .client
            .post(&self.url)
            .basic_auth(&self.credentials.username, Some(&self.credentials.password))
            .header("Origin", &self.origin)
            .json(requests)
            .timeout(self.timeout)
            .send();
        let started = std::time::Instant::now();
        let response = send.await.map_err(|e| self.transport_error(e))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| self.transport_error(e))?;
        tracing::debug!(node = %self.node(), status = status.as_u16(), elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "jolokia answered");
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(BrokerError::Refused(ManagementRefusal {
                kind: RefusalKind::NotAuthorized,
                code: None,
                message: format!(
                    "{} refused the credentials (HTTP {}): check the username and password in the credentials Secret, and that the user's role is in the broker's HAWTIO_ROLES",
                    self.node(),
                    status.as_u16()
                ),
            }));
        }
        let parsed: Value = serde_json::from_str(&body).map_err(|_| {
            BrokerError::BadResponse(format!(
                "{} answered HTTP {} with something that is not Jolokia JSON: is this the Jolokia URL (usually …/console/jolokia)?",
                self.node(),
                status.as_u16()
            ))
        })?;
        match parsed {
            Value::Array(items) if items.len() == requests.len() => {
                Ok(items.into_iter().map(element).collect())
            }
            Value::Array(items) => Err(BrokerError::BadResponse(format!(
                "{} answered {} results for {} requests",
                self.node(),
                items.len(),
                requests.len()
            ))),
            // The whole request was refused (Jolokia's access policy, before any request in it
            // was read): every element failed alike.
            Value::Object(ref whole) => match whole.get("status").and_then(Value::as_u64) {
                Some(status) if status != 200 => Err(self.explain(classify_whole_request(
                    status,
                    whole.get("error_type").and_then(Value::as_str),
                    whole.get("error").and_then(Value::as_str),
                ))),
                _ => Err(BrokerError::BadResponse(format!(
                    "{} answered one object to a bulk request",
                    self.node()
                ))),
            },
            _ => Err(BrokerError::BadResponse(format!(
                "{} answered an unexpected JSON shape",
                self.node()
            ))),
        }
    }

    fn transport_error(&self, e: reqwest::Error) -> BrokerError {
        if e.is_timeout() {
            BrokerError::Timeout(self.timeout.as_secs())
        } else if e.is_connect() || e.is_request() {
            BrokerError::Unreachable(format!("{}: {}", self.node(), root_cause(&e)))
        } else {
            BrokerError::BadResponse(format!("{}: {}", self.node(), root_cause(&e)))
        }
    }

    /// Add what to do to refusals whose cause is the request, not the broker's state.
    fn explain(&self, e: BrokerError) -> BrokerError {
        match e {
            BrokerError::Refused(mut r) if r.kind == RefusalKind::OriginRefused => {
                r.message = format!(
                    "{}: Jolokia's access policy on {} refused the request as a whole (the operator sent Origin {}). Set the cluster's spec.origin to an origin the broker's jolokia-access.xml allows (<cors> <allow-origin>; with the scheme of the broker's URL: an https origin is refused over http), e.g. http://<its --http-host>, or allow this origin in that file (a refused client address is its <remote>)",
                    r.message,
                    self.node(),
                    self.origin
                );
                BrokerError::Refused(r)
            }
            other => other,
        }
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// The value Jolokia puts where an attribute's value would be when a read with `ignoreErrors`
/// could not read it, recognised by its structure, never by a word in it: Jolokia 2.0–2.2 (as
/// Artemis 2.40 ships it) writes `"ERROR: <message> (class <exception class>)"`
/// (`ValueFaultHandler.IGNORING_VALUE_FAULT_HANDLER`); later versions an object with `".error":
/// true`, `error_type` and `error`. An ordinary string value — a filter such as
/// `kind = 'TimeoutException'` — is never a fault.
pub fn attribute_fault(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => {
            let body = s.strip_prefix("ERROR: ")?.strip_suffix(')')?;
            let (message, class) = body.rsplit_once(" (class ")?;
            is_java_class_name(class).then(|| format!("{message} ({class})"))
        }
        Value::Object(o) if o.get(".error").and_then(Value::as_bool) == Some(true) => Some(format!(
            "{} ({})",
            o.get("error").and_then(Value::as_str).unwrap_or("no message"),
            o.get("error_type")
                .and_then(Value::as_str)
                .unwrap_or("unknown type")
        )),
        _ => None,
    }
}

/// `a.b.C`, `a.b.C$D`: what `Class.toString()` prints after "class ".
fn is_java_class_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_' || c == '$')
                && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
        })
}

/// One element of a (bulk) response.
fn element(v: Value) -> Result<Value, BrokerError> {
    let status = v.get("status").and_then(Value::as_u64).unwrap_or(0);
    if status == 200 {
        return Ok(v.get("value").cloned().unwrap_or(Value::Null));
    }
    Err(classify(
        status,
        v.get("error_type").and_then(Value::as_str),
        v.get("error").and_then(Value::as_str),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_serialize_as_jolokia_expects() {
        let r = JolokiaRequest::exec(
            "m",
            "createQueue(java.lang.String,boolean)",
            vec![Value::from("{}"), Value::from(true)],
        );
        assert_eq!(
            serde_json::to_value(&r).unwrap_or_default(),
            serde_json::json!({"type":"exec","mbean":"m","operation":"createQueue(java.lang.String,boolean)","arguments":["{}",true]})
        );
        let r = JolokiaRequest::read("m", "NodeID");
        assert_eq!(
            serde_json::to_value(&r).unwrap_or_default(),
            serde_json::json!({"type":"read","mbean":"m","attribute":"NodeID"})
        );
    }

    #[test]
    fn origin_defaults_to_scheme_and_host() {
        assert_eq!(
            default_origin("http://localhost:8261/console/jolokia"),
            "http://localhost"
        );
        assert_eq!(
            default_origin("https://b-0.b.ns.svc:8161/console/jolokia"),
            "https://b-0.b.ns.svc"
        );
    }

    #[test]
    fn an_attribute_fault_is_recognised_by_jolokias_structure_not_by_a_word() {
        use serde_json::json;
        // Jolokia 2.1/2.2 (Artemis 2.40) and later versions.
        let old =
            json!("ERROR: java.lang.IllegalStateException: boom (class java.lang.IllegalStateException)");
        assert!(attribute_fault(&old).is_some_and(|m| m.contains("boom")));
        let new =
            json!({".error": true, "error_type": "javax.management.RuntimeMBeanException", "error": "boom"});
        assert!(attribute_fault(&new).is_some());
        // Ordinary values that merely mention errors or exceptions are values.
        for v in [
            json!("kind = 'TimeoutException'"),
            json!("ERROR = 1"),
            json!("type = 'ERROR: x (class y z)'"),
            json!("java.lang.IllegalStateException: boom"),
            json!({"error": "a property map, not a fault"}),
            json!(3),
        ] {
            assert_eq!(attribute_fault(&v), None, "{v} is a value");
        }
    }

    #[test]
    fn a_ca_that_is_not_pem_is_refused_and_trust_is_part_of_identity() {
        assert!(matches!(
            http_client(&Registry::standalone(), Some(b"not a certificate")),
            Err(TlsError::NotPem)
        ));
        assert!(matches!(
            http_client(&Registry::standalone(), Some(b"")),
            Err(TlsError::NotPem)
        ));
        let plain = http_client(&Registry::standalone(), None).expect("system roots");
        assert_eq!(plain.trust(), 0);
    }

    #[test]
    fn credentials_never_print_the_password() {
        let c = Credentials {
            username: "u".into(),
            password: "s3cret".into(),
        };
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
