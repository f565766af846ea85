//! The MCP server configuration: the `{"mcpServers": {name: {...}}}` object
//! that Cursor, Claude Desktop and llama-server share.
//!
//! Each entry names a `command` to spawn, with optional `args`, `env` (merged
//! over the server's own environment), `cwd` and `timeout_ms` (the per-call
//! limit, 30 s by default). An entry without a command is skipped with a
//! warning, as llama-server does; a field of the wrong type is an error that
//! names the server and the field, so a typo does not silently drop a server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

/// The per-call limit when an entry sets none (llama-server's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(30_000);

/// The longest per-call limit an entry may ask for: a day. Larger values are
/// refused rather than turned into a deadline that overflows the clock.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// One MCP server to spawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The key under `mcpServers`: the prefix of its tools' names.
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// Set over the inherited environment.
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// How long one request may wait for its reply.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the MCP server config is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the MCP server config must be a JSON object (with \"mcpServers\")")]
    NotAnObject,
    #[error("\"mcpServers\" must be an object mapping names to servers")]
    ServersNotAnObject,
    #[error("MCP server \"{server}\": \"{field}\" must be {expected}")]
    Field {
        server: String,
        field: &'static str,
        expected: &'static str,
    },
    #[error("MCP server name \"{0}\" must be non-empty and contain no whitespace")]
    BadName(String),
    #[error("cannot read the MCP server config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Parses a config's JSON text. A config without `mcpServers` configures
/// no server (as llama-server reads it).
pub fn parse(text: &str) -> Result<Vec<ServerConfig>, ConfigError> {
    let root: Value = serde_json::from_str(text)?;
    let Value::Object(root) = root else {
        return Err(ConfigError::NotAnObject);
    };
    let servers = match root.get("mcpServers") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(servers)) => servers,
        Some(_) => return Err(ConfigError::ServersNotAnObject),
    };
    let mut out = Vec::with_capacity(servers.len());
    for (name, entry) in servers {
        if let Some(server) = parse_entry(name, entry)? {
            out.push(server);
        }
    }
    Ok(out)
}

/// Reads and parses a config file.
pub fn read(path: &Path) -> Result<Vec<ServerConfig>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text)
}

/// Joins several sources (a file, then inline JSON): a name seen before is
/// skipped with a warning, since tools are routed by server name.
pub fn merge(sources: impl IntoIterator<Item = Vec<ServerConfig>>) -> Vec<ServerConfig> {
    let mut out: Vec<ServerConfig> = Vec::new();
    for server in sources.into_iter().flatten() {
        if out.iter().any(|s| s.name == server.name) {
            tracing::warn!(server = %server.name, "MCP server configured twice; the first is kept");
            continue;
        }
        out.push(server);
    }
    out
}

fn parse_entry(name: &str, entry: &Value) -> Result<Option<ServerConfig>, ConfigError> {
    let field = |field: &'static str, expected: &'static str| ConfigError::Field {
        server: name.to_owned(),
        field,
        expected,
    };
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        return Err(ConfigError::BadName(name.to_owned()));
    }
    let Value::Object(entry) = entry else {
        return Err(field("(entry)", "an object"));
    };
    let command = match entry.get("command") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) => Some(c.clone()),
        Some(_) => return Err(field("command", "a string")),
    };
    let Some(command) = command.filter(|c| !c.is_empty()) else {
        // Remote (url) servers belong to the web UI, not to this client.
        tracing::warn!(server = %name, "MCP server has no \"command\"; skipped");
        return Ok(None);
    };
    let args = match entry.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(args)) => args
            .iter()
            .map(|a| a.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| field("args", "an array of strings"))?,
        Some(_) => return Err(field("args", "an array of strings")),
    };
    let env = match entry.get("env") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(env)) => {
            string_map(env).ok_or_else(|| field("env", "an object of strings"))?
        }
        Some(_) => return Err(field("env", "an object of strings")),
    };
    let cwd = match entry.get("cwd") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) if c.is_empty() => None,
        Some(Value::String(c)) => Some(PathBuf::from(c)),
        Some(_) => return Err(field("cwd", "a string")),
    };
    let timeout = match entry.get("timeout_ms") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT,
        Some(v) => match v.as_u64() {
            Some(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Duration::from_millis(ms),
            _ => {
                return Err(field(
                    "timeout_ms",
                    "a whole number of milliseconds from 1 to 86400000",
                ))
            }
        },
    };
    Ok(Some(ServerConfig {
        name: name.to_owned(),
        command,
        args,
        env,
        cwd,
        timeout,
    }))
}

