//! Reconcile requests from outside an object's own watch, and the stream a controller reads
//! them from.

use kube::Resource;
use kube::runtime::reflector;

use crate::api::{ArtemisCluster, ArtemisDivert, ArtemisQueue};

/// Reconcile requests from outside an object's own watch: after each poll the cluster
/// controller names the objects whose nodes or broker objects changed (kube-runtime's
/// `reconcile_on`), so no object polls on a timer.
#[derive(Clone)]
pub struct Triggers {
    /// A cluster whose access changed (its Secret, seen by a command or by the Secret watch).
    pub clusters: tokio::sync::broadcast::Sender<reflector::ObjectRef<ArtemisCluster>>,
    pub queues: tokio::sync::broadcast::Sender<reflector::ObjectRef<ArtemisQueue>>,
    pub diverts: tokio::sync::broadcast::Sender<reflector::ObjectRef<ArtemisDivert>>,
}

impl Default for Triggers {
    fn default() -> Self {
        // Enough for every object of a large installation at once; a receiver that lags is
        // told so and triggers everything of its kind (see `trigger_stream`).
        Triggers {
            clusters: tokio::sync::broadcast::channel(1 << 10).0,
            queues: tokio::sync::broadcast::channel(1 << 16).0,
            diverts: tokio::sync::broadcast::channel(1 << 16).0,
        }
    }
}

/// The stream of trigger requests one controller (of one namespace, or of all) acts on.
pub fn trigger_stream<K>(
    tx: &tokio::sync::broadcast::Sender<reflector::ObjectRef<K>>,
    namespace: Option<String>,
) -> futures::stream::BoxStream<'static, reflector::ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + 'static,
{
    use futures::StreamExt;
    use tokio::sync::broadcast::error::RecvError;
    let rx = tx.subscribe();
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(r) => return Some((r, rx)),
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        kind = K::kind(&()).as_ref(),
                        "trigger queue overflowed; the slow resync covers the missed objects"
                    );
                }
                Err(RecvError::Closed) => return None,
            }
        }
    })
    .filter(move |r| futures::future::ready(namespace.is_none() || r.namespace == namespace))
    .boxed()
}
