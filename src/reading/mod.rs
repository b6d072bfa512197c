//! Reading what was captured, and the story of every broker write (ADR-0062 D2, D3, D10;
//! ADR-0049): `capture tail|search|requests` and `audit`, over the operator's Postgres. The same
//! code is the operator binary's subcommands and the `kubectl-artemis` plugin.
//!
//! Every answer about messages ends with the coverage of the window it read, per tap (where it
//! is complete, the gaps, the estimated loss), and every message says what it claims: captured
//! (routed to this address) or sampled (a browse saw it), never rendered alike.

pub mod answers;
pub mod coverage;
pub mod render;
pub mod requests;
pub mod verify;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

use crate::store::reading::KnownSubscription;
use crate::store::{DatabaseConfig, Store, StoreError};
use answers::{coverage_of, db_now, message_doc, one_subscription};
use coverage::Window;
use render::{CAPTURED_CLAIM, Document, Format, Printer, SAMPLED_CLAIM};

#[derive(Subcommand, Debug)]
pub enum ReadCommand {
    /// Read captured (and sampled) messages: tail, search, request-reply.
    #[command(subcommand)]
    Capture(CaptureCommand),
    /// The broker commands the operator issued for an object (`queue/orders`) or a whole
    /// cluster (`--cluster`), newest first: actor, verdict and every node's outcome.
    Audit(AuditArgs),
}

#[derive(Subcommand, Debug)]
pub enum CaptureCommand {
    /// Print the subscription's messages as they are stored (polling the newest rows), then the
    /// coverage of the time it ran.
    Tail(TailArgs),
    /// Stored messages in a time range, by address, property and text, oldest first, paged.
    Search(SearchArgs),
    /// Request-reply pairs on an address: latency, requests without a captured reply, and
    /// replies that cannot be captured (temporary reply queues).
    Requests(RequestsArgs),
    /// Is a captured message still on the brokers, and where? Asks every live node of its
    /// cluster with your own kubeconfig's authority.
    Verify(verify::VerifyArgs),
}

/// The operator's database, as the reading commands (and `kubectl artemis mcp`) reach it.
#[derive(Args, Debug, Clone)]
pub struct Database {
    /// The operator's Postgres URL, e.g. `postgres://user@host:5432/db`. Special characters in
    /// the user name or password must be percent-encoded; or leave the password out and give
    /// it in DATABASE_PASSWORD.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: crate::store::Secret,
    /// The Postgres password, as it is (no encoding); replaces any password in DATABASE_URL.
    #[arg(long, env = "DATABASE_PASSWORD", hide_env_values = true)]
    pub database_password: Option<crate::store::Secret>,
}

