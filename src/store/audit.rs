//! The audit log (ADR-0049: one row per command, its intent written before the first broker
//! write and its outcome after), written by group commit: the intents and outcomes that
//! concurrent reconciles ask for while one statement is in flight go together in the next,
//! one transaction and one WAL flush for all of them, each still its own row. Nothing waits
//! for a batch to fill: a lone command costs one statement, as before.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::{OnPool, Store, StoreError};
use crate::api::{NodeOutcome, Outcome};

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
    /// Say this process is alive: every process that writes audit rows (the leader's
    /// controllers, and any replica serving capture) heartbeats, or its pending rows would be
    /// reaped as abandoned while it is still sending them.
    pub async fn heartbeat(&self, instance_id: &str) -> Result<(), StoreError> {
        let Some(me) = &self.process_id else {
            return Ok(());
        };
        sqlx::query(
            "INSERT INTO operator_process (process_id, instance_id) VALUES ($1, $2) \
             ON CONFLICT (process_id) DO UPDATE SET heartbeat_at = now()",
        )
        .bind(me)
        .bind(instance_id)
        .execute(&self.pool)
        .await
        .on(&self.pool)?;
        Ok(())
    }

    /// Complete as `unknown` every `pending` row of a process that is not alive (no heartbeat
    /// within [`PROCESS_GONE_AFTER`], or a row from before processes were recorded). A process
    /// that was only cut off and comes back still records its own outcome over it (an outcome is
    /// written by row id).
    pub async fn reap_abandoned(&self) -> Result<Vec<AbandonedCommand>, StoreError> {
        let Some(me) = &self.process_id else {
            return Ok(vec![]);
        };
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
        .await.on(&self.pool)?;
        Ok(rows)
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
        .await.on(&self.pool)?;
        Ok(r.rows_affected())
    }
}

/// The most requests one statement carries.
const MOST_PER_STATEMENT: usize = 256;

