// The attention kernels' cache loads for q8_0 caches (9-word blocks: eight
// words of i8 quants, value 4w + b in byte b of word w, then the f16 scale
// in the low half of word 8; KvElem in ops/fused.rs): vec4 i of the keys or
// values (values 4i .. 4i + 3, word i mod 8 of block i / 8), widened as the
// CPU's cache widens them, q · d with d the f16 scale as f32: the same
// bits as an f32 cache holding those values.

fn q8_widen(w: u32, s: u32) -> vec4<f32> {
    let q = vec4<i32>(
        bitcast<i32>(w << 24u) >> 24u,
        bitcast<i32>(w << 16u) >> 24u,
        bitcast<i32>(w << 8u) >> 24u,
        bitcast<i32>(w) >> 24u,
    );
    return vec4<f32>(q) * unpack2x16float(s).x;
}

fn k4(i: u32) -> vec4<f32> {
    let b = i / 8u * 9u;
    return q8_widen(k[b + i % 8u], k[b + 8u]);
}

fn v4(i: u32) -> vec4<f32> {
    let b = i / 8u * 9u;
    return q8_widen(v[b + i % 8u], v[b + 8u]);
}
