//! A Model Context Protocol client for stdio servers.
//!
//! [`config`] reads the `{"mcpServers": ...}` configuration; [`McpServers`]
//! spawns each server, discovers its tools and routes `tools/call`
//! requests to it; [`Transport`] is one server process spoken to in
//! newline-delimited JSON-RPC 2.0. Nothing here knows about HTTP: the
//! server crate maps [`ToolOutput`] and [`CallError`] onto its `/tools`
//! endpoint.

pub mod cancel;
pub mod config;
mod error;
mod servers;
mod transport;

pub use config::{ConfigError, ServerConfig};
pub use error::CallError;
pub use servers::{McpServers, ToolDef, ToolOutput, COOLDOWN, WARM_UP_LIMIT};
pub use transport::{Transport, PROTOCOL_VERSION};
