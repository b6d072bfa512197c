//! The benchmark's Kubernetes objects: an ArtemisCluster for test bed cluster "c", queues
//! created and deleted in bulk, capture subscriptions, and one watch that sees every queue's
//! state as soon as the API server has it, and a LIST once a second while a burst is served, as
//! `../shared/bench/wait_ready.py` and `delete_all.py` observe it (the load the operator is
//! judged under: at 10,000 queues one such LIST costs the API server over a second of CPU).
//!
//! The harness counts its own API requests, so the API server's totals can be reported less
//! what the harness itself asked for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;

use artemis_studio_operator::api::queue::ArtemisQueue;
use artemis_studio_operator::api::{ArtemisCaptureSubscription, ArtemisCluster};

/// The harness's own API requests (to subtract from the API server's totals).
#[derive(Default)]
pub struct HarnessRequests {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
}

impl HarnessRequests {
    pub fn read(&self, n: u64) {
        self.reads.fetch_add(n, Ordering::Relaxed);
    }
    pub fn write(&self, n: u64) {
        self.writes.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> (f64, f64) {
        (
            self.reads.load(Ordering::Relaxed) as f64,
            self.writes.load(Ordering::Relaxed) as f64,
        )
    }
}

pub struct Objects {
    pub client: Client,
    pub ns: String,
    pub harness: Arc<HarnessRequests>,
    /// Requests in flight when creating or deleting many objects.
    pub concurrency: usize,
    /// Queues are created durable (the CRD's default) or not (`Config::durable`).
    pub durable: bool,
    /// The ArtemisCluster every object here names (`c`, unless a scenario says otherwise).
    pub cluster: String,
}

/// What the watch knows of one queue.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueState {
    /// Ready=True for the current generation (observedGeneration = generation).
    pub ready: bool,
    /// First seen in that state.
    pub since: Option<Instant>,
    pub generation: i64,
    pub deleted: bool,
    /// When the watch first saw a status the operator wrote (its first status, issue 50).
    pub first_status: Option<Instant>,
}

/// Every queue of the namespace, as the watch last saw it.
#[derive(Clone)]
pub struct QueueWatch {
    states: Arc<Mutex<HashMap<String, QueueState>>>,
    changed: Arc<Notify>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

fn ready_now(q: &ArtemisQueue) -> bool {
    let generation = q.metadata.generation;
    q.status.as_ref().is_some_and(|s| {
        s.observed_generation == generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Ready=True's lastTransitionTime − creationTimestamp, whole seconds; None when not Ready or a
/// timestamp is missing.
fn ready_lag(q: &DynamicObject) -> Option<i64> {
    let created = q.metadata.creation_timestamp.as_ref()?.0.as_second();
    let conditions = q.data.get("status")?.get("conditions")?.as_array()?;
    let ready = conditions.iter().find(|c| {
        c.get("type").and_then(Value::as_str) == Some("Ready")
            && c.get("status").and_then(Value::as_str) == Some("True")
    })?;
    let since = ready.get("lastTransitionTime")?.as_str()?;
    let since = chrono::DateTime::parse_from_rfc3339(since).ok()?.timestamp();
    Some(since - created)
}

/// One LIST of the namespace's queues a second (back to back when a LIST takes longer), as the
/// shared scripts wait; stopped (and its figures taken) by `stop`.
pub struct ListObserver {
    task: tokio::task::JoinHandle<(u64, Duration)>,
    stop: Arc<Notify>,
}

impl ListObserver {
    pub fn start(o: &Objects) -> ListObserver {
        let resource = ApiResource::erase::<ArtemisQueue>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(o.client.clone(), &o.ns, &resource);
        let (stop, harness) = (Arc::new(Notify::new()), o.harness.clone());
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let (mut lists, mut spent) = (0u64, Duration::ZERO);
            loop {
                let t = Instant::now();
                harness.read(1);
                if let Err(e) = api.list(&ListParams::default()).await {
                    eprintln!("[bench] observer LIST: {e}");
                }
                lists += 1;
                spent += t.elapsed();
                let pause = Duration::from_secs(1).saturating_sub(t.elapsed());
                if tokio::time::timeout(pause, stopped.notified()).await.is_ok() {
                    return (lists, spent);
                }
            }
        });
        ListObserver { task, stop }
    }

    /// Stop; how many LISTs it made and their mean time.
    pub async fn stop(self) -> (u64, f64) {
        self.stop.notify_one();
        match self.task.await {
            Ok((n, spent)) => (n, spent.as_secs_f64() / n.max(1) as f64),
            Err(_) => (0, f64::NAN),
        }
    }
}

impl QueueWatch {
    pub fn start(o: &Objects) -> QueueWatch {
        let api: Api<ArtemisQueue> = Api::namespaced(o.client.clone(), &o.ns);
        let states: Arc<Mutex<HashMap<String, QueueState>>> = Arc::default();
        let changed = Arc::new(Notify::new());
        let (s, c, harness) = (states.clone(), changed.clone(), o.harness.clone());
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let now = Instant::now();
                let update = |q: &ArtemisQueue, deleted: bool| {
                    let Ok(mut map) = s.lock() else { return };
                    let entry = map.entry(q.name_any()).or_default();
                    let ready = !deleted && ready_now(q);
                    let generation = q.metadata.generation.unwrap_or(0);
                    let seen = q.status.as_ref().is_some_and(|s| s.observed_generation.is_some());
                    let first_status = entry.first_status.or(seen.then_some(now));
                    if ready != entry.ready || deleted != entry.deleted || generation != entry.generation {
                        *entry = QueueState {
                            ready,
                            since: Some(now),
                            generation,
                            deleted,
                            first_status,
                        };
                    }
                    entry.first_status = first_status;
                };
                match event {
                    Ok(watcher::Event::Apply(q)) | Ok(watcher::Event::InitApply(q)) => update(&q, false),
                    Ok(watcher::Event::Delete(q)) => update(&q, true),
                    Ok(watcher::Event::Init) => harness.read(1),
                    Ok(watcher::Event::InitDone) => {}
                    Err(e) => {
                        eprintln!("[bench] queue watch: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                c.notify_waiters();
            }
        });
        QueueWatch {
            states,
            changed,
            task: Arc::new(task),
        }
    }

    pub fn state(&self, name: &str) -> Option<QueueState> {
        self.states.lock().ok()?.get(name).copied()
    }

    /// How many of `names` `done` does not hold for (yet).
    pub fn pending(&self, names: &[String], done: impl Fn(&QueueState) -> bool) -> usize {
        let Ok(map) = self.states.lock() else {
            return names.len();
        };
        names.iter().filter(|n| !map.get(*n).is_some_and(&done)).count()
    }

    /// Wait until `done` holds for every name; returns the latest `since` among them (when the
    /// last one got there).
    pub async fn wait_all(
        &self,
        names: &[String],
        timeout: Duration,
        what: &str,
        done: impl Fn(&QueueState) -> bool,
    ) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            {
                let map = self.states.lock().map_err(|_| anyhow!("queue watch poisoned"))?;
                let mut last = None::<Instant>;
                let mut missing = 0;
                for n in names {
                    match map.get(n).filter(|s| done(s)) {
                        Some(s) => last = last.max(s.since),
                        None => missing += 1,
                    }
                }
                if missing == 0 {
                    return last.ok_or_else(|| anyhow!("no queue to wait for"));
                }
                if Instant::now() > deadline {
                    bail!("{missing} of {} queues not {what} after {timeout:?}", names.len());
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), notified).await;
        }
    }
}

