use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kube::Api;

use artemis_studio_operator::cli::{Cli, Command, RunArgs};
use artemis_studio_operator::controllers::{self, Context, Namespaces, Reflectors};
use artemis_studio_operator::leader;
use artemis_studio_operator::store::{DatabaseConfig, Secret, Store};
use artemis_studio_operator::supervisor::{self, Supervisor};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => print!("{}", artemis_studio_operator::api::crds_yaml()?),
        Command::Run(args) => run(*args).await?,
        Command::Read(cmd) => artemis_studio_operator::reading::run(*cmd, std::io::stdout().lock()).await?,
    }
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(&args);
    let namespaces = Namespaces::from_list(args.watch_namespaces());
    // Refused before anything starts: a renew deadline not under the lease duration could let
    // two leaders act.
    let timing = leader::Timing::new(
        args.lease_duration_seconds,
        args.lease_renew_deadline_seconds,
        args.lease_retry_period_seconds,
    )?;
    let database = DatabaseConfig::new(
        args.database_url.expose(),
        args.database_password.as_ref().map(Secret::expose),
    )?;
    Store::migrate_to(&database).await?;
    let store = Store::connect_to(&database).await?;
    // Every Kubernetes API request is counted (artemis_studio_api_requests_total).
    let metrics = Arc::new(artemis_studio_operator::telemetry::Metrics::default());
    let client = artemis_studio_operator::telemetry::api_client(metrics.clone()).await?;
    let (ctx, mut reflectors) = context(&args, client.clone(), store, namespaces.clone(), metrics);
    tracing::info!(
        instance_id = %args.instance_id,
        namespaces = ?namespaces,
        listen = %args.listen,
        database = %database.target(),
        pod = ?args.pod_name,
        pod_namespace = ?args.pod_namespace,
        "starting"
    );
    let tasks = ctx.supervisor.clone();
    let events = ctx.events.clone();
    serve_health_and_metrics(&tasks, args.listen, ctx.metrics.clone());
    stop_on_signals(ctx.shutdown.clone(), tasks.clone())?;
    // Capture is not leader-only: every replica runs it, and a Postgres advisory lock per
    // cluster decides which replica serves which cluster (ADR-0062 D7).
    let capture = artemis_studio_operator::capture::run(ctx.clone(), reflectors.take_subscriptions());
    tasks.spawn("capture", ends_in_tests("capture", capture));
    let code = tokio::select! {
        exit = run_controllers(&args, client, timing, ctx, reflectors) => {
            tasks.stopping();
            tracing::info!(?exit, "stopped");
            exit.code()
        }
        ended = tasks.first_end() => {
            tracing::error!(task = ended.task, how = %ended.how, "stopping: a supervised task ended unasked");
            supervisor::EXIT_TASK_ENDED
        }
    };
    if code != 0 {
        // At once: nothing of this process may act after its Lease is lost or a task died.
        std::process::exit(code);
    }
    // A clean stop: the Events the last passes queued are published (within a bound).
    if tokio::time::timeout(EVENTS_AT_EXIT, events.settled())
        .await
        .is_err()
    {
        tracing::warn!("stopped with Events not yet published");
    }
    Ok(())
}

/// How long a clean stop waits for the queued Events to be published.
const EVENTS_AT_EXIT: Duration = Duration::from_secs(5);

/// A supervised task, which a test build ends (a panic) when a test says so.
async fn ends_in_tests(task: &'static str, run: impl std::future::Future<Output = ()>) {
    tokio::select! {
        () = run => {}
        () = artemis_studio_operator::crash_window::task_ends(task) => {}
    }
}

/// kube's client logs every failed API request at ERROR ("failed with error client error
/// (Connect)", naming neither the request nor its caller), and the caller logs the same failure
/// again with its context: with the API server unreachable that doubled every retry's line.
/// Off unless RUST_LOG names a `kube…` target itself.
const KUBE_REQUEST_FAILURES_OFF: &str = "kube_client::client::builder=off";

/// Logs as JSON or text, filtered by RUST_LOG (at info, with a warning, when it does not parse).
fn init_logging(args: &RunArgs) {
    let (mut filter, bad_filter) = match tracing_subscriber::EnvFilter::try_new(&args.log_filter) {
        Ok(f) => (f, None),
        Err(e) => (tracing_subscriber::EnvFilter::new("info"), Some(e)),
    };
    let names_kube = args
        .log_filter
        .split(',')
        .any(|directive| directive.trim_start().starts_with("kube"));
    if !names_kube && let Ok(off) = KUBE_REQUEST_FAILURES_OFF.parse() {
        filter = filter.add_directive(off);
    }
    if args.log_json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    if let Some(e) = bad_filter {
        tracing::warn!(error = %e, filter = %args.log_filter, "invalid log filter (RUST_LOG); logging at info");
    }
}

