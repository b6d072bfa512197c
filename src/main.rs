use std::sync::Arc;

use clap::Parser;
use kube::{Api, Client};

use artemis_studio_operator::api::{ArtemisCluster, ArtemisDivert, ArtemisQueue, ConnectionClose};
use artemis_studio_operator::cli::{Cli, Command, RunArgs};
use artemis_studio_operator::controllers::{self, Context};
use artemis_studio_operator::store::Store;
use futures::future::join_all;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => print!("{}", artemis_studio_operator::api::crds_yaml()?),
        Command::Run(args) => run(*args).await?,
    }
    Ok(())
}

/// One Api per watched namespace, or one over all namespaces when none is named.
fn apis<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    if namespaces.is_empty() {
        return vec![Api::all(client.clone())];
    }
    namespaces
        .iter()
        .map(|ns| Api::namespaced(client.clone(), ns))
        .collect()
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
    let namespaces = args.watch_namespaces();
    Store::migrate(&args.database_url).await?;
    let store = Store::connect(&args.database_url).await?;
    let client = Client::try_default().await?;
    let ctx = Arc::new(Context::new(client.clone(), store, args.instance_id.clone()));
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
    ctx.metrics.set_ready();
    let closes = apis::<ConnectionClose>(&client, &namespaces)
        .into_iter()
        .map(|api| controllers::connection_close::run(ctx.clone(), api));
    let clusters = apis::<ArtemisCluster>(&client, &namespaces)
        .into_iter()
        .map(|api| controllers::cluster::run(ctx.clone(), api));
    let queues = apis::<ArtemisQueue>(&client, &namespaces)
        .into_iter()
        .map(|api| controllers::queue::run(ctx.clone(), api));
    let diverts = apis::<ArtemisDivert>(&client, &namespaces)
        .into_iter()
        .map(|api| controllers::divert::run(ctx.clone(), api));
    tokio::join!(
        join_all(closes),
        join_all(clusters),
        join_all(queues),
        join_all(diverts),
    );
    Ok(())
}
