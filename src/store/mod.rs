//! Postgres: migrations and the audit log (ADR-0049: one row per command, intent before the
//! first broker write, outcome after).

pub mod audit;
pub mod capture;
pub mod captured;
pub mod reading;
pub mod replay;
pub mod sampled;
mod secret;
pub mod storable;
pub mod target;

use std::sync::Arc;

use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions, Connection, PgPool};

pub use secret::Secret;
pub use target::{DatabaseConfig, DatabaseTarget, DatabaseUrlError};

pub use audit::{
    AbandonedCommand, AuditIntent, CommandVerdict, HEARTBEAT, PROCESS_GONE_AFTER, outcome_detail,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The server could not be reached or refused the session: names which server, never the
    /// password (see [`target::is_connection_error`]).
    #[error("Postgres at {target}: {source}")]
    Connection {
        target: Arc<DatabaseTarget>,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Url(#[from] DatabaseUrlError),
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
            StoreError::Database(sqlx::Error::Database(e))
            | StoreError::Connection {
                source: sqlx::Error::Database(e),
                ..
            } => e.code().map(|c| c.into_owned()),
            _ => None,
        }
    }

    /// This error, naming `target` when it is a connection failure.
    fn at(self, target: impl FnOnce() -> Arc<DatabaseTarget>) -> StoreError {
        match self {
            StoreError::Database(source) if target::is_connection_error(&source) => StoreError::Connection {
                target: target(),
                source,
            },
            other => other,
        }
    }
}

/// Naming the server in a connection failure, for the results of statements on a pool: the
/// pool's options say which server (computed only on a failure).
pub(crate) trait OnPool<T> {
    fn on(self, pool: &PgPool) -> Result<T, StoreError>;
}

impl<T, E: Into<StoreError>> OnPool<T> for Result<T, E> {
    fn on(self, pool: &PgPool) -> Result<T, StoreError> {
        self.map_err(|e| {
            e.into()
                .at(|| Arc::new(DatabaseTarget::of(&pool.connect_options())))
        })
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
    /// Connect to the database of `url` (checked first: see [`DatabaseConfig`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Store::connect_to(&DatabaseConfig::new(url, None)?).await
    }

    /// Connect a pool; a failure names the server.
    pub async fn connect_to(config: &DatabaseConfig) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(config.options().clone())
            .await
            .map_err(|e| StoreError::from(e).at(|| config.target().clone()))?;
        Ok(Store {
            pool,
            process_id: None,
            audit: audit::GroupCommit::default(),
        })
    }

    /// For a one-shot reader (`kubectl artemis`): one connection first, within `within`, so
    /// that a server that refuses or does not answer is an error at once naming it (host, port,
    /// database, user) and the cause. A pool's first acquire retries a refused connection until
    /// its acquire timeout (30 s by default) and then says only "pool timed out". Then a pool
    /// whose acquire waits at most `within`.
    pub async fn connect_within(
        config: &DatabaseConfig,
        within: std::time::Duration,
    ) -> Result<Self, StoreError> {
        let named = |e: sqlx::Error| StoreError::from(e).at(|| config.target().clone());
        let first = tokio::time::timeout(within, config.options().connect())
            .await
            .map_err(|_| StoreError::Connection {
                target: config.target().clone(),
                source: sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {} s", within.as_secs_f64()),
                )),
            })?
            .map_err(named)?;
        // Its job is done: the server answers and takes these credentials.
        let _ = first.close().await;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(within)
            .connect_lazy_with(config.options().clone());
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
        Store::migrate_to(&DatabaseConfig::new(url, None)?).await
    }

    /// [`Store::migrate`] on checked settings; a connection failure names the server.
    pub async fn migrate_to(config: &DatabaseConfig) -> Result<(), StoreError> {
        let named = |e: sqlx::Error| StoreError::from(e).at(|| config.target().clone());
        let mut conn = config.options().connect().await.map_err(named)?;
        let result = MIGRATOR.run(&mut conn).await;
        conn.close().await.map_err(named)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A server nothing listens on, with a password that must never show.
    fn nowhere() -> DatabaseConfig {
        DatabaseConfig::new("postgres://op@127.0.0.1:1/studio", Some("Qxq@Zzy")).expect("valid")
    }

    fn assert_names_the_server(e: &StoreError) {
        assert!(matches!(e, StoreError::Connection { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("127.0.0.1:1, database studio, user op"), "{text}");
        assert!(
            !text.contains("Qxq") && !format!("{e:?}").contains("Qxq"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_connection_failure_at_start_up_names_the_server_and_never_the_password() {
        let e = Store::migrate_to(&nowhere()).await.expect_err("nothing listens");
        assert_names_the_server(&e);
    }

    #[tokio::test]
    async fn a_reader_is_told_at_once_which_server_refused_and_why() {
        let started = std::time::Instant::now();
        let e = match Store::connect_within(&nowhere(), std::time::Duration::from_secs(5)).await {
            Ok(_) => panic!("nothing listens on 127.0.0.1:1"),
            Err(e) => e,
        };
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_names_the_server(&e);
        let text = e.to_string();
        assert!(!text.contains("pool timed out"), "{text}");
        assert!(
            matches!(&e, StoreError::Connection { source: sqlx::Error::Io(io), .. } if io.kind() == std::io::ErrorKind::ConnectionRefused),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_statement_that_cannot_reach_the_server_names_it() {
        let pool = PgPoolOptions::new()
            .acquire_timeout(std::time::Duration::from_millis(300))
            .connect_lazy_with(nowhere().options().clone());
        let store = Store {
            pool,
            process_id: None,
            audit: audit::GroupCommit::default(),
        };
        let e = store.audit_unknown("uid", "test").await.expect_err("unreachable");
        assert_names_the_server(&e);
        // A refusal of the statement itself is no connection failure.
        let refused = StoreError::from(sqlx::Error::RowNotFound).at(|| nowhere().target().clone());
        assert!(matches!(refused, StoreError::Database(_)), "{refused:?}");
    }
}
