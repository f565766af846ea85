//! The crate's one error type. Every variant is the request's fault except
//! `Vocab` (the model's vocabulary cannot be described to llguidance) and
//! `Worker` (the mask thread is gone), so the server answers most with 400.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum GrammarError {
    /// A GBNF grammar that does not parse; `at` is the byte offset.
    #[error("GBNF grammar: {message} at byte {at}")]
    Gbnf { message: String, at: usize },

    /// A JSON schema that is not one (not an object or a boolean), or that
    /// no value satisfies.
    #[error("JSON schema: {0}")]
    Schema(String),

    /// llguidance refused the grammar or schema (syntax, unsupported
    /// keyword, a limit on its size).
    #[error("{0}")]
    Compile(String),

    /// The grammar failed while generating: a parser limit was hit, or no
    /// token can continue the text.
    #[error("constrained decoding stopped: {0}")]
    Decode(String),

    /// A tool-call constraint that cannot be built from the request's tools.
    #[error("{0}")]
    Tools(String),

    /// The vocabulary cannot be given to llguidance.
    #[error("vocabulary: {0}")]
    Vocab(String),

    /// The thread computing masks ended unexpectedly.
    #[error("the grammar's mask thread stopped")]
    Worker,
}