/// Where to read and how to print.
#[derive(Args, Debug, Clone)]
pub struct Source {
    #[command(flatten)]
    pub database: Database,
    /// Namespace of the objects (default: the kubeconfig context's namespace, else `default`).
    #[arg(short = 'n', long, env = "ARTEMIS_NAMESPACE")]
    pub namespace: Option<String>,
    /// Output: table, json (lines) or yaml (a stream).
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Which messages.
#[derive(Args, Debug, Clone, Default)]
pub struct MessageFilter {
    /// Only messages routed to this address.
    #[arg(long)]
    pub address: Option<String>,
    /// Only messages whose application property KEY equals VALUE (`--where region=eu`; repeat
    /// to require several).
    #[arg(long = "where", value_name = "KEY=VALUE", value_parser = parse_property)]
    pub properties: Vec<(String, String)>,
    /// Only messages whose text body contains all these words.
    #[arg(long)]
    pub text: Option<String>,
}

/// A time range: `--since`, or `--from`/`--to` (RFC 3339).
#[derive(Args, Debug, Clone, Default)]
pub struct TimeRange {
    /// How far back from now (e.g. `15m`, `2h`, `1day`). Default: 1h.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "from")]
    pub since: Option<Duration>,
    /// Start of the range (RFC 3339, e.g. 2026-12-01T09:00:00Z).
    #[arg(long)]
    pub from: Option<DateTime<Utc>>,
    /// End of the range (RFC 3339). Default: now.
    #[arg(long)]
    pub to: Option<DateTime<Utc>>,
}

impl TimeRange {
    fn window(&self, now: DateTime<Utc>) -> Result<Window, ReadError> {
        let to = self.to.unwrap_or(now);
        let from = match (self.from, self.since) {
            (Some(f), _) => f,
            (None, Some(d)) => to - chrono::Duration::from_std(d).map_err(ReadError::SinceTooLong)?,
            (None, None) => to - chrono::Duration::hours(1),
        };
        if from > to {
            return Err(ReadError::RangeBackwards { from, to });
        }
        Ok(Window { from, to })
    }
}

#[derive(Args, Debug)]
pub struct TailArgs {
    /// The ArtemisCaptureSubscription.
    pub subscription: String,
    #[command(flatten)]
    pub source: Source,
    #[command(flatten)]
    pub filter: MessageFilter,
    /// Also print this many messages stored before the tail started.
    #[arg(long, default_value_t = 0)]
    pub last: i64,
    /// How often to look for new rows.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub interval: Duration,
    /// Stop after this many messages (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this long (e.g. `5m`).
    #[arg(long = "for", value_parser = humantime::parse_duration)]
    pub run_for: Option<Duration>,
}

#[derive(Args, Debug)]
pub struct SearchArgs {
    #[command(flatten)]
    pub source: Source,
    #[command(flatten)]
    pub query: SearchQuery,
    /// Add a VERIFIED column: each row's message looked for on every live node, as `capture
    /// verify` does (with your authority; a miss scans the queue on the broker, per row).
    #[arg(long)]
    pub verify: bool,
}

/// Which stored messages a search reads: one page of them.
#[derive(Args, Debug, Clone, Default)]
pub struct SearchQuery {
    /// Search this subscription's messages …
    #[arg(long, required_unless_present = "cluster")]
    pub subscription: Option<String>,
    /// … or those of every subscription of this ArtemisCluster.
    #[arg(long)]
    pub cluster: Option<String>,
    #[command(flatten)]
    pub filter: MessageFilter,
    #[command(flatten)]
    pub range: TimeRange,
    /// Most messages per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub limit: i64,
    /// The next page: rows after this row number (the previous page says which).
    #[arg(long)]
    pub after: Option<i64>,
}

#[derive(Args, Debug)]
pub struct RequestsArgs {
    #[command(flatten)]
    pub query: RequestsQuery,
    #[command(flatten)]
    pub source: Source,
}

/// Which request-reply exchanges.
#[derive(Args, Debug, Clone, Default)]
pub struct RequestsQuery {
    /// The address requests are sent to.
    pub address: String,
    /// The ArtemisCluster (default: the cluster of the namespace's only capture subscriptions).
    #[arg(long)]
    pub cluster: Option<String>,
    #[command(flatten)]
    pub range: TimeRange,
    /// Most requests.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
}

#[derive(Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub query: AuditSelection,
    #[command(flatten)]
    pub source: Source,
}

/// Which audit rows: one object's, or a whole cluster's.
#[derive(Args, Debug, Clone, Default)]
pub struct AuditSelection {
    /// The object, `<kind>/<name>`: kind is queue, divert, cluster, capture (subscription) or
    /// connectionclose (full kind names and plurals work too).
    #[arg(required_unless_present = "cluster")]
    pub object: Option<String>,
    /// Every command on this ArtemisCluster's brokers.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Most commands.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub limit: i64,
}

/// Why a reading command gave no answer: what it was asked (each names the fix), the database,
/// or the output.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("--since is too long")]
    SinceTooLong(#[source] chrono::OutOfRangeError),
    #[error("the range starts ({from}) after it ends ({to}): check --from/--to")]
    RangeBackwards { from: DateTime<Utc>, to: DateTime<Utc> },
    #[error(
        "no capture subscription {name} in namespace {namespace} has stored anything yet: check the name and -n, \
         and `kubectl get acap -n {namespace}` for its status"
    )]
    SubscriptionNotStored { name: String, namespace: String },
    #[error(
        "{name} in namespace {namespace} names subscriptions of several clusters ({}): use search --cluster",
        .clusters.join(", ")
    )]
    SubscriptionOnSeveralClusters {
        name: String,
        namespace: String,
        clusters: Vec<String>,
    },
    #[error("subscription {subscription} belongs to cluster {belongs_to}, not {given}")]
    SubscriptionOfAnotherCluster {
        subscription: String,
        belongs_to: String,
        given: String,
    },
    #[error("give --subscription or --cluster")]
    NoSubscriptionOrCluster,
    #[error("give an object (<kind>/<name>, e.g. queue/orders) or --cluster")]
    NoObjectOrCluster,
    #[error("no capture subscription in namespace {namespace} has stored anything yet")]
    NothingStoredInNamespace { namespace: String },
    #[error(
        "namespace {namespace} has subscriptions on several clusters ({}): give --cluster",
        .clusters.join(", ")
    )]
    NamespaceOnSeveralClusters {
        namespace: String,
        clusters: Vec<String>,
    },
    #[error("`{object}` is not <kind>/<name> (e.g. queue/orders)")]
    NotKindAndName { object: String },
    #[error("unknown kind `{kind}`: use queue, divert, cluster, capture or connectionclose")]
    UnknownKind { kind: String },
    #[error(transparent)]
    Verify(#[from] verify::VerifyError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the answer: {0}")]
    Output(#[from] std::io::Error),
}

/// A `--where` that is not KEY=VALUE.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{given}` is not KEY=VALUE (e.g. --where region=eu)")]
pub struct NotAProperty {
    given: String,
}

fn parse_property(s: &str) -> Result<(String, String), NotAProperty> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(NotAProperty { given: s.to_string() }),
    }
}

