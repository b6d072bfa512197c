//! This process's liveness in the audit store: its heartbeat, and the leader's reaping of the
//! `pending` rows of processes that stopped.

use std::sync::Arc;

use super::Context;

/// Complete, as `unknown`, the `pending` audit rows of processes that stopped (killed inside a
/// command): no row stays `pending` for ever (issue 22 item 5). Every process heartbeats on its
/// own ([`heartbeat`]); the leader reaps.
pub(super) async fn reap_abandoned_commands(ctx: Arc<Context>) {
    loop {
        match ctx.store.reap_abandoned().await {
            Ok(rows) => {
                for r in rows {
                    tracing::warn!(audit_id = r.id, command = %r.command, object_uid = %r.object_uid,
                        "a command of an operator process that stopped has no outcome: recorded as unknown");
                    if let Ok(mut m) = ctx.abandoned.lock() {
                        m.entry(r.object_uid).or_default().push(r.id);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "audit heartbeat"),
        }
        tokio::time::sleep(crate::store::HEARTBEAT).await;
    }
}

/// Say, every [`crate::store::HEARTBEAT`], that this process is alive, for as long as it runs:
/// every replica, leader or standby, since a standby serving capture writes audit rows too
/// (issue 50), and a row whose process has no heartbeat is reaped as abandoned.
pub async fn heartbeat(ctx: Arc<Context>) {
    loop {
        if let Err(e) = ctx.store.heartbeat(&ctx.instance_id).await {
            tracing::warn!(error = %e, "audit heartbeat");
        }
        tokio::time::sleep(crate::store::HEARTBEAT).await;
    }
}
