//! What the pipeline's kinds add to the dependents' index: the broker names an object's plan
//! looks at (`controllers::dependents` triggers them).

use super::TopologyObject;

/// The index keys of what an object's plan looks at (none for a spec that does not validate:
/// it plans nothing).
pub fn touch_keys_of<K: TopologyObject>(o: &K) -> Vec<String> {
    o.desired().map(|d| K::touch_keys(&d)).unwrap_or_default()
}
