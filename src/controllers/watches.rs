//! The watches that keep the caches (one per kind and scope, shared by cache and controller):
//! the indexes they keep, the Secret watch
//! that re-reads a cluster's access, and what a deleted cluster takes with it.

use std::sync::Arc;

use kube::runtime::reflector;
use kube::{Api, Resource};

use super::{
    Cache, Context, SecretMeta, Source, Watched, claims, cluster, feed, keep_spec_writer, key, pipeline,
};
use crate::api::{ArtemisCluster, ArtemisDivert, ArtemisQueue};

/// Each kind's watches (the one watch per kind and scope that caches and controllers share).
pub(super) struct Watches {
    pub(super) clusters: Vec<Watch<ArtemisCluster>>,
    pub(super) queues: Vec<Watch<ArtemisQueue>>,
    pub(super) diverts: Vec<Watch<ArtemisDivert>>,
    pub(super) secrets: Vec<reflector::store::Writer<SecretMeta>>,
}

/// Every watch of every scope, feeding the caches (and through them the controllers).
pub(super) async fn reflect_all(ctx: Arc<Context>, watches: Watches) {
    use futures::future::join_all;
    let (client, ns) = (&ctx.client, &ctx.namespaces);
    let c = ns
        .apis::<ArtemisCluster>(client)
        .into_iter()
        .zip(watches.clusters)
        .map(|(a, (w, tx))| {
            let ctx = ctx.clone();
            let feed = (tx, ctx.caches.clusters.changes.clone());
            async move {
                reflect(a, w, Some(feed), None, |c: &ArtemisCluster| {
                    cluster_deleted(&ctx, c)
                })
                .await
            }
        });
    let q = reflect_topology(&ctx, watches.queues);
    let d = reflect_topology(&ctx, watches.diverts);
    let secrets = ns
        .apis::<SecretMeta>(client)
        .into_iter()
        .zip(watches.secrets)
        .map(|(a, w)| watch_secrets(ctx.clone(), a, w));
    tokio::join!(join_all(c), join_all(q), join_all(d), join_all(secrets));
}

/// The watches of a topology kind (queue, divert), one per scope: its cache, its feed and the
/// claim and dependents indexes the watch keeps.
fn reflect_topology<K: pipeline::TopologyObject>(
    ctx: &Context,
    watches: Vec<Watch<K>>,
) -> impl Iterator<Item = impl std::future::Future<Output = ()>> {
    ctx.namespaces
        .apis::<K>(&ctx.client)
        .into_iter()
        .zip(watches)
        .map(move |(a, (w, tx))| {
            let (indexes, feed) = (indexes_of::<K>(ctx), (tx, K::cache(ctx).changes.clone()));
            async move { reflect(a, w, Some(feed), Some(indexes), |_: &K| {}).await }
        })
}

/// A watch's writer and feed sender
pub(super) type Watch<K> = (reflector::store::Writer<K>, tokio::sync::mpsc::UnboundedSender<K>);

/// Each scope's watch (for the reflector) and its controller's source (the feed, over the
/// scope's store of the same cache).
pub(super) fn split_feeds<K>(
    scoped: Vec<feed::Scoped<K>>,
    cache: &Cache<K>,
) -> (Vec<Watch<K>>, Vec<Source<K>>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    scoped
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let reader = cache.store(i)?;
            Some((
                (s.writer, s.tx),
                Source::Feed {
                    changes: s.rx,
                    reader,
                },
            ))
        })
        .unzip()
}

/// An ArtemisCluster deleted: its runtime and snapshot go at once (no write uses them again),
/// and every dependent says so now instead of at its next resync.
fn cluster_deleted(ctx: &Context, c: &ArtemisCluster) {
    let (ns, name) = (
        c.metadata.namespace.clone().unwrap_or_default(),
        c.metadata.name.clone().unwrap_or_default(),
    );
    ctx.clusters.remove(&key(&ns, &name));
    ctx.topologies.remove(&key(&ns, &name));
    super::dependents::trigger_dependents(
        ctx,
        &ns,
        &name,
        &crate::topology::TopologyChange::everything(),
        None,
    );
}

/// A kind's indexes kept by its watch: what an object claims, and what its plan looks at.
struct Indexes<K> {
    claims: claims::ClaimIndex,
    claim_of: fn(&K) -> Option<String>,
    touched: claims::ClaimIndex,
    touch_keys_of: fn(&K) -> Vec<String>,
}

fn indexes_of<K: pipeline::TopologyObject>(ctx: &Context) -> Indexes<K> {
    let cache = K::cache(ctx);
    Indexes {
        claims: cache.claims.clone(),
        claim_of: pipeline::claim_of::<K>,
        touched: cache.touched.clone(),
        touch_keys_of: pipeline::touch_keys_of::<K>,
    }
}