fn string_map(map: &Map<String, Value>) -> Option<BTreeMap<String, String>> {
    map.iter()
        .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_entry() {
        let servers = parse(
            r#"{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "srv"],
                "env": {"A": "1"}, "cwd": "/tmp", "timeout_ms": 500}}}"#,
        )
        .unwrap();
        assert_eq!(servers.len(), 1);
        let fs = &servers[0];
        assert_eq!(fs.name, "fs");
        assert_eq!(fs.command, "npx");
        assert_eq!(fs.args, ["-y", "srv"]);
        assert_eq!(fs.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(fs.cwd.as_deref(), Some(Path::new("/tmp")));
        assert_eq!(fs.timeout, Duration::from_millis(500));
    }

    #[test]
    fn defaults_and_skips() {
        let servers =
            parse(r#"{"mcpServers": {"a": {"command": "x"}, "remote": {"url": "http://h"}}}"#)
                .unwrap();
        assert_eq!(servers.len(), 1);
        assert_eq!(servers[0].timeout, DEFAULT_TIMEOUT);
        assert!(servers[0].args.is_empty());
        assert!(parse("{}").unwrap().is_empty());
    }

    #[test]
    fn each_way_to_be_wrong() {
        assert!(matches!(parse("not valid json"), Err(ConfigError::Json(_))));
        assert!(matches!(parse("[]"), Err(ConfigError::NotAnObject)));
        assert!(matches!(
            parse(r#"{"mcpServers": []}"#),
            Err(ConfigError::ServersNotAnObject)
        ));
        let field = |text: &str| match parse(text) {
            Err(ConfigError::Field { field, .. }) => field,
            other => panic!("expected a field error, got {other:?}"),
        };
        assert_eq!(field(r#"{"mcpServers": {"a": 1}}"#), "(entry)");
        assert_eq!(field(r#"{"mcpServers": {"a": {"command": 1}}}"#), "command");
        assert_eq!(
            field(r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#),
            "args"
        );
        assert_eq!(
            field(r#"{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}"#),
            "env"
        );
        assert_eq!(
            field(r#"{"mcpServers": {"a": {"command": "x", "cwd": 2}}}"#),
            "cwd"
        );
        assert_eq!(
            field(r#"{"mcpServers": {"a": {"command": "x", "timeout_ms": -1}}}"#),
            "timeout_ms"
        );
        assert_eq!(
            field(r#"{"mcpServers": {"a": {"command": "x", "timeout_ms": 1e30}}}"#),
            "timeout_ms"
        );
        assert!(matches!(
            parse(r#"{"mcpServers": {"a b": {"command": "x"}}}"#),
            Err(ConfigError::BadName(_))
        ));
        assert!(matches!(
            read(Path::new("/nonexistent/mcp.json")),
            Err(ConfigError::Read { .. })
        ));
    }

    #[test]
    fn merge_keeps_the_first_of_a_name() {
        let a = parse(r#"{"mcpServers": {"s": {"command": "first"}}}"#).unwrap();
        let b = parse(r#"{"mcpServers": {"s": {"command": "second"}, "t": {"command": "t"}}}"#)
            .unwrap();
        let merged = merge([a, b]);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].command, "first");
    }
}
