//! The binary's command line. Every setting is a flag with an environment variable (what the
//! Helm chart sets); `src/config_contract.rs` checks that the chart sets no variable not listed
//! here, and the README's configuration reference is this file in prose.

use clap::{Parser, Subcommand};

/// Artemis Studio Operator: queues on every live node, safe connection closes, complete capture.
#[derive(Parser, Debug)]
#[command(name = "artemis-studio-operator", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions (YAML) of every kind.
    Crd,
    /// Run the controllers (kubeconfig from KUBECONFIG or in-cluster).
    Run(Box<RunArgs>),
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Postgres URL for the audit log (and captured messages).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// This installation's ID: the capture objects it owns carry it.
    #[arg(long, env = "INSTANCE_ID", default_value = "studio")]
    pub instance_id: String,
    /// Namespaces to watch, comma-separated (default: all).
    #[arg(long, env = "WATCH_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// One namespace to watch (the older form of --namespaces; both may be given and add up).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long, env = "LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
    /// Log filter (tracing's env-filter syntax, e.g. `info,artemis_studio_operator=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
    /// Log as JSON lines.
    #[arg(long, env = "LOG_JSON", default_value_t = false)]
    pub log_json: bool,
    /// This replica's name (the chart sets it from the downward API): the reporting instance
    /// of the Events the operator writes, and logged at start-up.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The namespace this replica runs in (the chart sets it from the downward API); logged at
    /// start-up.
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
}

impl RunArgs {
    /// The namespaces to watch: WATCH_NAMESPACES and WATCH_NAMESPACE together, blanks dropped,
    /// each once, in the order given. Empty means every namespace.
    pub fn watch_namespaces(&self) -> Vec<String> {
        let mut out: Vec<String> = vec![];
        for ns in self.namespaces.iter().chain(self.namespace.iter()) {
            let ns = ns.trim();
            if !ns.is_empty() && !out.iter().any(|o| o == ns) {
                out.push(ns.to_string());
            }
        }
        out
    }
}

/// The environment variables `run` reads (each flag's `env`).
pub fn run_env_vars() -> Vec<String> {
    use clap::CommandFactory;
    Cli::command()
        .find_subcommand("run")
        .map(|run| {
            run.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> RunArgs {
        let mut argv = vec!["artemis-studio-operator", "run", "--database-url", "postgres://x"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).expect("parse").command {
            Command::Run(r) => *r,
            Command::Crd => panic!("parsed as crd"),
        }
    }

    #[test]
    fn namespaces_are_a_comma_separated_list_and_the_old_single_form_adds_to_it() {
        assert!(
            run_args(&[]).watch_namespaces().is_empty(),
            "none given: every namespace"
        );
        assert_eq!(run_args(&["--namespaces", "a,b"]).watch_namespaces(), ["a", "b"]);
        assert_eq!(
            run_args(&["--namespaces", "a, b,,a", "--namespace", "c"]).watch_namespaces(),
            ["a", "b", "c"]
        );
        assert_eq!(run_args(&["--namespace", "demo"]).watch_namespaces(), ["demo"]);
        assert!(run_args(&["--namespaces", ""]).watch_namespaces().is_empty());
    }

    #[test]
    fn every_run_setting_has_an_environment_variable() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let run = cmd.find_subcommand("run").expect("run subcommand");
        for a in run.get_arguments() {
            let id = a.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            assert!(a.get_env().is_some(), "--{id} has no environment variable");
        }
        let env = run_env_vars();
        for v in [
            "DATABASE_URL",
            "WATCH_NAMESPACES",
            "WATCH_NAMESPACE",
            "RUST_LOG",
            "POD_NAME",
        ] {
            assert!(env.iter().any(|e| e == v), "{v} is not read: {env:?}");
        }
    }
}
