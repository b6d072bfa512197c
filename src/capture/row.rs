//! One delivered copy as a row (ADR-0062 D4, D10; issue 25). Every AMQP body kind is stored
//! faithfully: a data section, or an amqp-value binary, as bytes in `body_binary`; an amqp-value
//! string as text; any other amqp-value, and amqp-sequence sections, as a JSON rendering in
//! `body_text` that keeps binaries as binaries (`{"$binary": "<hex>"}`); and the body kind is
//! kept with the row. What Postgres cannot take as it is is handled by `store::storable`.

use fe2o3_amqp::types::messaging::annotations::OwnedKey;
use fe2o3_amqp::types::messaging::{Body, Message, MessageId};
use fe2o3_amqp::types::primitives::Value;
use serde_json::json;

use crate::api::capture_names::TapName;
use crate::store::captured::CapturedRow;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|x| format!("{x:02x}")).collect()
}

fn id_text(id: &MessageId) -> String {
    match id {
        MessageId::String(s) => s.clone(),
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(u) => hex(u.as_inner()),
        MessageId::Binary(b) => hex(b),
    }
}

fn float(f: f64) -> serde_json::Value {
    if f.is_finite() {
        json!(f)
    } else {
        json!(f.to_string())
    }
}

/// A faithful JSON rendering of an AMQP value: scalars as JSON scalars (a timestamp as its
/// milliseconds), a binary as `{"$binary": hex}`, a map's non-string keys as their rendering.
pub fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => json!(b),
        Value::Ubyte(n) => json!(n),
        Value::Ushort(n) => json!(n),
        Value::Uint(n) => json!(n),
        Value::Ulong(n) => json!(n),
        Value::Byte(n) => json!(n),
        Value::Short(n) => json!(n),
        Value::Int(n) => json!(n),
        Value::Long(n) => json!(n),
        Value::Float(n) => float(f64::from(n.0)),
        Value::Double(n) => float(n.0),
        Value::Decimal32(d) => json!({"$decimal32": hex(d.as_inner())}),
        Value::Decimal64(d) => json!({"$decimal64": hex(d.as_inner())}),
        Value::Decimal128(d) => json!({"$decimal128": hex(d.as_inner())}),
        Value::Char(c) => json!(c.to_string()),
        Value::Timestamp(t) => json!(t.milliseconds()),
        Value::Uuid(u) => json!(uuid::Uuid::from_bytes(*u.as_inner()).to_string()),
        Value::Binary(b) => json!({"$binary": hex(b)}),
        Value::String(s) => json!(s),
        Value::Symbol(s) => json!(s.0),
        Value::List(l) => serde_json::Value::Array(l.iter().map(to_json).collect()),
        Value::Array(a) => serde_json::Value::Array(a.0.iter().map(to_json).collect()),
        Value::Map(m) => serde_json::Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Value::String(s) => s.clone(),
                        Value::Symbol(s) => s.0.clone(),
                        other => to_json(other).to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Value::Described(d) => {
            json!({"$descriptor": format!("{:?}", d.descriptor), "value": to_json(&d.value)})
        }
    }
}

/// A body as (kind, text, bytes).
pub fn body_of(body: &Body<Value>) -> (&'static str, Option<String>, Option<Vec<u8>>) {
    match body {
        Body::Data(sections) => (
            "data",
            None,
            Some(sections.iter().flat_map(|d| d.0.iter().copied()).collect()),
        ),
        Body::Value(v) => match &v.0 {
            Value::String(s) => ("amqp-value", Some(s.clone()), None),
            Value::Binary(b) => ("amqp-value", None, Some(b.to_vec())),
            Value::Null => ("amqp-value", None, None),
            other => ("amqp-value", Some(to_json(other).to_string()), None),
        },
        // One JSON array per sequence section.
        Body::Sequence(sections) => (
            "amqp-sequence",
            Some(
                serde_json::Value::Array(
                    sections
                        .iter()
                        .map(|s| serde_json::Value::Array(s.0.iter().map(to_json).collect()))
                        .collect(),
                )
                .to_string(),
            ),
            None,
        ),
        Body::Empty => ("empty", None, None),
    }
}

