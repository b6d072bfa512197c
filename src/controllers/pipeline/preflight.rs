//! preflight: the fresh reads a write or a delete is planned from — a read of only what the
//! command touches, on the nodes it goes to — where the snapshot is not the evidence.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::dereference::Dereferenced;
use super::plan::{planned, snapshot_inventories, write_targets};
use super::{FreshRead, Step, TopologyObject};
use crate::api::{NodeOutcome, Outcome};
use crate::fanout::Target;
use crate::topology::inventory::NodeInventory;

/// What a node's write is planned from.
#[derive(Clone)]
pub(in crate::controllers) enum Planned {
    /// The preflight's fresh read: the write is verified by another one.
    Fresh(Arc<NodeInventory>),
    /// The cluster's snapshot: the write's answer is the evidence.
    Snapshot(Arc<NodeInventory>),
}

impl Planned {
    pub(super) fn inventory(&self) -> Arc<NodeInventory> {
        match self {
            Planned::Fresh(i) | Planned::Snapshot(i) => i.clone(),
        }
    }
}

/// The nodes to write, re-planned where a fresh read is the evidence (ADR-0049: an update reads
/// first; the snapshot may predate a write, ours or someone else's: no audited no-op commands).
/// Where the write's answer is the evidence, the snapshot stands (issue 23). Returns the plan and
/// what each written node is planned from.
pub(super) async fn preflight_apply<K: TopologyObject>(
    deref: &Dereferenced,
    d: &K::Desired,
    plan: Vec<(NodeOutcome, bool)>,
) -> (Vec<(NodeOutcome, bool)>, BTreeMap<String, Planned>) {
    let snapshot = snapshot_inventories(&deref.topology);
    let mut from: BTreeMap<String, Planned> = BTreeMap::new();
    let mut to_read: BTreeSet<String> = BTreeSet::new();
    for node in write_targets(&plan) {
        match snapshot.get(&node) {
            Some(Ok(inv)) if K::answer_is_evidence(d, inv) => {
                from.insert(node, Planned::Snapshot(inv.clone()));
            }
            _ => {
                to_read.insert(node);
            }
        }
    }
    let fresh = fresh_reads::<K>(deref, d, &to_read, false).await;
    let plan = plan
        .into_iter()
        .map(|(n, w)| {
            let node = deref.topology.nodes.iter().find(|x| x.node_id == n.node);
            match (w, fresh.get(&n.node), node) {
                (true, Some(Ok(inv)), Some(node)) => {
                    let step = K::plan_apply(d, inv);
                    from.insert(n.node.clone(), Planned::Fresh(inv.clone()));
                    (planned(node, &step), matches!(step, Step::Write { .. }))
                }
                (true, Some(Err(failed)), _) => (failed.clone(), false),
                (w, _, _) => {
                    let write = w && from.contains_key(&n.node);
                    (n, write)
                }
            }
        })
        .collect();
    (plan, from)
}

/// One fresh read per named live node, concurrently; a node whose read fails is FAILED with the
/// error (nothing is written or destroyed there on a guess).
pub(super) async fn fresh_reads<K: TopologyObject>(
    deref: &Dereferenced,
    d: &K::Desired,
    nodes: &BTreeSet<String>,
    for_delete: bool,
) -> BTreeMap<String, Result<Arc<NodeInventory>, NodeOutcome>> {
    let timeout = deref.rt.request_timeout * 2;
    let reads = deref.topology.live_nodes().filter(|n| nodes.contains(&n.node_id)).filter_map(|n| {
        let management = n.active.clone()?;
        Some(async move {
            let t = Target::new(n.node_id.clone(), management);
            let purpose = if for_delete {
                FreshRead::Delete {
                    last_inventory: n.inventory.clone(),
                }
            } else {
                FreshRead::Apply
            };
            let read = tokio::time::timeout(timeout, K::read_fresh(&t, d, purpose))
                .await
                .unwrap_or(Err(crate::broker::BrokerError::Timeout(timeout.as_secs())));
            let r = read.map(Arc::new).map_err(|e| NodeOutcome {
                last_command: None,
                node: n.node_id.clone(),
                endpoint: n.active_endpoint().map(str::to_string),
                outcome: Outcome::Failed,
                refusal: Some(e.refusal_kind()),
                message: format!(
                    "the preflight could not read this node ({e}); nothing is written or destroyed there on a guess"
                ),
                detail: vec![],
            });
            (n.node_id.clone(), r)
        })
    });
    futures::future::join_all(reads).await.into_iter().collect()
}
