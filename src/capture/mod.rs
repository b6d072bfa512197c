//! Capture (ADR-0062, ADR-0066): a non-exclusive divert into a ring-bounded, operator-owned
//! queue per captured address per live node, kept by one reconciler per cluster.
//!
//! - `names`: ownership is in the name (D7); escaping; Artemis wildcards.
//! - `arming`: pure — the blast radius shown before anything is installed, then armed.
//! - `plan`: pure judgement — captured addresses, what a tap lacks, orphans, refusals (D8).
//! - `pass`: one pass over one cluster — install, heal, sweep, audit, status (D6, ADR-0066 D2).
//! - `status`: what the status writers share (conditions, change test, the finalizer).
//! - `sample`: mode Sample — browse (never consume) matching queues, no tap (D3, D10).
//! - `drain::supervise`: a drain that dies is counted, shown in status and restarted with a backoff.
//! - [`run`]: the worker every replica runs (capture is not leader-only): per cluster, a pass
//!   runs only while this process holds the cluster's Postgres advisory lock, so passes never
//!   overlap and clusters spread across replicas.

pub mod arming;
pub mod connection;
pub mod counters;
pub mod drain;
pub mod loss;
pub mod outage;
pub mod pass;
pub mod plan;
pub mod reconcile;
pub mod row;
pub mod sample;
pub mod split;
pub mod status;
pub mod tls;
pub mod window;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::{reflector, watcher};

use crate::api::{ArtemisCaptureSubscription, ArtemisCluster};
use crate::controllers::{Context, key};
use crate::store::StoreError;
use crate::store::capture::{ClusterLock, PassRecord};

/// Every capture worker of an instance keeps one connection with this application_name
/// prefix: the count of them is how many replicas share the clusters. The instance is a digest
/// and the holder its process key, so the whole name fits Postgres's 63 bytes whatever the
/// instance ID and pod name (issue 50: a long instance ID cut the prefix, and no worker was
/// counted).
fn presence_prefix(instance: &str) -> String {
    format!("capture-worker {} ", crate::store::capture::name_digest(instance))
}

/// The application_name of this worker's presence connection.
fn presence_name(instance: &str, holder: &str) -> String {
    format!(
        "{}{}",
        presence_prefix(instance),
        crate::store::capture::holder_key(holder)
    )
}

/// A cluster this process serves: its lock, what it keeps between passes, and its drains
/// (they run only where the cluster's lock is held).
struct Served {
    lock: ClusterLock,
    state: pass::ClusterState,
    /// Per subscription: one rate cap shared by all its drains (ADR-0062 D9).
    caps: BTreeMap<String, Arc<std::sync::Mutex<drain::RateCap>>>,
    /// When retention last ran for this cluster (it runs every RETENTION_PASSES passes).
    retained_at: Option<std::time::Instant>,
    /// Since when Postgres could not be reached (the lock's session lost and not re-taken).
    store_lost: Option<chrono::DateTime<chrono::Utc>>,
}

impl Served {
    async fn stop_drains(&mut self) {
        let all = std::mem::take(&mut *self.state.drains.lock().await);
        futures::future::join_all(all.into_values().map(|d| d.stop(DRAIN_GRACE))).await;
    }

    async fn release(mut self) {
        self.stop_drains().await;
        self.lock.release().await;
    }

