//! The answers of the reading commands as data: what `capture search|requests`, the last rows
//! of a tail, a window's coverage and `audit` find, before anything is printed. The commands
//! print them (`super::run`); `kubectl artemis mcp` returns them to an agent (issue 48).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use super::coverage::Window;
use super::render::{CAPTURED_CLAIM, CoverageDoc, Document, MessageDoc, SAMPLED_CLAIM};
use super::requests::{self, Exchange};
use super::{AuditSelection, MessageFilter, ReadError, RequestsQuery, SearchQuery, TimeRange};
use crate::store::reading::{AuditQuery, AuditRecord, KnownSubscription, MessageQuery, StoredMessage};
use crate::store::{Store, StoreError};

/// The database's clock: every window is measured on it, never on the reader's.
pub async fn db_now(store: &Store) -> Result<DateTime<Utc>, ReadError> {
    Ok(sqlx::query_scalar("SELECT now()")
        .fetch_one(store.pool())
        .await
        .map_err(StoreError::from)?)
}

/// The one subscription of that name the database knows in the namespace.
pub async fn one_subscription(store: &Store, ns: &str, name: &str) -> Result<KnownSubscription, ReadError> {
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
pub async fn coverage_of(
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
        super::coverage::assess(window, now, &sessions, &taps, &losses),
        sampled,
    ))
}

/// A stored row as printed: with its origin's claim (ADR-0062 D10).
pub fn message_doc(row: &StoredMessage) -> Document<'_> {
    verified_doc(row, None)
}

/// A stored row as printed, with where it is now when it was verified.
pub fn verified_doc(row: &StoredMessage, verified: Option<String>) -> Document<'_> {
    Document::Message(MessageDoc {
        row,
        claim: if row.sampled() {
            SAMPLED_CLAIM
        } else {
            CAPTURED_CLAIM
        },
        verified,
    })
}

/// `namespace/name` of an ArtemisCluster named in the namespace (or already `namespace/name`).
pub fn cluster_key(ns: &str, name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{ns}/{name}")
    }
}

/// The cluster (`namespace/name`) and subscription a read covers: a subscription's own
/// cluster (which a cluster given beside it must be), or every subscription of a cluster.
pub async fn scope(
    store: &Store,
    ns: &str,
    subscription: Option<&str>,
    cluster: Option<&str>,
) -> Result<(String, Option<String>), ReadError> {
    match (subscription, cluster) {
        (Some(s), cluster) => {
            let sub = one_subscription(store, ns, s).await?;
            if let Some(c) = cluster
                && cluster_key(ns, c) != sub.cluster
            {
                return Err(ReadError::SubscriptionOfAnotherCluster {
                    subscription: s.to_string(),
                    belongs_to: sub.cluster,
                    given: c.to_string(),
                });
            }
            Ok((sub.cluster, Some(sub.subscription)))
        }
        (None, Some(c)) => Ok((cluster_key(ns, c), None)),
        (None, None) => Err(ReadError::NoSubscriptionOrCluster),
    }
}

/// One page of a search, and the coverage of its window.
pub struct SearchPage {
    pub rows: Vec<StoredMessage>,
    /// A full page: ask again after this row.
    pub next_after: Option<i64>,
    pub coverage: CoverageDoc,
}

pub async fn search_page(store: &Store, ns: &str, q: &SearchQuery) -> Result<SearchPage, ReadError> {
    let (cluster, subscription) = scope(store, ns, q.subscription.as_deref(), q.cluster.as_deref()).await?;
    let now = db_now(store).await?;
    let window = q.range.window(now)?;
    let mut rows = store
        .captured_messages(&MessageQuery {
            cluster: cluster.clone(),
            subscription: subscription.clone(),
            address: q.filter.address.clone(),
            from: Some(window.from),
            to: Some(window.to),
            properties: q.filter.properties.clone(),
            text: q.filter.text.clone(),
            after_row: q.after,
            limit: q.limit + 1,
            newest_first: false,
        })
        .await?;
    let more = rows.len() as i64 > q.limit;
    rows.truncate(usize::try_from(q.limit).unwrap_or(usize::MAX));
    let next_after = more.then(|| rows.last().map(|r| r.row_id)).flatten();
    let mut coverage = coverage_of(store, &cluster, subscription.as_deref(), window, now, ns).await?;
    if let Some(address) = &q.filter.address {
        coverage.taps.retain(|t| &t.address == address);
        coverage = CoverageDoc::new(coverage.window, coverage.taps, coverage.sampled_subscriptions);
    }
    Ok(SearchPage {
        rows,
        next_after,
        coverage,
    })
}

/// What a tail reads: the subscription's rows that pass its filter, oldest first.
pub fn tail_query(
    filter: &MessageFilter,
    sub: &KnownSubscription,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    limit: i64,
) -> MessageQuery {
    MessageQuery {
        cluster: sub.cluster.clone(),
        subscription: Some(sub.subscription.clone()),
        address: filter.address.clone(),
        from,
        to,
        properties: filter.properties.clone(),
        text: filter.text.clone(),
        after_row: None,
        limit,
        newest_first: false,
    }
}

