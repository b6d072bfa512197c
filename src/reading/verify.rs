//! `kubectl artemis capture verify ROW --subscription S` (issue 48, ADR-0062 D4): is the
//! message a captured row copied still on the brokers, and where? Every live node of the row's
//! cluster is asked for the message by its id on each queue bound to the row's address. The
//! brokers are reached with the caller's own authority — their kubeconfig reads the
//! ArtemisCluster and its Secrets — never the operator's.

use std::io::Write;

use clap::Args;
use kube::Api;

use super::answers::one_subscription;
use super::{ReadError, Source};
use crate::api::{ArtemisCluster, CAPTURE_PREFIX};
use crate::broker::messages::MessagePresence;
use crate::reading::render::{Document, Printer, QueueAnswer, Verification};
use crate::store::Store;
use crate::store::reading::StoredMessage;
use crate::topology::{self, Topology};

/// Is a captured message still on the brokers? Asks every live node of its cluster, with your
/// kubeconfig's authority (you must be allowed to read the cluster's credentials Secret).
#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub source: Source,
    /// The row (the ROW column of `capture search` and `tail`).
    pub row: i64,
    /// The capture subscription the row belongs to.
    #[arg(long)]
    pub subscription: String,
}

/// Why verify could not ask the brokers at all.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(
        "subscription {subscription} has no row {row}: check the ROW column of `kubectl artemis capture search`"
    )]
    NoSuchRow { subscription: String, row: i64 },
    #[error("the kubeconfig gives no client: {0}")]
    NoKubeClient(#[source] kube::Error),
    #[error("reading ArtemisCluster {cluster} with your kubeconfig: {source}")]
    Cluster {
        cluster: String,
        #[source]
        source: kube::Error,
    },
    #[error("reaching ArtemisCluster {cluster} with your authority: {message}")]
    Access { cluster: String, message: String },
}

pub async fn verify<W: Write>(a: VerifyArgs, out: W) -> Result<(), ReadError> {
    let store = a.source.store().await?;
    let v = verification(&store, &a.source.namespace(), &a.subscription, a.row).await?;
    Ok(Printer::new(out, a.source.output).print(&Document::Verification(&v))?)
}

/// Where the message a captured row copied is now: every live node's answer, and the verdict.
pub async fn verification(
    store: &Store,
    ns: &str,
    subscription: &str,
    row_id: i64,
) -> Result<Verification, ReadError> {
    let sub = one_subscription(store, ns, subscription).await?;
    let row = store
        .captured_row(&sub.cluster, &sub.subscription, row_id)
        .await?
        .ok_or(VerifyError::NoSuchRow {
            subscription: subscription.to_string(),
            row: row_id,
        })?;
    let mut v = Verification {
        row: row_id,
        address: row.original_address.clone(),
        message_id: row.message_id.clone(),
        answers: vec![],
        verdict: String::new(),
    };
    match row.message_id.as_deref() {
        // ADR-0062 D4: offered, disabled, with the reason.
        None => v.verdict = NO_ID.into(),
        Some(id) => {
            let topology = cluster_topology(&sub.cluster).await?;
            v.answers = ask_every_node(&topology, &row.original_address, id).await;
            v.verdict = verdict(&v.answers);
        }
    }
    Ok(v)
}

/// ADR-0062 D4: a row without a message id is offered verify, disabled, with the reason.
const NO_ID: &str = "cannot verify: the message carried no message id (a Core message sent without one, or an AMQP message without message-id), so no broker can be asked for it";

/// `capture search --verify`: each row's verdict, the cluster polled once for the page (every
/// row of a search is of one cluster), with the caller's authority as `verify`.
pub async fn verdicts(cluster: &str, rows: &[StoredMessage]) -> Result<Vec<String>, ReadError> {
    let topology = cluster_topology(cluster).await?;
    let mut verdicts = Vec::with_capacity(rows.len());
    for row in rows {
        verdicts.push(match row.message_id.as_deref() {
            None => NO_ID.to_string(),
            Some(id) => verdict(&ask_every_node(&topology, &row.original_address, id).await),
        });
    }
    Ok(verdicts)
}

