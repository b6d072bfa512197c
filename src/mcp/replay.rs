//! The replay write tools, listed with the other write tools (only with `--allow-writes`). Two
//! steps through the object a person would write: `preview_replay` creates a MessageReplay
//! naming a captured row, without `spec.confirm`, and returns the preview the operator shows
//! (what would be sent, where) with a confirmation token; `apply_replay` sets `spec.confirm` to
//! the address that preview showed. The operator then sends, once, and writes the audit row: no
//! broker is called from here.

use kube::{Api, ResourceExt};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::objects::{replay_doc, wait_for};
use super::token::{Preview, Step};
use super::write::{Confirmation, shown_now};
use super::{Studio, ToolError, answer, client_of};
use crate::api::message_replay::{MessageReplay, MessageReplaySpec, ReplayPhase, ReplayPreview};
use crate::api::{ClusterRef, MCP_MANAGER};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReplayRequest {
    /// Namespace (default: the server's).
    pub namespace: Option<String>,
    /// The MessageReplay's metadata.name: a new one (an unconfirmed one with the same row,
    /// node and address is previewed again).
    pub name: String,
    /// The ArtemisCluster the row was captured on; the replay is sent on it.
    pub cluster: String,
    /// The ArtemisCaptureSubscription (in the namespace) that captured the row.
    pub subscription: String,
    /// The captured row: the rowId capture_search or capture_tail gives.
    pub row: i64,
    /// The logical node (broker node ID, or an endpoint URL) to send on. Default: the node
    /// that captured the row.
    pub node: Option<String>,
    /// The address to send to. Default: the address the row was captured from.
    pub address: Option<String>,
}

#[tool_router(router = replay_tools, vis = "pub(super)")]
impl Studio {
    #[tool(
        description = "Step 1 of sending a captured message again: creates a MessageReplay naming the captured row (unconfirmed: nothing is sent by this step), waits for the operator's preview and returns what apply_replay would send — the node, the address, the body's kind and size, every property as the broker will hold it, whether the body was truncated at capture — its consequence, and a confirmationToken. Applying SENDS A NEW MESSAGE (a new message id) to that address, where running applications consume it as any other message: once, never retried, never taken back. A row the operator refuses (body truncated or changed at capture, a sampled row, a body the broker cannot send) is answered with why, and no token. Show the preview to the user before applying.",
        annotations(destructive_hint = false, idempotent_hint = false)
    )]
    async fn preview_replay(
        &self,
        Parameters(p): Parameters<ReplayRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.preview_replay_of(p, &client_of(&ctx)).await)
    }

    #[tool(
        description = "Step 2: confirms the replay preview_replay showed, by setting spec.confirm to the previewed address on the same MessageReplay. The operator then SENDS ONE NEW MESSAGE (the captured body and properties, a new message id) to that address on that node — applications consuming it receive it as any other message — once, never retried, and writes one audit row naming you and this MCP client. Returns Completed with the broker's new message id, or Failed with why. Refused when the token is unknown, for another step, or stale (the object changed since the preview).",
        annotations(destructive_hint = false, idempotent_hint = false)
    )]
    async fn apply_replay(
        &self,
        Parameters(p): Parameters<Confirmation>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(self.apply_replay_of(p, &client_of(&ctx)).await)
    }
}

/// The operator has shown what the replay's current spec would send: the preview to confirm,
/// or its refusal. (Completed and Sending count too: someone else confirmed it first.)
fn shown(r: &MessageReplay) -> bool {
    let Some(s) = r.status.as_ref() else {
        return false;
    };
    let generation = r.metadata.generation;
    s.observed_generation == generation
        && match s.phase {
            ReplayPhase::AwaitingConfirmation => s.preview.is_some() && s.shown_generation == generation,
            ReplayPhase::Pending => false,
            ReplayPhase::Sending | ReplayPhase::Completed | ReplayPhase::Failed => true,
        }
}

fn finished(r: &MessageReplay) -> bool {
    r.status
        .as_ref()
        .is_some_and(|s| matches!(s.phase, ReplayPhase::Completed | ReplayPhase::Failed))
}

