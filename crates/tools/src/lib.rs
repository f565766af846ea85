//! llama-server's built-in agent tools (`--tools`): read, write and edit
//! files, search them by glob or regex, and run shell commands, each with a
//! JSON-schema definition, plus the registry the `/tools` endpoint lists and
//! calls. No HTTP here: the server turns a request's body and headers into a
//! [`CallContext`] and a call on [`Tools`].
//!
//! **Security.** These tools read and write files and run commands with the
//! server's rights (or, with a runtime, inside a container or on an ssh
//! host). The server builds a [`Tools`] only when `--tools` names them.
//! Values that end up on a command line of ours (a container id, an ssh
//! target) are checked so that they cannot be read as options.
//!
//! # Adding another source of tools
//!
//! The built-ins are one source; another (MCP servers, say) implements
//! [`ToolSource`] and is added with [`Tools::with_source`]. The listing is
//! the built-ins, then each source's entries in the order the sources were
//! added, an entry whose name is already taken being left out (and logged).
//! A call asks the built-ins first, then each source in turn: the first that
//! knows the name answers. That is the whole seam: a source never sees the
//! built-ins, and the built-ins never see a source.
//!
//! ```
//! use lamina_tools::{CallContext, ToolEntry, ToolError, ToolSource, Tools};
//! use serde_json::{json, Value};
//!
//! struct Echo;
//! impl ToolSource for Echo {
//!     fn entries(&self) -> Vec<ToolEntry> {
//!         vec![ToolEntry::external("echo_say", "mcp", json!({"type": "function"}))]
//!     }
//!     fn call(&self, name: &str, params: Value, _: &CallContext) -> Option<Result<Value, ToolError>> {
//!         (name == "echo_say").then(|| Ok(params))
//!     }
//! }
//!
//! let tools = Tools::new(&[], None).unwrap().with_source(Box::new(Echo));
//! let out = tools.call("echo_say", json!({"x": 1}), &CallContext::default()).unwrap();
//! assert_eq!(out, json!({"x": 1}));
//! ```

mod builtin;
mod error;
mod glob;
mod io;
mod params;
mod process;
mod runtime;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde_json::{json, Value};

pub use builtin::Builtin;
pub use error::{RuntimeError, SetupError, ToolError};
pub use runtime::Runtime;

/// What a request says beside the tool's parameters, from its headers.
/// A model writes the parameters; these come from the client (the web UI),
/// so a `cwd` or `runtime` in the parameters is never read.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// `x-tool-cwd`: the directory relative paths resolve against and
    /// commands run in (default: the server's).
    pub cwd: Option<String>,
    /// `x-tool-runtime`: where to run (`docker-container:<id>`,
    /// `podman-container:<id>`, `ssh:<target>`), else `--tools-runtime`'s,
    /// else the server's host.
    pub runtime: Option<String>,
    /// `x-resp-type: base64`: `read_file` answers the whole file as base64.
    pub base64: bool,
    /// Set by the caller when its client went away: a running command is
    /// then killed, even one that prints nothing.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// One tool as `GET /tools` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolEntry {
    /// The name a call gives in `{"tool": NAME}`.
    pub name: String,
    pub display_name: String,
    /// `"server"` for the built-ins, `"mcp"` for MCP servers' tools.
    pub kind: String,
    /// Whether it can change anything (the web UI asks before running it).
    pub write: bool,
    /// Whether it reads `x-tool-cwd`.
    pub uses_cwd: bool,
    /// Whether `"stream": true` is accepted.
    pub streams: bool,
    /// The OpenAI-style `{"type": "function", "function": {...}}`.
    pub definition: Value,
}

impl ToolEntry {
    /// An entry of another source: no cwd, no streaming, read-only.
    pub fn external(name: impl Into<String>, kind: impl Into<String>, definition: Value) -> Self {
        let name = name.into();
        ToolEntry {
            display_name: name.clone(),
            name,
            kind: kind.into(),
            write: false,
            uses_cwd: false,
            streams: false,
            definition,
        }
    }

    /// The JSON object `GET /tools` answers for it (llama-server's shape).
    pub fn to_json(&self) -> Value {
        json!({
            "display_name": self.display_name,
            "tool": self.name,
            "type": self.kind,
            "permissions": {"write": self.write},
            "uses_cwd": self.uses_cwd,
            "definition": self.definition,
        })
    }
}

/// A source of tools beside the built-ins (see the crate docs).
///
/// Calls run on a blocking thread: a source may block, up to its own
/// timeouts.
pub trait ToolSource: Send + Sync {
    /// The tools it has now.
    fn entries(&self) -> Vec<ToolEntry>;
    /// Runs `name`, or `None` when this source has no such tool. A tool
    /// that ran and failed answers `Ok` with an `"error"` field, as a
    /// built-in does; `Err` is for a call that could not be made.
    fn call(
        &self,
        name: &str,
        params: Value,
        ctx: &CallContext,
    ) -> Option<Result<Value, ToolError>>;
}

