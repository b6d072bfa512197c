//! The capture pass's judgement, as pure functions of (subscriptions, a node's inventory, the
//! node's effective settings): which addresses a subscription captures, what a tap lacks on a
//! node, which of our objects are orphans, and the refusals of ADR-0062 D8. No I/O here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::api::capture_names::{TapName, TapObject, never_captured, wildcard_matches};
use crate::api::{CAPTURE_PREFIX, RefusalKind};
use crate::broker::management::{EffectiveSettings, SecurityRoles};
use crate::topology::inventory::NodeInventory;

/// What the pass needs of one subscription.
#[derive(Clone, Debug, PartialEq)]
pub struct Subscription {
    pub name: String,
    pub pattern: String,
    pub filter: Option<String>,
    pub ring_size: i64,
    pub expiry_delay_ms: i64,
    pub max_buffer_bytes: i64,
    /// Being deleted: none of its taps is desired any more.
    pub deleting: bool,
    /// Armed (see `arming`): its pattern's addresses are tapped, up to `max_taps`. Not armed:
    /// only the taps it has already (`installed`), while its pattern still matches them.
    pub armed: bool,
    pub max_taps: u32,
    /// The source addresses it has a tap on now (an open install record).
    pub installed: BTreeSet<String>,
}

/// A tap as the broker should hold it on every live node.
#[derive(Clone, Debug, PartialEq)]
pub struct TapSpec {
    pub name: TapName,
    pub filter: Option<String>,
    pub ring_size: i64,
    pub expiry_delay_ms: i64,
    pub max_buffer_bytes: i64,
    /// The only role that may consume or browse the capture queue.
    pub role: String,
}

/// The addresses a pattern captures: those of the queues it matches, on any node; and second,
/// those it matches that are never captured (`capture_names::never_captured`: broker-internal, or
/// under the capture prefix — capture never captures itself nor another installation's taps).
pub fn matched_addresses<'a>(
    pattern: &str,
    inventories: impl IntoIterator<Item = &'a NodeInventory>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut out, mut never) = (BTreeSet::new(), BTreeSet::new());
    for inv in inventories {
        for q in inv.queues.values() {
            if q.temporary || !wildcard_matches(pattern, &q.name) {
                continue;
            }
            if never_captured(&q.name) || never_captured(&q.address) {
                never.insert(q.address.clone());
            } else {
                out.insert(q.address.clone());
            }
        }
    }
    (out, never)
}

/// The addresses a subscription captures (see [`matched_addresses`]).
pub fn captured_addresses<'a>(
    pattern: &str,
    inventories: impl IntoIterator<Item = &'a NodeInventory>,
) -> BTreeSet<String> {
    matched_addresses(pattern, inventories).0
}

/// How one cluster's taps are named: with the subscription's namespace, except a tap installed
/// before names carried it, which keeps its name (`TapName::legacy`).
pub struct Naming<'a> {
    pub instance: &'a str,
    pub namespace: &'a str,
    /// (subscription, address) of the taps that keep their legacy name.
    pub legacy: &'a BTreeSet<(String, String)>,
}

impl Naming<'_> {
    pub fn tap(&self, address: &str, subscription: &str) -> TapName {
        if self
            .legacy
            .contains(&(subscription.to_string(), address.to_string()))
        {
            TapName::legacy(self.instance, address, subscription)
        } else {
            TapName::new(self.instance, self.namespace, address, subscription)
        }
    }
}

/// The desired taps: every live subscription × the addresses it taps (`arming::chosen`); second,
/// per subscription, the addresses refused past its cap.
pub fn desired_taps<'a>(
    naming: &Naming<'_>,
    role: &str,
    subscriptions: &[Subscription],
    inventories: impl IntoIterator<Item = &'a NodeInventory> + Clone,
) -> (BTreeMap<TapName, TapSpec>, BTreeMap<String, Vec<String>>) {
    let mut out = BTreeMap::new();
    let mut past_cap = BTreeMap::new();
    for s in subscriptions.iter().filter(|s| !s.deleting) {
        let matched = captured_addresses(&s.pattern, inventories.clone());
        let (chosen, refused) = super::arming::chosen(s.armed, s.max_taps, &matched, &s.installed);
        if !refused.is_empty() {
            past_cap.insert(s.name.clone(), refused);
        }
        for address in chosen {
            let name = naming.tap(&address, &s.name);
            out.insert(
                name.clone(),
                TapSpec {
                    name,
                    filter: s.filter.clone(),
                    ring_size: s.ring_size,
                    expiry_delay_ms: s.expiry_delay_ms,
                    max_buffer_bytes: s.max_buffer_bytes,
                    role: role.to_string(),
                },
            );
        }
    }
    (out, past_cap)
}

