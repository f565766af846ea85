//! `/tools` for MCP servers (`--mcp-servers-json`, `--mcp-servers-config`):
//! GET lists every tool the servers advertised at start-up, POST
//! `{"tool": "<server>_<tool>", "params": {...}}` calls one.
//!
//! The answers follow llama-server's `/tools` contract: a listing entry is
//! `{"display_name", "tool", "type": "mcp", "permissions", "uses_cwd",
//! "definition"}` with `definition` in the chat-completions function shape;
//! a call answers 200 with `{"plain_text_response": text}`, or 200 with
//! `{"error": message}` when the tool or its server failed (the call
//! itself was well-formed). A malformed body is a 400, an unknown tool a
//! 404, and without any MCP server configured both routes are a 403, as in
//! llama-server.
//!
//! The servers' processes live in `lamina-mcp`; this file only maps its
//! results onto HTTP.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lamina_mcp::{McpServers, ServerConfig, ToolDef};
use serde_json::{json, Value};
use tokio::sync::watch;

use super::params::Body;
use super::{ApiError, AppState};

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

    /// Ends calls in flight and kills the servers' processes: run on the
    /// first shutdown signal, so a slow tool cannot hold the exit.
    pub async fn shutdown(&self) {
        self.servers.shutdown().await;
    }

    /// The tools, once start-up discovery is over (a listing asked for while
    /// the model still loads waits for it rather than answer too few).
    async fn tools(&self) -> Vec<ToolDef> {
        let mut warmed = self.warmed.subscribe();
        // Discovery is bounded by WARM_UP_LIMIT; the margin covers the
        // processes' clean-up after it.
        let wait = lamina_mcp::WARM_UP_LIMIT + Duration::from_secs(5);
        let _ = tokio::time::timeout(wait, warmed.wait_for(|w| *w)).await;
        self.servers.tools()
    }
}

fn disabled() -> ApiError {
    let mut e = ApiError::forbidden(
        "no tools are enabled on this server (start it with --mcp-servers-json or --mcp-servers-config)",
    );
    e.code = Some("tools_disabled");
    e
}

/// One listing entry, in llama-server's shape.
fn entry(tool: &ToolDef) -> Value {
    let name = tool.qualified_name();
    json!({
        "display_name": name,
        "tool": name,
        "type": "mcp",
        "permissions": {"write": false},
        "uses_cwd": false,
        "definition": {
            "type": "function",
            "function": {
                "name": name,
                "description": tool.description,
                "parameters": tool.input_schema,
            },
        },
    })
}

/// GET /tools
pub async fn list(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let mcp = st.mcp.as_ref().ok_or_else(disabled)?;
    let tools: Vec<Value> = mcp.tools().await.iter().map(entry).collect();
    Ok(Json(tools).into_response())
}

/// POST /tools
pub async fn call(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mcp = st.mcp.as_ref().ok_or_else(disabled)?;
    let b = Body::parse(&body?)?;
    let name = b
        .str("tool")?
        .ok_or_else(|| ApiError::invalid("tool", "tool is required: the name GET /tools lists"))?;
    let params = match b.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(ApiError::invalid("params", "params must be an object")),
    };
    if b.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::invalid(
            "stream",
            format!("tool \"{name}\" does not support stream = true"),
        ));
    }
    // Listed tools only: a name the servers never advertised is the
    // client's mistake (404), not a server failure.
    let Some(tool) = mcp
        .tools()
        .await
        .into_iter()
        .find(|t| t.qualified_name() == name)
    else {
        return Err(ApiError::not_found(format!("unknown tool \"{name}\"")));
    };
    let answer = match mcp
        .servers
        .call_tool(&tool.server, &tool.name, params)
        .await
    {
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
    };
    Ok(Json(answer).into_response())
}