/// The newest `query.limit` rows `query` matches, oldest first.
pub async fn newest_rows(store: &Store, query: MessageQuery) -> Result<Vec<StoredMessage>, ReadError> {
    let mut rows = store
        .captured_messages(&MessageQuery {
            newest_first: true,
            ..query
        })
        .await?;
    rows.reverse();
    Ok(rows)
}

/// A bounded tail: a subscription's newest rows (at most `count`), and the coverage from the
/// oldest of them (or the last hour, when there are none) to now.
pub struct LastRows {
    pub subscription: KnownSubscription,
    pub rows: Vec<StoredMessage>,
    pub coverage: CoverageDoc,
}

pub async fn last_rows(
    store: &Store,
    ns: &str,
    subscription: &str,
    filter: &MessageFilter,
    count: i64,
) -> Result<LastRows, ReadError> {
    let sub = one_subscription(store, ns, subscription).await?;
    let now = db_now(store).await?;
    let rows = newest_rows(store, tail_query(filter, &sub, None, Some(now), count)).await?;
    let from = rows
        .first()
        .map_or(now - chrono::Duration::hours(1), |r| r.captured_at);
    let window = Window { from, to: now };
    let coverage = coverage_of(store, &sub.cluster, Some(&sub.subscription), window, now, ns).await?;
    Ok(LastRows {
        subscription: sub,
        rows,
        coverage,
    })
}

/// The coverage and estimated loss of a subscription (or a cluster's subscriptions) over a
/// time range.
pub async fn coverage(
    store: &Store,
    ns: &str,
    subscription: Option<&str>,
    cluster: Option<&str>,
    range: &TimeRange,
) -> Result<CoverageDoc, ReadError> {
    let (cluster, subscription) = scope(store, ns, subscription, cluster).await?;
    let now = db_now(store).await?;
    let window = range.window(now)?;
    coverage_of(store, &cluster, subscription.as_deref(), window, now, ns).await
}

/// The cluster a requests query reads: the one given, else the namespace's only one.
async fn requests_cluster(store: &Store, ns: &str, given: Option<&str>) -> Result<String, ReadError> {
    if let Some(c) = given {
        return Ok(cluster_key(ns, c));
    }
    let clusters: BTreeSet<String> = store
        .known_subscriptions(ns, None)
        .await?
        .into_iter()
        .map(|s| s.cluster)
        .collect();
    match clusters.len() {
        1 => Ok(clusters.into_iter().next().unwrap_or_default()),
        0 => Err(ReadError::NothingStoredInNamespace {
            namespace: ns.to_string(),
        }),
        _ => Err(ReadError::NamespaceOnSeveralClusters {
            namespace: ns.to_string(),
            clusters: clusters.into_iter().collect(),
        }),
    }
}

/// Every request on the address in the range paired with its reply, and the coverage up to
/// now (replies may come after the range's end).
pub async fn exchanges(
    store: &Store,
    ns: &str,
    q: &RequestsQuery,
) -> Result<(Vec<Exchange>, CoverageDoc), ReadError> {
    let cluster = requests_cluster(store, ns, q.cluster.as_deref()).await?;
    let now = db_now(store).await?;
    let window = q.range.window(now)?;
    let requests: Vec<StoredMessage> = store
        .captured_messages(&MessageQuery {
            cluster: cluster.clone(),
            address: Some(q.address.clone()),
            from: Some(window.from),
            to: Some(window.to),
            limit: q.limit,
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
    let up_to_now = Window {
        from: window.from,
        to: now,
    };
    let doc = coverage_of(store, &cluster, None, up_to_now, now, ns).await?;
    let captured: BTreeSet<String> = doc.taps.iter().map(|t| t.address.clone()).collect();
    Ok((requests::correlate(&requests, &replies, &captured), doc))
}

/// An object's (`<kind>/<name>`) or a cluster's commands from the audit log, newest first.
pub async fn audit_rows(store: &Store, ns: &str, q: &AuditSelection) -> Result<Vec<AuditRecord>, ReadError> {
    let object = match &q.object {
        Some(o) => {
            let (kind, name) = o
                .split_once('/')
                .ok_or_else(|| ReadError::NotKindAndName { object: o.clone() })?;
            let kind = super::audit_kind(kind).ok_or_else(|| ReadError::UnknownKind {
                kind: kind.to_string(),
            })?;
            Some((kind.to_string(), name.to_string()))
        }
        None if q.cluster.is_none() => return Err(ReadError::NoObjectOrCluster),
        None => None,
    };
    Ok(store
        .audit_records(&AuditQuery {
            namespace: ns.to_string(),
            object,
            cluster: q.cluster.as_deref().map(|c| cluster_key(ns, c)),
            limit: q.limit,
        })
        .await?)
}
