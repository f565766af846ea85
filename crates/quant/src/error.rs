//! The one error type of this crate: every malformed input is reported with the
//! type and the lengths involved, never by a panic.

use lamina_gguf::GgmlType;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantError {
    /// The type has no CPU kernel here (integer and f64 tensors, and the newest
    /// types without a published reference decoder).
    #[error("type {ty} has no CPU kernel")]
    Unsupported { ty: GgmlType },

    /// A byte buffer that does not end on a block boundary.
    #[error("{ty}: {bytes} bytes is not a whole number of {type_size}-byte blocks")]
    PartialBlock {
        ty: GgmlType,
        bytes: usize,
        type_size: usize,
    },

    /// A row length (in weights) that is not a whole number of blocks.
    #[error("{ty}: row of {cols} weights is not a whole number of {block_size}-weight blocks")]
    PartialRow {
        ty: GgmlType,
        cols: usize,
        block_size: usize,
    },

    /// A buffer whose length disagrees with the shape the call describes.
    #[error("{ty}: {what} has length {actual}, expected {expected}")]
    LengthMismatch {
        ty: GgmlType,
        what: &'static str,
        expected: usize,
        actual: usize,
    },

    /// A shape whose element or byte count does not fit in `usize`.
    #[error("{ty}: shape {rows} x {cols} overflows the address space")]
    Overflow {
        ty: GgmlType,
        rows: usize,
        cols: usize,
    },
}
