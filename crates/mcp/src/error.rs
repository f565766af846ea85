//! What can go wrong talking to an MCP server.

use std::time::Duration;

/// Why an MCP request (or the start of a server) failed. The server keeps
/// running after any of them: a tool call that fails becomes an error in the
/// `/tools` answer, never a crash.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("MCP server \"{server}\": cannot start `{command}`: {source}")]
    Spawn {
        server: String,
        command: String,
        source: std::io::Error,
    },
    #[error("MCP server \"{server}\" failed to start; the next try is in {retry_in_ms} ms")]
    CoolingDown { server: String, retry_in_ms: u128 },
    #[error("MCP server \"{server}\": {method} timed out after {} ms", .timeout.as_millis())]
    TimedOut {
        server: String,
        method: String,
        timeout: Duration,
    },
    #[error("MCP server \"{server}\" closed the connection{}", diagnostics_suffix(.diagnostics))]
    Closed { server: String, diagnostics: String },
    #[error("the call was cancelled: the server is shutting down")]
    Cancelled,
    #[error("MCP server \"{server}\": {method} failed (JSON-RPC error {code}): {message}")]
    Rpc {
        server: String,
        method: String,
        code: i64,
        message: String,
    },
    #[error("MCP server \"{server}\" answered {method} without a result")]
    NoResult { server: String, method: String },
    #[error("no MCP server is named \"{0}\"")]
    UnknownServer(String),
    #[error("no MCP tool is named \"{0}\"")]
    UnknownTool(String),
}

fn diagnostics_suffix(diagnostics: &str) -> String {
    if diagnostics.is_empty() {
        String::new()
    } else {
        format!(" (its last stderr: {diagnostics})")
    }
}
