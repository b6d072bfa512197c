//! The orphan sweep (ADR-0062 D6): the only thing that ever removes a tap. The drains of every
//! swept tap stop together (one grace), then the removals run side by side, each with its own
//! audit row.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::install::INSTALLS_AT_ONCE;
use super::{ClusterState, PassError, PassScope, intent, may_start, told};
use crate::api::capture::ArtemisCaptureSubscription;
use crate::api::capture_names::TapName;
use crate::api::{Outcome, RefusalKind};
use crate::broker::{BrokerError, BrokerManagement};
use crate::capture::drain::{DrainHandle, DrainKey};
use crate::controllers::command;
use crate::fanout::{NodeFailure, NodeReport, Target};
use crate::store::capture::TapKey;

/// The orphan sweep: the only thing that ever removes a tap (ADR-0062 D6). The number of
/// commands sent. Issue 42: the drains of every swept tap stop together (one grace), then the
/// removals run side by side, so their operations to one node share bulk POSTs; each keeps its
/// own audit row.
pub(super) async fn sweep_all(
    scope: &PassScope<'_>,
    state: &ClusterState,
    sweeps: BTreeMap<TapName, BTreeMap<String, (bool, bool)>>,
    subs_by_name: &BTreeMap<String, &Arc<ArtemisCaptureSubscription>>,
    elsewhere: &BTreeMap<String, String>,
) -> Result<(i32, i32), PassError> {
    use futures::StreamExt;
    if !may_start(scope.writes_until) && !sweeps.is_empty() {
        // Not even the drains are stopped: the next pass sweeps these with its whole budget.
        let deferred = i32::try_from(sweeps.len()).unwrap_or(i32::MAX);
        tracing::info!(cluster = %scope.cluster_key, deferred, "capture: the pass's time for writes is spent; the sweep waits for the next pass");
        return Ok((0, deferred));
    }
    let mut swept = vec![];
    for (tap, nodes) in sweeps {
        let sub = subs_by_name.get(&tap.subscription).copied();
        if let (None, Some(owner)) = (sub, elsewhere.get(&tap.subscription)) {
            tracing::debug!(tap = %tap.divert(), %owner, "not this cluster's tap: its subscription is another cluster's on these brokers");
            continue;
        }
        swept.push((tap, nodes, sub));
    }
    // The drains go first: a consumer re-attaching to a queue the sweep just removed could
    // have the broker auto-create an ordinary queue in its place.
    let mut keys: Vec<DrainKey> = vec![];
    for (tap, nodes, _) in &swept {
        keys.extend(nodes.keys().map(|node| DrainKey {
            cluster: scope.cluster_key.to_string(),
            node: node.clone(),
            capture_queue: tap.capture_queue(),
        }));
    }
    let handles: Vec<DrainHandle> = {
        let mut drains = state.drains.lock().await;
        keys.iter().filter_map(|k| drains.remove(k)).collect()
    };
    futures::future::join_all(handles.into_iter().map(|h| h.stop(SWEEP_DRAIN_GRACE))).await;
    // Boxed as Send, as in `install_all`.
    let each: Vec<futures::future::BoxFuture<'_, Result<bool, PassError>>> = swept
        .into_iter()
        .map(|(tap, nodes, sub)| -> futures::future::BoxFuture<'_, Result<bool, PassError>> {
            let reason = match elsewhere.get(&tap.subscription) {
                Some(other) if sub.is_some() && tap.is_legacy() => format!(
                    "named before tap names carried the namespace, and {other} has the same name on these brokers: re-installed under a name that carries it (issue 42)"
                ),
                _ => sweep_reason(sub, &tap),
            };
            Box::pin(async move {
                if !may_start(scope.writes_until) {
                    return Ok(false);
                }
                remove(scope, sub, &tap, &nodes, &reason).await.map(|()| true)
            })
        })
        .collect();
    let results: Vec<Result<bool, PassError>> = futures::stream::iter(each)
        .buffer_unordered(INSTALLS_AT_ONCE)
        .collect()
        .await;
    let (mut commands, mut deferred) = (0, 0);
    let mut first_error = None;
    for r in results {
        match r {
            Ok(true) => commands += 1,
            Ok(false) => deferred += 1,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok((commands, deferred)), Err)
}