/// Why an existing MessageReplay is not the one asked for (another row, node or address, or
/// already confirmed), if it is not.
fn differs(existing: &MessageReplay, wanted: &MessageReplaySpec) -> Option<String> {
    let e = &existing.spec;
    if e.confirm.is_some() {
        return Some("and is already confirmed (spec.confirm is set)".into());
    }
    let same = e.cluster_ref == wanted.cluster_ref
        && e.subscription == wanted.subscription
        && e.row == wanted.row
        && e.node == wanted.node
        && e.address == wanted.address;
    (!same).then(|| {
        format!(
            "for another replay (cluster {}, subscription {}, row {}, node {}, address {})",
            e.cluster_ref.name,
            e.subscription,
            e.row,
            e.node.as_deref().unwrap_or("as captured"),
            e.address.as_deref().unwrap_or("as captured")
        )
    })
}

/// What confirming does, in plain words.
fn consequence(p: &ReplayPreview) -> String {
    format!(
        "apply_replay SENDS one new message ({} body, {} bytes, {} properties, a new message id) to address {} on node {}: the applications consuming {} receive it as any other message. It is sent once, never retried, and cannot be taken back. Nothing has been sent yet.",
        p.body,
        p.body_bytes,
        p.properties.len(),
        p.address,
        p.node,
        p.address
    )
}

