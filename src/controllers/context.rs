//! What every controller shares ([`Context`]): the watched namespaces, the watch caches (and
//! the writers behind them, [`Reflectors`]), and the status this process last wrote.

use std::sync::Arc;

use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::{Api, Client, Resource};

use super::{AddressLocks, Backoff, MANAGER, Triggers, catch_up, claims, feed, runtime, shared_read};
use crate::api::{ArtemisCaptureSubscription, ArtemisCluster, ArtemisDivert, ArtemisQueue};
use crate::store::Store;
use crate::topology::TopologyCache;
use crate::topology::access;

/// Which namespaces the operator acts in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Namespaces {
    #[default]
    All,
    /// Only these (never empty).
    Only(Vec<String>),
}

impl Namespaces {
    /// From a list of names; empty means all.
    pub fn from_list(names: Vec<String>) -> Self {
        let names: Vec<String> = names
            .into_iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            Namespaces::All
        } else {
            Namespaces::Only(names)
        }
    }

    pub fn contains(&self, ns: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::Only(list) => list.iter().any(|n| n == ns),
        }
    }

    /// One Api per watched namespace (the chart binds the operator's role only there), or one
    /// over every namespace.
    pub fn apis<K>(&self, client: &Client) -> Vec<Api<K>>
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
    {
        self.scopes()
            .iter()
            .map(|scope| scoped_api(client, scope))
            .collect()
    }

    /// One scope per controller: a namespace, or None for all.
    pub fn scopes(&self) -> Vec<Option<String>> {
        match self {
            Namespaces::All => vec![None],
            Namespaces::Only(list) => list.iter().cloned().map(Some).collect(),
        }
    }

    fn count(&self) -> usize {
        self.scopes().len()
    }
}

/// The API of one controller's scope: one namespace, or all.
pub(super) fn scoped_api<K>(client: &Client, scope: &Option<String>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
{
    match scope {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// One kind's in-memory copy: a reflector store per watched namespace.
#[derive(Clone)]
pub struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    stores: Vec<reflector::Store<K>>,
    /// Which objects claim which broker object (kinds with claims: queues, diverts).
    pub claims: claims::ClaimIndex,
    /// Which objects look at which broker names (`TopologyObject::touch_keys`): whom a change
    /// of the cluster's broker objects concerns.
    pub touched: claims::ClaimIndex,
    /// What of each object was last handed to its controller (`feed::Changes`), kept by the
    /// kind's watches and told of the operator's own finalizer writes.
    pub changes: Arc<std::sync::Mutex<feed::Changes>>,
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub(super) fn new(n: usize) -> (Self, Vec<reflector::store::Writer<K>>) {
        let (stores, writers) = (0..n).map(|_| reflector::store()).unzip();
        let (claims, touched) = (claims::ClaimIndex::default(), claims::ClaimIndex::default());
        (
            Cache {
                stores,
                claims,
                touched,
                changes: Default::default(),
            },
            writers,
        )
    }

    /// The objects that claim `claim`, from the claim index.
    pub fn claimants(&self, claim: &str) -> Vec<Arc<K>> {
        self.claims
            .claimants(claim)
            .into_iter()
            .filter_map(|(ns, name)| self.get(&ns, &name))
            .collect()
    }

    /// Every object held.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(|s| s.state()).collect()
    }

    /// One object by namespace and name.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<K>> {
        let r = reflector::ObjectRef::<K>::new(name).within(ns);
        self.stores.iter().find_map(|s| s.get(&r))
    }

    /// The store of the i-th watched scope (the order of `Namespaces::scopes`).
    pub fn store(&self, i: usize) -> Option<reflector::Store<K>> {
        self.stores.get(i).cloned()
    }

    pub(super) async fn wait_until_ready(&self) {
        for s in &self.stores {
            let _ = s.wait_until_ready().await;
        }
    }
}

