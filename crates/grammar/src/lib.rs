//! Structured output by constrained decoding: the output of a request is
//! kept inside a JSON schema, JSON mode, a grammar or a tool-call shape by
//! banning, before each token is sampled, every token that would leave it.
//!
//! The grammar engine is llguidance (the one llama.cpp itself can use),
//! not a hand-written one: it compiles JSON schemas and Lark-like grammars
//! into a lexer and an Earley parser and computes a step's mask by walking
//! the vocabulary's trie.
//!
//! - [`Vocab`] (`vocab.rs`): the model's vocabulary as llguidance sees it,
//!   built once per model from Lamina's tokenizer.
//! - [`Spec`], [`Constraint`], [`Mask`] (`constraint.rs`): what a request
//!   asks for, compiled (failing closed: a grammar or schema llguidance
//!   refuses is an error, never an unconstrained answer), and the masks.
//! - `gbnf.rs`: llama.cpp's GBNF grammars translated to Lark.
//! - [`call_grammar`] (`tools.rs`): a required tool call as a grammar.
//! - [`Ahead`] (`ahead.rs`): the next mask computed on another thread
//!   while the model computes the logits.
//!
//! Test with `cargo test -p lamina-grammar` (the real models must be
//! fetched by `scripts/fetch-models.sh`).

mod ahead;
mod constraint;
mod error;
mod gbnf;
mod tools;
mod vocab;

pub use ahead::Ahead;
pub use constraint::{Constraint, Mask, Spec, MAX_JSON_WS};
pub use error::GrammarError;
pub use gbnf::to_lark as gbnf_to_lark;
pub use tools::{call_grammar, ToolSpec};
pub use vocab::Vocab;
