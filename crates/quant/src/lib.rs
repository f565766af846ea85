//! ggml block layouts and CPU kernels over them.