/// The kind an `audit <kind>/<name>` means, as the audit log names it.
pub fn audit_kind(word: &str) -> Option<&'static str> {
    match word.to_ascii_lowercase().as_str() {
        "queue" | "queues" | "aq" | "artemisqueue" | "artemisqueues" => Some("ArtemisQueue"),
        "divert" | "diverts" | "artemisdivert" | "artemisdiverts" => Some("ArtemisDivert"),
        "cluster" | "clusters" | "artemiscluster" | "artemisclusters" => Some("ArtemisCluster"),
        "capture" | "acap" | "artemiscapturesubscription" | "artemiscapturesubscriptions" => {
            Some("ArtemisCaptureSubscription")
        }
        "connectionclose" | "connectioncloses" | "close" => Some("ConnectionClose"),
        "messagereplay" | "messagereplays" | "mreplay" | "replay" => Some("MessageReplay"),
        _ => None,
    }
}

/// The namespace of the kubeconfig's current context (what kubectl would use), if any.
fn kubeconfig_namespace() -> Option<String> {
    let config = kube::config::Kubeconfig::read().ok()?;
    let current = config.current_context.as_deref()?;
    config
        .contexts
        .iter()
        .find(|c| c.name == current)?
        .context
        .as_ref()?
        .namespace
        .clone()
}

/// The namespace a command means: the one given, else the kubeconfig context's, else
/// `default`.
pub fn namespace_or_default(given: Option<&str>) -> String {
    given
        .map(str::to_string)
        .or_else(kubeconfig_namespace)
        .unwrap_or_else(|| "default".into())
}

impl Source {
    fn namespace(&self) -> String {
        namespace_or_default(self.namespace.as_deref())
    }

    async fn store(&self) -> Result<Store, ReadError> {
        self.database.store().await
    }
}

impl Database {
    /// The operator's database, checked as the operator checks it (`store::DatabaseConfig`);
    /// a server that refuses or does not answer within [`CONNECT_WITHIN`] is an error naming
    /// it and the cause.
    pub async fn store(&self) -> Result<Store, ReadError> {
        let password = self.database_password.as_ref().map(crate::store::Secret::expose);
        let config = DatabaseConfig::new(self.database_url.expose(), password).map_err(StoreError::from)?;
        Ok(Store::connect_within(&config, CONNECT_WITHIN).await?)
    }
}

/// How long a reading command waits for its first database connection (and any later one).
pub const CONNECT_WITHIN: Duration = Duration::from_secs(4);

