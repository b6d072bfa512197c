//! `kubectl artemis mcp` (issue 48, ADR-0049, ADR-0084): an MCP server over stdio that gives an
//! agent the path a person has — objects, previews, per-node truth, one audit row per command —
//! with the caller's own kubeconfig and the capture database the other plugin commands read,
//! never the operator's credentials.
//!
//! - `read`: the read tools, always listed (clusters and their live nodes, queues and diverts
//!   with their per-node outcomes and delete previews, capture search / bounded tail /
//!   requests / coverage and loss / verify, audit);
//! - `write`: the write tools, listed only with `--allow-writes`, each two steps: `preview_*`
//!   writes the object with `spec.dryRun: true` (or reads a delete's blast radius) and returns
//!   the operator's per-node outcomes with a confirmation token; `apply_*` takes that token and
//!   acts through the same object a person would write, never a broker call of its own;
//! - `replay`: the replay write tools, listed with them: `preview_replay` creates a
//!   MessageReplay and returns the operator's preview of what would be sent with a token;
//!   `apply_replay` sets its `spec.confirm` to the address shown, and the operator sends once;
//! - `token`: the previews this server issued and what an apply checks against them;
//! - `objects`: what the tools read of the objects (documents, the wait for the operator).
//!
//! Every write carries the field manager [`crate::api::MCP_MANAGER`] and the annotations naming
//! the MCP client and the Kubernetes user, which the audit row's actor names.

mod objects;
mod read;
mod replay;
mod token;
mod write;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool_handler};
use tokio::sync::OnceCell;

use crate::reading::{Database, ReadError};
use crate::store::Store;

/// Serve MCP over stdio for an agent: read tools always; write tools (previews first, applied
/// by a confirmation token) only with --allow-writes. Uses your kubeconfig and the operator's
/// database, as the other `kubectl artemis` commands do.
#[derive(clap::Args, Debug)]
pub struct McpArgs {
    #[command(flatten)]
    pub database: Database,
    /// The namespace a tool call that names none acts in (default: the kubeconfig context's
    /// namespace, else `default`).
    #[arg(short = 'n', long, env = "ARTEMIS_NAMESPACE")]
    pub namespace: Option<String>,
    /// List and serve the write tools (preview_queue, apply_queue, preview_queue_delete,
    /// apply_queue_delete, preview_replay, apply_replay). Without it they are not listed at all.
    #[arg(long)]
    pub allow_writes: bool,
    /// The most seconds a preview or an apply waits for the operator to report on the object.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub wait_seconds: u64,
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("starting MCP over stdio: {0}")]
    Start(#[source] Box<rmcp::service::ServerInitializeError>),
    #[error("the MCP session ended abnormally: {0}")]
    Session(#[source] tokio::task::JoinError),
}

/// Why one tool call gave no answer: the message an agent (and its user) reads.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("the kubeconfig gives no client: {0}")]
    NoKube(#[source] kube::Error),
    #[error("{what}: {}", kube_message(.source))]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Token(#[from] token::TokenError),
    #[error("`{given}` is not a duration (e.g. 15m, 2h): {source}")]
    Since {
        given: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("`{given}` is not an RFC 3339 time (e.g. 2026-12-01T09:00:00Z): {source}")]
    Time {
        given: String,
        #[source]
        source: chrono::ParseError,
    },
    #[error("{kind} {namespace}/{name} does not exist")]
    NotFound {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error(
        "{kind} {namespace}/{name} does not exist yet: give `cluster` (an ArtemisCluster in {namespace}) to create it"
    )]
    NeedsCluster {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("spec has fields {kind} does not know: {} (see `kubectl explain {}.spec`)", .fields.join(", "), .kind.to_lowercase())]
    UnknownFields { kind: &'static str, fields: Vec<String> },
    #[error("spec is not a valid {kind} spec: {source}")]
    InvalidSpec {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the operator has not reported on {object} generation {generation} within {seconds}s (is it running, and does it hold the cluster?); nothing was applied. Its status now: {state}"
    )]
    NotObserved {
        object: String,
        generation: i64,
        seconds: u64,
        state: String,
    },
    #[error(
        "the operator shows no delete preview for {object} yet (status.deletePreview): its cluster has not been read for it; try again after the cluster's next poll"
    )]
    NoDeletePreview { object: String },
    #[error("{object} kept changing while it was written ({tries} tries): preview again")]
    Contended { object: String, tries: u32 },
    #[error(
        "{object} already exists {why}: give another name (a MessageReplay cannot be changed but for spec.confirm)"
    )]
    Exists { object: String, why: String },
    #[error(
        "the operator refused {object}: {message}. Nothing was sent, and this replay never will be (Failed is final); no token"
    )]
    ReplayRefused { object: String, message: String },
}

