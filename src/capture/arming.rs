//! Blast radius before arming (issue 25 item 5): before its first install a subscription shows
//! what it would install (`status.preview`: taps, addresses, nodes, broker objects) and installs
//! nothing until that preview was shown and then armed — the "shown, then armed" rule of a
//! ConnectionClose (ADR-0057 D3, D4): `spec.confirm` counts only when it says what the preview
//! says AND was set at a later generation than the one the preview was shown at. Automation that
//! accepts any blast radius annotates the object instead (recorded in the audit rows). A queue
//! named without wildcards is one address whatever the brokers hold: its spec is its preview.
//! A cap (`spec.maxTaps`) bounds what one subscription may install. Pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::capture::{CaptureArming, CapturePreview};
use crate::topology::inventory::NodeInventory;

/// Addresses listed in a preview (its `taps` counts them all): the status stays small.
pub const PREVIEW_ADDRESSES: usize = 50;
/// Never-tapped names listed in a preview.
pub const PREVIEW_NEVER_TAPPED: usize = 20;
/// The objects of one tap on one node: divert, ring queue, address setting, security setting.
pub const OBJECTS_PER_TAP_AND_NODE: u64 = 4;

/// What a pattern resolves to on the live nodes now.
pub struct Resolved<'a> {
    pub queues: &'a str,
    pub max_taps: u32,
    /// The addresses it would tap.
    pub capturable: &'a BTreeSet<String>,
    /// The addresses it matches that are never tapped (internal, capture prefix).
    pub never: &'a BTreeSet<String>,
    /// Live node ID → its inventory.
    pub live: &'a BTreeMap<String, &'a NodeInventory>,
}

/// FNV-1a: a digest stable across processes and Rust releases (the confirmation is compared by
/// another replica, perhaps another build).
fn digest(parts: impl IntoIterator<Item = impl AsRef<str>>) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.as_ref().bytes().chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    (h ^ (h >> 32)) as u32
}

/// The preview of `r`, shown at `generation`.
pub fn preview(r: &Resolved<'_>, generation: Option<i64>) -> CapturePreview {
    let nodes: Vec<String> = r.live.keys().cloned().collect();
    let pairs: u64 = r
        .capturable
        .iter()
        .map(|a| {
            r.live
                .values()
                .filter(|inv| inv.addresses.contains_key(a))
                .count() as u64
        })
        .sum();
    let taps = r.capturable.len() as u64;
    let hash = digest(
        [r.queues.to_string()]
            .into_iter()
            .chain(r.capturable.iter().cloned())
            .chain(["|".to_string()])
            .chain(nodes.iter().cloned()),
    );
    CapturePreview {
        queues: r.queues.to_string(),
        taps,
        addresses: r.capturable.iter().take(PREVIEW_ADDRESSES).cloned().collect(),
        nodes: nodes.clone(),
        broker_objects: pairs * OBJECTS_PER_TAP_AND_NODE,
        never_tapped: r.never.iter().take(PREVIEW_NEVER_TAPPED).cloned().collect(),
        max_taps: r.max_taps,
        confirmation: format!("{taps} taps on {} nodes #{hash:08x}", nodes.len()),
        shown_generation: generation,
    }
}

/// What the subscription object says about arming.
pub struct Request<'a> {
    pub queues: &'a str,
    pub confirm: Option<&'a str>,
    pub generation: Option<i64>,
    /// The annotation `artemis-studio.io/confirm-without-review: "true"`.
    pub without_review: bool,
    /// status.armed as last written.
    pub armed: Option<&'a CaptureArming>,
    /// status.preview as last written: what was shown.
    pub shown: Option<&'a CapturePreview>,
}

/// Why a subscription is not armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotArmed {
    /// No spec.confirm.
    AwaitingConfirmation,
    /// spec.confirm is not what the preview says now (the matching queues changed, or a typo).
    ConfirmationMismatch,
    /// spec.confirm says it, but was set before that preview was shown.
    ConfirmedBeforeShown,
    /// The pattern matches more addresses than spec.maxTaps.
    TapCapExceeded,
}

impl NotArmed {
    pub fn reason(self) -> &'static str {
        match self {
            NotArmed::AwaitingConfirmation => "AwaitingConfirmation",
            NotArmed::ConfirmationMismatch => "ConfirmationMismatch",
            NotArmed::ConfirmedBeforeShown => "ConfirmedBeforeShown",
            NotArmed::TapCapExceeded => "TapCapExceeded",
        }
    }
}

/// The verdict of one pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Arming {
    /// Armed (now or before): its taps follow `queues`, up to the cap.
    Armed(CaptureArming),
    /// Not armed: it installs nothing new; what for a human, with the next action.
    Not { why: NotArmed, message: String },
}

