//! Capture's records in Postgres: the install record of every tap incarnation (`capture_tap`,
//! ADR-0062 D4) and one row per capture pass (`capture_pass`), plus the per-cluster advisory
//! lock that serialises passes (ADR-0062 D7).

use sqlx::postgres::PgConnection;
use sqlx::{ConnectOptions, Connection};

use super::{OnPool, Store, StoreError};

/// One open tap incarnation on one node.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TapRecord {
    pub subscription: String,
    pub node: String,
    pub source_address: String,
    pub capture_queue: String,
    pub installed_at: chrono::DateTime<chrono::Utc>,
}

/// One tap on one node.
#[derive(Clone, Copy, Debug)]
pub struct TapKey<'a> {
    pub cluster: &'a str,
    pub subscription: &'a str,
    pub source_address: &'a str,
    pub node: &'a str,
    pub instance_id: &'a str,
}

/// What an install wrote down.
#[derive(Clone, Debug)]
pub struct TapInstall<'a> {
    pub cluster: &'a str,
    pub subscription: &'a str,
    pub subscription_uid: Option<&'a str>,
    pub instance_id: &'a str,
    pub node: &'a str,
    pub endpoint: Option<&'a str>,
    pub source_address: &'a str,
    pub capture_queue: &'a str,
    pub divert: &'a str,
    pub filter: Option<&'a str>,
    pub audit_id: Option<i64>,
}

/// One finished pass.
#[derive(Clone, Debug)]
pub struct PassRecord<'a> {
    pub cluster: &'a str,
    pub instance_id: &'a str,
    pub holder: &'a str,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub commands: i32,
    pub result: &'a str,
    /// The pass's time budget.
    pub budget_ms: i32,
    /// Taps whose install or removal the pass left for the next (its budget's time was spent).
    pub deferred: i32,
}

impl Store {
    /// The open tap incarnations of one cluster and instance.
    pub async fn open_taps(&self, cluster: &str, instance_id: &str) -> Result<Vec<TapRecord>, StoreError> {
        sqlx::query_as(
            "SELECT subscription, node, source_address, capture_queue, installed_at FROM capture_tap \
             WHERE cluster = $1 AND instance_id = $2 AND removed_at IS NULL",
        )
        .bind(cluster)
        .bind(instance_id)
        .fetch_all(self.pool())
        .await
        .on(self.pool())
    }

