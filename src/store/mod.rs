//! Postgres: migrations and the audit log (ADR-0049: one row per command, intent before the
//! first broker write, outcome after).

pub mod capture;
pub mod captured;
pub mod reading;
pub mod sampled;
pub mod storable;

use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use std::str::FromStr;

use crate::api::{NodeOutcome, Outcome};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("encoding audit detail: {0}")]
    Encode(#[from] serde_json::Error),
}

/// SQLSTATE 23514: a CHECK violation, and also how Postgres says a row has no partition to go
/// to (which creating the partition fixes, not changing the row).
pub const NO_PARTITION_OR_CHECK: &str = "23514";

impl StoreError {
    /// The SQLSTATE when Postgres refused what was sent, as opposed to being unavailable:
    /// class 22 (data exception: U+0000, an invalid byte sequence, bad JSON), 23 (integrity
    /// constraint) except [`NO_PARTITION_OR_CHECK`], and 54 (program limit exceeded: an index
    /// row or a tsvector too large). Classified by the code, never by the message. None for
    /// everything else (connection lost, server shutting down, …): the same request may
    /// succeed later.
    pub fn data_refusal(&self) -> Option<String> {
        let StoreError::Database(sqlx::Error::Database(e)) = self else {
            return None;
        };
        let code = e.code()?.into_owned();
        let data = (code.starts_with("22") || code.starts_with("23") || code.starts_with("54"))
            && code != NO_PARTITION_OR_CHECK;
        data.then_some(code)
    }

    /// The SQLSTATE, when Postgres answered with one.
    pub fn sqlstate(&self) -> Option<String> {
        match self {
            StoreError::Database(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()),
            _ => None,
        }
    }
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    /// The operator process whose audit intents this store writes (None: a reading tool).
    process_id: Option<String>,
}

/// How long a process may go without a heartbeat before its `pending` rows are completed as
/// `unknown` by another (it heartbeats every [`HEARTBEAT`]).
pub const PROCESS_GONE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(5);

/// A `pending` row another process could never complete, now `unknown`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AbandonedCommand {
    pub id: i64,
    pub object_uid: String,
    pub command: String,
}

/// Who asked for a command and on which object: written with the intent.
#[derive(Debug, Clone, Serialize)]
pub struct AuditIntent {
    pub instance_id: String,
    pub actor: String,
    /// e.g. `queue.create`, `queue.delete`, `connection.close`.
    pub command: String,
    /// `namespace/name` of the ArtemisCluster.
    pub cluster: String,
    /// The broker object, e.g. `queue orders.in`.
    pub target: String,
    pub object_kind: String,
    pub object_namespace: String,
    pub object_name: String,
    pub object_uid: String,
    pub object_generation: Option<i64>,
    pub params: serde_json::Value,
}

/// The final verdict of a command (ADR-0049: any FAILED node makes the command failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandVerdict {
    Succeeded,
    Failed,
    /// The outcome could not be learned (e.g. the operator restarted mid-command).
    Unknown,
}

impl CommandVerdict {
    pub fn of(nodes: &[NodeOutcome]) -> Self {
        if nodes.iter().any(|n| n.outcome == Outcome::Failed) {
            CommandVerdict::Failed
        } else {
            CommandVerdict::Succeeded
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            CommandVerdict::Succeeded => "succeeded",
            CommandVerdict::Failed => "failed",
            CommandVerdict::Unknown => "unknown",
        }
    }
}

/// The JSON stored in `outcome_detail`: every node's outcome, and on failure the nodes that
/// applied, named (ADR-0049).
pub fn outcome_detail(nodes: &[NodeOutcome]) -> serde_json::Value {
    let applied: Vec<&str> = nodes
        .iter()
        .filter(|n| n.outcome == Outcome::Applied)
        .map(|n| n.node.as_str())
        .collect();
    serde_json::json!({ "nodes": nodes, "appliedNodes": applied })
}

