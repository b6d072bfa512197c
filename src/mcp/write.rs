//! The write tools, listed only with `--allow-writes`. Every write is two steps through the
//! object a person would write: a preview (the object written with `spec.dryRun: true`, or a
//! delete's blast radius read from `status.deletePreview`) that returns the operator's per-node
//! outcomes and a confirmation token, then the apply that token names (`spec.dryRun: false`
//! patched, or the object deleted). No broker is called from here: the operator acts, reports
//! per node and writes the audit row.

use std::collections::BTreeMap;
use std::time::Instant;

use kube::api::{DeleteParams, Patch, Preconditions};
use kube::{Api, Resource, ResourceExt};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, schemars, tool, tool_router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::objects::{check_queue_fields, kube_user, queue_doc, reported, wait_for};
use super::token::{Preview, Step};
use super::{Studio, ToolError, answer, client_of};
use crate::api::queue::DeletePreview;
use crate::api::{
    ArtemisQueue, DeletionPolicy, MCP_CLIENT_ANNOTATION, MCP_MANAGER, MCP_USER_ANNOTATION, Outcome,
};
use crate::controllers::conditions;

/// How often a write is tried again when the object changed between its read and its write.
const TRIES: u32 = 5;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct QueueChange {
    /// Namespace (default: the server's).
    pub namespace: Option<String>,
    /// The ArtemisQueue's metadata.name (the broker queue's name unless spec.name says another).
    pub name: String,
    /// The ArtemisCluster it acts on (needed to create it; immutable afterwards).
    pub cluster: Option<String>,
    /// ArtemisQueue spec fields to set, as `kubectl explain artemisqueue.spec` names them
    /// (e.g. {"address": "orders", "routingType": "ANYCAST", "filter": "region = 'eu'",
    /// "maxConsumers": 10}). dryRun is set by the tools.
    pub spec: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct QueueDelete {
    /// Namespace (default: the server's).
    pub namespace: Option<String>,
    /// The ArtemisQueue's metadata.name.
    pub name: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Confirmation {
    /// The confirmationToken the preview returned.
    pub token: String,
}

#[tool_router(router = write_tools, vis = "pub(super)")]
impl Studio {
    #[tool(
        description = "Step 1 of creating or changing a queue: writes the ArtemisQueue with spec.dryRun: true (creating it if it does not exist), waits for the operator to report, and returns what each live node WOULD_APPLY (and what would change there), the blast radius and a confirmationToken. Nothing is written to any broker. While the object is in dry run the operator does not keep its queue on the brokers (no repair) until apply_queue. Show the outcome to the user before applying.",
        annotations(destructive_hint = false, idempotent_hint = true)
    )]
    async fn preview_queue(
        &self,
        Parameters(p): Parameters<QueueChange>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.preview_queue_change(p, &client_of(&ctx)).await)
    }

    #[tool(
        description = "Step 2: applies the queue preview_queue showed, by patching spec.dryRun: false on the same object. The operator then creates or updates the queue on every live node (a node that becomes live later gets it), reports per node and writes one audit row naming you and this MCP client. Refused when the token is unknown, or stale (the object changed since the preview).",
        annotations(destructive_hint = false)
    )]
    async fn apply_queue(
        &self,
        Parameters(p): Parameters<Confirmation>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.apply_queue_change(p, &client_of(&ctx)).await)
    }

    #[tool(
        description = "Step 1 of deleting a queue: changes nothing, and returns the blast radius the operator shows for a delete (status.deletePreview): per node the messages a delete DESTROYS, the consumers it would disconnect or be refused by, the diverts removed with it, the bulk-cap verdict, and whether the delete would leave the queue on the brokers (Retain, dry run, paused, not owned); with a confirmationToken.",
        annotations(read_only_hint = true)
    )]
    async fn preview_queue_delete(
        &self,
        Parameters(p): Parameters<QueueDelete>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.preview_delete(p).await)
    }

    #[tool(
        description = "Step 2: deletes the ArtemisQueue preview_queue_delete showed. A delete DESTROYS the queue's messages on every live node: it sets spec.deletion.allowMessageLoss to the message count the preview showed (the most it may destroy; the operator refuses with BulkCapExceeded if the queue holds more by then, unless the cluster's messageLossCap is higher), then deletes the object. Refused when the token is unknown or stale (the object changed since the preview).",
        annotations(destructive_hint = true)
    )]
    async fn apply_queue_delete(
        &self,
        Parameters(p): Parameters<Confirmation>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.apply_delete(p, &client_of(&ctx)).await)
    }
}

