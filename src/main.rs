use std::sync::Arc;

use clap::{Parser, Subcommand};

use artemis_studio_operator::controllers::{self, Context, Namespaces};
use artemis_studio_operator::store::Store;

/// Artemis Studio Operator: queues on every live node, safe connection closes, complete capture.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions (YAML) of every kind.
    Crd,
    /// Run the controllers (kubeconfig from KUBECONFIG or in-cluster).
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Postgres URL for the audit log (and captured messages).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// This installation's ID: the capture objects it owns carry it.
    #[arg(long, env = "INSTANCE_ID", default_value = "studio")]
    instance_id: String,
    /// Namespaces to watch, comma-separated (default: all).
    #[arg(
        long,
        visible_alias = "namespace",
        env = "WATCH_NAMESPACES",
        default_value = ""
    )]
    namespaces: String,
    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long, env = "LISTEN", default_value = "0.0.0.0:8080")]
    listen: std::net::SocketAddr,
    /// Log as JSON lines.
    #[arg(long, env = "LOG_JSON", default_value_t = false)]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => print!("{}", artemis_studio_operator::api::crds_yaml()?),
        Command::Run(args) => run(args).await?,
    }
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if args.log_json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    Store::migrate(&args.database_url).await?;
    let store = Store::connect(&args.database_url).await?;
    let client = kube::Client::try_default().await?;
    let namespaces = Namespaces::parse(&args.namespaces);
    let (ctx, reflectors) = Context::new(client, store, args.instance_id.clone(), namespaces.clone());
    let ctx = Arc::new(ctx);
    tracing::info!(instance_id = %args.instance_id, namespaces = ?namespaces, listen = %args.listen, "starting controllers");
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
