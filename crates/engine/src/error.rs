//! The engine's one error type. The server maps each kind to a status:
//! `Overloaded` and `NotReady` are the client's cue to retry (503), and so is
//! `FileChanged` (the process must be restarted, which an orchestrator does
//! on the 503 from `/health`), `Invalid` and `Constraint` are the request's fault (400), the
//! rest are faults of the server (500).

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineError {
    /// Every slot is busy and the wait queue is full.
    #[error("the server is busy: {active} sequences running and {queued} waiting (limit {limit}); retry later")]
    Overloaded {
        active: usize,
        queued: usize,
        limit: usize,
    },

    /// The model is still loading, or failed to load.
    #[error("the model is not ready: {0}")]
    NotReady(String),

    /// The engine thread has stopped (it failed or the server is shutting down).
    #[error("the engine has stopped")]
    Stopped,

    /// A request the engine cannot run as given; names the field and the bound.
    #[error("{message}")]
    Invalid {
        /// The request field at fault, as the client spelled it.
        param: &'static str,
        message: String,
    },

    /// The prompt does not fit a slot's context (llama-server's
    /// `exceed_context_size_error`, which its clients read these two
    /// numbers from).
    #[error(
        "the prompt has {n_prompt} tokens, but the context of a slot is {n_ctx} tokens \
         (one is needed to generate)"
    )]
    ContextExceeded { n_prompt: usize, n_ctx: usize },

    /// Loading the model failed.
    #[error("loading the model: {0}")]
    Load(String),

    /// The output's constraint failed mid-request (a limit of the grammar
    /// engine was hit, or every token it allows was banned by
    /// `logit_bias`): the request's fault, and never an unconstrained
    /// answer.
    #[error("{0}")]
    Constraint(String),

    /// The forward pass failed mid-request.
    #[error("model fault: {0}")]
    Model(String),

    /// A mapped model file was truncated, resized or written in place while
    /// being served: the weights under the map are no longer the ones
    /// loaded, so nothing is computed from them any more.
    #[error(
        "the model file {} changed while the server was using it ({reason}); restart the server \
         to load it again, and replace model files by rename (mv new.gguf model.gguf), \
         which a running server does not see",
        path.display()
    )]
    FileChanged { path: PathBuf, reason: String },
}

impl From<lamina_gguf::FileChanged> for EngineError {
    fn from(e: lamina_gguf::FileChanged) -> Self {
        EngineError::FileChanged {
            path: e.path,
            reason: e.change.to_string(),
        }
    }
}
