//! A pass's installs (ADR-0062 D2, issue 42): every missing part of every desired tap, the taps
//! side by side so their operations to one node share bulk POSTs, each with its own audit row,
//! within the pass's time budget (what is left is deferred to the next pass, and says so).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::judge::Judged;
use super::survey::{ArmState, Survey, without_review};
use super::{Found, PassError, PassScope, intent, may_start, told};
use crate::api::capture::{ArtemisCaptureSubscription, TapState};
use crate::api::capture_names::TapName;
use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::broker::{BrokerError, BrokerManagement};
use crate::capture::plan::{Part, TapSpec};
use crate::capture::status::not_drained;
use crate::controllers::command;
use crate::fanout::{NodeFailure, NodeReport, Target};
use crate::store::capture::TapInstall;

/// Installs: one audited command per tap, on the nodes that lack something. The number of
/// commands sent, and of taps left for the next pass (none starts once the pass's budget for
/// writes is spent: those are PENDING and say so).
pub(super) async fn install_all(
    scope: &PassScope<'_>,
    seen: &Survey,
    subs_by_name: &BTreeMap<String, &Arc<ArtemisCaptureSubscription>>,
    judged: &mut Judged,
) -> Result<(i32, i32), PassError> {
    use futures::StreamExt;
    // The taps' installs run side by side, so their operations to one node share bulk POSTs
    // (issue 25: installs of one pass batched per node); each keeps its own audit row.
    // None: deferred to the next pass, on these nodes.
    type Installed = (TapName, Option<Result<Vec<NodeOutcome>, PassError>>, Vec<String>);
    // Boxed as Send: rustc cannot prove it of the unboxed futures inside a spawned task.
    let mut each: Vec<futures::future::BoxFuture<'_, Installed>> = vec![];
    let queue_parts = creating_queues(&judged.installs);
    for (tap, parts) in std::mem::take(&mut judged.installs) {
        let Some(spec) = seen.desired.get(&tap) else {
            continue;
        };
        let sub = subs_by_name.get(&tap.subscription).copied();
        each.push(Box::pin(async move {
            let nodes: Vec<String> = parts.keys().cloned().collect();
            if !may_start(scope.writes_until) {
                return (tap, None, nodes);
            }
            let outcomes = install(scope, sub, spec, &parts).await;
            (tap, Some(outcomes), nodes)
        }));
    }
    let results: Vec<Installed> = futures::stream::iter(each)
        .buffer_unordered(INSTALLS_AT_ONCE)
        .collect()
        .await;
    let (mut commands, mut deferred) = (0, 0);
    let mut first_error = None;
    for (tap, outcomes, nodes) in results {
        let Some(outcomes) = outcomes else {
            deferred += 1;
            for node in nodes {
                judged
                    .found
                    .insert((tap.clone(), node), found_deferred(scope.budget));
            }
            continue;
        };
        if let Some(nodes) = queue_parts.get(&tap) {
            let applied = outcomes
                .iter()
                .flatten()
                .filter(|o| o.outcome == Outcome::Applied);
            for o in applied.filter(|o| nodes.contains(&o.node)) {
                judged.fresh_queues.insert((tap.clone(), o.node.clone()));
            }
        }
        let outcomes = match outcomes {
            Ok(o) => o,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        commands += 1;
        for o in outcomes {
            if o.outcome == Outcome::Applied {
                judged.drain_targets.push((tap.clone(), o.node.clone()));
                // Judged by its drain once that runs (`report`), not "starts after this pass".
                judged.installed.push((tap.clone(), o.node.clone()));
            }
            judged
                .found
                .insert((tap.clone(), o.node.clone()), found_after_install(o));
        }
    }
    first_error.map_or(Ok((commands, deferred)), Err)
}

/// The nodes where each tap's install creates its capture queue.
fn creating_queues(
    installs: &BTreeMap<TapName, BTreeMap<String, Vec<Part>>>,
) -> BTreeMap<TapName, BTreeSet<String>> {
    installs
        .iter()
        .map(|(tap, nodes)| {
            let with_queue = nodes.iter().filter(|(_, p)| p.contains(&Part::Queue));
            (tap.clone(), with_queue.map(|(n, _)| n.clone()).collect())
        })
        .collect()
}

/// A tap whose install this pass left for the next: the budget's time for writes was spent.
fn found_deferred(budget: Duration) -> Found {
    Found {
        state: TapState::Pending,
        refusal: None,
        message: format!(
            "deferred: this pass spent its time budget ({}s) on other taps' installs; installed by the next pass",
            budget.as_secs()
        ),
    }
}

/// Taps installed (or removed) at once by a pass: each install is a few operations one after
/// another per node, one in flight per tap and node; this many fill the node's whole budget
/// (`broker::budget::MAX_IN_FLIGHT` POSTs of `broker::batch::MAX_BATCH` operations), so a
/// replicated primary's journal commits them in groups (issue 42: ≥ 100 installs/s; 128 gave
/// 113/s on the replicated pair).
pub(super) const INSTALLS_AT_ONCE: usize =
    crate::broker::budget::MAX_IN_FLIGHT * crate::broker::batch::MAX_BATCH;

fn found_after_install(o: NodeOutcome) -> Found {
    if o.outcome == Outcome::Applied {
        return Found {
            state: TapState::Degraded,
            refusal: None,
            message: format!(
                "{}; {}",
                o.message,
                not_drained("its drain starts after this pass")
            ),
        };
    }
    Found {
        state: if o.refusal == Some(RefusalKind::NoSecurityAuthority) {
            TapState::Refused
        } else {
            TapState::Pending
        },
        refusal: o.refusal,
        message: o.message,
    }
}

/// Audit intent → fan-out on the nodes that lack something → audit outcome → install record.
async fn install(
    p: &PassScope<'_>,
    sub: Option<&Arc<ArtemisCaptureSubscription>>,
    spec: &TapSpec,
    parts_by_node: &BTreeMap<String, Vec<Part>>,
) -> Result<Vec<NodeOutcome>, PassError> {
    let (ctx, cluster_key) = (p.ctx, p.cluster_key);
    let parts_json: BTreeMap<&String, Vec<&str>> = parts_by_node
        .iter()
        .map(|(n, p)| (n, p.iter().map(|p| p.describe()).collect()))
        .collect();
    let params = json!({
        "sourceAddress": spec.name.address,
        "captureQueue": spec.name.capture_queue(),
        "divert": spec.name.divert(),
        "parts": parts_json,
        "addressSettings": spec.address_settings(),
        "queue": spec.queue_document(),
        "divertConfiguration": spec.divert_document(),
        "consumeRole": spec.role,
        // Who accepted the blast radius: spec.confirm after the preview, or the annotation.
        "armed": p.arms.get(&spec.name.subscription).and_then(ArmState::armed),
        "confirmWithoutReview": sub.is_some_and(|s| without_review(s)),
    });
    let audit = intent(p, "capture.install", sub, &spec.name, params);
    let nodes: BTreeSet<String> = parts_by_node.keys().cloned().collect();
    let scope = p.topology.restricted_to(&nodes);
    let result = command::execute(ctx, told(sub), &scope, p.timeout * 6, audit, |t: Target| {
        let parts = parts_by_node.get(&t.node_id).cloned().unwrap_or_default();
        async move { install_on(&t.management, spec, &parts).await }
    })
    .await?;
    let (audit_id, outcomes) = (result.audit_id, result.nodes);
    for o in outcomes.iter().filter(|o| o.outcome == Outcome::Applied) {
        let queue_created = parts_by_node
            .get(&o.node)
            .is_some_and(|p| p.contains(&Part::Queue));
        let record = TapInstall {
            cluster: cluster_key,
            subscription: &spec.name.subscription,
            subscription_uid: sub.and_then(|s| s.metadata.uid.as_deref()),
            instance_id: &ctx.instance_id,
            node: &o.node,
            endpoint: o.endpoint.as_deref(),
            source_address: &spec.name.address,
            capture_queue: &spec.name.capture_queue(),
            divert: &spec.name.divert(),
            filter: spec.filter.as_deref(),
            audit_id: Some(audit_id),
        };
        if queue_created {
            // A new incarnation: whatever was open ended when its queue went (a broker restart
            // or a failover), and the interval since is a gap in this node's coverage.
            ctx.store
                .record_install(
                    &record,
                    "capture queue found gone (broker restart or failover); re-created",
                )
                .await?;
        } else {
            ctx.store.ensure_tap_recorded(&record).await?;
        }
    }
    Ok(outcomes)
}

/// The install order of [`Part`]: security, settings, queue, divert.
async fn install_on(m: &BrokerManagement, spec: &TapSpec, parts: &[Part]) -> Result<NodeReport, NodeFailure> {
    let queue = spec.name.capture_queue();
    let mut done: Vec<&str> = vec![];
    for part in parts {
        let result: Result<(), BrokerError> = match part {
            Part::SecuritySetting => m
                .add_security_settings(&queue, &spec.security_roles())
                .await
                .map_err(|e| {
                    if e.is_authorization() {
                        BrokerError::refused(
                            RefusalKind::NoSecurityAuthority,
                            format!("addSecuritySettings refused ({e}): the capture queue cannot be restricted, nothing installed (ADR-0062 D8)"),
                        )
                    } else {
                        e
                    }
                }),
            Part::AddressSettings => m.add_address_settings(&queue, &spec.address_settings()).await,
            Part::Queue => match m.create_queue(&spec.queue_document()).await {
                Err(e) if e.refusal_kind() == RefusalKind::QueueExists => Ok(()),
                r => r.map(|_| ()),
            },
            Part::QueueRingSize => m.update_queue(&spec.queue_document()).await.map(|_| ()),
            Part::Divert => match m.create_divert(&spec.divert_document()).await {
                Ok(()) => {
                    // The broker ignores a duplicate or a missing address silently: verify
                    // (the divert's own MBean: the cost of one install does not grow with taps).
                    if m.divert_exists(&spec.name.address, &spec.name.divert()).await? {
                        Ok(())
                    } else {
                        Err(BrokerError::refused(
                            RefusalKind::NotConverging,
                            format!(
                                "createDivert returned but no divert {} exists afterwards",
                                spec.name.divert()
                            ),
                        ))
                    }
                }
                Err(e) => Err(e),
            },
            Part::DivertUpdate => m.update_divert(&spec.divert_document()).await,
        };
        if let Err(e) = result {
            let written = if done.is_empty() {
                "nothing written".to_string()
            } else {
                format!("written before it: {}", done.join(", "))
            };
            return Err(NodeFailure {
                message: Some(format!("{} failed ({written}): {e}", part.describe())),
                error: e,
                detail: vec![],
            });
        }
        done.push(part.describe());
    }
    Ok(NodeReport::new(
        Outcome::Applied,
        format!("installed {}", done.join(", ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deferred_install_is_pending_and_says_when_it_comes() {
        let f = found_deferred(Duration::from_secs(60));
        assert_eq!(f.state, TapState::Pending);
        assert!(
            f.message.contains("time budget (60s)") && f.message.contains("next pass"),
            "{}",
            f.message
        );
    }
}
