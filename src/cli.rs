//! The binary's command line. Every setting is a flag with an environment variable (what the
//! Helm chart sets); `src/config_contract.rs` checks that the chart sets no variable not listed
//! here, and the README's configuration reference is this file in prose.

use clap::{Parser, Subcommand};

use crate::store::Secret;

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
    /// Read what was captured or what the operator did (the same commands as `kubectl artemis`).
    #[command(flatten)]
    Read(Box<crate::reading::ReadCommand>),
}

/// `kubectl artemis …`: the reading commands as a kubectl plugin (a binary named
/// `kubectl-artemis` on PATH).
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-artemis",
    bin_name = "kubectl artemis",
    version,
    about = "Read what Artemis Studio Operator captured and did: capture tail|search|requests, audit"
)]
pub struct PluginCli {
    #[command(subcommand)]
    pub command: crate::reading::ReadCommand,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Postgres URL for the audit log (and captured messages), e.g.
    /// `postgres://user@host:5432/db`. Special characters in the user name or password must be
    /// percent-encoded (`/` as %2F, `#` as %23, `@` as %40, …); or leave the password out and
    /// give it in DATABASE_PASSWORD.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Secret,
    /// The Postgres password, as it is (no encoding); replaces any password in DATABASE_URL.
    /// Never logged.
    #[arg(long, env = "DATABASE_PASSWORD", hide_env_values = true)]
    pub database_password: Option<Secret>,
    /// This installation's ID: the capture objects it owns carry it.
    #[arg(long, env = "INSTANCE_ID", default_value = "studio")]
    pub instance_id: String,
    /// Namespaces to watch, comma-separated (default: all).
    #[arg(long, env = "WATCH_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// One namespace to watch (the older form of --namespaces; both may be given and add up).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Seconds between capture passes over each cluster this replica serves (ADR-0062 D6); a
    /// subscription change triggers one sooner. Every replica runs capture: a Postgres advisory
    /// lock per cluster decides which one serves it.
    #[arg(long, env = "CAPTURE_PASS_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub capture_pass_seconds: u32,
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
    /// Elect a leader on a coordination.k8s.io/v1 Lease: only the holder runs the controllers,
    /// the others wait as ready standbys. `false` makes this process act at once (local
    /// development, or exactly one replica that is never run twice).
    #[arg(
        long,
        env = "LEADER_ELECTION",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub leader_election: bool,
    /// Share the broker clusters out between the replicas (issue 46): every replica runs the
    /// controllers, and each ArtemisCluster (with every object naming it, and its capture) is
    /// acted for by exactly one replica, which holds the cluster's Lease. Replaces leader
    /// election (the chart turns it on when replicaCount > 1).
    #[arg(
        long,
        env = "SHARDING",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub sharding: bool,
    /// Namespace of the leader Lease (`artemis-studio-operator-<instance ID>`). Default: the
    /// pod's namespace (POD_NAMESPACE), else `default`.
    #[arg(long, env = "LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long a Lease stays valid after its last renewal: a standby takes it over once it has
    /// seen no renewal for this long.
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub lease_duration_seconds: u32,
    /// The leader stops (its controllers at once, then the process, non-zero) when it has not
    /// renewed the Lease for this long; less than the lease duration, so it stops before a
    /// standby may take over.
    #[arg(long, env = "LEASE_RENEW_DEADLINE_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub lease_renew_deadline_seconds: u32,
    /// How often the leader renews the Lease and a standby tries to take it; less than the
    /// renew deadline.
    #[arg(long, env = "LEASE_RETRY_PERIOD_SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub lease_retry_period_seconds: u32,
    /// On SIGTERM/SIGINT the controllers take no new reconcile and in-flight ones get this long
    /// to finish before the Lease is released; past it they are cancelled and the Lease is left
    /// to expire.
    #[arg(long, env = "SHUTDOWN_GRACE_SECONDS", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(0..=3600))]
    pub shutdown_grace_seconds: u32,
    /// ArtemisQueue reconciles run at once, at most (1 or more).
    #[arg(long, env = "QUEUE_CONCURRENCY", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub queue_concurrency: u16,
    /// ArtemisDivert reconciles run at once, at most (1 or more).
    #[arg(long, env = "DIVERT_CONCURRENCY", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub divert_concurrency: u16,
    /// ArtemisCluster reconciles run at once, at most (1 or more).
    #[arg(long, env = "CLUSTER_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub cluster_concurrency: u16,
    /// ConnectionClose reconciles run at once, at most (1 or more).
    #[arg(long, env = "CONNECTION_CLOSE_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub connection_close_concurrency: u16,
}

