//! Captured messages, coverage and loss in Postgres (ADR-0062 D4, D9, D10). Inserts are batched
//! (one `INSERT … SELECT FROM UNNEST` per batch, never a row per round trip); a redelivered copy
//! never becomes a second row; retention drops whole day partitions of one subscription.

use chrono::{DateTime, Datelike, Duration, NaiveDate, Utc};

use super::{OnPool, Store, StoreError};

pub use super::storable::CapturedRow;

/// Where a loss happened.
#[derive(Clone, Copy, Debug)]
pub struct LossAt<'a> {
    pub cluster: &'a str,
    pub subscription: &'a str,
    pub node: &'a str,
    pub source_address: &'a str,
}

/// Which bound a loss count is (`capture_loss.bound`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LossBound {
    /// Counted from the broker's own counters on both sides.
    Exact,
    /// At most this many were lost.
    UpperBound,
    /// At least this many were lost.
    LowerBound,
}

impl LossBound {
    pub fn as_db(self) -> &'static str {
        match self {
            LossBound::Exact => "exact",
            LossBound::UpperBound => "upper",
            LossBound::LowerBound => "lower",
        }
    }

    /// None for NULL (no bound claimed) or a value this version does not know.
    pub fn from_db(s: Option<&str>) -> Option<LossBound> {
        match s? {
            "exact" => Some(LossBound::Exact),
            "upper" => Some(LossBound::UpperBound),
            "lower" => Some(LossBound::LowerBound),
            _ => None,
        }
    }

    /// As printed beside a count.
    pub fn label(self) -> &'static str {
        match self {
            LossBound::Exact => "exact",
            LossBound::UpperBound => "upper bound",
            LossBound::LowerBound => "lower bound",
        }
    }
}

/// Stored and lost at one tap on one node.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct TapTotals {
    pub subscription: String,
    pub node: String,
    pub source_address: String,
    pub captured: i64,
    pub lost: i64,
}

/// A capture queue's loss counters as read from the broker (see `capture::loss`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct QueueCounters {
    pub ring_evicted: i64,
    pub address_dropped: i64,
    pub messages_added: i64,
    pub message_count: i64,
}

/// Which subscription a batch belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionKey {
    pub cluster: String,
    pub subscription: String,
    pub id: i64,
}

fn day_name(sub_id: i64, day: NaiveDate) -> String {
    format!(
        "captured_message_s{sub_id}_{:04}{:02}{:02}",
        day.year(),
        day.month(),
        day.day()
    )
}