/// In-memory copies of the kinds a reconcile reads besides its own object (kube-runtime
/// reflectors): conflicts, declared diverts and the cluster's existence come from here, never
/// from a LIST per reconcile.
#[derive(Clone)]
pub struct Caches {
    pub clusters: Cache<ArtemisCluster>,
    pub queues: Cache<ArtemisQueue>,
    pub diverts: Cache<ArtemisDivert>,
    /// Capture subscriptions: a queue's delete preview names the taps on its address (ADR-0084 §5).
    pub subscriptions: Cache<ArtemisCaptureSubscription>,
    /// Secrets' metadata only (never their data): a cluster's access is re-read when one of its
    /// Secrets changes.
    pub secrets: Cache<SecretMeta>,
}

/// A Secret as the operator watches it: metadata, no data.
pub type SecretMeta = kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Secret>;

/// The writers behind [`Caches`], driven by [`run_all`](super::run_all); the clusters', queues' and diverts'
/// watches also feed their controllers (`feed`). The subscriptions' writers are capture's
/// ([`Reflectors::take_subscriptions`]): capture runs in every replica, the controllers only
/// where the process leads, so capture's watch is the one that keeps the subscription cache
/// both read (one watch of the kind per process).
pub struct Reflectors {
    pub(super) clusters: Vec<feed::Scoped<ArtemisCluster>>,
    pub(super) queues: Vec<feed::Scoped<ArtemisQueue>>,
    pub(super) diverts: Vec<feed::Scoped<ArtemisDivert>>,
    subscriptions: Vec<reflector::store::Writer<ArtemisCaptureSubscription>>,
    pub(super) secrets: Vec<reflector::store::Writer<SecretMeta>>,
}

impl Reflectors {
    /// The writers of the subscription cache, one per watched scope (in `Namespaces::scopes`
    /// order), for capture's watch; taken once.
    pub fn take_subscriptions(&mut self) -> Vec<reflector::store::Writer<ArtemisCaptureSubscription>> {
        std::mem::take(&mut self.subscriptions)
    }
}

/// What every controller shares.
#[derive(Clone)]
pub struct Context {
    /// The process's long-lived tasks and their heartbeats (`/healthz` reads it).
    pub supervisor: crate::supervisor::Supervisor,
    pub client: Client,
    pub store: Store,
    pub instance_id: String,
    /// This process, uniquely (a restart is another process): what a one-shot action is armed
    /// by.
    pub process_id: String,
    pub namespaces: Namespaces,
    pub caches: Caches,
    pub topologies: TopologyCache,
    pub clusters: runtime::ClusterRegistry,
    /// Events, published off the reconcile's path (`events.rs`).
    pub events: super::events::EventSink,
    pub metrics: Arc<crate::telemetry::Metrics>,
    /// This operator's per-node broker state (budgets, batchers), counted in `metrics`.
    pub broker: Arc<crate::broker::Registry>,
    pub triggers: Triggers,
    /// Per-object retry state of failed reconciles (exponential backoff).
    pub backoff: Backoff,
    /// Once requested, the controllers take no new reconcile and end when the in-flight ones
    /// have finished (the binary requests it on SIGTERM/SIGINT).
    pub shutdown: crate::leader::Shutdown,
    /// How many reconciles of each kind run at once.
    pub concurrency: crate::cli::Concurrency,
    /// The status this process last wrote per object (newer than the cache until the watch
    /// delivers it).
    pub written: WrittenStatus,
    /// How often a served cluster gets a capture pass (also soon after a subscription changes).
    pub capture_pass_interval: std::time::Duration,
    /// One writer at a time per (cluster, address) in this process.
    pub address_locks: AddressLocks,
    /// Commands of stopped processes this process recorded as `unknown`, by object uid: the
    /// object's next command names them (`params.follows`).
    pub abandoned: Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<i64>>>>,
    /// The gate's fresh reads of each cluster's Secrets, shared by the commands that ask at the
    /// same time: each Secret's resourceVersion, or why the access is withdrawn.
    pub secret_reads: Arc<shared_read::SharedReads<SecretVersions>>,
    /// What a node that came back was sent in bulk, until each object's pass reports it.
    pub caught_up: catch_up::CaughtUp,
    /// The broker clusters this replica acts for (issue 46): every one unless sharded.
    pub holdings: crate::shards::Holdings,
}

/// What the gate before a broker write reads of a cluster's Secrets.
pub type SecretVersions = Result<std::collections::BTreeMap<String, String>, Arc<access::AccessProblem>>;

