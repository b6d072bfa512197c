//! What a pass judges (ADR-0062 D6, ADR-0066 D2): every desired tap on every node — installed
//! (and drained or not), missing parts to install, refused, or waiting — and the orphans the
//! sweep removes; the writes the pass will make, before it makes any.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::ResourceExt;

use super::survey::Survey;
use super::{DrainView, Found, PassError};
use crate::api::RefusalKind;
use crate::api::capture::{ArtemisCaptureSubscription, TapState};
use crate::api::capture_names::TapName;
use crate::broker::BrokerManagement;
use crate::capture::drain::{DrainKey, NotDraining};
use crate::capture::plan::{self, Part, TapSpec, Verdict};
use crate::capture::status::not_drained;
use crate::controllers::Context;
use crate::store::capture::TapInstall;

/// What the pass judged of every desired tap on every node, and the writes it will make.
#[derive(Default)]
pub(super) struct Judged {
    pub(super) found: BTreeMap<(TapName, String), Found>,
    pub(super) installs: BTreeMap<TapName, BTreeMap<String, Vec<Part>>>,
    pub(super) sweeps: BTreeMap<TapName, BTreeMap<String, (bool, bool)>>,
    pub(super) installed_unrecorded: Vec<(TapName, String, Option<String>)>,
    /// (tap, node) whose capture queue exists: drained, and their loss counters read.
    pub(super) drain_targets: Vec<(TapName, String)>,
    /// (tap, node) found installed (judged again by their drain at report time).
    pub(super) installed: Vec<(TapName, String)>,
    /// (tap, node) whose capture queue this pass created.
    pub(super) fresh_queues: BTreeSet<(TapName, String)>,
}

/// Judge every desired tap on one node; collect its writes and its orphans.
pub(super) async fn judge_node(
    seen: &Survey,
    node: &crate::topology::LogicalNode,
    instance: &str,
    cluster_key: &str,
    drains: &DrainView<'_>,
    judged: &mut Judged,
) {
    let (Some(m), Some(inv)) = (&node.active, &node.inventory) else {
        not_served(&seen.desired, node, judged);
        return;
    };
    let drain_key = |n: &TapName| DrainKey {
        cluster: cluster_key.to_string(),
        node: node.node_id.clone(),
        capture_queue: n.capture_queue(),
    };
    let drain_of = |n: &TapName| drains.health.draining(&drain_key(n), drains.within);
    let (verdicts, node_problem) = verdicts_on(&seen.desired, m, inv, &drain_of).await;
    for (name, verdict) in verdicts {
        let k = (name.clone(), node.node_id.clone());
        let f = match (verdict, &node_problem) {
            (Verdict::Missing(parts), None) => {
                judged
                    .installs
                    .entry(name.clone())
                    .or_default()
                    .insert(node.node_id.clone(), parts);
                continue;
            }
            (Verdict::Installed { drained }, _) => {
                installed(seen, node, name, judged);
                judged.installed.push((name.clone(), node.node_id.clone()));
                let why = (!drained).then(|| drain_of(name).err().map(|e| e.to_string()).unwrap_or_default());
                found_installed(why)
            }
            (verdict, problem) => found_elsewise(name, verdict, problem.as_ref()),
        };
        judged.found.insert(k, f);
    }
    orphans_on(seen, node, (instance, cluster_key), inv, judged);
}

/// A node not served now: every desired tap waits for it.
fn not_served(
    desired: &BTreeMap<TapName, TapSpec>,
    node: &crate::topology::LogicalNode,
    judged: &mut Judged,
) {
    let why = node
        .not_live_reason
        .clone()
        .or_else(|| {
            node.inventory_error
                .as_ref()
                .map(|e| format!("inventory unreadable: {e}"))
        })
        .unwrap_or_else(|| "not live".into());
    for tap in desired.keys() {
        let found = Found {
            state: TapState::Pending,
            refusal: None,
            message: format!("node not served now ({why}): the tap is checked at the first pass after it is"),
        };
        judged.found.insert((tap.clone(), node.node_id.clone()), found);
    }
}

