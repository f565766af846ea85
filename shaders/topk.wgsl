// Each row's K best values, best first: the candidates of lamina_sampling's
// top-k sampler (`best`), so a sampled step reads back K (key, index) pairs
// per sequence instead of its whole vocabulary of logits.
//
// The order is the sampler's: higher first under IEEE total order (+0 above
// -0, -inf last of the numbers), ties to the lower index, NaN never a
// candidate. Values are compared as integer keys that preserve that order
// (and round-trip to the same bits), never as floats, so every device
// gives the host's bits and order.
//
// A stage takes each row's `len` items in chunks of CH, a workgroup per
// (chunk, row): it sorts the chunk in workgroup memory (a bitonic network
// over CH slots, empty slots last) and writes its best `k` pairs, empty
// ones as (0, NONE). The host runs stages until a row is one chunk: the
// K best of a row are among the K best of its chunks. Stage one reads the
// logits (item j of row r at src[r * stride + j], index j), later stages
// the pairs (item j at src[2 (r * stride + j)]).

#include "common/params.wgsl"
#include "common/ranked.wgsl"

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: TopkParams;

const WG: u32 = 256u;
const CH: u32 = {{CH}}u;
const PER: u32 = CH / WG;

var<workgroup> keys: array<u32, CH>;
var<workgroup> idxs: array<u32, CH>;

// The key of an f32's bits in total order; NaN has none (index NONE).
fn key_of(bits: u32) -> u32 {
    if ((bits & 0x80000000u) != 0u) {
        return ~bits;
    }
    return bits | 0x80000000u;
}

fn is_nan(bits: u32) -> bool {
    return (bits & 0x7fffffffu) > 0x7f800000u;
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let chunk = wid.x;
    let row = wid.y;
    let start = chunk * CH;
    for (var t = 0u; t < PER; t++) {
        let s = t * WG + li;
        let j = start + s;
        var k = 0u;
        var i = NONE;
        if (row < p.rows && j < p.len) {
            let at = row * p.stride + j;
            if (p.pairs == 0u) {
                let bits = src[at];
                if (!is_nan(bits)) {
                    k = key_of(bits);
                    i = j;
                }
            } else {
                k = src[2u * at];
                i = src[2u * at + 1u];
            }
        }
        keys[s] = k;
        idxs[s] = i;
    }
    workgroupBarrier();
    // Bitonic sort, best first: CH / 2 compare-exchanges per step, PER / 2
    // per invocation; the barriers are reached by every invocation.
    for (var size = 2u; size <= CH; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            for (var t = 0u; t < PER / 2u; t++) {
                let q = t * WG + li;
                let a = 2u * q - (q & (stride - 1u));
                let b = a + stride;
                let ka = keys[a];
                let ia = idxs[a];
                let kb = keys[b];
                let ib = idxs[b];
                // In a block whose bit `size` is clear the better goes
                // first; in the others last, so the pair of blocks forms
                // one bitonic sequence for the next size.
                let first_best = (a & size) == 0u;
                if (beats(kb, ib, ka, ia) == first_best) {
                    keys[a] = kb;
                    idxs[a] = ib;
                    keys[b] = ka;
                    idxs[b] = ia;
                }
            }
            workgroupBarrier();
        }
    }
    if (row < p.rows) {
        for (var j = li; j < p.k; j += WG) {
            let out = 2u * ((row * p.chunks + chunk) * p.k + j);
            dst[out] = keys[j];
            dst[out + 1u] = idxs[j];
        }
    }
}
