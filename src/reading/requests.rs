//! Request-reply correlation from captured rows (ADR-0062 D2): a request is a row on the
//! address that carries a reply-to; its reply is a row whose correlation ID is the request's
//! message ID (or its correlation ID, for requesters that set one). A reply to an address no
//! tap covers — a temporary reply queue above all, which cannot be pre-diverted (ADR-0062
//! Consequences) — is "not capturable", never "no reply".

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::store::reading::StoredMessage;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReplyVerdict {
    /// A captured reply correlates.
    Replied,
    /// The reply address is captured and no correlating row was stored.
    NoReplyCaptured,
    /// The reply address has no tap (a temporary reply queue, or an address no subscription
    /// captures): whether a reply came cannot be known from capture.
    ReplyNotCapturable,
}

/// What a latency is measured between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LatencyBasis {
    /// Both messages carry the time they were routed (an ingress timestamp or a creation time
    /// set by the client).
    Routed,
    /// At least one does not: the times the rows were stored, accurate to a drain batch.
    Captured,
}

/// One request and what became of it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Exchange {
    pub request_row: i64,
    pub request_message_id: Option<String>,
    pub requested_at: DateTime<Utc>,
    /// The reply-to as the request carried it.
    pub reply_to: String,
    /// The address a reply is routed to (the reply-to without scheme or queue part).
    pub reply_address: String,
    pub verdict: ReplyVerdict,
    pub reply_row: Option<i64>,
    pub replied_at: Option<DateTime<Utc>>,
    pub latency_ms: Option<i64>,
    pub latency_basis: Option<LatencyBasis>,
    /// Why, for a human.
    pub reason: String,
}

/// The address a reply-to routes to: `queue://x`, `topic://x`, `temp-queue://x`, `x::q` → `x`.
pub fn reply_address(reply_to: &str) -> String {
    let bare = reply_to.split_once("://").map_or(reply_to, |(_, rest)| rest);
    bare.split_once("::").map_or(bare, |(a, _)| a).to_string()
}

/// A reply-to that names a temporary queue: a JMS/AMQP temporary destination scheme, or the
/// UUID name the broker gives a dynamic (temporary) node.
pub fn looks_temporary(reply_to: &str) -> bool {
    let lower = reply_to.to_ascii_lowercase();
    if lower.starts_with("temp-queue://") || lower.starts_with("temp-topic://") {
        return true;
    }
    let address = reply_address(reply_to);
    let hex_groups: Vec<usize> = address.split('-').map(str::len).collect();
    hex_groups == [8, 4, 4, 4, 12] && address.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
}

fn when(m: &StoredMessage) -> DateTime<Utc> {
    m.routed_at.unwrap_or(m.captured_at)
}

