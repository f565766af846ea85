//! Architectures as data ([`Config`]), their weights found and shape-checked
//! in the file ([`Weights`]), and the forward pass ([`CpuModel`]).

pub mod arch;
pub mod block;
pub mod config;
pub mod cpu;
mod delta;
pub mod error;
pub mod gpu;
pub mod kv;
pub mod memory;
pub mod moe;
pub mod ops;
pub mod placement;
pub mod plan;
pub mod program;
mod sampling_defaults;
pub mod weights;

pub use block::{Block, RopeSpec, Window};
pub use config::{Activation, Arch, Config, Moe};
pub use cpu::{CpuModel, Logits};
pub use error::ModelError;
pub use gpu::{Candidates, HybridCache, HybridModel};
pub use kv::{KvCache, KvType, KvTypes};
pub use sampling_defaults::FileSampling;
pub use weights::{Experts, Ffn, Layer, Matrix, Weights};