/// The row's cluster polled with the caller's kubeconfig (its Secrets read with their RBAC).
async fn cluster_topology(cluster_key: &str) -> Result<Topology, VerifyError> {
    let (ns, name) = cluster_key.split_once('/').unwrap_or(("default", cluster_key));
    let client = kube::Client::try_default()
        .await
        .map_err(VerifyError::NoKubeClient)?;
    let cluster = Api::<ArtemisCluster>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|source| VerifyError::Cluster {
            cluster: cluster_key.to_string(),
            source,
        })?;
    let access = crate::topology::access::resolve_access(
        &client,
        ns,
        &cluster.spec,
        &crate::broker::Registry::standalone(),
    )
    .await
    .map_err(|p| VerifyError::Access {
        cluster: cluster_key.to_string(),
        message: p.message,
    })?;
    Ok(topology::poll(&access, &Default::default()).await)
}

/// Every node's answer for every queue bound to `address` there (capture queues aside).
async fn ask_every_node(topology: &Topology, address: &str, id: &str) -> Vec<QueueAnswer> {
    let mut answers = vec![];
    for n in &topology.nodes {
        let could_not = |why: String| QueueAnswer {
            node: n.node_id.clone(),
            queue: None,
            state: "could-not-ask".into(),
            why: Some(why),
        };
        let (Some(m), Some(inv)) = (&n.active, &n.inventory) else {
            let why = n.not_live_reason.clone().unwrap_or_else(|| "not live".into());
            answers.push(could_not(why));
            continue;
        };
        let queues: Vec<_> = inv
            .queues
            .values()
            .filter(|q| q.address == address && !q.name.starts_with(CAPTURE_PREFIX))
            .collect();
        if queues.is_empty() {
            answers.push(QueueAnswer {
                node: n.node_id.clone(),
                queue: None,
                state: "absent".into(),
                why: Some(format!("no queue is bound to {address} on this node")),
            });
        }
        for q in queues {
            let found = m.find_message((&q.address, &q.routing_type, &q.name), id).await;
            answers.push(match found {
                Ok(p) => QueueAnswer {
                    node: n.node_id.clone(),
                    queue: Some(q.name.clone()),
                    state: presence_word(p).into(),
                    why: None,
                },
                Err(e) => QueueAnswer {
                    queue: Some(q.name.clone()),
                    ..could_not(e.to_string())
                },
            });
        }
    }
    answers
}

fn presence_word(p: MessagePresence) -> &'static str {
    match p {
        MessagePresence::Waiting => "waiting",
        MessagePresence::Delivering => "delivering",
        MessagePresence::Scheduled => "scheduled",
        MessagePresence::Absent => "absent",
    }
}

/// What the answers allow one to say: where it is, or that no live node that answered has it
/// — never "consumed" as a fact.
fn verdict(answers: &[QueueAnswer]) -> String {
    let found: Vec<String> = answers
        .iter()
        .filter(|a| matches!(a.state.as_str(), "waiting" | "delivering" | "scheduled"))
        .map(|a| {
            format!(
                "{} on {} ({})",
                a.queue.as_deref().unwrap_or("?"),
                a.node,
                a.state
            )
        })
        .collect();
    let unasked = answers.iter().filter(|a| a.state == "could-not-ask").count();
    match (found.is_empty(), unasked) {
        (false, _) => format!("present: {}", found.join(", ")),
        (true, 0) => {
            "not found on any live node: consumed, expired, moved, or on a node that was not live".into()
        }
        (true, n) => {
            format!("not found on the nodes that answered; {n} could not be asked (see why): it may be there")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(state: &str) -> QueueAnswer {
        QueueAnswer {
            node: "n1".into(),
            queue: Some("q".into()),
            state: state.into(),
            why: None,
        }
    }

    /// Issue 48: "not found" is never "consumed" as a fact, and a node that could not be asked
    /// keeps the answer open.
    #[test]
    fn the_verdict_says_only_what_the_answers_show() {
        assert!(verdict(&[answer("waiting")]).starts_with("present: q on n1 (waiting)"));
        let none = verdict(&[answer("absent")]);
        assert!(
            none.starts_with("not found on any live node: consumed, expired, moved"),
            "{none}"
        );
        let open = verdict(&[answer("absent"), answer("could-not-ask")]);
        assert!(
            open.contains("1 could not be asked") && open.contains("it may be there"),
            "{open}"
        );
    }
}