impl Drop for QueueWatch {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

impl Objects {
    fn queues(&self) -> Api<ArtemisQueue> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The credentials Secret and the ArtemisCluster `self.cluster` over `urls`, with the CRD's
    /// default poll interval and request timeout; waits until it reports `live` live nodes.
    pub async fn create_cluster(&self, urls: &[String], user: &(String, String), live: u32) -> Result<()> {
        let name = self.cluster.as_str();
        let secret_name = format!("{name}-credentials");
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret_name},
            "stringData": {"username": user.0, "password": user.1}
        }))?;
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &secret)
            .await
            .context("create the credentials Secret")?;
        let brokers: Vec<Value> = urls.iter().map(|u| json!({"url": u})).collect();
        let cluster: ArtemisCluster = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": name},
            "spec": {"brokers": brokers, "credentials": {"secretName": secret_name}}
        }))?;
        let api: Api<ArtemisCluster> = Api::namespaced(self.client.clone(), &self.ns);
        api.create(&PostParams::default(), &cluster)
            .await
            .with_context(|| format!("create the ArtemisCluster {name}"))?;
        self.harness.write(2);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            self.harness.read(1);
            let c = api.get(name).await?;
            if c.status.as_ref().is_some_and(|s| s.live_nodes == live) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("ArtemisCluster {name} did not report {live} live nodes in 120 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// `status.heldBy` of the ArtemisCluster `self.cluster`: the replica acting for it (None
    /// until one wrote it).
    pub async fn cluster_held_by(&self) -> Result<Option<String>> {
        let api: Api<ArtemisCluster> = Api::namespaced(self.client.clone(), &self.ns);
        self.harness.read(1);
        let cluster = api
            .get(&self.cluster)
            .await
            .with_context(|| format!("get the ArtemisCluster {}/{}", self.ns, self.cluster))?;
        Ok(cluster.status.and_then(|s| s.held_by))
    }

    pub async fn create_queue(&self, name: &str) -> Result<()> {
        let q: ArtemisQueue = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": name},
            "spec": {"clusterRef": {"name": self.cluster}, "durable": self.durable}
        }))?;
        self.harness.write(1);
        self.queues()
            .create(&PostParams::default(), &q)
            .await
            .with_context(|| format!("create ArtemisQueue {name}"))?;
        Ok(())
    }

    pub async fn set_filter(&self, name: &str, filter: &str) -> Result<()> {
        self.harness.write(1);
        self.queues()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"filter": filter}})),
            )
            .await
            .with_context(|| format!("set the filter of {name}"))?;
        Ok(())
    }

    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        self.harness.write(1);
        match self.queues().delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e).with_context(|| format!("delete ArtemisQueue {name}")),
        }
    }

    /// The status of a queue as the API server holds it, every field (not the typed view).
    pub async fn status_of(&self, name: &str) -> Result<Value> {
        let resource = ApiResource::erase::<ArtemisQueue>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &resource);
        self.harness.read(1);
        let object = api
            .get(name)
            .await
            .with_context(|| format!("get ArtemisQueue {name}"))?;
        object
            .data
            .get("status")
            .cloned()
            .ok_or_else(|| anyhow!("ArtemisQueue {name} has no status"))
    }

    /// For every queue named `prefix…` that is Ready=True: its Ready condition's
    /// lastTransitionTime less its creationTimestamp, whole seconds, from one LIST (the API
    /// server's own timestamps, as ../shared/bench/wait_ready.py reads them).
    pub async fn ready_lags(&self, prefix: &str) -> Result<Vec<i64>> {
        let resource = ApiResource::erase::<ArtemisQueue>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &resource);
        self.harness.read(1);
        let list = api
            .list(&ListParams::default())
            .await
            .context("list the queues")?;
        Ok(list
            .items
            .iter()
            .filter(|q| q.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix)))
            .filter_map(ready_lag)
            .collect())
    }

    pub async fn create_queues(&self, names: &[String]) -> Result<()> {
        self.create_queues_timed(names).await.map(|_| ())
    }

    /// Create every queue; returns when each create was acknowledged by the API server.
    pub async fn create_queues_timed(&self, names: &[String]) -> Result<HashMap<String, Instant>> {
        let acknowledged = stream::iter(names)
            .map(|n| async move {
                self.create_queue(n).await?;
                Ok::<_, anyhow::Error>((n.clone(), Instant::now()))
            })
            .buffer_unordered(self.concurrency)
            .try_collect::<HashMap<String, Instant>>()
            .await?;
        Ok(acknowledged)
    }

    pub async fn delete_queues(&self, names: &[String]) -> Result<()> {
        stream::iter(names)
            .map(|n| self.delete_queue(n))
            .buffer_unordered(self.concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// An ArtemisCaptureSubscription over one queue name pattern.
    pub async fn create_subscription(&self, name: &str, pattern: &str) -> Result<()> {
        let s: ArtemisCaptureSubscription = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
            "metadata": {"name": name},
            "spec": {"clusterRef": {"name": self.cluster}, "queues": pattern, "ringSize": 100}
        }))?;
        self.harness.write(1);
        Api::<ArtemisCaptureSubscription>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &s)
            .await
            .with_context(|| format!("create ArtemisCaptureSubscription {name}"))?;
        Ok(())
    }

    /// Wait until every subscription reports a HEALTHY tap on each of `nodes` nodes.
    pub async fn wait_taps(&self, nodes: usize, timeout: Duration) -> Result<()> {
        let api: Api<ArtemisCaptureSubscription> = Api::namespaced(self.client.clone(), &self.ns);
        let deadline = Instant::now() + timeout;
        loop {
            self.harness.read(1);
            let subs = api.list(&ListParams::default()).await?.items;
            // Healthy: installed and drained (the drains and their coverage started), as the
            // counts of every tap say (status lists a bounded number of them).
            let done = subs.iter().all(|s| {
                s.status
                    .as_ref()
                    .is_some_and(|st| st.tap_counts.healthy >= nodes as u64)
            });
            if done {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("capture taps not all healthy after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Delete every subscription and wait until the operator released them (its sweep
    /// removed their taps).
    pub async fn delete_subscriptions(&self, timeout: Duration) -> Result<()> {
        let api: Api<ArtemisCaptureSubscription> = Api::namespaced(self.client.clone(), &self.ns);
        api.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .context("delete the capture subscriptions")?;
        let deadline = Instant::now() + timeout;
        loop {
            if api.list(&ListParams::default()).await?.items.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("capture subscriptions still present after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Last resort after a failed run: remove the finalizers of whatever is left so the
    /// namespace can go (the broker side is cleaned by name prefix).
    pub async fn strip_finalizers(&self) -> Result<()> {
        let patch = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        for q in self.queues().list(&ListParams::default()).await?.items {
            let _ = self
                .queues()
                .patch(&q.name_any(), &PatchParams::default(), &patch)
                .await;
        }
        let subs: Api<ArtemisCaptureSubscription> = Api::namespaced(self.client.clone(), &self.ns);
        for s in subs.list(&ListParams::default()).await?.items {
            let _ = subs.patch(&s.name_any(), &PatchParams::default(), &patch).await;
        }
        Ok(())
    }
}
