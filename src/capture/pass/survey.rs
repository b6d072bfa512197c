//! What a pass starts from (ADR-0062 D6, issue 24): the cluster's access and a topology to judge
//! from, the open tap records, how each subscription is armed (issue 25 item 5), the taps
//! wanted, and which subscriptions on these brokers are another cluster's (ADR-0062 D7).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use super::{ClusterState, JudgedSub, PassError};
use crate::api::ArtemisCluster;
use crate::api::capture::{ArtemisCaptureSubscription, CaptureArming, CaptureMode, CapturePreview};
use crate::api::capture_names::TapName;
use crate::capture::arming::{self, Arming};
use crate::capture::plan::{self, Subscription, TapSpec};
use crate::controllers::{Context, key};
use crate::topology::{self, Topology};

/// What a pass starts from: the cluster's access and a fresh topology, the open tap records,
/// how each subscription is armed, and the taps wanted (and those past a subscription's cap).
pub(super) struct Survey {
    pub(super) access: topology::ClusterAccess,
    pub(super) topology: Topology,
    /// The access and topology are the cluster runtime's (not read by this pass).
    pub(super) from_runtime: bool,
    pub(super) records: Vec<crate::store::capture::TapRecord>,
    pub(super) arms: BTreeMap<String, ArmState>,
    pub(super) desired: BTreeMap<TapName, TapSpec>,
    pub(super) past_cap: BTreeMap<String, Vec<String>>,
    /// How the drains reach the brokers (issue 44).
    pub(super) transport: crate::capture::tls::DrainTransport,
}

pub(super) async fn survey(
    ctx: &Context,
    state: &ClusterState,
    cluster: &ArtemisCluster,
    subs: &[Arc<ArtemisCaptureSubscription>],
    cluster_key: &str,
    elsewhere: &BTreeMap<String, String>,
) -> Result<Survey, PassError> {
    let instance = ctx.instance_id.as_str();
    // Finalizers first: a subscription never has a tap on a broker without one.
    for s in subs.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        crate::capture::status::set_finalizer(&ctx.client, s, true).await?;
    }
    let (access, topology, from_runtime) = cluster_view(ctx, state, cluster, subs, cluster_key).await?;
    // Sampling browses on this snapshot until the next pass.
    state.sample.lock().await.topology = Some(topology.clone());
    // The reading commands label a tail by capture_subscription.mode: kept current here.
    for s in subs.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        let interval = (s.spec.mode == CaptureMode::Sample)
            .then(|| i32::try_from(s.spec.sample_interval_seconds).unwrap_or(i32::MAX));
        ctx.store
            .record_subscription_mode(cluster_key, &s.name_any(), s.spec.mode.as_db(), interval)
            .await?;
    }
    let records = ctx.store.open_taps(cluster_key, instance).await?;
    // Before anything new is installed: the blast radius shown, then armed (issue 25 item 5).
    let arms = arm_all(subs, &topology);
    // A subscription in mode Sample wants no tap: the sweep removes any it had (ADR-0062 D6).
    let views: Vec<Subscription> = subs
        .iter()
        .filter(|s| !crate::capture::sample::is_sampling(s))
        .map(|s| view(s, &arms, &records))
        .collect();
    let inventories: Vec<&crate::topology::inventory::NodeInventory> = topology
        .live_nodes()
        .filter_map(|n| n.inventory.as_deref())
        .collect();
    let role = cluster.spec.capture_role.clone();
    let ns = cluster.namespace().unwrap_or_default();
    let legacy = legacy_taps(instance, &records, &inventories, elsewhere);
    let naming = plan::Naming {
        instance,
        namespace: &ns,
        legacy: &legacy,
    };
    let (desired, past_cap) = plan::desired_taps(&naming, &role, &views, inventories.iter().copied());
    let transport = crate::capture::tls::DrainTransport::of(&cluster.spec, &access);
    Ok(Survey {
        transport,
        access,
        topology,
        from_runtime,
        records,
        arms,
        desired,
        past_cap,
    })
}

/// The (subscription, address) of this instance's taps named before names carried the
/// namespace — from the open records and the nodes' inventories — that keep that name: renaming
/// a live tap would drop what its ring holds. Not where another cluster on these brokers has a
/// subscription of the same name (the name would be both's): those are installed under the new
/// name, and the old one swept.
fn legacy_taps(
    instance: &str,
    records: &[crate::store::capture::TapRecord],
    inventories: &[&crate::topology::inventory::NodeInventory],
    elsewhere: &BTreeMap<String, String>,
) -> BTreeSet<(String, String)> {
    let recorded = records
        .iter()
        .filter_map(|r| TapName::parse(instance, &r.capture_queue).map(|(t, _)| t));
    let on_brokers = inventories
        .iter()
        .flat_map(|inv| plan::our_objects(instance, inv).into_keys());
    recorded
        .chain(on_brokers)
        .filter(|t| t.is_legacy() && !elsewhere.contains_key(&t.subscription))
        .map(|t| (t.subscription, t.address))
        .collect()
}

