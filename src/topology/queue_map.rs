//! A node's queues by name, with the names of the queues on each address kept beside them
//! (issue 45): which queues an address holds — what a queue delete judges its diverts and taps
//! by (ADR-0084 §1, §5) — is a lookup, not a walk of every queue on the node, so a delete or a
//! create costs the same at 10,000 queues as at 100. Every change goes through [`QueueMap`]'s
//! own methods, which keep the two in step. A queue as a node's inventory knows it is
//! [`QueueInfo`].

use imbl::{OrdMap, OrdSet};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueInfo {
    pub name: String,
    pub address: String,
    /// ANYCAST or MULTICAST.
    pub routing_type: String,
    pub filter: Option<String>,
    pub durable: bool,
    pub max_consumers: i64,
    pub exclusive: bool,
    pub last_value: bool,
    pub last_value_key: Option<String>,
    /// Not an attribute of Artemis 2.40's QueueControl: None (unknown) unless a broker reports it.
    pub non_destructive: Option<bool>,
    pub purge_on_no_consumers: bool,
    pub enabled: bool,
    /// Delivery to consumers is paused (QueueControl.isPaused).
    pub paused: bool,
    /// A pause the broker keeps across a restart (QueueControl.isPersistedPause, Artemis 2.41+;
    /// `pause()` by hand does not persist). None: not paused, or not known (a 2.40 broker does
    /// not report it; a fresh read asks it only for a queue declared Paused).
    pub pause_persisted: Option<bool>,
    pub consumers_before_dispatch: i64,
    pub delay_before_dispatch: i64,
    /// Not an attribute of Artemis 2.40's QueueControl: None (unknown) unless a broker reports it.
    pub consumer_priority: Option<i64>,
    pub ring_size: i64,
    pub group_rebalance: bool,
    pub group_buckets: i64,
    pub group_first_key: Option<String>,
    pub auto_delete: bool,
    /// Not attributes of Artemis 2.40's QueueControl: None (unknown) unless a broker reports them.
    pub auto_delete_delay: Option<i64>,
    pub auto_delete_message_count: Option<i64>,
    pub temporary: bool,
    pub message_count: u64,
    pub consumer_count: u64,
    pub delivering_count: u64,
}

#[derive(Clone, Debug, Default)]
pub struct QueueMap {
    by_name: OrdMap<String, QueueInfo>,
    /// Address → the names of the queues in `by_name` bound to it.
    by_address: OrdMap<String, OrdSet<String>>,
}

/// Two maps are equal when they hold the same queues (the index follows from them).
impl PartialEq for QueueMap {
    fn eq(&self, other: &Self) -> bool {
        self.by_name == other.by_name
    }
}

impl QueueMap {
    pub fn insert(&mut self, name: String, queue: QueueInfo) -> Option<QueueInfo> {
        let address = queue.address.clone();
        let old = self.by_name.insert(name.clone(), queue);
        if let Some(moved_from) = old.as_ref().filter(|o| o.address != address) {
            self.unindex(&moved_from.address, &name);
        }
        self.by_address.entry(address).or_default().insert(name);
        old
    }

    pub fn remove(&mut self, name: &str) -> Option<QueueInfo> {
        let old = self.by_name.remove(name)?;
        self.unindex(&old.address, name);
        Some(old)
    }

    /// Change one queue in place (its address too: the index follows).
    pub fn update(&mut self, name: &str, change: impl FnOnce(&mut QueueInfo)) {
        if let Some(mut q) = self.by_name.get(name).cloned() {
            change(&mut q);
            self.insert(name.to_string(), q);
        }
    }

    fn unindex(&mut self, address: &str, name: &str) {
        let emptied = self.by_address.get_mut(address).is_some_and(|names| {
            names.remove(name);
            names.is_empty()
        });
        if emptied {
            self.by_address.remove(address);
        }
    }

    pub fn get(&self, name: &str) -> Option<&QueueInfo> {
        self.by_name.get(name)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn values(&self) -> impl Iterator<Item = &QueueInfo> {
        self.by_name.values()
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.by_name.keys()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &QueueInfo)> {
        self.by_name.iter()
    }

    /// The queues by name, for a diff against another snapshot (shared subtrees skipped).
    pub fn by_name(&self) -> &OrdMap<String, QueueInfo> {
        &self.by_name
    }

    /// The names of the queues bound to `address`, in order.
    pub fn on_address(&self, address: &str) -> impl Iterator<Item = &String> {
        self.by_address
            .get(address)
            .into_iter()
            .flat_map(|names| names.iter())
    }
}

impl std::ops::Index<&str> for QueueMap {
    type Output = QueueInfo;

    fn index(&self, name: &str) -> &QueueInfo {
        &self.by_name[name]
    }
}

impl<'a> IntoIterator for &'a QueueMap {
    type Item = (&'a String, &'a QueueInfo);
    type IntoIter = imbl::ordmap::Iter<'a, String, QueueInfo, imbl::shared_ptr::DefaultSharedPtr>;

    fn into_iter(self) -> Self::IntoIter {
        self.by_name.iter()
    }
}

impl FromIterator<(String, QueueInfo)> for QueueMap {
    fn from_iter<I: IntoIterator<Item = (String, QueueInfo)>>(iter: I) -> Self {
        let mut map = QueueMap::default();
        for (name, q) in iter {
            map.insert(name, q);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, address: &str) -> QueueInfo {
        QueueInfo {
            name: name.into(),
            address: address.into(),
            ..Default::default()
        }
    }

    fn on(map: &QueueMap, address: &str) -> Vec<String> {
        map.on_address(address).cloned().collect()
    }

    #[test]
    fn the_queues_of_an_address_follow_every_insert_move_update_and_remove() {
        let mut m = QueueMap::default();
        m.insert("a1".into(), q("a1", "a"));
        m.insert("a2".into(), q("a2", "a"));
        m.insert("b1".into(), q("b1", "b"));
        assert_eq!(on(&m, "a"), ["a1", "a2"]);
        assert_eq!(on(&m, "b"), ["b1"]);
        // The same name read again on another address moves.
        m.insert("a2".into(), q("a2", "b"));
        assert_eq!(on(&m, "a"), ["a1"]);
        assert_eq!(on(&m, "b"), ["a2", "b1"]);
        m.update("a1", |x| x.address = "c".into());
        assert!(on(&m, "a").is_empty());
        assert_eq!(on(&m, "c"), ["a1"]);
        m.update("missing", |x| x.address = "c".into());
        assert_eq!(m.len(), 3, "an update of a queue not held adds nothing");
        assert_eq!(m.remove("b1").map(|x| x.name), Some("b1".into()));
        assert_eq!(on(&m, "b"), ["a2"]);
        assert!(m.remove("b1").is_none());
        m.remove("a2");
        assert!(
            m.by_address.get("b").is_none(),
            "an emptied address leaves the index"
        );
    }

    #[test]
    fn equal_by_the_queues_held_whatever_the_order_of_changes() {
        let one: QueueMap = [("x".to_string(), q("x", "a")), ("y".to_string(), q("y", "a"))]
            .into_iter()
            .collect();
        let mut other = QueueMap::default();
        other.insert("y".into(), q("y", "b"));
        other.insert("x".into(), q("x", "a"));
        assert_ne!(one, other);
        other.update("y", |x| x.address = "a".into());
        assert_eq!(one, other);
        assert_eq!(on(&other, "a"), ["x", "y"]);
    }
}
