//! How one kind's controller runs: its [`Wiring`] (source, triggers, [`Slots`]), the run loop
//! every kind shares ([`run_controller`]) and the finalizer around a reconcile.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::runtime::reflector;
use kube::{Api, Resource};

use super::arrival::{Book, Gate, InLine};
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

/// A kind's reconcile slots: so many reconciles at once over all its controllers, granted in
/// the order the objects' changes arrived (issue 45: see [`arrival`](super::arrival)).
#[derive(Clone)]
pub struct Slots {
    gate: Gate,
}

impl Slots {
    pub fn new(concurrency: u16) -> Self {
        Slots {
            gate: Gate::new(usize::from(concurrency)),
        }
    }

    /// How many reconciles wait for a slot.
    pub fn waiting(&self) -> usize {
        self.gate.waiting()
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

/// A controller's changes: each object the watch reports (or the feed lets through).
type Changes<K> = futures::stream::BoxStream<'static, Result<K, kube::runtime::watcher::Error>>;

/// Run one kind's controller until shutdown (every kind is wired the same way).
///
/// kube starts a reconcile for every object at once (no limit of its own; still one reconcile
/// per object at a time), and each waits for one of the kind's [`Slots`] in the order its
/// object's change arrived; it then reconciles the object's latest version. Shutdown closes the
/// slots: the reconciles still waiting end at once, those holding a slot finish.
pub async fn run_controller<K, R, Fut>(
    wiring: Wiring<K>,
    ctx: Arc<Context>,
    reconcile: R,
    error_policy: impl Fn(Arc<K>, &ReconcileError, Arc<Context>) -> Action,
) where
    K: Watched + OfCluster,
    R: Fn(Arc<K>, Arc<Context>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    use futures::StreamExt;
    let Wiring {
        source,
        triggers,
        slots,
    } = wiring;
    let (changes, reader) = changes_of(source);
    let book = Arc::new(Book::new(slots.gate.clone(), reader.clone()));
    // An object arrives when its change or trigger enters the controller (in watch order).
    let changes = changes.inspect({
        let book = book.clone();
        move |r| {
            if let Ok(o) = r {
                book.arrived(reflector::ObjectRef::from_obj(o));
            }
        }
    });
    let triggers = triggers.inspect({
        let book = book.clone();
        move |r| book.arrived(r.clone())
    });
    let reconcile = Arc::new(reconcile);
    let in_turn = move |obj: Arc<K>, ctx: Arc<Context>| {
        // Only its name is kept while it waits: the turn reads the latest version.
        let in_line = book.in_line(reflector::ObjectRef::from_obj(obj.as_ref()));
        reconcile_in_turn(in_line, reconcile.clone(), ctx)
    };
    // No limit of kube's own (0): the slots are the limit, and they keep arrival order.
    let config = kube::runtime::controller::Config::default().concurrency(0);
    let run = kube::runtime::Controller::for_stream(changes, reader)
        .with_config(config)
        .reconcile_on(triggers)
        .graceful_shutdown_on(ctx.shutdown.requested())
        .run(in_turn, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, kind = K::kind(&()).as_ref(), "controller");
            }
        });
    let mut run = std::pin::pin!(run);
    tokio::select! {
        _ = &mut run => return,
        _ = ctx.shutdown.requested() => slots.gate.close(),
    }
    run.await;
}

/// A source's changes, and the cache they are looked up in.
fn changes_of<K: Watched>(source: Source<K>) -> (Changes<K>, reflector::Store<K>) {
    use futures::StreamExt;
    match source {
        Source::Watch(api) => {
            // Controller::new's own watcher would use kube's default backoff (see backoff::watch).
            use kube::runtime::WatchStreamExt;
            let (reader, writer) = kube::runtime::reflector::store();
            let failures = Arc::new(crate::backoff::WatchFailures::default());
            let stream = kube::runtime::reflector(writer, crate::backoff::watched(*api))
                .inspect(move |r| failures.saw(K::kind(&()).as_ref(), r))
                .applied_objects();
            (stream.boxed(), reader)
        }
        Source::Feed { changes, reader } => (
            tokio_stream_of(changes)
                .map(Ok::<K, kube::runtime::watcher::Error>)
                .boxed(),
            reader,
        ),
    }
}

