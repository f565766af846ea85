// Packs a step's (token, slot) pairs by expert on the device, after
// moe_route, so each expert's products stream its weights once for all its
// tokens without the host learning which experts were chosen. In `out`
// (moe_route's words, MoePackParams says where):
// - the weighed sum's row of pair i (out[i]) becomes its packed column;
// - the packed runs replace the router's tables from runs_at: each
//   expert's packed columns in runs of up to maxc, the same columns of x
//   and y, then empty runs (no columns) up to max_runs;
// - out[gather_at + j] is packed column j's token (gather_cols.wgsl copies
//   the inputs into that order);
// - `args` gets the two products' indirect dispatch arguments (their grids
//   over rows, and the runs that hold columns), so no empty run is
//   dispatched: a CPU-backed device would run an empty workgroup's whole
//   body with its lanes masked.
// Within an expert the order of its pairs is the atomics', which may vary
// from run to run; no value depends on it (every column is its own
// product, and the sum reads each pair's row back by the table).
// One workgroup: the counts per expert live in its memory.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read_write> args: array<u32>;
@group(0) @binding(2) var<uniform> p: MoePackParams;

const WG: u32 = 256u;
const MAX_EXPERTS: u32 = 2048u;
// A pair's slot within its expert, beside the expert (11 bits).
const SLOT_BITS: u32 = 21u;
const SLOT_MASK: u32 = 0x1fffffu;

var<workgroup> counts: array<atomic<u32>, MAX_EXPERTS>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    let ne = min(p.n_expert, MAX_EXPERTS);
    for (var e = li; e < ne; e += WG) {
        atomicStore(&counts[e], 0u);
    }
    workgroupBarrier();
    for (var i = li; i < p.nk; i += WG) {
        let e = min(out[p.down_at + 4u * i], ne - 1u);
        let slot = atomicAdd(&counts[e], 1u);
        out[i] = (e << SLOT_BITS) | (slot & SLOT_MASK);
    }
    workgroupBarrier();
    if (li == 0u) {
        // Each expert's first packed column, and its runs in expert order.
        var first = 0u;
        var r = 0u;
        for (var e = 0u; e < ne; e++) {
            let c = atomicLoad(&counts[e]);
            atomicStore(&counts[e], first);
            for (var j = 0u; j < c && r < p.max_runs; j += p.maxc) {
                let at = p.runs_at + 4u * r;
                out[at] = e;
                out[at + 1u] = first + j;
                out[at + 2u] = first + j;
                out[at + 3u] = min(p.maxc, c - j);
                r++;
            }
            first += c;
        }
        args[0] = p.gxa;
        args[1] = p.gya;
        args[2] = r;
        args[3] = p.gxb;
        args[4] = p.gyb;
        args[5] = r;
        for (; r < p.max_runs; r++) {
            let at = p.runs_at + 4u * r;
            out[at] = 0u;
            out[at + 1u] = 0u;
            out[at + 2u] = 0u;
            out[at + 3u] = 0u;
        }
    }
    workgroupBarrier();
    for (var i = li; i < p.nk; i += WG) {
        let v = out[i];
        let col = atomicLoad(&counts[v >> SLOT_BITS]) + (v & SLOT_MASK);
        out[i] = col;
        out[p.gather_at + col] = i / p.k;
    }
}
