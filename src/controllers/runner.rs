//! How one kind's controller runs: its [`Wiring`] (source, triggers, [`Slots`]), the run loop
//! every kind shares ([`run_controller`]) and the finalizer around a reconcile.

use std::sync::Arc;

use kube::runtime::reflector;
use kube::{Api, Resource};

use super::{Context, OfCluster, ReconcileError, Watched};

/// How one kind's controller is wired: what it reconciles on (its cache's watch, or a watch of
/// its own for a kind without a cache), the external triggers, and how many reconciles run at
/// once — the kind's slots, shared by its controllers of every watched namespace.
///
/// One controller per kind *and namespace*: a namespace list is watched namespace by namespace,
/// because the chart grants the operator a Role in each listed namespace, never a cluster-wide
/// list/watch. The slots keep the configured concurrency a total per kind (issue 43), however
/// many namespaces are listed.
pub struct Wiring<K: Resource<DynamicType = ()> + 'static> {
    pub source: Source<K>,
    pub triggers: futures::stream::BoxStream<'static, reflector::ObjectRef<K>>,
    pub slots: Slots,
}

/// A kind's reconcile slots: so many reconciles at once over all its controllers.
#[derive(Clone)]
pub struct Slots {
    permits: Arc<tokio::sync::Semaphore>,
    size: u16,
}

impl Slots {
    pub fn new(concurrency: u16) -> Self {
        let size = concurrency.max(1);
        Slots {
            permits: Arc::new(tokio::sync::Semaphore::new(usize::from(size))),
            size,
        }
    }
}

/// Where a controller's objects come from.
pub enum Source<K: Resource<DynamicType = ()> + 'static> {
    /// A watch of its own (a kind no cache holds).
    Watch(Box<Api<K>>),
    /// The changes its cache's watch lets through (`feed`), looked up in that cache.
    Feed {
        changes: tokio::sync::mpsc::UnboundedReceiver<K>,
        reader: reflector::Store<K>,
    },
}

impl<K: Resource<DynamicType = ()> + 'static> Wiring<K> {
    pub fn new(
        source: Source<K>,
        triggers: futures::stream::BoxStream<'static, reflector::ObjectRef<K>>,
        slots: Slots,
    ) -> Self {
        Wiring {
            source,
            triggers,
            slots,
        }
    }
}

/// Run one kind's controller until shutdown (every kind is wired the same way).
pub async fn run_controller<K, Fut>(
    wiring: Wiring<K>,
    ctx: Arc<Context>,
    reconcile: impl FnMut(Arc<K>, Arc<Context>) -> Fut,
    error_policy: impl Fn(Arc<K>, &ReconcileError, Arc<Context>) -> kube::runtime::controller::Action,
) where
    K: Watched + OfCluster,
    Fut: std::future::Future<Output = Result<kube::runtime::controller::Action, ReconcileError>>
        + Send
        + 'static,
{
    use futures::StreamExt;
    use tracing::Instrument;
    let mut reconcile = reconcile;
    let slots = wiring.slots.permits.clone();
    let measured = move |obj: Arc<K>, ctx: Arc<Context>| {
        let metrics = ctx.metrics.clone();
        let backoff = ctx.backoff.clone();
        let uid = obj.meta().uid.clone().unwrap_or_default();
        let cluster = obj.cluster_key();
        // One span per reconciled object: every log line of the pass names it.
        let span = tracing::info_span!(
            "reconcile",
            kind = K::kind(&()).as_ref(),
            namespace = obj.meta().namespace.as_deref().unwrap_or_default(),
            object = obj.meta().name.as_deref().unwrap_or_default(),
        );
        let fut = reconcile(obj, ctx).instrument(span);
        let slots = slots.clone();
        async move {
            // Closed never (the semaphore lives as long as the controller): no slot, no limit.
            let _slot = slots.acquire_owned().await.ok();
            let started = std::time::Instant::now();
            let r = fut.await;
            let result = match &r {
                Ok(_) => "ok",
                Err(e) => e.reason(),
            };
            metrics.reconciled(&K::kind(&()), &cluster, result, started.elapsed().as_secs_f64());
            if r.is_ok() {
                backoff.reset(&uid);
            }
            r
        }
    };
    let config = kube::runtime::controller::Config::default().concurrency(wiring.slots.size);
    let controller = match wiring.source {
        Source::Watch(api) => {
            // Controller::new's own watcher would use kube's default backoff (see backoff::watch).
            use kube::runtime::WatchStreamExt;
            let (reader, writer) = kube::runtime::reflector::store();
            let failures = Arc::new(crate::backoff::WatchFailures::default());
            let stream = kube::runtime::reflector(writer, crate::backoff::watched(*api))
                .inspect(move |r| failures.saw(K::kind(&()).as_ref(), r))
                .applied_objects();
            kube::runtime::Controller::for_stream(stream, reader)
        }
        Source::Feed { changes, reader } => kube::runtime::Controller::for_stream(
            tokio_stream_of(changes).map(Ok::<K, kube::runtime::watcher::Error>),
            reader,
        ),
    };
    controller
        .with_config(config)
        .reconcile_on(wiring.triggers)
        .graceful_shutdown_on(ctx.shutdown.requested())
        .run(measured, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, kind = K::kind(&()).as_ref(), "controller");
            }
        })
        .await;
}

