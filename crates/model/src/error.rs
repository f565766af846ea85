use lamina_gguf::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("missing metadata key {key}")]
    MissingKey { key: String },
    #[error("metadata key {key} {reason}")]
    BadKey { key: String, reason: String },
    #[error("unsupported architecture {0:?} (supported: llama, qwen2, qwen3, gemma3)")]
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
    #[error("GPU: {0}")]
    Gpu(String),
    #[error(transparent)]
    Quant(#[from] lamina_quant::QuantError),
}
