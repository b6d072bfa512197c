//! Ownership is in the name (ADR-0062 D7): every broker object of a tap carries the operator's
//! instance ID, the captured address and the subscription, so the reconciler can tell its own
//! objects from anyone else's by name alone, and a name read back from a broker says exactly
//! which tap it belongs to.
//!
//! `artemis-studio.capture.<instance>.<address>.<namespace>/<subscription>` is the capture
//! address and its ring queue (issue 42: the subscription's namespace is in it, so same-named
//! subscriptions of two namespaces on shared brokers never share a ring; taps installed before
//! keep their `<subscription>`-only name, `TapName::legacy`); the divert is the same name with `.divert` appended (queues and diverts share the
//! broker's binding namespace, so they cannot share a name). Each component is escaped so it is
//! one Artemis word: `[A-Za-z0-9_-]` stay, every other byte (the `.` delimiter, the `*` and `#`
//! wildcards, `~` itself, `::` of a FQQN, non-ASCII) becomes `~XX` (hex). Escaping is
//! reversible and injective, so any address maps to a legal, unique name and back.

use crate::api::CAPTURE_PREFIX;

const DIVERT_SUFFIX: &str = "divert";

/// Escape one component into a single Artemis word.
pub fn escape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("~{b:02X}"));
        }
    }
    out
}

/// Reverse [`escape`]; None for anything `escape` cannot have produced.
pub fn unescape(word: &str) -> Option<String> {
    let bytes = word.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'~' {
            let hex = word.get(i + 1..i + 3)?;
            if !hex
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(&c))
            {
                return None;
            }
            let v = u8::from_str_radix(hex, 16).ok()?;
            if v.is_ascii_alphanumeric() || v == b'_' || v == b'-' {
                // escape() never encodes these: not one of our names.
                return None;
            }
            out.push(v);
            i += 3;
        } else if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// One tap: what it captures, for which subscription, owned by which instance.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TapName {
    pub instance: String,
    /// The subscription's namespace (its cluster's), empty in a name made before names carried
    /// it (see [`TapName::legacy`]).
    pub namespace: String,
    /// The captured (source) address.
    pub address: String,
    /// The subscription's name.
    pub subscription: String,
}

impl TapName {
    /// The tap of subscription `namespace/subscription` on `address`: its broker names carry
    /// the subscription's identity, so same-named subscriptions of two namespaces on shared
    /// brokers never share a capture queue (issue 42).
    pub fn new(instance: &str, namespace: &str, address: &str, subscription: &str) -> Self {
        TapName {
            instance: instance.to_string(),
            namespace: namespace.to_string(),
            address: address.to_string(),
            subscription: subscription.to_string(),
        }
    }

    /// A tap as named before its names carried the namespace: kept by the taps installed then
    /// (renaming a live tap would drop what its ring holds), while no same-named subscription
    /// of another namespace shares the brokers.
    pub fn legacy(instance: &str, address: &str, subscription: &str) -> Self {
        Self::new(instance, "", address, subscription)
    }

    pub fn is_legacy(&self) -> bool {
        self.namespace.is_empty()
    }

    /// Every object name of this instance starts with this.
    pub fn instance_prefix(instance: &str) -> String {
        format!("{CAPTURE_PREFIX}{}.", escape(instance))
    }

    /// The subscription's word: `namespace/name` escaped (a `/` is in no Kubernetes name, so
    /// the split back is unambiguous), or the bare name in a legacy name.
    fn subscription_word(&self) -> String {
        if self.is_legacy() {
            escape(&self.subscription)
        } else {
            escape(&format!("{}/{}", self.namespace, self.subscription))
        }
    }

    /// The capture address and its ring queue.
    pub fn capture_queue(&self) -> String {
        format!(
            "{}{}.{}",
            Self::instance_prefix(&self.instance),
            escape(&self.address),
            self.subscription_word()
        )
    }

    /// Where the divert sends its copies: the capture queue by its fully qualified name
    /// (`address::queue`), so a copy goes to this node's capture queue only. Forwarded to the
    /// bare address, the cluster would load-balance copies over the other nodes' capture queues
    /// (their drains make them remote bindings with consumers) through the cluster bridge — a
    /// store-and-forward hop on the producer's send (measured: 0.07× its throughput).
    pub fn forwarding_address(&self) -> String {
        let q = self.capture_queue();
        format!("{q}::{q}")
    }

    /// The divert (also its routing name: unique, so it never shares a routing group with an
    /// application's binding and takes a message away from it).
    pub fn divert(&self) -> String {
        format!("{}.{DIVERT_SUFFIX}", self.capture_queue())
    }

