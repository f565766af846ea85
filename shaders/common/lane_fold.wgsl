// The binary counter fold of a canonical lane walk (matvec_rows.wgsl's
// header explains it), included inside the walk's loop over j = 0 .. 31,
// uniform, after lane j's partials `t` (NO outputs) are complete: lane j
// is stored at the level of its lowest zero bit, after adding the levels
// below it; the last lane (every bit set) leaves the root in `t`. Written
// out rather than looped over an array of levels: a run-time index into
// private memory is what a software rasteriser keeps in memory.
        if ((j & 1u) == 0u) {
            l0 = t;
            continue;
        }
        for (var o = 0u; o < NO; o++) {
            t[o] = l0[o] + t[o];
        }
        if ((j & 2u) == 0u) {
            l1 = t;
            continue;
        }
        for (var o = 0u; o < NO; o++) {
            t[o] = l1[o] + t[o];
        }
        if ((j & 4u) == 0u) {
            l2 = t;
            continue;
        }
        for (var o = 0u; o < NO; o++) {
            t[o] = l2[o] + t[o];
        }
        if ((j & 8u) == 0u) {
            l3 = t;
            continue;
        }
        for (var o = 0u; o < NO; o++) {
            t[o] = l3[o] + t[o];
        }
        if ((j & 16u) == 0u) {
            l4 = t;
            continue;
        }
        for (var o = 0u; o < NO; o++) {
            t[o] = l4[o] + t[o];
        }
