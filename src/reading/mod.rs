//! Reading what was captured, and the story of every broker write (ADR-0062 D2, D3, D10;
//! ADR-0049): `capture tail|search|requests` and `audit`, over the operator's Postgres. The same
//! code is the operator binary's subcommands and the `kubectl-artemis` plugin.
//!
//! Every answer about messages ends with the coverage of the window it read, per tap (where it
//! is complete, the gaps, the estimated loss), and every message says what it claims: captured
//! (routed to this address) or sampled (a browse saw it), never rendered alike.

pub mod coverage;
pub mod render;
pub mod requests;
pub mod verify;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

use crate::store::reading::{AuditQuery, KnownSubscription, MessageQuery, StoredMessage};
use crate::store::{DatabaseConfig, Store, StoreError};
use coverage::Window;
use render::{CAPTURED_CLAIM, CoverageDoc, Document, Format, MessageDoc, Printer, SAMPLED_CLAIM};

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

/// Where to read and how to print.
#[derive(Args, Debug, Clone)]
pub struct Source {
    /// The operator's Postgres URL, e.g. `postgres://user@host:5432/db`. Special characters in
    /// the user name or password must be percent-encoded; or leave the password out and give
    /// it in DATABASE_PASSWORD.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: crate::store::Secret,
    /// The Postgres password, as it is (no encoding); replaces any password in DATABASE_URL.
    #[arg(long, env = "DATABASE_PASSWORD", hide_env_values = true)]
    pub database_password: Option<crate::store::Secret>,
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
    /// The address requests are sent to.
    pub address: String,
    #[command(flatten)]
    pub source: Source,
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
    /// The object, `<kind>/<name>`: kind is queue, divert, cluster, capture (subscription) or
    /// connectionclose (full kind names and plurals work too).
    #[arg(required_unless_present = "cluster")]
    pub object: Option<String>,
    #[command(flatten)]
    pub source: Source,
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

impl Source {
    fn namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(kubeconfig_namespace)
            .unwrap_or_else(|| "default".into())
    }

    /// The operator's database, checked as the operator checks it (`store::DatabaseConfig`);
    /// a server that refuses or does not answer within [`CONNECT_WITHIN`] is an error naming
    /// it and the cause.
    async fn store(&self) -> Result<Store, ReadError> {
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

async fn db_now(store: &Store) -> Result<DateTime<Utc>, ReadError> {
    Ok(sqlx::query_scalar("SELECT now()")
        .fetch_one(store.pool())
        .await
        .map_err(StoreError::from)?)
}

async fn one_subscription(store: &Store, ns: &str, name: &str) -> Result<KnownSubscription, ReadError> {
    let mut found = store.known_subscriptions(ns, Some(name)).await?;
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(ReadError::SubscriptionNotStored {
            name: name.to_string(),
            namespace: ns.to_string(),
        }),
        _ => Err(ReadError::SubscriptionOnSeveralClusters {
            name: name.to_string(),
            namespace: ns.to_string(),
            clusters: found.into_iter().map(|s| s.cluster).collect(),
        }),
    }
}

/// The coverage of `window` for one subscription (or every subscription of the cluster).
async fn coverage_of(
    store: &Store,
    cluster: &str,
    subscription: Option<&str>,
    window: Window,
    now: DateTime<Utc>,
    namespace: &str,
) -> Result<CoverageDoc, ReadError> {
    let sessions = store
        .coverage_sessions(cluster, subscription, window.from, window.to)
        .await?;
    let taps = store
        .tap_incarnations(cluster, subscription, window.from, window.to)
        .await?;
    let losses = store.loss_tallies(cluster, subscription).await?;
    let sampled: Vec<String> = store
        .known_subscriptions(namespace, subscription)
        .await?
        .into_iter()
        .filter(|s| s.cluster == cluster && s.sampled())
        .map(|s| s.subscription)
        .collect();
    Ok(CoverageDoc::new(
        window,
        coverage::assess(window, now, &sessions, &taps, &losses),
        sampled,
    ))
}

fn message_doc(row: &StoredMessage) -> Document<'_> {
    Document::Message(MessageDoc {
        row,
        claim: if row.sampled() {
            SAMPLED_CLAIM
        } else {
            CAPTURED_CLAIM
        },
    })
}