impl Store {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new().max_connections(8).connect(url).await?;
        Ok(Store {
            pool,
            process_id: None,
        })
    }

    /// A store that never connects unless used (unit tests of stages that write no audit row).
    #[cfg(test)]
    pub fn unconnected() -> Self {
        Store {
            pool: PgPoolOptions::new()
                .connect_lazy("postgres://127.0.0.1:9/none")
                .unwrap_or_else(|e| panic!("lazy pool: {e}")),
            process_id: None,
        }
    }

    /// Apply the migrations on a dedicated connection that is closed afterwards (sqlx's
    /// migration lock can outlive a failed migration on a pooled connection).
    pub async fn migrate(url: &str) -> Result<(), StoreError> {
        let mut conn = PgConnectOptions::from_str(url)?.connect().await?;
        let result = MIGRATOR.run(&mut conn).await;
        conn.close().await?;
        Ok(result?)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// This store, writing audit intents as `process_id`'s.
    pub fn for_process(&self, process_id: &str) -> Store {
        Store {
            pool: self.pool.clone(),
            process_id: Some(process_id.to_string()),
        }
    }

    /// Say this process is alive; then complete as `unknown` every `pending` row of a process
    /// that is not (no heartbeat within [`PROCESS_GONE_AFTER`], or a row from before processes
    /// were recorded). A process that was only cut off and comes back still records its own
    /// outcome over it (an outcome is written by row id).
    pub async fn heartbeat_and_reap(&self, instance_id: &str) -> Result<Vec<AbandonedCommand>, StoreError> {
        let Some(me) = &self.process_id else {
            return Ok(vec![]);
        };
        sqlx::query(
            "INSERT INTO operator_process (process_id, instance_id) VALUES ($1, $2) \
             ON CONFLICT (process_id) DO UPDATE SET heartbeat_at = now()",
        )
        .bind(me)
        .bind(instance_id)
        .execute(&self.pool)
        .await?;
        let rows = sqlx::query_as::<_, AbandonedCommand>(
            "UPDATE audit_event a SET outcome = 'unknown', completed_at = now(), \
             outcome_detail = jsonb_build_object('reason', \
               'the operator process that sent this command (' || coalesce(a.process_id, 'an earlier binary') || \
               ') stopped before recording its outcome: what each node did is not known; the object''s next command acted (or acts) on what the broker showed then', \
               'followedBy', (SELECT coalesce(jsonb_agg(l.id ORDER BY l.id), '[]'::jsonb) FROM audit_event l \
                              WHERE l.object_uid = a.object_uid AND l.id > a.id)) \
             WHERE a.outcome = 'pending' AND a.process_id IS DISTINCT FROM $1 \
               AND NOT EXISTS (SELECT 1 FROM operator_process p WHERE p.process_id = a.process_id \
                               AND p.heartbeat_at > now() - make_interval(secs => $2)) \
             RETURNING a.id, a.object_uid, a.command",
        )
        .bind(me)
        .bind(PROCESS_GONE_AFTER.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Write the intent row before the first broker write; returns its id.
    pub async fn audit_intent(&self, i: &AuditIntent) -> Result<i64, StoreError> {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO audit_event (instance_id, actor, command, cluster, target, object_kind, \
             object_namespace, object_name, object_uid, object_generation, params, process_id) \
             VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12) RETURNING id",
        )
        .bind(&i.instance_id)
        .bind(&i.actor)
        .bind(&i.command)
        .bind(&i.cluster)
        .bind(&i.target)
        .bind(&i.object_kind)
        .bind(&i.object_namespace)
        .bind(&i.object_name)
        .bind(&i.object_uid)
        .bind(i.object_generation)
        .bind(&i.params)
        .bind(&self.process_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(id)
    }

    /// A command whose outcome cannot be learned (the process that sent it is gone): every row
    /// of this object still `pending` becomes `unknown`, with the reason. Returns how many.
    pub async fn audit_unknown(&self, object_uid: &str, reason: &str) -> Result<u64, StoreError> {
        let r = sqlx::query(
            "UPDATE audit_event SET outcome = 'unknown', outcome_detail = jsonb_build_object('reason', $2::text), \
             completed_at = now() WHERE object_uid = $1 AND outcome = 'pending'",
        )
        .bind(object_uid)
        .bind(reason)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    /// Complete the row with the per-node outcome.
    pub async fn audit_outcome(
        &self,
        id: i64,
        verdict: CommandVerdict,
        detail: &serde_json::Value,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE audit_event SET outcome = $2, outcome_detail = $3, completed_at = now() WHERE id = $1",
        )
        .bind(id)
        .bind(verdict.as_str())
        .bind(detail)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
