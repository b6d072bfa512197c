//! Reading what was captured and what the operator did (ADR-0062 D2, ADR-0049): the queries
//! behind `capture tail|search|requests` and `audit`. Read-only; every query is scoped by
//! cluster (and subscription) first, the leading columns of every index.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{OnPool, Store, StoreError};

/// A subscription as Postgres knows it (the rows, coverage and loss are keyed by it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct KnownSubscription {
    /// `namespace/name` of the ArtemisCluster.
    pub cluster: String,
    pub subscription: String,
    /// `capture` or `sample`.
    pub mode: String,
}

impl KnownSubscription {
    pub fn sampled(&self) -> bool {
        self.mode == "sample"
    }
}

/// One stored row as read back.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct StoredMessage {
    pub row_id: i64,
    pub cluster: String,
    pub subscription: String,
    pub node: String,
    pub original_address: String,
    pub capture_queue: String,
    pub source_message_id: Option<String>,
    pub message_id: Option<String>,
    pub correlation_id: Option<String>,
    pub reply_to: Option<String>,
    pub properties: serde_json::Value,
    pub headers: serde_json::Value,
    pub body_text: Option<String>,
    /// Binary bodies are not read back by the console; their size is.
    pub body_binary: bool,
    pub body_size: i32,
    pub body_truncated: bool,
    pub routed_at: Option<DateTime<Utc>>,
    pub captured_at: DateTime<Utc>,
    /// `captured` or `sampled` (ADR-0062 D10: never rendered alike).
    pub origin: String,
}

impl StoredMessage {
    pub fn sampled(&self) -> bool {
        self.origin == "sampled"
    }
}

/// Which rows: every filter is optional except the cluster.
#[derive(Clone, Debug, Default)]
pub struct MessageQuery {
    /// `namespace/name` of the ArtemisCluster.
    pub cluster: String,
    pub subscription: Option<String>,
    pub address: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// Application property equal to a value (compared as text).
    pub properties: Vec<(String, String)>,
    /// Words that must all occur in the text body (full-text, the `simple` configuration).
    pub text: Option<String>,
    /// Only rows after this row ID (paging).
    pub after_row: Option<i64>,
    pub limit: i64,
    /// The newest rows first (a tail's `--last`); else oldest first.
    pub newest_first: bool,
}

/// One drain session of a tap on a node (`capture_coverage`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct CoverageSession {
    pub subscription: String,
    pub node: String,
    pub source_address: String,
    pub started_at: DateTime<Utc>,
    pub confirmed_until: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// A tap ever installed on a node (`capture_tap`): a node that should be covered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct TapIncarnation {
    pub subscription: String,
    pub node: String,
    pub source_address: String,
    pub installed_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
}

/// Cumulative estimated loss of one cause at one tap (`capture_loss`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct LossTally {
    pub subscription: String,
    pub node: String,
    pub source_address: String,
    pub cause: String,
    pub messages: i64,
    pub updated_at: DateTime<Utc>,
    /// `capture_loss.bound`: exact, upper, lower, or null (no bound claimed).
    pub bound: Option<String>,
}

/// One command of the audit log.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub id: i64,
    pub occurred_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub instance_id: String,
    pub actor: String,
    pub command: String,
    pub cluster: String,
    pub target: String,
    pub object_kind: String,
    pub object_namespace: String,
    pub object_name: String,
    pub object_generation: Option<i64>,
    pub params: serde_json::Value,
    pub outcome: String,
    pub outcome_detail: Option<serde_json::Value>,
}

/// Which audit rows.
#[derive(Clone, Debug, Default)]
pub struct AuditQuery {
    pub namespace: String,
    /// The object's kind and name; None: every object of the cluster.
    pub object: Option<(String, String)>,
    /// `namespace/name` of the ArtemisCluster.
    pub cluster: Option<String>,
    pub limit: i64,
}

const MESSAGE_COLUMNS: &str = "row_id, cluster, subscription, node, original_address, capture_queue, \
     source_message_id, message_id, correlation_id, reply_to, properties, headers, body_text, \
     body_binary IS NOT NULL AS body_binary, body_size, body_truncated, routed_at, captured_at, origin";

impl Store {
    /// The subscriptions of this name in this namespace (their cluster is in the namespace).
    pub async fn known_subscriptions(
        &self,
        namespace: &str,
        subscription: Option<&str>,
    ) -> Result<Vec<KnownSubscription>, StoreError> {
        sqlx::query_as(
            "SELECT cluster, subscription, mode FROM capture_subscription \
             WHERE split_part(cluster, '/', 1) = $1 AND ($2::text IS NULL OR subscription = $2) \
             ORDER BY cluster, subscription",
        )
        .bind(namespace)
        .bind(subscription)
        .fetch_all(self.pool())
        .await
        .on(self.pool())
    }

