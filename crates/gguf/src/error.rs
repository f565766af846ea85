//! Every way a GGUF file can be wrong, each with the absolute byte offset
//! where the reader found it.

use std::path::PathBuf;

use crate::types::TypeIdError;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("at byte {offset}: file ends while reading {what} ({need} bytes needed, {have} left)")]
    Truncated {
        offset: u64,
        what: &'static str,
        need: u64,
        have: u64,
    },
    #[error("at byte 0: bad magic {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("at byte 4: this is a big-endian GGUF file; only little-endian files are supported (is there a mismatch between the host and model endianness?)")]
    BigEndian,
    #[error("at byte 4: unsupported GGUF version {version} (supported: 1 read-only, 2, 3)")]
    BadVersion { version: u32 },
    #[error("at byte {offset}: {what} {count} cannot fit in the {remaining} bytes that remain")]
    CountTooLarge {
        offset: u64,
        what: &'static str,
        count: u64,
        remaining: u64,
    },
    #[error("at byte {offset}: {what} is not valid UTF-8")]
    BadUtf8 { offset: u64, what: &'static str },
    #[error("at byte {offset}: empty metadata key")]
    EmptyKey { offset: u64 },
    #[error("at byte {offset}: duplicate metadata key {key:?}")]
    DuplicateKey { offset: u64, key: String },
    #[error("at byte {offset}: key {key:?} has unknown value type {type_id}")]
    BadValueType {
        offset: u64,
        key: String,
        type_id: u32,
    },
    #[error("at byte {offset}: key {key:?} nests arrays deeper than {limit}")]
    ArrayTooDeep {
        offset: u64,
        key: String,
        limit: usize,
    },
    #[error("at byte {offset}: general.alignment {reason}")]
    BadAlignment { offset: u64, reason: String },
    #[error("at byte {offset}: tensor name {name:?} is {len} bytes; ggml allows at most 63")]
    NameTooLong {
        offset: u64,
        name: String,
        len: usize,
    },
    #[error("at byte {offset}: duplicate tensor name {name:?}")]
    DuplicateTensor { offset: u64, name: String },
    #[error("at byte {offset}: tensor {name:?} has {n_dims} dimensions; ggml allows at most 4")]
    TooManyDims {
        offset: u64,
        name: String,
        n_dims: u64,
    },
    #[error("at byte {offset}: tensor {name:?}: {reason}")]
    BadShape {
        offset: u64,
        name: String,
        reason: String,
    },
    #[error("at byte {offset}: tensor {name:?}: {source}")]
    BadTensorType {
        offset: u64,
        name: String,
        source: TypeIdError,
    },
    #[error("at byte {offset}: tensor {name:?}: {reason}")]
    BadOffset {
        offset: u64,
        name: String,
        reason: String,
    },
    #[error("split model: {0}")]
    Split(String),
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
