//! The captured row a MessageReplay sends again (issue 48): its body as stored, how it was
//! stored, and what was changed so that Postgres could take it.

use super::{OnPool, Store, StoreError};

/// One captured row, as much of it as a replay needs.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct ReplaySource {
    pub row_id: i64,
    /// The logical node it was drained on.
    pub node: String,
    pub original_address: String,
    /// Application properties as captured (JSON values).
    pub properties: serde_json::Value,
    /// `data`, `amqp-value`, `amqp-sequence`, `empty`; None: a sampled row or one stored before
    /// body kinds were recorded.
    pub body_kind: Option<String>,
    pub body_text: Option<String>,
    pub body_binary: Option<Vec<u8>>,
    pub body_truncated: bool,
    /// What was changed so that Postgres could store the copy; None: stored as received.
    pub escaped: Option<Vec<String>>,
    /// `captured` or `sampled`.
    pub origin: String,
}

impl Store {
    /// The row `row_id` of `subscription` on `cluster` (`namespace/name`), if stored.
    pub async fn replay_source(
        &self,
        cluster: &str,
        subscription: &str,
        row_id: i64,
    ) -> Result<Option<ReplaySource>, StoreError> {
        sqlx::query_as(
            "SELECT row_id, node, original_address, properties, body_kind, body_text, body_binary, \
             body_truncated, escaped, origin FROM captured_message \
             WHERE cluster = $1 AND subscription = $2 AND row_id = $3",
        )
        .bind(cluster)
        .bind(subscription)
        .bind(row_id)
        .fetch_optional(self.pool())
        .await
        .on(self.pool())
    }
}
