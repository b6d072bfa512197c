//! Which live replica holds which broker cluster: rendezvous (highest random weight) hashing
//! with bounded loads. Every replica computes it from the same inputs (the live replicas' Lease
//! identities, the ArtemisClusters' keys) and gets the same answer, with no extra component.
//!
//! Each cluster, in key order, goes to the replica of highest weight for it that has fewer than
//! ⌈clusters ÷ replicas⌉: the spread is as even as it can be (three on three is 1/1/1, four on
//! two 2/2), and a replica that comes or goes moves few clusters (those whose first choice it is,
//! and those pushed by the bound). The weight is a SHA-256 of the pair, so every build of the
//! operator agrees (a rolling upgrade runs two).

use std::collections::BTreeMap;

/// The replica each cluster is assigned to (every cluster, when there is a replica).
pub fn assign<'a>(clusters: &[&'a str], replicas: &[&'a str]) -> BTreeMap<&'a str, &'a str> {
    let mut assigned = BTreeMap::new();
    if replicas.is_empty() {
        return assigned;
    }
    let mut clusters: Vec<&str> = clusters.to_vec();
    clusters.sort_unstable();
    clusters.dedup();
    let cap = clusters.len().div_ceil(replicas.len());
    let mut load: BTreeMap<&str, usize> = replicas.iter().map(|r| (*r, 0)).collect();
    for c in clusters {
        let mut ranked: Vec<&str> = load.keys().copied().collect();
        ranked.sort_by_key(|r| std::cmp::Reverse((weight(r, c), *r)));
        if let Some(r) = ranked.into_iter().find(|r| load[r] < cap) {
            *load.entry(r).or_default() += 1;
            assigned.insert(c, r);
        }
    }
    assigned
}

/// The pair's weight: the first 8 bytes of SHA-256(replica, NUL, cluster).
fn weight(replica: &str, cluster: &str) -> u64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(replica.as_bytes());
    ctx.update(&[0]);
    ctx.update(cluster.as_bytes());
    let digest = ctx.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
}

/// A stable hex name for a cluster key (the cluster Lease's name carries it).
pub fn short_hash(key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread<'a>(a: &BTreeMap<&'a str, &'a str>) -> BTreeMap<&'a str, usize> {
        let mut s = BTreeMap::new();
        for r in a.values() {
            *s.entry(*r).or_default() += 1;
        }
        s
    }

    #[test]
    fn three_clusters_on_three_replicas_are_one_each_and_four_on_two_are_two_each() {
        let a = assign(&["ns/c", "ns/ha", "other/c"], &["r1", "r2", "r3"]);
        assert_eq!(a.len(), 3);
        assert!(spread(&a).values().all(|n| *n == 1), "{a:?}");
        let a = assign(&["a/c", "b/c", "c/c", "d/c"], &["r1", "r2"]);
        assert_eq!(
            spread(&a).values().copied().collect::<Vec<_>>(),
            vec![2, 2],
            "{a:?}"
        );
    }

    #[test]
    fn every_replica_computes_the_same_assignment_whatever_the_order_it_lists_things_in() {
        let a = assign(&["x/1", "x/2", "x/3", "x/4", "x/5"], &["r1", "r2", "r3"]);
        let b = assign(&["x/5", "x/3", "x/1", "x/4", "x/2", "x/3"], &["r3", "r1", "r2"]);
        assert_eq!(a, b);
        assert!(spread(&a).values().all(|n| *n <= 2));
    }

    #[test]
    fn one_replica_holds_everything_and_none_holds_nothing() {
        let a = assign(&["a/c", "b/c"], &["only"]);
        assert!(a.values().all(|r| *r == "only") && a.len() == 2);
        assert!(assign(&["a/c"], &[]).is_empty());
    }

    #[test]
    fn a_replica_that_goes_moves_only_its_own_clusters() {
        let clusters: Vec<String> = (0..30).map(|i| format!("ns/c{i}")).collect();
        let clusters: Vec<&str> = clusters.iter().map(String::as_str).collect();
        let before = assign(&clusters, &["r1", "r2", "r3"]);
        let after = assign(&clusters, &["r1", "r2"]);
        // With the bound, a cluster of r1 or r2 may move only to make room; most stay.
        let stayed = before
            .iter()
            .filter(|(c, r)| **r != "r3" && after.get(*c) == Some(*r))
            .count();
        let kept = before.values().filter(|r| **r != "r3").count();
        assert!(stayed * 10 >= kept * 7, "{stayed} of {kept} stayed");
        assert!(spread(&after).values().all(|n| *n == 15));
    }

    #[test]
    fn the_weight_is_the_same_in_every_build() {
        // SHA-256, not the standard library's hasher (whose output may change between Rust
        // releases): two builds of the operator during an upgrade must agree.
        // SHA-256 of "ns/c" (checked with another implementation).
        assert_eq!(short_hash("ns/c"), "82ab9080ef644892");
        assert_eq!(short_hash("ns/c").len(), 16);
        assert_ne!(weight("r1", "ns/c"), weight("r2", "ns/c"));
    }
}
