//! One writer at a time per address of a cluster, in this process (ADR-0084).

use std::sync::Arc;

/// Serialises, in one process, the commands that touch one address of one cluster: a queue
/// delete (its preflight, the dependent diverts, the queue) and a divert write into or out of
/// that address never interleave, so a delete's preflight and its writes see the same state
/// (ADR-0084: no divert left forwarding into an address whose last queue is gone). Queue
/// commands hold their address alone; divert commands share theirs with other diverts (2,000
/// diverts into one queue are written side by side, never one at a time).
#[derive(Clone, Default)]
pub struct AddressLocks {
    by_address: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::RwLock<()>>>>>,
}

/// How a command holds its addresses (see [`AddressLocks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressHold {
    /// No other command on the address meanwhile (queue commands).
    Alone,
    /// Beside other shared holders, never beside one holding it alone (divert commands).
    Shared,
}

/// One address held (dropped: released).
pub enum HeldAddress {
    Alone(tokio::sync::OwnedRwLockWriteGuard<()>),
    Shared(tokio::sync::OwnedRwLockReadGuard<()>),
}

impl AddressLocks {
    /// Hold every one of these addresses of `cluster` (taken in one order: no deadlock).
    pub async fn hold(&self, cluster: &str, addresses: &[String], how: AddressHold) -> Vec<HeldAddress> {
        let mut keys: Vec<String> = addresses.iter().map(|a| format!("{cluster}\u{0}{a}")).collect();
        keys.sort();
        keys.dedup();
        let locks: Vec<Arc<tokio::sync::RwLock<()>>> = {
            let mut m = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
            // Locks nobody holds or waits for are forgotten.
            m.retain(|_, l| Arc::strong_count(l) > 1);
            keys.iter()
                .map(|k| m.entry(k.clone()).or_default().clone())
                .collect()
        };
        let mut held = Vec::with_capacity(locks.len());
        for l in locks {
            held.push(match how {
                AddressHold::Alone => HeldAddress::Alone(l.write_owned().await),
                AddressHold::Shared => HeldAddress::Shared(l.read_owned().await),
            });
        }
        held
    }
}

#[cfg(test)]
mod address_lock_tests {
    use super::{AddressHold, AddressLocks};
    use std::time::Duration;

    const ALONE: AddressHold = AddressHold::Alone;
    const SHARED: AddressHold = AddressHold::Shared;

    async fn within(
        ms: u64,
        f: impl std::future::Future<Output = Vec<super::HeldAddress>>,
    ) -> Option<Vec<super::HeldAddress>> {
        tokio::time::timeout(Duration::from_millis(ms), f).await.ok()
    }

    #[tokio::test]
    async fn one_writer_per_address_of_a_cluster() {
        let locks = AddressLocks::default();
        let held = locks.hold("ns/c", &["orders".into()], ALONE).await;
        // Another cluster's address of the same name, and another address, are free.
        let other = within(200, locks.hold("ns/d", &["orders".into()], ALONE)).await;
        assert!(other.is_some(), "another cluster's address is not held");
        let free = within(200, locks.hold("ns/c", &["invoices".into()], ALONE)).await;
        assert!(free.is_some(), "another address is not held");
        // A divert touching orders waits until the delete is done.
        let waiting = within(
            200,
            locks.hold("ns/c", &["events".into(), "orders".into()], SHARED),
        )
        .await;
        assert!(waiting.is_none(), "orders is held");
        drop(held);
        let after = within(
            2_000,
            locks.hold("ns/c", &["orders".into(), "orders".into()], ALONE),
        )
        .await;
        assert!(
            after.is_some(),
            "free once released (the same address twice is held once)"
        );
    }

    #[tokio::test]
    async fn diverts_share_an_address_that_a_queue_command_holds_alone() {
        let locks = AddressLocks::default();
        let first = locks.hold("ns/c", &["a1".into(), "sink".into()], SHARED).await;
        let second = within(200, locks.hold("ns/c", &["a2".into(), "sink".into()], SHARED)).await;
        assert!(second.is_some(), "two diverts into one queue at once");
        let queue = within(200, locks.hold("ns/c", &["sink".into()], ALONE)).await;
        assert!(queue.is_none(), "a queue command waits for the diverts");
        drop((first, second));
        let queue = locks.hold("ns/c", &["sink".into()], ALONE).await;
        let divert = within(200, locks.hold("ns/c", &["a3".into(), "sink".into()], SHARED)).await;
        assert!(divert.is_none(), "a divert waits for the queue command");
        drop(queue);
    }
}
