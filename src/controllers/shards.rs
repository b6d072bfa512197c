//! The shard loop (issue 46; the design: `src/shards/mod.rs`): every retry period, renew this replica's Lease, look at every shard Lease,
//! release what is assigned elsewhere (once idle) and take what is assigned here and free.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use super::{Context, key};
use crate::leader::Exit;
use crate::shards::assign::assign;
use crate::shards::{ShardLeases, View};

/// Run the shard loop until a requested stop (every cluster released once idle, then this
/// replica's Lease deleted) or until this replica cannot renew its Lease within the renew
/// deadline, or finds a cluster it holds taken by another: then it returns at once
/// (`Exit::LeaseLost`) and the process exits, so nothing of it writes any more.
pub async fn run(ctx: Arc<Context>, mut leases: ShardLeases, grace: Duration) -> Exit {
    let timing = leases.timing();
    let holdings = ctx.holdings.clone();
    let mut renewed_at: Option<Instant> = None;
    let mut stop_by: Option<Instant> = None;
    tracing::info!(identity = %leases.identity(), replica = %holdings.replica(), "shards: sharing the broker clusters out by Lease");
    loop {
        let attempt = Instant::now();
        match leases.renew_own().await {
            Ok(true) => {
                renewed_at = Some(attempt);
                holdings.renewed(attempt);
            }
            Ok(false) => tracing::warn!("shards: this replica's own Lease is held by another identity"),
            Err(e) => tracing::warn!(error = %e, "shards: cannot renew this replica's Lease"),
        }
        if renewed_at.is_some_and(|at| at.elapsed() >= timing.renew_deadline) {
            tracing::error!(deadline = ?timing.renew_deadline, "shards: this replica's Lease was not renewed within the renew deadline: stopping");
            return Exit::LeaseLost;
        }
        if ctx.shutdown.is_requested() && stop_by.is_none() {
            stop_by = Some(Instant::now() + grace);
        }
        let view = match leases.look().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "shards: cannot read the shard Leases");
                pause(&ctx, attempt + timing.retry_period).await;
                continue;
            }
        };
        if let Some(lost) = taken_from_me(&ctx, &leases, &view) {
            tracing::error!(cluster = %lost, "shards: a cluster this replica holds is held by another replica: stopping");
            return Exit::LeaseLost;
        }
        let mine = assigned_here(&ctx, &leases, &view, stop_by.is_some());
        release_the_rest(&ctx, &leases, &mine, stop_by).await;
        if let Some(by) = stop_by {
            if holdings.all_held().is_empty() {
                leases
                    .leave(timing.renew_deadline.min(Duration::from_secs(5)))
                    .await;
                return Exit::Stopped;
            }
            if Instant::now() >= by {
                tracing::warn!(grace = ?grace, held = ?holdings.all_held(), "shards: reconciles in flight outlived the shutdown grace: those clusters' Leases are left to expire");
                return Exit::GraceExceeded;
            }
        } else {
            take_what_is_free(&ctx, &leases, &view, &mine).await;
            leases.delete_stale(&view).await;
        }
        ctx.metrics.set_clusters_held(holdings.held().len());
        pause(&ctx, attempt + timing.retry_period).await;
    }
}

/// Until `until`, or a requested stop (acted on at once).
async fn pause(ctx: &Context, until: Instant) {
    tokio::select! {
        _ = tokio::time::sleep_until(until) => {}
        _ = ctx.shutdown.requested() => {}
    }
}

/// A cluster this replica holds (or is releasing) whose Lease names another holder.
fn taken_from_me(ctx: &Context, leases: &ShardLeases, view: &View) -> Option<String> {
    ctx.holdings
        .all_held()
        .into_iter()
        .find(|c| view.holder(c).is_some_and(|h| h != leases.identity()))
}

/// The clusters assigned to this replica (none once stopping).
fn assigned_here(ctx: &Context, leases: &ShardLeases, view: &View, stopping: bool) -> BTreeSet<String> {
    if stopping {
        return BTreeSet::new();
    }
    let clusters: Vec<String> = ctx
        .caches
        .clusters
        .state()
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| key(&c.namespace().unwrap_or_default(), &c.name_any()))
        .collect();
    let cs: Vec<&str> = clusters.iter().map(String::as_str).collect();
    let rs: Vec<&str> = view.live.iter().map(String::as_str).collect();
    assign(&cs, &rs)
        .into_iter()
        .filter(|(_, r)| *r == leases.identity())
        .map(|(c, _)| c.to_string())
        .collect()
}

/// Release every held cluster not in `mine` once no reconcile of it is in flight (no new one
/// starts meanwhile). While stopping, each waits at most until `stop_by`.
async fn release_the_rest(
    ctx: &Context,
    leases: &ShardLeases,
    mine: &BTreeSet<String>,
    stop_by: Option<Instant>,
) {
    let holdings = &ctx.holdings;
    for cluster in holdings.all_held().into_iter().filter(|c| !mine.contains(c)) {
        // Stopping: wait a little here for the last reconciles; otherwise look again next time.
        let wait = stop_by.map_or(Duration::ZERO, |_| Duration::from_secs(1));
        let idle = holdings.start_release(&cluster) || holdings.idle(&cluster, wait).await;
        if !idle {
            continue;
        }
        let gone = cluster
            .split_once('/')
            .is_none_or(|(ns, name)| ctx.caches.clusters.get(ns, name).is_none());
        match leases.release(&cluster, gone).await {
            Ok(()) => {
                holdings.forget(&cluster);
                ctx.topologies.remove(&cluster);
                ctx.clusters.remove(&cluster);
                tracing::info!(%cluster, gone, "shards: released this cluster");
            }
            Err(e) => {
                tracing::warn!(%cluster, error = %e, "shards: cannot release this cluster's Lease; retried")
            }
        }
    }
}

/// Take every cluster assigned here whose Lease is free: none yet, released, this replica's own
/// (a take whose answer was lost), or held by a replica no longer live. Each one taken is
/// polled at once, and its objects follow from that first poll.
async fn take_what_is_free(ctx: &Context, leases: &ShardLeases, view: &View, mine: &BTreeSet<String>) {
    let holdings = &ctx.holdings;
    let held: BTreeSet<String> = holdings.all_held().into_iter().collect();
    for cluster in mine.iter().filter(|c| !held.contains(*c)) {
        match view.holder(cluster) {
            Some(h) if h != leases.identity() && view.is_live(h) => continue,
            Some(h) if h != leases.identity() => {
                tracing::info!(%cluster, previous = %h, "shards: the holder's Lease expired unrenewed; taking this cluster over")
            }
            _ => {}
        }
        match leases.take(cluster, view.clusters.get(cluster)).await {
            Ok(true) => {
                holdings.take(cluster);
                tracing::info!(%cluster, "shards: holding this cluster");
                // Its first poll here triggers every object of it (a first poll changes everything).
                if let Some((ns, name)) = cluster.split_once('/') {
                    let _ = ctx.triggers.clusters.send(ObjectRef::new(name).within(ns));
                }
            }
            Ok(false) => tracing::debug!(%cluster, "shards: another replica took this cluster first"),
            Err(e) => tracing::warn!(%cluster, error = %e, "shards: cannot take this cluster's Lease"),
        }
    }
}