    /// Parse a divert or capture-queue name of `instance`; None for anything else (another
    /// instance's objects, or names that are not ours at all).
    pub fn parse(instance: &str, name: &str) -> Option<(TapName, TapObject)> {
        let rest = name.strip_prefix(&Self::instance_prefix(instance))?;
        let words: Vec<&str> = rest.split('.').collect();
        let (address, subscription, object) = match words.as_slice() {
            [a, s] => (a, s, TapObject::Queue),
            [a, s, d] if *d == DIVERT_SUFFIX => (a, s, TapObject::Divert),
            _ => return None,
        };
        let subscription = unescape(subscription)?;
        let (namespace, subscription) = match subscription.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (String::new(), subscription),
        };
        Some((
            TapName {
                instance: instance.to_string(),
                namespace,
                address: unescape(address)?,
                subscription,
            },
            object,
        ))
    }
}

/// Which object of a tap a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapObject {
    Queue,
    Divert,
}

/// Artemis wildcard matching (the default `wildcard-addresses`: words separated by `.`, `*`
/// one word, `#` zero or more words), for a subscription's queue pattern.
pub fn wildcard_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[&str], n: &[&str]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(&"#"), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(&"*"), Some(_)) => go(&p[1..], &n[1..]),
            (Some(w), Some(x)) if w == x => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let n: Vec<&str> = name.split('.').collect();
    go(&p, &n)
}

/// A pattern with no `*` or `#` word names exactly one queue.
pub fn is_exact(pattern: &str) -> bool {
    pattern.split('.').all(|w| w != "*" && w != "#")
}

/// Prefixes of the broker's own addresses and queues: store-and-forward (`$.artemis.internal.sf.*`),
/// MQTT and other protocol internals (`$sys.*`), management and notifications.
const BROKER_INTERNAL: &[&str] = &[
    "$.artemis.internal.",
    "$sys.",
    "activemq.management",
    "activemq.notifications",
];

