//! The engine's one error type. The server maps each kind to a status:
//! `Overloaded` and `NotReady` are the client's cue to retry (503), and so is
//! `FileChanged` (the process must be restarted, which an orchestrator does
//! on the 503 from `/health`), `Invalid` and `Constraint` are the request's fault (400), the
//! rest are faults of the server (500).

use std::path::PathBuf;
use std::sync::Arc;

use lamina_model::ModelError;

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

    /// The forward pass failed mid-request (the same fault for every
    /// sequence of a failed step). Memory that ran out is the client's cue
    /// to retry ([`EngineError::is_out_of_memory`]); anything else is a
    /// fault of the server.
    #[error("model fault: {0}")]
    Model(#[source] ModelFault),

    /// The sampler could not draw from what a step gave it.
    #[error("sampling: {0}")]
    Sampling(String),

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

impl EngineError {
    /// Memory ran out (on the GPU or the host) while running a request.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, EngineError::Model(f) if f.0.is_out_of_memory())
    }
}

/// A [`ModelError`] that several requests can hold (`EngineError` is
/// cloned to each waiter); equal when its message is.
#[derive(Debug, Clone)]
pub struct ModelFault(pub Arc<ModelError>);

impl std::fmt::Display for ModelFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ModelFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl PartialEq for ModelFault {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        EngineError::Model(ModelFault(Arc::new(e)))
    }
}

impl From<lamina_gguf::FileChanged> for EngineError {
    fn from(e: lamina_gguf::FileChanged) -> Self {
        EngineError::FileChanged {
            path: e.path,
            reason: e.change.to_string(),
        }
    }
}
