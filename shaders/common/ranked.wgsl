// (key, index) items as argmax.wgsl and topk.wgsl rank them: a higher key
// first, ties to the lower index, and an empty item (index NONE: no value,
// or a NaN) after every other.

const NONE: u32 = 0xffffffffu;

// Whether item (kb, ib) ranks before (ka, ia).
fn beats(kb: u32, ib: u32, ka: u32, ia: u32) -> bool {
    if (ib == NONE) {
        return false;
    }
    if (ia == NONE) {
        return true;
    }
    return kb > ka || (kb == ka && ib < ia);
}
