//! One error type for every management call, classified once, close to the broker.

use crate::api::RefusalKind;

/// A management call that did not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// The broker (or Jolokia's access policy) answered and refused.
    #[error("{0}")]
    Refused(ManagementRefusal),
    /// No connection to the endpoint.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// No answer in time; the call's effect is unknown.
    #[error("timed out after {0}s; the effect of the call is unknown")]
    Timeout(u64),
    /// An answer the operator cannot interpret (not Jolokia, or not the expected shape).
    #[error("bad response: {0}")]
    BadResponse(String),
    /// Jolokia's 404 for a request element: the MBean does not exist (InstanceNotFoundException)
    /// — a queue, address or divert that is not (or no longer) on the broker.
    #[error("bad response: status 404: {0}")]
    NoSuchMBean(String),
    /// The node is judged not answering (the per-node budget's evidence, `budget::Health`):
    /// the call was not sent, or was let go unanswered. A structure of its own so the fan-out
    /// reports the node as not live (never called) without reading any text.
    #[error("{0}")]
    NotAnswering(NotAnswering),
}

/// The evidence that a node does not answer at all, as the per-node budget judged it: why a
/// call failed fast instead of waiting a request timeout behind POSTs the node never answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnswering {
    /// The call was on the wire when the node was judged (its effect is unknown until the node
    /// answers); false: it was never sent.
    pub sent: bool,
    /// POSTs that timed out with no answer from the node since they were sent.
    pub timed_out: u32,
    /// POSTs on the wire now, unanswered.
    pub unanswered: usize,
    /// When the node stopped answering: the start of the oldest POST it left unanswered.
    pub since: chrono::DateTime<chrono::Utc>,
}

impl NotAnswering {
    /// What was seen, for a human: counts and the moment the silence began.
    pub fn evidence(&self) -> String {
        let since = self.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        match (self.timed_out, self.unanswered) {
            (0, waiting) => format!("{waiting} calls unanswered since {since}"),
            (timed_out, 0) => format!("{timed_out} calls timed out since {since}"),
            (timed_out, waiting) => {
                format!("{timed_out} calls timed out and {waiting} unanswered since {since}")
            }
        }
    }
}

impl std::fmt::Display for NotAnswering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.sent {
            write!(
                f,
                "stopped answering while this call was on the wire ({}): its effect is unknown until the node answers again",
                self.evidence()
            )
        } else {
            write!(f, "not answering: {}; not sent", self.evidence())
        }
    }
}

/// A refusal by the broker, with its kind and what it said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ManagementRefusal {
    pub kind: RefusalKind,
    /// The broker's AMQ code, when it gave one.
    pub code: Option<String>,
    /// What the broker said, without the Java class prefix.
    pub message: String,
}

impl BrokerError {
    pub fn refusal_kind(&self) -> RefusalKind {
        match self {
            BrokerError::Refused(r) => r.kind,
            BrokerError::Unreachable(_) => RefusalKind::Unreachable,
            BrokerError::Timeout(_) => RefusalKind::Timeout,
            BrokerError::BadResponse(_) | BrokerError::NoSuchMBean(_) => RefusalKind::BadResponse,
            // Sent: as a timeout, the effect is unknown. Not sent: the node could not be reached.
            BrokerError::NotAnswering(n) if n.sent => RefusalKind::Timeout,
            BrokerError::NotAnswering(_) => RefusalKind::Unreachable,
        }
    }

    /// The MBean asked for does not exist (Jolokia's 404): the object is not on the broker.
    pub fn is_no_such_mbean(&self) -> bool {
        matches!(self, BrokerError::NoSuchMBean(_))
    }

    /// An authorization refusal: the evidence for managementWrite = UNAVAILABLE (ADR-0049).
    pub fn is_authorization(&self) -> bool {
        matches!(self, BrokerError::Refused(r) if r.kind == RefusalKind::NotAuthorized)
    }

    pub fn code(&self) -> Option<&str> {
        match self {
            BrokerError::Refused(r) => r.code.as_deref(),
            _ => None,
        }
    }

    pub fn refused(kind: RefusalKind, message: impl Into<String>) -> Self {
        BrokerError::Refused(ManagementRefusal {
            kind,
            code: None,
            message: message.into(),
        })
    }
}

