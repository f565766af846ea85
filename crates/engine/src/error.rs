//! The engine's one error type. The server maps each kind to a status:
//! `Overloaded` and `NotReady` are the client's cue to retry (503), `Invalid`
//! is the request's fault (400), the rest are faults of the server (500).

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

    /// Loading the model failed.
    #[error("loading the model: {0}")]
    Load(String),

    /// The forward pass failed mid-request.
    #[error("model fault: {0}")]
    Model(String),
}
