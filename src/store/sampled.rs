//! Sampling's records in Postgres (ADR-0062 D3): the subscription's mode, for the reading
//! commands, and the per-(subscription, node, queue) high-water mark of the broker message ID,
//! written in the same transaction as the rows it covers (an operator restart never stores a
//! message twice).

use chrono::{DateTime, Utc};

use super::captured::{CapturedRow, Origin, SubscriptionKey, insert_rows};
use super::{OnPool, Store, StoreError};

/// One browsed queue on one node, as Postgres holds it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct SampleMark {
    pub subscription: String,
    pub node: String,
    pub queue: String,
    pub address: String,
    /// The highest broker message ID stored from this queue on this node (0: none yet).
    pub high_water: i64,
    /// Rows stored.
    pub sampled: i64,
    /// Successful browses.
    pub browses: i64,
    pub last_browse_at: DateTime<Utc>,
}

/// Where one browse's rows go.
#[derive(Clone, Copy, Debug)]
pub struct SampleAt<'a> {
    pub node: &'a str,
    pub queue: &'a str,
    pub address: &'a str,
}

impl Store {
    /// Keep `capture_subscription.mode` (and the sample interval, null in mode capture) current:
    /// written only when it changed. The reading commands label a tail from it.
    pub async fn record_subscription_mode(
        &self,
        cluster: &str,
        subscription: &str,
        mode: &str,
        sample_interval_seconds: Option<i32>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO capture_subscription (cluster, subscription, mode, sample_interval_seconds, mode_changed_at) \
             VALUES ($1, $2, $3, $4, now()) \
             ON CONFLICT (cluster, subscription) DO UPDATE SET mode = EXCLUDED.mode, \
             sample_interval_seconds = EXCLUDED.sample_interval_seconds, mode_changed_at = now() \
             WHERE (capture_subscription.mode, capture_subscription.sample_interval_seconds) \
             IS DISTINCT FROM (EXCLUDED.mode, EXCLUDED.sample_interval_seconds)",
        )
        .bind(cluster)
        .bind(subscription)
        .bind(mode)
        .bind(sample_interval_seconds)
        .execute(self.pool())
        .await.on(self.pool())?;
        Ok(())
    }

    /// Every high-water mark of one cluster.
    pub async fn sample_marks(&self, cluster: &str) -> Result<Vec<SampleMark>, StoreError> {
        sqlx::query_as(
            "SELECT subscription, node, queue, address, high_water, sampled, browses, last_browse_at \
             FROM capture_sample_mark WHERE cluster = $1",
        )
        .bind(cluster)
        .fetch_all(self.pool())
        .await
        .on(self.pool())
    }

    /// One successful browse: its new rows (marked origin=sampled) and the raised high-water
    /// mark, in one transaction. Returns the rows inserted.
    pub async fn store_sample(
        &self,
        key: &SubscriptionKey,
        at: &SampleAt<'_>,
        rows: &[CapturedRow],
        high_water: i64,
    ) -> Result<u64, StoreError> {
        let mut tx = self.pool().begin().await.on(self.pool())?;
        let n = insert_rows(&mut *tx, key, rows, Origin::Sampled, None).await?;
        sqlx::query(
            "INSERT INTO capture_sample_mark (cluster, subscription, node, queue, address, high_water, sampled, browses) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 1) \
             ON CONFLICT (cluster, subscription, node, queue) DO UPDATE SET \
             high_water = GREATEST(capture_sample_mark.high_water, EXCLUDED.high_water), \
             sampled = capture_sample_mark.sampled + EXCLUDED.sampled, address = EXCLUDED.address, \
             browses = capture_sample_mark.browses + 1, last_browse_at = now()",
        )
        .bind(&key.cluster)
        .bind(&key.subscription)
        .bind(at.node)
        .bind(at.queue)
        .bind(at.address)
        .bind(high_water)
        .bind(n as i64)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(n)
    }
}