impl Store {
    /// The partition key of one (cluster, subscription), created on first use.
    pub async fn subscription_key(
        &self,
        cluster: &str,
        subscription: &str,
    ) -> Result<SubscriptionKey, StoreError> {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO capture_subscription (cluster, subscription) VALUES ($1, $2) \
             ON CONFLICT (cluster, subscription) DO UPDATE SET cluster = EXCLUDED.cluster RETURNING id",
        )
        .bind(cluster)
        .bind(subscription)
        .fetch_one(self.pool())
        .await
        .on(self.pool())?;
        Ok(SubscriptionKey {
            cluster: cluster.into(),
            subscription: subscription.into(),
            id,
        })
    }

    /// The subscription's partition and its day partitions for today and the next day (made
    /// ahead, so an insert never waits on DDL at midnight).
    pub async fn ensure_partitions(&self, key: &SubscriptionKey) -> Result<(), StoreError> {
        let id = key.id;
        // Identifiers and bounds here are numbers and dates this code formats, never input.
        // Two drains may race to create the same partition: "already exists" is success.
        let tolerate = |r: Result<sqlx::postgres::PgQueryResult, sqlx::Error>| match r {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P07") => Ok(()),
            r => r.map(|_| ()),
        };
        tolerate(
            sqlx::query(&format!(
                "CREATE TABLE IF NOT EXISTS captured_message_s{id} PARTITION OF captured_message \
                 FOR VALUES IN ({id}) PARTITION BY RANGE (captured_at)"
            ))
            .execute(self.pool())
            .await,
        )
        .on(self.pool())?;
        let today = Utc::now().date_naive();
        for day in [today, today + Duration::days(1)] {
            let next = day + Duration::days(1);
            tolerate(
                sqlx::query(&format!(
                    "CREATE TABLE IF NOT EXISTS {} PARTITION OF captured_message_s{id} \
                     FOR VALUES FROM ('{day}T00:00:00Z') TO ('{next}T00:00:00Z')",
                    day_name(id, day)
                ))
                .execute(self.pool())
                .await,
            )
            .on(self.pool())?;
        }
        Ok(())
    }

    /// Store a batch and confirm the drain's coverage session `coverage` (alive until now, this
    /// many more stored) in one statement, one round trip, one transaction; returns the rows
    /// inserted. A copy already stored (same node, capture queue and source message ID — a
    /// redelivery after a drain died between commit and settle) is skipped.
    pub async fn insert_captured(
        &self,
        key: &SubscriptionKey,
        rows: &[CapturedRow],
        coverage: i64,
    ) -> Result<u64, StoreError> {
        if rows.is_empty() {
            self.coverage_confirm(key, coverage, 0).await?;
            return Ok(0);
        }
        insert_rows(self.pool(), key, rows, Origin::Captured, Some(coverage))
            .await
            .on(self.pool())
    }

    /// A drain session starts: coverage for this node begins now.
    pub async fn coverage_start(
        &self,
        key: &SubscriptionKey,
        node: &str,
        source_address: &str,
        capture_queue: &str,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(
            "INSERT INTO capture_coverage (cluster, subscription, node, source_address, capture_queue) \
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(&key.cluster)
        .bind(&key.subscription)
        .bind(node)
        .bind(source_address)
        .bind(capture_queue)
        .fetch_one(self.pool())
        .await
        .on(self.pool())
    }

    /// The session was alive until now, and stored `messages` more.
    pub async fn coverage_confirm(
        &self,
        key: &SubscriptionKey,
        id: i64,
        messages: u64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE capture_coverage SET confirmed_until = now(), messages = messages + $4 \
             WHERE cluster = $1 AND subscription = $2 AND id = $3",
        )
        .bind(&key.cluster)
        .bind(&key.subscription)
        .bind(id)
        .bind(messages as i64)
        .execute(self.pool())
        .await
        .on(self.pool())?;
        Ok(())
    }

    /// A heartbeat row for this process's drains of one node (issue 42: idle coverage is
    /// confirmed per node): its id.
    pub async fn heartbeat_start(&self, cluster: &str, node: &str, holder: &str) -> Result<i64, StoreError> {
        sqlx::query_scalar(
            "INSERT INTO capture_drain_heartbeat (cluster, node, holder) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(cluster)
        .bind(node)
        .bind(holder)
        .fetch_one(self.pool())
        .await
        .on(self.pool())
    }

    /// One beat of the idle confirmation, in one transaction: the intervals whose drain
    /// stopped draining are detached, confirmed until their heartbeat's last beat (before this
    /// one); those draining again or anew are attached; then every heartbeat of a node with a
    /// draining drain beats. Rows written: the changes, and one per node.
    pub async fn coverage_beat(&self, beat: &CoverageBeat) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await.on(self.pool())?;
        let (clusters, subscriptions, ids) = columns(&beat.detach);
        sqlx::query(
            "UPDATE capture_coverage c SET confirmed_until = greatest(c.confirmed_until, h.confirmed_until), \
             heartbeat_id = NULL \
             FROM unnest($1::text[], $2::text[], $3::int8[]) AS o(cluster, subscription, id), capture_drain_heartbeat h \
             WHERE c.cluster = o.cluster AND c.subscription = o.subscription AND c.id = o.id AND h.id = c.heartbeat_id",
        )
        .bind(clusters)
        .bind(subscriptions)
        .bind(ids)
        .execute(&mut *tx)
        .await
        .on(self.pool())?;
        let attach: Vec<(SubscriptionKey, i64)> =
            beat.attach.iter().map(|(k, id, _)| (k.clone(), *id)).collect();
        let (clusters, subscriptions, ids) = columns(&attach);
        let heartbeats: Vec<i64> = beat.attach.iter().map(|(_, _, h)| *h).collect();
        sqlx::query(
            "UPDATE capture_coverage c SET heartbeat_id = o.heartbeat, confirmed_until = now() \
             FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[]) AS o(cluster, subscription, id, heartbeat) \
             WHERE c.cluster = o.cluster AND c.subscription = o.subscription AND c.id = o.id AND c.ended_at IS NULL",
        )
        .bind(clusters)
        .bind(subscriptions)
        .bind(ids)
        .bind(heartbeats)
        .execute(&mut *tx)
        .await
        .on(self.pool())?;
        sqlx::query("UPDATE capture_drain_heartbeat SET confirmed_until = now() WHERE id = ANY($1)")
            .bind(&beat.beat)
            .execute(&mut *tx)
            .await
            .on(self.pool())?;
        tx.commit().await.on(self.pool())
    }

    /// The session ended (the drain stopped); coverage ends at its last confirmation (its own,
    /// or its heartbeat's).
    pub async fn coverage_end(&self, key: &SubscriptionKey, id: i64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE capture_coverage c SET ended_at = greatest(c.confirmed_until, \
               (SELECT h.confirmed_until FROM capture_drain_heartbeat h WHERE h.id = c.heartbeat_id)), \
             heartbeat_id = NULL \
             WHERE cluster = $1 AND subscription = $2 AND id = $3",
        )
        .bind(&key.cluster)
        .bind(&key.subscription)
        .bind(id)
        .execute(self.pool())
        .await
        .on(self.pool())?;
        Ok(())
    }

    /// Count `messages` more lost to `cause` at this tap and node (an estimate claiming no bound).
    pub async fn add_loss(&self, at: &LossAt<'_>, cause: &str, messages: u64) -> Result<(), StoreError> {
        self.add_loss_bounded(at, cause, messages, None).await
    }

    /// Count `messages` more lost to `cause`, saying which bound the count is. Added to a count
    /// of another bound, the sum keeps the weaker claim: exact with an upper (lower) bound is an
    /// upper (lower) bound; an upper with a lower bound, or anything with an unbounded
    /// estimate, claims no bound.
    pub async fn add_loss_bounded(
        &self,
        at: &LossAt<'_>,
        cause: &str,
        messages: u64,
        bound: Option<LossBound>,
    ) -> Result<(), StoreError> {
        if messages == 0 {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO capture_loss (cluster, subscription, node, source_address, cause, messages, bound) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (cluster, subscription, node, source_address, cause) DO UPDATE \
             SET messages = capture_loss.messages + EXCLUDED.messages, updated_at = now(), \
                 bound = CASE WHEN capture_loss.bound = EXCLUDED.bound OR capture_loss.bound = 'exact' THEN EXCLUDED.bound \
                              WHEN EXCLUDED.bound = 'exact' THEN capture_loss.bound END",
        )
        .bind(at.cluster)
        .bind(at.subscription)
        .bind(at.node)
        .bind(at.source_address)
        .bind(cause)
        .bind(messages as i64)
        .bind(bound.map(LossBound::as_db))
        .execute(self.pool())
        .await
        .on(self.pool())?;
        Ok(())
    }

    /// Per (subscription, node, source address): messages stored and estimated lost, for status.
    /// One pass over the cluster's coverage and loss rows, grouped (a sum per tap looked up per
    /// tap walked every address of the node for each tap: 1 s and more at 2,000 taps, each pass).
    pub async fn capture_totals(&self, cluster: &str) -> Result<Vec<TapTotals>, StoreError> {
        sqlx::query_as(
            "SELECT subscription, node, source_address, \
               COALESCE(sum(captured), 0)::bigint AS captured, COALESCE(sum(lost), 0)::bigint AS lost \
             FROM (SELECT subscription, node, source_address, messages AS captured, 0::bigint AS lost \
                     FROM capture_coverage WHERE cluster = $1 \
                   UNION ALL SELECT subscription, node, source_address, 0::bigint, messages \
                     FROM capture_loss WHERE cluster = $1) t \
             GROUP BY subscription, node, source_address",
        )
        .bind(cluster)
        .fetch_all(self.pool())
        .await
        .on(self.pool())
    }

    /// The last counters read for a capture queue (None: never read).
    pub async fn last_counters(
        &self,
        at: &LossAt<'_>,
        capture_queue: &str,
    ) -> Result<Option<QueueCounters>, StoreError> {
        sqlx::query_as(
            "SELECT ring_evicted, address_dropped, messages_added, message_count FROM capture_counter \
             WHERE cluster = $1 AND subscription = $2 AND node = $3 AND capture_queue = $4",
        )
        .bind(at.cluster)
        .bind(at.subscription)
        .bind(at.node)
        .bind(capture_queue)
        .fetch_optional(self.pool())
        .await
        .on(self.pool())
    }

    pub async fn save_counters(
        &self,
        at: &LossAt<'_>,
        capture_queue: &str,
        c: &QueueCounters,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO capture_counter (cluster, subscription, node, capture_queue, ring_evicted, address_dropped, \
             messages_added, message_count) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (cluster, subscription, node, capture_queue) DO UPDATE SET ring_evicted = EXCLUDED.ring_evicted, \
             address_dropped = EXCLUDED.address_dropped, messages_added = EXCLUDED.messages_added, \
             message_count = EXCLUDED.message_count, read_at = now()",
        )
        .bind(at.cluster)
        .bind(at.subscription)
        .bind(at.node)
        .bind(capture_queue)
        .bind(c.ring_evicted)
        .bind(c.address_dropped)
        .bind(c.messages_added)
        .bind(c.message_count)
        .execute(self.pool())
        .await.on(self.pool())?;
        Ok(())
    }

    /// Retention (ADR-0062 Consequences: a time bound and a size bound): drop this
    /// subscription's day partitions older than `max_age`, then its oldest ones while it holds
    /// more than `max_bytes` (today's partition is never dropped). Returns the partitions dropped.
    pub async fn enforce_retention(
        &self,
        key: &SubscriptionKey,
        max_age: Duration,
        max_bytes: Option<u64>,
    ) -> Result<Vec<String>, StoreError> {
        let parent = format!("captured_message_s{}", key.id);
        let mut parts: Vec<(String, i64)> = sqlx::query_as(
            "SELECT c.relname::text, pg_total_relation_size(c.oid) FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent \
             WHERE p.relname = $1 ORDER BY c.relname",
        )
        .bind(&parent)
        .fetch_all(self.pool())
        .await
        .on(self.pool())?;
        let today = day_name(key.id, Utc::now().date_naive());
        let oldest_kept = day_name(key.id, (Utc::now() - max_age).date_naive());
        let mut dropped = vec![];
        let mut total: i64 = parts.iter().map(|(_, s)| *s).sum();
        // Names sort by day: yyyymmdd.
        while let Some((name, size)) = parts.first().cloned() {
            let too_old = name < oldest_kept;
            let too_big = max_bytes.is_some_and(|m| total > m as i64);
            if name >= today || !(too_old || too_big) {
                break;
            }
            sqlx::query(&format!("ALTER TABLE {parent} DETACH PARTITION {name}"))
                .execute(self.pool())
                .await
                .on(self.pool())?;
            sqlx::query(&format!("DROP TABLE {name}"))
                .execute(self.pool())
                .await
                .on(self.pool())?;
            total -= size;
            dropped.push(name);
            parts.remove(0);
        }
        Ok(dropped)
    }
}