/// Pair each request (a row on the address with a reply-to) with its reply among `candidates`;
/// `captured_addresses` are the addresses some tap of the cluster covered in the window.
pub fn correlate(
    requests: &[StoredMessage],
    candidates: &[StoredMessage],
    captured_addresses: &BTreeSet<String>,
) -> Vec<Exchange> {
    // Two subscriptions capturing one address store a message twice: one exchange per message.
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut by_correlation: BTreeMap<&str, Vec<&StoredMessage>> = BTreeMap::new();
    for c in candidates {
        if let Some(id) = c.correlation_id.as_deref() {
            by_correlation.entry(id).or_default().push(c);
        }
    }
    let mut out = vec![];
    for q in requests {
        let Some(reply_to) = q.reply_to.as_deref() else {
            continue;
        };
        let identity = q
            .source_message_id
            .clone()
            .or_else(|| q.message_id.clone())
            .unwrap_or_else(|| q.row_id.to_string());
        if !seen.insert(format!("{}\u{0}{identity}", q.original_address)) {
            continue;
        }
        let address = reply_address(reply_to);
        let keys = [q.message_id.as_deref(), q.correlation_id.as_deref()];
        let reply = keys
            .iter()
            .flatten()
            .filter_map(|k| by_correlation.get(k))
            .flatten()
            .filter(|r| r.row_id != q.row_id && r.original_address == address)
            .min_by_key(|r| (when(r), r.row_id));
        let (verdict, reason) = match reply {
            Some(_) => (ReplyVerdict::Replied, format!("reply captured on {address}")),
            None if captured_addresses.contains(&address) => (
                ReplyVerdict::NoReplyCaptured,
                format!("{address} is captured and no row correlates (see its coverage for gaps)"),
            ),
            None if looks_temporary(reply_to) => (
                ReplyVerdict::ReplyNotCapturable,
                format!(
                    "reply not capturable: {address} is a temporary reply queue, which cannot be pre-diverted (ADR-0062)"
                ),
            ),
            None => (
                ReplyVerdict::ReplyNotCapturable,
                format!("reply not capturable: no capture subscription covers {address}"),
            ),
        };
        out.push(Exchange {
            request_row: q.row_id,
            request_message_id: q.message_id.clone(),
            requested_at: when(q),
            reply_to: reply_to.to_string(),
            reply_address: address,
            verdict,
            reply_row: reply.map(|r| r.row_id),
            replied_at: reply.map(|r| when(r)),
            latency_ms: reply.map(|r| (when(r) - when(q)).num_milliseconds()),
            latency_basis: reply.map(|r| {
                if r.routed_at.is_some() && q.routed_at.is_some() {
                    LatencyBasis::Routed
                } else {
                    LatencyBasis::Captured
                }
            }),
            reason,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, address: &str, message_id: &str, ms: i64) -> StoredMessage {
        StoredMessage {
            row_id: id,
            cluster: "ns/c".into(),
            subscription: "s".into(),
            node: "n1".into(),
            original_address: address.into(),
            capture_queue: "q".into(),
            source_message_id: Some(format!("src-{id}")),
            message_id: Some(message_id.into()),
            correlation_id: None,
            reply_to: None,
            properties: serde_json::json!({}),
            headers: serde_json::json!({}),
            body_text: None,
            body_binary: false,
            body_size: 0,
            body_truncated: false,
            routed_at: DateTime::from_timestamp_millis(1_800_000_000_000 + ms),
            captured_at: DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("time"),
            origin: "captured".into(),
        }
    }

    #[test]
    fn reply_to_forms_reduce_to_an_address_and_uuids_look_temporary() {
        assert_eq!(reply_address("queue://svc.replies"), "svc.replies");
        assert_eq!(reply_address("svc.replies::r1"), "svc.replies");
        assert_eq!(reply_address("svc.replies"), "svc.replies");
        assert!(looks_temporary("temp-queue://whatever"));
        assert!(looks_temporary("5c0f3a52-1d6e-11ef-9e8b-0242ac120002"));
        assert!(!looks_temporary("svc.replies"));
    }

    #[test]
    fn pairs_come_with_latency_and_an_uncaptured_temporary_reply_is_not_capturable() {
        let mut asked = row(1, "svc.req", "m1", 0);
        asked.reply_to = Some("queue://svc.replies".into());
        let mut reply = row(2, "svc.replies", "r1", 250);
        reply.correlation_id = Some("m1".into());
        let mut unanswered = row(3, "svc.req", "m2", 10);
        unanswered.reply_to = Some("svc.replies".into());
        let mut temporary = row(4, "svc.req", "m3", 20);
        temporary.reply_to = Some("5c0f3a52-1d6e-11ef-9e8b-0242ac120002".into());
        let mut elsewhere = row(5, "svc.req", "m4", 30);
        elsewhere.reply_to = Some("other.replies".into());
        let captured: BTreeSet<String> = ["svc.req".to_string(), "svc.replies".to_string()].into();
        let x = correlate(&[asked, unanswered, temporary, elsewhere], &[reply], &captured);
        let verdicts: Vec<(i64, ReplyVerdict, Option<i64>)> = x
            .iter()
            .map(|e| (e.request_row, e.verdict, e.latency_ms))
            .collect();
        assert_eq!(
            verdicts,
            vec![
                (1, ReplyVerdict::Replied, Some(250)),
                (3, ReplyVerdict::NoReplyCaptured, None),
                (4, ReplyVerdict::ReplyNotCapturable, None),
                (5, ReplyVerdict::ReplyNotCapturable, None),
            ]
        );
        assert!(x[2].reason.contains("temporary"), "{}", x[2].reason);
        assert!(x[3].reason.contains("no capture subscription"), "{}", x[3].reason);
    }
}
