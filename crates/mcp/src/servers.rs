//! The configured MCP servers: their tools, discovered once at start-up,
//! and calls routed to a live process per server, spawned on first use and
//! respawned after it dies.
//!
//! Start-up ([`McpServers::warm_up`]) spawns each server, lists its tools
//! and closes it again, so a server that is never called holds no process.
//! A server that fails to start is not retried for [`COOLDOWN`], so a bad
//! command costs one failed spawn per cooldown, not one per call.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::cancel::{Cancel, Canceller};
use crate::config::ServerConfig;
use crate::error::CallError;
use crate::transport::Transport;

/// The most a server may take to start and list its tools at start-up.
pub const WARM_UP_LIMIT: Duration = Duration::from_secs(10);

/// How long a server that failed to start is left alone.
pub const COOLDOWN: Duration = Duration::from_secs(5);

/// A tool as a server advertises it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub server: String,
    /// The server's own name for it.
    pub name: String,
    pub description: String,
    /// The JSON schema of its arguments (an object schema when the server
    /// gave none).
    pub input_schema: Value,
}

impl ToolDef {
    /// `<server>_<tool>`, the name clients call it by (llama-server's).
    pub fn qualified_name(&self) -> String {
        format!("{}_{}", self.server, self.name)
    }
}

/// What a `tools/call` produced: its text parts joined by newlines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    /// The tool reported a failure (`isError`): `text` says what.
    pub is_error: bool,
}

impl ToolOutput {
    fn from_result(result: &Value) -> Self {
        let text = result
            .get("content")
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        Self {
            text,
            is_error: result
                .get("isError")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }
    }
}

struct Server {
    config: ServerConfig,
    /// Held while a process is started, so concurrent first calls start one.
    slot: tokio::sync::Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    live: Option<Arc<Transport>>,
    retry_after: Option<Instant>,
}

/// Every configured MCP server.
pub struct McpServers {
    servers: Vec<Server>,
    tools: RwLock<Vec<ToolDef>>,
    canceller: Canceller,
}