    /// Rows matching `q`, in row order (oldest first), at most `q.limit`.
    /// One stored row of a subscription (issue 48: verify).
    pub async fn captured_row(
        &self,
        cluster: &str,
        subscription: &str,
        row_id: i64,
    ) -> Result<Option<StoredMessage>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM captured_message WHERE cluster = $1 AND subscription = $2 AND row_id = $3"
        ))
        .bind(cluster)
        .bind(subscription)
        .bind(row_id)
        .fetch_optional(self.pool())
        .await?)
    }

    pub async fn captured_messages(&self, q: &MessageQuery) -> Result<Vec<StoredMessage>, StoreError> {
        let (keys, values): (Vec<String>, Vec<String>) = q.properties.iter().cloned().unzip();
        sqlx::query_as(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM captured_message \
             WHERE cluster = $1 AND ($2::text IS NULL OR subscription = $2) \
             AND ($3::text IS NULL OR original_address = $3) \
             AND ($4::timestamptz IS NULL OR captured_at >= $4) \
             AND ($5::timestamptz IS NULL OR captured_at <= $5) \
             AND ($6::bigint IS NULL OR row_id > $6) \
             AND ($7::text IS NULL OR to_tsvector('simple', coalesce(body_text, '')) @@ plainto_tsquery('simple', $7)) \
             AND NOT EXISTS (SELECT 1 FROM UNNEST($8::text[], $9::text[]) AS p(k, v) \
                             WHERE (properties ->> p.k) IS DISTINCT FROM p.v) \
             ORDER BY row_id {} LIMIT $10",
            if q.newest_first { "DESC" } else { "ASC" }
        ))
        .bind(&q.cluster)
        .bind(&q.subscription)
        .bind(&q.address)
        .bind(q.from)
        .bind(q.to)
        .bind(q.after_row)
        .bind(&q.text)
        .bind(keys)
        .bind(values)
        .bind(q.limit)
        .fetch_all(self.pool())
        .await.on(self.pool())
    }

    /// Rows on `address` that carry a reply-to (requests), and rows whose correlation ID names
    /// one of `ids` (their replies), within the window.
    pub async fn correlated_messages(
        &self,
        cluster: &str,
        ids: &[String],
        from: DateTime<Utc>,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        sqlx::query_as(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM captured_message \
             WHERE cluster = $1 AND correlation_id = ANY($2) AND captured_at >= $3 ORDER BY row_id"
        ))
        .bind(cluster)
        .bind(ids)
        .bind(from)
        .fetch_all(self.pool())
        .await
        .on(self.pool())
    }

    /// Drain sessions that overlap the window, of one subscription or all of the cluster's.
    pub async fn coverage_sessions(
        &self,
        cluster: &str,
        subscription: Option<&str>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<CoverageSession>, StoreError> {
        let columns = "subscription, node, source_address, started_at, confirmed_until, ended_at";
        // A heartbeat confirms an idle drain's interval (migration 0010): the view says until when.
        let lived = ("capture_coverage_confirmed", "started_at", "ended_at");
        self.overlapping(columns, lived, cluster, subscription, (from, to))
            .await
    }

    /// Taps installed at some time in the window: the (node, address) pairs that should be
    /// covered there.
    pub async fn tap_incarnations(
        &self,
        cluster: &str,
        subscription: Option<&str>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<TapIncarnation>, StoreError> {
        let columns = "subscription, node, source_address, installed_at, removed_at";
        let lived = ("capture_tap", "installed_at", "removed_at");
        self.overlapping(columns, lived, cluster, subscription, (from, to))
            .await
    }

    /// Rows of a per-tap table whose life (`lived`: table, start column, end column, the end
    /// NULL while it lasts) overlaps the window, of one subscription or all of the cluster's.
    async fn overlapping<T>(
        &self,
        columns: &str,
        (table, start, end): (&str, &str, &str),
        cluster: &str,
        subscription: Option<&str>,
        (from, to): (DateTime<Utc>, DateTime<Utc>),
    ) -> Result<Vec<T>, StoreError>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        sqlx::query_as(&format!(
            "SELECT {columns} FROM {table} \
             WHERE cluster = $1 AND ($2::text IS NULL OR subscription = $2) \
             AND {start} <= $4 AND coalesce({end}, 'infinity') >= $3 \
             ORDER BY subscription, node, source_address, {start}"
        ))
        .bind(cluster)
        .bind(subscription)
        .bind(from)
        .bind(to)
        .fetch_all(self.pool())
        .await
        .on(self.pool())
    }

    /// Cumulative estimated loss per tap and cause.
    pub async fn loss_tallies(
        &self,
        cluster: &str,
        subscription: Option<&str>,
    ) -> Result<Vec<LossTally>, StoreError> {
        sqlx::query_as(
            "SELECT subscription, node, source_address, cause, messages, updated_at, bound FROM capture_loss \
             WHERE cluster = $1 AND ($2::text IS NULL OR subscription = $2) AND messages > 0 \
             ORDER BY subscription, node, source_address, cause",
        )
        .bind(cluster)
        .bind(subscription)
        .fetch_all(self.pool())
        .await
        .on(self.pool())
    }

    /// Audit rows, newest first.
    pub async fn audit_records(&self, q: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        let (kind, name) = q.object.clone().unzip();
        sqlx::query_as(
            "SELECT id, occurred_at, completed_at, instance_id, actor, command, cluster, target, object_kind, \
             object_namespace, object_name, object_generation, params, outcome, outcome_detail \
             FROM audit_event WHERE ($1::text IS NULL OR (object_namespace = $4 AND object_kind = $1 AND object_name = $2)) \
             AND ($3::text IS NULL OR cluster = $3) ORDER BY occurred_at DESC, id DESC LIMIT $5",
        )
        .bind(kind)
        .bind(name)
        .bind(&q.cluster)
        .bind(&q.namespace)
        .bind(q.limit)
        .fetch_all(self.pool())
        .await.on(self.pool())
    }
}