    /// Start the drains the pass asks for, stop the others (a removed tap, a node no longer
    /// live, an endpoint that changed); restart the ones that died, each after its backoff
    /// (`supervise`). The drains started now, for the report to wait on.
    async fn converge_drains(
        &mut self,
        ctx: &Context,
        health: &drain::DrainHealth,
        links: &connection::NodeLinks,
        targets: Vec<pass::DrainTarget>,
    ) -> Vec<drain::DrainKey> {
        let wanted: BTreeMap<drain::DrainKey, pass::DrainTarget> =
            targets.into_iter().map(|t| (t.key.clone(), t)).collect();
        // Issue 42: the lock is held for the map only, never across a stop or the database.
        let (mut dead, stale, missing) = {
            let mut drains = self.state.drains.lock().await;
            let dead = drain::supervise::take_ended(&mut drains).await;
            let stale_keys: Vec<drain::DrainKey> = drains
                .iter()
                .filter(|(k, h)| wanted.get(*k).is_none_or(|t| t.link != h.link || t.fresh_queue))
                .map(|(k, _)| k.clone())
                .collect();
            let stale: Vec<drain::DrainHandle> = stale_keys.iter().filter_map(|k| drains.remove(k)).collect();
            let missing: Vec<(drain::DrainKey, pass::DrainTarget)> = wanted
                .iter()
                .filter(|(k, _)| !drains.contains_key(*k))
                .map(|(k, t)| (k.clone(), t.clone()))
                .collect();
            (dead, stale, missing)
        };
        // A drain that died and is no longer wanted is not restarted: nothing runs there now.
        for k in dead.keys().filter(|k| !wanted.contains_key(*k)) {
            health.forget(k);
        }
        // Stopped together: one grace for all of them, not one each.
        futures::future::join_all(stale.into_iter().map(|h| h.stop(DRAIN_GRACE))).await;
        for t in wanted.values() {
            rate_cap(&mut self.caps, t);
        }
        let mut keys: BTreeMap<String, Option<crate::store::captured::SubscriptionKey>> = BTreeMap::new();
        let mut started = vec![];
        let mut spawned = vec![];
        for (k, t) in missing {
            let subscription = match keys.get(&t.tap.subscription) {
                Some(known) => known.clone(),
                None => {
                    let found = ctx.store.subscription_key(&k.cluster, &t.tap.subscription).await;
                    if let Err(e) = &found {
                        tracing::warn!(error = %e, "capture: cannot register the subscription; its drains not started");
                    }
                    let found = found.ok();
                    keys.insert(t.tap.subscription.clone(), found.clone());
                    found
                }
            };
            let Some(subscription) = subscription else {
                continue;
            };
            let restart = drain::supervise::restart_of(health, &k, &t.tap.subscription, dead.remove(&k));
            let spec = drain::DrainSpec {
                key: k.clone(),
                tap: t.tap.clone(),
                subscription,
                link: t.link.clone(),
                max_body_bytes: t.max_body_bytes,
                rate_cap: rate_cap(&mut self.caps, &t),
                metrics: ctx.metrics.capture.clone(),
                link_name: format!("{}-{}", t.tap.capture_queue(), uuid::Uuid::new_v4().simple()),
            };
            if restart.wait.is_zero() {
                started.push(k.clone());
            }
            spawned.push((
                k,
                drain::spawn(ctx.store.clone(), health.clone(), links.clone(), spec, restart),
            ));
        }
        self.state.drains.lock().await.extend(spawned);
        started
    }
}

/// The subscription's rate cap, shared by all its drains, at its spec's rate now.
fn rate_cap(
    caps: &mut BTreeMap<String, Arc<std::sync::Mutex<drain::RateCap>>>,
    t: &pass::DrainTarget,
) -> Arc<std::sync::Mutex<drain::RateCap>> {
    let cap = caps
        .entry(t.tap.subscription.clone())
        .or_insert_with(|| {
            Arc::new(std::sync::Mutex::new(drain::RateCap::new(
                t.max_ingest_per_second,
            )))
        })
        .clone();
    if let Ok(mut c) = cap.lock() {
        c.set_rate(t.max_ingest_per_second);
    }
    cap
}

/// How long the worker waits on Postgres for what it reads outside a pass.
const STORE_CHECK: Duration = Duration::from_secs(2);