impl McpServers {
    pub fn new(configs: Vec<ServerConfig>) -> Self {
        Self {
            servers: configs
                .into_iter()
                .map(|config| Server {
                    config,
                    slot: tokio::sync::Mutex::default(),
                })
                .collect(),
            tools: RwLock::default(),
            canceller: Canceller::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Starts every server at once, lists its tools and closes it. A server
    /// that cannot start or answer is logged and contributes no tools.
    pub async fn warm_up(&self) {
        let cancel = self.canceller.signal();
        let found = join_all(self.servers.iter().map(|s| discover(&s.config, &cancel))).await;
        let mut tools: Vec<ToolDef> = Vec::new();
        for tool in found.into_iter().flatten() {
            let name = tool.qualified_name();
            if tools.iter().any(|t| t.qualified_name() == name) {
                tracing::warn!(tool = %name, "two MCP tools share a name; the second is skipped");
                continue;
            }
            tools.push(tool);
        }
        *self.tools.write().unwrap_or_else(PoisonError::into_inner) = tools;
    }

    /// The tools found by [`McpServers::warm_up`], in configuration order.
    pub fn tools(&self) -> Vec<ToolDef> {
        self.tools
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The tool clients call `qualified` (`<server>_<tool>`).
    pub fn find(&self, qualified: &str) -> Option<ToolDef> {
        self.tools
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|t| t.qualified_name() == qualified)
            .cloned()
    }

    /// Calls the tool clients name `qualified`.
    pub async fn call(&self, qualified: &str, arguments: Value) -> Result<ToolOutput, CallError> {
        let tool = self
            .find(qualified)
            .ok_or_else(|| CallError::UnknownTool(qualified.to_owned()))?;
        self.call_tool(&tool.server, &tool.name, arguments).await
    }

    /// Calls `tool` on `server`, starting (or restarting) its process first
    /// when none is alive.
    pub async fn call_tool(
        &self,
        server: &str,
        tool: &str,
        arguments: Value,
    ) -> Result<ToolOutput, CallError> {
        let cancel = self.canceller.signal();
        if cancel.is_cancelled() {
            return Err(CallError::Cancelled);
        }
        let server = self
            .servers
            .iter()
            .find(|s| s.config.name == server)
            .ok_or_else(|| CallError::UnknownServer(server.to_owned()))?;
        let transport = live(server, &cancel).await?;
        // MCP requires an object; llama-server's clients may send none.
        let arguments = if arguments.is_null() {
            json!({})
        } else {
            arguments
        };
        let result = transport
            .request(
                "tools/call",
                json!({"name": tool, "arguments": arguments}),
                server.config.timeout,
                &cancel,
            )
            .await?;
        Ok(ToolOutput::from_result(&result))
    }

    /// Ends every call in flight and kills every server's processes.
    pub async fn shutdown(&self) {
        self.canceller.cancel();
        let mut live = Vec::new();
        for server in &self.servers {
            if let Some(t) = server.slot.lock().await.live.take() {
                live.push(t);
            }
        }
        join_all(live.iter().map(|t| t.close())).await;
    }
}

/// The server's live process, started when there is none.
async fn live(server: &Server, cancel: &Cancel) -> Result<Arc<Transport>, CallError> {
    let name = &server.config.name;
    let mut slot = server.slot.lock().await;
    if let Some(t) = &slot.live {
        if t.is_alive() {
            return Ok(t.clone());
        }
        tracing::warn!(server = %name, stderr = %t.diagnostics(), "MCP server exited; restarting it");
        if let Some(dead) = slot.live.take() {
            dead.close().await;
        }
    }
    let now = Instant::now();
    if let Some(at) = slot.retry_after.filter(|&at| at > now) {
        return Err(CallError::CoolingDown {
            server: name.clone(),
            retry_in_ms: (at - now).as_millis(),
        });
    }
    match Transport::start(&server.config, server.config.timeout, cancel).await {
        Ok(t) => {
            let t = Arc::new(t);
            slot.live = Some(t.clone());
            slot.retry_after = None;
            Ok(t)
        }
        Err(e) => {
            if !matches!(e, CallError::Cancelled) {
                tracing::warn!(server = %name, "MCP server failed to start: {e}");
                slot.retry_after = Some(now + COOLDOWN);
            }
            Err(e)
        }
    }
}

/// Starts a server, lists its tools and closes it.
async fn discover(config: &ServerConfig, cancel: &Cancel) -> Vec<ToolDef> {
    let limit = WARM_UP_LIMIT;
    let started = Instant::now();
    let transport = match Transport::start(config, limit, cancel).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(server = %config.name, "MCP server failed to start: {e}");
            return Vec::new();
        }
    };
    let left = limit.saturating_sub(started.elapsed());
    let listed = transport
        .request("tools/list", json!({}), left, cancel)
        .await;
    transport.close().await;
    let result = match listed {
        Ok(result) => result,
        Err(e) => {
            tracing::warn!(server = %config.name, "MCP server did not list its tools: {e}");
            return Vec::new();
        }
    };
    let tools = parse_tools(&config.name, &result);
    tracing::info!(server = %config.name, tools = tools.len(), "MCP server ready");
    tools
}

fn parse_tools(server: &str, result: &Value) -> Vec<ToolDef> {
    let Some(tools) = result.get("tools").and_then(Value::as_array) else {
        return Vec::new();
    };
    tools
        .iter()
        .filter_map(|t| {
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())?;
            let input_schema = match t.get("inputSchema") {
                Some(s @ Value::Object(_)) => s.clone(),
                _ => json!({"type": "object", "properties": {}}),
            };
            Some(ToolDef {
                server: server.to_owned(),
                name: name.to_owned(),
                description: t
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                input_schema,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_joins_text_parts_and_keeps_is_error() {
        let out = ToolOutput::from_result(&json!({"content": [
            {"type": "text", "text": "a"}, {"type": "image", "data": "x"}, {"type": "text", "text": "b"}
        ], "isError": true}));
        assert_eq!(out.text, "a\nb");
        assert!(out.is_error);
        assert_eq!(ToolOutput::from_result(&json!({})).text, "");
    }

    #[test]
    fn tools_without_a_name_are_skipped_and_schemas_defaulted() {
        let tools = parse_tools(
            "s",
            &json!({"tools": [{"name": "t"}, {"description": "nameless"}, {"name": "u", "inputSchema": {"type": "object", "required": ["x"]}}]}),
        );
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0].qualified_name(), "s_t");
        assert_eq!(tools[0].input_schema["type"], "object");
        assert_eq!(tools[1].input_schema["required"][0], "x");
    }
}
