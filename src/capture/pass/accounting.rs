//! The loss a capture pass counts once its writes are done (issue 42), from one read of each
//! node's counters (`capture::counters`): each ring's own loss (`capture::loss`), both sides of
//! each tap (`capture::reconcile`), and the failover windows this pass's re-created queues close
//! (`capture::window`). Stored in `capture_loss`, counted in the metrics.

use std::collections::{BTreeMap, BTreeSet};

use super::ClusterState;
use super::judge::Judged;
use super::survey::Survey;
use crate::api::capture_names::TapName;
use crate::capture::plan::TapSpec;
use crate::capture::window::SourceMark;
use crate::controllers::Context;
use crate::store::StoreError;
use crate::store::captured::{LossAt, QueueCounters};
use crate::topology::Topology;

/// Every loss this pass counts once its writes are done: the capture queues' counters, both
/// sides of every tap (which close the windows of the queues re-created), and the windows no
/// read closed — all from one read of each node's counters.
pub(super) async fn count_loss(
    ctx: &Context,
    state: &ClusterState,
    cluster_key: &str,
    (seen, judged): (&Survey, &Judged),
    divert_missing: &BTreeSet<(TapName, String)>,
    mut windows: crate::capture::window::Windows,
) {
    let (topology, targets) = (&seen.topology, &judged.drain_targets);
    let reads = read_counters(ctx, topology, targets).await;
    read_loss(ctx, state, cluster_key, &reads).await;
    let sides = SidesScope {
        divert_missing,
        desired: &seen.desired,
        windows: &mut windows,
    };
    reconcile_sides(ctx, state, cluster_key, &reads, sides).await;
    let marks = &state.source_marks;
    crate::capture::window::close_unread(ctx, marks, cluster_key, windows, &judged.fresh_queues).await;
}

/// One node's counters with the taps they were read for.
struct NodeRead<'t> {
    node: &'t str,
    endpoint: String,
    inventory: &'t crate::topology::inventory::NodeInventory,
    taps: Vec<&'t TapName>,
    counters: crate::capture::counters::NodeCounters,
}

