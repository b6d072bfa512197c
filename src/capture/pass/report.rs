//! What a pass writes to each subscription's status (the capture side of the report stage): every
//! tap's state on every node, the counts, the arming, and the conditions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::ResourceExt;

use super::judge::Judged;
use super::survey::{ArmState, Survey};
use super::{ClusterState, Found, PassError};
use crate::api::capture::{
    ArtemisCaptureSubscription, ArtemisCaptureSubscriptionStatus, CaptureMode, TapState, TapStatus,
};
use crate::api::capture_names::TapName;
use crate::capture::arming::{self, Arming};
use crate::capture::plan::TapSpec;
use crate::capture::status::{ARMED, same_status, set_tap_conditions, set_taps};
use crate::controllers::{Context, conditions};
use crate::store::capture::TapKey;
use crate::store::captured::TapTotals;
use crate::topology::Topology;

/// Issue 42: status is true while a pass runs. The taps it is about to install say so before
/// the installs (a tap the last pass found HEALTHY may have lost its ring since: a failover, a
/// restart), not only once the whole pass ends. Not written: logged, and the pass goes on.
pub(super) async fn write_before_installs(
    ctx: &Context,
    state: &ClusterState,
    cluster_key: &str,
    subs: &[Arc<ArtemisCaptureSubscription>],
    (seen, judged): (&Survey, &Judged),
    held: &BTreeSet<String>,
) {
    if judged.installs.is_empty() {
        return;
    }
    let interim = installing(judged);
    let written = write_statuses(ctx, state, cluster_key, subs, seen, &interim, held).await;
    if let Err(e) = written {
        tracing::warn!(cluster = %cluster_key, error = %e, "capture: the status before this pass's installs not written");
    }
}

/// What status says while this pass installs: every tap as judged, each one about to be
/// installed PENDING.
fn installing(judged: &Judged) -> BTreeMap<(TapName, String), Found> {
    let mut found = judged.found.clone();
    for (tap, nodes) in &judged.installs {
        for node in nodes.keys() {
            let pending = Found {
                state: TapState::Pending,
                refusal: None,
                message: "not installed on this node: the pass running now installs it".into(),
            };
            found.insert((tap.clone(), node.clone()), pending);
        }
    }
    found
}

/// Status and finalizers, from what is true after the writes.
pub(super) async fn write_statuses(
    ctx: &Context,
    state: &ClusterState,
    cluster_key: &str,
    subs: &[Arc<ArtemisCaptureSubscription>],
    seen: &Survey,
    found: &BTreeMap<(TapName, String), Found>,
    held: &BTreeSet<String>,
) -> Result<(), PassError> {
    let records = ctx.store.open_taps(cluster_key, &ctx.instance_id).await?;
    let totals = ctx.store.capture_totals(cluster_key).await?;
    let marks = ctx.store.sample_marks(cluster_key).await?;
    for s in subs {
        if crate::capture::sample::is_sampling(s) {
            let sampled = crate::capture::sample::Sampled {
                marks: &marks,
                totals: &totals,
                held: held.contains(&s.name_any()),
            };
            crate::capture::sample::write_status(ctx, &state.sample, s, &seen.topology, &sampled).await?;
            continue;
        }
        let stored = Stored {
            records: &records,
            totals: &totals,
            marks: &marks,
            arms: &seen.arms,
            past_cap: &seen.past_cap,
            held,
            cluster_key,
        };
        write_status(ctx, s, &seen.topology, &seen.desired, found, &stored).await?;
    }
    Ok(())
}

/// What Postgres holds of a cluster's taps after the pass.
struct Stored<'a> {
    records: &'a [crate::store::capture::TapRecord],
    totals: &'a [TapTotals],
    /// What an earlier mode Sample stored stays counted.
    marks: &'a [crate::store::sampled::SampleMark],
    arms: &'a BTreeMap<String, ArmState>,
    /// Per subscription: the addresses refused past its spec.maxTaps.
    past_cap: &'a BTreeMap<String, Vec<String>>,
    /// The paused subscriptions whose installs or removals the pass held.
    held: &'a BTreeSet<String>,
    cluster_key: &'a str,
}