/// The AMQ codes this product acts on (ActiveMQMessageBundle).
fn kind_of_code(code: &str) -> Option<RefusalKind> {
    Some(match code {
        "AMQ229012" | "AMQ229231" => RefusalKind::DivertDoesNotExist,
        "AMQ229013" => RefusalKind::NotADivert,
        "AMQ229017" => RefusalKind::QueueDoesNotExist,
        "AMQ229019" => RefusalKind::QueueExists,
        "AMQ229025" => RefusalKind::HasConsumers,
        "AMQ229203" => RefusalKind::AddressDoesNotExist,
        "AMQ229204" => RefusalKind::AddressExists,
        "AMQ229205" => RefusalKind::AddressHasBindings,
        "AMQ229207" => RefusalKind::RoutingTypeNotSupported,
        "AMQ229210" => RefusalKind::MaxConsumersTooLow,
        "AMQ229211" => RefusalKind::RoutingTypeImmutable,
        "AMQ229229" => RefusalKind::InvalidConfiguration,
        _ => return None,
    })
}

/// Find the first `AMQ` + 6 digits in a message.
fn amq_code(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("AMQ") {
        let start = i + pos;
        let digits = &bytes[start + 3..];
        if digits.len() >= 6 && digits[..6].iter().all(u8::is_ascii_digit) {
            return Some(text[start..start + 9].to_string());
        }
        i = start + 3;
    }
    None
}

/// Strip Jolokia's `"<java class> : "` prefix.
fn broker_message(error: &str) -> &str {
    match error.split_once(" : ") {
        Some((class, rest)) if !class.contains(' ') => rest,
        _ => error,
    }
}

/// Classify one Jolokia response element that did not have status 200.
pub fn classify(status: u64, error_type: Option<&str>, error: Option<&str>) -> BrokerError {
    let error = error.unwrap_or("");
    let message = broker_message(error).to_string();
    if let Some((code, kind)) = amq_code(error).and_then(|c| kind_of_code(&c).map(|k| (c, k))) {
        return BrokerError::Refused(ManagementRefusal {
            kind,
            code: Some(code),
            message,
        });
    }
    if status == 403 {
        // One request of a bulk POST refused (the element carries its `request`): the broker's
        // management.xml authorization of the management user (Artemis's guard throws a
        // SecurityException, which Jolokia reports as 403). Jolokia's access policy refuses the
        // whole POST instead: see [`classify_whole_request`].
        return BrokerError::Refused(ManagementRefusal {
            kind: RefusalKind::NotAuthorized,
            code: None,
            message,
        });
    }
    let parse_error =
        error_type.is_some_and(|t| t.contains("JsonParsingException") || t.contains("JsonException"));
    if parse_error {
        return BrokerError::Refused(ManagementRefusal {
            kind: RefusalKind::InvalidConfiguration,
            code: None,
            message,
        });
    }
    if status == 404 {
        return BrokerError::NoSuchMBean(message);
    }
    BrokerError::BadResponse(format!("status {status}: {message}"))
}