/// How many reconciles of each kind may run at once (each at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Concurrency {
    pub queue: u16,
    pub divert: u16,
    pub cluster: u16,
    pub connection_close: u16,
}

impl Default for Concurrency {
    /// The flags' defaults.
    fn default() -> Self {
        Concurrency {
            queue: 64,
            divert: 64,
            cluster: 4,
            connection_close: 4,
        }
    }
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

    /// Per-kind reconcile concurrency (QUEUE_CONCURRENCY, DIVERT_CONCURRENCY,
    /// CLUSTER_CONCURRENCY, CONNECTION_CLOSE_CONCURRENCY).
    pub fn concurrency(&self) -> Concurrency {
        Concurrency {
            queue: self.queue_concurrency,
            divert: self.divert_concurrency,
            cluster: self.cluster_concurrency,
            connection_close: self.connection_close_concurrency,
        }
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
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn the_database_settings_never_show_in_debug() {
        let a = run_args(&["--database-password", "Qxq@Zzy/Kwk#Jvj"]);
        assert_eq!(
            a.database_password.as_ref().map(Secret::expose),
            Some("Qxq@Zzy/Kwk#Jvj")
        );
        let shown = format!("{a:?}");
        assert!(
            !shown.contains("Qxq") && !shown.contains("postgres://"),
            "{shown}"
        );
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
    fn leader_election_is_on_by_default_and_takes_a_boolish_value() {
        let a = run_args(&[]);
        assert!(a.leader_election);
        assert_eq!(
            (
                a.lease_duration_seconds,
                a.lease_renew_deadline_seconds,
                a.lease_retry_period_seconds
            ),
            (15, 10, 2)
        );
        assert_eq!(a.shutdown_grace_seconds, 20);
        assert!(!run_args(&["--leader-election", "false"]).leader_election);
        assert!(!run_args(&["--leader-election=no"]).leader_election);
        assert!(run_args(&["--leader-election"]).leader_election);
        let bad = [
            "artemis-studio-operator",
            "run",
            "--database-url",
            "x",
            "--lease-duration-seconds",
            "0",
        ];
        assert!(
            Cli::try_parse_from(bad).is_err(),
            "a zero lease duration is refused"
        );
    }

    #[test]
    fn concurrency_has_defaults_and_refuses_zero() {
        assert_eq!(
            run_args(&[]).concurrency(),
            Concurrency {
                queue: 64,
                divert: 64,
                cluster: 4,
                connection_close: 4
            }
        );
        let c = run_args(&[
            "--queue-concurrency",
            "1",
            "--divert-concurrency",
            "2",
            "--cluster-concurrency",
            "3",
            "--connection-close-concurrency",
            "65535",
        ])
        .concurrency();
        assert_eq!(
            (c.queue, c.divert, c.cluster, c.connection_close),
            (1, 2, 3, 65535)
        );
        for flag in [
            "--queue-concurrency",
            "--divert-concurrency",
            "--cluster-concurrency",
            "--connection-close-concurrency",
        ] {
            let argv = ["artemis-studio-operator", "run", "--database-url", "x", flag, "0"];
            assert!(Cli::try_parse_from(argv).is_err(), "{flag} 0 is refused");
        }
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
            "DATABASE_PASSWORD",
            "WATCH_NAMESPACES",
            "WATCH_NAMESPACE",
            "RUST_LOG",
            "POD_NAME",
            "LEADER_ELECTION",
            "LEASE_NAMESPACE",
            "LEASE_DURATION_SECONDS",
            "LEASE_RENEW_DEADLINE_SECONDS",
            "LEASE_RETRY_PERIOD_SECONDS",
            "SHUTDOWN_GRACE_SECONDS",
            "QUEUE_CONCURRENCY",
            "DIVERT_CONCURRENCY",
            "CLUSTER_CONCURRENCY",
            "CONNECTION_CLOSE_CONCURRENCY",
        ] {
            assert!(env.iter().any(|e| e == v), "{v} is not read: {env:?}");
        }
    }
}
