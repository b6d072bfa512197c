use std::sync::Arc;

use clap::Parser;

use artemis_studio_operator::cli::{Cli, Command, RunArgs};
use artemis_studio_operator::controllers::{self, Context, Namespaces};
use artemis_studio_operator::store::Store;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => print!("{}", artemis_studio_operator::api::crds_yaml()?),
        Command::Run(args) => run(*args).await?,
    }
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let (filter, bad_filter) = match tracing_subscriber::EnvFilter::try_new(&args.log_filter) {
        Ok(f) => (f, None),
        Err(e) => (tracing_subscriber::EnvFilter::new("info"), Some(e)),
    };
    if args.log_json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    if let Some(e) = bad_filter {
        tracing::warn!(error = %e, filter = %args.log_filter, "invalid log filter (RUST_LOG); logging at info");
    }
    let namespaces = Namespaces::from_list(args.watch_namespaces());
    Store::migrate(&args.database_url).await?;
    let store = Store::connect(&args.database_url).await?;
    // Every Kubernetes API request is counted (artemis_studio_api_requests_total).
    let metrics = Arc::new(artemis_studio_operator::telemetry::Metrics::default());
    let client = artemis_studio_operator::telemetry::api_client(metrics.clone()).await?;
    let (mut ctx, reflectors) = Context::new(client, store, args.instance_id.clone(), namespaces.clone());
    ctx.metrics = metrics;
    let ctx = Arc::new(ctx);
    tracing::info!(
        instance_id = %args.instance_id,
        namespaces = ?namespaces,
        listen = %args.listen,
        pod = ?args.pod_name,
        pod_namespace = ?args.pod_namespace,
        "starting controllers"
    );
    let metrics = ctx.metrics.clone();
    let listen = args.listen;
    tokio::spawn(async move {
        if let Err(e) = artemis_studio_operator::telemetry::serve(listen, metrics).await {
            tracing::error!(error = %e, %listen, "the health and metrics endpoint stopped");
        }
    });
    // /readyz turns true once the caches have synced and the controllers start.
    controllers::run_all(ctx, reflectors).await;
    Ok(())
}
