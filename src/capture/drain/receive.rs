//! The AMQP receive loop: one receiver per drain on the node's shared connection, credit
//! granted a batch at a time, each batch stored ([`super::batch`]) before it is accepted.

use std::time::Duration;

use fe2o3_amqp::Receiver;
use fe2o3_amqp::link::RecvError;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use tokio::sync::watch;

use super::batch::{Received, store_batch};
use super::health::DrainHealth;
use super::{BATCH, DrainError, DrainSpec};
use crate::capture::connection::NodeLinks;
use crate::store::Store;

/// One receiver's life on the node's shared connection: attach, then batches until stopped
/// or broken.
pub(super) async fn session(
    store: &Store,
    health: &DrainHealth,
    links: &NodeLinks,
    spec: &DrainSpec,
    stopped: &mut watch::Receiver<bool>,
) -> Result<(), DrainError> {
    let queue = spec.tap.capture_queue();
    let (mut receiver, lease) = links
        .attach(&spec.link, &spec.link_name, &format!("{queue}::{queue}"))
        .await?;
    store
        .ensure_partitions(&spec.subscription)
        .await
        .map_err(DrainError::Partitions)?;
    let coverage = store
        .coverage_start(&spec.subscription, &spec.key.node, &spec.tap.address, &queue)
        .await
        .map_err(DrainError::Coverage)?;
    health.set(&spec.key, true, None);
    health.set_coverage(&spec.key, Some((spec.subscription.clone(), coverage)));
    let result = batches(store, health, spec, &mut receiver, coverage, stopped).await;
    health.set_coverage(&spec.key, None);
    let _ = store.coverage_end(&spec.subscription, coverage).await;
    let _ = receiver.close().await;
    drop(lease);
    result
}

/// One copy: decoded, or one that would not decode (settled with its batch, counted as loss).
async fn receive(receiver: &mut Receiver) -> Result<Received, DrainError> {
    match receiver.recv::<Body<Value>>().await {
        Ok(d) => Ok(Received::Decoded(Box::new(d))),
        Err(RecvError::MessageDecode(e)) => Ok(Received::Undecodable(e.info)),
        Err(e) => Err(DrainError::Receive(e)),
    }
}

/// The first copy (or nothing within a second: an idle heartbeat), then whatever follows
/// within a short linger, up to BATCH.
async fn collect(
    receiver: &mut Receiver,
    stopped: &mut watch::Receiver<bool>,
) -> Result<Vec<Received>, DrainError> {
    let mut batch = vec![];
    tokio::select! {
        r = receive(receiver) => batch.push(r?),
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        _ = stopped.changed() => {}
    }
    while !batch.is_empty() && batch.len() < BATCH as usize {
        match tokio::time::timeout(Duration::from_millis(20), receive(receiver)).await {
            Ok(r) => batch.push(r?),
            Err(_) => break,
        }
    }
    Ok(batch)
}

/// Batches until stopped: each stored, then accepted; the next one's credit granted meanwhile.
async fn batches(
    store: &Store,
    health: &DrainHealth,
    spec: &DrainSpec,
    receiver: &mut Receiver,
    coverage: i64,
    stopped: &mut watch::Receiver<bool>,
) -> Result<(), DrainError> {
    // Credit is granted again only after a batch used it: an idle drain sends nothing to the
    // broker and nothing to the database (its coverage is confirmed with every other drain's,
    // `coverage::confirm_coverage`). It is granted before the batch
    // is committed (the broker streams the next batch meanwhile), never while a batch is held
    // for a database that refuses: at most two batches are unsettled.
    receiver.set_credit(BATCH).await.map_err(DrainError::Credit)?;
    loop {
        if *stopped.borrow() {
            return Ok(());
        }
        // A drain that dies (test builds only): what supervision restarts.
        if crate::crash_window::drain_dies() {
            panic!("test hook ARTEMIS_STUDIO_TEST_DRAIN_DIES");
        }
        let batch = collect(receiver, stopped).await?;
        if batch.is_empty() {
            health.set(&spec.key, true, None);
            continue;
        }
        receiver.set_credit(BATCH).await.map_err(DrainError::Credit)?;
        let Some(stored) = store_batch(store, health, spec, coverage, &batch, stopped).await else {
            // Stopped while the batch was held: it goes back to the queue unsettled.
            return Ok(());
        };
        // The crash window between commit and settle (test builds only): a SIGKILL here must
        // not make a second row of any copy redelivered to the next drain.
        crate::crash_window::pause(crate::crash_window::Window::AfterInsert, &stored.to_string()).await;
        receiver
            .accept_all(batch.iter().map(Received::info))
            .await
            .map_err(DrainError::Settle)?;
        health.set(&spec.key, true, None);
    }
}
