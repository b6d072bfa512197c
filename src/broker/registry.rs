//! What every Jolokia client of one operator shares, per broker node: the request budgets
//! (`super::budget`), the batchers that coalesce concurrent calls (`super::batch`) and the Jolokia
//! metric families. One per operator, a field of the controllers' `Context` (issue 43: no
//! process-wide registry; a test's operator gets its own, so its counts are its own).
//!
//! It reaches a client through the [`super::jolokia::HttpClient`] the client is built with: every
//! client of a cluster is built from that cluster's HTTP client, so one operator's clients share
//! one budget per node — two budgets for one node would let the operator's own traffic collapse
//! it, which is what the budget prevents.

use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

use super::budget::{BatchKey, NodeBudget, NodeStats, node_key};
use crate::telemetry::jolokia::JolokiaMetrics;

pub struct Registry {
    budgets: Mutex<HashMap<String, Arc<NodeBudget>>>,
    /// The running batchers by key: what `super::batch` hands a caller's requests to (its type
    /// is the batch module's; kept opaque here, so this module needs nothing of it).
    batchers: Mutex<HashMap<BatchKey, Box<dyn Any + Send>>>,
    /// Keys credentials and trust roots for the batcher map; random per registry, so a key
    /// reveals nothing.
    hasher: RandomState,
    metrics: Arc<JolokiaMetrics>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// A registry whose traffic is counted in these metric families (the operator's exported
    /// ones).
    pub fn new(metrics: Arc<JolokiaMetrics>) -> Arc<Registry> {
        Arc::new(Registry {
            budgets: Mutex::new(HashMap::new()),
            batchers: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
            metrics,
        })
    }

    /// A registry with metric families of its own (unit tests, one-off tools).
    pub fn standalone() -> Arc<Registry> {
        Registry::new(Arc::new(JolokiaMetrics::default()))
    }

    pub fn metrics(&self) -> &Arc<JolokiaMetrics> {
        &self.metrics
    }

    /// The budget of the node behind this endpoint URL (created on first use).
    pub fn budget_for(&self, url: &str) -> Arc<NodeBudget> {
        let node = node_key(url);
        let mut budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        budgets
            .entry(node.clone())
            .or_insert_with(|| Arc::new(NodeBudget::new(node, self.metrics.clone())))
            .clone()
    }

    /// The budget state of the node behind this URL, if anything was ever sent there.
    pub fn node_stats(&self, url: &str) -> Option<NodeStats> {
        let budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        budgets.get(&node_key(url)).map(|b| b.stats())
    }

    /// Jolokia operations sent to this endpoint URL (any kind, any result).
    pub fn requests_of(&self, url: &str) -> u64 {
        self.metrics.requests_of(&node_key(url))
    }

    /// Jolokia HTTP POSTs sent to this endpoint URL.
    pub fn posts_of(&self, url: &str) -> u64 {
        self.metrics.posts_of(&node_key(url))
    }

    /// The running batcher for this key, else one started by `start`: a batcher that `ended`
    /// is replaced, and ended ones are pruned then.
    pub(crate) fn batcher<T: Clone + Send + 'static>(
        &self,
        key: BatchKey,
        ended: impl Fn(&T) -> bool,
        start: impl FnOnce() -> T,
    ) -> T {
        let mut batchers = self.batchers.lock().unwrap_or_else(|p| p.into_inner());
        let running = |b: &Box<dyn Any + Send>| b.downcast_ref::<T>().filter(|t| !ended(t)).cloned();
        if let Some(t) = batchers.get(&key).and_then(running) {
            return t;
        }
        batchers.retain(|_, b| running(b).is_some());
        let t = start();
        batchers.insert(key, Box::new(t.clone()));
        t
    }

    /// Who asks, as a key: the credentials and the exact URL (which may carry user info).
    pub(crate) fn credentials_hash(&self, username: &str, password: &str, url: &str) -> u64 {
        self.hasher.hash_one((username, password, url))
    }

    /// What a client trusts, as a key (never 0: 0 is the system roots alone).
    pub(crate) fn trust_hash(&self, ca_pem: &[u8]) -> u64 {
        self.hasher.hash_one(("trust", ca_pem)).max(1)
    }
}
