use lamina_gguf::GgmlType;

use crate::plan::human_size;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("missing metadata key {key}")]
    MissingKey { key: String },
    #[error("metadata key {key} {reason}")]
    BadKey { key: String, reason: String },
    #[error("unsupported architecture {0:?} (supported: {supported})", supported = crate::arch::supported())]
    UnsupportedArch(String),
    #[error("missing tensor {name}")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {got:?}, expected {want:?}")]
    BadShape {
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("tensor {name} has type {ty}, which has no CPU kernel")]
    NoKernel { name: String, ty: GgmlType },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("position {pos} is past the context of {n_ctx}")]
    ContextFull { pos: usize, n_ctx: usize },
    #[error("a sequence in the batch has no tokens")]
    EmptyBatch,
    #[error("{0}")]
    Placement(String),
    #[error(
        "a KV cache of {count} x {n_ctx} positions over {n_layers} layers is too large to count \
         in bytes; lower -c/--ctx-size or -np/--parallel"
    )]
    KvOverflow {
        count: usize,
        n_ctx: usize,
        n_layers: usize,
    },
    #[error(
        "the KV cache needs {needed} bytes ({}) of host memory, but {available} bytes ({}) are \
         available ({measure}) and {reserve} bytes ({}) stay reserved for the weights and each step; \
         lower -c/--ctx-size or -np/--parallel (or set {} to try anyway)",
        human_size(*.needed),
        human_size(*.available),
        human_size(*.reserve),
        crate::memory::SKIP_CHECK_ENV
    )]
    HostMemory {
        needed: u64,
        available: u64,
        reserve: u64,
        measure: &'static str,
    },
    #[error(
        "allocating {bytes} bytes ({}) of KV cache failed; lower -c/--ctx-size or -np/--parallel",
        human_size(*.bytes)
    )]
    Alloc { bytes: u64 },
    #[error("KV cache type: {0}")]
    KvType(String),
    /// The device failed an operation (out of memory, lost, a kernel that
    /// would not build).
    #[error("GPU: {0}")]
    Gpu(#[from] lamina_gpu::GpuError),
    /// Uploading a tensor to the device failed.
    #[error("GPU: {name}: {source}")]
    GpuTensor {
        name: String,
        #[source]
        source: lamina_gpu::GpuError,
    },
    /// Opening the device `-ngl` asked for failed.
    #[error("opening the GPU for -ngl: {0}")]
    OpenGpu(#[source] lamina_gpu::GpuError),
    /// A GPU step asked for what this model, as loaded, cannot run (a
    /// caller's or this crate's bug), or that came back other than asked.
    #[error("GPU step: {0}")]
    Step(String),
    #[error(transparent)]
    Quant(#[from] lamina_quant::QuantError),
}

impl ModelError {
    /// Memory ran out, on the device or the host: a request may succeed
    /// once others finish (the server answers 503 with Retry-After).
    pub fn is_out_of_memory(&self) -> bool {
        use lamina_gpu::GpuError::OutOfMemory;
        matches!(
            self,
            ModelError::Gpu(OutOfMemory { .. })
                | ModelError::GpuTensor {
                    source: OutOfMemory { .. },
                    ..
                }
                | ModelError::Alloc { .. }
                | ModelError::HostMemory { .. }
        )
    }
}
