//! The wgpu device and the WGSL kernels of Lamina.
//!
//! * [`device`]: adapter discovery ([`list_adapters`]) and [`Gpu::new`], with
//!   the adapter's own limits and wgpu errors turned into [`GpuError`] values.
//! * [`buffer`]: activation [`Tensor`]s and quantized [`Weight`]s; weights keep
//!   their ggml blocks and are split by rows across bindings when larger than
//!   the storage binding limit.
//! * [`ops`]: recording kernels into a [`Batch`] (mat-vec / mat-mul per ggml
//!   type, row lookup, RMSNorm, RoPE, softmax, attention, gated activations,
//!   add, bias rows, scale, copy)
//!   and submitting them as one command buffer. [`ops::matmul`] states the
//!   canonical reduction order that makes every mat-mul batch invariant.
//! * `shader`: composition of the `.wgsl` files in `shaders/` and the
//!   pipeline cache.
//!
//! ```no_run
//! # fn main() -> Result<(), lamina_gpu::GpuError> {
//! use lamina_gpu::{Gpu, GpuOptions};
//! use lamina_gguf::GgmlType;
//! let gpu = Gpu::new(GpuOptions::default())?;
//! let w = gpu.upload_weight(GgmlType::F32, 2, 3, bytemuck::cast_slice(&[1f32, 2., 3., 4., 5., 6.]))?;
//! let x = gpu.upload_f32(&[1.0, 1.0, 1.0])?;
//! let y = gpu.tensor(2)?;
//! let mut batch = gpu.batch();
//! batch.matmul(&w, &x, &y, 1)?;
//! batch.submit()?;
//! assert_eq!(gpu.read_f32(&y)?, vec![6.0, 15.0]);
//! # Ok(()) }
//! ```

pub mod bench;
pub mod buffer;
pub mod device;
mod error;
mod grids;
pub mod ops;
mod params;
pub mod quant;
mod shader;

pub use buffer::{row_bytes, Tensor, Weight, WordCopy, WEIGHT_PAD};
pub use device::{list_adapters, AdapterInfo, Gpu, GpuOptions, HostCounters};
pub use error::GpuError;
pub use ops::{
    argmax_scratch_len, attention_scratch_len, Attention, Batch, Columns, DeltaShape, Fuse, Gate,
    KvElem, MatmulKernel, MatvecShape, MoeRouting, NormAfter, QkvLayout, Rope, RopeOut, Runs,
    TokenRow, TokenTable, ARGMAX_MAX_LEN, ARGMAX_NONE, ATTN_CHUNK, DELTA_MAX_HEAD, KV_Q8_BLOCK,
    KV_Q8_WORDS, LANES, MAX_SMALL_COLS, MOE_ROUTE_MAX_EXPERTS,
};
pub use ops::{topk_scratch_len, topk_value, TOPK_MAX, TOPK_NONE};
pub use quant::{has_kernel, SUPPORTED};