/// The tools the server offers: the built-ins `--tools` enabled, where they
/// run (`--tools-runtime`), and other sources.
pub struct Tools {
    builtins: Vec<Builtin>,
    runtime: Option<Runtime>,
    sources: Vec<Box<dyn ToolSource>>,
}

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tools")
            .field("builtins", &self.builtins)
            .field("runtime", &self.runtime)
            .field("sources", &self.sources.len())
            .finish()
    }
}

impl Tools {
    /// The built-ins named in `enabled` (`all` for every one; `--tools`'
    /// comma list, split), run where `runtime` says (`--tools-runtime`).
    /// An unknown name or a bad runtime is an error, as in llama-server;
    /// `docker:<image>`/`podman:<image>` starts its container here.
    pub fn new(enabled: &[String], runtime: Option<&str>) -> Result<Self, SetupError> {
        let mut builtins = Vec::new();
        for name in enabled {
            let name = name.trim();
            if name.is_empty() {
                continue;
            }
            if name == "all" {
                builtins = Builtin::ALL.to_vec();
                continue;
            }
            let tool = Builtin::named(name).ok_or_else(|| SetupError::UnknownTool {
                name: name.to_owned(),
                known: Builtin::ALL
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
            if !builtins.contains(&tool) {
                builtins.push(tool);
            }
        }
        // llama-server's order, whatever the flag's.
        builtins.sort_by_key(|b| Builtin::ALL.iter().position(|a| a == b));
        let runtime = runtime
            .filter(|s| !s.is_empty())
            .map(Runtime::start)
            .transpose()?;
        Ok(Tools {
            builtins,
            runtime,
            sources: Vec::new(),
        })
    }

    /// Adds a source, asked after the built-ins and the sources before it.
    pub fn with_source(mut self, source: Box<dyn ToolSource>) -> Self {
        self.sources.push(source);
        self
    }

    /// Every tool, as `GET /tools` lists them.
    pub fn entries(&self) -> Vec<ToolEntry> {
        let mut out: Vec<ToolEntry> = self.builtins.iter().map(|b| b.entry()).collect();
        for source in &self.sources {
            for entry in source.entries() {
                if out.iter().any(|e| e.name == entry.name) {
                    tracing::warn!(
                        "tool {:?} is already listed; the later one is left out",
                        entry.name
                    );
                    continue;
                }
                out.push(entry);
            }
        }
        out
    }

    /// Runs `name` with `params`; the answer is the tool's JSON.
    pub fn call(&self, name: &str, params: Value, ctx: &CallContext) -> Result<Value, ToolError> {
        if let Some(b) = self.builtin(name) {
            return b.invoke(&params, &self.io(ctx)?, ctx, None);
        }
        for source in &self.sources {
            if let Some(answer) = source.call(name, params.clone(), ctx) {
                return answer;
            }
        }
        Err(ToolError::UnknownTool(name.to_owned()))
    }

    /// Whether `name` can be called with `"stream": true`: checked before
    /// a stream starts, so that a refusal is a status code.
    pub fn check_stream(&self, name: &str) -> Result<(), ToolError> {
        match self.builtin(name) {
            Some(b) if b.streams() => Ok(()),
            Some(_) => Err(ToolError::NoStream(name.to_owned())),
            None if self
                .sources
                .iter()
                .any(|s| s.entries().iter().any(|e| e.name == name)) =>
            {
                Err(ToolError::NoStream(name.to_owned()))
            }
            None => Err(ToolError::UnknownTool(name.to_owned())),
        }
    }

    /// Checks a streamed call's parameters and runtime before its stream
    /// starts, so that those errors are status codes too.
    pub fn prepare_stream(
        &self,
        name: &str,
        params: &Value,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        self.check_stream(name)?;
        if let Some(b) = self.builtin(name) {
            b.check_params(params)?;
        }
        self.io(ctx).map(drop)
    }

    /// Runs a streaming tool: `on_chunk` gets its output as it comes and
    /// stops it by answering `false` (the client went away).
    pub fn call_stream(
        &self,
        name: &str,
        params: Value,
        ctx: &CallContext,
        on_chunk: &mut dyn FnMut(&str) -> bool,
    ) -> Result<(), ToolError> {
        self.check_stream(name)?;
        let b = self
            .builtin(name)
            .ok_or_else(|| ToolError::UnknownTool(name.to_owned()))?;
        b.invoke(&params, &self.io(ctx)?, ctx, Some(on_chunk))
            .map(drop)
    }

    /// Stops what `--tools-runtime` started (its container). Also done on
    /// drop; this is for a shutdown that may not drop the registry.
    pub fn shutdown(&self) {
        if let Some(r) = &self.runtime {
            r.stop();
        }
    }

    fn builtin(&self, name: &str) -> Option<Builtin> {
        self.builtins.iter().copied().find(|b| b.name() == name)
    }

    /// Where this call runs: the header's runtime, else the server's.
    fn io(&self, ctx: &CallContext) -> Result<io::Target, ToolError> {
        let spec = match ctx.runtime.as_deref().filter(|s| !s.is_empty()) {
            Some(s) => Some(s.to_owned()),
            None => self.runtime.as_ref().map(Runtime::spec).transpose()?,
        };
        Ok(io::Target::new(spec.as_deref(), ctx.cwd.as_deref())?.with_cancel(ctx.cancel.clone()))
    }
}