/// Why a cluster's lock could not be taken again: Postgres failed, or did not answer in time.
#[derive(Debug, thiserror::Error)]
enum RetakeError {
    #[error("{0}")]
    Store(#[source] StoreError),
    #[error("no answer within {}s", .within.as_secs())]
    NoAnswer { within: Duration },
}

/// Take a cluster's lock again after its session was lost: Some when taken, None when another
/// process holds it, Err when Postgres cannot be reached (or not in time).
async fn retake(ctx: &Context, cluster_key: &str, holder: &str) -> Result<Option<ClusterLock>, RetakeError> {
    match tokio::time::timeout(
        STORE_CHECK,
        ClusterLock::try_acquire(&ctx.store, &ctx.instance_id, cluster_key, holder),
    )
    .await
    {
        Ok(Ok(lock)) => Ok(lock),
        Ok(Err(e)) => Err(RetakeError::Store(e)),
        Err(_) => Err(RetakeError::NoAnswer { within: STORE_CHECK }),
    }
}

/// Before a pass: whether this process still holds the cluster's lock, re-taking it at once
/// when only its session was lost. When Postgres cannot be reached (`store_lost` is set), no
/// replica can hold the lock or run a pass and nothing can be stored: the drains keep what they
/// hold, and status (in Kubernetes) says so. False with `store_lost` unset: another process
/// holds the lock now.
async fn lock_still_ours(
    ctx: &Context,
    s: &mut Served,
    cluster_key: &str,
    holder: &str,
    mine: &[Arc<ArtemisCaptureSubscription>],
    view: &pass::DrainView<'_>,
) -> bool {
    if s.lock.still_held().await {
        return true;
    }
    match retake(ctx, cluster_key, holder).await {
        Ok(Some(lock)) => {
            tracing::info!(cluster = %cluster_key, "capture: lock session lost and re-taken");
            s.lock = lock;
            s.store_lost = None;
            true
        }
        Ok(None) => {
            tracing::warn!(cluster = %cluster_key, "capture: lock connection lost; no longer serving this cluster");
            s.store_lost = None;
            false
        }
        Err(e) => {
            let since = *s.store_lost.get_or_insert_with(chrono::Utc::now);
            let cause = format!(
                "Postgres unreachable since {}: nothing can be stored ({e})",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            outage::report(ctx, cluster_key, mine, view, &cause).await;
            false
        }
    }
}

/// Retention (and making the next day's partition) runs once per this many passes.
const RETENTION_PASSES: u32 = 10;

/// How long a stopping drain may take to commit and settle the batch in hand.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// A reflector's stream, run for what it does to its store (and, for subscriptions, the wake-up).
type Feed = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// One namespace's subscriptions reflected into `writer`. Only a change that asks for a pass
/// wakes the worker (spec, arming annotation, finalizers, deletion), never capture's own status
/// writes (issue 25).
fn subscription_feed(
    api: kube::Api<ArtemisCaptureSubscription>,
    writer: reflector::store::Writer<ArtemisCaptureSubscription>,
    changed: Arc<tokio::sync::Notify>,
    failures: Arc<crate::backoff::WatchFailures>,
) -> Feed {
    let mut changes = crate::controllers::feed::Changes::default();
    Box::pin(
        reflector::reflector(writer, crate::backoff::watched(api)).for_each(move |r| {
            failures.saw("ArtemisCaptureSubscription", &r);
            let asks = match r {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => changes.asks_for_reconcile(&o),
                Ok(watcher::Event::Delete(o)) => {
                    changes.forget(&o);
                    true
                }
                Ok(watcher::Event::InitDone) => true,
                Ok(watcher::Event::Init) => false,
                Err(_) => false,
            };
            if asks {
                changed.notify_one();
            }
            futures::future::ready(())
        }),
    )
}

/// Run capture until shutdown: reflectors of subscriptions and clusters (every replica), and a
/// pass per served cluster every `ctx.capture_pass_interval`, or soon after a subscription
/// changes; and this process's audit heartbeat, until it exits (it never returns).
///
/// The subscription watch keeps the Context's subscription cache (`sub_writers`, from
/// `Reflectors::take_subscriptions`), which the controllers read too: one watch of the kind
/// per process. Clusters are watched here as well as by the controllers: a standby runs capture
/// without them, and their cluster watch feeds reconciles only the leader runs (clusters are
/// few; a second watch of them is cheap).
pub async fn run(ctx: Arc<Context>, sub_writers: Vec<reflector::store::Writer<ArtemisCaptureSubscription>>) {
    let subs: Vec<_> = (0..sub_writers.len())
        .filter_map(|i| ctx.caches.subscriptions.store(i))
        .collect();
    let (clusters, cluster_writers): (Vec<_>, Vec<_>) =
        ctx.namespaces.scopes().iter().map(|_| reflector::store()).unzip();
    let changed = Arc::new(tokio::sync::Notify::new());
    let mut streams: Vec<Feed> = vec![];
    // One log streak per kind, over its namespaces' watches.
    let sub_failures = Arc::new(crate::backoff::WatchFailures::default());
    let cluster_failures = Arc::new(crate::backoff::WatchFailures::default());
    for (api, writer) in ctx
        .namespaces
        .apis::<ArtemisCaptureSubscription>(&ctx.client)
        .into_iter()
        .zip(sub_writers)
    {
        streams.push(subscription_feed(
            api,
            writer,
            changed.clone(),
            sub_failures.clone(),
        ));
    }
    for (api, writer) in ctx
        .namespaces
        .apis::<ArtemisCluster>(&ctx.client)
        .into_iter()
        .zip(cluster_writers)
    {
        let failures = cluster_failures.clone();
        streams.push(Box::pin(
            reflector::reflector(writer, crate::backoff::watched(api)).for_each(move |r| {
                failures.saw("ArtemisCluster (capture)", &r);
                futures::future::ready(())
            }),
        ));
    }
    let reflect = futures::future::join_all(streams);
    let work = async {
        // Never judge orphans on a partial view: wait until both caches have listed.
        for s in subs.iter() {
            let _ = s.wait_until_ready().await;
        }
        for c in clusters.iter() {
            let _ = c.wait_until_ready().await;
        }
        worker(ctx.clone(), subs, clusters, changed).await
    };
    // Every replica runs capture, and a replica serving it writes audit rows: this process
    // heartbeats (issue 50), whether or not it leads, until it exits — through the shutdown
    // grace too, while the leader's in-flight commands complete their rows.
    let beat = crate::controllers::heartbeat(ctx.clone());
    tokio::pin!(beat);
    tokio::select! {
        _ = reflect => {}
        _ = work => {}
        _ = &mut beat => {}
        _ = ctx.shutdown.requested() => {}
    }
    beat.await
}

/// Retention per subscription (by age and by size), by dropping whole day partitions; and the
/// next day's partition made ahead.
async fn retention(ctx: &Context, cluster_key: &str, subs: &[Arc<ArtemisCaptureSubscription>]) {
    for s in subs.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        let result = async {
            let key = ctx.store.subscription_key(cluster_key, &s.name_any()).await?;
            ctx.store.ensure_partitions(&key).await?;
            let r = &s.spec.retention;
            ctx.store
                .enforce_retention(&key, chrono::Duration::hours(r.max_age_hours.into()), r.max_bytes)
                .await
        }
        .await;
        match result {
            Ok(dropped) if !dropped.is_empty() => {
                tracing::info!(subscription = %s.name_any(), ?dropped, "capture retention dropped partitions")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(subscription = %s.name_any(), error = %e, "capture retention not enforced this pass")
            }
        }
    }
}

/// A subscription being deleted whose ArtemisCluster is gone gets no pass (only a cluster this
/// process can reach is served), so its finalizer waits for the cluster to come back. In a
/// namespace being deleted (a GitOps prune of the whole namespace deletes the cluster, which has
/// no finalizer, with the subscription) it never can: the finalizer is released and the taps
/// still recorded are left on the brokers (bounded rings, ADR-0062 D2), with a warning naming
/// them. Elsewhere the subscription keeps waiting for its cluster, as before.
async fn release_orphaned_in_deleted_namespaces(
    ctx: &Context,
    subs: &[Arc<ArtemisCaptureSubscription>],
    clusters: &BTreeMap<String, Arc<ArtemisCluster>>,
) {
    for s in subs {
        let ns = s.namespace().unwrap_or_default();
        if s.metadata.deletion_timestamp.is_none()
            || !s
                .finalizers()
                .iter()
                .any(|f| f == crate::api::capture::CAPTURE_FINALIZER)
            || clusters.contains_key(&key(&ns, &s.spec.cluster_ref.name))
            || !crate::controllers::namespace_being_deleted(&ctx.client, &ns).await
        {
            continue;
        }
        let taps = s.status.as_ref().map_or(0, |st| st.tap_counts.total());
        tracing::warn!(
            subscription = %key(&ns, &s.name_any()),
            taps,
            "capture: ArtemisCluster {} is gone and namespace {ns} is being deleted: finalizer released, its taps are left on the brokers",
            s.spec.cluster_ref.name
        );
        if let Err(e) = status::set_finalizer(&ctx.client, s, false).await {
            tracing::warn!(subscription = %s.name_any(), error = %e, "capture: cannot release the finalizer");
        }
    }
}

/// The least time without a round of passes after which the capture worker counts as stuck.
const STUCK_AFTER_AT_LEAST: std::time::Duration = std::time::Duration::from_secs(300);

async fn worker(
    ctx: Arc<Context>,
    subs: Vec<reflector::Store<ArtemisCaptureSubscription>>,
    clusters: Vec<reflector::Store<ArtemisCluster>>,
    changed: Arc<tokio::sync::Notify>,
) {
    let mut w = Worker {
        holder: ctx.process_id.clone(),
        links: connection::NodeLinks::new(&ctx.instance_id),
        ctx,
        subs,
        clusters,
        health: drain::DrainHealth::default(),
        presence: None,
        served: BTreeMap::new(),
    };
    // Idle drains' coverage is confirmed together, beside the passes.
    let beat = drain::confirm_coverage(w.ctx.store.clone(), w.health.clone(), w.ctx.process_id.clone());
    // A round over every served cluster beats; one stuck far past its interval fails /healthz.
    let stuck_after = (w.ctx.capture_pass_interval * 10).max(STUCK_AFTER_AT_LEAST);
    w.ctx.supervisor.expect_beats("capture", stuck_after);
    let passes = async move {
        loop {
            w.ctx.supervisor.beat("capture");
            w.ensure_presence().await;
            let all_subs = w.all_subs();
            let all_clusters: BTreeMap<String, Arc<ArtemisCluster>> = w
                .clusters
                .iter()
                .flat_map(|s| s.state())
                .map(|c| (key(&c.namespace().unwrap_or_default(), &c.name_any()), c))
                .collect();
            let (wanted, workers) = w.wanted(&all_subs, &all_clusters).await;
            for gone in w
                .served
                .keys()
                .filter(|c| !wanted.contains(*c))
                .cloned()
                .collect::<Vec<_>>()
            {
                if let Some(s) = w.served.remove(&gone) {
                    s.release().await;
                }
            }
            let fair = wanted.len().div_ceil(workers);
            for cluster_key in &wanted {
                let Some(cluster) = all_clusters.get(cluster_key) else {
                    continue;
                };
                // Issue 46: a pass counts as work of its cluster, which is not released under it.
                let Some(_work) = w.ctx.holdings.enter(cluster_key) else {
                    continue;
                };
                if w.take_on(cluster_key, fair).await {
                    w.serve(cluster_key, cluster, &all_subs, &all_clusters).await;
                }
            }
            // More than a fair share (another replica joined): hand one cluster over.
            if w.served.len() > fair
                && let Some(k) = w.served.keys().next_back().cloned()
                && let Some(s) = w.served.remove(&k)
            {
                tracing::info!(cluster = %k, "capture: releasing this cluster to another replica");
                s.release().await;
            }
            w.sample_until_next_pass(&changed).await;
        }
    };
    tokio::select! {
        _ = beat => {}
        _ = passes => {}
    }
}

/// One capture worker's state between passes: its presence in Postgres, its drains' health,
/// and the clusters it serves (under their advisory locks).
struct Worker {
    ctx: Arc<Context>,
    subs: Vec<reflector::Store<ArtemisCaptureSubscription>>,
    clusters: Vec<reflector::Store<ArtemisCluster>>,
    holder: String,
    health: drain::DrainHealth,
    /// One AMQP connection per node for all the drains there.
    links: connection::NodeLinks,
    /// Presence: this process counts as one capture worker for as long as it lives.
    presence: Option<sqlx::PgConnection>,
    served: BTreeMap<String, Served>,
}

impl Worker {
    async fn ensure_presence(&mut self) {
        if self.presence.is_some() {
            return;
        }
        let name = presence_name(&self.ctx.instance_id, &self.holder);
        self.presence = self
            .ctx
            .store
            .dedicated_connection(&name)
            .await
            .map_err(|e| tracing::warn!(error = %e, "capture: no presence connection to Postgres"))
            .ok();
    }

