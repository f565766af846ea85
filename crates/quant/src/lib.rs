//! ggml block layouts and CPU kernels over them.
//!
//! Every decoder here is a port of ggml's `dequantize_row_*` (`src/ggml-quants.c`)
//! that performs the same f32 operations in the same order, so its output equals
//! ggml's bit for bit; golden blocks produced by the independent numpy decoders of
//! the `gguf` Python package check that in `tests/`. Layouts are cited per module.
//!
//! Inputs are untrusted: lengths are checked up front and reported as
//! [`QuantError`]; nothing in this crate panics on a malformed buffer.

mod block;
mod error;
mod float;
mod fp4;
pub mod iq_tables;
mod iquants;
mod kquants;
mod legacy;
mod ternary;

pub use error::QuantError;
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
        _ => return None,
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