fn cluster_key(ns: &str, name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{ns}/{name}")
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
        let before = tail_query(&a, &sub, None, Some(start), a.last);
        print_before_start(&store, &mut printer, before).await?;
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

/// What a tail reads: the subscription's rows that pass its filter, oldest first.
fn tail_query(
    a: &TailArgs,
    sub: &KnownSubscription,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    limit: i64,
) -> MessageQuery {
    MessageQuery {
        cluster: sub.cluster.clone(),
        subscription: Some(sub.subscription.clone()),
        address: a.filter.address.clone(),
        from,
        to,
        properties: a.filter.properties.clone(),
        text: a.filter.text.clone(),
        after_row: None,
        limit,
        newest_first: false,
    }
}

/// `--last`: the newest rows `before` matches (the rows up to the tail's start).
async fn print_before_start<W: Write>(
    store: &Store,
    printer: &mut Printer<W>,
    before: MessageQuery,
) -> Result<(), ReadError> {
    // The newest `last` rows before the start, printed oldest first.
    let mut earlier = store
        .captured_messages(&MessageQuery {
            newest_first: true,
            ..before
        })
        .await?;
    earlier.reverse();
    for r in &earlier {
        printer.print(&message_doc(r))?;
    }
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
            .captured_messages(&tail_query(a, sub, Some(from), None, 10_000))
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
    let (cluster, subscription) = match (&a.subscription, &a.cluster) {
        (Some(s), cluster) => {
            let sub = one_subscription(&store, &ns, s).await?;
            if let Some(c) = cluster
                && cluster_key(&ns, c) != sub.cluster
            {
                return Err(ReadError::SubscriptionOfAnotherCluster {
                    subscription: s.clone(),
                    belongs_to: sub.cluster,
                    given: c.clone(),
                });
            }
            (sub.cluster, Some(sub.subscription))
        }
        (None, Some(c)) => (cluster_key(&ns, c), None),
        (None, None) => return Err(ReadError::NoSubscriptionOrCluster),
    };
    let now = db_now(&store).await?;
    let window = a.range.window(now)?;
    let rows = store
        .captured_messages(&MessageQuery {
            cluster: cluster.clone(),
            subscription: subscription.clone(),
            address: a.filter.address.clone(),
            from: Some(window.from),
            to: Some(window.to),
            properties: a.filter.properties.clone(),
            text: a.filter.text.clone(),
            after_row: a.after,
            limit: a.limit + 1,
            newest_first: false,
        })
        .await?;
    let more = rows.len() as i64 > a.limit;
    let page = &rows[..rows.len().min(usize::try_from(a.limit).unwrap_or(usize::MAX))];
    let mut printer = Printer::new(out, a.source.output);
    for r in page {
        printer.print(&message_doc(r))?;
    }
    if more && let Some(last) = page.last() {
        printer.print(&Document::NextPage {
            after_row: last.row_id,
        })?;
    }
    let mut doc = coverage_of(&store, &cluster, subscription.as_deref(), window, now, &ns).await?;
    if let Some(address) = &a.filter.address {
        doc.taps.retain(|t| &t.address == address);
        doc = CoverageDoc::new(doc.window, doc.taps, doc.sampled_subscriptions);
    }
    printer.print(&Document::Coverage(doc))?;
    Ok(())
}

async fn requests_on<W: Write>(a: RequestsArgs, out: W) -> Result<(), ReadError> {
    let ns = a.source.namespace();
    let store = a.source.store().await?;
    let cluster = match &a.cluster {
        Some(c) => cluster_key(&ns, c),
        None => {
            let clusters: BTreeSet<String> = store
                .known_subscriptions(&ns, None)
                .await?
                .into_iter()
                .map(|s| s.cluster)
                .collect();
            match clusters.len() {
                1 => clusters.into_iter().next().unwrap_or_default(),
                0 => {
                    return Err(ReadError::NothingStoredInNamespace { namespace: ns });
                }
                _ => {
                    return Err(ReadError::NamespaceOnSeveralClusters {
                        namespace: ns,
                        clusters: clusters.into_iter().collect(),
                    });
                }
            }
        }
    };
    let now = db_now(&store).await?;
    let window = a.range.window(now)?;
    let requests: Vec<StoredMessage> = store
        .captured_messages(&MessageQuery {
            cluster: cluster.clone(),
            address: Some(a.address.clone()),
            from: Some(window.from),
            to: Some(window.to),
            limit: a.limit,
            ..MessageQuery::default()
        })
        .await?
        .into_iter()
        .filter(|r| r.reply_to.is_some())
        .collect();
    let ids: Vec<String> = requests
        .iter()
        .flat_map(|r| [r.message_id.clone(), r.correlation_id.clone()])
        .flatten()
        .collect();
    let replies = store.correlated_messages(&cluster, &ids, window.from).await?;
    // Replies may come after the window's end; the coverage read covers them up to now.
    let doc = coverage_of(
        &store,
        &cluster,
        None,
        Window {
            from: window.from,
            to: now,
        },
        now,
        &ns,
    )
    .await?;
    let captured: BTreeSet<String> = doc.taps.iter().map(|t| t.address.clone()).collect();
    let exchanges = requests::correlate(&requests, &replies, &captured);
    let mut printer = Printer::new(out, a.source.output);
    for x in &exchanges {
        printer.print(&Document::Exchange(x))?;
    }
    printer.print(&Document::Coverage(doc))?;
    Ok(())
}

async fn audit<W: Write>(a: AuditArgs, out: W) -> Result<(), ReadError> {
    let ns = a.source.namespace();
    let object = match &a.object {
        Some(o) => {
            let (kind, name) = o
                .split_once('/')
                .ok_or_else(|| ReadError::NotKindAndName { object: o.clone() })?;
            let kind = audit_kind(kind).ok_or_else(|| ReadError::UnknownKind {
                kind: kind.to_string(),
            })?;
            Some((kind.to_string(), name.to_string()))
        }
        None => None,
    };
    let store = a.source.store().await?;
    let rows = store
        .audit_records(&AuditQuery {
            namespace: ns.clone(),
            object,
            cluster: a.cluster.as_deref().map(|c| cluster_key(&ns, c)),
            limit: a.limit,
        })
        .await?;
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