/// One reconcile: in line for a slot, then `reconcile` on the object's latest version,
/// measured (nothing when shutdown came first or the object left the cache meanwhile).
async fn reconcile_in_turn<K, R, Fut>(
    in_line: InLine<K>,
    reconcile: Arc<R>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError>
where
    K: Watched + OfCluster,
    R: Fn(Arc<K>, Arc<Context>) -> Fut,
    Fut: std::future::Future<Output = Result<Action, ReconcileError>>,
{
    use tracing::Instrument;
    let Some((_slot, obj)) = in_line.turn().await else {
        return Ok(Action::await_change());
    };
    let cluster = obj.cluster_key();
    // Issue 46: only the replica holding the object's cluster acts on it; the guard keeps the
    // cluster from being released while this reconcile runs.
    let Some(_work) = ctx.holdings.enter(&cluster) else {
        return Ok(K::when_not_held());
    };
    let metrics = ctx.metrics.clone();
    let backoff = ctx.backoff.clone();
    let uid = obj.meta().uid.clone().unwrap_or_default();
    // One span per reconciled object: every log line of the pass names it.
    let span = tracing::info_span!(
        "reconcile",
        kind = K::kind(&()).as_ref(),
        namespace = obj.meta().namespace.as_deref().unwrap_or_default(),
        object = obj.meta().name.as_deref().unwrap_or_default(),
    );
    let started = std::time::Instant::now();
    // Boxed: a waiting reconcile stays small; the pass's own state exists once it runs.
    let r = Box::pin(reconcile(obj, ctx).instrument(span)).await;
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

/// A receiver as a stream.
pub(super) fn tokio_stream_of<K: Send + 'static>(
    rx: tokio::sync::mpsc::UnboundedReceiver<K>,
) -> impl futures::Stream<Item = K> + Send {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|k| (k, rx)) })
}

/// Reconcile through the object's finalizer: `apply` while it lives, `cleanup` once deleted
/// (the finalizer is released only when `cleanup` succeeds).
///
/// A live object without the finalizer gets it and goes on to `apply` in the same reconcile
/// (issue 45: one slot per create, where kube's `finalizer()` ends the reconcile and waits for
/// the patch's watch event to queue a second one behind every later arrival). The finalizer is
/// stored before `apply` sends anything, as ADR-0084 needs; `own_change` is told of the patched
/// object first, so its watch event asks for no further reconcile. `alongside_patch` runs with
/// the finalizer patch when there is one (issue 45: a create's credentials read), else never.
pub async fn with_finalizer<K, A, AFut, C, CFut>(
    ctx: &Context,
    obj: Arc<K>,
    finalizer_name: &str,
    own_change: impl FnOnce(&K),
    alongside_patch: impl std::future::Future<Output = ()>,
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
    let has_finalizer = obj
        .meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizer_name);
    if obj.meta().deletion_timestamp.is_none() && !has_finalizer {
        let mut expected = (*obj).clone();
        expected
            .meta_mut()
            .finalizers
            .get_or_insert_default()
            .push(finalizer_name.to_string());
        own_change(&expected);
        let (added, ()) = futures::join!(add_finalizer(&api, obj.as_ref(), finalizer_name), alongside_patch);
        return apply(Arc::new(added?)).await;
    }
    finalizer(&api, finalizer_name, obj, |event| async move {
        match event {
            Event::Apply(o) => apply(o).await,
            Event::Cleanup(o) => cleanup(o).await,
        }
    })
    .await
    .map_err(ReconcileError::from)
}