/// Run one reading command, printing to `out`.
pub async fn run<W: Write>(cmd: ReadCommand, out: W) -> Result<(), ReadError> {
    let result = match cmd {
        ReadCommand::Capture(CaptureCommand::Tail(a)) => tail(a, out).await,
        ReadCommand::Capture(CaptureCommand::Search(a)) => search(a, out).await,
        ReadCommand::Capture(CaptureCommand::Requests(a)) => requests_on(a, out).await,
        ReadCommand::Capture(CaptureCommand::Verify(a)) => verify::verify(a, out).await,
        ReadCommand::Audit(a) => audit(a, out).await,
    };
    match result {
        // The reader went away (`| head`): not an error.
        Err(ReadError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

async fn tail<W: Write>(a: TailArgs, out: W) -> Result<(), ReadError> {
    let ns = a.source.namespace();
    let store = a.source.store().await?;
    let sub = one_subscription(&store, &ns, &a.subscription).await?;
    let mut printer = Printer::new(out, a.source.output);
    let start = db_now(&store).await?;
    printer.print(&Document::TailStarted {
        cluster: sub.cluster.clone(),
        subscription: sub.subscription.clone(),
        mode: sub.mode.clone(),
        at: start,
        claim: if sub.sampled() {
            SAMPLED_CLAIM
        } else {
            CAPTURED_CLAIM
        },
    })?;
    if a.last > 0 {
        // `--last`: the newest rows up to the tail's start, printed oldest first.
        let before = answers::tail_query(&a.filter, &sub, None, Some(start), a.last);
        for r in &answers::newest_rows(&store, before).await? {
            printer.print(&message_doc(r))?;
        }
    }
    print_until_stopped(&store, &mut printer, &a, &sub, start).await?;
    let end = db_now(&store).await?;
    let doc = coverage_of(
        &store,
        &sub.cluster,
        Some(&sub.subscription),
        Window { from: start, to: end },
        end,
        &ns,
    )
    .await?;
    printer.print(&Document::Coverage(doc))?;
    Ok(())
}

/// Poll for rows stored since `start` and print each once, until interrupted, `--for` has
/// passed or `--count` rows were printed.
async fn print_until_stopped<W: Write>(
    store: &Store,
    printer: &mut Printer<W>,
    a: &TailArgs,
    sub: &KnownSubscription,
    start: DateTime<Utc>,
) -> Result<(), ReadError> {
    // A batch's rows carry its transaction's start time and become visible at its commit: each
    // poll looks back over this overlap and skips the rows it has printed.
    let overlap = chrono::Duration::seconds(30);
    let mut seen: BTreeMap<i64, DateTime<Utc>> = BTreeMap::new();
    let mut printed: u64 = 0;
    let deadline = a.run_for.map(|d| tokio::time::Instant::now() + d);
    let mut tick = tokio::time::interval(a.interval.max(Duration::from_millis(100)));
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut interrupted => return Ok(()),
            _ = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => return Ok(()),
        }
        let polled_at = db_now(store).await?;
        let from = start.max(polled_at - overlap);
        let rows = store
            .captured_messages(&answers::tail_query(&a.filter, sub, Some(from), None, 10_000))
            .await?;
        for r in rows.iter().filter(|r| r.captured_at >= start) {
            if seen.insert(r.row_id, r.captured_at).is_some() {
                continue;
            }
            printer.print(&message_doc(r))?;
            printed += 1;
            if a.count.is_some_and(|c| printed >= c) {
                return Ok(());
            }
        }
        seen.retain(|_, at| *at >= polled_at - overlap - overlap);
    }
}

async fn search<W: Write>(a: SearchArgs, out: W) -> Result<(), ReadError> {
    let ns = a.source.namespace();
    let store = a.source.store().await?;
    let page = answers::search_page(&store, &ns, &a.query).await?;
    let mut verified: Vec<Option<String>> = vec![None; page.rows.len()];
    if let (true, Some(first)) = (a.verify, page.rows.first()) {
        let verdicts = verify::verdicts(&first.cluster, &page.rows).await?;
        verified = verdicts.into_iter().map(Some).collect();
    }
    let mut printer = Printer::new(out, a.source.output);
    for (r, v) in page.rows.iter().zip(verified) {
        printer.print(&answers::verified_doc(r, v))?;
    }
    if let Some(after_row) = page.next_after {
        printer.print(&Document::NextPage { after_row })?;
    }
    printer.print(&Document::Coverage(page.coverage))?;
    Ok(())
}

async fn requests_on<W: Write>(a: RequestsArgs, out: W) -> Result<(), ReadError> {
    let ns = a.source.namespace();
    let store = a.source.store().await?;
    let (exchanges, doc) = answers::exchanges(&store, &ns, &a.query).await?;
    let mut printer = Printer::new(out, a.source.output);
    for x in &exchanges {
        printer.print(&Document::Exchange(x))?;
    }
    printer.print(&Document::Coverage(doc))?;
    Ok(())
}

async fn audit<W: Write>(a: AuditArgs, out: W) -> Result<(), ReadError> {
    let ns = a.source.namespace();
    let store = a.source.store().await?;
    let rows = answers::audit_rows(&store, &ns, &a.query).await?;
    let mut printer = Printer::new(out, a.source.output);
    for r in &rows {
        printer.print(&Document::Audit(r))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_properties_parse_with_an_error_naming_the_fix() {
        assert_eq!(audit_kind("queue"), Some("ArtemisQueue"));
        assert_eq!(
            audit_kind("ArtemisCaptureSubscriptions"),
            Some("ArtemisCaptureSubscription")
        );
        assert_eq!(audit_kind("pod"), None);
        assert_eq!(parse_property("region=eu"), Ok(("region".into(), "eu".into())));
        assert_eq!(parse_property("k=a=b"), Ok(("k".into(), "a=b".into())));
        assert_eq!(
            parse_property("region").map_err(|e| e.to_string()),
            Err("`region` is not KEY=VALUE (e.g. --where region=eu)".to_string())
        );
    }

    #[test]
    fn a_range_defaults_to_the_last_hour_and_refuses_to_run_backwards() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).expect("time");
        let w = TimeRange::default().window(now).expect("window");
        assert_eq!((w.to - w.from).num_minutes(), 60);
        let backwards = TimeRange {
            from: Some(now),
            to: Some(now - chrono::Duration::seconds(1)),
            since: None,
        };
        assert!(matches!(
            backwards.window(now),
            Err(ReadError::RangeBackwards { .. })
        ));
    }
}
