//! The one error type of this crate. Every wgpu failure that would otherwise
//! panic (wgpu's default uncaptured-error handler) or silently produce wrong
//! numbers is turned into one of these values.

use lamina_gguf::GgmlType;

/// A failure of the GPU layer.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable adapter: no GPU driver, and no software Vulkan device either.
    #[error(
        "no GPU adapter with compute shaders found (backends tried: {backends}); \
         install a Vulkan driver, or the software one with `apt-get install mesa-vulkan-drivers libvulkan1` (lavapipe)"
    )]
    NoAdapter { backends: String },

    /// An adapter index was asked for that `list_adapters` does not have.
    #[error("adapter index {index} out of range: {count} adapter(s) found")]
    AdapterIndex { index: usize, count: usize },

    /// The adapter refused to create a device with the requested features and limits.
    #[error("requesting a device from adapter {adapter:?} failed: {message}")]
    RequestDevice { adapter: String, message: String },

    /// A composed shader failed to compile or its pipeline failed to build.
    /// `wgsl` is the composed source that was handed to the driver.
    #[error("kernel `{kernel}` failed to compile: {message}")]
    ShaderCompile {
        kernel: String,
        message: String,
        wgsl: String,
    },

    /// A kernel source asked for an include or substitution that does not exist.
    #[error("kernel `{kernel}`: {message}")]
    Compose { kernel: String, message: String },

    /// The device ran out of memory while creating `what`.
    #[error("out of GPU memory allocating {what} ({bytes} bytes)")]
    OutOfMemory { what: String, bytes: u64 },

    /// wgpu rejected an operation (a bug in this crate or an argument outside the
    /// device limits).
    #[error("GPU validation error in {what}: {message}")]
    Validation { what: String, message: String },

    /// There is no kernel for this tensor type on the GPU.
    #[error("type {ty} has no kernel on the GPU ({op})")]
    NoKernel { ty: GgmlType, op: &'static str },

    /// Shapes or lengths handed to an operation do not fit together.
    #[error("{op}: {message}")]
    Shape { op: &'static str, message: String },

    /// A single row (or other indivisible piece) is larger than one binding may be.
    #[error(
        "{what}: {bytes} bytes cannot be split below the storage binding limit of {limit} bytes"
    )]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },

    /// Mapping a buffer back to the host failed.
    #[error("reading back {what} failed: {message}")]
    Readback { what: String, message: String },

    /// The device was lost (driver reset, removal) or a wait on it failed.
    #[error("GPU device lost: {message}")]
    DeviceLost { message: String },
}

impl GpuError {
    /// Converts an error captured by a wgpu error scope or handler.
    pub(crate) fn from_wgpu(what: impl Into<String>, bytes: u64, err: wgpu::Error) -> Self {
        let what = what.into();
        match err {
            wgpu::Error::OutOfMemory { .. } => GpuError::OutOfMemory { what, bytes },
            wgpu::Error::Validation { description, .. } => GpuError::Validation {
                what,
                message: description,
            },
            wgpu::Error::Internal { description, .. } => GpuError::Validation {
                what,
                message: format!("internal error: {description}"),
            },
        }
    }
}