    /// Clusters (namespace/name) with a tap still recorded as installed by this instance: they
    /// get a pass even when no subscription names them any more (the orphan sweep).
    pub async fn clusters_with_open_taps(&self, instance_id: &str) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT DISTINCT cluster FROM capture_tap WHERE instance_id = $1 AND removed_at IS NULL",
        )
        .bind(instance_id)
        .fetch_all(self.pool())
        .await
        .on(self.pool())
    }

    /// A new incarnation: the capture queue was (re-)created. An incarnation still open for
    /// the same tap and node ends now with `previous_ended` (the gap starts there).
    pub async fn record_install(&self, t: &TapInstall<'_>, previous_ended: &str) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await.on(self.pool())?;
        sqlx::query(
            "UPDATE capture_tap SET removed_at = now(), removal_reason = $6 \
             WHERE cluster = $1 AND subscription = $2 AND source_address = $3 AND node = $4 \
             AND instance_id = $5 AND removed_at IS NULL",
        )
        .bind(t.cluster)
        .bind(t.subscription)
        .bind(t.source_address)
        .bind(t.node)
        .bind(t.instance_id)
        .bind(previous_ended)
        .execute(&mut *tx)
        .await?;
        insert(&mut tx, t).await?;
        tx.commit().await?;
        Ok(())
    }

    /// An installed tap this database has no open record of (the record was lost, or the tap
    /// predates it): recorded from now, the earliest moment this process can vouch for.
    pub async fn ensure_tap_recorded(&self, t: &TapInstall<'_>) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await.on(self.pool())?;
        let open: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM capture_tap WHERE cluster = $1 AND subscription = $2 AND source_address = $3 \
             AND node = $4 AND instance_id = $5 AND removed_at IS NULL",
        )
        .bind(t.cluster)
        .bind(t.subscription)
        .bind(t.source_address)
        .bind(t.node)
        .bind(t.instance_id)
        .fetch_optional(&mut *tx)
        .await?;
        if open.is_none() {
            insert(&mut tx, t).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The incarnation ends: removed by the sweep, or found gone.
    pub async fn close_tap(
        &self,
        tap: &TapKey<'_>,
        reason: &str,
        audit_id: Option<i64>,
    ) -> Result<(), StoreError> {
        let TapKey {
            cluster,
            subscription,
            source_address,
            node,
            instance_id,
        } = *tap;
        sqlx::query(
            "UPDATE capture_tap SET removed_at = now(), removal_reason = $6, remove_audit_id = $7 \
             WHERE cluster = $1 AND subscription = $2 AND source_address = $3 AND node = $4 \
             AND instance_id = $5 AND removed_at IS NULL",
        )
        .bind(cluster)
        .bind(subscription)
        .bind(source_address)
        .bind(node)
        .bind(instance_id)
        .bind(reason)
        .bind(audit_id)
        .execute(self.pool())
        .await
        .on(self.pool())?;
        Ok(())
    }

    /// Record a finished pass; passes older than a week are pruned.
    pub async fn record_pass(&self, p: &PassRecord<'_>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO capture_pass (cluster, instance_id, holder, started_at, finished_at, commands, result, budget_ms, deferred) \
             VALUES ($1, $2, $3, $4, now(), $5, $6, $7, $8)",
        )
        .bind(p.cluster)
        .bind(p.instance_id)
        .bind(p.holder)
        .bind(p.started_at)
        .bind(p.commands)
        .bind(p.result)
        .bind(p.budget_ms)
        .bind(p.deferred)
        .execute(self.pool())
        .await.on(self.pool())?;
        sqlx::query("DELETE FROM capture_pass WHERE cluster = $1 AND started_at < now() - interval '7 days'")
            .bind(p.cluster)
            .execute(self.pool())
            .await
            .on(self.pool())?;
        Ok(())
    }

    /// A dedicated connection (outside the pool) that names itself in `pg_stat_activity`.
    pub async fn dedicated_connection(&self, application_name: &str) -> Result<PgConnection, StoreError> {
        let name = cut_to_application_name(application_name);
        let options = (*self.pool().connect_options()).clone().application_name(&name);
        options.connect().await.on(self.pool())
    }

    /// How many connections carry an application_name starting with `prefix` (the capture
    /// workers of one instance announce themselves this way).
    pub async fn count_connections_named(&self, prefix: &str) -> Result<i64, StoreError> {
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, $1)")
            .bind(prefix)
            .fetch_one(self.pool())
            .await
            .on(self.pool())
    }
}