/// Status of one subscription after the pass (written only when it changed), and its
/// finalizer released once no tap of it remains.
async fn write_status(
    ctx: &Context,
    s: &Arc<ArtemisCaptureSubscription>,
    topology: &Topology,
    desired: &BTreeMap<TapName, TapSpec>,
    found: &BTreeMap<(TapName, String), Found>,
    stored: &Stored<'_>,
) -> Result<(), PassError> {
    let (records, totals) = (stored.records, stored.totals);
    let name = s.name_any();
    let generation = s.metadata.generation;
    let old = s.status.clone().unwrap_or_default();
    let mut status = ArtemisCaptureSubscriptionStatus {
        observed_generation: generation,
        conditions: old.conditions.clone(),
        instance_id: Some(ctx.instance_id.clone()),
        mode: Some(CaptureMode::Capture),
        sampled: stored
            .marks
            .iter()
            .filter(|m| m.subscription == name)
            .map(|m| m.sampled.max(0) as u64)
            .sum(),
        ..Default::default()
    };
    // The claim of mode Sample does not describe a capturing subscription.
    status
        .conditions
        .retain(|c| c.type_ != crate::capture::sample::SAMPLING);
    let mine: Vec<&TapName> = desired.keys().filter(|t| t.subscription == name).collect();
    let addresses: Vec<String> = mine.iter().map(|t| t.address.clone()).collect();
    let mut remaining: Vec<&crate::store::capture::TapRecord> =
        records.iter().filter(|r| r.subscription == name).collect();

    if s.metadata.deletion_timestamp.is_some() {
        remaining = release_departed(ctx, stored.cluster_key, s, remaining, topology).await?;
        if remaining.is_empty() {
            crate::capture::status::set_finalizer(&ctx.client, s, false).await?;
            return Ok(());
        }
        being_removed(&mut status, &remaining, topology, addresses, generation);
    } else {
        let taps = tap_statuses(&name, &mine, topology, found, &remaining, totals);
        set_taps(&mut status, taps, addresses);
        set_tap_conditions(&mut status, &s.spec.queues, mine.is_empty(), generation);
        if let Some(arm) = stored.arms.get(&name) {
            set_arming(&mut status, s, arm, stored.past_cap.get(&name), generation);
        }
    }
    // Over every tap this subscription ever had, not only today's addresses.
    let mine_totals = totals.iter().filter(|t| t.subscription == name);
    status.captured = mine_totals.clone().map(|t| t.captured.max(0) as u64).sum();
    status.dropped_estimate = mine_totals.map(|t| t.lost.max(0) as u64).sum();
    let waits = "no tap is installed, changed or removed (its drains go on) until the annotation goes";
    crate::capture::status::set_paused(&mut status, s, stored.held.contains(&name), waits);
    conditions::kstatus(&mut status.conditions, &[], generation);
    stalled_past_cap(&mut status.conditions, generation);
    let unchanged = same_status(&old, &status);
    if !unchanged {
        crate::controllers::report::patch_whole_status(&ctx.client, s.as_ref(), &status).await?;
    }
    Ok(())
}

/// The records of taps on nodes that left the cluster: every endpoint answered this poll, and
/// none as that node (its data was replaced, or it was taken out of `spec.brokers`). While an
/// endpoint does not answer, it may be that node: none.
fn departed<'r>(
    remaining: Vec<&'r crate::store::capture::TapRecord>,
    topology: &Topology,
) -> (
    Vec<&'r crate::store::capture::TapRecord>,
    Vec<&'r crate::store::capture::TapRecord>,
) {
    if !topology.unreachable.is_empty() {
        return (vec![], remaining);
    }
    remaining
        .into_iter()
        .partition(|r| !topology.nodes.iter().any(|n| n.node_id == r.node))
}

/// Issue 42: a deleted subscription never stays `Deleting` for a node that left the cluster.
/// Its taps there went with the node's data, or sit on a broker this cluster no longer reaches:
/// their records are closed (no broker write, so no audit row; should the node come back here,
/// its taps are this instance's orphans and the sweep removes them), and one Event says so.
/// Returns the records still to remove.
async fn release_departed<'r>(
    ctx: &Context,
    cluster_key: &str,
    s: &ArtemisCaptureSubscription,
    remaining: Vec<&'r crate::store::capture::TapRecord>,
    topology: &Topology,
) -> Result<Vec<&'r crate::store::capture::TapRecord>, PassError> {
    let (gone, here) = departed(remaining, topology);
    if gone.is_empty() {
        return Ok(here);
    }
    let name = s.name_any();
    for r in &gone {
        let key = TapKey {
            cluster: cluster_key,
            subscription: &name,
            source_address: &r.source_address,
            node: &r.node,
            instance_id: &ctx.instance_id,
        };
        ctx.store.close_tap(&key, DEPARTED, None).await?;
    }
    let nodes: BTreeSet<&str> = gone.iter().map(|r| r.node.as_str()).collect();
    let note = format!(
        "{} tap(s) on node(s) {} released: {DEPARTED}",
        gone.len(),
        nodes.into_iter().collect::<Vec<_>>().join(", ")
    );
    ctx.event(s, false, "TapsReleased", "capture.remove", note);
    Ok(here)
}