/// An API server's own words for an API error (its message), else the error.
fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// What every tool shares: the caller's kubeconfig client, the database, the previews issued.
pub(crate) struct Shared {
    database: Database,
    store: OnceCell<Store>,
    kube: OnceCell<kube::Client>,
    /// The Kubernetes user this server acts as (SelfSubjectReview), asked once.
    user: OnceCell<String>,
    namespace: String,
    previews: Mutex<token::Previews>,
    wait: Duration,
}

/// The MCP server: its tools and what they share.
#[derive(Clone)]
pub struct Studio {
    shared: Arc<Shared>,
    tools: ToolRouter<Studio>,
}

impl Studio {
    pub fn new(args: McpArgs) -> Studio {
        let mut tools = Self::read_tools();
        if args.allow_writes {
            tools += Self::write_tools();
            tools += Self::replay_tools();
        }
        Studio {
            shared: Arc::new(Shared {
                namespace: crate::reading::namespace_or_default(args.namespace.as_deref()),
                database: args.database,
                store: OnceCell::new(),
                kube: OnceCell::new(),
                user: OnceCell::new(),
                previews: Mutex::new(token::Previews::default()),
                wait: Duration::from_secs(args.wait_seconds),
            }),
            tools,
        }
    }

    /// The database, connected at its first use (a database that is down fails the tools that
    /// read it, not the server).
    async fn store(&self) -> Result<&Store, ToolError> {
        Ok(self
            .shared
            .store
            .get_or_try_init(|| self.shared.database.store())
            .await?)
    }

    /// A client from the caller's kubeconfig (KUBECONFIG, else ~/.kube/config, else in-cluster).
    async fn kube(&self) -> Result<kube::Client, ToolError> {
        self.shared
            .kube
            .get_or_try_init(|| async { kube::Client::try_default().await.map_err(ToolError::NoKube) })
            .await
            .cloned()
    }

    /// The namespace a call means: its own, else the server's.
    fn namespace(&self, given: Option<&str>) -> String {
        given
            .filter(|n| !n.is_empty())
            .map_or_else(|| self.shared.namespace.clone(), str::to_string)
    }
}

/// A tool's answer: a JSON object, or a tool-level error the agent reads (never a protocol
/// error: the message is for the user).
fn answer(result: Result<serde_json::Value, ToolError>) -> Result<CallToolResult, ErrorData> {
    Ok(match result {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
    })
}

/// The MCP client that made a request: its `clientInfo` from the initialize handshake, or from
/// the request's own metadata (protocol revisions without a handshake).
fn client_of(ctx: &RequestContext<RoleServer>) -> String {
    let info = ctx
        .peer
        .peer_info()
        .map(|p| p.client_info.clone())
        .or_else(|| ctx.meta.client_info());
    match info {
        Some(i) => format!("{} {}", i.name, i.version).chars().take(200).collect(),
        None => "unknown (the client sent no clientInfo)".into(),
    }
}

const INSTRUCTIONS: &str = "Artemis Studio: ActiveMQ Artemis queues, diverts and capture on Kubernetes, \
through the operator's objects. Every broker write is reported per node (WOULD_APPLY, APPLIED, ALREADY, \
SKIPPED_NOT_LIVE, FAILED) and audited. Writes, when enabled, are two steps: a preview_* tool writes the \
object as a dry run and returns what each node would do and a confirmation token; show that to the user, \
and call the apply_* tool with the token only once they agree. preview_replay shows the message a \
MessageReplay would send again; apply_replay sends it, as a new message, to the applications consuming \
that address: once, never retried, never taken back.";

#[tool_handler(router = self.tools)]
impl ServerHandler for Studio {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("kubectl-artemis", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

/// Serve MCP on stdin/stdout until the client closes it. Nothing else may write to stdout.
pub async fn serve(args: McpArgs) -> Result<(), McpError> {
    let running = Studio::new(args)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Start(Box::new(e)))?;
    running.waiting().await.map_err(McpError::Session)?;
    Ok(())
}
