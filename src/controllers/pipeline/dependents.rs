//! dependents: the objects of an ArtemisCluster that a change of its brokers concerns (found
//! through each kind's index of the broker names its plan looks at), and triggering them.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::{Resource, ResourceExt};

use super::TopologyObject;
use crate::controllers::{Context, key};

/// Trigger every object of this ArtemisCluster that the change concerns (reconcile_on), but
/// `except` (the uid of the object whose write made the change, if any).
pub fn trigger_dependents(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    change: &crate::topology::TopologyChange,
    except: Option<&str>,
) {
    let queues = dependents::<crate::api::ArtemisQueue>(ctx, ns, cluster, change, except);
    let diverts = dependents::<crate::api::ArtemisDivert>(ctx, ns, cluster, change, except);
    tracing::debug!(cluster = %key(ns, cluster), queues = queues.len(), diverts = diverts.len(), ?change, "topology changed");
    for q in queues {
        let _ = ctx.triggers.queues.send(q);
    }
    for d in diverts {
        let _ = ctx.triggers.diverts.send(d);
    }
}

fn dependents<K: TopologyObject>(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    change: &crate::topology::TopologyChange,
    except: Option<&str>,
) -> Vec<kube::runtime::reflector::ObjectRef<K>> {
    let cache = K::cache(ctx);
    let concerned: Vec<Arc<K>> = if change.everything {
        cache.state()
    } else {
        // One lookup per changed name: a command's write changes one or two, and the cost of
        // finding who they concern must not grow with the kind's size (issue 23).
        let keys: std::collections::BTreeSet<(String, String)> = change
            .keys()
            .iter()
            .flat_map(|k| cache.touched.claimants(k))
            .collect();
        keys.iter().filter_map(|(ns, name)| cache.get(ns, name)).collect()
    };
    concerned
        .iter()
        .filter(|o| except.is_none() || o.meta().uid.as_deref() != except)
        .filter(|o| of_cluster(o.as_ref(), ns, cluster))
        .map(|o| kube::runtime::reflector::ObjectRef::from_obj(o.as_ref()))
        .collect()
}

/// After a cluster's credentials or trust roots changed, or a node came back: every dependent
/// is retried now (its failed nodes' backoff is forgotten: they may have failed for the old
/// credentials, or while the node was away). The ArtemisQueues of `queues_first` (uids) are
/// triggered before the rest.
pub fn retry_dependents_now(ctx: &Context, ns: &str, cluster: &str, queues_first: &BTreeSet<String>) {
    forget_node_backoff::<crate::api::ArtemisQueue>(ctx, ns, cluster);
    forget_node_backoff::<crate::api::ArtemisDivert>(ctx, ns, cluster);
    // Issue 41: the queues a returned node still lacks go to the head of the line, not behind
    // every object's pass that only reports what the catch-up did.
    let cache = crate::api::ArtemisQueue::cache(ctx);
    for o in cache
        .state()
        .iter()
        .filter(|o| o.meta().uid.as_ref().is_some_and(|u| queues_first.contains(u)))
    {
        let _ = ctx
            .triggers
            .queues
            .send(kube::runtime::reflector::ObjectRef::from_obj(o.as_ref()));
    }
    trigger_dependents(
        ctx,
        ns,
        cluster,
        &crate::topology::TopologyChange::everything(),
        None,
    );
}

fn forget_node_backoff<K: TopologyObject>(ctx: &Context, ns: &str, cluster: &str) {
    for o in K::cache(ctx)
        .state()
        .iter()
        .filter(|o| of_cluster(o.as_ref(), ns, cluster))
    {
        ctx.backoff
            .reset(&format!("{}/nodes", o.uid().unwrap_or_default()));
    }
}

/// The object names this ArtemisCluster (namespace and name).
pub(in crate::controllers) fn of_cluster<K: TopologyObject>(o: &K, ns: &str, cluster: &str) -> bool {
    o.namespace().as_deref() == Some(ns) && o.cluster_ref().name == cluster
}

/// The index keys of what an object's plan looks at (none for a spec that does not validate:
/// it plans nothing).
pub fn touch_keys_of<K: TopologyObject>(o: &K) -> Vec<String> {
    o.desired().map(|d| K::touch_keys(&d)).unwrap_or_default()
}
