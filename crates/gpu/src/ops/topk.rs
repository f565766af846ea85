//! Each row's best values on the device (`shaders/topk.wgsl`): the
//! candidates of a top-k sampler, so a sampled step reads back `k` pairs
//! per sequence instead of its vocabulary.

use super::{shape, to_u32, Batch};
use crate::buffer::Tensor;
use crate::error::GpuError;
use crate::params::TopkParams;
use crate::shader::KernelSpec;

/// Items one workgroup sorts: four per invocation.
const TOPK_CHUNK: usize = 1024;
/// The largest `k` [`Batch::topk_rows`] takes: an eighth of a chunk, so
/// each stage leaves a row at most an eighth of its items (Gemma 3's
/// 262144 logits take three stages at any `k` up to this).
pub const TOPK_MAX: usize = 128;
/// The index of an empty pair: a row with fewer than `k` values that are
/// not NaN.
pub const TOPK_NONE: u32 = u32::MAX;

fn topk_spec() -> KernelSpec {
    KernelSpec::new("topk.wgsl").def("CH", TOPK_CHUNK.to_string())
}

#[cfg(test)]
pub(crate) fn topk_specs() -> Vec<KernelSpec> {
    vec![topk_spec()]
}

/// Words each of [`Batch::topk_rows`]'s two scratch tensors needs for
/// `rows` rows of `len` values and `k` best.
pub fn topk_scratch_len(rows: usize, len: usize, k: usize) -> usize {
    rows.saturating_mul(len.div_ceil(TOPK_CHUNK))
        .saturating_mul(k)
        .saturating_mul(2)
}

/// The value of a pair's order key: the f32 whose bits the key preserved.
pub fn topk_value(key: u32) -> f32 {
    f32::from_bits(if key & 0x8000_0000 != 0 {
        key & 0x7fff_ffff
    } else {
        !key
    })
}

impl Batch<'_> {
    /// Each row's `k` best values, best first: higher first in IEEE total
    /// order (+0 above -0), ties to the lower index, NaN never one of them,
    /// as lamina_sampling's top-k candidates. Row `r` is the `len` values
    /// of `x` from element `r * stride`. `out` gets `k` pairs per row,
    /// `2·k` words: an order key ([`topk_value`] gives the value back, bit
    /// for bit) and the index, [`TOPK_NONE`] where the row ran out of
    /// values. `scratch` holds the stages between: two tensors of
    /// [`topk_scratch_len`] words each. One dispatch per stage; a stage
    /// leaves each row at most an eighth of its items.
    #[allow(clippy::too_many_arguments)]
    pub fn topk_rows(
        &mut self,
        x: &Tensor,
        rows: usize,
        len: usize,
        stride: usize,
        k: usize,
        scratch: [&Tensor; 2],
        out: &Tensor,
    ) -> Result<(), GpuError> {
        const OP: &str = "topk";
        let last = rows
            .checked_sub(1)
            .and_then(|r| r.checked_mul(stride))
            .and_then(|a| a.checked_add(len));
        let need = topk_scratch_len(rows, len, k);
        let chunks = len.div_ceil(TOPK_CHUNK);
        if len == 0
            || !(1..=TOPK_MAX).contains(&k)
            || (rows > 1 && stride < len)
            || last.is_some_and(|end| end > x.len())
            || rows.checked_mul(2 * k).is_none_or(|w| w > out.len())
            || (chunks > 1 && scratch.iter().any(|s| s.len() < need))
        {
            return Err(shape(
                OP,
                format!(
                    "{rows} rows of {len} (stride {stride}), k {k} (1..={TOPK_MAX}), in {} \
                     values, scratch {} and {} (need {need}), out {}",
                    x.len(),
                    scratch[0].len(),
                    scratch[1].len(),
                    out.len()
                ),
            ));
        }
        Self::distinct(OP, out, &[x, scratch[0], scratch[1]])?;
        Self::distinct(OP, scratch[0], &[x, scratch[1]])?;
        Self::distinct(OP, scratch[1], &[x])?;
        if rows == 0 {
            return Ok(());
        }
        let rows32 = to_u32(OP, "rows", rows)?;
        if rows32 > self.gpu.limits().max_compute_workgroups_per_dimension {
            return Err(shape(OP, format!("{rows} rows in one dispatch")));
        }
        let spec = topk_spec();
        // Stage one: the values; then pairs, `chunks·k` a row, until a row
        // is one chunk, which writes `out`.
        let (mut len, mut stride, mut pairs, mut from) = (len, stride, false, x);
        let mut turn = 0;
        loop {
            let chunks = len.div_ceil(TOPK_CHUNK);
            let to = if chunks == 1 { out } else { scratch[turn] };
            let params = TopkParams {
                rows: rows32,
                len: to_u32(OP, "len", len)?,
                stride: to_u32(OP, "stride", stride)?,
                chunks: to_u32(OP, "chunks", chunks)?,
                pairs: u32::from(pairs),
                k: to_u32(OP, "k", k)?,
                _pad: [0; 2],
            };
            let groups = to_u32(OP, "chunks", chunks)?;
            self.push(
                &spec,
                &[(&from.buf, None), (&to.buf, None)],
                &params,
                [groups, rows32, 1],
            )?;
            if chunks == 1 {
                return Ok(());
            }
            len = chunks * k;
            stride = len;
            pairs = true;
            from = to;
            turn = 1 - turn;
        }
    }
}