/// Classify Jolokia's answer to a bulk POST that is one object with a status, not one element
/// per request: the agent refused the HTTP request as a whole, before reading any request in it.
///
/// Status 403 there is Jolokia's access policy, by structure: `AgentServlet.handle` calls
/// `HttpRequestHandler.checkAccess` first and answers its `SecurityException` through
/// `handleThrowable` with HTTP 200 and one object `{"status": 403, "error_type":
/// "java.lang.Exception", "error": …}` (jolokia/jolokia v2.1.1, which Artemis 2.40 ships, and
/// later versions alike). The management user's refusals come otherwise: a wrong password is
/// HTTP 401/403 from the web server, an operation management.xml denies is a 403 element of
/// the array, with its `request`. So this is [`RefusalKind::OriginRefused`], classified here once.
///
/// Which clause of `checkAccess` refused (the Origin is not allowed under strict checking, an
/// https Origin over http, or the client address under `<remote>`) Jolokia says only in its
/// message, so this does not tell them apart: the message is kept as the broker wrote it, and
/// the fix the operator adds names both `spec.origin` and `jolokia-access.xml`.
pub fn classify_whole_request(status: u64, error_type: Option<&str>, error: Option<&str>) -> BrokerError {
    if status == 403 {
        return BrokerError::Refused(ManagementRefusal {
            kind: RefusalKind::OriginRefused,
            code: None,
            message: broker_message(error.unwrap_or("")).to_string(),
        });
    }
    classify(status, error_type, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> serde_json::Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/jolokia")
            .join(name);
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture json")
    }

    fn classify_fixture(name: &str) -> BrokerError {
        let v = fixture(name);
        classify(
            v["status"].as_u64().unwrap_or(0),
            v["error_type"].as_str(),
            v["error"].as_str(),
        )
    }

    #[test]
    fn classifies_captured_broker_refusals_by_code() {
        for (file, kind, code) in [
            (
                "create_queue_exists_AMQ229019.json",
                RefusalKind::QueueExists,
                "AMQ229019",
            ),
            (
                "create_queue_no_address_AMQ229203.json",
                RefusalKind::AddressDoesNotExist,
                "AMQ229203",
            ),
            (
                "update_queue_routing_type_AMQ229211.json",
                RefusalKind::RoutingTypeImmutable,
                "AMQ229211",
            ),
            (
                "update_queue_missing_AMQ229017.json",
                RefusalKind::QueueDoesNotExist,
                "AMQ229017",
            ),
            (
                "destroy_queue_missing_AMQ229017.json",
                RefusalKind::QueueDoesNotExist,
                "AMQ229017",
            ),
            (
                "destroy_divert_missing_AMQ229012.json",
                RefusalKind::DivertDoesNotExist,
                "AMQ229012",
            ),
            (
                "destroy_divert_not_a_divert_AMQ229013.json",
                RefusalKind::NotADivert,
                "AMQ229013",
            ),
            (
                "delete_address_has_bindings_AMQ229205.json",
                RefusalKind::AddressHasBindings,
                "AMQ229205",
            ),
            (
                "create_address_exists_AMQ229204.json",
                RefusalKind::AddressExists,
                "AMQ229204",
            ),
        ] {
            let e = classify_fixture(file);
            assert_eq!(e.refusal_kind(), kind, "{file}: {e}");
            assert_eq!(e.code(), Some(code), "{file}");
            assert!(
                !e.to_string().contains("java."),
                "{file}: message keeps the class name: {e}"
            );
        }
    }

    /// Jolokia's 404 (an MBean that does not exist) is its own variant, read by structure —
    /// never by the text "status 404" — and prints as before.
    #[test]
    fn an_mbean_that_does_not_exist_is_no_such_mbean() {
        let e = classify(
            404,
            Some("javax.management.InstanceNotFoundException"),
            Some(
                "javax.management.InstanceNotFoundException : org.apache.activemq.artemis:broker=\"b\",component=addresses,address=\"x\"",
            ),
        );
        assert!(e.is_no_such_mbean(), "{e:?}");
        assert_eq!(e.refusal_kind(), RefusalKind::BadResponse);
        assert!(e.to_string().starts_with("bad response: status 404: "), "{e}");
        let other = classify(500, None, Some("boom"));
        assert!(!other.is_no_such_mbean(), "{other:?}");
    }

    #[test]
    fn classifies_authorization_and_malformed_requests() {
        let e = classify_fixture("create_queue_viewer_not_authorized.json");
        assert!(e.is_authorization(), "{e}");
        assert!(
            e.to_string()
                .contains("not authorized to access operation: createQueue")
        );

        let e = classify_fixture("create_queue_bad_json.json");
        assert_eq!(e.refusal_kind(), RefusalKind::InvalidConfiguration, "{e}");
        assert!(!e.is_authorization());

        let e = classify_fixture("exec_unknown_operation.json");
        assert_eq!(e.refusal_kind(), RefusalKind::BadResponse, "{e}");
        let e = classify_fixture("read_unknown_mbean_404.json");
        assert_eq!(e.refusal_kind(), RefusalKind::BadResponse, "{e}");
    }

    /// Issue 42: "Secure origin … should not be processed over HTTP" was CredentialsRefused.
    /// Jolokia's access policy answers a bulk POST with one object (captured from the bed's
    /// strict-origin broker c1, Jolokia 2.1.1): OriginRefused, whatever its words; the same 403
    /// as an element of the array is management.xml refusing the user.
    #[test]
    fn a_whole_request_refused_by_jolokias_access_policy_is_origin_refused() {
        for file in [
            "bulk_secure_origin_over_http_403.json",
            "bulk_origin_not_allowed_403.json",
            "read_without_origin_403.json",
        ] {
            let v = fixture(file);
            assert!(
                v.is_object() && v.get("request").is_none(),
                "{file}: not the whole-request shape"
            );
            let e = classify_whole_request(
                v["status"].as_u64().unwrap_or(0),
                v["error_type"].as_str(),
                v["error"].as_str(),
            );
            assert_eq!(e.refusal_kind(), RefusalKind::OriginRefused, "{file}: {e}");
            assert!(!e.is_authorization(), "{file}");
            assert!(!e.to_string().contains("java."), "{file}: {e}");
        }
        let v = fixture("create_queue_viewer_not_authorized.json");
        let e = classify_whole_request(
            v["status"].as_u64().unwrap_or(0),
            v["error_type"].as_str(),
            v["error"].as_str(),
        );
        assert_eq!(
            e.refusal_kind(),
            RefusalKind::OriginRefused,
            "the shape decides, not the words"
        );
        assert!(classify_fixture("create_queue_viewer_not_authorized.json").is_authorization());
        // Another status of the whole request is classified as an element's would be.
        let e = classify_whole_request(
            500,
            Some("java.lang.Exception"),
            Some("java.lang.Exception : boom"),
        );
        assert_eq!(e.refusal_kind(), RefusalKind::BadResponse, "{e}");
    }

    #[test]
    fn finds_codes_anywhere_in_the_message() {
        assert_eq!(
            amq_code("x AMQ229025: Cannot delete queue"),
            Some("AMQ229025".into())
        );
        assert_eq!(
            amq_code("AMQ12 short, then AMQ229017: gone"),
            Some("AMQ229017".into())
        );
        assert_eq!(amq_code("no code"), None);
    }

    /// The refusals the fixtures above do not capture, each classified by its AMQ code alone:
    /// the kind decides the node's message (the flag, the field, the routing type to add).
    /// AMQ229025 is ADR-0084 §6: a consumer that attaches between the preflight's ConsumerCount
    /// and `destroyQueue` is refused by the broker, and that refusal is HAS_CONSUMERS (the node's
    /// message then names `spec.deletion.disconnectConsumers`), never a generic bad response.
    #[test]
    fn refusals_without_a_fixture_are_classified_by_their_amq_code() {
        for (error_type, error, kind, code) in [
            (
                "org.apache.activemq.artemis.api.core.ActiveMQIllegalStateException",
                "org.apache.activemq.artemis.api.core.ActiveMQIllegalStateException : AMQ229025: Cannot delete queue fx.q on binding fx.q - it has consumers = org.apache.activemq.artemis.core.server.impl.ServerConsumerImpl",
                RefusalKind::HasConsumers,
                "AMQ229025",
            ),
            (
                "java.lang.IllegalArgumentException",
                "java.lang.IllegalArgumentException : AMQ229207: Address fx.q is not configured to support routing type MULTICAST",
                RefusalKind::RoutingTypeNotSupported,
                "AMQ229207",
            ),
            (
                "java.lang.IllegalStateException",
                "java.lang.IllegalStateException : AMQ229210: Can't update queue fx.q with maxConsumers: 1. Current consumers are 2.",
                RefusalKind::MaxConsumersTooLow,
                "AMQ229210",
            ),
            (
                "java.lang.IllegalArgumentException",
                "java.lang.IllegalArgumentException : AMQ229229: Failed to parse JSON queue configuration: {\"name\":",
                RefusalKind::InvalidConfiguration,
                "AMQ229229",
            ),
            (
                "org.apache.activemq.artemis.api.core.ActiveMQNonExistentQueueException",
                "org.apache.activemq.artemis.api.core.ActiveMQNonExistentQueueException : AMQ229231: Divert Does Not Exist: fx.d",
                RefusalKind::DivertDoesNotExist,
                "AMQ229231",
            ),
        ] {
            let e = classify(500, Some(error_type), Some(error));
            assert_eq!(e.refusal_kind(), kind, "{code}: {e}");
            assert_eq!(e.code(), Some(code), "{code}");
            assert!(!e.is_authorization(), "{code}");
            assert!(
                !e.to_string().contains("java."),
                "{code}: message keeps the class name: {e}"
            );
        }
        // An AMQ code this product does not act on stays a bad response, with the broker's words.
        let e = classify(
            500,
            Some("java.lang.IllegalStateException"),
            Some("java.lang.IllegalStateException : AMQ229999: something else"),
        );
        assert_eq!(e.refusal_kind(), RefusalKind::BadResponse, "{e}");
        assert_eq!(e.code(), None);
        assert!(e.to_string().contains("AMQ229999: something else"), "{e}");
    }

    /// Only a Java class name before " : " is stripped: a broker message that itself holds " : "
    /// reaches the user whole.
    #[test]
    fn only_a_class_name_prefix_is_stripped_from_the_brokers_words() {
        let e = classify(
            500,
            Some("java.lang.IllegalStateException"),
            Some("Queue fx.q : not ready"),
        );
        assert_eq!(e.to_string(), "bad response: status 500: Queue fx.q : not ready");
        let e = classify(
            500,
            Some("java.lang.IllegalStateException"),
            Some("java.lang.IllegalStateException : Queue fx.q : not ready"),
        );
        assert_eq!(e.to_string(), "bad response: status 500: Queue fx.q : not ready");
    }
}
