//! MCP servers (`--mcp-servers-json`, `--mcp-servers-config`) as a source
//! of `/tools` beside the built-ins: each tool is listed as
//! `<server>_<tool>` with its definition in the chat-completions function
//! shape, and a call answers `{"plain_text_response": text}`, or
//! `{"error": message}` when the tool or its server failed (timed out,
//! could not start, died), as llama-server answers.
//!
//! The servers' processes live in `lamina-mcp`; this file only adapts it to
//! `lamina-tools`' [`ToolSource`] and to the server's start and shutdown.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use lamina_mcp::{McpServers, ServerConfig, ToolDef};
use lamina_tools::{CallContext, ToolEntry, ToolError, ToolSource};
use serde_json::{json, Value};
use tokio::runtime::Handle;
use tokio::sync::watch;

/// How often a call checks whether its client hung up.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// The configured MCP servers and whether their tools are known yet.
pub struct Mcp {
    servers: McpServers,
    warmed: watch::Sender<bool>,
}

impl Mcp {
    pub fn new(configs: Vec<ServerConfig>) -> Self {
        Self {
            servers: McpServers::new(configs),
            warmed: watch::channel(false).0,
        }
    }

    /// Discovers every server's tools (see [`McpServers::warm_up`]).
    pub async fn warm_up(&self) {
        self.servers.warm_up().await;
        self.warmed.send_replace(true);
    }

    /// Waits until start-up discovery is over, so that a listing asked for
    /// while the model still loads does not answer too few tools.
    pub async fn warmed(&self) {
        let mut warmed = self.warmed.subscribe();
        // Discovery is bounded by WARM_UP_LIMIT; the margin covers the
        // processes' clean-up after it.
        let wait = lamina_mcp::WARM_UP_LIMIT + Duration::from_secs(5);
        let _ = tokio::time::timeout(wait, warmed.wait_for(|w| *w)).await;
    }

    /// Ends calls in flight and kills the servers' processes: run on the
    /// first shutdown signal, so a slow tool cannot hold the exit.
    pub async fn shutdown(&self) {
        self.servers.shutdown().await;
    }
}

/// The MCP servers' tools as `/tools` sees them.
pub struct McpSource {
    mcp: Arc<Mcp>,
    /// Calls arrive on a blocking thread (see [`ToolSource`]); the client
    /// is async, so they run on the server's runtime from there.
    rt: Handle,
}

impl McpSource {
    pub fn new(mcp: Arc<Mcp>, rt: Handle) -> Self {
        Self { mcp, rt }
    }
}

fn definition(tool: &ToolDef) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.qualified_name(),
            "description": tool.description,
            "parameters": tool.input_schema,
        },
    })
}

impl ToolSource for McpSource {
    fn entries(&self) -> Vec<ToolEntry> {
        self.mcp
            .servers
            .tools()
            .iter()
            .map(|t| ToolEntry::external(t.qualified_name(), "mcp", definition(t)))
            .collect()
    }

    fn call(
        &self,
        name: &str,
        params: Value,
        ctx: &CallContext,
    ) -> Option<Result<Value, ToolError>> {
        let tool = self.mcp.servers.find(name)?;
        let call = self.mcp.servers.call_tool(&tool.server, &tool.name, params);
        // A client that hung up gets no answer: stop waiting for it (the
        // MCP server's late reply is dropped by its id).
        let gone = async {
            loop {
                if ctx
                    .cancel
                    .as_ref()
                    .is_some_and(|c| c.load(Ordering::SeqCst))
                {
                    return;
                }
                tokio::time::sleep(CANCEL_POLL).await;
            }
        };
        let answer = self.rt.block_on(async {
            tokio::select! {
                answer = call => Some(answer),
                () = gone => None,
            }
        });
        let Some(answer) = answer else {
            return Some(Ok(json!({ "error": "the client went away" })));
        };
        Some(Ok(match answer {
            Ok(out) if out.is_error => {
                let message = if out.text.is_empty() {
                    "the MCP tool returned an error".to_owned()
                } else {
                    out.text
                };
                json!({ "error": message })
            }
            Ok(out) => json!({ "plain_text_response": out.text }),
            Err(e) => {
                tracing::warn!(tool = %name, "MCP tool call failed: {e}");
                json!({ "error": e.to_string() })
            }
        }))
    }
}
