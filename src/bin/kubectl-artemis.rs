//! `kubectl artemis …`: the operator binary's reading commands (capture tail|search|requests,
//! audit) as a kubectl plugin. Reads the operator's Postgres (`--database-url` or DATABASE_URL).

use clap::Parser;

use artemis_studio_operator::cli::PluginCli;

#[tokio::main]
async fn main() {
    let cli = PluginCli::parse();
    if let Err(e) = artemis_studio_operator::reading::run(cli.command, std::io::stdout().lock()).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
