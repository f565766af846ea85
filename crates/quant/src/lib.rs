//! ggml block layouts and CPU kernels over them.
//!
//! Every decoder here is a port of ggml's `dequantize_row_*` (`src/ggml-quants.c`)
//! that performs the same f32 operations in the same order, so its output equals
//! ggml's bit for bit; golden blocks produced by the independent numpy decoders of
//! the `gguf` Python package check that in `tests/`. Layouts are cited per module.
//!
//! [`dot_row`], [`matvec`] and [`matmul`] multiply straight from the quantized blocks,
//! decoding a chunk at a time (see the `dot` module for the reduction order that makes
//! them batch invariant). On x86-64 the common types run AVX-512 or AVX2 kernels,
//! chosen at run time and bit-identical to the portable path; [`SIMD_LIMIT_VAR`] caps
//! the choice.
//!
//! Inputs are untrusted: lengths are checked up front and reported as
//! [`QuantError`]; nothing in this crate panics on a malformed buffer.

pub mod act;
mod block;
mod dot;
mod error;
mod float;
mod fp4;
pub mod iq_tables;
mod iquants;
mod kquants;
pub mod kv;
mod legacy;
mod ternary;

pub use dot::{
    attention_scores, attention_scores_heads, attention_scores_rows, attention_values,
    attention_values_heads, attention_values_rows, dot_f32, SIMD_LIMIT_VAR,
};
pub use error::QuantError;
pub use kv::{KvData, KvRows};
pub use lamina_gguf::GgmlType;

/// Decodes whole blocks: `src` holds `n` blocks and `dst` exactly `n · block_size` weights.
pub(crate) type Decoder = fn(&[u8], &mut [f32]);

/// The decoder of `ty`, or `None` where this crate has none.
pub(crate) fn decoder(ty: GgmlType) -> Option<Decoder> {
    use GgmlType::*;
    let f: Decoder = match ty {
        F32 => float::f32_le,
        F16 => float::f16_le,
        BF16 => float::bf16_le,
        Q4_0 => legacy::q4_0,
        Q4_1 => legacy::q4_1,
        Q5_0 => legacy::q5_0,
        Q5_1 => legacy::q5_1,
        Q8_0 => legacy::q8_0,
        Q8_1 => legacy::q8_1,
        Q2K => kquants::q2_k,
        Q3K => kquants::q3_k,
        Q4K => kquants::q4_k,
        Q5K => kquants::q5_k,
        Q6K => kquants::q6_k,
        Q8K => kquants::q8_k,
        IQ2XXS => iquants::iq2_xxs,
        IQ2XS => iquants::iq2_xs,
        IQ2S => iquants::iq2_s,
        IQ3XXS => iquants::iq3_xxs,
        IQ3S => iquants::iq3_s,
        IQ1S => iquants::iq1_s,
        IQ1M => iquants::iq1_m,
        IQ4NL => iquants::iq4_nl,
        IQ4XS => iquants::iq4_xs,
        TQ1_0 => ternary::tq1_0,
        TQ2_0 => ternary::tq2_0,
        MXFP4 => fp4::mxfp4,
        NVFP4 => fp4::nvfp4,
        // Integer and f64 tensors are not weights; Q1_0 and Q2_0 have no reference
        // decoder to test against yet. Listed, not wildcarded, so a new type is a
        // compile error here.
        I8 | I16 | I32 | I64 | F64 | Q1_0 | Q2_0 => return None,
    };
    Some(f)
}

/// Which types this crate can dequantize.
pub fn supports(ty: GgmlType) -> bool {
    decoder(ty).is_some()
}

/// Block geometry as `usize`: (weights per block, bytes per block).
fn geometry(ty: GgmlType) -> (usize, usize) {
    // The type table holds small constants (at most 256 weights, 292 bytes).
    (ty.block_size() as usize, ty.type_size() as usize)
}

/// Checks that `bytes` is whole blocks of `ty` and returns the number of weights.
fn weights_in(ty: GgmlType, bytes: usize) -> Result<usize, QuantError> {
    let (bs, ts) = geometry(ty);
    if bytes % ts != 0 {
        return Err(QuantError::PartialBlock {
            ty,
            bytes,
            type_size: ts,
        });
    }
    // bytes / ts · bs ≤ bytes · 32 for every type; overflow needs a buffer near usize::MAX.
    (bytes / ts).checked_mul(bs).ok_or(QuantError::Overflow {
        ty,
        rows: 1,
        cols: bytes,
    })
}

