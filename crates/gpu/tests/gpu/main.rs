//! GPU tests, in one binary so every kernel is compiled once per run (a
//! software Vulkan device spends far longer compiling than running them).
//! They share one device and take turns on it (see `common::gpu`).
#![allow(clippy::unwrap_used)]

mod argmax;
mod common;
mod delta;
mod device;
mod elementwise;
mod fused;
mod invariance;
mod matmul;
mod moe;
mod q8_cache;
mod rows;
mod split;
mod topk;