    fn all_subs(&self) -> Vec<Arc<ArtemisCaptureSubscription>> {
        self.subs.iter().flat_map(|s| s.state()).collect()
    }

    /// The clusters to serve (a subscription names it, or one of our taps is still open there)
    /// that this process can reach, and how many capture workers share them.
    async fn wanted(
        &self,
        all_subs: &[Arc<ArtemisCaptureSubscription>],
        all_clusters: &BTreeMap<String, Arc<ArtemisCluster>>,
    ) -> (BTreeSet<String>, usize) {
        let ctx = &self.ctx;
        let mut wanted: BTreeSet<String> = all_subs
            .iter()
            .map(|s| key(&s.namespace().unwrap_or_default(), &s.spec.cluster_ref.name))
            .collect();
        // Both bounded, and together: while Postgres is away a pooled query waits for a
        // connection up to the pool's acquire timeout, and the served clusters' status must
        // not wait with it.
        let prefix = presence_prefix(&ctx.instance_id);
        let (open, workers) = tokio::join!(
            tokio::time::timeout(STORE_CHECK, ctx.store.clusters_with_open_taps(&ctx.instance_id)),
            tokio::time::timeout(STORE_CHECK, ctx.store.count_connections_named(&prefix)),
        );
        match open {
            Ok(Ok(c)) => wanted.extend(c),
            Ok(Err(e)) => tracing::warn!(error = %e, "capture: cannot read capture_tap"),
            Err(_) => tracing::warn!("capture: capture_tap not readable in time"),
        }
        let workers = workers.ok().and_then(Result::ok).unwrap_or(1).max(1) as usize;
        // Sharded (issue 46): the clusters this replica holds are its share, all of them.
        let workers = if ctx.holdings.is_sharded() { 1 } else { workers };
        release_orphaned_in_deleted_namespaces(ctx, all_subs, all_clusters).await;
        for s in all_subs
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
        {
            let cluster = key(&s.namespace().unwrap_or_default(), &s.spec.cluster_ref.name);
            if !all_clusters.contains_key(&cluster)
                && let Err(e) = status::report_missing_cluster(&ctx.client, s).await
            {
                tracing::warn!(subscription = %s.name_any(), error = %e, "capture: cannot write status");
            }
        }
        // Only clusters this process can reach (the ArtemisCluster exists and is watched), and
        // holds when sharded (issue 46).
        wanted.retain(|c| all_clusters.contains_key(c) && ctx.holdings.holds(c));
        (wanted, workers)
    }