/// The controllers' shared context, configured from the arguments.
fn context(
    args: &RunArgs,
    client: kube::Client,
    store: Store,
    namespaces: Namespaces,
    metrics: Arc<artemis_studio_operator::telemetry::Metrics>,
) -> (Arc<Context>, Reflectors) {
    let (mut ctx, reflectors) = Context::new(client, store, args.instance_id.clone(), namespaces, metrics);
    if args.sharding {
        let replica = leader::replica_name(args.pod_name.as_deref());
        let deadline = Duration::from_secs(args.lease_renew_deadline_seconds.into());
        ctx.holdings = artemis_studio_operator::shards::Holdings::sharded(replica, deadline);
        ctx.metrics.sharding.set(1);
    }
    ctx.concurrency = args.concurrency();
    ctx.capture_pass_interval = Duration::from_secs(args.capture_pass_seconds.into());
    (Arc::new(ctx), reflectors)
}

/// The health and metrics endpoint, in the background.
fn serve_health_and_metrics(
    tasks: &Supervisor,
    listen: std::net::SocketAddr,
    metrics: Arc<artemis_studio_operator::telemetry::Metrics>,
) {
    let serve = artemis_studio_operator::telemetry::serve(listen, metrics, tasks.clone());
    let health = async move {
        if let Err(e) = serve.await {
            tracing::error!(error = %e, %listen, "the health and metrics endpoint stopped");
        }
    };
    tasks.spawn("health", ends_in_tests("health", health));
}

/// Run the controllers, as the Lease's holder when leader election is on, until they stop.
async fn run_controllers(
    args: &RunArgs,
    client: kube::Client,
    timing: leader::Timing,
    ctx: Arc<Context>,
    reflectors: Reflectors,
) -> leader::Exit {
    let grace = Duration::from_secs(args.shutdown_grace_seconds.into());
    let metrics = ctx.metrics.clone();
    let shutdown = ctx.shutdown.clone();
    // /readyz turns true once the caches have synced and the controllers start (as the
    // leader), or once the Lease is seen held by another process (as a standby).
    let controllers = controllers::run_all(ctx.clone(), reflectors);
    let namespace = leader::lease_namespace(args.lease_namespace.as_deref(), args.pod_namespace.as_deref());
    if args.sharding {
        let leases = artemis_studio_operator::shards::ShardLeases::new(
            Api::namespaced(client, &namespace),
            leader::lease_name(&args.instance_id),
            leader::holder_identity(args.pod_name.as_deref()),
            timing,
        );
        tracing::info!(%namespace, identity = %leases.identity(), "sharding on: broker clusters shared out by Lease");
        return run_sharded(ctx, leases, grace, controllers).await;
    }
    let lock = if args.leader_election {
        let lock = leader::LeaseLock::new(
            Api::namespaced(client, &namespace),
            leader::lease_name(&args.instance_id),
            leader::holder_identity(args.pod_name.as_deref()),
            timing,
        );
        tracing::info!(lease = %lock.name(), %namespace, identity = %lock.identity(), "leader election on");
        Some(lock)
    } else {
        tracing::info!("leader election off: this process acts at once");
        None
    };
    leader::run(lock, shutdown, metrics, grace, controllers).await
}

/// Sharded (issue 46): the controllers at once, beside the shard loop that decides which
/// clusters they act for. A lost Lease ends the process at once; on a requested stop the loop
/// releases every cluster once its reconciles finished, and both are awaited.
async fn run_sharded(
    ctx: Arc<Context>,
    leases: artemis_studio_operator::shards::ShardLeases,
    grace: Duration,
    controllers: impl std::future::Future<Output = ()> + Send + 'static,
) -> leader::Exit {
    let metrics = ctx.metrics.clone();
    let shutdown = ctx.shutdown.clone();
    let shards = controllers::shards::run(ctx, leases, grace);
    let controllers = leader::run(None, shutdown.clone(), metrics, grace, controllers);
    tokio::pin!(shards, controllers);
    tokio::select! {
        exit = &mut shards => {
            if exit == leader::Exit::Stopped {
                controllers.await;
            }
            exit
        }
        exit = &mut controllers => {
            if shutdown.is_requested() { shards.await } else { exit }
        }
    }
}

/// SIGTERM or SIGINT asks for a graceful stop; a second one ends the process at once.
fn stop_on_signals(shutdown: leader::Shutdown, tasks: Supervisor) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // Supervision: it ends only by ending the process (a second signal).
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("stop requested (signal)");
        tasks.stopping();
        shutdown.request();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second stop signal: exiting at once");
        std::process::exit(130);
    });
    Ok(())
}
