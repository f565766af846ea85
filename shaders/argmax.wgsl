// Each row's argmax: the highest value, ties to the lowest index, NaN never
// chosen (lamina_sampling's `argmax`, which greedy decoding samples with).
// A step that decodes greedily then reads back two words per sequence
// instead of its whole vocabulary of logits.
//
// A stage reduces each row's `len` items in chunks of CH, a workgroup per
// (chunk, row), and writes one (key, index) pair per chunk; the host runs
// stages until a row is one pair. Stage one reads the logits themselves
// (item j of row r at src[r * stride + j], index j), later stages the pairs
// (item j at src[2 (r * stride + j)]).
//
// Values are compared as integer keys, never as floats: the order of the
// keys is the order of the floats (with -0 made +0, equal as the host's
// comparison has them), and an integer compare is exact on every device,
// where a float compare may flush subnormals to zero. Which of two items
// wins depends on their keys and indices only, never on the order they
// meet in, so any reduction order gives the host's answer.

#include "common/params.wgsl"
#include "common/ranked.wgsl"

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: ArgmaxParams;

const WG: u32 = 256u;
const CH: u32 = {{CH}}u;

var<workgroup> keys: array<u32, WG>;
var<workgroup> idxs: array<u32, WG>;

// The order-preserving key of an f32's bits; NaN has none.
fn key_of(bits: u32) -> vec2<u32> {
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return vec2<u32>(0u, 0u); // NaN: not a candidate
    }
    var b = bits;
    if (b == 0x80000000u) {
        b = 0u; // -0 equals +0
    }
    if ((b & 0x80000000u) != 0u) {
        return vec2<u32>(~b, 1u);
    }
    return vec2<u32>(b | 0x80000000u, 1u);
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let chunk = wid.x;
    let row = wid.y;
    let start = chunk * CH;
    let end = min(start + CH, p.len);
    var bk = 0u;
    var bi = NONE;
    // Uniform over the workgroup: every invocation reaches the barriers.
    if (row < p.rows) {
        for (var j = start + li; j < end; j += WG) {
            let at = row * p.stride + j;
            var k = 0u;
            var i = NONE;
            if (p.pairs == 0u) {
                let kv = key_of(src[at]);
                if (kv.y != 0u) {
                    k = kv.x;
                    i = j;
                }
            } else {
                k = src[2u * at];
                i = src[2u * at + 1u];
            }
            if (beats(k, i, bk, bi)) {
                bk = k;
                bi = i;
            }
        }
    }
    keys[li] = bk;
    idxs[li] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            let k = keys[li + s];
            let i = idxs[li + s];
            if (beats(k, i, keys[li], idxs[li])) {
                keys[li] = k;
                idxs[li] = i;
            }
        }
        workgroupBarrier();
    }
    if (li == 0u && row < p.rows) {
        let out = 2u * (row * p.chunks + chunk);
        dst[out] = keys[0];
        dst[out + 1u] = idxs[0];
    }
}