/// A controller's feed: where the changes that ask for a reconcile go, and the kind's record of
/// what each object last asked (`Cache::changes`).
type Feed<K> = (
    tokio::sync::mpsc::UnboundedSender<K>,
    Arc<std::sync::Mutex<feed::Changes>>,
);

/// Keep one reflector cache (and its indexes) in sync until shutdown. `feed` (a kind with a controller) gets every
/// object once the cache holds it, when it asks for a reconcile (`feed::Changes`); `deleted` runs for each object the watch
/// reports deleted, after the cache has dropped it.
async fn reflect<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    feed: Option<Feed<K>>,
    indexes: Option<Indexes<K>>,
    deleted: impl Fn(&K),
) where
    K: Watched,
{
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    use kube::runtime::watcher::Event as Watched;
    let stream = crate::backoff::watched(api).modify(|o: &mut K| keep_spec_writer(o.meta_mut()));
    let failures = crate::backoff::WatchFailures::default();
    let (feed, changes) = match feed {
        Some((tx, changes)) => (Some(tx), changes),
        None => (None, Default::default()),
    };
    let relist = std::sync::Mutex::new(feed::Relist::default());
    let cached = writer.as_reader();
    let (deleted, changes, feed, indexes) = (&deleted, &changes, &feed, &indexes);
    let object = |o: &K| {
        (
            o.meta().namespace.clone().unwrap_or_default(),
            o.meta().name.clone().unwrap_or_default(),
        )
    };
    let gone = |o: &K| {
        if let Ok(mut c) = changes.lock() {
            c.forget(o);
        }
        if let Some(ix) = indexes {
            ix.claims.remove(&object(o));
            ix.touched.remove(&object(o));
        }
        deleted(o)
    };
    let (gone, relist, cached) = (&gone, &relist, &cached);
    reflector::reflector(writer, stream)
        .inspect(|r| failures.saw(K::kind(&()).as_ref(), r))
        .for_each(|r| async move {
            match r {
                Ok(Watched::Apply(o) | Watched::InitApply(o)) => {
                    if let Ok(mut l) = relist.lock() {
                        l.listed(&o);
                    }
                    if let Some(ix) = indexes {
                        ix.claims.set(object(&o), (ix.claim_of)(&o));
                        ix.touched.set_all(object(&o), (ix.touch_keys_of)(&o));
                    }
                    let asks = changes.lock().is_ok_and(|mut c| c.asks_for_reconcile(&o));
                    if let (true, Some(tx)) = (asks, feed) {
                        let _ = tx.send(o);
                    }
                }
                Ok(Watched::Delete(o)) => gone(&o),
                // A (re-)list: what the cache held and the list does not report was deleted
                // while the watch was away (no Delete event comes for it).
                Ok(Watched::Init) => {
                    if let Ok(mut l) = relist.lock() {
                        l.begin(cached.state());
                    }
                }
                Ok(Watched::InitDone) => {
                    let left = relist.lock().map(|mut l| l.gone()).unwrap_or_default();
                    left.iter().for_each(|o| gone(o));
                }
                // Errors: told by `failures`.
                Err(_) => {}
            }
        })
        .await;
}

/// Keep the Secret metadata cache in sync and trigger, at once, every cluster whose access was
/// read from a Secret that has changed since (rotated or revoked credentials, another CA).
async fn watch_secrets(
    ctx: Arc<Context>,
    api: Api<SecretMeta>,
    writer: reflector::store::Writer<SecretMeta>,
) {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    // An Api of PartialObjectMeta makes metadata-only requests: Secret data never arrives.
    let stream = crate::backoff::watched(api).modify(|o: &mut SecretMeta| o.metadata.managed_fields = None);
    let failures = crate::backoff::WatchFailures::default();
    reflector::reflector(writer, stream)
        .inspect(|r| failures.saw("Secret", r))
        .applied_objects()
        .for_each(|r| {
            let ctx = ctx.clone();
            async move {
                // An error was logged by `failures`.
                if let Ok(secret) = r {
                    trigger_clusters_of(&ctx, &secret);
                }
            }
        })
        .await;
}

/// Trigger the clusters that read this Secret and hold an access older than it.
fn trigger_clusters_of(ctx: &Context, secret: &SecretMeta) {
    let ns = secret.metadata.namespace.clone().unwrap_or_default();
    let name = secret.metadata.name.clone().unwrap_or_default();
    for c in ctx.caches.clusters.state() {
        if c.metadata.namespace.as_deref() != Some(ns.as_str())
            || !cluster::secret_names(&c.spec).contains(&name)
        {
            continue;
        }
        let cluster_name = c.metadata.name.clone().unwrap_or_default();
        let stale = ctx.clusters.get(&key(&ns, &cluster_name)).is_none_or(|rt| {
            rt.access.secret_versions.get(&name) != secret.metadata.resource_version.as_ref()
        });
        if stale {
            let _ = ctx
                .triggers
                .clusters
                .send(reflector::ObjectRef::new(&cluster_name).within(&ns));
        }
    }
}