    /// Whether this process serves the cluster this pass: already, or by taking its advisory
    /// lock while under its fair share.
    async fn take_on(&mut self, cluster_key: &str, fair: usize) -> bool {
        if self.served.contains_key(cluster_key) {
            return true;
        }
        if self.served.len() >= fair {
            return false;
        }
        let ctx = &self.ctx;
        match ClusterLock::try_acquire(&ctx.store, &ctx.instance_id, cluster_key, &self.holder).await {
            Ok(Some(lock)) => {
                tracing::info!(cluster = %cluster_key, "capture: serving this cluster (advisory lock held)");
                let served = Served {
                    lock,
                    state: pass::ClusterState::default(),
                    caps: BTreeMap::new(),
                    retained_at: None,
                    store_lost: None,
                };
                self.served.insert(cluster_key.to_string(), served);
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(cluster = %cluster_key, error = %e, "capture: advisory lock unavailable");
                false
            }
        }
    }

    /// One pass on a served cluster (while its lock is still ours), its drains converged, and
    /// the pass recorded.
    async fn serve(
        &mut self,
        cluster_key: &str,
        cluster: &ArtemisCluster,
        all_subs: &[Arc<ArtemisCaptureSubscription>],
        all_clusters: &BTreeMap<String, Arc<ArtemisCluster>>,
    ) {
        let ctx = self.ctx.clone();
        let Some(s) = self.served.get_mut(cluster_key) else {
            return;
        };
        let mine: Vec<Arc<ArtemisCaptureSubscription>> = of_cluster(all_subs, cluster_key);
        let view = pass::DrainView {
            health: &self.health,
            within: ctx.capture_pass_interval * 3 + Duration::from_secs(5),
        };
        if !lock_still_ours(&ctx, s, cluster_key, &self.holder, &mine, &view).await {
            if s.store_lost.is_none()
                && let Some(mut s) = self.served.remove(cluster_key)
            {
                // The lock is gone: another replica serves the cluster now.
                s.stop_drains().await;
            }
            return;
        }
        let started = chrono::Utc::now();
        // Every subscription's loss counters exist (at 0) before a pass can count a loss.
        let names: Vec<String> = mine.iter().map(|s| s.name_any()).collect();
        ctx.metrics
            .capture
            .subscriptions(cluster_key, names.iter().map(String::as_str));
        let elsewhere = pass::claimed_elsewhere(&ctx, cluster_key, cluster, all_subs, all_clusters);
        let mut outcome = pass::run(&ctx, &s.state, cluster, &mine, &self.holder, &view, &elsewhere).await;
        let mut judgement = None;
        if let Ok(p) = &mut outcome {
            let started = s
                .converge_drains(&ctx, &self.health, &self.links, std::mem::take(&mut p.drains))
                .await;
            judgement = p.judgement.take().map(|j| (j, started));
            // Retention works on whole day partitions: every RETENTION_PASSES passes is
            // plenty, and keeps DDL off the busy path.
            if s.retained_at
                .is_none_or(|t| t.elapsed() >= ctx.capture_pass_interval * RETENTION_PASSES)
            {
                retention(&ctx, cluster_key, &mine).await;
                s.retained_at = Some(std::time::Instant::now());
            }
        }
        if let Some((j, drains)) = judgement
            && let Err(e) = pass::report(&ctx, &s.state, &mine, j, &view, &drains).await
        {
            outcome = Err(e);
        }
        record_pass(&ctx, cluster_key, &self.holder, started, &outcome, &mine, &view).await;
    }

