//! The command step of every mutating reconcile (ADR-0049): audit intent → fan-out → audit
//! outcome → managementWrite evidence → one Event.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::Resource;

use super::{Context, ReconcileError, runtime};
use crate::api::{NodeOutcome, Outcome};
use crate::broker::BrokerError;
use crate::fanout::{self, NodeFailure, NodeReport, Target};
use crate::store::{AuditIntent, CommandVerdict, outcome_detail};
use crate::topology::Topology;

/// What a command did.
#[derive(Debug, Clone)]
pub struct CommandResult {
    pub audit_id: i64,
    pub nodes: Vec<NodeOutcome>,
    pub verdict: CommandVerdict,
}

/// Where a command goes: the cluster and its topology at the time, and the per-node timeout.
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    pub cluster_ns: &'a str,
    pub cluster_name: &'a str,
    pub topology: &'a Topology,
    pub timeout: Duration,
}

/// What a command's end tells besides its audit row: the object its Event goes on (None: an
/// orphan's sweep, which no object asked for), whether a success is told too, and the cluster
/// whose managementWrite its outcome is evidence for (None for capture's writes: they say
/// nothing of the management user's authority over queues, ADR-0049).
pub struct Told<'a, K> {
    pub on: Option<&'a K>,
    pub success_event: SuccessEvent<'a>,
    pub evidence_for: Option<(&'a str, &'a str)>,
}

/// Whether a command that succeeded gets an Event on its object (a failure always does).
#[derive(Clone, Copy)]
pub enum SuccessEvent<'a> {
    Always,
    /// Only if a node held the object already (the flag its write sets): a new object's create
    /// is told by its status (`Ready`, each node `APPLIED` with the audit row) and the audit
    /// log — an Event per created object would be a third API write per object, and thousands
    /// of Events nobody acts on.
    IfExisted(&'a AtomicBool),
    /// Never: a capture tap's install or removal, one of thousands a pattern makes — its
    /// subscription's status lists each tap and the audit log each command; a plain delete,
    /// told by the object's going and its audit row.
    Never,
}

impl SuccessEvent<'_> {
    fn wanted(self) -> bool {
        match self {
            SuccessEvent::Always => true,
            SuccessEvent::IfExisted(existed) => existed.load(Ordering::Relaxed),
            SuccessEvent::Never => false,
        }
    }
}

impl<'a, K> Told<'a, K> {
    /// A management command on `obj`: its Event goes on it, its outcome is evidence for the
    /// cluster's managementWrite.
    pub fn management(obj: &'a K, cluster_ns: &'a str, cluster_name: &'a str) -> Self {
        Told {
            on: Some(obj),
            success_event: SuccessEvent::Always,
            evidence_for: Some((cluster_ns, cluster_name)),
        }
    }

    /// A command whose success is told by its audit row alone (a failure still gets an Event).
    pub fn failure_only(self) -> Self {
        Told {
            success_event: SuccessEvent::Never,
            ..self
        }
    }

    /// A create on every node: its success gets an Event only if a node held the object already.
    pub fn unless_created(self, existed: &'a AtomicBool) -> Self {
        Told {
            success_event: SuccessEvent::IfExisted(existed),
            ..self
        }
    }
}

impl<'a> Scope<'a> {
    /// What a management command on `obj` within this scope tells besides its audit row.
    pub fn told<'b, K>(&self, obj: &'b K) -> Told<'b, K>
    where
        'a: 'b,
    {
        Told::management(obj, self.cluster_ns, self.cluster_name)
    }
}

/// The execute stage, the one every kind's broker writes go through: audit intent → fan-out on
/// `topology`'s live nodes → audit outcome, metrics, write evidence and Event.
pub async fn execute<K, F, Fut>(
    ctx: &Context,
    told: Told<'_, K>,
    topology: &Topology,
    timeout: Duration,
    intent: AuditIntent,
    op: F,
) -> Result<CommandResult, ReconcileError>
where
    K: Resource<DynamicType = ()>,
    F: Fn(Target) -> Fut,
    Fut: Future<Output = Result<NodeReport, NodeFailure>>,
{
    let audit_id = ctx.store.audit_intent(&intent).await?;
    let nodes = fanout::fan_out(topology, fanout::DEFAULT_CONCURRENCY, timeout, op).await;
    // The crash window between the broker's answers and the outcome (test builds only).
    crate::crash_window::pause(crate::crash_window::Window::MidFanout, &audit_id.to_string()).await;
    conclude(ctx, told, &intent.command, &intent.cluster, audit_id, nodes).await
}

/// Complete a command whose intent row was written (by [`execute`], or by a one-shot kind that
/// persists the row's id before it calls the broker): the audit outcome, the metrics, the
/// managementWrite evidence and one Event.
pub async fn finish<K>(
    ctx: &Context,
    obj: &K,
    cluster_ns: &str,
    cluster_name: &str,
    command: &str,
    audit_id: i64,
    nodes: Vec<NodeOutcome>,
) -> Result<CommandResult, ReconcileError>
where
    K: Resource<DynamicType = ()>,
{
    let cluster = super::key(cluster_ns, cluster_name);
    let told = Told::management(obj, cluster_ns, cluster_name);
    conclude(ctx, told, command, &cluster, audit_id, nodes).await
}