impl Studio {
    async fn preview_replay_of(&self, p: ReplayRequest, client: &str) -> Result<Value, ToolError> {
        let ns = self.namespace(p.namespace.as_deref());
        let api: Api<MessageReplay> = Api::namespaced(self.kube().await?, &ns);
        let object = format!("MessageReplay {ns}/{}", p.name);
        let wanted = MessageReplaySpec {
            cluster_ref: ClusterRef { name: p.cluster },
            subscription: p.subscription,
            row: p.row,
            node: p.node,
            address: p.address,
            confirm: None,
            ttl_seconds_after_finished: None,
        };
        let mut replay = MessageReplay::new(&p.name, wanted.clone());
        replay.metadata.annotations = Some(self.marks(client).await?);
        let written = match api
            .create(&crate::api::post_params_as(MCP_MANAGER), &replay)
            .await
        {
            Ok(r) => r,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api
                    .get(&p.name)
                    .await
                    .map_err(Self::kube_error(format!("reading {object}")))?;
                if let Some(why) = differs(&existing, &wanted) {
                    return Err(ToolError::Exists { object, why });
                }
                existing
            }
            Err(e) => return Err(Self::kube_error(format!("creating {object}"))(e)),
        };
        self.shown_replay(&api, &written, object).await
    }

    /// Wait for the operator's preview of what was written: the preview and a token, or the
    /// operator's refusal.
    async fn shown_replay(
        &self,
        api: &Api<MessageReplay>,
        written: &MessageReplay,
        object: String,
    ) -> Result<Value, ToolError> {
        let name = written.name_any();
        let r = wait_for(api, &name, self.shared.wait, shown)
            .await?
            .filter(|r| r.uid() == written.uid());
        let status = r.as_ref().and_then(|r| r.status.clone()).unwrap_or_default();
        let preview = match (r, status.phase, status.preview) {
            (Some(r), ReplayPhase::AwaitingConfirmation, Some(preview)) if shown(&r) => (r, preview),
            (Some(r), phase @ (ReplayPhase::Sending | ReplayPhase::Completed), _) if shown(&r) => {
                let why = format!("and was confirmed meanwhile by another writer (phase {phase:?})");
                return Err(ToolError::Exists { object, why });
            }
            (Some(_), ReplayPhase::Failed, _) => {
                let message = status.message.unwrap_or_else(|| "no reason given".into());
                return Err(ToolError::ReplayRefused { object, message });
            }
            (r, ..) => {
                return Err(ToolError::NotObserved {
                    object,
                    generation: written.metadata.generation.unwrap_or_default(),
                    seconds: self.shared.wait.as_secs(),
                    state: r.map_or_else(|| "gone".into(), |r| replay_doc(&r).to_string()),
                });
            }
        };
        let (r, preview) = preview;
        let token = self.issue(Preview {
            address: preview.address.clone(),
            ..shown_now(&r, Step::Replay)
        });
        let mut doc = replay_doc(&r);
        doc["consequence"] = json!(consequence(&preview));
        doc["confirmationToken"] = json!(token);
        doc["next"] = json!(
            "show the preview and its consequence to the user; only once they agree, call apply_replay with this confirmationToken (it sets spec.confirm to the address shown). To call it off, delete the MessageReplay"
        );
        Ok(doc)
    }

    async fn apply_replay_of(&self, p: Confirmation, client: &str) -> Result<Value, ToolError> {
        let shown = self.redeem(&p.token, Step::Replay)?;
        let api: Api<MessageReplay> = Api::namespaced(self.kube().await?, &shown.namespace);
        let marks = self.marks(client).await?;
        let confirm = json!({"confirm": shown.address});
        let confirmed = self.patch_previewed(&api, &shown, &marks, confirm).await?;
        self.spend(&p.token);
        let r = wait_for(&api, &shown.name, self.shared.wait, finished)
            .await?
            .filter(|r| r.uid() == confirmed.uid());
        let Some(r) = r else {
            return Ok(json!({
                "confirmed": true,
                "gone": true,
                "next": format!("the MessageReplay was deleted after it was confirmed: `audit` with object replay/{} says whether it was sent", shown.name),
            }));
        };
        let mut doc = replay_doc(&r);
        doc["confirmed"] = json!(true);
        doc["finished"] = json!(finished(&r));
        doc["next"] = json!(if finished(&r) {
            format!(
                "final (a replay is never retried); `audit` with object replay/{} shows its audit row",
                shown.name
            )
        } else {
            "confirmed, not sent yet: the operator sends it once it can (message and conditions say what it waits for); deleting the MessageReplay calls it off".to_string()
        });
        Ok(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(spec: Value, generation: i64, status: Value) -> MessageReplay {
        let mut s = json!({"clusterRef": {"name": "c"}, "subscription": "s", "row": 7});
        if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
            s.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "MessageReplay",
            "metadata": {"name": "r", "namespace": "ns", "generation": generation},
            "spec": s, "status": status
        }))
        .expect("replay")
    }

    #[test]
    fn a_preview_counts_when_shown_for_this_generation_and_a_replay_is_reused_only_unconfirmed_and_alike() {
        let preview = json!({"node": "n1", "address": "orders", "sourceAddress": "orders", "body": "text",
            "bodyBytes": 5, "truncated": false, "consequence": "sends one new durable message"});
        let awaiting = |observed: i64, shown: i64| {
            json!({"observedGeneration": observed, "phase": "AwaitingConfirmation",
                "shownGeneration": shown, "preview": preview})
        };
        assert!(shown(&replay(json!({}), 1, awaiting(1, 1))));
        assert!(!shown(&replay(json!({}), 2, awaiting(1, 1))), "not yet observed");
        assert!(
            !shown(&replay(json!({}), 1, json!({"observedGeneration": 1}))),
            "Pending"
        );
        let failed = replay(json!({}), 1, json!({"observedGeneration": 1, "phase": "Failed"}));
        assert!(shown(&failed) && finished(&failed));
        assert!(!finished(&replay(json!({}), 1, awaiting(1, 1))));

        let wanted = replay(json!({}), 1, Value::Null).spec;
        assert_eq!(differs(&replay(json!({}), 1, Value::Null), &wanted), None);
        let elsewhere = differs(&replay(json!({"address": "audit"}), 1, Value::Null), &wanted);
        assert!(
            elsewhere.as_deref().is_some_and(|w| w.contains("address audit")),
            "{elsewhere:?}"
        );
        let confirmed = differs(&replay(json!({"confirm": "orders"}), 2, Value::Null), &wanted);
        assert!(
            confirmed
                .as_deref()
                .is_some_and(|w| w.contains("already confirmed")),
            "{confirmed:?}"
        );
    }
}