/// Add the finalizer by a JSON patch that tests the list it extends (no resourceVersion
/// precondition: a status written meanwhile does not refuse it; a finalizer someone else added
/// meanwhile does, and the reconcile is retried). The object as stored, spec writer kept as the
/// watch keeps it.
async fn add_finalizer<K>(api: &kube::Api<K>, obj: &K, finalizer_name: &str) -> Result<K, ReconcileError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let patch = match obj.meta().finalizers.as_deref() {
        None | Some([]) => serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer_name]},
        ]),
        Some(list) => serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": list},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer_name},
        ]),
    };
    let patch: json_patch::Patch = serde_json::from_value(patch)?;
    let mut added = api
        .patch(
            &name,
            &super::patch_params(),
            &kube::api::Patch::Json::<()>(patch),
        )
        .await?;
    super::keep_spec_writer(added.meta_mut());
    Ok(added)
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

    /// A controller's feed as the test writes it: the cache it reads and its changes.
    struct Fed {
        writer: reflector::store::Writer<ArtemisQueue>,
        tx: tokio::sync::mpsc::UnboundedSender<ArtemisQueue>,
    }

    impl Fed {
        /// A change arrives: the cache holds it, then the feed hands it over (as `watches`).
        fn arrive(&mut self, q: ArtemisQueue) {
            self.writer.apply_watcher_event(&watcher::Event::Apply(q.clone()));
            let _ = self.tx.send(q);
        }
    }

    /// One namespace's controller over an empty cache, fed by the test.
    fn fed(slots: &Slots) -> (Fed, Wiring<ArtemisQueue>) {
        let (reader, mut writer) = reflector::store();
        let (tx, changes) = tokio::sync::mpsc::unbounded_channel();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let source = Source::Feed { changes, reader };
        let never = futures::StreamExt::boxed(futures::stream::pending());
        (Fed { writer, tx }, Wiring::new(source, never, slots.clone()))
    }

    fn labelled(ns: &str, name: &str, v: &str) -> ArtemisQueue {
        let mut q = queue(ns, name);
        q.metadata.labels = Some([("v".to_string(), v.to_string())].into());
        q
    }

    /// The reconciles as they start (`ns/name v`); the one of an object named `first` holds its
    /// slot until `release` has a permit.
    #[derive(Clone)]
    struct Recorder {
        started: Arc<std::sync::Mutex<Vec<String>>>,
        release: Arc<tokio::sync::Semaphore>,
    }

    impl Default for Recorder {
        fn default() -> Self {
            Recorder {
                started: Default::default(),
                release: Arc::new(tokio::sync::Semaphore::new(0)),
            }
        }
    }

    impl Recorder {
        fn reconcile(
            &self,
        ) -> impl Fn(
            Arc<ArtemisQueue>,
            Arc<Context>,
        ) -> futures::future::BoxFuture<'static, Result<Action, ReconcileError>>
        + Send
        + Sync
        + 'static {
            let me = self.clone();
            move |q: Arc<ArtemisQueue>, _: Arc<Context>| {
                let me = me.clone();
                Box::pin(async move {
                    let m = &q.metadata;
                    let (ns, name) = (
                        m.namespace.clone().unwrap_or_default(),
                        m.name.clone().unwrap_or_default(),
                    );
                    let v = m
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("v").cloned())
                        .unwrap_or_default();
                    if let Ok(mut s) = me.started.lock() {
                        s.push(format!("{ns}/{name} {v}"));
                    }
                    if name == "first" {
                        let _ = me.release.acquire().await;
                    }
                    Ok(Action::await_change())
                })
            }
        }

        fn started(&self) -> Vec<String> {
            self.started.lock().map(|s| s.clone()).unwrap_or_default()
        }

        /// Wait until `n` reconciles have started.
        async fn until_started(&self, n: usize) {
            while self.started().len() < n {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }

    fn policy(_: Arc<ArtemisQueue>, _: &ReconcileError, _: Arc<Context>) -> Action {
        Action::await_change()
    }

    /// Wait until `n` reconciles wait for a slot.
    async fn until_waiting(slots: &Slots, n: usize) {
        while slots.waiting() < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Let the controllers take what was fed (the test and they share one task).
    async fn let_them_take() {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    /// The test the issue asks for, through kube's real Controller: under a full work queue (the
    /// one slot held) the objects that arrive meanwhile are served in arrival order. Before
    /// issue 45 they were served in the order of kube's `pending` HashSet.
    #[tokio::test]
    async fn objects_are_served_in_arrival_order_under_a_full_work_queue() {
        let (ctx, _) = fixtures::context(Box::new(|_| (404, serde_json::json!({}))));
        let (slots, recorder, n) = (Slots::new(1), Recorder::default(), 40);
        let (mut feed, w) = fed(&slots);
        let run = run_controller(w, ctx.clone(), recorder.reconcile(), policy);
        let (shutdown, rec) = (ctx.shutdown.clone(), recorder.clone());
        let drive = async move {
            feed.arrive(queue("a", "first"));
            rec.until_started(1).await;
            for i in 0..n {
                feed.arrive(labelled("a", &format!("q{i:02}"), "1"));
                let_them_take().await;
            }
            until_waiting(&slots, n).await;
            rec.release.add_permits(1);
            rec.until_started(n + 1).await;
            shutdown.request();
        };
        let all = async { tokio::join!(run, drive) };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .unwrap_or_else(|_| panic!("{} reconciles", n + 1));
        let expected: Vec<String> = std::iter::once("a/first ".to_string())
            .chain((0..n).map(|i| format!("a/q{i:02} 1")))
            .collect();
        assert_eq!(recorder.started(), expected);
    }

    /// Arrival order holds across the kind's controllers of every namespace: changes arriving
    /// in two namespaces in turn are served in turn.
    #[tokio::test]
    async fn arrival_order_holds_across_namespaces() {
        let (ctx, _) = fixtures::context(Box::new(|_| (404, serde_json::json!({}))));
        let (slots, recorder, n) = (Slots::new(1), Recorder::default(), 10);
        let ((mut a, wa), (mut b, wb)) = (fed(&slots), fed(&slots));
        let run_a = run_controller(wa, ctx.clone(), recorder.reconcile(), policy);
        let run_b = run_controller(wb, ctx.clone(), recorder.reconcile(), policy);
        let (shutdown, rec) = (ctx.shutdown.clone(), recorder.clone());
        let drive = async move {
            a.arrive(queue("a", "first"));
            rec.until_started(1).await;
            for i in 0..n {
                // b's first, then a's: the namespaces' own order does not decide.
                b.arrive(labelled("b", &format!("q{i}"), "1"));
                let_them_take().await;
                a.arrive(labelled("a", &format!("q{i}"), "1"));
                let_them_take().await;
            }
            until_waiting(&slots, 2 * n).await;
            rec.release.add_permits(1);
            rec.until_started(2 * n + 1).await;
            shutdown.request();
        };
        let all = async { tokio::join!(run_a, run_b, drive) };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .unwrap_or_else(|_| panic!("{} reconciles", 2 * n + 1));
        let expected: Vec<String> = std::iter::once("a/first ".to_string())
            .chain((0..n).flat_map(|i| [format!("b/q{i} 1"), format!("a/q{i} 1")]))
            .collect();
        assert_eq!(recorder.started(), expected);
    }

    /// A reconcile that waited for its slot reconciles the object as it is when the slot comes,
    /// not the copy it was started with.
    #[tokio::test]
    async fn a_reconcile_that_waited_reconciles_the_latest_version() {
        let (ctx, _) = fixtures::context(Box::new(|_| (404, serde_json::json!({}))));
        let (slots, recorder) = (Slots::new(1), Recorder::default());
        let (mut feed, w) = fed(&slots);
        let run = run_controller(w, ctx.clone(), recorder.reconcile(), policy);
        let (shutdown, rec) = (ctx.shutdown.clone(), recorder.clone());
        let drive = async move {
            feed.arrive(queue("a", "first"));
            rec.until_started(1).await;
            feed.arrive(labelled("a", "q", "1"));
            until_waiting(&slots, 1).await;
            feed.arrive(labelled("a", "q", "2"));
            let_them_take().await;
            rec.release.add_permits(1);
            rec.until_started(2).await;
            shutdown.request();
        };
        let all = async { tokio::join!(run, drive) };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .unwrap_or_else(|_| panic!("2 reconciles"));
        assert_eq!(recorder.started().get(1).map(String::as_str), Some("a/q 2"));
    }

    /// Shutdown does not wait for the reconciles still in line: they end at once, and the
    /// controller ends when those holding a slot have finished.
    #[tokio::test]
    async fn shutdown_ends_the_reconciles_still_waiting() {
        let (ctx, _) = fixtures::context(Box::new(|_| (404, serde_json::json!({}))));
        let (slots, recorder) = (Slots::new(1), Recorder::default());
        let (mut feed, w) = fed(&slots);
        let run = run_controller(w, ctx.clone(), recorder.reconcile(), policy);
        let (shutdown, rec) = (ctx.shutdown.clone(), recorder.clone());
        let drive = async move {
            feed.arrive(queue("a", "first"));
            rec.until_started(1).await;
            for i in 0..10 {
                feed.arrive(queue("a", &format!("q{i}")));
            }
            until_waiting(&slots, 10).await;
            shutdown.request();
            let_them_take().await;
            rec.release.add_permits(1);
        };
        let all = async { tokio::join!(run, drive) };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .unwrap_or_else(|_| panic!("the controller ends"));
        assert_eq!(recorder.started(), vec!["a/first ".to_string()]);
    }

    /// The `p`-quantile of sorted samples.
    fn quantile(sorted: &[f64], p: f64) -> f64 {
        let i = (sorted.len() as f64 * p) as usize;
        sorted
            .get(i.min(sorted.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    }

    /// Issue 45's measure, scaled down: 10,000 objects created at 5,000/s into 32 slots of
    /// 20 ms reconciles (1,600/s); create → start p99 ≤ 2× p50 (before: p99/p50 ≈ 35–185, the
    /// oldest waiting behind newer ones). A timing measure, so not run by default:
    /// `cargo test --release --lib -- --ignored a_burst_of_10000 --nocapture`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore]
    async fn a_burst_of_10000_creates_is_served_first_come_first_served() {
        use std::collections::HashMap;
        use std::time::Instant;
        let (ctx, _) = fixtures::context(Box::new(|_| (404, serde_json::json!({}))));
        let n = 10_000;
        let started: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Default::default();
        let reconcile = {
            let started = started.clone();
            move |q: Arc<ArtemisQueue>, _: Arc<Context>| {
                if let Ok(mut s) = started.lock() {
                    s.entry(q.metadata.name.clone().unwrap_or_default())
                        .or_insert_with(Instant::now);
                }
                async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, ReconcileError>(Action::await_change())
                }
            }
        };
        let (mut feed, w) = fed(&Slots::new(32));
        let run = run_controller(w, ctx.clone(), reconcile, policy);
        let (shutdown, all_started) = (ctx.shutdown.clone(), started.clone());
        let drive = async move {
            let mut arrived = HashMap::new();
            for i in 0..n {
                let name = format!("q{i:05}");
                arrived.insert(name.clone(), Instant::now());
                feed.arrive(queue("a", &name));
                if i % 5 == 4 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            while all_started.lock().map(|s| s.len()).unwrap_or_default() < n {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            shutdown.request();
            arrived
        };
        let (_, arrived) = tokio::join!(run, drive);
        let started = started.lock().map(|s| s.clone()).unwrap_or_default();
        let mut waits: Vec<f64> = arrived
            .iter()
            .filter_map(|(name, at)| Some(started.get(name)?.duration_since(*at).as_secs_f64()))
            .collect();
        waits.sort_by(f64::total_cmp);
        let (p50, p99) = (quantile(&waits, 0.5), quantile(&waits, 0.99));
        println!("10,000 creates: create -> start p50 {p50:.2} s, p99 {p99:.2} s");
        assert!(p99 <= 2.0 * p50, "p99 {p99:.2} s > 2 × p50 {p50:.2} s");
    }

    /// 10,000 waiting reconciles stay cheap: what waits is the small future of the turn; the
    /// pass itself (a queue's pipeline) is built and boxed only once the slot is granted.
    #[tokio::test]
    async fn a_waiting_reconcile_is_small() {
        use super::super::arrival::{Book, Gate};
        let (ctx, _) = fixtures::context(Box::new(|_| (404, serde_json::json!({}))));
        let (reader, _writer) = reflector::store::<ArtemisQueue>();
        let book = Arc::new(Book::new(Gate::new(1), reader));
        let pass = super::super::pipeline::reconcile::<ArtemisQueue>;
        let in_line = book.in_line(reflector::ObjectRef::new("q").within("a"));
        let waiting = super::reconcile_in_turn(in_line, Arc::new(pass), ctx.clone());
        let whole = pass(Arc::new(queue("a", "q")), ctx);
        let (waiting, whole) = (std::mem::size_of_val(&waiting), std::mem::size_of_val(&whole));
        println!("a waiting reconcile: {waiting} bytes (the pass: {whole} bytes)");
        assert!(waiting <= 1024, "{waiting} bytes wait (the pass: {whole})");
    }
}

/// The finalizer patch as the API server receives it (a mock API, `fixtures`).
#[cfg(test)]
mod finalizer_on_a_mock_api {
    use serde_json::json;

    use super::super::{MANAGER, fixtures};
    use super::add_finalizer;
    use crate::api::ArtemisQueue;

    fn queue(finalizers: serde_json::Value) -> ArtemisQueue {
        serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": "orders", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "finalizers": finalizers},
            "spec": {"clusterRef": {"name": "c"}}
        }))
        .unwrap_or_else(|e| panic!("queue: {e}"))
    }

    /// One JSON patch under the operator's field manager (`managedFields` names it, not
    /// "unknown"), testing the list it extends: another writer's finalizer added meanwhile
    /// refuses it instead of being overwritten.
    #[tokio::test]
    async fn the_finalizer_is_one_patch_that_tests_the_list_and_names_the_operator() {
        let (ctx, received) = fixtures::context(Box::new(|_| {
            let q = queue(json!(["other.io/keep", "artemis-studio.io/queue"]));
            (200, serde_json::to_value(q).unwrap_or_default())
        }));
        let api = kube::Api::<ArtemisQueue>::namespaced(ctx.client.clone(), "ns");
        let before = queue(json!(["other.io/keep"]));
        let added = add_finalizer(&api, &before, "artemis-studio.io/queue")
            .await
            .expect("patched");
        assert_eq!(
            added.metadata.finalizers.as_deref(),
            Some(&["other.io/keep".to_string(), "artemis-studio.io/queue".to_string()][..])
        );
        let sent = received.all();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].method, "PATCH");
        assert!(
            sent[0].uri.contains(&format!("fieldManager={MANAGER}")),
            "{}",
            sent[0].uri
        );
        assert_eq!(
            sent[0].body,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["other.io/keep"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "artemis-studio.io/queue"},
            ])
        );
    }
}