async fn conclude<K>(
    ctx: &Context,
    told: Told<'_, K>,
    command: &str,
    cluster: &str,
    audit_id: i64,
    nodes: Vec<NodeOutcome>,
) -> Result<CommandResult, ReconcileError>
where
    K: Resource<DynamicType = ()>,
{
    let verdict = record_outcome(ctx, command, cluster, audit_id, &nodes).await?;
    if let Some((ns, cluster)) = told.evidence_for {
        report_evidence(ctx, ns, cluster, command, &nodes).await?;
    }
    let told_too = verdict != CommandVerdict::Succeeded || told.success_event.wanted();
    if let Some(obj) = told.on.filter(|_| told_too) {
        announce(ctx, obj, command, verdict, &nodes);
    }
    Ok(CommandResult {
        audit_id,
        nodes,
        verdict,
    })
}

/// The first half of every command's end, management or capture: its verdict counted, the
/// per-node outcomes counted, and the audit row completed with them.
async fn record_outcome(
    ctx: &Context,
    command: &str,
    cluster: &str,
    audit_id: i64,
    nodes: &[NodeOutcome],
) -> Result<CommandVerdict, crate::store::StoreError> {
    let verdict = CommandVerdict::of(nodes);
    ctx.metrics
        .commands
        .get_or_create(&crate::telemetry::CommandLabels {
            command: command.to_string(),
            verdict: format!("{verdict:?}").to_lowercase(),
            cluster: cluster.to_string(),
        })
        .inc();
    for n in nodes {
        ctx.metrics
            .node_outcomes
            .get_or_create(&crate::telemetry::OutcomeLabels {
                outcome: format!("{:?}", n.outcome),
            })
            .inc();
    }
    ctx.store
        .audit_outcome(audit_id, verdict, &outcome_detail(nodes))
        .await?;
    Ok(verdict)
}

/// The Event a human sees for a finished command on its object.
fn announce<K>(ctx: &Context, obj: &K, command: &str, verdict: CommandVerdict, nodes: &[NodeOutcome])
where
    K: Resource<DynamicType = ()>,
{
    let (warning, reason) = match verdict {
        CommandVerdict::Succeeded => (false, "Applied"),
        _ => (true, "Failed"),
    };
    ctx.event(obj, warning, reason, command, describe(command, nodes));
}

/// ADR-0049: only real writes are evidence. An APPLIED node proves writes work; an
/// authorization refusal proves they do not; anything else says nothing.
async fn report_evidence(
    ctx: &Context,
    cluster_ns: &str,
    cluster_name: &str,
    command: &str,
    nodes: &[NodeOutcome],
) -> Result<(), ReconcileError> {
    let refused = nodes
        .iter()
        .find(|n| n.outcome == Outcome::Failed && n.refusal == Some(crate::api::RefusalKind::NotAuthorized));
    if let Some(n) = refused {
        let e = BrokerError::refused(crate::api::RefusalKind::NotAuthorized, n.message.clone());
        return runtime::report_write(ctx, cluster_ns, cluster_name, command, &n.node, Err(&e)).await;
    }
    if let Some(n) = nodes.iter().find(|n| n.outcome == Outcome::Applied) {
        return runtime::report_write(ctx, cluster_ns, cluster_name, command, &n.node, Ok(())).await;
    }
    Ok(())
}

/// One line per node for the Event.
pub fn describe(command: &str, nodes: &[NodeOutcome]) -> String {
    let parts: Vec<String> = nodes
        .iter()
        .map(|n| {
            let short = n.node.get(..8).unwrap_or(&n.node);
            format!("{short}: {:?} {}", n.outcome, n.message)
        })
        .collect();
    format!("{command} ({}): {}", fanout::summary(nodes), parts.join("; "))
}

/// A repair puts back what drifted: every node written was in the requested state at the last
/// pass of this generation (APPLIED or ALREADY). A command that retries nodes that failed, timed
/// out or were not live is this generation's apply again (issue 41 item 6: a retry after a
/// refusal or a timeout is not a repair).
pub fn is_repair(
    observed: Option<i64>,
    generation: Option<i64>,
    last_audit: Option<i64>,
    written_nodes_before: &[Option<Outcome>],
) -> bool {
    last_audit.is_some()
        && observed == generation
        && !written_nodes_before.is_empty()
        && written_nodes_before
            .iter()
            .all(|o| matches!(o, Some(Outcome::Applied | Outcome::Already)))
}

/// `<kind>.apply` for the first command of a spec generation; `<kind>.repair` for a repair.
pub fn apply_or_repair(kind: &str, repair: bool) -> String {
    format!("{kind}.{}", if repair { "repair" } else { "apply" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_after_a_refusal_or_a_timeout_is_an_apply_and_drift_is_a_repair() {
        let drifted = [Some(Outcome::Applied), Some(Outcome::Already)];
        assert!(is_repair(Some(2), Some(2), Some(9), &drifted));
        for retried in [Some(Outcome::Failed), Some(Outcome::SkippedNotLive), None] {
            assert!(!is_repair(
                Some(2),
                Some(2),
                Some(9),
                &[Some(Outcome::Applied), retried]
            ));
        }
        assert!(
            !is_repair(Some(1), Some(2), Some(9), &drifted),
            "a new generation applies"
        );
        assert!(
            !is_repair(Some(2), Some(2), None, &drifted),
            "nothing was sent yet"
        );
    }
}