    /// Until the next pass: the samples that fall due (mode Sample), under the same locks; a
    /// change to a subscription or cluster ends the wait (a burst settles into one pass).
    async fn sample_until_next_pass(&mut self, changed: &tokio::sync::Notify) {
        let next_pass = tokio::time::Instant::now() + self.ctx.capture_pass_interval;
        loop {
            let all_subs = self.all_subs();
            let mut wake = next_pass;
            for (cluster_key, s) in &self.served {
                let mine = of_cluster(&all_subs, cluster_key);
                if let Some(due) = sample::next_due(&s.state.sample, &mine).await {
                    wake = wake.min(tokio::time::Instant::from_std(due));
                }
            }
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = changed.notified() => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    return;
                }
            }
            if tokio::time::Instant::now() >= next_pass {
                return;
            }
            for (cluster_key, s) in self.served.iter_mut() {
                let mine = of_cluster(&all_subs, cluster_key);
                if mine.iter().any(|x| sample::is_sampling(x)) && s.lock.still_held().await {
                    sample::sample_due(&self.ctx, &s.state.sample, cluster_key, &mine).await;
                }
            }
        }
    }
}

/// A pass's metric and its row in `capture_pass`; a pass that could not use Postgres still
/// reports what the drains know in status.
async fn record_pass(
    ctx: &Context,
    cluster_key: &str,
    holder: &str,
    started: chrono::DateTime<chrono::Utc>,
    outcome: &Result<pass::PassSummary, pass::PassError>,
    mine: &[Arc<ArtemisCaptureSubscription>],
    view: &pass::DrainView<'_>,
) {
    let budget = pass::budget(ctx.capture_pass_interval);
    let took = (chrono::Utc::now() - started).to_std().unwrap_or_default();
    if took > budget {
        tracing::warn!(cluster = %cluster_key, took_ms = took.as_millis() as u64, budget_ms = budget.as_millis() as u64, "capture pass over its time budget");
    }
    let (commands, deferred, result) = match outcome {
        Ok(p) => (p.commands, p.deferred, "ok".to_string()),
        Err(e) => {
            tracing::warn!(cluster = %cluster_key, error = %e, "capture pass failed");
            if let pass::PassError::Store(store) = e {
                let cause = format!("the capture pass cannot use Postgres: {store}");
                outage::report(ctx, cluster_key, mine, view, &cause).await;
            }
            (0, 0, format!("failed: {e}"))
        }
    };
    let labels = crate::telemetry::CapturePassLabels {
        result: if outcome.is_ok() { "ok" } else { "failed" }.into(),
    };
    ctx.metrics.capture_passes.get_or_create(&labels).inc();
    let row = PassRecord {
        cluster: cluster_key,
        instance_id: &ctx.instance_id,
        holder,
        started_at: started,
        commands,
        result: &result,
        budget_ms: i32::try_from(budget.as_millis()).unwrap_or(i32::MAX),
        deferred,
    };
    if let Err(e) = ctx.store.record_pass(&row).await {
        tracing::warn!(cluster = %cluster_key, error = %e, "capture: cannot record the pass");
    }
}