/// Where a row came from (ADR-0062 D10: captured and sampled rows make different claims).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Drained from a tap: complete within a covered window.
    Captured,
    /// Seen by a browse: only what was still on the queue then.
    Sampled,
}

impl Origin {
    pub fn as_db(self) -> &'static str {
        match self {
            Origin::Captured => "captured",
            Origin::Sampled => "sampled",
        }
    }
}

/// One batch of rows (parameters $4… are one array per column); a copy already stored (same
/// node, capture queue and source message ID, within a day) is skipped.
const INSERT_CAPTURED: &str = "INSERT INTO captured_message (cluster, subscription, subscription_id, node, original_address, \
         capture_queue, source_message_id, message_id, correlation_id, reply_to, properties, headers, \
         body_text, body_binary, body_size, body_truncated, routed_at, origin, body_kind, escaped) \
         SELECT $1, $2, $3, t.node, t.address, t.queue, t.source, t.message_id, t.correlation, t.reply_to, \
         t.properties::jsonb, t.headers::jsonb, t.text, t.bin, t.size, t.truncated, t.routed, $18, t.kind, \
         CASE WHEN t.escaped IS NULL THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(t.escaped::jsonb)) END \
         FROM UNNEST($4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], \
         $11::text[], $12::text[], $13::text[], $14::bytea[], $15::int[], $16::bool[], $17::timestamptz[], \
         $19::text[], $20::text[]) \
         AS t(node, address, queue, source, message_id, correlation, reply_to, properties, headers, text, \
         bin, size, truncated, routed, kind, escaped) \
         WHERE t.source IS NULL OR NOT EXISTS (SELECT 1 FROM captured_message m \
         WHERE m.subscription_id = $3 AND m.cluster = $1 AND m.subscription = $2 AND m.node = t.node \
         AND m.capture_queue = t.queue AND m.source_message_id = t.source \
         AND m.captured_at > now() - interval '1 day') RETURNING 1";

