//! The divert watch's creation (issue 45; what it is and how a delete uses it:
//! topology/divert_watch.rs). After a poll, the live nodes whose watch queue is missing get it,
//! in one audited command on the ArtemisCluster. A node that refused it is asked again only
//! after [`RETRY_AFTER`]; meanwhile its deletes read the diverts as before (`DivertNames`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use tokio::sync::Mutex;

use super::command::{self, SuccessEvent, Told};
use super::runtime::WatchRefusals as Refusals;
use super::{Context, ReconcileError};
use crate::api::{ArtemisCluster, Outcome, RefusalKind};
use crate::fanout::{NodeFailure, NodeReport, Target};
use crate::store::AuditIntent;
use crate::topology::Topology;
use crate::topology::divert_watch::{self, Watch};

/// How long a node that refused the watch (a role without `createNonDurableQueue` on the
/// notification address, say) is left without it before it is asked again: one audit row per
/// node per this, not per poll.
pub const RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The live nodes of `topology` that get the watch now.
fn lacking(topology: &Topology, refusals: &Refusals) -> BTreeSet<String> {
    topology
        .live_nodes()
        .filter(|n| {
            let watch = n.inventory.as_ref().map(|i| &i.divert_watch);
            watch.is_some_and(|w| wanted(w, &n.node_id, refusals))
        })
        .map(|n| n.node_id.clone())
        .collect()
}

/// A node gets the watch when its full read found none (not one that is there but untrusted:
/// that one is someone's, or moved) and it has not refused it within [`RETRY_AFTER`].
fn wanted(watch: &Watch, node: &str, refusals: &Refusals) -> bool {
    *watch == Watch::Missing && refusals.0.get(node).is_none_or(|at| at.elapsed() >= RETRY_AFTER)
}

/// Create the watch on every live node that lacks it: one audit row for them all.
pub async fn ensure(
    ctx: &Context,
    obj: &ArtemisCluster,
    topology: &Topology,
    refusals: &Mutex<Refusals>,
    timeout: Duration,
) -> Result<(), ReconcileError> {
    let nodes = lacking(topology, &*refusals.lock().await);
    if nodes.is_empty() {
        return Ok(());
    }
    let on = topology.restricted_to(&nodes);
    // What it says of the management user's authority is about one reserved address, not the
    // queues it manages: no managementWrite evidence; a failure is an Event on the cluster.
    let told = Told {
        on: Some(obj),
        success_event: SuccessEvent::Never,
        evidence_for: None,
    };
    let result = command::execute(ctx, told, &on, timeout, intent(ctx, obj), create).await?;
    let mut refused = refusals.lock().await;
    for n in &result.nodes {
        if n.outcome.is_success() {
            refused.0.remove(&n.node);
        } else {
            refused.0.insert(n.node.clone(), Instant::now());
        }
    }
    Ok(())
}

/// One node's create; a watch made meanwhile (another installation's) is already there.
async fn create(t: Target) -> Result<NodeReport, NodeFailure> {
    match t.ops.create_queue(&divert_watch::queue_document()).await {
        Ok(_) => Ok(NodeReport::new(Outcome::Applied, "divert watch created")),
        Err(e) if e.refusal_kind() == RefusalKind::QueueExists => {
            Ok(NodeReport::new(Outcome::Already, "divert watch already there"))
        }
        Err(e) => Err(NodeFailure {
            message: Some(format!(
                "the divert watch {} could not be created on {} ({e}); deletes on this node read its DivertNames instead (slower at many queues), and it is tried again in {} min",
                divert_watch::QUEUE,
                divert_watch::NOTIFICATION_ADDRESS,
                RETRY_AFTER.as_secs() / 60
            )),
            error: e,
            detail: vec![],
        }),
    }
}

fn intent(ctx: &Context, obj: &ArtemisCluster) -> AuditIntent {
    let ns = obj.namespace().unwrap_or_default();
    AuditIntent {
        instance_id: ctx.instance_id.clone(),
        actor: "the operator: the divert watch its queue deletes read (issue 45)".into(),
        command: "divertwatch.create".into(),
        cluster: super::key(&ns, &obj.name_any()),
        target: format!("queue {}", divert_watch::QUEUE),
        object_kind: "ArtemisCluster".into(),
        object_namespace: ns,
        object_name: obj.name_any(),
        object_uid: obj.uid().unwrap_or_default(),
        object_generation: obj.metadata.generation,
        params: divert_watch::queue_document(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::divert_watch::Mark;

    #[test]
    fn only_a_missing_watch_is_made_and_a_refusal_waits_its_hour() {
        let none = Refusals::default();
        assert!(wanted(&Watch::Missing, "n1", &none));
        let live = Watch::Live(Mark { id: 1, added: 1 });
        assert!(!wanted(&live, "n1", &none), "there and counting");
        let foreign = Watch::Untrusted("its filter is not the watch's".into());
        assert!(!wanted(&foreign, "n1", &none), "there: never replaced");
        assert!(!wanted(&Watch::Unread, "n1", &none));
        let mut refused = Refusals::default();
        refused.0.insert("n1".into(), Instant::now());
        assert!(!wanted(&Watch::Missing, "n1", &refused), "refused just now");
        assert!(wanted(&Watch::Missing, "n2", &refused), "another node");
        if let Some(long_ago) = Instant::now().checked_sub(RETRY_AFTER) {
            refused.0.insert("n1".into(), long_ago);
            assert!(wanted(&Watch::Missing, "n1", &refused), "an hour on: asked again");
        }
    }
}