/// Why a deleted subscription's tap on a node that left the cluster is released.
const DEPARTED: &str = "its node is not in the cluster any more (every endpoint answers as another node): the tap went with the node's data or stays on a broker this cluster no longer reaches; if that node comes back here, the sweep removes it as an orphan";

/// A subscription being deleted: its open records, each a tap the pass still has to remove,
/// and why it is still there — its node not live now, or not in the cluster at all (a broker
/// whose data was replaced answers at the endpoint as another node: the tap went with its
/// journal, and only a person can say that node is gone for good).
fn being_removed(
    status: &mut ArtemisCaptureSubscriptionStatus,
    remaining: &[&crate::store::capture::TapRecord],
    topology: &Topology,
    addresses: Vec<String>,
    generation: Option<i64>,
) {
    let why = |node: &str| match topology.nodes.iter().find(|n| n.node_id == node) {
        Some(n) if n.is_live() => "its node answers; the removal failed this pass and is retried",
        Some(_) => "its node is not live now; removed when it is back",
        None => {
            "its node is not in this cluster now (not found at any endpoint); released once every endpoint answers as another node"
        }
    };
    let taps = remaining
        .iter()
        .map(|r| TapStatus {
            address: r.source_address.clone(),
            node: r.node.clone(),
            state: TapState::Pending,
            capture_queue: Some(r.capture_queue.clone()),
            message: Some(format!("being removed: {}", why(&r.node))),
            coverage_start: Some(r.installed_at.to_rfc3339()),
            ..Default::default()
        })
        .collect();
    let gone: BTreeSet<&str> = remaining
        .iter()
        .map(|r| r.node.as_str())
        .filter(|n| !topology.nodes.iter().any(|x| x.node_id == *n))
        .collect();
    let unknown = if gone.is_empty() {
        String::new()
    } else {
        format!(
            "; node(s) {} are not in this cluster now, and an endpoint does not answer (it may be one of them): their taps are released once every endpoint answers as another node",
            gone.into_iter().collect::<Vec<_>>().join(", ")
        )
    };
    set_taps(status, taps, addresses);
    conditions::set(
        &mut status.conditions,
        conditions::READY,
        false,
        "Deleting",
        format!(
            "being deleted: the capture pass removes its taps (ADR-0062 D6); {} remain (taps[] says why each){unknown}; the finalizer is released when none remains",
            remaining.len()
        ),
        generation,
    );
}

/// One status entry per tap of subscription `name` per node: what the pass found, where its
/// coverage starts, what it stored and lost.
fn tap_statuses(
    name: &str,
    mine: &[&TapName],
    topology: &Topology,
    found: &BTreeMap<(TapName, String), Found>,
    remaining: &[&crate::store::capture::TapRecord],
    totals: &[TapTotals],
) -> Vec<TapStatus> {
    let mut out = vec![];
    for tap in mine {
        for node in &topology.nodes {
            let f = found.get(&((*tap).clone(), node.node_id.clone()));
            let coverage = remaining
                .iter()
                .find(|r| r.node == node.node_id && r.source_address == tap.address)
                .map(|r| r.installed_at.to_rfc3339());
            let t = totals.iter().find(|t| {
                t.subscription == name && t.node == node.node_id && t.source_address == tap.address
            });
            out.push(TapStatus {
                address: tap.address.clone(),
                node: node.node_id.clone(),
                state: f.map(|f| f.state).unwrap_or_default(),
                refusal: f.and_then(|f| f.refusal),
                message: f.map(|f| f.message.clone()),
                capture_queue: Some(tap.capture_queue()),
                coverage_start: coverage,
                captured: t.map(|t| t.captured.max(0) as u64).unwrap_or(0),
                dropped_estimate: t.map(|t| t.lost.max(0) as u64).unwrap_or(0),
            });
        }
    }
    out
}

/// The condition that says whether (and how) the subscription is armed, the preview, and — while
/// it is not armed, or past its cap — Ready=False naming the next action.
fn set_arming(
    status: &mut ArtemisCaptureSubscriptionStatus,
    s: &ArtemisCaptureSubscription,
    arm: &ArmState,
    past_cap: Option<&Vec<String>>,
    generation: Option<i64>,
) {
    status.preview = Some(arm.preview.clone());
    status.armed = arm.armed().cloned();
    let (armed, reason, message) = match &arm.arming {
        Arming::Armed(a) => (
            true,
            a.how.clone(),
            format!(
                "armed at {} ({}) for spec.queues {:?}: its taps follow the pattern, up to spec.maxTaps ({})",
                a.at, a.how, a.queues, s.spec.max_taps
            ),
        ),
        Arming::Not { why, message } => (false, why.reason().to_string(), message.clone()),
    };
    conditions::set(
        &mut status.conditions,
        ARMED,
        armed,
        &reason,
        &message,
        generation,
    );
    if !armed {
        conditions::set(
            &mut status.conditions,
            conditions::READY,
            false,
            &reason,
            message,
            generation,
        );
    } else if let Some(refused) = past_cap.filter(|r| !r.is_empty()) {
        let shown: Vec<&str> = refused.iter().take(5).map(String::as_str).collect();
        let message = format!(
            "{} more addresses match spec.queues {:?} past spec.maxTaps ({}) and are not tapped ({}{}): raise spec.maxTaps to at least {} or narrow spec.queues",
            refused.len(),
            s.spec.queues,
            s.spec.max_taps,
            shown.join(", "),
            if refused.len() > shown.len() { ", …" } else { "" },
            arm.preview.taps
        );
        conditions::set(
            &mut status.conditions,
            conditions::READY,
            false,
            arming::NotArmed::TapCapExceeded.reason(),
            message,
            generation,
        );
    }
}