pub const HOW_CONFIRMED: &str = "ConfirmedAfterPreview";
pub const HOW_WITHOUT_REVIEW: &str = "ConfirmWithoutReview";
pub const HOW_EXACT: &str = "ExactQueueName";

/// Decide whether `req` is armed against the preview computed now (`now`); `at` is the time an
/// arming made now records.
pub fn decide(req: &Request<'_>, now: &CapturePreview, at: &str) -> Arming {
    if let Some(a) = req.armed.filter(|a| a.queues == req.queues) {
        return Arming::Armed(a.clone());
    }
    if now.taps > u64::from(now.max_taps) {
        return Arming::Not {
            why: NotArmed::TapCapExceeded,
            message: format!(
                "spec.queues {:?} matches {} addresses, above spec.maxTaps ({}): nothing is installed. Narrow spec.queues, or raise spec.maxTaps to at least {} (each tap is {OBJECTS_PER_TAP_AND_NODE} broker objects per node; see status.preview)",
                req.queues, now.taps, now.max_taps, now.taps
            ),
        };
    }
    let armed = |how: &str, confirm: Option<&str>| {
        Arming::Armed(CaptureArming {
            queues: req.queues.to_string(),
            how: how.to_string(),
            generation: req.generation,
            confirm: confirm.map(str::to_string),
            taps: now.taps,
            at: at.to_string(),
        })
    };
    if crate::api::capture_names::is_exact(req.queues) {
        return armed(HOW_EXACT, None);
    }
    if req.without_review {
        return armed(HOW_WITHOUT_REVIEW, req.confirm);
    }
    let radius = format!(
        "spec.queues {:?} would install {} taps on {} nodes ({} broker objects: a divert, a ring queue, an address setting and a security setting per address and node; see status.preview)",
        req.queues,
        now.taps,
        now.nodes.len(),
        now.broker_objects
    );
    let token = &now.confirmation;
    let automation = format!(
        "automation that accepts it without review annotates the object {}: \"true\" (recorded in the audit rows)",
        crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION
    );
    let shown_here = req
        .shown
        .filter(|s| s.confirmation == *token)
        .and_then(|s| s.shown_generation);
    match req.confirm {
        None => Arming::Not {
            why: NotArmed::AwaitingConfirmation,
            message: format!(
                "{radius}; nothing is installed until it is armed: set spec.confirm to {token:?}, or {automation}"
            ),
        },
        Some(c) if c != token.as_str() => Arming::Not {
            why: NotArmed::ConfirmationMismatch,
            message: format!(
                "spec.confirm is {c:?} but the preview now says {token:?} (the matching queues or nodes changed since): nothing new is installed. {radius}; if that is what you want, set spec.confirm to {token:?}"
            ),
        },
        Some(c) if shown_here.is_some_and(|s| req.generation.is_some_and(|g| g > s)) => {
            armed(HOW_CONFIRMED, Some(c))
        }
        Some(_) => Arming::Not {
            why: NotArmed::ConfirmedBeforeShown,
            message: format!(
                "spec.confirm was set before this preview was shown, so it does not count: {radius}. To arm it, remove spec.confirm and set it again to {token:?}; {automation}"
            ),
        },
    }
}

