//! The census `/metrics` exports (`telemetry::census`), read from the watch caches at scrape
//! time: what every object's status says now, with no state of its own to drift. Connection
//! closes are one-shot commands (not cached) and are not counted here; their commands are
//! (`artemis_studio_commands_total`).

use kube::ResourceExt;

use crate::api::Condition;
use crate::api::cluster::ArtemisCluster;
use crate::telemetry::census::{
    CensusSource, ConditionLabels, Counts, EndpointLabels, NodeLabels, ObjectLabels, TapLabels,
};

use super::conditions::{DEGRADED, DELETE_BLOCKED, NOT_CONVERGING, READY, STALLED};

/// The conditions that are abnormal when True (kstatus' "abnormal-true"), counted by reason.
const FLAGS: [&str; 4] = [STALLED, NOT_CONVERGING, DELETE_BLOCKED, DEGRADED];
use super::{Caches, key};

/// Counts from this process's caches.
pub struct FromCaches(pub Caches);

impl CensusSource for FromCaches {
    fn count(&self) -> Counts {
        let mut c = Counts::default();
        let caches = &self.0;
        for q in caches.queues.state() {
            let conds = q.status.as_ref().map(|s| s.conditions.as_slice());
            count_object(
                &mut c,
                "ArtemisQueue",
                &cluster_of(&*q, &q.spec.cluster_ref.name),
                conds,
            );
        }
        for d in caches.diverts.state() {
            let conds = d.status.as_ref().map(|s| s.conditions.as_slice());
            count_object(
                &mut c,
                "ArtemisDivert",
                &cluster_of(&*d, &d.spec.cluster_ref.name),
                conds,
            );
        }
        for s in caches.subscriptions.state() {
            let cluster = cluster_of(&*s, &s.spec.cluster_ref.name);
            let status = s.status.as_ref();
            let conds = status.map(|s| s.conditions.as_slice());
            count_object(&mut c, "ArtemisCaptureSubscription", &cluster, conds);
            if let Some(status) = status {
                count_taps(
                    &mut c,
                    &cluster,
                    &key(&s.namespace().unwrap_or_default(), &s.name_any()),
                    status.tap_counts,
                );
            }
        }
        for cl in caches.clusters.state() {
            count_cluster(&mut c, &cl);
        }
        c
    }
}

fn cluster_of<K: ResourceExt>(o: &K, cluster: &str) -> String {
    key(&o.namespace().unwrap_or_default(), cluster)
}

fn count_cluster(c: &mut Counts, cl: &ArtemisCluster) {
    let cluster = key(&cl.namespace().unwrap_or_default(), &cl.name_any());
    let status = cl.status.as_ref();
    count_object(
        c,
        "ArtemisCluster",
        &cluster,
        status.map(|s| s.conditions.as_slice()),
    );
    if let Some(s) = status {
        let live = i64::from(s.live_nodes);
        let not_live = i64::from(s.total_nodes.saturating_sub(s.live_nodes));
        for (state, n) in [("live", live), ("not_live", not_live)] {
            let labels = NodeLabels {
                cluster: cluster.clone(),
                state: state.into(),
            };
            *c.nodes.entry(labels).or_default() += n;
        }
        for n in &s.nodes {
            let active = n.active_endpoint.iter().map(|e| (e, "active"));
            for (url, role) in active.chain(n.standby_endpoints.iter().map(|e| (e, "standby"))) {
                let labels = EndpointLabels {
                    cluster: cluster.clone(),
                    node: crate::broker::budget::node_key(url),
                    role: role.into(),
                };
                c.endpoints.insert(labels, 1);
            }
        }
    }
}

fn count_taps(c: &mut Counts, cluster: &str, subscription: &str, t: crate::api::capture::TapCounts) {
    let by_state = [
        ("healthy", t.healthy),
        ("degraded", t.degraded),
        ("pending", t.pending),
        ("refused", t.refused),
    ];
    for (state, n) in by_state {
        let labels = TapLabels {
            cluster: cluster.into(),
            subscription: subscription.into(),
            state: state.into(),
        };
        *c.taps.entry(labels).or_default() += i64::try_from(n).unwrap_or(i64::MAX);
    }
}

