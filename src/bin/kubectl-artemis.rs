//! `kubectl artemis …`: the operator binary's reading commands (capture tail|search|requests,
//! audit) as a kubectl plugin. Reads the operator's Postgres (`--database-url` or DATABASE_URL).
//! `kubectl artemis version` is the plugin's own: its version and the commit it was built from,
//! read from the binary alone (no cluster, no database). `kubectl artemis mcp` serves MCP over
//! stdio for an agent (issue 48, `src/mcp/`).

use std::io::Write;

use clap::{Args, CommandFactory, FromArgMatches};
use serde::Serialize;

use artemis_studio_operator::cli::PluginCli;
use artemis_studio_operator::mcp::McpArgs;
use artemis_studio_operator::reading::render::Format;

/// The commit this binary was built from: `deploy/release/archives` sets ARTEMIS_STUDIO_COMMIT
/// (`git rev-parse HEAD`, `-dirty` when tracked files differ from it); any other build says so.
const COMMIT: &str = match option_env!("ARTEMIS_STUDIO_COMMIT") {
    Some(c) if !c.is_empty() => c,
    _ => "unknown",
};

/// Print this plugin's version and the commit it was built from (reads nothing else).
#[derive(Args, Debug)]
struct VersionArgs {
    /// Output: table (one line), json or yaml.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    output: Format,
}

/// What `version` prints (`kind` like every other document the plugin prints).
#[derive(Serialize)]
#[serde(tag = "kind", rename = "Version")]
struct VersionDoc {
    name: &'static str,
    version: &'static str,
    commit: &'static str,
}

const VERSION: VersionDoc = VersionDoc {
    name: "kubectl-artemis",
    version: env!("CARGO_PKG_VERSION"),
    commit: COMMIT,
};

fn print_version(args: VersionArgs, mut out: impl Write) -> anyhow::Result<()> {
    let v = &VERSION;
    match args.output {
        Format::Table => writeln!(out, "{} {} (commit {})", v.name, v.version, v.commit)?,
        Format::Json => writeln!(out, "{}", serde_json::to_string(v)?)?,
        Format::Yaml => write!(out, "---\n{}", serde_saphyr::to_string(v)?)?,
    }
    Ok(out.flush()?)
}

#[tokio::main]
async fn main() {
    // The reading commands are PluginCli's (shared with the operator binary); `version` is added
    // here, being about this binary only.
    let version = VersionArgs::augment_args(clap::Command::new("version"));
    // `mcp` is the plugin's own too: it acts with the caller's kubeconfig, never a pod's.
    let mcp = McpArgs::augment_args(clap::Command::new("mcp"));
    let matches = PluginCli::command()
        .subcommand(version)
        .subcommand(mcp)
        .get_matches();
    let done = match matches.subcommand() {
        Some(("version", m)) => {
            let args = VersionArgs::from_arg_matches(m).unwrap_or_else(|e| e.exit());
            print_version(args, std::io::stdout().lock())
        }
        Some(("mcp", m)) => {
            let args = McpArgs::from_arg_matches(m).unwrap_or_else(|e| e.exit());
            artemis_studio_operator::mcp::serve(args)
                .await
                .map_err(anyhow::Error::from)
        }
        _ => {
            let cli = PluginCli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
            artemis_studio_operator::reading::run(cli.command, std::io::stdout().lock())
                .await
                .map_err(anyhow::Error::from)
        }
    };
    if let Err(e) = done {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