/// The addresses a subscription taps: those it has already that its pattern still matches, and
/// — armed — the others its pattern matches, in order, up to `max_taps`. The rest is refused
/// past the cap (returned second).
pub fn chosen(
    armed: bool,
    max_taps: u32,
    matched: &BTreeSet<String>,
    installed: &BTreeSet<String>,
) -> (BTreeSet<String>, Vec<String>) {
    let mut out: BTreeSet<String> = matched.intersection(installed).cloned().collect();
    let mut refused = vec![];
    if armed {
        for a in matched.difference(installed) {
            if out.len() < max_taps as usize {
                out.insert(a.clone());
            } else {
                refused.push(a.clone());
            }
        }
    }
    (out, refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::inventory::AddressInfo;

    fn inv(addresses: &[&str]) -> NodeInventory {
        let mut i = NodeInventory::default();
        for a in addresses {
            i.addresses.insert(
                a.to_string(),
                AddressInfo {
                    name: a.to_string(),
                    ..Default::default()
                },
            );
        }
        i
    }

    fn set(a: &[&str]) -> BTreeSet<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn preview_of(pattern: &str, max: u32, addresses: &[&str], generation: i64) -> CapturePreview {
        let (a, b) = (inv(addresses), inv(&addresses[..1]));
        let live = BTreeMap::from([("n1".to_string(), &a), ("n2".to_string(), &b)]);
        let (capturable, never) = (set(addresses), set(&["$sys.x"]));
        preview(
            &Resolved {
                queues: pattern,
                max_taps: max,
                capturable: &capturable,
                never: &never,
                live: &live,
            },
            Some(generation),
        )
    }

    fn req<'a>(confirm: Option<&'a str>, generation: i64, shown: Option<&'a CapturePreview>) -> Request<'a> {
        Request {
            queues: "kb.#",
            confirm,
            generation: Some(generation),
            without_review: false,
            armed: None,
            shown,
        }
    }

    #[test]
    fn the_preview_counts_objects_per_node_holding_the_address() {
        let p = preview_of("kb.#", 100, &["kb.a", "kb.b", "kb.c"], 1);
        assert_eq!((p.taps, p.broker_objects), (3, (3 + 1) * 4));
        assert_eq!(p.nodes, vec!["n1", "n2"]);
        assert_eq!(p.never_tapped, vec!["$sys.x"]);
        assert!(
            p.confirmation.starts_with("3 taps on 2 nodes #"),
            "{}",
            p.confirmation
        );
        // Another set of addresses of the same size is another confirmation.
        let q = preview_of("kb.#", 100, &["kb.a", "kb.b", "kb.d"], 1);
        assert_ne!(p.confirmation, q.confirmation);
    }

    #[test]
    fn only_a_confirmation_given_after_the_preview_was_shown_arms() {
        let shown = preview_of("kb.#", 100, &["kb.a", "kb.b"], 1);
        let token = shown.confirmation.clone();
        // Nothing shown yet: a correct confirmation (computed ahead) does not count.
        let now = preview_of("kb.#", 100, &["kb.a", "kb.b"], 1);
        let v = decide(&req(Some(&token), 1, None), &now, "t");
        assert!(
            matches!(
                v,
                Arming::Not {
                    why: NotArmed::ConfirmedBeforeShown,
                    ..
                }
            ),
            "{v:?}"
        );
        // Shown at generation 1, confirmation in the same generation: does not count.
        let v = decide(&req(Some(&token), 1, Some(&shown)), &now, "t");
        assert!(
            matches!(
                v,
                Arming::Not {
                    why: NotArmed::ConfirmedBeforeShown,
                    ..
                }
            ),
            "{v:?}"
        );
        // Not given.
        let v = decide(&req(None, 1, Some(&shown)), &now, "t");
        assert!(
            matches!(v, Arming::Not { why: NotArmed::AwaitingConfirmation, ref message } if message.contains(&token)),
            "{v:?}"
        );
        // Given later: armed, with the confirmation recorded.
        let Arming::Armed(a) = decide(&req(Some(&token), 2, Some(&shown)), &now, "t") else {
            panic!("armed")
        };
        assert_eq!(
            (a.how.as_str(), a.confirm.as_deref(), a.taps),
            (HOW_CONFIRMED, Some(token.as_str()), 2)
        );
        // The queues changed since it was shown: a mismatch, nothing armed.
        let changed = preview_of("kb.#", 100, &["kb.a", "kb.b", "kb.c"], 2);
        let v = decide(&req(Some(&token), 2, Some(&shown)), &changed, "t");
        assert!(
            matches!(
                v,
                Arming::Not {
                    why: NotArmed::ConfirmationMismatch,
                    ..
                }
            ),
            "{v:?}"
        );
    }

    #[test]
    fn the_cap_refuses_the_annotation_and_exact_names_arm_and_arming_follows_the_pattern() {
        let big = preview_of("kb.#", 2, &["kb.a", "kb.b", "kb.c"], 1);
        let mut r = req(None, 1, None);
        r.without_review = true;
        let v = decide(&r, &big, "t");
        assert!(
            matches!(v, Arming::Not { why: NotArmed::TapCapExceeded, ref message } if message.contains("spec.maxTaps") && message.contains("at least 3")),
            "{v:?}"
        );
        let small = preview_of("kb.#", 100, &["kb.a"], 1);
        let Arming::Armed(a) = decide(&r, &small, "t") else {
            panic!("annotation arms")
        };
        assert_eq!(a.how, HOW_WITHOUT_REVIEW);
        let mut exact = req(None, 1, None);
        exact.queues = "kb.a";
        let Arming::Armed(e) = decide(&exact, &small, "t") else {
            panic!("exact arms")
        };
        assert_eq!(e.how, HOW_EXACT);
        // Armed for kb.#: stays armed, also past the cap; another pattern is not armed.
        let mut later = req(None, 5, None);
        later.armed = Some(&a);
        assert!(matches!(decide(&later, &big, "t"), Arming::Armed(_)));
        later.queues = "kb.*";
        assert!(matches!(decide(&later, &small, "t"), Arming::Not { .. }));
    }

    #[test]
    fn not_armed_keeps_what_it_has_and_armed_adds_up_to_the_cap() {
        let matched = set(&["a", "b", "c", "d"]);
        let installed = set(&["c", "x"]);
        assert_eq!(chosen(false, 100, &matched, &installed), (set(&["c"]), vec![]));
        assert_eq!(
            chosen(true, 3, &matched, &installed),
            (set(&["a", "b", "c"]), vec!["d".to_string()])
        );
    }
}