/// The page size the broker wants below max-size-bytes ("pageSize has to be lower than
/// maxSizeBytes"); nothing is ever paged with DROP, but the broker checks it.
fn page_size(max: i64) -> i64 {
    (max / 4).clamp(4096, 10 * 1024 * 1024)
}

impl TapSpec {
    /// ADR-0066 D1: the capture address auto-creates (so a divert whose queue is momentarily
    /// gone, after a failover, never makes a producer's send fail) and auto-deletes; queues are
    /// never auto-created there (an ordinary queue would not be a ring). DROP at a max size and
    /// an expiry delay bound an abandoned tap in size and age. No expiry or dead-letter address:
    /// a captured copy must never land on a queue other clients may read.
    pub fn address_settings(&self) -> Value {
        json!({
            "addressFullMessagePolicy": "DROP",
            "maxSizeBytes": self.max_buffer_bytes,
            "pageSizeBytes": page_size(self.max_buffer_bytes),
            "autoCreateAddresses": true,
            "autoDeleteAddresses": true,
            "autoCreateQueues": false,
            "autoDeleteQueues": false,
            "expiryDelay": self.expiry_delay_ms,
            "expiryAddress": "",
            "deadLetterAddress": "",
            "autoCreateExpiryResources": false,
            "autoCreateDeadLetterResources": false,
        })
    }

    /// ADR-0062 D8: only the operator's role may consume or browse the capture queue (it is a
    /// complete second copy of production payload); nobody may send to it.
    pub fn security_roles(&self) -> SecurityRoles {
        let r = self.role.clone();
        SecurityRoles {
            send: String::new(),
            consume: r.clone(),
            create_durable_queue: String::new(),
            delete_durable_queue: String::new(),
            create_non_durable_queue: r.clone(),
            delete_non_durable_queue: r.clone(),
            manage: r.clone(),
            browse: r.clone(),
            create_address: r.clone(),
            delete_address: r.clone(),
            view: r.clone(),
            edit: r,
        }
    }

    /// ADR-0066 D3: a non-durable ring queue (the disposable buffer; never journalled).
    pub fn queue_document(&self) -> Value {
        let q = self.name.capture_queue();
        json!({
            "name": q,
            "address": q,
            "routing-type": "ANYCAST",
            "durable": false,
            "ring-size": self.ring_size,
            "auto-create-address": true,
            "auto-delete": false,
            "purge-on-no-consumers": false,
            "max-consumers": -1,
        })
    }

    /// ADR-0062 D1: a non-exclusive divert (the application's routing is untouched), with a
    /// routing name of its own (never in an application binding's routing group).
    pub fn divert_document(&self) -> Value {
        let d = self.name.divert();
        json!({
            "name": d,
            "routing-name": d,
            "address": self.name.address,
            "forwarding-address": self.name.forwarding_address(),
            "exclusive": false,
            "filter-string": self.filter,
            "routing-type": "ANYCAST",
        })
    }
}

/// One object of a tap to write on a node, in install order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// First: the capture queue never exists unrestricted.
    SecuritySetting,
    AddressSettings,
    Queue,
    /// The queue exists with another ring size.
    QueueRingSize,
    /// Last: nothing is routed before the queue and its settings are in place.
    Divert,
    /// The divert exists with another filter or forwarding address.
    DivertUpdate,
}

impl Part {
    pub fn describe(self) -> &'static str {
        match self {
            Part::SecuritySetting => "security setting",
            Part::AddressSettings => "address settings",
            Part::Queue => "ring queue",
            Part::QueueRingSize => "ring size",
            Part::Divert => "divert",
            Part::DivertUpdate => "divert configuration",
        }
    }
}

/// What a desired tap is on one node.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The source address does not exist on this node.
    AddressAbsent,
    /// ADR-0062 D8: installing would capture nothing, or capture unsafely.
    Refused { kind: RefusalKind, message: String },
    /// These objects are missing or differ (settings are only judged when read).
    Missing(Vec<Part>),
    /// Every object checked is in place.
    Installed { drained: bool },
}

