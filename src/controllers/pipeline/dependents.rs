//! What the pipeline's kinds add to the dependents' index: which cluster an object names, and
//! the broker names its plan looks at (`controllers::dependents` triggers them).

use kube::ResourceExt;

use super::TopologyObject;

/// The object names this ArtemisCluster (namespace and name).
pub(in crate::controllers) fn of_cluster<K: TopologyObject>(o: &K, ns: &str, cluster: &str) -> bool {
    o.namespace().as_deref() == Some(ns) && o.cluster_ref().name == cluster
}

/// The index keys of what an object's plan looks at (none for a spec that does not validate:
/// it plans nothing).
pub fn touch_keys_of<K: TopologyObject>(o: &K) -> Vec<String> {
    o.desired().map(|d| K::touch_keys(&d)).unwrap_or_default()
}