/// The cluster's access and a topology to judge from (issue 24: capture reads the cluster's
/// snapshot instead of polling again). Where this process runs the cluster's controller and the
/// Secrets are as its runtime read them (the watch says so, and `ensure_credentials` re-reads
/// them before any write), its latest topology — polled inline if older than a pass interval,
/// or than this cluster's last capture write (a pass never judges from a snapshot that
/// predates its own installs), or whenever the subscriptions changed since the last pass (a new
/// pattern is previewed and judged on what the brokers hold now). Otherwise (a replica that
/// serves capture without leading, a runtime of another generation, changed Secrets) this pass
/// reads both itself.
async fn cluster_view(
    ctx: &Context,
    state: &ClusterState,
    cluster: &ArtemisCluster,
    subs: &[Arc<ArtemisCaptureSubscription>],
    cluster_key: &str,
) -> Result<(topology::ClusterAccess, Topology, bool), PassError> {
    let ns = cluster.namespace().unwrap_or_default();
    let usable = ctx.clusters.get(cluster_key).filter(|rt| {
        rt.generation == cluster.metadata.generation
            && crate::controllers::runtime::access_is_current(ctx, &ns, rt)
    });
    let mut judged: Vec<JudgedSub> = subs
        .iter()
        .map(|s| JudgedSub {
            name: s.name_any(),
            generation: s.metadata.generation,
            deleting: s.metadata.deletion_timestamp.is_some(),
            annotations: s.annotations().clone(),
        })
        .collect();
    judged.sort();
    let same_subs = *state.judged_subs.lock().await == judged;
    *state.judged_subs.lock().await = judged;
    if usable.is_some() {
        let wrote = state.wrote_at.lock().await.map(|t| t.elapsed());
        let mut max_age = wrote.map_or(ctx.capture_pass_interval, |w| w.min(ctx.capture_pass_interval));
        if !same_subs {
            max_age = Duration::ZERO;
        }
        let current =
            crate::controllers::runtime::current_topology(ctx, &ns, &cluster.name_any(), Some(max_age)).await;
        if let Ok((rt, t)) = current {
            return Ok((rt.access.clone(), (*t).clone(), true));
        }
    }
    let access = crate::controllers::cluster::resolve_access(&ctx.client, &ns, &cluster.spec, &ctx.broker)
        .await
        .map_err(PassError::Access)?;
    let topology = topology::poll(&access, &state.memory).await;
    Ok((access, topology, false))
}

fn view(
    s: &ArtemisCaptureSubscription,
    arms: &BTreeMap<String, ArmState>,
    records: &[crate::store::capture::TapRecord],
) -> Subscription {
    let name = s.name_any();
    Subscription {
        armed: arms.get(&name).is_some_and(|a| a.armed().is_some()),
        max_taps: s.spec.max_taps,
        installed: records
            .iter()
            .filter(|r| r.subscription == name)
            .map(|r| r.source_address.clone())
            .collect(),
        name,
        pattern: s.spec.queues.clone(),
        filter: s.spec.filter.clone().filter(|f| !f.trim().is_empty()),
        ring_size: s.spec.ring_size,
        expiry_delay_ms: s.spec.expiry_delay_seconds.saturating_mul(1000),
        max_buffer_bytes: s.spec.max_buffer_bytes,
        deleting: s.metadata.deletion_timestamp.is_some(),
    }
}

/// A subscription's blast radius now and whether it is armed (issue 25 item 5).
pub struct ArmState {
    pub preview: CapturePreview,
    pub arming: Arming,
}

impl ArmState {
    pub fn armed(&self) -> Option<&CaptureArming> {
        match &self.arming {
            Arming::Armed(a) => Some(a),
            Arming::Not { .. } => None,
        }
    }
}

