//! Postgres: migrations and the audit log (ADR-0049: one row per command, intent before the
//! first broker write, outcome after).

pub mod audit;
pub mod capture;
pub mod captured;
pub mod reading;
pub mod sampled;
pub mod storable;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use std::str::FromStr;

pub use audit::{
    AbandonedCommand, AuditIntent, CommandVerdict, HEARTBEAT, PROCESS_GONE_AFTER, outcome_detail,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("encoding audit detail: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("the audit log writer stopped before answering")]
    WriterGone,
    /// One failure of a statement that carried several callers' rows, each caller's error.
    #[error("{0}")]
    Shared(std::sync::Arc<StoreError>),
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
        if let StoreError::Shared(e) = self {
            return e.data_refusal();
        }
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
            StoreError::Shared(e) => e.sqlstate(),
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
    /// The group commit of audit intents and outcomes, shared by every clone of this store.
    audit: audit::GroupCommit,
}

impl Store {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new().max_connections(8).connect(url).await?;
        Ok(Store {
            pool,
            process_id: None,
            audit: audit::GroupCommit::default(),
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
            audit: audit::GroupCommit::default(),
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
            audit: self.audit.clone(),
        }
    }
}
