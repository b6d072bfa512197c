//! claims: of two objects claiming one broker object on one *broker* cluster (judged by node
//! IDs, not by namespace), the oldest wins; the other never writes and its delete touches
//! nothing.

use std::collections::BTreeSet;

use kube::ResourceExt;

use super::TopologyObject;
use crate::controllers::{Context, key};

/// Whether two ArtemisClusters reach the same brokers: the same object, or topologies that share
/// a broker node ID. None when one of them has no topology yet.
pub fn same_brokers(ctx: &Context, a: &str, b: &str) -> Option<bool> {
    if a == b {
        return Some(true);
    }
    let (ta, tb) = (ctx.topologies.get(a)?, ctx.topologies.get(b)?);
    let ids: BTreeSet<&str> = ta.nodes.iter().map(|n| n.node_id.as_str()).collect();
    Some(tb.nodes.iter().any(|n| ids.contains(n.node_id.as_str())))
}

/// What an object claims (None: its spec does not validate), for the claim index.
pub fn claim_of<K: TopologyObject>(o: &K) -> Option<String> {
    o.desired().ok().map(|d| K::claim(&d))
}

/// Two objects claiming one broker object on one broker cluster: the oldest wins (creation
/// time, then namespace/name). `Some(winner)` when this object is not the winner. An older
/// claimant whose cluster has no topology yet counts as a winner until it is known.
pub fn conflict_winner<K: TopologyObject>(
    ctx: &Context,
    obj: &K,
    d: &K::Desired,
    cluster_key: &str,
) -> Option<String> {
    let claim = K::claim(d);
    let order = |o: &K| {
        (
            o.meta().creation_timestamp.clone().map(|t| t.0),
            o.namespace().unwrap_or_default(),
            o.name_any(),
        )
    };
    let mine = order(obj);
    K::cache(ctx)
        .claimants(&claim)
        .iter()
        .filter(|o| o.uid() != obj.uid())
        .filter(|o| ctx.watches(&o.namespace().unwrap_or_default()))
        .filter(|o| o.desired().is_ok_and(|od| K::claim(&od) == claim))
        .filter(|o| {
            let other = key(&o.namespace().unwrap_or_default(), &o.cluster_ref().name);
            same_brokers(ctx, cluster_key, &other) != Some(false)
        })
        .filter(|o| order(o) < mine)
        .min_by_key(|o| order(o))
        .map(|w| key(&w.namespace().unwrap_or_default(), &w.name_any()))
}