pub(super) fn without_review(s: &ArtemisCaptureSubscription) -> bool {
    s.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::CONFIRM_WITHOUT_REVIEW_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// The preview and the arming verdict of every capturing subscription, on the live nodes'
/// inventories of this pass.
fn arm_all(subs: &[Arc<ArtemisCaptureSubscription>], topology: &Topology) -> BTreeMap<String, ArmState> {
    let live: BTreeMap<String, &crate::topology::inventory::NodeInventory> = topology
        .live_nodes()
        .filter_map(|n| n.inventory.as_deref().map(|i| (n.node_id.clone(), i)))
        .collect();
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    subs.iter()
        .filter(|s| !crate::capture::sample::is_sampling(s) && s.metadata.deletion_timestamp.is_none())
        .map(|s| {
            let (capturable, never) = plan::matched_addresses(&s.spec.queues, live.values().copied());
            let resolved = arming::Resolved {
                queues: &s.spec.queues,
                max_taps: s.spec.max_taps,
                capturable: &capturable,
                never: &never,
                live: &live,
            };
            let preview = arming::preview(&resolved, s.metadata.generation);
            let old = s.status.as_ref();
            let request = arming::Request {
                queues: &s.spec.queues,
                confirm: s.spec.confirm.as_deref(),
                generation: s.metadata.generation,
                without_review: without_review(s),
                armed: old.and_then(|o| o.armed.as_ref()),
                shown: old.and_then(|o| o.preview.as_ref()),
            };
            let arming = arming::decide(&request, &preview, &at);
            (s.name_any(), ArmState { preview, arming })
        })
        .collect()
}

/// ADR-0062 D7 across the ArtemisClusters of one installation: a tap's name carries the
/// instance and the subscription's name, not its cluster, so a tap under our prefix whose
/// subscription is not one of this cluster's may belong to another ArtemisCluster on the same
/// brokers — that cluster's pass sweeps it, never this one's. Returns subscription name → the
/// other claimant (`namespace/name on cluster namespace/name`). Brokers count as shared when the
/// two specs share an endpoint URL or either discovers pods, or when both topologies are known
/// and share a node ID; when that cannot be told, they count as shared.
pub fn claimed_elsewhere(
    ctx: &Context,
    cluster_key: &str,
    cluster: &ArtemisCluster,
    all_subs: &[Arc<ArtemisCaptureSubscription>],
    all_clusters: &BTreeMap<String, Arc<ArtemisCluster>>,
) -> BTreeMap<String, String> {
    let urls: BTreeSet<&str> = cluster.spec.brokers.iter().map(|b| b.url.as_str()).collect();
    let shares = |other_key: &str, other: &ArtemisCluster| {
        let same_url = other.spec.brokers.iter().any(|b| urls.contains(b.url.as_str()));
        let discovered = cluster.spec.discovery.is_some() || other.spec.discovery.is_some();
        same_url
            || discovered
            || crate::controllers::pipeline::same_brokers(ctx, cluster_key, other_key).unwrap_or(true)
    };
    all_subs
        .iter()
        .filter_map(|s| {
            let ns = s.namespace().unwrap_or_default();
            let other_key = key(&ns, &s.spec.cluster_ref.name);
            let other = all_clusters.get(&other_key)?;
            (other_key != cluster_key && shares(&other_key, other)).then(|| {
                (
                    s.name_any(),
                    format!("{ns}/{} on cluster {other_key}", s.name_any()),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod naming_tests {
    use super::*;
    use crate::store::capture::TapRecord;
    use crate::topology::inventory::{NodeInventory, QueueInfo};

    fn record(tap: &TapName) -> TapRecord {
        TapRecord {
            subscription: tap.subscription.clone(),
            node: "n1".into(),
            source_address: tap.address.clone(),
            capture_queue: tap.capture_queue(),
            installed_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn taps_named_before_namespaces_keep_their_name_unless_another_cluster_shares_it() {
        let recorded = TapName::legacy("i1", "orders", "audit");
        let on_broker = TapName::legacy("i1", "payments", "audit");
        let renamed = TapName::new("i1", "ns", "refunds", "audit");
        let mut inv = NodeInventory::default();
        for t in [&on_broker, &renamed] {
            let name = t.capture_queue();
            inv.queues.insert(
                name.clone(),
                QueueInfo {
                    name,
                    ..Default::default()
                },
            );
        }
        let records = [record(&recorded), record(&renamed)];
        let kept = legacy_taps("i1", &records, &[&inv], &BTreeMap::new());
        let want: BTreeSet<(String, String)> = [("audit", "orders"), ("audit", "payments")]
            .into_iter()
            .map(|(s, a)| (s.to_string(), a.to_string()))
            .collect();
        assert_eq!(kept, want);
        let elsewhere = BTreeMap::from([("audit".to_string(), "other/audit on cluster other/c".to_string())]);
        assert!(legacy_taps("i1", &records, &[&inv], &elsewhere).is_empty());
        let legacy = kept;
        let naming = plan::Naming {
            instance: "i1",
            namespace: "ns",
            legacy: &legacy,
        };
        assert_eq!(naming.tap("orders", "audit"), recorded);
        assert_eq!(naming.tap("refunds", "audit"), renamed);
        assert_eq!(
            naming.tap("orders", "other"),
            TapName::new("i1", "ns", "orders", "other")
        );
    }
}
