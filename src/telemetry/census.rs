//! What the objects' statuses say, counted at scrape time (issue 26): objects by kind, cluster
//! and `Ready` reason, objects with an abnormal-true condition (`Stalled`, `NotConverging`,
//! `DeleteBlocked`, `Degraded`) by its reason, logical nodes per cluster, capture taps by state. Nothing is kept between scrapes: an object that is deleted stops counting, and a
//! status that changes is counted as it is now. The counts come from a [`CensusSource`] (the
//! controllers' watch caches); a process without one (a standby) exports the families empty.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ObjectLabels {
    pub kind: String,
    /// `namespace/name` of the ArtemisCluster the object names (its own for a cluster).
    pub cluster: String,
    /// The `Ready` condition's status: `True`, `False` or `Unknown` (no status yet).
    pub ready: String,
    /// The `Ready` condition's reason (`NoStatusYet` before the first status).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ConditionLabels {
    pub kind: String,
    pub cluster: String,
    /// The condition's type (`Stalled`, `NotConverging`, `DeleteBlocked`, `Degraded`).
    pub condition: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct NodeLabels {
    pub cluster: String,
    /// `live` or `not_live` (seen in the topology, not answering).
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct EndpointLabels {
    pub cluster: String,
    /// The endpoint URL without user info (the `node` label of the Jolokia metrics).
    pub node: String,
    /// `active` (commands go there) or `standby` (a replicating backup).
    pub role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TapLabels {
    pub cluster: String,
    /// `namespace/name` of the ArtemisCaptureSubscription.
    pub subscription: String,
    /// `healthy`, `degraded`, `pending` or `refused`.
    pub state: String,
}

/// One scrape's counts.
#[derive(Debug, Default, PartialEq)]
pub struct Counts {
    pub objects: BTreeMap<ObjectLabels, i64>,
    /// Objects with an abnormal-true condition True, by condition and reason.
    pub flagged: BTreeMap<ConditionLabels, i64>,
    pub nodes: BTreeMap<NodeLabels, i64>,
    /// 1 per endpoint of a cluster's logical nodes: which cluster a Jolokia `node` belongs to.
    pub endpoints: BTreeMap<EndpointLabels, i64>,
    pub taps: BTreeMap<TapLabels, i64>,
}

/// Where the counts come from.
pub trait CensusSource: Send + Sync {
    fn count(&self) -> Counts;
}

/// The collector the registry asks on every scrape.
#[derive(Clone, Default)]
pub struct Census {
    source: Arc<RwLock<Option<Arc<dyn CensusSource>>>>,
}

impl std::fmt::Debug for Census {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Census")
    }
}

impl Census {
    /// Count from `source` from now on (the controllers, once their caches exist).
    pub fn count_from(&self, source: Arc<dyn CensusSource>) {
        if let Ok(mut s) = self.source.write() {
            *s = Some(source);
        }
    }

    fn counts(&self) -> Counts {
        let source = self.source.read().ok().and_then(|s| s.clone());
        source.map(|s| s.count()).unwrap_or_default()
    }
}

fn encode_family<L>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    counts: BTreeMap<L, i64>,
) -> Result<(), std::fmt::Error>
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    let family = Family::<L, Gauge>::default();
    for (labels, n) in counts {
        family.get_or_create(&labels).set(n);
    }
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}

impl Collector for Census {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = self.counts();
        encode_family(
            &mut encoder,
            "objects",
            "Objects by kind, cluster and Ready condition (status and reason), as their statuses say now",
            c.objects,
        )?;
        encode_family(
            &mut encoder,
            "objects_condition_true",
            "Objects whose Stalled, NotConverging, DeleteBlocked or Degraded condition is True, by kind, cluster, condition and reason",
            c.flagged,
        )?;
        encode_family(
            &mut encoder,
            "cluster_nodes",
            "Logical broker nodes per cluster in its latest poll, live or not",
            c.nodes,
        )?;
        encode_family(
            &mut encoder,
            "cluster_endpoints",
            "1 per endpoint of a cluster's logical nodes, by role: joins the Jolokia metrics' node label to its cluster",
            c.endpoints,
        )?;
        encode_family(
            &mut encoder,
            "capture_taps",
            "Capture taps by subscription and state (every tap, listed in status or not)",
            c.taps,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl CensusSource for Fixed {
        fn count(&self) -> Counts {
            let mut c = Counts::default();
            c.objects.insert(
                ObjectLabels {
                    kind: "ArtemisQueue".into(),
                    cluster: "ns/c".into(),
                    ready: "False".into(),
                    reason: "NotConverging".into(),
                },
                2,
            );
            c
        }
    }

    #[test]
    fn a_scrape_counts_what_the_source_says_now_and_nothing_without_one() {
        let census = Census::default();
        let mut registry = prometheus_client::registry::Registry::with_prefix("artemis_studio");
        registry.register_collector(Box::new(census.clone()));
        let scrape = |r: &prometheus_client::registry::Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, r).expect("encode");
            out
        };
        assert!(!scrape(&registry).contains("artemis_studio_objects{"));
        census.count_from(Arc::new(Fixed));
        let text = scrape(&registry);
        assert!(
            text.contains(
                r#"artemis_studio_objects{kind="ArtemisQueue",cluster="ns/c",ready="False",reason="NotConverging"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE artemis_studio_capture_taps gauge"),
            "{text}"
        );
    }
}