/// The subscriptions that name this cluster (`namespace/name`).
fn of_cluster(
    all: &[Arc<ArtemisCaptureSubscription>],
    cluster_key: &str,
) -> Vec<Arc<ArtemisCaptureSubscription>> {
    all.iter()
        .filter(|x| key(&x.namespace().unwrap_or_default(), &x.spec.cluster_ref.name) == cluster_key)
        .cloned()
        .collect()
}

#[cfg(test)]
mod presence_tests {
    use super::{presence_name, presence_prefix};

    #[test]
    fn a_worker_is_counted_by_its_prefix_whatever_the_instance_id_and_pod_name() {
        let holder = format!("{}/0f8e4c2a9b7d4e6f8a1b3c5d7e9f0a2b", "p".repeat(63));
        for instance in ["prod", &"i".repeat(200)] {
            let name = presence_name(instance, &holder);
            assert!(
                name.len() <= crate::store::capture::APPLICATION_NAME_MAX,
                "{name}"
            );
            assert!(name.starts_with(&presence_prefix(instance)), "{name}");
            assert!(name.ends_with("0f8e4c2a9b7d4e6f8a1b3c5d7e9f0a2b"), "{name}");
        }
        assert_ne!(presence_prefix("prod"), presence_prefix("staging"));
    }
}
