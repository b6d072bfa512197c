//! Ownership (issue 41): what a plain delete may destroy. An object owns the broker object it
//! created; it does not own one it found in use (adopted) or one another writer keeps (another
//! operator installation on the same brokers, a script, broker.xml). Both are recorded in
//! `status.notOwned` once, with their evidence, and kept for the object's life; a plain delete
//! then releases the object and leaves the broker object in place, and destroying it takes
//! `spec.deletion.destroyConfirmation` set to the confirmation the status shows.
//!
//! Everything here is pure: the pipeline gives it the last status, this pass's plan and the
//! latest inventories, and writes what it returns.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::{AdoptedNode, NodeOutcome, NotOwned, OtherWriterNode, Outcome, RefusalKind};
use crate::topology::inventory::NodeInventory;

/// How a broker object is used on a node: messages held and consumers attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InUse {
    pub messages: u64,
    pub consumers: u64,
}

impl InUse {
    pub fn any(self) -> bool {
        self.messages > 0 || self.consumers > 0
    }
}

/// Nodes where the broker object is in use and this object never wrote there: the old status
/// has no command received on the node (`last_command`). A node this object created the queue
/// on has one, so it is never adopted; a node where the queue was there before (another
/// application's, another installation's, broker.xml's, or a queue a `Retain` delete left) is
/// adopted as soon as it is seen in use, and stays adopted.
pub fn adopted_nodes(
    old_nodes: &[NodeOutcome],
    already: Option<&NotOwned>,
    inventories: &BTreeMap<String, Arc<NodeInventory>>,
    in_use: impl Fn(&NodeInventory) -> Option<InUse>,
) -> Vec<AdoptedNode> {
    inventories
        .iter()
        .filter(|(node, _)| {
            let wrote = old_nodes
                .iter()
                .any(|o| &o.node == *node && o.last_command.is_some());
            let recorded = already.is_some_and(|n| n.adopted.iter().any(|a| &a.node == *node));
            !wrote && !recorded
        })
        .filter_map(|(node, inv)| {
            let used = in_use(inv).filter(|u| u.any())?;
            Some(AdoptedNode {
                node: node.clone(),
                message_count: used.messages,
                consumer_count: used.consumers,
            })
        })
        .collect()
}

/// Nodes where someone else changed the broker object: at the last pass of this generation the
/// node was in the requested state (APPLIED or ALREADY), and now the plan finds fields to change
/// back (an update; a broker object deleted behind our back is re-created, not evidence). The
/// spec did not change in between, so the change came from another writer. Nodes held back as
/// CONTESTED carry their fields too.
pub fn other_writer_nodes(
    old_nodes: &[NodeOutcome],
    planned: &[NodeOutcome],
    same_generation: bool,
    at: &str,
) -> Vec<OtherWriterNode> {
    if !same_generation {
        return vec![];
    }
    planned
        .iter()
        .filter(|p| {
            let update = p.outcome == Outcome::WouldApply
                || (p.outcome == Outcome::Failed && p.refusal == Some(RefusalKind::Contested));
            update && !p.detail.is_empty()
        })
        .filter_map(|p| {
            let o = old_nodes.iter().find(|o| o.node == p.node)?;
            let was_requested = matches!(o.outcome, Outcome::Applied | Outcome::Already)
                || o.refusal == Some(RefusalKind::Contested);
            was_requested.then(|| OtherWriterNode {
                node: p.node.clone(),
                fields: p.detail.clone(),
                undone: o
                    .last_command
                    .as_ref()
                    .map_or("what this object found matching".into(), |lc| {
                        format!("{} (audit #{})", lc.command, lc.audit_id)
                    }),
                at: at.to_string(),
            })
        })
        .collect()
}

/// The ownership record after this pass: the old one with the new evidence added (a node is
/// recorded once per kind of evidence). `None` while there is no evidence at all.
pub fn merged(
    old: Option<&NotOwned>,
    adopted: Vec<AdoptedNode>,
    other_writer: Vec<OtherWriterNode>,
    at: &str,
    target: &str,
) -> Option<NotOwned> {
    let mut n = old.cloned().unwrap_or_else(|| NotOwned {
        since: at.to_string(),
        confirmation: confirmation(target, at),
        ..Default::default()
    });
    for a in adopted {
        if !n.adopted.iter().any(|x| x.node == a.node) {
            n.adopted.push(a);
        }
    }
    for w in other_writer {
        if !n.other_writer.iter().any(|x| x.node == w.node) {
            n.other_writer.push(w);
        }
    }
    (!n.adopted.is_empty() || !n.other_writer.is_empty()).then_some(n)
}

/// The words `spec.deletion.destroyConfirmation` must hold: the broker object and the moment
/// the record began, which no manifest can know before the status showed it.
pub fn confirmation(target: &str, since: &str) -> String {
    format!("destroy {target} not owned since {since}")
}

