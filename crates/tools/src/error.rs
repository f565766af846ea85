//! Errors of a call that could not be made (a tool that ran and failed
//! answers its own `"error"` field instead) and of the setup.

/// Why a call could not be made. The server maps each to a status:
/// unknown tool or no stream 404, bad parameters 400, runtime 500 (as
/// llama-server does).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool \"{0}\"")]
    UnknownTool(String),
    #[error("tool \"{0}\" does not support stream = true")]
    NoStream(String),
    /// A required parameter is missing or of the wrong type.
    #[error("invalid parameter \"{param}\": {message}")]
    InvalidParams { param: String, message: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

impl ToolError {
    pub(crate) fn param(param: &str, message: impl Into<String>) -> Self {
        ToolError::InvalidParams {
            param: param.to_owned(),
            message: message.into(),
        }
    }
}

/// A runtime (`x-tool-runtime` or `--tools-runtime`) that cannot be used.
/// Never a fallback to the host: the caller asked for an isolate.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("unknown tool runtime: {0}")]
    Unknown(String),
    /// `<engine>:<image>` in a header: spawning belongs to `--tools-runtime`.
    #[error("tool runtime must name a running container: {0}")]
    NotRunning(String),
    /// An id that `<engine> exec` could read as an option (`--privileged`).
    #[error("invalid container id: {0}")]
    InvalidContainerId(String),
    /// A target that ssh could read as an option (`-oProxyCommand=...`).
    #[error("invalid ssh target: {0}")]
    InvalidSshTarget(String),
    #[error("--tools-runtime {engine}:<image> requires an image name")]
    NoImage { engine: String },
    #[error("invalid image name: {0}")]
    InvalidImage(String),
    #[error("failed to spawn {engine} container for tools runtime (image: {image}): {source}")]
    Spawn {
        engine: String,
        image: String,
        source: std::io::Error,
    },
    #[error("timed out waiting for {engine} container to start (image: {image})")]
    StartTimeout { engine: String, image: String },
}

/// `--tools` or `--tools-runtime` that the server cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("unknown tool \"{name}\". available tools: {known}")]
    UnknownTool { name: String, known: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}