fn headers_of(
    m: &Message<Body<Value>>,
    annotations: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Value {
    let mut headers = serde_json::Map::new();
    if let Some(h) = &m.header {
        headers.insert("durable".into(), json!(h.durable));
        headers.insert("priority".into(), json!(h.priority.0));
        headers.insert("ttl".into(), json!(h.ttl));
        headers.insert("deliveryCount".into(), json!(h.delivery_count));
    }
    if let Some(p) = &m.properties {
        if let Some(s) = &p.subject {
            headers.insert("subject".into(), json!(s));
        }
        if let Some(c) = &p.content_type {
            headers.insert("contentType".into(), json!(c.0));
        }
    }
    headers.insert("annotations".into(), serde_json::Value::Object(annotations));
    serde_json::Value::Object(headers)
}

/// One delivered copy as a row (pure). The original address comes from our install record (the
/// tap we drain), never from a header (ADR-0062 D4); the source message ID from the broker's
/// divert annotations (AMQP origin) or properties (Core/JMS origin), null when absent.
pub fn row(node: &str, tap: &TapName, max_body: usize, m: &Message<Body<Value>>) -> CapturedRow {
    let annotations: serde_json::Map<String, serde_json::Value> = m
        .message_annotations
        .as_ref()
        .map(|a| {
            a.0.iter()
                .map(|(k, v)| {
                    let key = match k {
                        OwnedKey::Symbol(s) => s.0.clone(),
                        OwnedKey::Ulong(n) => n.to_string(),
                    };
                    (key, to_json(v))
                })
                .collect()
        })
        .unwrap_or_default();
    let properties: serde_json::Map<String, serde_json::Value> = m
        .application_properties
        .as_ref()
        .map(|p| {
            p.0.iter()
                .map(|(k, v)| (k.clone(), to_json(&Value::from(v.clone()))))
                .collect()
        })
        .unwrap_or_default();
    let source = annotations
        .get("x-opt-ORIG-MESSAGE-ID")
        .or_else(|| properties.get("_AMQ_ORIG_MESSAGE_ID"))
        .filter(|v| !v.is_null())
        .map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()));
    let p = m.properties.as_ref();
    let routed_at = annotations
        .get("x-opt-ingress-time")
        .and_then(serde_json::Value::as_i64)
        .or_else(|| p.and_then(|p| p.creation_time.as_ref()).map(|t| t.milliseconds()))
        .and_then(chrono::DateTime::from_timestamp_millis);
    let (kind, text, binary) = body_of(&m.body);
    let size = text
        .as_ref()
        .map(String::len)
        .or(binary.as_ref().map(Vec::len))
        .unwrap_or(0);
    let (text, binary) = crate::store::storable::cut_body(text, binary, max_body);
    CapturedRow {
        node: node.into(),
        original_address: tap.address.clone(),
        capture_queue: tap.capture_queue(),
        source_message_id: source,
        message_id: p.and_then(|p| p.message_id.as_ref()).map(id_text),
        correlation_id: p.and_then(|p| p.correlation_id.as_ref()).map(id_text),
        reply_to: p.and_then(|p| p.reply_to.clone()),
        properties: serde_json::Value::Object(properties),
        headers: headers_of(m, annotations),
        body_text: text,
        body_binary: binary,
        body_size: i32::try_from(size).unwrap_or(i32::MAX),
        body_truncated: size > max_body,
        routed_at,
        body_kind: Some(kind),
        escaped: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp::types::messaging::{
        AmqpSequence, AmqpValue, ApplicationProperties, Data, MessageAnnotations, Properties,
    };
    use fe2o3_amqp::types::primitives::{Array, Binary, OrderedMap};

    fn with_body(body: Body<Value>) -> Message<Body<Value>> {
        Message::builder()
            .properties(Properties::builder().message_id(String::from("m-1")).build())
            .message_annotations(
                MessageAnnotations::builder()
                    .insert("x-opt-ORIG-MESSAGE-ID", Value::Long(42))
                    .insert("x-opt-ORIG-ADDRESS", Value::String("spoofed".into()))
                    .build(),
            )
            .application_properties(ApplicationProperties::builder().insert("region", "eu").build())
            .body(body)
            .build()
    }

    fn message(body: &str) -> Message<Body<Value>> {
        with_body(Body::Value(AmqpValue(Value::String(body.into()))))
    }

    fn tap() -> TapName {
        TapName::new("i1", "ns", "orders.in", "sub")
    }

    #[test]
    fn the_original_address_is_ours_and_the_source_id_the_brokers() {
        let r = row("n1", &tap(), 1024, &message("hello"));
        assert_eq!(
            r.original_address, "orders.in",
            "from the install record, not a header"
        );
        assert_eq!(r.source_message_id.as_deref(), Some("42"));
        assert_eq!(r.message_id.as_deref(), Some("m-1"));
        assert_eq!(r.properties["region"], "eu");
        assert_eq!(r.body_text.as_deref(), Some("hello"));
        assert_eq!(r.body_kind, Some("amqp-value"));
        assert!(!r.body_truncated);
    }

    #[test]
    fn bodies_are_truncated_at_the_limit_and_say_so() {
        let r = row("n1", &tap(), 4, &message("héllo world"));
        assert!(r.body_truncated);
        assert_eq!(r.body_size, "héllo world".len() as i32);
        assert!(r.body_text.as_deref().is_some_and(|t| t.len() <= 4));
    }

    #[test]
    fn an_amqp_value_binary_is_stored_as_its_bytes_like_a_data_section() {
        let bytes = vec![255u8, 254, 0, 128, 1];
        let value = row(
            "n1",
            &tap(),
            1024,
            &with_body(Body::Value(AmqpValue(Value::Binary(Binary::from(bytes.clone()))))),
        );
        assert_eq!(value.body_binary.as_deref(), Some(&bytes[..]));
        assert_eq!(value.body_text, None);
        assert_eq!(value.body_size, 5);
        assert_eq!(value.body_kind, Some("amqp-value"));
        let data = row(
            "n1",
            &tap(),
            3,
            &with_body(Body::Data(vec![Data(Binary::from(bytes.clone()))].into())),
        );
        assert_eq!(data.body_binary.as_deref(), Some(&bytes[..3]));
        assert!(data.body_truncated);
        assert_eq!(data.body_kind, Some("data"));
    }

    #[test]
    fn other_values_and_sequences_are_json_renderings_that_keep_binaries_binary() {
        let mut map = OrderedMap::new();
        map.insert(
            Value::String("k".into()),
            Value::Binary(Binary::from(vec![0u8, 255])),
        );
        map.insert(Value::Long(7), Value::Symbol("s".into()));
        let r = row(
            "n1",
            &tap(),
            1024,
            &with_body(Body::Value(AmqpValue(Value::Map(map)))),
        );
        let rendered: serde_json::Value =
            serde_json::from_str(r.body_text.as_deref().unwrap_or("")).unwrap_or_default();
        assert_eq!(rendered, json!({"k": {"$binary": "00ff"}, "7": "s"}));
        let seq = row(
            "n1",
            &tap(),
            1024,
            &with_body(Body::Sequence(
                vec![
                    AmqpSequence(vec![Value::Int(1), Value::String("two".into())]),
                    AmqpSequence(vec![Value::Array(Array(vec![Value::Bool(true)]))]),
                ]
                .into(),
            )),
        );
        assert_eq!(seq.body_kind, Some("amqp-sequence"));
        assert_eq!(seq.body_text.as_deref(), Some(r#"[[1,"two"],[[true]]]"#));
    }

    #[test]
    fn an_empty_body_is_an_empty_row_of_kind_empty() {
        let r = row("n1", &tap(), 1024, &with_body(Body::Empty));
        assert_eq!(
            (r.body_kind, r.body_text, r.body_binary, r.body_size),
            (Some("empty"), None, None, 0)
        );
    }
}