/// Dequantizes `src` (whole blocks of `ty`) into `dst` (dst.len() == weights in src).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let decode = decoder(ty).ok_or(QuantError::Unsupported { ty })?;
    let n = weights_in(ty, src.len())?;
    if dst.len() != n {
        return Err(QuantError::LengthMismatch {
            ty,
            what: "dst",
            expected: n,
            actual: dst.len(),
        });
    }
    decode(src, dst);
    Ok(())
}

/// The row kernel of `ty`, or `Unsupported`.
fn kernel(ty: GgmlType) -> Result<dot::RowKernel, QuantError> {
    let decode = decoder(ty).ok_or(QuantError::Unsupported { ty })?;
    let (block_size, type_size) = geometry(ty);
    Ok(dot::RowKernel::new(ty, decode, block_size, type_size))
}

fn check_len(
    ty: GgmlType,
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), QuantError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            ty,
            what,
            expected,
            actual,
        })
    }
}

/// Bytes of one row of `cols` weights, checking that the row is whole blocks.
fn row_bytes(ty: GgmlType, cols: usize) -> Result<usize, QuantError> {
    let (bs, ts) = geometry(ty);
    if cols % bs != 0 {
        return Err(QuantError::PartialRow {
            ty,
            cols,
            block_size: bs,
        });
    }
    (cols / bs)
        .checked_mul(ts)
        .ok_or(QuantError::Overflow { ty, rows: 1, cols })
}

/// Checks the weight matrix of `rows` × `cols` and returns the bytes per row.
fn check_matrix(ty: GgmlType, w: &[u8], rows: usize, cols: usize) -> Result<usize, QuantError> {
    let rb = row_bytes(ty, cols)?;
    let total = rows
        .checked_mul(rb)
        .ok_or(QuantError::Overflow { ty, rows, cols })?;
    check_len(ty, "w (bytes)", total, w.len())?;
    Ok(rb)
}

/// Dot product of one quantized row with an f32 vector (x.len() == weights in row).
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let k = kernel(ty)?;
    let n = weights_in(ty, row.len())?;
    check_len(ty, "x", n, x.len())?;
    Ok(k.dot(row, x))
}

/// `y[r] = W[r]·x` for a row-major matrix of `rows` rows, each `cols` weights; multithreaded (rayon).
///
/// `w` is `rows` rows of `cols / block_size` blocks each; `cols` must be whole blocks.
pub fn matvec(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), QuantError> {
    let k = kernel(ty)?;
    let rb = check_matrix(ty, w, rows, cols)?;
    check_len(ty, "x", cols, x.len())?;
    check_len(ty, "y", rows, y.len())?;
    k.matvec(w, rb, x, y);
    Ok(())
}

/// `Y[c][r] = W[r]·X[c]` for n columns (X and Y column-major: column c of X is
/// `x[c*cols..(c+1)*cols]`, column c of Y is `y[c*rows..(c+1)*rows]`).
///
/// Batch invariant: column c of the result is bit-identical to [`matvec`] of column c
/// alone (and to [`dot_row`] per row), for every n.
pub fn matmul(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), QuantError> {
    let k = kernel(ty)?;
    let rb = check_matrix(ty, w, rows, cols)?;
    let x_len = n
        .checked_mul(cols)
        .ok_or(QuantError::Overflow { ty, rows: n, cols })?;
    let y_len = n
        .checked_mul(rows)
        .ok_or(QuantError::Overflow { ty, rows, cols: n })?;
    check_len(ty, "x", x_len, x.len())?;
    check_len(ty, "y", y_len, y.len())?;
    k.matmul(w, rows, rb, x, n, y);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each decoder's compile-time block geometry must agree with the type table,
    /// or it would silently skip weights: decoding three zero blocks must overwrite
    /// every NaN placeholder.
    #[test]
    fn decoders_cover_every_weight_of_every_block() {
        for ty in GgmlType::ALL.into_iter().filter(|t| supports(*t)) {
            let (bs, ts) = geometry(ty);
            let src = vec![0u8; 3 * ts];
            let mut dst = vec![f32::NAN; 3 * bs];
            assert_eq!(dequantize(ty, &src, &mut dst), Ok(()));
            assert!(
                dst.iter().all(|v| v.is_finite()),
                "{ty} left weights unwritten"
            );
        }
    }
}
