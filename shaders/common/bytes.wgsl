// Byte access to the weight binding `w: array<u32>`, which the including
// kernel declares. ggml blocks are byte-packed and many are not 4-byte
// aligned (Q4_0 18 B, Q8_0 34 B, Q3_K 110 B, Q6_K 210 B), so fields are read
// by byte offset; all values are little-endian. Weight buffers carry 128
// bytes of padding, so a read straddling the last word, or the unused lanes
// of a float row's last 32-weight unit, stay inside the buffer.

// The byte at offset `b`.
fn wb_u8(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) << 3u)) & 0xffu;
}

// The 16-bit value at an even offset `b`.
fn wb_u16(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 2u) << 3u)) & 0xffffu;
}

// The IEEE half at an even offset `b`, widened to f32.
fn wb_f16(b: u32) -> f32 {
    return unpack2x16float(wb_u16(b)).x;
}

// The 32-bit value at any offset `b`, funnel-shifted from two words when
// unaligned. (A shift by 32 is taken modulo 32 in WGSL, hence the select.)
fn wb_u32(b: u32) -> u32 {
    let i = b >> 2u;
    let sh = (b & 3u) << 3u;
    let hi = select(w[i + 1u] << (32u - sh), 0u, sh == 0u);
    return (w[i] >> sh) | hi;
}

// The four bytes of `q`, byte 0 first, as unsigned values.
fn u8x4(q: u32) -> vec4<f32> {
    return vec4<f32>(
        f32(q & 0xffu),
        f32((q >> 8u) & 0xffu),
        f32((q >> 16u) & 0xffu),
        f32(q >> 24u)
    );
}

// The four bytes of `q`, byte 0 first, as signed (int8) values.
fn i8x4(q: u32) -> vec4<f32> {
    let s = bitcast<i32>(q);
    return vec4<f32>(
        f32((s << 24u) >> 24u),
        f32((s << 16u) >> 24u),
        f32((s << 8u) >> 24u),
        f32(s >> 24u)
    );
}

// The 4 (w4_at) or 8 (w8_at) little-endian words starting at an even byte
// offset `b`, from one load per word plus one: the whole-unit decoders
// (dq32) read a block's bytes once with these instead of one funnel-shifted
// pair of loads per word.
fn w4_at(b: u32) -> array<u32, 4> {
    let i = b >> 2u;
    let odd = (b & 2u) != 0u;
    var o: array<u32, 4>;
    var prev = w[i];
    for (var k = 0u; k < 4u; k++) {
        let next = w[i + k + 1u];
        o[k] = select(prev, (prev >> 16u) | (next << 16u), odd);
        prev = next;
    }
    return o;
}

fn w8_at(b: u32) -> array<u32, 8> {
    let i = b >> 2u;
    let odd = (b & 2u) != 0u;
    var o: array<u32, 8>;
    var prev = w[i];
    for (var k = 0u; k < 8u; k++) {
        let next = w[i + k + 1u];
        o[k] = select(prev, (prev >> 16u) | (next << 16u), odd);
        prev = next;
    }
    return o;
}