/// Judge one tap on one node. Without `settings` only the queue and the divert (which the
/// inventory holds) are judged; a node that is not drained is judged again with fresh settings
/// reads, the whole install (ADR-0066 D2).
pub fn assess(
    tap: &TapSpec,
    inv: &NodeInventory,
    settings: Option<&EffectiveSettings>,
    drained: bool,
) -> Verdict {
    let address = &tap.name.address;
    if !inv.addresses.contains_key(address) {
        return Verdict::AddressAbsent;
    }
    let exclusive: Vec<&str> = inv
        .diverts
        .values()
        .filter(|d| d.address == *address && d.exclusive && !d.name.starts_with(CAPTURE_PREFIX))
        .map(|d| d.name.as_str())
        .collect();
    if !exclusive.is_empty() {
        return Verdict::Refused {
            kind: RefusalKind::ExclusiveDivertPresent,
            message: format!(
                "exclusive divert {} on {address}: the broker evaluates exclusive diverts first, so a capture tap here would record nothing (ADR-0062 D8). Nothing was installed on this node; make that divert non-exclusive or remove it",
                exclusive.join(", ")
            ),
        };
    }
    let mut parts = vec![];
    let queue_name = tap.name.capture_queue();
    let queue = inv.queues.get(&queue_name);
    match queue {
        None => parts.push(Part::Queue),
        Some(q) if q.ring_size != tap.ring_size => parts.push(Part::QueueRingSize),
        Some(_) => {}
    }
    match inv.diverts.get(&tap.name.divert()) {
        None => parts.push(Part::Divert),
        Some(d) => {
            let filter = d.filter.as_deref().filter(|f| !f.is_empty());
            // A divert to the bare address (an older install) is updated to the FQQN.
            if d.forwarding_address != tap.name.forwarding_address()
                || filter != tap.filter.as_deref().filter(|f| !f.is_empty())
                || d.exclusive
            {
                parts.push(Part::DivertUpdate);
            }
        }
    }
    if let Some(s) = settings {
        if !address_settings_match(tap, &s.address_settings) {
            parts.push(Part::AddressSettings);
        }
        if !roles_restrict(&tap.role, &s.roles) {
            parts.push(Part::SecuritySetting);
        }
    }
    parts.sort();
    if parts.is_empty() {
        Verdict::Installed {
            drained: drained && queue.is_some(),
        }
    } else {
        Verdict::Missing(parts)
    }
}

fn address_settings_match(tap: &TapSpec, s: &Value) -> bool {
    let want = tap.address_settings();
    let empty_or_absent = |k: &str| s.get(k).and_then(Value::as_str).is_none_or(str::is_empty);
    [
        "addressFullMessagePolicy",
        "maxSizeBytes",
        "autoCreateAddresses",
        "autoDeleteAddresses",
        "autoCreateQueues",
        "autoDeleteQueues",
        "expiryDelay",
    ]
    .iter()
    .all(|k| s.get(*k) == want.get(*k))
        && empty_or_absent("expiryAddress")
        && empty_or_absent("deadLetterAddress")
}

/// The effective roles let `role` consume and browse, and nobody else consume, browse or send.
fn roles_restrict(role: &str, roles: &Value) -> bool {
    let Some(list) = roles.as_array() else {
        return false;
    };
    let flag = |r: &Value, k: &str| r.get(k).and_then(Value::as_bool).unwrap_or(false);
    let ours = list.iter().any(|r| {
        r.get("name").and_then(Value::as_str) == Some(role) && flag(r, "consume") && flag(r, "browse")
    });
    let others_excluded = list.iter().all(|r| {
        let name = r.get("name").and_then(Value::as_str);
        !flag(r, "send") && (name == Some(role) || (!flag(r, "consume") && !flag(r, "browse")))
    });
    ours && others_excluded
}

