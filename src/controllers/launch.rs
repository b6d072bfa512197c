//! Everything at once: every controller, the watches feeding the caches they read, and the
//! reaper of abandoned commands, until shutdown.

use std::sync::Arc;

use super::context::scoped_api;
use super::liveness::reap_abandoned_commands;
use super::watches::{Watches, reflect_all, split_feeds};
use super::{
    Context, Reflectors, Slots, Source, Wiring, census, cluster, connection_close, divert, message_replay,
    queue, trigger_stream,
};
use crate::api::{ArtemisCluster, ArtemisDivert, ArtemisQueue};

/// Run every controller (and the caches they read) until shutdown: one of each per watched
/// namespace. Controllers start once the caches have synced, so no decision is taken on a
/// partial view.
pub async fn run_all(ctx: Arc<Context>, reflectors: Reflectors) {
    ctx.metrics
        .census
        .count_from(Arc::new(census::FromCaches(ctx.caches.clone())));
    let Reflectors {
        clusters,
        queues,
        diverts,
        secrets,
        ..
    } = reflectors;
    let (cluster_watches, clusters) = split_feeds(clusters, &ctx.caches.clusters);
    let (queue_watches, queues) = split_feeds(queues, &ctx.caches.queues);
    let (divert_watches, diverts) = split_feeds(diverts, &ctx.caches.diverts);
    let feeds = Feeds {
        clusters,
        queues,
        diverts,
    };
    let watches = Watches {
        clusters: cluster_watches,
        queues: queue_watches,
        diverts: divert_watches,
        secrets,
    };
    tokio::select! {
        _ = run_controllers(ctx.clone(), feeds) => {}
        _ = reflect_all(ctx.clone(), watches) => {}
        _ = reap_abandoned_commands(ctx.clone()) => {}
    }
}

/// Each kind's controllers' sources, one per watched scope.
struct Feeds {
    clusters: Vec<Source<ArtemisCluster>>,
    queues: Vec<Source<ArtemisQueue>>,
    diverts: Vec<Source<ArtemisDivert>>,
}

/// Every controller of every scope, once every cache has its first list (readiness follows).
async fn run_controllers(ctx: Arc<Context>, feeds: Feeds) {
    use futures::future::join_all;
    let caches = &ctx.caches;
    caches.clusters.wait_until_ready().await;
    caches.queues.wait_until_ready().await;
    caches.diverts.wait_until_ready().await;
    // Kept by capture's watch (`Reflectors::take_subscriptions`).
    caches.subscriptions.wait_until_ready().await;
    caches.secrets.wait_until_ready().await;
    ctx.metrics.set_ready();
    let scopes = ctx.namespaces.scopes();
    let c = &ctx.concurrency;
    let (close_slots, cluster_slots) = (Slots::new(c.connection_close), Slots::new(c.cluster));
    let (queue_slots, divert_slots) = (Slots::new(c.queue), Slots::new(c.divert));
    let closes = scopes.iter().map(|scope| {
        let w = Wiring::new(
            Source::Watch(Box::new(scoped_api(&ctx.client, scope))),
            futures::StreamExt::boxed(futures::stream::pending()),
            close_slots.clone(),
        );
        connection_close::run(ctx.clone(), w)
    });
    // One-shot kinds share the one-shot slots (CONNECTION_CLOSE_CONCURRENCY).
    let replays = scopes.iter().map(|scope| {
        let w = Wiring::new(
            Source::Watch(Box::new(scoped_api(&ctx.client, scope))),
            futures::StreamExt::boxed(futures::stream::pending()),
            close_slots.clone(),
        );
        message_replay::run(ctx.clone(), w)
    });
    let clusters = scopes.iter().zip(feeds.clusters).map(|(scope, source)| {
        let t = trigger_stream(&ctx.triggers.clusters, scope.clone());
        cluster::run(ctx.clone(), Wiring::new(source, t, cluster_slots.clone()))
    });
    let queues = scopes.iter().zip(feeds.queues).map(|(scope, source)| {
        let t = trigger_stream(&ctx.triggers.queues, scope.clone());
        queue::run(ctx.clone(), Wiring::new(source, t, queue_slots.clone()))
    });
    let diverts = scopes.iter().zip(feeds.diverts).map(|(scope, source)| {
        let t = trigger_stream(&ctx.triggers.diverts, scope.clone());
        divert::run(ctx.clone(), Wiring::new(source, t, divert_slots.clone()))
    });
    tokio::join!(
        join_all(closes),
        join_all(replays),
        join_all(clusters),
        join_all(queues),
        join_all(diverts)
    );
}
