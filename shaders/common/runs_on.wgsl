// A dispatch over runs (RUNS = on, lamina_gpu's `Runs`): the weight holds
// params.n_mats matrices of params.rows rows, one after another (a block's
// routed experts), and workgroup column chunk z is run z of a table of four
// words a run, from word params.runs_at: its matrix, its first column of x,
// its first column of y, and its column count (1 ..= MAXC). One dispatch so
// multiplies every (token, expert) pair, or every expert's run of packed
// tokens, by its own expert, and the table may come from a kernel (routing
// on the device) as well as from the host. Each column's product is the
// kernel's own, in the canonical order: a run changes which rows a
// workgroup reads, never how it sums them.

@group(0) @binding({{RB}}) var<storage, read> runs: array<u32>;

// Runs hold any column count up to MAXC (an expert's few tokens beside
// another's eight): matvec_rows.wgsl computes them column by column.
const RUNS_ON: bool = true;

//
// A weight too large for one binding is split between matrices
// (`Gpu::upload_matrices`): one dispatch per binding, which holds matrices
// params.mat_first .. + params.n_mats, and a run naming another matrix
// computes nothing here (it is another binding's).

// Points `p` at run z's columns (none for an empty run or another
// binding's, after which the workgroup returns at once); returns the byte
// offset of its matrix in this binding.
fn run_setup(z: u32) -> u32 {
    let at = params.runs_at + 4u * z;
    // Wraps below mat_first, so one comparison tests both ends.
    let m = runs[at] - params.mat_first;
    p.ncols = select(0u, min(runs[at + 3u], MAXC), m < params.n_mats);
    p.x_offset = params.x_offset + runs[at + 1u] * params.x_stride;
    p.y_offset = params.y_offset + runs[at + 2u] * params.y_stride;
    return min(m, params.n_mats - 1u) * params.rows * params.row_bytes;
}