/// A receiver as a stream.
pub(super) fn tokio_stream_of<K: Send + 'static>(
    rx: tokio::sync::mpsc::UnboundedReceiver<K>,
) -> impl futures::Stream<Item = K> + Send {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|k| (k, rx)) })
}

/// Reconcile through the object's finalizer: `apply` while it lives, `cleanup` once deleted
/// (the finalizer is released only when `cleanup` succeeds).
pub async fn with_finalizer<K, A, AFut, C, CFut>(
    ctx: &Context,
    obj: Arc<K>,
    finalizer_name: &str,
    apply: A,
    cleanup: C,
) -> Result<kube::runtime::controller::Action, ReconcileError>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    A: FnOnce(Arc<K>) -> AFut,
    AFut: std::future::Future<Output = Result<kube::runtime::controller::Action, ReconcileError>>,
    C: FnOnce(Arc<K>) -> CFut,
    CFut: std::future::Future<Output = Result<kube::runtime::controller::Action, ReconcileError>>,
{
    use kube::runtime::finalizer::{Event, finalizer};
    let api: kube::Api<K> = kube::Api::namespaced(
        ctx.client.clone(),
        &obj.meta().namespace.clone().unwrap_or_default(),
    );
    finalizer(&api, finalizer_name, obj, |event| async move {
        match event {
            Event::Apply(o) => apply(o).await,
            Event::Cleanup(o) => cleanup(o).await,
        }
    })
    .await
    .map_err(ReconcileError::from)
}

#[cfg(test)]
mod slot_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use kube::runtime::controller::Action;
    use kube::runtime::{reflector, watcher};

    use super::super::fixtures;
    use super::{Context, ReconcileError, Slots, Source, Wiring, run_controller};
    use crate::api::ArtemisQueue;

    fn queue(ns: &str, name: &str) -> ArtemisQueue {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}")},
            "spec": {"clusterRef": {"name": "c"}, "name": name}
        }))
        .unwrap_or_else(|e| panic!("queue: {e}"))
    }

    /// One namespace's controller, fed `n` queues.
    fn wiring(ns: &str, n: usize, slots: &Slots) -> Wiring<ArtemisQueue> {
        let (reader, mut writer) = reflector::store();
        let (tx, changes) = tokio::sync::mpsc::unbounded_channel();
        writer.apply_watcher_event(&watcher::Event::Init);
        for i in 0..n {
            let q = queue(ns, &format!("q{i}"));
            writer.apply_watcher_event(&watcher::Event::InitApply(q.clone()));
            let _ = tx.send(q);
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        std::mem::forget(tx);
        let source = Source::Feed { changes, reader };
        Wiring::new(
            source,
            futures::StreamExt::boxed(futures::stream::pending()),
            slots.clone(),
        )
    }

    /// Issue 43: a kind's configured concurrency is a total over the controllers of every
    /// watched namespace, not one per namespace.
    #[tokio::test]
    async fn a_kinds_concurrency_is_shared_by_its_controllers_of_every_namespace() {
        let (ctx, _) = fixtures::context(Box::new(|_| (404, serde_json::json!({}))));
        let (now, most, done) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let reconcile = {
            let (now, most, done) = (now.clone(), most.clone(), done.clone());
            move |_: Arc<ArtemisQueue>, _: Arc<Context>| {
                let (now, most, done) = (now.clone(), most.clone(), done.clone());
                async move {
                    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, ReconcileError>(Action::await_change())
                }
            }
        };
        let policy = |_: Arc<ArtemisQueue>, _: &ReconcileError, _: Arc<Context>| Action::await_change();
        let slots = Slots::new(2);
        let a = run_controller(wiring("a", 4, &slots), ctx.clone(), reconcile.clone(), policy);
        let b = run_controller(wiring("b", 4, &slots), ctx.clone(), reconcile, policy);
        let shutdown = ctx.shutdown.clone();
        let watch = async move {
            while done.load(Ordering::SeqCst) < 8 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            shutdown.request();
        };
        let all = async { tokio::join!(a, b, watch) };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .unwrap_or_else(|_| panic!("8 reconciles"));
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "at most the kind's 2 slots at once"
        );
    }
}
