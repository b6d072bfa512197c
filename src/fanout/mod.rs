//! Fan-out (ADR-0049): one operation on every live logical node, concurrently (bounded), each
//! with its own timeout; one NodeOutcome per logical node. Not-live nodes are SKIPPED_NOT_LIVE
//! and never called. A partial failure is reported, never rolled back.
//!
//! A node the per-node budget judges not answering (`broker::budget::Health`) is not live: it is
//! SKIPPED_NOT_LIVE with the evidence, whether it was judged before the operation (never
//! called) or during it with nothing of the operation sent yet (its calls failed at once). An
//! operation whose call was on the wire when the node was judged is FAILED (its effect is
//! unknown), and never waits for that answer: no reconcile holds its slot on a hung node.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::api::{NodeOutcome, Outcome, RefusalKind};
use crate::broker::error::NotAnswering;
use crate::broker::{BrokerError, BrokerManagement};
use crate::topology::{LogicalNode, Topology};

#[cfg(test)]
pub mod fake;
pub mod ops;

pub use ops::BrokerOps;

/// What an operation reports for its node when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeReport {
    pub outcome: Outcome,
    pub message: String,
    pub detail: Vec<String>,
    /// What the write's own answer showed of the node (a created queue's configuration): laid
    /// over the cluster's snapshot, as a fresh read is.
    pub seen: Option<std::sync::Arc<crate::topology::inventory::NodeInventory>>,
}

impl NodeReport {
    pub fn new(outcome: Outcome, message: impl Into<String>) -> Self {
        NodeReport {
            outcome,
            message: message.into(),
            detail: vec![],
            seen: None,
        }
    }
    pub fn with_seen(mut self, seen: crate::topology::inventory::NodeInventory) -> Self {
        self.seen = Some(std::sync::Arc::new(seen));
        self
    }
    pub fn with_detail(mut self, detail: Vec<String>) -> Self {
        self.detail = detail;
        self
    }
}

/// A failed node: the error, and what was done on the node before it (e.g. removed diverts).
#[derive(Debug, Clone)]
pub struct NodeFailure {
    pub error: BrokerError,
    /// The cause and the next action, for a human; defaults to the error's text.
    pub message: Option<String>,
    pub detail: Vec<String>,
}

impl From<BrokerError> for NodeFailure {
    fn from(error: BrokerError) -> Self {
        NodeFailure {
            error,
            message: None,
            detail: vec![],
        }
    }
}

/// The node an operation runs on: its ID and its active endpoint's management — `ops`, the seam
/// queues, diverts and closes use (a fake in unit tests), and `management`, the whole Jolokia
/// surface capture's installs still use directly.
#[derive(Clone, Debug)]
pub struct Target {
    pub node_id: String,
    pub ops: Arc<dyn BrokerOps>,
    pub management: BrokerManagement,
}

impl Target {
    pub fn new(node_id: impl Into<String>, management: BrokerManagement) -> Self {
        Target {
            node_id: node_id.into(),
            ops: Arc::new(management.clone()),
            management,
        }
    }
}

/// Most nodes called at once.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// Run `op` on every live node of `topology` concurrently; skip the others.
pub async fn fan_out<F, Fut>(
    topology: &Topology,
    concurrency: usize,
    timeout: Duration,
    op: F,
) -> Vec<NodeOutcome>
where
    F: Fn(Target) -> Fut,
    Fut: Future<Output = Result<NodeReport, NodeFailure>>,
{
    // Owned nodes (cheap clones): a stream over borrowed ones is not Send-general enough for
    // controllers' futures.
    let targets: Vec<LogicalNode> = topology.nodes.clone();
    let op = &op;
    let mut outcomes: Vec<(usize, NodeOutcome)> = futures::stream::iter(targets.into_iter().enumerate())
        .map(|(i, node)| async move { (i, run_on(&node, timeout, op).await) })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    outcomes.sort_by_key(|(i, _)| *i);
    outcomes.into_iter().map(|(_, o)| o).collect()
}

/// Run `op` on one node (ADR-0057's node-scoped operations use the same outcome shape).
pub async fn run_on<F, Fut>(node: &LogicalNode, timeout: Duration, op: &F) -> NodeOutcome
where
    F: Fn(Target) -> Fut,
    Fut: Future<Output = Result<NodeReport, NodeFailure>>,
{
    let Some(management) = node.active.clone() else {
        return skipped(node);
    };
    if let Some(silence) = management.client().not_answering() {
        return not_answering(node, &silence);
    }
    let endpoint = Some(management.client().url().to_string());
    let (management, sent) = management.tracked();
    let target = Target::new(node.node_id.clone(), management);
    let result = tokio::time::timeout(timeout, op(target)).await;
    let result = result.unwrap_or_else(|_| Err(BrokerError::Timeout(timeout.as_secs()).into()));
    match result {
        Ok(r) => NodeOutcome {
            last_command: None,
            node: node.node_id.clone(),
            endpoint,
            outcome: r.outcome,
            refusal: None,
            message: r.message,
            detail: r.detail,
        },
        // Nothing of the operation reached the node: it was not live for it.
        Err(NodeFailure {
            error: BrokerError::NotAnswering(silence),
            ..
        }) if !sent.any() => not_answering(node, &silence),
        Err(f) => NodeOutcome {
            last_command: None,
            node: node.node_id.clone(),
            endpoint,
            outcome: Outcome::Failed,
            refusal: Some(f.error.refusal_kind()),
            message: f.message.unwrap_or_else(|| f.error.to_string()),
            detail: f.detail,
        },
    }
}