/// Never captured nor sampled, whatever the pattern: the broker's internal addresses and queues,
/// and anything under the capture prefix — this installation's taps and every other
/// installation's (all carry `artemis-studio.capture.<instance>.`), so capture never captures a
/// capture queue.
pub fn never_captured(name: &str) -> bool {
    name.starts_with(CAPTURE_PREFIX) || BROKER_INTERNAL.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_and_capture_names_are_never_captured_and_wildcards_are_words() {
        for n in [
            "$.artemis.internal.sf.my-cluster.abc",
            "$sys.mqtt.sessions",
            "activemq.management",
            "activemq.management.abc",
            "activemq.notifications",
            "artemis-studio.capture.other-install.orders.sub",
        ] {
            assert!(never_captured(n), "{n}");
        }
        for n in [
            "orders",
            "DLQ",
            "ExpiryQueue",
            "sys.orders",
            "artemis-studio.orders",
        ] {
            assert!(!never_captured(n), "{n}");
        }
        assert!(is_exact("orders.in") && is_exact("orders*") && !is_exact("orders.#") && !is_exact("*"));
    }

    #[test]
    fn any_address_maps_to_one_word_and_back() {
        for raw in [
            "orders.in",
            "a~b",
            "x::y",
            "#",
            "*.b",
            "ünï",
            "plain-name_1",
            "",
            "~2E",
        ] {
            let e = escape(raw);
            assert!(!e.contains('.') && !e.contains('*') && !e.contains('#') && !e.contains(':'));
            assert_eq!(unescape(&e).as_deref(), Some(raw), "{raw} -> {e}");
        }
        // Distinct inputs never collide.
        assert_ne!(escape("a.b"), escape("a~2Eb"));
    }

    #[test]
    fn names_carry_the_subscriptions_namespace_and_legacy_names_parse_as_such() {
        let a = TapName::new("prod", "team-a", "orders.in", "audit");
        let b = TapName::new("prod", "team-b", "orders.in", "audit");
        assert_eq!(
            a.capture_queue(),
            "artemis-studio.capture.prod.orders~2Ein.team-a~2Faudit"
        );
        assert_ne!(a.capture_queue(), b.capture_queue());
        assert_ne!(a.divert(), b.divert());
        assert_eq!(
            TapName::parse("prod", &b.divert()),
            Some((b.clone(), TapObject::Divert))
        );
        let old = TapName::legacy("prod", "orders.in", "audit");
        assert_eq!(
            old.capture_queue(),
            "artemis-studio.capture.prod.orders~2Ein.audit"
        );
        let (parsed, _) = TapName::parse("prod", &old.capture_queue()).expect("a legacy name parses");
        assert!(parsed.is_legacy() && parsed == old);
        assert_ne!(old, a);
    }

    #[test]
    fn names_parse_back_and_other_instances_are_not_ours() {
        let t = TapName::new("prod", "ns", "orders.in", "audit");
        assert_eq!(
            t.capture_queue(),
            "artemis-studio.capture.prod.orders~2Ein.ns~2Faudit"
        );
        assert_eq!(
            TapName::parse("prod", &t.divert()),
            Some((t.clone(), TapObject::Divert))
        );
        assert_eq!(
            TapName::parse("prod", &t.capture_queue()),
            Some((t.clone(), TapObject::Queue))
        );
        assert_eq!(TapName::parse("staging", &t.divert()), None);
        assert_eq!(TapName::parse("prod", "orders.in"), None);
        assert_eq!(
            TapName::parse("prod", "artemis-studio.capture.prod.a.b.c.d"),
            None
        );
        // An instance whose ID is a prefix of ours is another instance.
        let other = TapName::new("prod-2", "ns", "orders.in", "audit");
        assert_eq!(TapName::parse("prod", &other.divert()), None);
    }

    /// The divert forwards to the capture queue by its fully qualified name (`address::queue`),
    /// so a copy lands in this node's capture queue only, never load-balanced over the cluster
    /// bridge to another node's.
    #[test]
    fn the_divert_forwards_to_the_capture_queue_by_its_fully_qualified_name() {
        let t = TapName::new("prod", "ns", "orders.in", "audit");
        assert_eq!(
            t.forwarding_address(),
            "artemis-studio.capture.prod.orders~2Ein.ns~2Faudit::artemis-studio.capture.prod.orders~2Ein.ns~2Faudit"
        );
    }

    /// `#` stands for words, not for the rest of the name: the words after it must still
    /// match, so a subscription to `orders.#.eu` never captures `orders.in.us`.
    #[test]
    fn the_words_after_a_hash_must_still_match() {
        assert!(!wildcard_matches("orders.#.eu", "orders.in.us"));
        assert!(!wildcard_matches("a.#.z", "a.b.c"));
        assert!(!wildcard_matches("a.#.z", "a"));
        assert!(wildcard_matches("orders.#.eu", "orders.in.eu"));
    }

    /// Ownership is in the name (ADR-0062 D7): a name of our instance's prefix with a third
    /// word other than `divert` is not one of our objects, so no pass counts it as a tap's.
    #[test]
    fn a_name_with_another_third_word_is_not_ours() {
        let t = TapName::new("prod", "ns", "orders.in", "audit");
        assert_eq!(
            TapName::parse("prod", &format!("{}.backup", t.capture_queue())),
            None
        );
        assert_eq!(TapName::parse("prod", &t.divert()), Some((t, TapObject::Divert)));
    }

    #[test]
    fn artemis_wildcards() {
        assert!(wildcard_matches("orders.#", "orders"));
        assert!(wildcard_matches("orders.#", "orders.in.eu"));
        assert!(wildcard_matches("orders.*", "orders.in"));
        assert!(!wildcard_matches("orders.*", "orders.in.eu"));
        assert!(!wildcard_matches("orders.*", "orders"));
        assert!(wildcard_matches("#", "anything.at.all"));
        assert!(wildcard_matches("*.in", "orders.in"));
        assert!(wildcard_matches("orders.in", "orders.in"));
        assert!(!wildcard_matches("orders.in", "orders.out"));
        assert!(wildcard_matches("a.#.z", "a.z"));
        assert!(wildcard_matches("a.#.z", "a.b.c.z"));
    }

    /// Escaping is injective (ADR-0062 D7: a name read back says exactly which tap it is): only
    /// what `escape` produces unescapes, so `~41` is never read as `A`, nor a lowercase or
    /// short escape as a byte, and a name carrying one is not ours.
    #[test]
    fn only_what_escape_produces_unescapes() {
        for word in [
            "~41", "~7A", "~30", "~5F", "~2D", "~2e", "~2", "~", "~ZZ", "a.b", "a*b", "a:b",
        ] {
            assert_eq!(unescape(word), None, "{word}");
        }
        assert_eq!(unescape("orders~2Ein~3A~3Ax").as_deref(), Some("orders.in::x"));
        assert_eq!(unescape("a_b-C9").as_deref(), Some("a_b-C9"));
        assert_eq!(
            TapName::parse("prod", "artemis-studio.capture.prod.~6Frders.ns~2Faudit"),
            None,
            "another spelling of orders is not one of our names"
        );
    }
}