/// How long a swept tap's drain may take to commit and settle the batch in hand.
const SWEEP_DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Why a tap is swept, for its audit row.
fn sweep_reason(sub: Option<&Arc<ArtemisCaptureSubscription>>, tap: &TapName) -> String {
    match sub {
        Some(s) if s.metadata.deletion_timestamp.is_some() => "subscription deleted".to_string(),
        Some(s) if crate::capture::sample::is_sampling(s) => {
            "the subscription switched to mode Sample: it browses, and installs no tap".to_string()
        }
        Some(_) => "the subscription no longer captures this address (no queue it matches is bound there)"
            .to_string(),
        None => format!(
            "orphan: no ArtemisCaptureSubscription {} (deleted while no operator ran, or its finalizer was removed)",
            tap.subscription
        ),
    }
}

/// Audit intent → remove on every node holding something of the tap → audit outcome → records.
async fn remove(
    p: &PassScope<'_>,
    sub: Option<&Arc<ArtemisCaptureSubscription>>,
    tap: &TapName,
    nodes: &BTreeMap<String, (bool, bool)>,
    reason: &str,
) -> Result<(), PassError> {
    let (ctx, cluster_key) = (p.ctx, p.cluster_key);
    let params = json!({
        "sourceAddress": tap.address,
        "captureQueue": tap.capture_queue(),
        "divert": tap.divert(),
        "reason": reason,
        "nodes": nodes.keys().collect::<Vec<_>>(),
    });
    let audit = intent(p, "capture.remove", sub, tap, params);
    let scope = p.topology.restricted_to(&nodes.keys().cloned().collect());
    let result = command::execute(ctx, told(sub), &scope, p.timeout * 6, audit, |t: Target| {
        let (queue, divert) = nodes.get(&t.node_id).copied().unwrap_or((true, true));
        async move { remove_on(&t.management, tap, queue, divert).await }
    })
    .await?;
    let (audit_id, outcomes) = (result.audit_id, result.nodes);
    for o in outcomes.iter().filter(|o| o.outcome == Outcome::Applied) {
        let key = TapKey {
            cluster: cluster_key,
            subscription: &tap.subscription,
            source_address: &tap.address,
            node: &o.node,
            instance_id: &ctx.instance_id,
        };
        ctx.store.close_tap(&key, reason, Some(audit_id)).await?;
    }
    Ok(())
}

/// Divert first (nothing more is copied), then the queue and its address, then the settings.
async fn remove_on(
    m: &BrokerManagement,
    tap: &TapName,
    queue: bool,
    divert: bool,
) -> Result<NodeReport, NodeFailure> {
    let q = tap.capture_queue();
    let gone = |r: Result<(), BrokerError>, kinds: &[RefusalKind]| match r {
        Err(e) if kinds.contains(&e.refusal_kind()) => Ok(()),
        r => r,
    };
    let mut done = vec![];
    if divert {
        gone(
            m.destroy_divert(&tap.divert()).await,
            &[RefusalKind::DivertDoesNotExist],
        )?;
        done.push("divert");
    }
    if queue {
        // The ring holds copies only; removing them is what deleting a subscription asks for.
        gone(m.destroy_queue(&q, true).await, &[RefusalKind::QueueDoesNotExist])?;
        done.push("ring queue");
    }
    gone(
        m.delete_address(&q).await,
        &[RefusalKind::AddressDoesNotExist, RefusalKind::AddressHasBindings],
    )?;
    m.remove_address_settings(&q).await?;
    m.remove_security_settings(&q).await?;
    done.extend(["address settings", "security setting"]);
    Ok(NodeReport::new(
        Outcome::Applied,
        format!("removed {}", done.join(", ")),
    ))
}