/// Store a batch in one statement; returns the rows inserted. A copy already stored (same node,
/// capture queue and source message ID) is skipped. With `coverage`, the same statement confirms
/// that coverage session (alive until now, the rows inserted added to its count).
pub(super) async fn insert_rows<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    key: &SubscriptionKey,
    rows: &[CapturedRow],
    origin: Origin,
    coverage: Option<i64>,
) -> Result<u64, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    // What Postgres cannot take as it is is escaped, cut or kept as bytes, and flagged.
    let rows: Vec<std::borrow::Cow<'_, CapturedRow>> = rows.iter().map(super::storable::storable).collect();
    let col = |f: &dyn Fn(&CapturedRow) -> Option<String>| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
    let node = col(&|r| Some(r.node.clone()));
    let address = col(&|r| Some(r.original_address.clone()));
    let queue = col(&|r| Some(r.capture_queue.clone()));
    let source = col(&|r| r.source_message_id.clone());
    let message_id = col(&|r| r.message_id.clone());
    let correlation = col(&|r| r.correlation_id.clone());
    let reply_to = col(&|r| r.reply_to.clone());
    let properties = col(&|r| Some(r.properties.to_string()));
    let headers = col(&|r| Some(r.headers.to_string()));
    let text = col(&|r| r.body_text.clone());
    let kind = col(&|r| r.body_kind.map(str::to_string));
    // A JSON array per row (a text[][] parameter would have to be rectangular).
    let escaped = col(&|r| (!r.escaped.is_empty()).then(|| serde_json::json!(r.escaped).to_string()));
    let binary: Vec<Option<Vec<u8>>> = rows.iter().map(|r| r.body_binary.clone()).collect();
    let size: Vec<i32> = rows.iter().map(|r| r.body_size).collect();
    let truncated: Vec<bool> = rows.iter().map(|r| r.body_truncated).collect();
    let routed: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.routed_at).collect();

    let confirm = if coverage.is_some() {
        ", confirmed AS (UPDATE capture_coverage SET confirmed_until = now(), \
         messages = messages + (SELECT count(*) FROM inserted) \
         WHERE cluster = $1 AND subscription = $2 AND id = $21)"
    } else {
        ""
    };
    let sql = format!("WITH inserted AS ({INSERT_CAPTURED}){confirm} SELECT count(*) FROM inserted");
    let query = sqlx::query_scalar::<_, i64>(&sql)
        .bind(&key.cluster)
        .bind(&key.subscription)
        .bind(key.id)
        .bind(node)
        .bind(address)
        .bind(queue)
        .bind(source)
        .bind(message_id)
        .bind(correlation)
        .bind(reply_to)
        .bind(properties)
        .bind(headers)
        .bind(text)
        .bind(binary)
        .bind(size)
        .bind(truncated)
        .bind(routed)
        .bind(origin.as_db())
        .bind(kind)
        .bind(escaped);
    let query = match coverage {
        Some(id) => query.bind(id),
        None => query,
    };
    let inserted = query.fetch_one(exec).await?;
    Ok(inserted as u64)
}

/// What one beat of the idle confirmation writes (`capture::drain::confirm_coverage`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoverageBeat {
    /// Open intervals whose drain stopped draining.
    pub detach: Vec<(SubscriptionKey, i64)>,
    /// Open intervals to attach to a heartbeat: (subscription, interval id, heartbeat id).
    pub attach: Vec<(SubscriptionKey, i64, i64)>,
    /// The heartbeats that beat now.
    pub beat: Vec<i64>,
}

/// Intervals as the parallel arrays `unnest` takes.
fn columns(intervals: &[(SubscriptionKey, i64)]) -> (Vec<&str>, Vec<&str>, Vec<i64>) {
    (
        intervals.iter().map(|(k, _)| k.cluster.as_str()).collect(),
        intervals.iter().map(|(k, _)| k.subscription.as_str()).collect(),
        intervals.iter().map(|(_, id)| *id).collect(),
    )
}