impl Context {
    /// The `unknown` rows the object's next command follows (taken: named once).
    pub fn take_abandoned(&self, uid: &str) -> Vec<i64> {
        self.abandoned
            .lock()
            .map(|mut m| m.remove(uid).unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Context {
    pub fn new(
        client: Client,
        store: Store,
        instance_id: String,
        namespaces: Namespaces,
        metrics: Arc<crate::telemetry::Metrics>,
    ) -> (Self, Reflectors) {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let n = namespaces.count();
        let (clusters, cw) = Cache::new(n);
        let (queues, qw) = Cache::new(n);
        let (diverts, dw) = Cache::new(n);
        let (subscriptions, sw) = Cache::new(n);
        let (secrets, secret_writers) = Cache::new(n);
        let process_id = format!(
            "{}/{}",
            std::env::var("POD_NAME").unwrap_or_else(|_| "local".into()),
            uuid::Uuid::new_v4().simple()
        );
        let ctx = Context {
            events: super::events::EventSink::new(
                Recorder::new(client.clone(), reporter),
                metrics.events_dropped.clone(),
            ),
            client,
            store: store.for_process(&process_id),
            instance_id,
            process_id,
            namespaces,
            caches: Caches {
                clusters,
                queues,
                diverts,
                subscriptions,
                secrets,
            },
            topologies: TopologyCache::default(),
            clusters: runtime::ClusterRegistry::default(),
            broker: crate::broker::Registry::new(metrics.jolokia.clone()),
            metrics,
            triggers: Triggers::default(),
            backoff: Backoff::default(),
            shutdown: crate::leader::Shutdown::default(),
            concurrency: crate::cli::Concurrency::default(),
            written: WrittenStatus::default(),
            capture_pass_interval: std::time::Duration::from_secs(30),
            address_locks: AddressLocks::default(),
            abandoned: Default::default(),
            secret_reads: Default::default(),
            caught_up: Default::default(),
            supervisor: Default::default(),
            holdings: crate::shards::Holdings::everything(crate::leader::replica_name(
                std::env::var("POD_NAME").ok().as_deref(),
            )),
        };
        (
            ctx,
            Reflectors {
                clusters: with_feeds(cw),
                queues: with_feeds(qw),
                diverts: with_feeds(dw),
                subscriptions: sw,
                secrets: secret_writers,
            },
        )
    }

    /// The operator acts on objects in this namespace.
    pub fn watches(&self, ns: &str) -> bool {
        self.namespaces.contains(ns)
    }
}

fn with_feeds<K>(writers: Vec<reflector::store::Writer<K>>) -> Vec<feed::Scoped<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    writers.into_iter().map(feed::Scoped::new).collect()
}

/// The last status this process wrote to each object, with the resourceVersion the write
/// produced. A reconcile that starts before the watch has delivered that write (a trigger right
/// after it) reads this instead of the cache's older status: it never plans from, or writes
/// back, a status older than its own last report.
#[derive(Clone, Default)]
pub struct WrittenStatus {
    by_uid: Arc<std::sync::Mutex<std::collections::HashMap<String, (u64, serde_json::Value)>>>,
}

impl WrittenStatus {
    pub(crate) fn record<S: serde::Serialize>(&self, meta: &kube::api::ObjectMeta, status: &S) {
        let (Some(uid), Some(rv)) = (
            meta.uid.clone(),
            meta.resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok()),
        ) else {
            return;
        };
        if let (Ok(mut m), Ok(v)) = (self.by_uid.lock(), serde_json::to_value(status)) {
            m.insert(uid, (rv, v));
        }
    }

    /// The status last written to this object, when the cached copy predates that write.
    pub fn newer_than<S: serde::de::DeserializeOwned>(&self, meta: &kube::api::ObjectMeta) -> Option<S> {
        let uid = meta.uid.as_deref()?;
        let cached = meta.resource_version.as_deref()?.parse::<u64>().ok()?;
        let m = self.by_uid.lock().ok()?;
        let (rv, v) = m.get(uid)?;
        if cached >= *rv {
            return None;
        }
        serde_json::from_value(v.clone()).ok()
    }

    pub fn forget(&self, uid: &str) {
        if let Ok(mut m) = self.by_uid.lock() {
            m.remove(uid);
        }
    }
}
