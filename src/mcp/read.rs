//! The read tools: always listed, they change nothing. The objects are read with the caller's
//! kubeconfig; captured messages and the audit log from the operator's database, by the same
//! functions `kubectl artemis capture …` and `audit` print (`crate::reading::answers`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kube::Api;
use kube::api::ListParams;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::objects::{cluster_doc, divert_doc, queue_doc};
use super::{Studio, ToolError, answer};
use crate::api::{ArtemisCluster, ArtemisDivert, ArtemisQueue};
use crate::reading::render::Document;
use crate::reading::{AuditSelection, MessageFilter, RequestsQuery, SearchQuery, TimeRange, answers};

/// The most rows a bounded tail returns.
const MOST_TAIL_ROWS: i64 = 100;
/// The most rows a search page returns.
const MOST_SEARCH_ROWS: i64 = 500;

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct InNamespace {
    /// Namespace (default: the server's, from -n or the kubeconfig context).
    pub namespace: Option<String>,
    /// Only this one (by name).
    pub name: Option<String>,
    /// Only the objects of this ArtemisCluster (queues and diverts).
    pub cluster: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Named {
    /// Namespace (default: the server's).
    pub namespace: Option<String>,
    /// The object's metadata.name.
    pub name: String,
}

/// A time range: `since` (e.g. 15m, 2h; default 1h), or `from`/`to` (RFC 3339).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct Range {
    /// How far back from now, e.g. 15m, 2h, 1day. Default 1h.
    pub since: Option<String>,
    /// Start (RFC 3339, e.g. 2026-12-01T09:00:00Z).
    pub from: Option<String>,
    /// End (RFC 3339). Default: now.
    pub to: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct Messages {
    /// Namespace (default: the server's).
    pub namespace: Option<String>,
    /// The ArtemisCaptureSubscription whose rows to read.
    pub subscription: Option<String>,
    /// … or every subscription of this ArtemisCluster (search and coverage).
    pub cluster: Option<String>,
    /// Only messages routed to this address.
    pub address: Option<String>,
    /// Only messages whose application properties equal these values (all of them).
    #[serde(rename = "where")]
    pub properties: Option<BTreeMap<String, String>>,
    /// Only messages whose text body contains all these words.
    pub text: Option<String>,
    #[serde(flatten)]
    pub range: Range,
    /// Most rows (search: default 50, at most 500; tail: default 20, at most 100).
    pub limit: Option<i64>,
    /// Search's next page: rows after this row (the previous page's `nextAfter`).
    pub after: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Requests {
    /// Namespace (default: the server's).
    pub namespace: Option<String>,
    /// The address requests are sent to.
    pub address: String,
    /// The ArtemisCluster (default: the namespace's only one with captured rows).
    pub cluster: Option<String>,
    #[serde(flatten)]
    pub range: Range,
    /// Most requests (default 500).
    pub limit: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Verify {
    /// Namespace (default: the server's).
    pub namespace: Option<String>,
    /// The capture subscription the row belongs to.
    pub subscription: String,
    /// The row (`row` of a search or tail answer).
    pub row: i64,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct Audit {
    /// Namespace (default: the server's).
    pub namespace: Option<String>,
    /// The object, `<kind>/<name>`: kind is queue, divert, cluster, capture, connectionclose or replay.
    pub object: Option<String>,
    /// … or every command on this ArtemisCluster's brokers.
    pub cluster: Option<String>,
    /// Most commands, newest first (default 20).
    pub limit: Option<i64>,
}

impl Range {
    fn time_range(&self) -> Result<TimeRange, ToolError> {
        let time = |t: &Option<String>| -> Result<Option<DateTime<Utc>>, ToolError> {
            t.as_deref()
                .map(|given| {
                    DateTime::parse_from_rfc3339(given)
                        .map(|t| t.with_timezone(&Utc))
                        .map_err(|source| ToolError::Time {
                            given: given.into(),
                            source,
                        })
                })
                .transpose()
        };
        let since = self
            .since
            .as_deref()
            .map(|given| {
                humantime::parse_duration(given).map_err(|source| ToolError::Since {
                    given: given.into(),
                    source,
                })
            })
            .transpose()?;
        Ok(TimeRange {
            since: since.filter(|_| self.from.is_none()),
            from: time(&self.from)?,
            to: time(&self.to)?,
        })
    }
}

impl Messages {
    fn filter(&self) -> MessageFilter {
        MessageFilter {
            address: self.address.clone(),
            properties: self.properties.clone().unwrap_or_default().into_iter().collect(),
            text: self.text.clone(),
        }
    }
}

/// Documents as `-o json` prints them (each with its `kind`).
fn documents<'a>(docs: impl IntoIterator<Item = Document<'a>>) -> Vec<Value> {
    docs.into_iter().map(|d| json!(d)).collect()
}

#[tool_router(router = read_tools, vis = "pub(super)")]
impl Studio {
    #[tool(
        description = "ArtemisClusters and their logical nodes as the operator last polled them: which are live (a primary and its replicating backup are one node), the endpoints that did not answer, whether management writes are permitted (from evidence only), and the bulk and message-loss caps. Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn list_clusters(
        &self,
        Parameters(p): Parameters<InNamespace>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.clusters(p).await)
    }

    #[tool(
        description = "ArtemisQueues with their per-node outcome (WOULD_APPLY, APPLIED, ALREADY, SKIPPED_NOT_LIVE, FAILED with the refusal and next action), Ready, and whether the operator has acted on the latest spec (observedGeneration). Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn list_queues(&self, Parameters(p): Parameters<InNamespace>) -> Result<CallToolResult, ErrorData> {
        answer(self.queues(p).await)
    }

    #[tool(
        description = "One ArtemisQueue in full: spec, every node's outcome, each node's delivery state, why it is not owned (if so), and its delete preview (status.deletePreview: the messages a delete would destroy per node, consumers, the diverts removed with it, the bulk-cap verdict). Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn get_queue(&self, Parameters(p): Parameters<Named>) -> Result<CallToolResult, ErrorData> {
        answer(self.queue(p).await)
    }

    #[tool(
        description = "ArtemisDiverts with their per-node outcome and Ready. Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn list_diverts(
        &self,
        Parameters(p): Parameters<InNamespace>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.diverts(p).await)
    }

    #[tool(
        description = "Search captured (and sampled) messages by subscription or cluster, address, application properties (`where`) and text, in a time range; oldest first, one page (`nextAfter` asks for the next). Ends with the coverage of the window: a captured row claims only that the message was routed to its address, and the coverage says where capture was complete, had gaps or lost messages. Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn capture_search(&self, Parameters(p): Parameters<Messages>) -> Result<CallToolResult, ErrorData> {
        answer(self.search(p).await)
    }

    #[tool(
        description = "A bounded tail: the newest rows of one capture subscription (at most 100, never a stream), oldest first, with the coverage from the oldest of them to now. Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn capture_tail(&self, Parameters(p): Parameters<Messages>) -> Result<CallToolResult, ErrorData> {
        answer(self.tail(p).await)
    }

    #[tool(
        description = "Request-reply pairs on an address: REPLIED with the latency, NO_REPLY_CAPTURED (check the reply address's coverage), or REPLY_NOT_CAPTURABLE (a temporary reply queue cannot be captured). Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn capture_requests(
        &self,
        Parameters(p): Parameters<Requests>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.requests(p).await)
    }

    #[tool(
        description = "Capture coverage and estimated loss over a time range, per tap (subscription, node, address): COMPLETE, GAPS (broker restart, failover, silent drain), LOSSY (cause and count) or NOT_DRAINED, and one statement. Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn capture_coverage(
        &self,
        Parameters(p): Parameters<Messages>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.coverage(p).await)
    }

    #[tool(
        description = "Is the message a captured row copied still on the brokers, and where? Asks every live node of its cluster, on every queue bound to its address, by message id (waiting, delivering, scheduled, absent, or could-not-ask with why). 'Not found on any live node' means consumed, expired, moved or on a node that was not live, never 'consumed' as a fact. Uses your kubeconfig's authority to read the cluster's credentials Secret; a miss scans the queue on the broker (nothing is transferred, the broker's management lock is held while it runs). Changes nothing.",
        annotations(read_only_hint = true)
    )]
    async fn capture_verify(&self, Parameters(p): Parameters<Verify>) -> Result<CallToolResult, ErrorData> {
        answer(self.verify(p).await)
    }

    #[tool(
        description = "The broker commands the operator issued for an object (`queue/orders`) or a whole cluster, newest first: command, target, actor (who last wrote the spec; for a change made through this server, the Kubernetes user and the MCP client), verdict and every node's outcome. Reads only.",
        annotations(read_only_hint = true)
    )]
    async fn audit(&self, Parameters(p): Parameters<Audit>) -> Result<CallToolResult, ErrorData> {
        answer(self.audit_rows(p).await)
    }
}

