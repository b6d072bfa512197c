//! Who claims what, kept as the watch reports changes: the objects of one kind that claim a
//! broker object (a queue's or divert's name), so a reconcile judges a conflict (the oldest
//! claimant wins) from the few objects with its claim instead of scanning every
//! object of the kind — a cost that grew with the kind's size, per reconcile (issue 23). The
//! same index, keyed by every broker name an object's plan looks at, says which objects a change
//! of the cluster's broker objects concerns (one lookup per changed name, not a scan).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// An object, by namespace and name.
pub type ObjectKey = (String, String);

#[derive(Default)]
struct Index {
    by_claim: HashMap<String, HashSet<ObjectKey>>,
    by_object: HashMap<ObjectKey, Vec<String>>,
}

/// The claim index of one kind, shared by its watch (the writer) and its reconciles.
#[derive(Clone, Default)]
pub struct ClaimIndex(Arc<Mutex<Index>>);

impl ClaimIndex {
    /// The object now claims `claim` (None: nothing, e.g. a spec that does not validate).
    pub fn set(&self, object: ObjectKey, claim: Option<String>) {
        self.set_all(object, claim.into_iter().collect());
    }

    /// The object now claims each of `claims` (none: nothing).
    pub fn set_all(&self, object: ObjectKey, claims: Vec<String>) {
        let Ok(mut ix) = self.0.lock() else { return };
        for old in ix.by_object.remove(&object).unwrap_or_default() {
            forget(&mut ix.by_claim, &old, &object);
        }
        if claims.is_empty() {
            return;
        }
        for claim in &claims {
            ix.by_claim
                .entry(claim.clone())
                .or_default()
                .insert(object.clone());
        }
        ix.by_object.insert(object, claims);
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

    #[test]
    fn an_object_claims_several_names_and_a_change_drops_the_old_ones() {
        let ix = ClaimIndex::default();
        ix.set_all(
            k("a", "d1"),
            vec!["divert d1".into(), "address x".into(), "address y".into()],
        );
        ix.set_all(k("a", "q1"), vec!["queue q1".into(), "address x".into()]);
        let mut on_x = ix.claimants("address x");
        on_x.sort();
        assert_eq!(on_x, vec![k("a", "d1"), k("a", "q1")]);
        ix.set_all(k("a", "d1"), vec!["divert d1".into(), "address z".into()]);
        assert_eq!(ix.claimants("address x"), vec![k("a", "q1")]);
        assert!(ix.claimants("address y").is_empty());
        assert_eq!(ix.claimants("address z"), vec![k("a", "d1")]);
        ix.remove(&k("a", "d1"));
        assert!(ix.claimants("divert d1").is_empty());
    }
}
