//! The drains a pass asks for: one per installed capture queue per live node, at the node's
//! AMQP acceptor, with the cluster's credentials.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::ClusterState;
use super::survey::Survey;
use crate::api::capture::ArtemisCaptureSubscription;
use crate::api::capture_names::TapName;
use crate::broker::BrokerManagement;
use crate::capture::connection::LinkKey;
use crate::capture::drain::DrainKey;

/// A tap on one node (by node ID).
type TapOnNode = (TapName, String);

/// A capture queue on a live node that a drain should consume.
#[derive(Clone)]
pub struct DrainTarget {
    pub key: DrainKey,
    pub tap: TapName,
    /// The node's AMQP URL and the credentials its drain connects with.
    pub link: LinkKey,
    pub max_body_bytes: usize,
    pub max_ingest_per_second: u32,
    /// This pass (re)created the capture queue (a broker restart or failover lost it): a drain
    /// still waiting out its reconnect backoff starts over now, not up to 30 s later.
    pub fresh_queue: bool,
}

/// The drains that should run: one per installed tap and node, with the cluster's credentials.
pub(super) async fn drains_to_run(
    state: &ClusterState,
    cluster_key: &str,
    seen: &Survey,
    subs_by_name: &BTreeMap<String, &Arc<ArtemisCaptureSubscription>>,
    (targets, fresh_queues): (&[TapOnNode], &BTreeSet<TapOnNode>),
) -> Vec<DrainTarget> {
    let mut drains = vec![];
    for (tap, node) in targets {
        let fresh_queue = fresh_queues.contains(&(tap.clone(), node.clone()));
        let (Some(spec), Some(n)) = (seen.desired.get(tap), seen.topology.find(node)) else {
            continue;
        };
        let (Some(sub), Some(m)) = (subs_by_name.get(&tap.subscription), &n.active) else {
            continue;
        };
        let Some(url) = amqp_url(state, m).await else {
            continue;
        };
        drains.push(DrainTarget {
            key: DrainKey {
                cluster: cluster_key.to_string(),
                node: node.clone(),
                capture_queue: spec.name.capture_queue(),
            },
            tap: tap.clone(),
            link: LinkKey {
                url,
                username: seen.access.credentials.username.clone(),
                password: seen.access.credentials.password.clone(),
            },
            max_body_bytes: sub.spec.max_body_bytes as usize,
            max_ingest_per_second: sub.spec.max_ingest_per_second,
            fresh_queue,
        });
    }
    drains
}

/// The AMQP endpoint of a node's active broker: its AMQP acceptor's port, on the Jolokia
/// endpoint's host when the acceptor listens on every interface.
async fn amqp_url(state: &ClusterState, m: &BrokerManagement) -> Option<String> {
    let endpoint = m.client().url().to_string();
    if let Some(u) = state.amqp.lock().await.get(&endpoint) {
        return Some(u.clone());
    }
    let (host, port) = match m.amqp_acceptor().await {
        Ok(Some(found)) => found,
        Ok(None) => {
            tracing::warn!(%endpoint, "capture: the broker has no plain AMQP acceptor; its taps cannot be drained");
            return None;
        }
        Err(e) => {
            tracing::warn!(%endpoint, error = %e, "capture: cannot read the broker's acceptors");
            return None;
        }
    };
    let jolokia_host = reqwest::Url::parse(&endpoint)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "localhost".into());
    let host = if host.is_empty() || host == "0.0.0.0" || host == "::" || host == "[::]" {
        jolokia_host
    } else {
        host
    };
    let url = format!("amqp://{host}:{port}");
    state.amqp.lock().await.insert(endpoint, url.clone());
    Some(url)
}
