//! What Postgres cannot take as it is (issue 25): U+0000 in a TEXT column or anywhere in JSONB
//! (SQLSTATE 22021 / 22P05), an identifier too long for its b-tree index (54000), a property
//! string too large to index well. Such a row is made storable by escaping the parts at fault,
//! or by keeping a text body as its bytes, and every change is named in the row's `escaped`
//! (ADR-0062 D10: a row claims what it can, and says what it does not hold as received).

use std::borrow::Cow;

use serde_json::Value;

use chrono::{DateTime, Utc};

/// One captured copy, ready to store.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CapturedRow {
    pub node: String,
    pub original_address: String,
    pub capture_queue: String,
    pub source_message_id: Option<String>,
    pub message_id: Option<String>,
    pub correlation_id: Option<String>,
    pub reply_to: Option<String>,
    pub properties: serde_json::Value,
    pub headers: serde_json::Value,
    pub body_text: Option<String>,
    pub body_binary: Option<Vec<u8>>,
    pub body_size: i32,
    pub body_truncated: bool,
    pub routed_at: Option<DateTime<Utc>>,
    /// The body section: `data`, `amqp-value`, `amqp-sequence` or `empty` (None: sampled).
    pub body_kind: Option<&'static str>,
    /// What was changed so that Postgres could take the copy (see `store::storable`); empty
    /// when it is stored as received.
    pub escaped: Vec<String>,
}

/// Identifiers (source, message and correlation IDs, reply-to) are indexed: a b-tree entry
/// holds at most ~2.7 kB, so longer ones are cut here.
pub const ID_MAX: usize = 1024;

/// A property or annotation string longer than this is cut.
pub const JSON_STRING_MAX: usize = 64 * 1024;

/// The marker a salvaged row carries first in `escaped`.
const SALVAGED: &str = "row: refused by Postgres as it was";

fn at_fault(s: &str, max: usize) -> bool {
    s.len() > max || s.contains('\0')
}

fn json_at_fault(v: &Value) -> bool {
    match v {
        Value::String(s) => at_fault(s, JSON_STRING_MAX),
        Value::Array(a) => a.iter().any(json_at_fault),
        Value::Object(o) => o
            .iter()
            .any(|(k, v)| at_fault(k, JSON_STRING_MAX) || json_at_fault(v)),
        _ => false,
    }
}

fn ids(row: &CapturedRow) -> [(&'static str, &Option<String>); 4] {
    [
        ("source_message_id", &row.source_message_id),
        ("message_id", &row.message_id),
        ("correlation_id", &row.correlation_id),
        ("reply_to", &row.reply_to),
    ]
}

fn row_at_fault(row: &CapturedRow) -> bool {
    row.body_text.as_deref().is_some_and(|t| t.contains('\0'))
        || ids(row)
            .iter()
            .any(|(_, v)| v.as_deref().is_some_and(|s| at_fault(s, ID_MAX)))
        || json_at_fault(&row.properties)
        || json_at_fault(&row.headers)
}

/// Unambiguous and reversible within a flagged part: `\` is written `\\`, U+0000 `\u0000`.
pub fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\0', "\\u0000")
}

/// Cut `s` to at most `max` bytes, at a character boundary.
pub fn truncate_at_char_boundary(s: &mut String, max: usize) {
    let mut at = max.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
}

/// `s` as Postgres takes it, the change (if any) noted under `path`.
fn fix_text(s: &str, max: usize, path: &str, notes: &mut Vec<String>) -> String {
    let mut out = if s.contains('\0') {
        notes.push(format!("{path}: U+0000 written as \\u0000 and \\ as \\\\"));
        escape(s)
    } else {
        s.to_string()
    };
    if out.len() > max {
        notes.push(format!("{path}: {} bytes cut to {max}", out.len()));
        truncate_at_char_boundary(&mut out, max);
    }
    out
}

fn fix_json(v: &Value, path: &str, notes: &mut Vec<String>) -> Value {
    match v {
        Value::String(s) if at_fault(s, JSON_STRING_MAX) => {
            Value::String(fix_text(s, JSON_STRING_MAX, path, notes))
        }
        Value::Array(a) => Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, v)| fix_json(v, &format!("{path}[{i}]"), notes))
                .collect(),
        ),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    let key = if at_fault(k, JSON_STRING_MAX) {
                        fix_text(k, JSON_STRING_MAX, &format!("{path} key {}", escape(k)), notes)
                    } else {
                        k.clone()
                    };
                    let value = fix_json(v, &format!("{path}.{key}"), notes);
                    (key, value)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The row as Postgres takes it: unchanged (borrowed) when nothing is at fault, else with the