/// What a delete does with a record: `Release` (leave the broker object, with the evidence)
/// unless the object's confirmation matches.
#[derive(Debug, PartialEq, Eq)]
pub enum DeleteVerdict {
    Destroy,
    Release { evidence: String, confirmation: String },
}

pub fn delete_verdict(record: Option<&NotOwned>, confirmation: Option<&str>) -> DeleteVerdict {
    match record {
        None => DeleteVerdict::Destroy,
        Some(r) if confirmation == Some(r.confirmation.as_str()) => DeleteVerdict::Destroy,
        Some(r) => DeleteVerdict::Release {
            evidence: r.evidence(),
            confirmation: r.confirmation.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LastCommand;

    fn node(id: &str, outcome: Outcome, command: Option<&str>) -> NodeOutcome {
        NodeOutcome {
            node: id.into(),
            endpoint: None,
            outcome,
            refusal: None,
            message: String::new(),
            detail: vec![],
            last_command: command.map(|c| LastCommand {
                command: c.into(),
                audit_id: 7,
                outcome,
                at: "t0".into(),
                not_applied: vec![],
            }),
        }
    }

    fn update(id: &str, fields: &[&str]) -> NodeOutcome {
        NodeOutcome {
            detail: fields.iter().map(|f| f.to_string()).collect(),
            ..node(id, Outcome::WouldApply, None)
        }
    }

    fn inventories(nodes: &[&str]) -> BTreeMap<String, Arc<NodeInventory>> {
        nodes
            .iter()
            .map(|n| (n.to_string(), Arc::new(NodeInventory::default())))
            .collect()
    }

    #[test]
    fn a_queue_found_in_use_where_this_object_never_wrote_is_adopted_and_one_it_created_is_not() {
        let old = vec![
            node("c1", Outcome::Applied, Some("queue.apply")),
            node("c2", Outcome::Already, None),
        ];
        let used = |_: &NodeInventory| {
            Some(InUse {
                messages: 4,
                consumers: 0,
            })
        };
        let adopted = adopted_nodes(&old, None, &inventories(&["c1", "c2", "c3"]), used);
        let nodes: Vec<&str> = adopted.iter().map(|a| a.node.as_str()).collect();
        assert_eq!(nodes, ["c2", "c3"]);
        assert_eq!(adopted[0].message_count, 4);
    }

    #[test]
    fn an_empty_unused_queue_is_not_adopted_and_a_recorded_node_is_not_recorded_twice() {
        let unused = |_: &NodeInventory| Some(InUse::default());
        assert!(adopted_nodes(&[], None, &inventories(&["c1"]), unused).is_empty());
        let record = merged(
            None,
            vec![AdoptedNode {
                node: "c1".into(),
                ..Default::default()
            }],
            vec![],
            "t1",
            "queue q",
        );
        let used = |_: &NodeInventory| {
            Some(InUse {
                messages: 0,
                consumers: 1,
            })
        };
        assert!(adopted_nodes(&[], record.as_ref(), &inventories(&["c1"]), used).is_empty());
    }

    #[test]
    fn fields_changed_back_on_a_node_that_matched_this_generation_are_another_writer() {
        let old = vec![
            node("c1", Outcome::Applied, Some("queue.apply")),
            node("c2", Outcome::SkippedNotLive, None),
            node("c3", Outcome::Already, None),
        ];
        let planned = vec![
            update("c1", &["filter-string"]),
            update("c2", &["filter-string"]),
            update("c3", &[]),
        ];
        let w = other_writer_nodes(&old, &planned, true, "t2");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].node, "c1");
        assert_eq!(w[0].undone, "queue.apply (audit #7)");
        // A spec change explains the difference: no evidence.
        assert!(other_writer_nodes(&old, &planned, false, "t2").is_empty());
    }

    #[test]
    fn a_plain_delete_releases_what_is_not_owned_unless_the_shown_confirmation_is_given() {
        assert_eq!(delete_verdict(None, None), DeleteVerdict::Destroy);
        let record = merged(
            None,
            vec![AdoptedNode {
                node: "c1".into(),
                message_count: 12,
                consumer_count: 0,
            }],
            vec![],
            "t1",
            "queue q",
        )
        .expect("record");
        assert!(matches!(
            delete_verdict(Some(&record), None),
            DeleteVerdict::Release { .. }
        ));
        assert!(matches!(
            delete_verdict(Some(&record), Some("yes")),
            DeleteVerdict::Release { .. }
        ));
        assert_eq!(
            delete_verdict(Some(&record), Some(&record.confirmation)),
            DeleteVerdict::Destroy
        );
        let DeleteVerdict::Release { evidence, .. } = delete_verdict(Some(&record), None) else {
            unreachable!()
        };
        assert!(evidence.contains("c1 (12 message(s)"), "{evidence}");
    }
}
