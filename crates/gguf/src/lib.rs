//! GGUF, read the way llama.cpp reads it, and trusting nothing.
//!
//! - [`read`]: the bounded parser (header, metadata, tensor table, alignment,
//!   data offset) and the offset checks.
//! - [`File`]: one file, memory-mapped or read, with zero-copy tensor views.
//! - [`Model`]: a file or the shards of a split file, opened as one.
//! - [`mapping`]: file maps that survive truncation (SIGBUS becomes zeros).
//! - [`watch`]: whether a mapped file is still the one opened
//!   ([`Model::check_unchanged`]).
//! - [`Writer`]: valid files for tests and synthetic models.
//! - [`GgmlType`]: the complete ggml type table.
//!
//! The format is described in ggml's `docs/gguf.md`; where llama.cpp's
//! `gguf.cpp` is stricter than the spec, this crate follows llama.cpp.

pub mod error;
pub mod file;
pub mod mapping;
pub mod read;
pub mod split;
pub mod types;
pub mod value;
pub mod watch;
pub mod write;

pub use error::{GgufError, Result};
pub use file::{File, LoadMode};
pub use read::{
    KvSpan, Layout, MetadataEntry, SizeCheck, TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH,
};
pub use split::{Model, Tensor};
pub use types::{GgmlType, TypeIdError};
pub use value::{Array, Value, ValueType};
pub use watch::{Change, FileChanged};
pub use write::Writer;
