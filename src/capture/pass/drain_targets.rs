//! The drains a pass asks for: one per installed capture queue per live node, at the node's
//! AMQP acceptor, with the cluster's credentials.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::ClusterState;
use super::survey::Survey;
use crate::api::capture::ArtemisCaptureSubscription;
use crate::api::capture_names::TapName;
use crate::broker::BrokerManagement;
use crate::capture::connection::{LinkKey, Trust};
use crate::capture::drain::DrainKey;
use crate::capture::tls::DrainTransport;

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
        let (url, trust) = match amqp_url(state, m, &seen.transport).await {
            Ok(found) => {
                state.no_drain.lock().await.remove(node);
                found
            }
            Err(why) => {
                state.no_drain.lock().await.insert(node.clone(), why.to_string());
                continue;
            }
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
                trust,
            },
            max_body_bytes: sub.spec.max_body_bytes as usize,
            max_ingest_per_second: sub.spec.max_ingest_per_second,
            fresh_queue,
        });
    }
    drains
}

/// Why a node's taps have no drain: what their status says instead of "no drain runs".
#[derive(Debug, thiserror::Error)]
pub enum NoDrain {
    #[error(
        "the broker at {0} has no TLS acceptor that speaks AMQP (sslEnabled=true, protocols including AMQP), and this cluster uses TLS, so captured payloads and credentials are not sent in clear: add one to broker.xml, or set spec.allowCaptureInClear on the ArtemisCluster"
    )]
    NoTlsAcceptor(String),
    #[error(
        "the broker at {0} has no AMQP acceptor without TLS: add one, or give the cluster its CA in spec.tls to drain over TLS"
    )]
    NoPlainAcceptor(String),
    #[error("cannot read the acceptors of {endpoint}: {source}")]
    AcceptorsUnreadable {
        endpoint: String,
        #[source]
        source: crate::broker::BrokerError,
    },
}

/// The AMQP endpoint of a node's active broker and what its handshake trusts: its AMQP
/// acceptor's port (a TLS one when the cluster uses TLS, issue 44), on the Jolokia endpoint's
/// host when the acceptor listens on every interface.
async fn amqp_url(
    state: &ClusterState,
    m: &BrokerManagement,
    transport: &DrainTransport,
) -> Result<(String, Trust), NoDrain> {
    let endpoint = m.client().node().to_string();
    let mut tls = transport.tls.clone();
    let mut found = acceptor(state, m, &endpoint, tls.is_some()).await?;
    if found.is_none() && tls.is_some() && transport.clear_allowed {
        tracing::warn!(%endpoint, "capture: no TLS acceptor for AMQP; draining in clear (spec.allowCaptureInClear)");
        tls = None;
        found = acceptor(state, m, &endpoint, false).await?;
    }
    match (found, tls) {
        (Some(url), tls) => Ok((url, tls.unwrap_or(Trust::SystemRoots))),
        (None, Some(_)) => Err(NoDrain::NoTlsAcceptor(endpoint)),
        (None, None) => Err(NoDrain::NoPlainAcceptor(endpoint)),
    }
}

/// The broker's acceptor of this kind as `amqp[s]://host:port` (read once per endpoint and
/// kind); None when it has none.
async fn acceptor(
    state: &ClusterState,
    m: &BrokerManagement,
    endpoint: &str,
    tls: bool,
) -> Result<Option<String>, NoDrain> {
    let cache_key = (endpoint.to_string(), tls);
    if let Some(u) = state.amqp.lock().await.get(&cache_key) {
        return Ok(Some(u.clone()));
    }
    let (host, port) = match m.amqp_acceptor(tls).await {
        Ok(Some(found)) => found,
        Ok(None) => return Ok(None),
        Err(source) => {
            let endpoint = endpoint.to_string();
            return Err(NoDrain::AcceptorsUnreadable { endpoint, source });
        }
    };
    let jolokia_host = reqwest::Url::parse(endpoint)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "localhost".into());
    let host = if host.is_empty() || host == "0.0.0.0" || host == "::" || host == "[::]" {
        jolokia_host
    } else {
        host
    };
    let scheme = if tls { "amqps" } else { "amqp" };
    let url = format!("{scheme}://{host}:{port}");
    state.amqp.lock().await.insert(cache_key, url.clone());
    Ok(Some(url))
}
