//! GGUF, read the way llama.cpp reads it, and trusting nothing.
pub mod types;
pub use types::{GgmlType, TypeIdError};