/// Read every node's counters, one bulk request per node whatever its taps (`counters`), the
/// nodes concurrently. A node that cannot be read is left out this pass.
async fn read_counters<'t>(
    ctx: &Context,
    topology: &'t Topology,
    taps: &'t [(TapName, String)],
) -> Vec<NodeRead<'t>> {
    let mut by_node: BTreeMap<&str, Vec<&TapName>> = BTreeMap::new();
    for (t, n) in taps {
        by_node.entry(n.as_str()).or_default().push(t);
    }
    let reads = by_node.into_iter().filter_map(|(node, taps)| {
        let n = topology.find(node)?;
        let (m, inventory) = (n.active.as_ref()?, n.inventory.as_deref()?);
        Some(async move {
            let sources: BTreeSet<&str> = taps.iter().map(|t| t.address.as_str()).collect();
            match crate::capture::counters::read(m, &ctx.instance_id, &sources).await {
                Ok(counters) => Some(NodeRead {
                    node,
                    endpoint: m.client().url().to_string(),
                    inventory,
                    taps,
                    counters,
                }),
                Err(e) => {
                    tracing::warn!(%node, error = %e, "capture: counters unreadable this pass");
                    None
                }
            }
        })
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Add what each existing capture queue lost since the last read to `capture_loss`
/// (CAPTURE-NOTES; counters reset with the broker), and keep each source's routed count as
/// the baseline of a later failover window.
async fn read_loss(ctx: &Context, state: &ClusterState, cluster_key: &str, reads: &[NodeRead<'_>]) {
    for r in reads {
        for tap in &r.taps {
            let Some(read) = r.counters.ring(tap) else {
                continue;
            };
            // The capture queue is there: the source side's baseline for a later window.
            if let Some(routed) = r.counters.source_routed(&tap.address) {
                state.source_marks.lock().await.insert(
                    (r.node.to_string(), tap.address.clone()),
                    SourceMark {
                        endpoint: r.endpoint.clone(),
                        routed,
                        at: std::time::Instant::now(),
                        queue_there: true,
                    },
                );
            }
            let at = LossAt {
                cluster: cluster_key,
                subscription: &tap.subscription,
                node: r.node,
                source_address: &tap.address,
            };
            let memo = (r.node.to_string(), tap.capture_queue());
            let result = record_queue_loss(ctx, state, &at, memo, &read.counters()).await;
            if let Err(e) = result {
                tracing::warn!(node = %r.node, error = %e, "capture: loss not recorded this pass");
            }
        }
    }
}

/// What the capture queue's counters say was lost since their last read (the memo, else the
/// saved read), added to `capture_loss` by cause and saved as the next baseline — only when
/// they changed, so an idle tap costs no write.
async fn record_queue_loss(
    ctx: &Context,
    state: &ClusterState,
    at: &LossAt<'_>,
    memo: (String, String),
    now: &QueueCounters,
) -> Result<(), StoreError> {
    let queue = &memo.1;
    let before = match state.counters.lock().await.get(&memo) {
        Some(c) => Some(*c),
        None => ctx.store.last_counters(at, queue).await?,
    };
    if before.as_ref() == Some(now) {
        return Ok(());
    }
    let d = crate::capture::loss::delta(before.as_ref(), now);
    ctx.store.add_loss(at, "ring_overwrite", d.ring).await?;
    ctx.store.add_loss(at, "address_full", d.address).await?;
    ctx.store.add_loss(at, "broker_restart", d.reset).await?;
    ctx.store.save_counters(at, queue, now).await?;
    let m = &ctx.metrics.capture;
    m.dropped(at.cluster, at.subscription, "ring_overwrite", d.ring);
    m.dropped(at.cluster, at.subscription, "address_full", d.address);
    m.dropped(at.cluster, at.subscription, "broker_restart", d.reset);
    state.counters.lock().await.insert(memo, *now);
    Ok(())
}

/// What [`reconcile_sides`] judges the reads with.
struct SidesScope<'a> {
    /// Taps whose divert this pass found gone and re-created.
    divert_missing: &'a BTreeSet<(TapName, String)>,
    desired: &'a BTreeMap<TapName, TapSpec>,
    /// The windows open on this pass's re-created queues: a read closes each.
    windows: &'a mut crate::capture::window::Windows,
}

/// Issue 25 item 3: per tap and node, what the source routed against what reached the capture
/// queue since the last read (`reconcile`); a shortfall no other cause explains goes to
/// `capture_loss` as `tap_missing` or `unexplained`. A tap whose queue this pass re-created
/// under its divert has a new baseline instead, and the same read closes its window
/// (`window::count`: the source's routed count less the copies the new queue got).
async fn reconcile_sides(
    ctx: &Context,
    state: &ClusterState,
    cluster_key: &str,
    reads: &[NodeRead<'_>],
    scope: SidesScope<'_>,
) {
    for r in reads {
        for tap in &r.taps {
            let Some(mut now) = r.counters.sides(tap, r.inventory) else {
                continue;
            };
            let node = r.node;
            let at = LossAt {
                cluster: cluster_key,
                subscription: &tap.subscription,
                node,
                source_address: &tap.address,
            };
            let key = (node.to_string(), (*tap).clone());
            let missing = scope.divert_missing.contains(&((*tap).clone(), node.to_string()));
            let filtered = scope.desired.get(*tap).is_some_and(|t| t.filter.is_some());
            if let Some(w) = scope.windows.remove(&((*tap).clone(), node.to_string())) {
                let (lost, bound) = crate::capture::window::count(&w, &now, filtered);
                crate::capture::window::record(ctx, &at, lost, bound).await;
                state.sides.lock().await.insert(key, now);
                continue;
            }
            let mut sides = state.sides.lock().await;
            let short = crate::capture::reconcile::shortfall(sides.get(&key), &mut now, missing, filtered);
            sides.insert(key, now);
            drop(sides);
            let Some(short) = short else { continue };
            tracing::warn!(%node, address = %tap.address, subscription = %tap.subscription, cause = short.cause, lost = short.messages, "capture: the source routed more than reached the capture queue");
            if let Err(e) = ctx.store.add_loss(&at, short.cause, short.messages).await {
                tracing::warn!(%node, error = %e, "capture: the shortfall not recorded");
            }
            let metrics = &ctx.metrics.capture;
            metrics.dropped(cluster_key, &tap.subscription, short.cause, short.messages);
        }
    }
}