/// One object: its Ready condition (or none yet), and each abnormal-true condition it has.
fn count_object(c: &mut Counts, kind: &str, cluster: &str, conditions: Option<&[Condition]>) {
    let conditions = conditions.unwrap_or_default();
    let (ready, reason) = match conditions.iter().find(|x| x.type_ == READY) {
        Some(r) => (r.status.clone(), r.reason.clone()),
        None => ("Unknown".to_string(), "NoStatusYet".to_string()),
    };
    let labels = ObjectLabels {
        kind: kind.into(),
        cluster: cluster.into(),
        ready,
        reason,
    };
    *c.objects.entry(labels).or_default() += 1;
    let flagged = conditions
        .iter()
        .filter(|x| x.status == "True" && FLAGS.contains(&x.type_.as_str()));
    for x in flagged {
        let labels = ConditionLabels {
            kind: kind.into(),
            cluster: cluster.into(),
            condition: x.type_.clone(),
            reason: x.reason.clone(),
        };
        *c.flagged.entry(labels).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        }
    }

    #[test]
    fn objects_count_by_ready_reason_and_by_each_abnormal_condition_that_is_true() {
        let mut c = Counts::default();
        let stuck = [
            condition(READY, "False", "NotConverging"),
            condition(STALLED, "True", "NotConverging"),
            condition(NOT_CONVERGING, "True", "BrokerDidNotApply"),
            condition(DEGRADED, "False", "AllNodesApplied"),
        ];
        count_object(&mut c, "ArtemisQueue", "ns/c", Some(&stuck));
        count_object(&mut c, "ArtemisQueue", "ns/c", Some(&stuck));
        count_object(&mut c, "ArtemisQueue", "ns/c", None);
        let labels = |ready: &str, reason: &str| ObjectLabels {
            kind: "ArtemisQueue".into(),
            cluster: "ns/c".into(),
            ready: ready.into(),
            reason: reason.into(),
        };
        assert_eq!(c.objects.get(&labels("False", "NotConverging")), Some(&2));
        assert_eq!(c.objects.get(&labels("Unknown", "NoStatusYet")), Some(&1));
        let flagged = |condition: &str, reason: &str| ConditionLabels {
            kind: "ArtemisQueue".into(),
            cluster: "ns/c".into(),
            condition: condition.into(),
            reason: reason.into(),
        };
        assert_eq!(c.flagged.get(&flagged(STALLED, "NotConverging")), Some(&2));
        assert_eq!(
            c.flagged.get(&flagged(NOT_CONVERGING, "BrokerDidNotApply")),
            Some(&2)
        );
        assert_eq!(c.flagged.len(), 2, "Ready is counted once, not as a flag");
    }

    fn cluster_json(status: serde_json::Value) -> ArtemisCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"brokers": [{"url": "http://b1/jolokia"}], "credentials": {"secretName": "s"}},
            "status": status,
        }))
        .unwrap_or_else(|e| panic!("cluster json: {e}"))
    }

    /// The census a dashboard reads: per cluster, logical nodes live and not live, every
    /// endpoint by role (credentials never in a label), and each subscription's taps by state.
    #[test]
    fn clusters_count_their_nodes_and_endpoints_and_subscriptions_their_taps() {
        let mut c = Counts::default();
        let cl = cluster_json(serde_json::json!({
            "liveNodes": 2, "totalNodes": 3,
            "nodes": [
                {"nodeId": "n1", "activeEndpoint": "http://u:p@b1/jolokia", "standbyEndpoints": ["http://b1b/jolokia"], "role": "primary", "live": true},
                {"nodeId": "n2", "activeEndpoint": "http://b2/jolokia", "role": "primary", "live": true},
            ],
        }));
        count_cluster(&mut c, &cl);
        count_cluster(&mut c, &cl);
        let nodes = |state: &str| {
            c.nodes.get(&NodeLabels {
                cluster: "ns/c".into(),
                state: state.into(),
            })
        };
        assert_eq!((nodes("live"), nodes("not_live")), (Some(&4), Some(&2)));
        let endpoint = |node: &str, role: &str| {
            c.endpoints.get(&EndpointLabels {
                cluster: "ns/c".into(),
                node: node.into(),
                role: role.into(),
            })
        };
        assert_eq!(endpoint("http://b1/jolokia", "active"), Some(&1));
        assert_eq!(endpoint("http://b1b/jolokia", "standby"), Some(&1));
        assert_eq!(endpoint("http://b2/jolokia", "active"), Some(&1));
        assert_eq!(c.endpoints.len(), 3);

        let taps = crate::api::capture::TapCounts {
            healthy: 3,
            degraded: 1,
            pending: 0,
            refused: 2,
        };
        count_taps(&mut c, "ns/c", "ns/sub", taps);
        count_taps(&mut c, "ns/c", "ns/sub", taps);
        let tap = |state: &str| {
            c.taps.get(&TapLabels {
                cluster: "ns/c".into(),
                subscription: "ns/sub".into(),
                state: state.into(),
            })
        };
        assert_eq!(
            [tap("healthy"), tap("degraded"), tap("pending"), tap("refused")],
            [Some(&6), Some(&2), Some(&0), Some(&4)]
        );
    }

    /// The census is read from the watch caches at scrape time: every cached object of every
    /// kind is counted, under the cluster it names (its own namespace / spec.clusterRef).
    #[test]
    fn the_census_counts_every_cached_object_under_its_cluster() {
        use kube::runtime::watcher::Event;
        let (clusters, mut w_clusters) = super::super::Cache::new(1);
        let (queues, mut w_queues) = super::super::Cache::new(1);
        let (diverts, _) = super::super::Cache::new(1);
        let (subscriptions, _) = super::super::Cache::new(1);
        let (secrets, _) = super::super::Cache::new(1);
        w_clusters[0].apply_watcher_event(&Event::Apply(cluster_json(
            serde_json::json!({"liveNodes": 1, "totalNodes": 1}),
        )));
        for name in ["q1", "q2"] {
            let q: crate::api::queue::ArtemisQueue = serde_json::from_value(serde_json::json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
                "metadata": {"name": name, "namespace": "team"},
                "spec": {"clusterRef": {"name": "c"}},
            }))
            .unwrap_or_else(|e| panic!("queue json: {e}"));
            w_queues[0].apply_watcher_event(&Event::Apply(q));
        }
        let census = FromCaches(Caches {
            clusters,
            queues,
            diverts,
            subscriptions,
            secrets,
        });
        let c = census.count();
        let object = |kind: &str, cluster: &str| {
            c.objects.get(&ObjectLabels {
                kind: kind.into(),
                cluster: cluster.into(),
                ready: "Unknown".into(),
                reason: "NoStatusYet".into(),
            })
        };
        assert_eq!(object("ArtemisQueue", "team/c"), Some(&2));
        assert_eq!(object("ArtemisCluster", "ns/c"), Some(&1));
        assert_eq!(
            c.nodes.get(&NodeLabels {
                cluster: "ns/c".into(),
                state: "live".into(),
            }),
            Some(&1)
        );
    }
}