/// The merge patch of `annotations` (and `spec`) on the object read at `resource_version`: the
/// API server refuses it (409) if the object changed since that read.
fn locked_patch(
    resource_version: Option<String>,
    annotations: &BTreeMap<String, String>,
    spec: Value,
) -> Value {
    json!({
        "metadata": {"resourceVersion": resource_version, "annotations": annotations},
        "spec": spec,
    })
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// What `o` shows now, as a token binds it (a delete's count or a replay's address is the
/// caller's to add).
pub(super) fn shown_now<K: Resource>(o: &K, step: Step) -> Preview {
    Preview {
        step,
        namespace: o.namespace().unwrap_or_default(),
        name: o.name_any(),
        uid: o.uid().unwrap_or_default(),
        generation: o.meta().generation.unwrap_or_default(),
        resource_version: o.resource_version().unwrap_or_default(),
        messages: 0,
        address: String::new(),
    }
}

impl Studio {
    async fn queues_in(&self, ns: &str) -> Result<Api<ArtemisQueue>, ToolError> {
        Ok(Api::namespaced(self.kube().await?, ns))
    }

    /// The annotations every write carries: the MCP client, and the Kubernetes user.
    pub(super) async fn marks(&self, client: &str) -> Result<BTreeMap<String, String>, ToolError> {
        let kube = self.kube().await?;
        let user = self.shared.user.get_or_init(|| kube_user(&kube)).await;
        Ok(BTreeMap::from([
            (MCP_CLIENT_ANNOTATION.to_string(), client.to_string()),
            (MCP_USER_ANNOTATION.to_string(), user.clone()),
        ]))
    }

    pub(super) fn kube_error(what: String) -> impl FnOnce(kube::Error) -> ToolError {
        move |source| ToolError::Kube { what, source }
    }

    async fn preview_queue_change(&self, p: QueueChange, client: &str) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let api = self.queues_in(&ns).await?;
        let mut spec = p.spec.unwrap_or_default();
        check_queue_fields(&spec)?;
        spec.insert("dryRun".into(), json!(true));
        let marks = self.marks(client).await?;
        let object = format!("ArtemisQueue {ns}/{}", p.name);
        let existing = api
            .get_opt(&p.name)
            .await
            .map_err(Self::kube_error(format!("reading {object}")))?;
        let written = match existing {
            Some(_) => {
                let patch = json!({"metadata": {"annotations": marks}, "spec": spec});
                api.patch(
                    &p.name,
                    &crate::api::patch_params_as(MCP_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(Self::kube_error(format!("writing {object} as a dry run")))?
            }
            None => {
                let cluster = p.cluster.ok_or_else(|| ToolError::NeedsCluster {
                    kind: "ArtemisQueue",
                    namespace: ns.clone(),
                    name: p.name.clone(),
                })?;
                spec.insert("clusterRef".into(), json!({"name": cluster}));
                let q: ArtemisQueue = serde_json::from_value(json!({
                    "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
                    "metadata": {"name": p.name, "annotations": marks}, "spec": spec,
                }))
                .map_err(|source| ToolError::InvalidSpec {
                    kind: "ArtemisQueue",
                    source,
                })?;
                api.create(&crate::api::post_params_as(MCP_MANAGER), &q)
                    .await
                    .map_err(Self::kube_error(format!("creating {object} as a dry run")))?
            }
        };
        self.shown_queue(&api, &written).await
    }

    /// Wait for the operator's report on the written generation; the report and a token.
    async fn shown_queue(&self, api: &Api<ArtemisQueue>, written: &ArtemisQueue) -> Result<Value, ToolError> {
        let name = written.name_any();
        let generation = written.metadata.generation.unwrap_or_default();
        let q = wait_for(api, &name, self.shared.wait, |q| reported(q, generation))
            .await?
            .filter(|q| reported(q, generation) && q.uid() == written.uid());
        let Some(q) = q else {
            let now = api.get_opt(&name).await.ok().flatten();
            return Err(ToolError::NotObserved {
                object: format!("ArtemisQueue {}/{name}", written.namespace().unwrap_or_default()),
                generation,
                seconds: self.shared.wait.as_secs(),
                state: now.map_or_else(|| "gone".into(), |q| queue_doc(&q, false).to_string()),
            });
        };
        let token = self.issue(shown_now(&q, Step::Queue));
        let nodes = q.status.as_ref().map(|s| s.nodes.clone()).unwrap_or_default();
        let count = |o: Outcome| nodes.iter().filter(|n| n.outcome == o).count();
        let mut doc = queue_doc(&q, false);
        doc["blastRadius"] = json!({
            "nodesThatWouldBeWritten": count(Outcome::WouldApply),
            "nodesAlreadyInThatState": count(Outcome::Already),
            "nodesNotLive": count(Outcome::SkippedNotLive),
            "nodesFailing": count(Outcome::Failed),
            "statement": format!(
                "applying writes the queue on {} live node(s) (each node's message says what changes); {} not live get it when they become live; nothing is destroyed",
                count(Outcome::WouldApply), count(Outcome::SkippedNotLive)
            ),
        });
        doc["confirmationToken"] = json!(token);
        doc["next"] = json!(
            "show the per-node outcome to the user; to apply it call apply_queue with this confirmationToken"
        );
        Ok(doc)
    }

    /// A token for `preview`.
    pub(super) fn issue(&self, preview: Preview) -> String {
        let mut previews = match self.shared.previews.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        previews.issue(preview, Instant::now())
    }

    pub(super) fn redeem(&self, token: &str, step: Step) -> Result<Preview, ToolError> {
        let previews = match self.shared.previews.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        Ok(previews.redeem(token, step, Instant::now())?)
    }

    pub(super) fn spend(&self, token: &str) {
        match self.shared.previews.lock() {
            Ok(mut p) => p.spend(token),
            Err(poisoned) => poisoned.into_inner().spend(token),
        }
    }

    /// Patch `spec` onto the previewed object, locked on a read that still shows what the
    /// preview showed (its uid and generation); tried again while only its status changes.
    pub(super) async fn patch_previewed<K>(
        &self,
        api: &Api<K>,
        shown: &Preview,
        marks: &BTreeMap<String, String>,
        spec: Value,
    ) -> Result<K, ToolError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let object = format!("{} {}", K::kind(&()), shown.object());
        for _ in 0..TRIES {
            let now = api
                .get_opt(&shown.name)
                .await
                .map_err(Self::kube_error(format!("reading {object}")))?;
            let Some(now) = now else {
                return Err(super::token::TokenError::Replaced {
                    object: shown.object(),
                }
                .into());
            };
            shown.still_shown(now.uid().as_deref(), now.meta().generation)?;
            let patch = locked_patch(now.resource_version(), marks, spec.clone());
            match api
                .patch(
                    &shown.name,
                    &crate::api::patch_params_as(MCP_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(q) => return Ok(q),
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(Self::kube_error(format!("writing {object}"))(e)),
            }
        }
        Err(ToolError::Contended { object, tries: TRIES })
    }

    async fn apply_queue_change(&self, p: Confirmation, client: &str) -> Result<Value, ToolError> {
        let shown = self.redeem(&p.token, Step::Queue)?;
        let api = self.queues_in(&shown.namespace).await?;
        let marks = self.marks(client).await?;
        let applied = self
            .patch_previewed(&api, &shown, &marks, json!({"dryRun": false}))
            .await?;
        self.spend(&p.token);
        let generation = applied.metadata.generation.unwrap_or_default();
        let q = wait_for(&api, &shown.name, self.shared.wait, |q| reported(q, generation)).await?;
        let mut doc = q.as_ref().map_or_else(|| json!({}), |q| queue_doc(q, false));
        doc["applied"] = json!(true);
        doc["reported"] = json!(q.as_ref().is_some_and(|q| reported(q, generation)));
        doc["next"] = json!(
            "the per-node outcomes above are the operator's report on the applied spec; `audit` with object queue/<name> shows its audit row"
        );
        Ok(doc)
    }
}

/// What a delete would do to the brokers, in one sentence, from the object and its preview.
fn delete_consequence(q: &ArtemisQueue, preview: &DeletePreview) -> String {
    let keeps = if q.spec.deletion.policy == DeletionPolicy::Retain {
        Some("spec.deletion.policy is Retain")
    } else if q.spec.dry_run {
        Some("the object is in dry run (spec.dryRun: true)")
    } else if crate::controllers::is_paused(&q.metadata) {
        Some("the object is paused (artemis-studio.io/paused)")
    } else if q.status.as_ref().is_some_and(|s| s.not_owned.is_some()) {
        Some("the queue is not owned by this object (status.notOwned): a plain delete releases it")
    } else {
        None
    };
    match keeps {
        Some(why) => format!(
            "the delete removes the object only and leaves the queue and its messages on the brokers: {why}"
        ),
        None => format!(
            "the delete DESTROYS the queue on {} live node(s) and the {} message(s) on it (as last read at {}), and removes the diverts listed with it",
            preview.nodes.len(),
            preview.total_messages,
            preview.read_at.as_deref().unwrap_or("the last poll")
        ),
    }
}

impl Studio {
    async fn preview_delete(&self, p: QueueDelete) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let api = self.queues_in(&ns).await?;
        let object = format!("ArtemisQueue {ns}/{}", p.name);
        let q = wait_for(&api, &p.name, self.shared.wait, |q| {
            let generation = q.metadata.generation.unwrap_or_default();
            reported(q, generation) && q.status.as_ref().is_some_and(|s| s.delete_preview.is_some())
        })
        .await?
        .ok_or_else(|| ToolError::NotFound {
            kind: "ArtemisQueue",
            namespace: ns.clone(),
            name: p.name.clone(),
        })?;
        let preview = q
            .status
            .as_ref()
            .and_then(|s| s.delete_preview.clone())
            .ok_or(ToolError::NoDeletePreview { object })?;
        let token = self.issue(Preview {
            messages: preview.total_messages,
            ..shown_now(&q, Step::QueueDelete)
        });
        let per_node: Vec<Value> = preview
            .nodes
            .iter()
            .map(|n| json!({"node": n.node, "messages": n.message_count, "consumers": n.consumer_count}))
            .collect();
        Ok(json!({
            "name": q.name_any(),
            "namespace": ns,
            "generation": q.metadata.generation,
            "consequence": delete_consequence(&q, &preview),
            "totalMessages": preview.total_messages,
            "messagesPerNode": per_node,
            "deletePreview": preview,
            "confirmationToken": token,
            "next": format!(
                "show this to the user; apply_queue_delete with this confirmationToken sets spec.deletion.allowMessageLoss to {} and deletes the object",
                preview.total_messages
            ),
        }))
    }

    async fn apply_delete(&self, p: Confirmation, client: &str) -> Result<Value, ToolError> {
        let shown = self.redeem(&p.token, Step::QueueDelete)?;
        let api = self.queues_in(&shown.namespace).await?;
        let marks = self.marks(client).await?;
        let capped = json!({"deletion": {"allowMessageLoss": shown.messages}});
        let patched = self.patch_previewed(&api, &shown, &marks, capped).await?;
        let confirmed = Preview {
            generation: patched.metadata.generation.unwrap_or_default(),
            ..shown.clone()
        };
        self.delete_confirmed(&api, &confirmed).await?;
        self.spend(&p.token);
        let blocked = |q: &ArtemisQueue| {
            q.status
                .as_ref()
                .is_some_and(|s| conditions::get(&s.conditions, conditions::DELETE_BLOCKED).is_some())
        };
        let q = wait_for(&api, &shown.name, self.shared.wait, blocked).await?;
        Ok(json!({
            "deleted": true,
            "gone": q.is_none(),
            "allowMessageLoss": shown.messages,
            "object": q.as_ref().map(|q| queue_doc(q, false)),
            "next": "the object is gone once every live node's queue is deleted; if it stays, its DeleteBlocked condition says why; `audit` with object queue/<name> shows the delete's row",
        }))
    }

    /// Delete the object, preconditioned on a read that is still the confirmed one.
    async fn delete_confirmed(&self, api: &Api<ArtemisQueue>, shown: &Preview) -> Result<(), ToolError> {
        let object = format!("ArtemisQueue {}", shown.object());
        for _ in 0..TRIES {
            let Some(now) = api
                .get_opt(&shown.name)
                .await
                .map_err(Self::kube_error(format!("reading {object}")))?
            else {
                return Ok(());
            };
            shown.still_shown(now.uid().as_deref(), now.metadata.generation)?;
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: now.uid(),
                    resource_version: now.resource_version(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(&shown.name, &params).await {
                Ok(_) => return Ok(()),
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(Self::kube_error(format!("deleting {object}"))(e)),
            }
        }
        Err(ToolError::Contended { object, tries: TRIES })
    }
}