impl Studio {
    fn list_params(p: &InNamespace) -> ListParams {
        match &p.name {
            Some(n) => ListParams::default().fields(&format!("metadata.name={n}")),
            None => ListParams::default(),
        }
    }

    async fn clusters(&self, p: InNamespace) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let api: Api<ArtemisCluster> = Api::namespaced(self.kube().await?, &ns);
        let list = api
            .list(&Self::list_params(&p))
            .await
            .map_err(|source| ToolError::Kube {
                what: format!("listing ArtemisClusters in {ns}"),
                source,
            })?;
        let clusters: Vec<Value> = list.items.iter().map(cluster_doc).collect();
        Ok(json!({"namespace": ns, "clusters": clusters}))
    }

    async fn queues(&self, p: InNamespace) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let api: Api<ArtemisQueue> = Api::namespaced(self.kube().await?, &ns);
        let list = api
            .list(&Self::list_params(&p))
            .await
            .map_err(|source| ToolError::Kube {
                what: format!("listing ArtemisQueues in {ns}"),
                source,
            })?;
        let queues: Vec<Value> = list
            .items
            .iter()
            .filter(|q| p.cluster.as_ref().is_none_or(|c| &q.spec.cluster_ref.name == c))
            .map(|q| queue_doc(q, false))
            .collect();
        Ok(json!({"namespace": ns, "queues": queues}))
    }

    async fn queue(&self, p: Named) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let api: Api<ArtemisQueue> = Api::namespaced(self.kube().await?, &ns);
        let q = api.get_opt(&p.name).await.map_err(|source| ToolError::Kube {
            what: format!("reading ArtemisQueue {ns}/{}", p.name),
            source,
        })?;
        let q = q.ok_or(ToolError::NotFound {
            kind: "ArtemisQueue",
            namespace: ns,
            name: p.name,
        })?;
        Ok(queue_doc(&q, true))
    }

    async fn diverts(&self, p: InNamespace) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let api: Api<ArtemisDivert> = Api::namespaced(self.kube().await?, &ns);
        let list = api
            .list(&Self::list_params(&p))
            .await
            .map_err(|source| ToolError::Kube {
                what: format!("listing ArtemisDiverts in {ns}"),
                source,
            })?;
        let diverts: Vec<Value> = list
            .items
            .iter()
            .filter(|d| p.cluster.as_ref().is_none_or(|c| &d.spec.cluster_ref.name == c))
            .map(|d| divert_doc(d, p.name.is_some()))
            .collect();
        Ok(json!({"namespace": ns, "diverts": diverts}))
    }

    async fn search(&self, p: Messages) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let query = SearchQuery {
            subscription: p.subscription.clone(),
            cluster: p.cluster.clone(),
            filter: p.filter(),
            range: p.range.time_range()?,
            limit: p.limit.unwrap_or(50).clamp(1, MOST_SEARCH_ROWS),
            after: p.after,
        };
        let page = answers::search_page(self.store().await?, &ns, &query).await?;
        Ok(json!({
            "messages": documents(page.rows.iter().map(answers::message_doc)),
            "nextAfter": page.next_after,
            "coverage": Document::Coverage(page.coverage),
        }))
    }

    async fn tail(&self, p: Messages) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let subscription = p
            .subscription
            .clone()
            .ok_or(crate::reading::ReadError::NoSubscriptionOrCluster)?;
        let count = p.limit.unwrap_or(20).clamp(1, MOST_TAIL_ROWS);
        let last = answers::last_rows(self.store().await?, &ns, &subscription, &p.filter(), count).await?;
        Ok(json!({
            "subscription": last.subscription,
            "messages": documents(last.rows.iter().map(answers::message_doc)),
            "coverage": Document::Coverage(last.coverage),
        }))
    }

    async fn requests(&self, p: Requests) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let query = RequestsQuery {
            address: p.address,
            cluster: p.cluster,
            range: p.range.time_range()?,
            limit: p.limit.unwrap_or(500).clamp(1, 100_000),
        };
        let (exchanges, coverage) = answers::exchanges(self.store().await?, &ns, &query).await?;
        Ok(json!({
            "exchanges": documents(exchanges.iter().map(Document::Exchange)),
            "coverage": Document::Coverage(coverage),
        }))
    }

    async fn coverage(&self, p: Messages) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let store = self.store().await?;
        let range = p.range.time_range()?;
        let doc = answers::coverage(
            store,
            &ns,
            p.subscription.as_deref(),
            p.cluster.as_deref(),
            &range,
        )
        .await?;
        Ok(json!(Document::Coverage(doc)))
    }

    async fn verify(&self, p: Verify) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let store = self.store().await?;
        let v = crate::reading::verify::verification(store, &ns, &p.subscription, p.row).await?;
        Ok(json!(Document::Verification(&v)))
    }

    async fn audit_rows(&self, p: Audit) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let query = AuditSelection {
            object: p.object,
            cluster: p.cluster,
            limit: p.limit.unwrap_or(20).clamp(1, 10_000),
        };
        let rows = answers::audit_rows(self.store().await?, &ns, &query).await?;
        Ok(json!({"commands": documents(rows.iter().map(Document::Audit))}))
    }
}