/// What a caller waits for.
enum Request {
    Intent {
        intent: Box<AuditIntent>,
        process_id: Option<String>,
        reply: oneshot::Sender<Result<i64, StoreError>>,
    },
    Outcome {
        id: i64,
        verdict: CommandVerdict,
        detail: serde_json::Value,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// The writer task's queue, started on first use and shared by every clone of a [`Store`].
/// A writer that died (a panic) is replaced at the next request (issue 43: supervised, restarted
/// by design): the requests it held get `WriterGone`, never every later one.
#[derive(Clone, Default)]
pub struct GroupCommit(Arc<Mutex<Option<mpsc::UnboundedSender<Request>>>>);

impl GroupCommit {
    fn send(&self, pool: &sqlx::PgPool, request: Request) {
        let Ok(mut writer) = self.0.lock() else {
            // A poisoned lock: the request is dropped, its caller gets `WriterGone`.
            return;
        };
        let tx = match writer.as_ref() {
            Some(tx) if !tx.is_closed() => tx,
            dead => {
                if dead.is_some() {
                    tracing::error!("the audit writer task ended: starting another");
                }
                writer.insert(spawn_writer(pool))
            }
        };
        // Refused only if the writer died since the check: its caller gets `WriterGone`.
        let _ = tx.send(request);
    }
}

fn spawn_writer(pool: &sqlx::PgPool) -> mpsc::UnboundedSender<Request> {
    let (tx, rx) = mpsc::unbounded_channel();
    // Supervision: a writer that ended is replaced at the next request (`GroupCommit::send`).
    tokio::spawn(write_batches(pool.clone(), rx));
    tx
}

impl Store {
    /// Write the intent row before the first broker write; returns its id.
    pub async fn audit_intent(&self, i: &AuditIntent) -> Result<i64, StoreError> {
        let (reply, answer) = oneshot::channel();
        let request = Request::Intent {
            intent: Box::new(i.clone()),
            process_id: self.process_id.clone(),
            reply,
        };
        self.audit.send(&self.pool, request);
        answer.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Complete the row with the per-node outcome.
    pub async fn audit_outcome(
        &self,
        id: i64,
        verdict: CommandVerdict,
        detail: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        let request = Request::Outcome {
            id,
            verdict,
            detail: detail.clone(),
            reply,
        };
        self.audit.send(&self.pool, request);
        answer.await.map_err(|_| StoreError::WriterGone)?
    }
}

/// The writer: take what is waiting (at least one request), write it in one transaction,
/// answer everyone, repeat.
async fn write_batches(pool: sqlx::PgPool, mut rx: mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MOST_PER_STATEMENT {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        write(&pool, batch).await;
    }
}

/// Write `batch` and answer everyone. A batch Postgres refuses as data (a parameter it cannot
/// store) is halved until the request at fault is alone, so one refused row never fails its
/// neighbours and it gets its own error; any other failure (the database unavailable) is
/// everyone's.
async fn write(pool: &sqlx::PgPool, batch: Vec<Request>) {
    let (intents, outcomes): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .partition(|r| matches!(r, Request::Intent { .. }));
    match write_together(pool, &intents, &outcomes).await.on(pool) {
        Ok(ids) => {
            for (r, id) in intents.into_iter().zip(ids) {
                answer(r, Ok(Some(id)));
            }
            for r in outcomes {
                answer(r, Ok(None));
            }
        }
        Err(e) if e.data_refusal().is_some() && intents.len() + outcomes.len() > 1 => {
            let mut all = intents;
            all.extend(outcomes);
            let second = all.split_off(all.len() / 2);
            Box::pin(write(pool, all)).await;
            Box::pin(write(pool, second)).await;
        }
        Err(e) => {
            let e = std::sync::Arc::new(e);
            for r in intents.into_iter().chain(outcomes) {
                answer(r, Err(StoreError::Shared(e.clone())));
            }
        }
    }
}

/// Both statements in one transaction; the intents' ids in request order.
async fn write_together(
    pool: &sqlx::PgPool,
    intents: &[Request],
    outcomes: &[Request],
) -> Result<Vec<i64>, StoreError> {
    let mut tx = pool.begin().await.on(pool)?;
    let ids = insert_intents(&mut tx, intents).await?;
    update_outcomes(&mut tx, outcomes).await?;
    tx.commit().await?;
    Ok(ids)
}

fn answer(r: Request, result: Result<Option<i64>, StoreError>) {
    match r {
        Request::Intent { reply, .. } => {
            let _ = reply.send(result.and_then(|id| id.ok_or(StoreError::WriterGone)));
        }
        Request::Outcome { reply, .. } => {
            let _ = reply.send(result.map(|_| ()));
        }
    }
}

/// One INSERT for every intent. The rows are inserted in `ord` order and each takes the
/// sequence's next value as it is inserted, so the ids sorted ascending are in request order.
async fn insert_intents(tx: &mut sqlx::PgConnection, intents: &[Request]) -> Result<Vec<i64>, StoreError> {
    if intents.is_empty() {
        return Ok(vec![]);
    }
    let c = IntentColumns::of(intents);
    let mut ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO audit_event (instance_id, actor, command, cluster, target, object_kind, \
         object_namespace, object_name, object_uid, object_generation, params, process_id) \
         SELECT i, a, c, cl, t, k, ns, n, u, g, p, pid FROM unnest($1::text[], $2::text[], \
         $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], \
         $10::int8[], $11::jsonb[], $12::text[]) WITH ORDINALITY AS r(i, a, c, cl, t, k, ns, n, u, g, p, pid, ord) \
         ORDER BY ord RETURNING id",
    )
    .bind(c.instance_id)
    .bind(c.actor)
    .bind(c.command)
    .bind(c.cluster)
    .bind(c.target)
    .bind(c.object_kind)
    .bind(c.object_namespace)
    .bind(c.object_name)
    .bind(c.object_uid)
    .bind(c.object_generation)
    .bind(c.params)
    .bind(c.process_id)
    .fetch_all(&mut *tx)
    .await?;
    ids.sort_unstable();
    Ok(ids)
}

/// The intents as columns, for `unnest`.
#[derive(Default)]
struct IntentColumns {
    instance_id: Vec<String>,
    actor: Vec<String>,
    command: Vec<String>,
    cluster: Vec<String>,
    target: Vec<String>,
    object_kind: Vec<String>,
    object_namespace: Vec<String>,
    object_name: Vec<String>,
    object_uid: Vec<String>,
    object_generation: Vec<Option<i64>>,
    params: Vec<serde_json::Value>,
    process_id: Vec<Option<String>>,
}

impl IntentColumns {
    fn of(intents: &[Request]) -> Self {
        let mut c = IntentColumns::default();
        for r in intents {
            let Request::Intent {
                intent: i,
                process_id,
                ..
            } = r
            else {
                continue;
            };
            c.instance_id.push(i.instance_id.clone());
            c.actor.push(i.actor.clone());
            c.command.push(i.command.clone());
            c.cluster.push(i.cluster.clone());
            c.target.push(i.target.clone());
            c.object_kind.push(i.object_kind.clone());
            c.object_namespace.push(i.object_namespace.clone());
            c.object_name.push(i.object_name.clone());
            c.object_uid.push(i.object_uid.clone());
            c.object_generation.push(i.object_generation);
            c.params.push(i.params.clone());
            c.process_id.push(process_id.clone());
        }
        c
    }
}

/// One UPDATE for every outcome.
async fn update_outcomes(tx: &mut sqlx::PgConnection, outcomes: &[Request]) -> Result<(), StoreError> {
    if outcomes.is_empty() {
        return Ok(());
    }
    let (mut ids, mut verdicts, mut details) = (vec![], vec![], vec![]);
    for r in outcomes {
        if let Request::Outcome {
            id, verdict, detail, ..
        } = r
        {
            ids.push(*id);
            verdicts.push(verdict.as_str());
            details.push(detail.clone());
        }
    }
    sqlx::query(
        "UPDATE audit_event a SET outcome = u.outcome, outcome_detail = u.detail, completed_at = now() \
         FROM unnest($1::int8[], $2::text[], $3::jsonb[]) AS u(id, outcome, detail) WHERE a.id = u.id",
    )
    .bind(ids)
    .bind(verdicts)
    .bind(details)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43: a writer that died is replaced at the next request — that request reaches a
    /// writer (here it fails on the unreachable database, as any write would) instead of every
    /// later intent failing `WriterGone` for ever.
    #[tokio::test]
    async fn a_dead_writer_is_replaced_at_the_next_request() {
        let options = sqlx::postgres::PgConnectOptions::new().host("127.0.0.1").port(1);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(std::time::Duration::from_millis(300))
            .connect_lazy_with(options);
        // The writer task is gone: its receiver dropped.
        let (dead, _) = mpsc::unbounded_channel();
        let store = Store {
            pool,
            process_id: None,
            audit: GroupCommit(Arc::new(Mutex::new(Some(dead)))),
        };
        let e = store
            .audit_outcome(1, CommandVerdict::Succeeded, &serde_json::Value::Null)
            .await
            .expect_err("the database is unreachable");
        assert!(!matches!(e, StoreError::WriterGone), "{e:?}");
    }
}
