//! Dependents: the objects of an ArtemisCluster that a change of its brokers concerns (found
//! through each kind's index of the broker names its plan looks at), and triggering them. Read
//! from the caches alone, so the cluster runtime's inline poll can announce a change without
//! importing the pipeline (issue 43: no import cycle).

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::{Resource, ResourceExt};

use super::{Cache, Context, OfCluster, key};

/// Trigger every object of this ArtemisCluster that the change concerns (reconcile_on), but
/// `except` (the uid of the object whose write made the change, if any).
pub fn trigger_dependents(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    change: &crate::topology::TopologyChange,
    except: Option<&str>,
) {
    let queues = dependents(&ctx.caches.queues, ns, cluster, change, except);
    let diverts = dependents(&ctx.caches.diverts, ns, cluster, change, except);
    tracing::debug!(cluster = %key(ns, cluster), queues = queues.len(), diverts = diverts.len(), ?change, "topology changed");
    for q in queues {
        let _ = ctx.triggers.queues.send(q);
    }
    for d in diverts {
        let _ = ctx.triggers.diverts.send(d);
    }
}

/// The object names this ArtemisCluster (namespace and name).
pub fn of_cluster<K: OfCluster>(o: &K, ns: &str, cluster: &str) -> bool {
    o.cluster_key() == key(ns, cluster)
}

fn dependents<K: Resource<DynamicType = ()> + OfCluster + Clone + 'static>(
    cache: &Cache<K>,
    ns: &str,
    cluster: &str,
    change: &crate::topology::TopologyChange,
    except: Option<&str>,
) -> Vec<kube::runtime::reflector::ObjectRef<K>> {
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
    forget_node_backoff(ctx, &ctx.caches.queues, ns, cluster);
    forget_node_backoff(ctx, &ctx.caches.diverts, ns, cluster);
    // Issue 41: the queues a returned node still lacks go to the head of the line, not behind
    // every object's pass that only reports what the catch-up did.
    for o in ctx
        .caches
        .queues
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

fn forget_node_backoff<K: Resource<DynamicType = ()> + OfCluster + Clone + 'static>(
    ctx: &Context,
    cache: &Cache<K>,
    ns: &str,
    cluster: &str,
) {
    for o in cache
        .state()
        .iter()
        .filter(|o| of_cluster(o.as_ref(), ns, cluster))
    {
        ctx.backoff
            .reset(&format!("{}/nodes", o.uid().unwrap_or_default()));
    }
}