async fn insert(conn: &mut PgConnection, t: &TapInstall<'_>) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO capture_tap (cluster, subscription, subscription_uid, instance_id, node, endpoint, \
         source_address, capture_queue, divert, filter, install_audit_id) \
         VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)",
    )
    .bind(t.cluster)
    .bind(t.subscription)
    .bind(t.subscription_uid)
    .bind(t.instance_id)
    .bind(t.node)
    .bind(t.endpoint)
    .bind(t.source_address)
    .bind(t.capture_queue)
    .bind(t.divert)
    .bind(t.filter)
    .bind(t.audit_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The most bytes of an `application_name` (Postgres's NAMEDATALEN - 1); a longer one is cut.
pub const APPLICATION_NAME_MAX: usize = 63;

/// `name` cut, at a char boundary, to what Postgres keeps.
fn cut_to_application_name(name: &str) -> String {
    let mut cut = name.to_string();
    crate::store::storable::truncate_at_char_boundary(&mut cut, APPLICATION_NAME_MAX);
    cut
}

/// The part of a holder (`<pod>/<uuid>`, the process ID) that names its process uniquely: the
/// last segment. The whole holder is in `operator_process` and `capture_pass`.
pub fn holder_key(holder: &str) -> &str {
    holder.rsplit('/').next().unwrap_or(holder)
}

/// A stable digest (FNV-1a, 48 bits, hex) of a name too long to fit an application_name:
/// the same in every process and binary version, so replicas of one instance agree on it.
pub fn name_digest(name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:012x}", h >> 16)
}

/// The application_name of the connection holding a cluster's capture lock: the holder's
/// process key first, whole (issue 50: a long cluster name cut it), then as much of the
/// cluster's name as fits, for a DBA reading `pg_stat_activity`.
fn lock_application_name(cluster: &str, holder: &str) -> String {
    cut_to_application_name(&format!("{} capture {cluster}", holder_key(holder)))
}

/// A per-cluster advisory lock held on its own connection for as long as this process serves
/// the cluster (ADR-0062 D7). The connection's application_name says which cluster it holds, so
/// a DBA sees it in `pg_stat_activity`. A connection error means the lock is lost.
pub struct ClusterLock {
    conn: PgConnection,
    key: String,
}

impl ClusterLock {
    /// `pg_try_advisory_lock` on a new dedicated connection; None when another process holds it.
    pub async fn try_acquire(
        store: &Store,
        instance_id: &str,
        cluster: &str,
        holder: &str,
    ) -> Result<Option<ClusterLock>, StoreError> {
        let key = format!("artemis-studio capture {instance_id} {cluster}");
        let mut conn = store
            .dedicated_connection(&lock_application_name(cluster, holder))
            .await?;
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
            .bind(&key)
            .fetch_one(&mut conn)
            .await?;
        if got {
            Ok(Some(ClusterLock { conn, key }))
        } else {
            conn.close().await?;
            Ok(None)
        }
    }

    /// Still held: the session is alive (a lost session has released it). A session that does
    /// not answer within 5 s counts as lost (an unreachable server may never answer).
    pub async fn still_held(&mut self) -> bool {
        matches!(
            tokio::time::timeout(std::time::Duration::from_secs(5), self.conn.ping()).await,
            Ok(Ok(()))
        )
    }

    /// Release explicitly and close the connection.
    pub async fn release(mut self) {
        let _ = sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
            .bind(&self.key)
            .execute(&mut self.conn)
            .await;
        let _ = self.conn.close().await;
    }
}

#[cfg(test)]
mod application_name_tests {
    use super::*;

    const HOLDER: &str = "artemis-studio-operator-7c9f8d6b5-x2x9q/0f8e4c2a9b7d4e6f8a1b3c5d7e9f0a2b";

    #[test]
    fn the_lock_names_its_holder_whole_whatever_the_cluster_name() {
        let long = format!("{}/{}", "n".repeat(63), "c".repeat(100));
        for cluster in ["ns/c", long.as_str()] {
            let name = lock_application_name(cluster, HOLDER);
            assert!(name.len() <= APPLICATION_NAME_MAX, "{name}");
            assert!(
                name.starts_with("0f8e4c2a9b7d4e6f8a1b3c5d7e9f0a2b capture "),
                "{name}"
            );
        }
        assert_eq!(
            lock_application_name("ns/c", HOLDER),
            "0f8e4c2a9b7d4e6f8a1b3c5d7e9f0a2b capture ns/c"
        );
    }

    #[test]
    fn a_digest_is_stable_and_short() {
        assert_eq!(name_digest("prod"), name_digest("prod"));
        assert_ne!(name_digest("prod"), name_digest("prod2"));
        assert_eq!(name_digest(&"i".repeat(300)).len(), 12);
    }
}