/// Our objects on a node (this instance's prefix only, ADR-0062 D7): per tap, which of the queue
/// and the divert exist. Another instance's objects never appear here.
pub fn our_objects(instance: &str, inv: &NodeInventory) -> BTreeMap<TapName, (bool, bool)> {
    let mut out: BTreeMap<TapName, (bool, bool)> = BTreeMap::new();
    let names = inv.queues.keys().chain(inv.diverts.keys());
    for n in names {
        if let Some((tap, object)) = TapName::parse(instance, n) {
            let e = out.entry(tap).or_default();
            match object {
                TapObject::Queue => e.0 = true,
                TapObject::Divert => e.1 = true,
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::inventory::{AddressInfo, DivertInfo, QueueInfo};

    fn spec(address: &str) -> TapSpec {
        TapSpec {
            name: TapName::new("i1", "ns", address, "sub"),
            filter: None,
            ring_size: 100,
            expiry_delay_ms: 60_000,
            max_buffer_bytes: 64 << 20,
            role: "amq".into(),
        }
    }

    fn naming() -> Naming<'static> {
        static NONE: std::sync::OnceLock<BTreeSet<(String, String)>> = std::sync::OnceLock::new();
        Naming {
            instance: "i1",
            namespace: "ns",
            legacy: NONE.get_or_init(BTreeSet::new),
        }
    }

    /// A subscription `sub` over `orders.#`.
    fn orders_sub(armed: bool, max_taps: u32, installed: BTreeSet<String>) -> Subscription {
        Subscription {
            name: "sub".into(),
            pattern: "orders.#".into(),
            filter: None,
            ring_size: 1,
            expiry_delay_ms: 1,
            max_buffer_bytes: 1 << 20,
            deleting: false,
            armed,
            max_taps,
            installed,
        }
    }

    fn inv_with(address: &str) -> NodeInventory {
        let mut inv = NodeInventory::default();
        inv.addresses.insert(
            address.into(),
            AddressInfo {
                name: address.into(),
                ..Default::default()
            },
        );
        inv.queues.insert(
            address.into(),
            QueueInfo {
                name: address.into(),
                address: address.into(),
                ..Default::default()
            },
        );
        inv
    }

    fn installed(inv: &mut NodeInventory, tap: &TapSpec, consumers: u64) {
        let q = tap.name.capture_queue();
        inv.queues.insert(
            q.clone(),
            QueueInfo {
                name: q.clone(),
                address: q.clone(),
                ring_size: tap.ring_size,
                consumer_count: consumers,
                ..Default::default()
            },
        );
        inv.diverts.insert(
            tap.name.divert(),
            DivertInfo {
                name: tap.name.divert(),
                address: tap.name.address.clone(),
                forwarding_address: tap.name.forwarding_address(),
                ..Default::default()
            },
        );
    }

    fn good_settings(tap: &TapSpec) -> EffectiveSettings {
        let mut a = tap.address_settings();
        a["expiryAddress"] = json!(null);
        EffectiveSettings {
            address_settings: a,
            roles: json!([{"name": "amq", "consume": true, "browse": true, "send": false}]),
        }
    }

    #[test]
    fn addresses_come_from_matching_queues_never_from_capture_queues() {
        let mut inv = inv_with("orders.in");
        inv.queues.insert(
            "orders.audit".into(),
            QueueInfo {
                name: "orders.audit".into(),
                address: "orders.all".into(),
                ..Default::default()
            },
        );
        installed(&mut inv, &spec("orders.in"), 0);
        let got = captured_addresses("orders.#", [&inv]);
        assert_eq!(
            got,
            BTreeSet::from(["orders.in".to_string(), "orders.all".to_string()])
        );
        assert!(
            captured_addresses("#", [&inv])
                .iter()
                .all(|a| !a.starts_with(CAPTURE_PREFIX))
        );
    }

    /// A subscription captures the addresses of the queues its pattern matches, and only
    /// those: never the address of a queue it does not match, nor of a temporary queue (a
    /// client's own, gone with its connection) even when it matches.
    #[test]
    fn only_non_temporary_queues_the_pattern_matches_are_captured() {
        let mut inv = inv_with("orders.in");
        for (q, a, temporary) in [
            ("invoices.in", "invoices", false),
            ("orders.reply", "orders.replies", true),
        ] {
            inv.queues.insert(
                q.into(),
                QueueInfo {
                    name: q.into(),
                    address: a.into(),
                    temporary,
                    ..Default::default()
                },
            );
        }
        let (tapped, never) = matched_addresses("orders.#", [&inv]);
        assert_eq!(tapped, BTreeSet::from(["orders.in".to_string()]));
        assert!(never.is_empty(), "{never:?}");
    }

    /// ADR-0066 D3: the ring is a non-durable ANYCAST queue on its own capture address, of
    /// the subscription's ring size, never purged or auto-deleted under the drain.
    #[test]
    fn the_capture_queue_is_a_non_durable_ring_on_its_own_address() {
        let tap = spec("orders.in");
        let q = tap.name.capture_queue();
        assert_eq!(
            tap.queue_document(),
            json!({
                "name": q,
                "address": q,
                "routing-type": "ANYCAST",
                "durable": false,
                "ring-size": 100,
                "auto-create-address": true,
                "auto-delete": false,
                "purge-on-no-consumers": false,
                "max-consumers": -1,
            })
        );
    }

    /// ADR-0062 D1: the tap's divert is non-exclusive (the application's routing is
    /// untouched), has a routing name of its own, sends its copies to this node's capture queue
    /// by its fully qualified name, and carries the subscription's filter.
    #[test]
    fn the_tap_divert_is_non_exclusive_with_its_own_routing_name_into_the_capture_queue() {
        let tap = TapSpec {
            filter: Some("region = 'eu'".into()),
            ..spec("orders.in")
        };
        let d = tap.name.divert();
        assert_eq!(
            tap.divert_document(),
            json!({
                "name": d,
                "routing-name": d,
                "address": "orders.in",
                "forwarding-address": tap.name.forwarding_address(),
                "exclusive": false,
                "filter-string": "region = 'eu'",
                "routing-type": "ANYCAST",
            })
        );
    }

    /// What a node's status and the audit row say was written or failed: each part by name,
    /// in install order.
    #[test]
    fn each_part_is_named_in_install_order() {
        let parts = [
            Part::SecuritySetting,
            Part::AddressSettings,
            Part::Queue,
            Part::QueueRingSize,
            Part::Divert,
            Part::DivertUpdate,
        ];
        let mut sorted = parts;
        sorted.sort();
        assert_eq!(sorted, parts);
        assert_eq!(
            parts.map(Part::describe),
            [
                "security setting",
                "address settings",
                "ring queue",
                "ring size",
                "divert",
                "divert configuration"
            ]
        );
    }

    /// ADR-0062 D8 refuses a tap only for an exclusive divert of someone else on the address:
    /// an application's ordinary divert there, or one elsewhere, leaves the tap to install.
    #[test]
    fn only_an_exclusive_divert_on_the_address_refuses_the_tap() {
        let tap = spec("orders.in");
        let mut inv = inv_with("orders.in");
        installed(&mut inv, &tap, 1);
        for (name, address, exclusive) in [
            ("app-divert", "orders.in", false),
            ("elsewhere", "invoices", true),
        ] {
            inv.diverts.insert(
                name.into(),
                DivertInfo {
                    name: name.into(),
                    address: address.into(),
                    exclusive,
                    ..Default::default()
                },
            );
        }
        assert_eq!(
            assess(&tap, &inv, None, true),
            Verdict::Installed { drained: true }
        );
    }

    /// A divert's filter read back as "" is no filter, and one read back as the subscription's
    /// is the subscription's: the tap is installed, not updated again at every pass.
    #[test]
    fn a_divert_filter_read_back_unchanged_is_no_update() {
        for (read_back, wanted) in [
            (Some(""), None),
            (None, Some("")),
            (Some("region = 'eu'"), Some("region = 'eu'")),
        ] {
            let tap = TapSpec {
                filter: wanted.map(String::from),
                ..spec("orders.in")
            };
            let mut inv = inv_with("orders.in");
            installed(&mut inv, &tap, 1);
            if let Some(d) = inv.diverts.get_mut(&tap.name.divert()) {
                d.filter = read_back.map(String::from);
            }
            assert_eq!(
                assess(&tap, &inv, None, true),
                Verdict::Installed { drained: true },
                "read back {read_back:?}, wanted {wanted:?}"
            );
        }
    }

    #[test]
    fn a_fresh_node_lacks_every_part_in_install_order() {
        let tap = spec("orders.in");
        let inv = inv_with("orders.in");
        let s = EffectiveSettings {
            address_settings: json!({"addressFullMessagePolicy": "PAGE"}),
            roles: json!([{"name": "amq", "consume": true, "browse": true, "send": true}]),
        };
        assert_eq!(
            assess(&tap, &inv, Some(&s), false),
            Verdict::Missing(vec![
                Part::SecuritySetting,
                Part::AddressSettings,
                Part::Queue,
                Part::Divert
            ])
        );
    }

    #[test]
    fn an_installed_tap_is_healthy_only_when_drained() {
        let tap = spec("orders.in");
        let mut inv = inv_with("orders.in");
        installed(&mut inv, &tap, 0);
        assert_eq!(
            assess(&tap, &inv, Some(&good_settings(&tap)), false),
            Verdict::Installed { drained: false }
        );
        installed(&mut inv, &tap, 1);
        assert_eq!(
            assess(&tap, &inv, None, true),
            Verdict::Installed { drained: true }
        );
    }

    #[test]
    fn a_promoted_backup_with_the_divert_but_no_queue_gets_the_queue() {
        // ADR-0066: the divert replicates, the non-durable queue does not.
        let tap = spec("orders.in");
        let mut inv = inv_with("orders.in");
        installed(&mut inv, &tap, 1);
        inv.queues.remove(&tap.name.capture_queue());
        assert_eq!(
            assess(&tap, &inv, Some(&good_settings(&tap)), false),
            Verdict::Missing(vec![Part::Queue])
        );
    }

    #[test]
    fn an_exclusive_divert_refuses_and_another_role_consuming_is_not_restricted() {
        let tap = spec("orders.in");
        let mut inv = inv_with("orders.in");
        inv.diverts.insert(
            "app-divert".into(),
            DivertInfo {
                name: "app-divert".into(),
                address: "orders.in".into(),
                exclusive: true,
                ..Default::default()
            },
        );
        assert!(matches!(
            assess(&tap, &inv, None, true),
            Verdict::Refused {
                kind: RefusalKind::ExclusiveDivertPresent,
                ..
            }
        ));
        assert!(!roles_restrict(
            "amq",
            &json!([{"name": "amq", "consume": true, "browse": true}, {"name": "app", "consume": true}])
        ));
        assert!(roles_restrict(
            "amq",
            &json!([{"name": "amq", "consume": true, "browse": true}])
        ));
    }

    #[test]
    fn filter_and_ring_size_changes_are_updates() {
        let mut tap = spec("orders.in");
        let mut inv = inv_with("orders.in");
        installed(&mut inv, &tap, 1);
        tap.filter = Some("region = 'eu'".into());
        tap.ring_size = 5;
        assert_eq!(
            assess(&tap, &inv, None, true),
            Verdict::Missing(vec![Part::QueueRingSize, Part::DivertUpdate])
        );
    }

    #[test]
    fn only_this_instances_objects_are_ours() {
        let tap = spec("orders.in");
        let mut inv = inv_with("orders.in");
        installed(&mut inv, &tap, 0);
        let other = TapSpec {
            name: TapName::new("i2", "ns", "orders.in", "sub"),
            ..spec("orders.in")
        };
        installed(&mut inv, &other, 0);
        let ours = our_objects("i1", &inv);
        assert_eq!(ours.len(), 1);
        assert_eq!(ours.get(&tap.name), Some(&(true, true)));
    }

    #[test]
    fn deleting_subscriptions_desire_nothing() {
        let inv = inv_with("orders.in");
        let mut s = orders_sub(true, 100, BTreeSet::new());
        assert_eq!(
            desired_taps(&naming(), "amq", std::slice::from_ref(&s), [&inv])
                .0
                .len(),
            1
        );
        s.deleting = true;
        assert!(desired_taps(&naming(), "amq", &[s], [&inv]).0.is_empty());
    }

    #[test]
    fn unarmed_subscriptions_desire_only_what_they_have_and_the_cap_refuses_the_rest() {
        let mut inv = inv_with("orders.a");
        for a in ["orders.b", "orders.c"] {
            inv.queues.insert(
                a.into(),
                QueueInfo {
                    name: a.into(),
                    address: a.into(),
                    ..Default::default()
                },
            );
        }
        let mut s = orders_sub(false, 2, BTreeSet::from(["orders.c".to_string()]));
        let (d, cap) = desired_taps(&naming(), "amq", std::slice::from_ref(&s), [&inv]);
        assert_eq!(
            d.keys().map(|t| t.address.as_str()).collect::<Vec<_>>(),
            ["orders.c"]
        );
        assert!(cap.is_empty());
        s.armed = true;
        let (d, cap) = desired_taps(&naming(), "amq", std::slice::from_ref(&s), [&inv]);
        assert_eq!(d.len(), 2);
        assert_eq!(cap.get("sub"), Some(&vec!["orders.b".to_string()]));
    }

    #[test]
    fn broker_internal_and_other_installations_addresses_never_match() {
        let mut inv = inv_with("orders");
        for (q, a) in [
            ("$.artemis.internal.sf.cc.node1", "$.artemis.internal.sf.cc.node1"),
            ("$sys.mqtt.sessions", "$sys.mqtt.sessions"),
            ("activemq.management.x", "activemq.management.x"),
            ("notif", "activemq.notifications"),
            (
                "artemis-studio.capture.other.orders.s",
                "artemis-studio.capture.other.orders.s",
            ),
            ("DLQ", "DLQ"),
        ] {
            inv.queues.insert(
                q.into(),
                QueueInfo {
                    name: q.into(),
                    address: a.into(),
                    ..Default::default()
                },
            );
        }
        let (tapped, never) = matched_addresses("#", [&inv]);
        assert_eq!(tapped, BTreeSet::from(["orders".to_string(), "DLQ".to_string()]));
        assert_eq!(never.len(), 5, "{never:?}");
    }

    /// ADR-0062 D8: the security setting a tap writes lets only the operator's role consume and
    /// browse the capture queue (a complete second copy of production payload), and nobody send.
    #[test]
    fn the_tap_security_setting_lets_only_the_operators_role_read_and_nobody_send() {
        let roles = spec("orders.in").security_roles();
        assert_eq!(roles.consume, "amq");
        assert_eq!(roles.browse, "amq");
        assert_eq!(roles.send, "", "nobody sends to a capture queue");
        assert_eq!(
            roles.create_durable_queue, "",
            "the capture queue is never durable"
        );
    }

    /// ADR-0062 D8: a node's effective roles restrict the capture queue only when the
    /// operator's role may consume and browse it, no other role may consume or browse it, and
    /// no role (the operator's included) may send to it. Anything else is re-installed.
    #[test]
    fn effective_roles_restrict_only_when_the_operators_role_alone_reads_and_nobody_sends() {
        for (roles, restricts) in [
            (json!([{"name": "amq", "consume": true, "browse": true}]), true),
            (
                json!([{"name": "amq", "consume": true, "browse": true}, {"name": "ops", "manage": true, "view": true}]),
                true,
            ),
            (json!([]), false),
            (json!({"name": "amq", "consume": true, "browse": true}), false),
            (json!([{"name": "amq", "consume": true}]), false),
            (json!([{"name": "amq", "browse": true}]), false),
            (json!([{"name": "app", "consume": true, "browse": true}]), false),
            (
                json!([{"name": "amq", "consume": true, "browse": true, "send": true}]),
                false,
            ),
            (
                json!([{"name": "amq", "consume": true, "browse": true}, {"name": "app", "send": true}]),
                false,
            ),
            (
                json!([{"name": "amq", "consume": true, "browse": true}, {"name": "app", "consume": true}]),
                false,
            ),
            (
                json!([{"name": "amq", "consume": true, "browse": true}, {"name": "app", "browse": true}]),
                false,
            ),
        ] {
            assert_eq!(roles_restrict("amq", &roles), restricts, "{roles}");
            // And as the pass sees it: an unrestricted node gets its security setting again.
            let tap = spec("orders.in");
            let mut node = inv_with("orders.in");
            installed(&mut node, &tap, 1);
            let settings = EffectiveSettings {
                roles,
                ..good_settings(&tap)
            };
            let verdict = assess(&tap, &node, Some(&settings), true);
            assert_eq!(
                verdict == Verdict::Missing(vec![Part::SecuritySetting]),
                !restricts,
                "{verdict:?}"
            );
        }
    }

    /// The broker refuses a page size at or above max-size-bytes ("pageSize has to be lower
    /// than maxSizeBytes"): for every buffer a subscription may set (1 MiB up), the page is a
    /// quarter of it, at most 10 MiB.
    #[test]
    fn the_page_size_stays_below_every_buffer_size_a_subscription_may_set() {
        for (max, page) in [
            (1 << 20, 256 << 10),
            (4 << 20, 1 << 20),
            (64 << 20, 10 << 20),
            (1 << 30, 10 << 20),
        ] {
            let tap = TapSpec {
                max_buffer_bytes: max,
                ..spec("orders.in")
            };
            let s = tap.address_settings();
            assert_eq!(s["maxSizeBytes"], json!(max));
            assert_eq!(s["pageSizeBytes"], json!(page), "buffer {max}");
            assert!(page < max);
        }
    }
}
