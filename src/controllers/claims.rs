//! Who claims what, kept as the watch reports changes: the objects of one kind that claim a
//! broker object (a queue's or divert's name), so a reconcile judges a conflict (the oldest
//! claimant wins) from the few objects with its claim instead of scanning every
//! object of the kind — a cost that grew with the kind's size, per reconcile (issue 23).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// An object, by namespace and name.
pub type ObjectKey = (String, String);

#[derive(Default)]
struct Index {
    by_claim: HashMap<String, HashSet<ObjectKey>>,
    by_object: HashMap<ObjectKey, String>,
}

/// The claim index of one kind, shared by its watch (the writer) and its reconciles.
#[derive(Clone, Default)]
pub struct ClaimIndex(Arc<Mutex<Index>>);

impl ClaimIndex {
    /// The object now claims `claim` (None: nothing, e.g. a spec that does not validate).
    pub fn set(&self, object: ObjectKey, claim: Option<String>) {
        let Ok(mut ix) = self.0.lock() else { return };
        if let Some(old) = ix.by_object.remove(&object) {
            forget(&mut ix.by_claim, &old, &object);
        }
        if let Some(claim) = claim {
            ix.by_claim
                .entry(claim.clone())
                .or_default()
                .insert(object.clone());
            ix.by_object.insert(object, claim);
        }
    }

    /// The object is gone.
    pub fn remove(&self, object: &ObjectKey) {
        self.set(object.clone(), None);
    }

    /// Every object that claims `claim` (it may have been deleted since: look it up).
    pub fn claimants(&self, claim: &str) -> Vec<ObjectKey> {
        self.0
            .lock()
            .ok()
            .and_then(|ix| ix.by_claim.get(claim).map(|s| s.iter().cloned().collect()))
            .unwrap_or_default()
    }
}

fn forget(by_claim: &mut HashMap<String, HashSet<ObjectKey>>, claim: &str, object: &ObjectKey) {
    if let Some(set) = by_claim.get_mut(claim) {
        set.remove(object);
        if set.is_empty() {
            by_claim.remove(claim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(ns: &str, name: &str) -> ObjectKey {
        (ns.into(), name.into())
    }

    #[test]
    fn a_claim_follows_its_objects_changes_and_deletion() {
        let ix = ClaimIndex::default();
        ix.set(k("a", "q1"), Some("queue orders".into()));
        ix.set(k("b", "q1"), Some("queue orders".into()));
        ix.set(k("a", "q2"), Some("queue payments".into()));
        let mut got = ix.claimants("queue orders");
        got.sort();
        assert_eq!(got, vec![k("a", "q1"), k("b", "q1")]);
        // a spec change moves the claim; a deletion drops it
        ix.set(k("a", "q1"), Some("queue payments".into()));
        assert_eq!(ix.claimants("queue orders"), vec![k("b", "q1")]);
        ix.remove(&k("b", "q1"));
        assert!(ix.claimants("queue orders").is_empty());
        ix.set(k("a", "q2"), None);
        assert_eq!(ix.claimants("queue payments"), vec![k("a", "q1")]);
    }
}