/// A node not live: SKIPPED_NOT_LIVE, never called, with why (the budget's evidence for a node
/// the poll found active but that does not answer now).
pub fn skipped(node: &LogicalNode) -> NodeOutcome {
    if let Some(silence) = node.not_answering() {
        return not_answering(node, &silence);
    }
    skipped_because(
        node,
        node.not_live_reason.as_deref().unwrap_or("no active endpoint"),
    )
}

/// A node judged not answering: SKIPPED_NOT_LIVE with the evidence. What it missed goes out
/// when it answers again: the cluster's poll then triggers every object of the cluster.
pub fn not_answering(node: &LogicalNode, silence: &NotAnswering) -> NodeOutcome {
    let why = format!(
        "{} is not answering ({}); the write is sent when it answers again",
        node.active_endpoint().unwrap_or("its endpoint"),
        silence.evidence()
    );
    skipped_because(node, &why)
}

fn skipped_because(node: &LogicalNode, why: &str) -> NodeOutcome {
    NodeOutcome {
        last_command: None,
        node: node.node_id.clone(),
        endpoint: None,
        outcome: Outcome::SkippedNotLive,
        refusal: None,
        message: format!("not live, did not receive the command: {why}"),
        detail: vec![],
    }
}

/// A live node whose inventory could not be scraped: nothing is known, so nothing is planned or
/// written there (no audited command on a guess); the next poll reads it again.
pub fn inventory_unavailable(node: &LogicalNode) -> NodeOutcome {
    let error = node.inventory_error.clone();
    NodeOutcome {
        last_command: None,
        node: node.node_id.clone(),
        endpoint: node.active_endpoint().map(str::to_string),
        outcome: Outcome::Failed,
        refusal: Some(
            error
                .as_ref()
                .map_or(RefusalKind::BadResponse, BrokerError::refusal_kind),
        ),
        message: format!(
            "the node's inventory could not be read ({}); nothing planned there, read again at the next poll",
            error.map_or_else(|| "no answer".to_string(), |e| e.to_string())
        ),
        detail: vec![],
    }
}

/// A refusal decided by the operator (not the broker), as a node failure.
pub fn refuse(kind: RefusalKind, message: impl Into<String>) -> NodeFailure {
    let message = message.into();
    NodeFailure {
        error: BrokerError::refused(kind, message.clone()),
        message: Some(message),
        detail: vec![],
    }
}

/// `applied/total`: nodes in the requested state over all logical nodes.
pub fn summary(outcomes: &[NodeOutcome]) -> String {
    let ok = outcomes
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Applied | Outcome::Already))
        .count();
    format!("{ok}/{}", outcomes.len())
}

#[cfg(test)]
mod not_answering_tests {
    //! A node the per-node budget judges not answering is SKIPPED_NOT_LIVE with the evidence and
    //! never called (time paused: the judgement is made by a permit held past the threshold, no
    //! HTTP involved).

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::broker::budget::{HUNG_AFTER_MIN, Purpose};
    use crate::broker::{Credentials, JolokiaClient, Registry};

    /// The registry of these tests' clients (each test names a node of its own).
    static REGISTRY: std::sync::LazyLock<std::sync::Arc<Registry>> =
        std::sync::LazyLock::new(Registry::standalone);

    fn budget_for(url: &str) -> std::sync::Arc<crate::broker::budget::NodeBudget> {
        REGISTRY.budget_for(url)
    }

    fn node(url: &str) -> LogicalNode {
        let client = JolokiaClient::new(
            crate::broker::jolokia::http_client(&REGISTRY, None).expect("an HTTP client"),
            url,
            None,
            Credentials {
                username: "u".into(),
                password: "p".into(),
            },
            Duration::from_secs(30),
        );
        LogicalNode {
            node_id: "n3".into(),
            active: Some(BrokerManagement::with_name(client, "b".into())),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_judged_not_answering_is_skipped_not_live_and_never_called() {
        let url = "http://hung.invalid:8161/console/jolokia?fanout-test=1";
        let n = node(url);
        // A POST the node never answers, past the threshold.
        let _hung = budget_for(url)
            .acquire(Purpose::Work)
            .await
            .expect("answering so far");
        assert!(n.is_live());
        tokio::time::sleep(HUNG_AFTER_MIN + Duration::from_millis(100)).await;
        assert!(!n.is_live(), "judged not live between polls");

        let calls = AtomicUsize::new(0);
        let outcome = run_on(&n, Duration::from_secs(30), &|_t: Target| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok(NodeReport::new(Outcome::Applied, "written")) }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 0, "never called");
        assert_eq!(outcome.outcome, Outcome::SkippedNotLive, "{outcome:?}");
        assert!(
            outcome
                .message
                .contains("is not answering (1 calls unanswered since"),
            "{}",
            outcome.message
        );
        assert_eq!(skipped(&n).outcome, Outcome::SkippedNotLive);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_judged_during_the_operation_with_nothing_sent_is_skipped_not_failed() {
        let url = "http://hung.invalid:8161/console/jolokia?fanout-test=2";
        let n = node(url);
        let budget = budget_for(url);
        let outcome = run_on(&n, Duration::from_secs(30), &|t: Target| {
            let budget = budget.clone();
            async move {
                // Another caller's POST goes unanswered while this operation prepares.
                let _hung = budget.acquire(Purpose::Work).await.expect("answering so far");
                tokio::time::sleep(HUNG_AFTER_MIN + Duration::from_millis(100)).await;
                t.management.identity().await?;
                Ok(NodeReport::new(Outcome::Applied, "read"))
            }
        })
        .await;
        assert_eq!(outcome.outcome, Outcome::SkippedNotLive, "{outcome:?}");
        assert_eq!(outcome.refusal, None);
    }
}
