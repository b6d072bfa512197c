//! One watch per kind: the reflector that keeps a kind's cache is also what its controller
//! reconciles on, and only a change that asks for a reconcile reaches the controller — never the
//! operator's own status writes (issue 23: nothing reconciles because of its own status write;
//! issue 24: one watch per kind, shared by the cache and the controller).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use kube::Resource;
use tokio::sync::mpsc;

/// What in an object asks for a reconcile: its spec (generation), annotations (pause, confirm),
/// labels, finalizers and the start of its deletion. A status write changes none of them.
pub fn fingerprint<K: Resource>(o: &K) -> u64 {
    let m = o.meta();
    let mut h = DefaultHasher::new();
    m.generation.hash(&mut h);
    m.annotations.hash(&mut h);
    m.labels.hash(&mut h);
    m.finalizers.hash(&mut h);
    m.deletion_timestamp.is_some().hash(&mut h);
    h.finish()
}

/// The last fingerprint handed to the controller, per object uid.
#[derive(Default)]
pub struct Changes {
    seen: HashMap<String, u64>,
}

impl Changes {
    /// True for an object not seen before, or changed in what asks for a reconcile.
    pub fn asks_for_reconcile<K: Resource>(&mut self, o: &K) -> bool {
        let uid = o.meta().uid.clone().unwrap_or_default();
        let print = fingerprint(o);
        self.seen.insert(uid, print) != Some(print)
    }

    /// The operator itself is about to change the object into `o` (its finalizer added, issue
    /// 45): that change is not a new one, so its watch event asks for no second reconcile.
    pub fn expect<K: Resource>(&mut self, o: &K) {
        let uid = o.meta().uid.clone().unwrap_or_default();
        self.seen.insert(uid, fingerprint(o));
    }

    pub fn forget<K: Resource>(&mut self, o: &K) {
        self.seen.remove(o.meta().uid.as_deref().unwrap_or_default());
    }
}

/// What a re-list (the watch's `Init` … `InitDone`, after a watch error or expiry) says was
/// deleted meanwhile: no `Delete` event comes for an object removed while the watch was away,
/// so the objects the cache held when the re-list began and the re-list did not report are the
/// ones to forget (issue 43: their index entries and their change fingerprints).
pub struct Relist<K> {
    before: Vec<std::sync::Arc<K>>,
    listed: std::collections::HashSet<String>,
    listing: bool,
}

impl<K> Default for Relist<K> {
    fn default() -> Self {
        Relist {
            before: vec![],
            listed: Default::default(),
            listing: false,
        }
    }
}

impl<K: Resource> Relist<K> {
    /// A re-list begins; `cached` is what the cache holds now.
    pub fn begin(&mut self, cached: Vec<std::sync::Arc<K>>) {
        self.before = cached;
        self.listed.clear();
        self.listing = true;
    }

    /// The watch reported this object (kept only while a re-list runs).
    pub fn listed(&mut self, o: &K) {
        if self.listing {
            self.listed.insert(uid_of(o));
        }
    }

    /// The re-list is complete: the objects it did not report (gone while the watch was away).
    pub fn gone(&mut self) -> Vec<std::sync::Arc<K>> {
        self.listing = false;
        let listed = std::mem::take(&mut self.listed);
        std::mem::take(&mut self.before)
            .into_iter()
            .filter(|o| !listed.contains(&uid_of(o.as_ref())))
            .collect()
    }
}

fn uid_of<K: Resource>(o: &K) -> String {
    o.meta().uid.clone().unwrap_or_default()
}

/// One scope's watch of one kind: the reflector's writer, and the channel through which it feeds
/// the controller.
pub struct Scoped<K: Resource<DynamicType = ()> + Clone + 'static> {
    pub writer: kube::runtime::reflector::store::Writer<K>,
    pub tx: mpsc::UnboundedSender<K>,
    pub rx: mpsc::UnboundedReceiver<K>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Scoped<K> {
    pub fn new(writer: kube::runtime::reflector::store::Writer<K>) -> Self {
        // Unbounded: the initial listing is fed before the controllers start (they wait until
        // every cache is ready), so a bound would stall the very watch they wait for.
        let (tx, rx) = mpsc::unbounded_channel();
        Scoped { writer, tx, rx }
    }
}

#[cfg(test)]
mod tests {
    use super::{Changes, Relist};
    use crate::api::queue::ArtemisQueue;

    fn queue(generation: i64) -> ArtemisQueue {
        let mut q: ArtemisQueue = serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": "q", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": {"clusterRef": {"name": "c"}}
        }))
        .expect("a queue");
        q.metadata.resource_version = Some(format!("{generation}"));
        q
    }

    #[test]
    fn a_status_write_does_not_ask_for_a_reconcile_and_a_spec_change_does() {
        let mut c = Changes::default();
        let q = queue(1);
        assert!(c.asks_for_reconcile(&q), "first sight");
        let mut status_written = q.clone();
        status_written.metadata.resource_version = Some("99".into());
        status_written.status = Some(Default::default());
        assert!(!c.asks_for_reconcile(&status_written), "own status write");
        let mut paused = status_written.clone();
        paused
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("artemis-studio.io/paused".into(), "true".into());
        assert!(c.asks_for_reconcile(&paused), "an annotation");
        let mut finalized = paused.clone();
        finalized.metadata.finalizers = Some(vec!["artemis-studio.io/queue".into()]);
        assert!(c.asks_for_reconcile(&finalized), "a finalizer");
        let mut deleting = finalized.clone();
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        assert!(c.asks_for_reconcile(&deleting), "deletion starts");
        assert!(c.asks_for_reconcile(&queue(2)), "a spec change");
    }

    #[test]
    fn a_relist_forgets_what_it_no_longer_reports() {
        let named = |uid: &str| {
            let mut q = queue(1);
            q.metadata.uid = Some(uid.into());
            q
        };
        let mut r = Relist::default();
        r.listed(&named("x"));
        r.begin(vec![
            std::sync::Arc::new(named("a")),
            std::sync::Arc::new(named("b")),
        ]);
        r.listed(&named("b"));
        r.listed(&named("c"));
        let gone: Vec<_> = r.gone().iter().map(|o| o.metadata.uid.clone()).collect();
        assert_eq!(gone, vec![Some("a".to_string())]);
        assert!(r.gone().is_empty(), "told once");
        r.listed(&named("y"));
        assert!(r.listed.is_empty(), "nothing kept between re-lists");
    }
}