/// Past the cap only a person can act (raise spec.maxTaps or narrow spec.queues): Stalled.
fn stalled_past_cap(list: &mut Vec<crate::api::Condition>, generation: Option<i64>) {
    let Some(ready) = list
        .iter()
        .find(|c| c.type_ == conditions::READY && c.reason == arming::NotArmed::TapCapExceeded.reason())
        .cloned()
    else {
        return;
    };
    conditions::set(
        list,
        conditions::STALLED,
        true,
        &ready.reason,
        ready.message,
        generation,
    );
    conditions::set(
        list,
        conditions::RECONCILING,
        false,
        "Settled",
        "nothing left to do until the spec or the brokers change",
        generation,
    );
}

#[cfg(test)]
mod deleting_tests {
    use super::being_removed;
    use crate::api::capture::ArtemisCaptureSubscriptionStatus;
    use crate::store::capture::TapRecord;
    use crate::topology::Topology;

    #[test]
    fn a_tap_on_a_node_no_longer_in_the_cluster_says_so_and_names_the_way_out() {
        let topology = Topology {
            polled_at: std::time::Instant::now(),
            polled_at_utc: chrono::Utc::now(),
            nodes: vec![],
            unreachable: vec![],
            fresh_reads: crate::topology::FreshReads::new(),
            secret_versions: Default::default(),
        };
        let record = TapRecord {
            subscription: "s".into(),
            node: "old-node".into(),
            source_address: "orders".into(),
            capture_queue: "q".into(),
            installed_at: chrono::Utc::now(),
        };
        let mut status = ArtemisCaptureSubscriptionStatus::default();
        being_removed(&mut status, &[&record], &topology, vec![], Some(2));
        let ready = crate::controllers::conditions::get(&status.conditions, "Ready").expect("Ready");
        assert!(
            ready.message.contains("old-node are not in this cluster now")
                && ready.message.contains("released once every endpoint answers"),
            "{}",
            ready.message
        );
        let tap = status.taps.first().expect("a tap");
        assert!(
            tap.message
                .as_deref()
                .is_some_and(|m| m.contains("not in this cluster")),
            "{tap:?}"
        );
    }
}

#[cfg(test)]
mod departed_tests {
    use super::departed;
    use crate::broker::BrokerError;
    use crate::store::capture::TapRecord;
    use crate::topology::{LogicalNode, Topology};

    fn record(node: &str) -> TapRecord {
        TapRecord {
            subscription: "s".into(),
            node: node.into(),
            source_address: "orders".into(),
            capture_queue: "q".into(),
            installed_at: chrono::Utc::now(),
        }
    }

    fn topology(nodes: &[&str], unreachable: &[&str]) -> Topology {
        Topology {
            polled_at: std::time::Instant::now(),
            polled_at_utc: chrono::Utc::now(),
            nodes: nodes
                .iter()
                .map(|n| LogicalNode {
                    node_id: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            unreachable: unreachable
                .iter()
                .map(|u| (u.to_string(), BrokerError::Unreachable("refused".into())))
                .collect(),
            fresh_reads: crate::topology::FreshReads::new(),
            secret_versions: Default::default(),
        }
    }

    #[test]
    fn a_node_is_departed_only_when_every_endpoint_answered_as_another() {
        let (kept, left) = (record("n1"), record("gone"));
        let (gone, here) = departed(vec![&kept, &left], &topology(&["n1", "n2"], &[]));
        assert_eq!(gone.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(), ["gone"]);
        assert_eq!(here.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(), ["n1"]);
        let (gone, here) = departed(vec![&kept, &left], &topology(&["n1"], &["http://n3"]));
        assert!(
            gone.is_empty() && here.len() == 2,
            "an endpoint away may be that node"
        );
        let (gone, _) = departed(vec![&kept], &topology(&["n1"], &[]));
        assert!(gone.is_empty(), "a node down but known is in the cluster");
    }
}
