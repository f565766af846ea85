// The buffers of attention.wgsl and attention_lanes.wgsl (one host call,
// the same bindings): q and out [n_tokens][n_head][HD]; the caches
// [row][n_kv_head][HD] of {{KV}}, read through k4 / v4 (common/kv_*.wgsl);
// the chunk partials; the token table.

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k: array<{{KV_VEC}}>;
@group(0) @binding(2) var<storage, read> v: array<{{KV_VEC}}>;
@group(0) @binding(3) var<storage, read_write> part: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> tab: array<u32>;

#include "common/kv_{{KV_LOAD}}.wgsl"
