//! What a ConnectionClose reads from the broker (ADR-0057 D3, D6): the target as the broker
//! reports it now, and an address close's preview. Reads only: nothing here writes.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::api::connection_close::{CloseTarget, NodeConnections, TargetSnapshot};
use crate::broker::management::ListKind;
use crate::broker::{BrokerError, BrokerManagement};
use crate::topology::Topology;

fn s(v: &Value, k: &str) -> Option<String> {
    match v.get(k)? {
        Value::String(x) if !x.is_empty() => Some(x.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn n(v: &Value, k: &str) -> Option<u64> {
    match v.get(k)? {
        Value::Number(x) => x.as_u64(),
        Value::String(x) => x.parse().ok(),
        _ => None,
    }
}

/// The connection a target belongs to (consumer/session → connection); None when the broker
/// does not report the target as given.
async fn connection_of(m: &BrokerManagement, t: &CloseTarget) -> Result<Option<String>, BrokerError> {
    Ok(match (&t.connection_id, &t.session_id, &t.consumer_id) {
        (Some(c), None, None) => Some(c.clone()),
        (Some(c), Some(sid), None) => {
            let sessions = m.list(ListKind::Sessions, "id", sid).await?;
            sessions
                .first()
                .filter(|row| s(row, "connectionID").as_deref() == Some(c.as_str()))
                .map(|_| c.clone())
        }
        (None, Some(sid), Some(cid)) => {
            let r = m
                .list_many(&[(ListKind::Consumers, "id", cid), (ListKind::Sessions, "id", sid)])
                .await?;
            let consumer_here = r[0]
                .iter()
                .any(|c| s(c, "session").as_deref() == Some(sid.as_str()));
            r[1].first()
                .and_then(|row| s(row, "connectionID"))
                .filter(|_| consumer_here)
        }
        _ => None,
    })
}

/// What the broker reports now about the target; None when it is gone.
pub async fn target(m: &BrokerManagement, t: &CloseTarget) -> Result<Option<TargetSnapshot>, BrokerError> {
    let Some(connection_id) = connection_of(m, t).await? else {
        return Ok(None);
    };
    let r = m
        .list_many(&[
            (ListKind::Connections, "connectionID", &connection_id),
            (ListKind::Sessions, "connectionID", &connection_id),
        ])
        .await?;
    let Some(conn) = r[0].first() else { return Ok(None) };
    let sessions: Vec<String> = r[1].iter().filter_map(|row| s(row, "id")).collect();
    let queries: Vec<(ListKind, &str, &str)> = sessions
        .iter()
        .map(|sid| (ListKind::Consumers, "session", sid.as_str()))
        .collect();
    let consumers: Vec<Value> = if queries.is_empty() {
        vec![]
    } else {
        m.list_many(&queries).await?.into_iter().flatten().collect()
    };
    // The in-flight messages the close hands back: of the closed consumer, session or connection.
    let in_flight = consumers
        .iter()
        .filter(|c| match (&t.session_id, &t.consumer_id) {
            (Some(sid), Some(cid)) => {
                s(c, "session").as_deref() == Some(sid) && s(c, "id").as_deref() == Some(cid)
            }
            (Some(sid), None) => s(c, "session").as_deref() == Some(sid),
            _ => true,
        })
        .map(|c| n(c, "messagesInTransit"))
        .sum::<Option<u64>>();
    Ok(Some(TargetSnapshot {
        client_id: s(conn, "clientID"),
        remote_address: s(conn, "remoteAddress"),
        users: s(conn, "users")
            .map(|u| u.split(',').map(str::to_string).collect())
            .unwrap_or_default(),
        protocol: s(conn, "protocol"),
        session_count: n(conn, "sessionCount").unwrap_or(sessions.len() as u64),
        consumer_count: consumers.len() as u64,
        in_flight_messages: in_flight,
        per_node: vec![],
    }))
}

/// A node whose consumers an address close's preview could not read.
#[derive(Debug, thiserror::Error)]
#[error("{node}: {source}")]
pub struct PreviewFailed {
    pub node: String,
    #[source]
    pub source: BrokerError,
}

/// D6: preview per node, the consumer connections each would close. The cap counts
/// connections — distinct ones, over every page. A 2.40 consumer row names no connection; its
/// remote address (the client's socket) is one per connection.
pub async fn address_preview(
    topology: &Topology,
    address: &str,
) -> Result<Vec<NodeConnections>, PreviewFailed> {
    let mut per_node = vec![];
    for node in topology.live_nodes() {
        let Some(m) = &node.active else { continue };
        let consumers = m
            .list_all(ListKind::Consumers, "address", address)
            .await
            .map_err(|source| PreviewFailed {
                node: node.node_id.clone(),
                source,
            })?;
        let connections: BTreeSet<String> = consumers
            .iter()
            .filter_map(|c| s(c, "remoteAddress").or_else(|| s(c, "session")))
            .collect();
        per_node.push(NodeConnections {
            node: node.node_id.clone(),
            connections: connections.len() as u64,
        });
    }
    Ok(per_node)
}