/// parts at fault escaped, cut or kept as bytes, each change named in `escaped`.
pub fn storable(row: &CapturedRow) -> Cow<'_, CapturedRow> {
    if !row_at_fault(row) {
        return Cow::Borrowed(row);
    }
    let mut r = row.clone();
    let mut notes = vec![];
    if let Some(text) = r.body_text.take_if(|t| t.contains('\0')) {
        // Kept exactly: the text's UTF-8 bytes, in the column that takes any byte.
        notes.push("body: text containing U+0000 stored as its UTF-8 bytes in body_binary".into());
        r.body_binary = Some(text.into_bytes());
    }
    for (name, field) in [
        ("source_message_id", &mut r.source_message_id),
        ("message_id", &mut r.message_id),
        ("correlation_id", &mut r.correlation_id),
        ("reply_to", &mut r.reply_to),
    ] {
        if let Some(s) = field.take() {
            *field = Some(fix_text(&s, ID_MAX, name, &mut notes));
        }
    }
    r.properties = fix_json(&row.properties, "properties", &mut notes);
    r.headers = fix_json(&row.headers, "headers", &mut notes);
    r.escaped.extend(notes);
    Cow::Owned(r)
}

/// The last resort for a row Postgres refused alone, for a data reason the escapes did not
/// foresee (`sqlstate`): a text body kept as its bytes (out of the text index), properties and
/// headers not stored. None when the row was salvaged already: it cannot be stored.
pub fn salvage(row: &CapturedRow, sqlstate: &str) -> Option<CapturedRow> {
    if row.escaped.first().is_some_and(|n| n.starts_with(SALVAGED)) {
        return None;
    }
    let mut r = row.clone();
    let mut notes = vec![format!(
        "{SALVAGED} (SQLSTATE {sqlstate}): stored without its properties and headers"
    )];
    if let Some(text) = r.body_text.take() {
        notes.push("body: text stored as its UTF-8 bytes in body_binary".into());
        r.body_binary = Some(text.into_bytes());
    }
    r.properties = Value::Object(Default::default());
    r.headers = Value::Object(Default::default());
    notes.append(&mut r.escaped);
    r.escaped = notes;
    Some(r)
}

/// A body cut to `max` bytes: text at a character boundary, binary at the byte.
pub fn cut_body(
    text: Option<String>,
    binary: Option<Vec<u8>>,
    max: usize,
) -> (Option<String>, Option<Vec<u8>>) {
    let text = text.map(|mut t| {
        truncate_at_char_boundary(&mut t, max);
        t
    });
    let binary = binary.map(|mut b| {
        b.truncate(max);
        b
    });
    (text, binary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row() -> CapturedRow {
        CapturedRow {
            node: "n1".into(),
            properties: json!({"region": "eu"}),
            headers: json!({}),
            body_text: Some("hello".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_row_postgres_takes_is_not_touched() {
        let r = row();
        assert!(matches!(storable(&r), Cow::Borrowed(_)));
    }

    #[test]
    fn a_text_body_with_a_nul_is_kept_exactly_as_bytes_and_flagged() {
        let mut r = row();
        r.body_text = Some("a\0b".into());
        let s = storable(&r);
        assert_eq!(s.body_text, None);
        assert_eq!(s.body_binary.as_deref(), Some(&b"a\0b"[..]));
        assert_eq!(s.escaped.len(), 1, "{:?}", s.escaped);
        assert!(s.escaped[0].starts_with("body:"));
    }

    #[test]
    fn a_nul_in_a_property_key_or_value_or_an_id_is_escaped_reversibly_and_named() {
        let mut r = row();
        r.properties = json!({"note": "x\0y\\z", "k\0": 1, "list": ["ok", "\0"]});
        r.correlation_id = Some("c\0".into());
        let s = storable(&r);
        assert_eq!(s.properties["note"], "x\\u0000y\\\\z");
        assert_eq!(s.properties["k\\u0000"], 1);
        assert_eq!(s.properties["list"][1], "\\u0000");
        assert_eq!(s.correlation_id.as_deref(), Some("c\\u0000"));
        assert!(!json_at_fault(&s.properties), "no NUL left for jsonb");
        for part in [
            "properties.note",
            "properties key k\\u0000",
            "properties.list[1]",
            "correlation_id",
        ] {
            assert!(
                s.escaped.iter().any(|n| n.starts_with(part)),
                "{part}: {:?}",
                s.escaped
            );
        }
        assert_eq!(s.body_text.as_deref(), Some("hello"), "the body was fine");
    }

    #[test]
    fn oversize_identifiers_and_property_strings_are_cut_and_say_so() {
        let mut r = row();
        r.message_id = Some("é".repeat(ID_MAX));
        r.properties = json!({"big": "x".repeat(JSON_STRING_MAX + 1)});
        let s = storable(&r);
        assert!(s.message_id.as_deref().is_some_and(|m| m.len() <= ID_MAX));
        assert_eq!(s.properties["big"].as_str().map(str::len), Some(JSON_STRING_MAX));
        assert_eq!(s.escaped.len(), 2, "{:?}", s.escaped);
    }

    #[test]
    fn a_salvage_keeps_the_body_as_bytes_and_happens_once() {
        let r = row();
        let s = salvage(&r, "54000").expect("first salvage");
        assert_eq!(s.body_binary.as_deref(), Some(&b"hello"[..]));
        assert_eq!(s.properties, json!({}));
        assert!(s.escaped[0].contains("54000"));
        assert!(
            salvage(&s, "54000").is_none(),
            "a salvaged row refused again cannot be stored"
        );
    }
}