/// Each desired tap's verdict on a live node, and a problem that stops any write there.
async fn verdicts_on<'d>(
    desired: &'d BTreeMap<TapName, TapSpec>,
    m: &BrokerManagement,
    inv: &crate::topology::inventory::NodeInventory,
    drain_of: &impl Fn(&TapName) -> Result<(), NotDraining>,
) -> (BTreeMap<&'d TapName, Verdict>, Option<(RefusalKind, String)>) {
    let mut verdicts: BTreeMap<&TapName, Verdict> = desired
        .iter()
        .map(|(n, t)| (n, plan::assess(t, inv, None, drain_of(n).is_ok())))
        .collect();
    // ADR-0066 D2: a node not being drained gets the whole install checked, settings too.
    let recheck: Vec<&TapName> = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Missing(_) | Verdict::Installed { drained: false }))
        .map(|(n, _)| *n)
        .collect();
    let mut node_problem: Option<(RefusalKind, String)> = None;
    if !recheck.is_empty() {
        let queues: Vec<String> = recheck.iter().map(|n| n.capture_queue()).collect();
        match m.effective_settings(&queues).await {
            Ok(settings) => {
                for (n, s) in recheck.iter().zip(settings.iter()) {
                    if let Some(t) = desired.get(*n) {
                        verdicts.insert(*n, plan::assess(t, inv, Some(s), drain_of(n).is_ok()));
                    }
                }
            }
            Err(e) => {
                let message = format!("settings unreadable, nothing written: {e}");
                node_problem = Some((e.refusal_kind(), message));
            }
        }
    }
    if node_problem.is_none() && verdicts.values().any(|v| matches!(v, Verdict::Missing(_))) {
        node_problem = security_preflight(m).await;
    }
    (verdicts, node_problem)
}

/// A tap installed on a node: drained from now on, and recorded if no record says so.
fn installed(seen: &Survey, node: &crate::topology::LogicalNode, name: &TapName, judged: &mut Judged) {
    let recorded = seen.records.iter().any(|r| {
        r.node == node.node_id && r.subscription == name.subscription && r.source_address == name.address
    });
    if !recorded {
        let endpoint = node.active_endpoint().map(str::to_string);
        judged
            .installed_unrecorded
            .push((name.clone(), node.node_id.clone(), endpoint));
    }
    judged.drain_targets.push((name.clone(), node.node_id.clone()));
}

/// An installed tap: healthy when drained, else degraded with why not.
pub(super) fn found_installed(not_drained_because: Option<String>) -> Found {
    match not_drained_because {
        None => Found {
            state: TapState::Healthy,
            refusal: None,
            message: "being drained into Postgres".into(),
        },
        Some(why) => Found {
            state: TapState::Degraded,
            refusal: None,
            message: not_drained(&why),
        },
    }
}

/// A tap that is neither to install nor installed: waiting for its address, refused, or held
/// by the node's problem.
fn found_elsewise(name: &TapName, verdict: Verdict, problem: Option<&(RefusalKind, String)>) -> Found {
    match (verdict, problem) {
        (Verdict::Refused { kind, message }, _) => Found {
            state: TapState::Refused,
            refusal: Some(kind),
            message,
        },
        (Verdict::Missing(_), Some((kind, message))) => Found {
            state: if *kind == RefusalKind::NoSecurityAuthority {
                TapState::Refused
            } else {
                TapState::Pending
            },
            refusal: Some(*kind),
            message: message.clone(),
        },
        _ => Found {
            state: TapState::Pending,
            refusal: None,
            message: format!(
                "address {} does not exist on this node (no matching queue here): the tap is installed at the first pass after it appears",
                name.address
            ),
        },
    }
}

/// Orphans: our objects (this instance only, ADR-0062 D7), and what our records say we
/// installed here, that no subscription wants any more.
fn orphans_on(
    seen: &Survey,
    node: &crate::topology::LogicalNode,
    (instance, cluster_key): (&str, &str),
    inv: &crate::topology::inventory::NodeInventory,
    judged: &mut Judged,
) {
    // Another namespace's taps on shared brokers are its cluster's to judge.
    let ns = cluster_key.split_once('/').map_or("", |(ns, _)| ns);
    let mut ours = plan::our_objects(instance, inv);
    ours.retain(|t, _| t.is_legacy() || t.namespace == ns);
    for r in seen.records.iter().filter(|r| r.node == node.node_id) {
        let tap = TapName::parse(instance, &r.capture_queue)
            .map(|(t, _)| t)
            .unwrap_or_else(|| TapName::new(instance, ns, &r.source_address, &r.subscription));
        ours.entry(tap).or_insert((false, false));
    }
    for (tap, objects) in ours {
        if !seen.desired.contains_key(&tap) {
            judged
                .sweeps
                .entry(tap)
                .or_default()
                .insert(node.node_id.clone(), objects);
        }
    }
}

