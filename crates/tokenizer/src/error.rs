//! The tokenizer's error type: every way GGUF tokenizer metadata can be
//! unusable, each naming the key at fault.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("metadata key {key} is missing")]
    MissingKey { key: &'static str },

    #[error("metadata key {key} holds {found}, expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },

    #[error("metadata key {key} has {found} entries, fewer than the {tokens} tokens")]
    TooShort {
        key: &'static str,
        found: usize,
        tokens: usize,
    },

    #[error("tokenizer.ggml.tokens is empty")]
    EmptyVocab,

    #[error("tokenizer.ggml.tokens has {0} entries, more than token ids can address")]
    VocabTooLarge(usize),

    #[error("tokenizer.ggml.tokens: duplicate token {text:?} at ids {first} and {second}")]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },

    #[error("unknown tokenizer model {0:?} (tokenizer.ggml.model)")]
    UnknownModel(String),

    #[error(
        "tokenizer model {0:?} (tokenizer.ggml.model) is known to llama.cpp but not supported yet"
    )]
    UnsupportedModel(String),

    #[error("unknown pre-tokenizer type {0:?} (tokenizer.ggml.pre)")]
    UnknownPre(String),

    #[error(
        "pre-tokenizer type {0:?} (tokenizer.ggml.pre) is known to llama.cpp but not supported yet"
    )]
    UnsupportedPre(String),

    #[error("{flag_key} is true, but {id_key} is not set")]
    MissingSpecial {
        flag_key: &'static str,
        id_key: &'static str,
    },

    #[error("building the BPE model from tokenizer.ggml.tokens and tokenizer.ggml.merges: {0}")]
    Bpe(String),

    #[error("pre-tokenizer regex for {pre:?}: {message}")]
    Regex { pre: String, message: String },
}
