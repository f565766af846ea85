//! The wgpu device and the WGSL kernels.