/// Installed taps no record names (installed by a pass that stopped before recording them).
pub(super) async fn record_unrecorded(
    ctx: &Context,
    cluster_key: &str,
    instance: &str,
    seen: &Survey,
    subs_by_name: &BTreeMap<String, &Arc<ArtemisCaptureSubscription>>,
    judged: &Judged,
) -> Result<(), PassError> {
    for (tap, node, endpoint) in &judged.installed_unrecorded {
        let sub = subs_by_name.get(&tap.subscription);
        ctx.store
            .ensure_tap_recorded(&TapInstall {
                cluster: cluster_key,
                subscription: &tap.subscription,
                subscription_uid: sub.and_then(|s| s.metadata.uid.as_deref()),
                instance_id: instance,
                node,
                endpoint: endpoint.as_deref(),
                source_address: &tap.address,
                capture_queue: &tap.capture_queue(),
                divert: &tap.divert(),
                filter: seen.desired.get(tap).and_then(|t| t.filter.as_deref()),
                audit_id: None,
            })
            .await?;
    }
    Ok(())
}

/// Existing taps whose divert is gone (removed behind our back): re-created by the installs,
/// and the copies routed meanwhile estimated as `tap_missing` (issue 25 item 3).
pub(super) fn divert_missing(
    installs: &BTreeMap<TapName, BTreeMap<String, Vec<Part>>>,
) -> BTreeSet<(TapName, String)> {
    installs
        .iter()
        .flat_map(|(tap, nodes)| {
            nodes
                .iter()
                .filter(|(_, parts)| parts.contains(&Part::Divert) && !parts.contains(&Part::Queue))
                .map(move |(node, _)| (tap.clone(), node.clone()))
        })
        .collect()
}

/// The pause rule every kind keeps (`artemis-studio.io/paused: "true"`): a paused
/// subscription's taps are neither installed, changed nor removed — also while it is deleted,
/// whose finalizer then waits for the annotation to go; its drains go on. Returns the
/// subscriptions whose writes this pass held.
pub(super) fn hold_paused(judged: &mut Judged, subs: &[Arc<ArtemisCaptureSubscription>]) -> BTreeSet<String> {
    let paused: BTreeSet<String> = subs
        .iter()
        .filter(|s| crate::controllers::is_paused(&s.metadata))
        .map(|s| s.name_any())
        .collect();
    let mut held = BTreeSet::new();
    let mut writes = |t: &TapName| {
        let hold = paused.contains(&t.subscription);
        if hold {
            held.insert(t.subscription.clone());
        }
        !hold
    };
    judged.installs.retain(|t, _| writes(t));
    judged.sweeps.retain(|t, _| writes(t));
    held
}

/// ADR-0062 D8: the capture queue must be restricted to the operator's role. A broker that
/// enforces no security, or a management user that may not add a security setting, gets no
/// tap at all.
async fn security_preflight(m: &BrokerManagement) -> Option<(RefusalKind, String)> {
    match m.security_authority().await {
        Ok(a) if !a.security_enabled => Some((
            RefusalKind::NoSecurityAuthority,
            "this broker has security-enabled=false: a security setting would restrict nothing and the capture queue (a complete copy of production payload) would be readable by every client (ADR-0062 D8). Nothing was installed on this node; enable security on the broker".into(),
        )),
        Ok(a) if a.may_add_security == Some(false) => Some((
            RefusalKind::NoSecurityAuthority,
            "the management user may not call addSecuritySettings (the broker's management.xml refuses it), so the capture queue could not be restricted to the capture role (ADR-0062 D8). Nothing was installed on this node; grant the user's role access to addSecuritySettings (and removeSecuritySettings)".into(),
        )),
        Ok(_) => None,
        Err(e) => Some((e.refusal_kind(), format!("security preflight unreadable, nothing written: {e}"))),
    }
}
