// Uniform parameter structs, one per kernel family. Each has a Rust twin in
// crates/gpu/src/params.rs with the same field order; a test checks the sizes.

struct MatParams {
    rows: u32,        // weight rows in this dispatch (one binding chunk)
    k: u32,           // weights per row
    row_bytes: u32,   // bytes per weight row
    ncols: u32,       // activation columns
    row_offset: u32,  // first output row of this chunk
    x_offset: u32,    // activations: column c starts at x_offset + c * x_stride
    x_stride: u32,
    y_offset: u32,    // outputs: column c starts at y_offset + c * y_stride
    y_stride: u32,
    eps: f32,         // the norm prologue's epsilon (NORM = on)
    runs_at: u32,     // RUNS = on: the run table's first word
    n_mats: u32,      // RUNS = on: matrices of `rows` rows the weight binding holds
    // The RoPE epilogue (ROPE = on): the QKV layout and the rotation.
    head_dim: u32,
    n_rot: u32,
    n_head: u32,
    n_kv_head: u32,
    tab_first: u32,   // token table entry of column 0
    neox: u32,
    freq_base: f32,
    ff_at: u32,       // token table word of the RoPE pair factors (0xffffffff: none)
    freq_scale: f32,  // every RoPE angle times this
    mscale: f32,      // every RoPE cosine and sine times this
    mat_first: u32,   // RUNS = on: the first matrix the weight binding holds
    _pad5: u32,
}

struct RowsParams {
    k: u32,           // weights per row
    row_bytes: u32,
    row_start: u32,   // first weight row held by this chunk
    rows: u32,        // rows held by this chunk
    n_ids: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct NormParams {
    dim: u32,
    rows: u32,
    eps: f32,
    _pad: u32,
}

struct RopeParams {
    head_dim: u32,
    n_rot: u32,       // leading dimensions rotated; the rest pass through
    n_heads: u32,
    n_tokens: u32,
    pos_offset: u32,  // position of token 0
    neox: u32,        // 0: pairs (2i, 2i+1); 1: pairs (i, i + n_rot/2)
    freq_base: f32,
    base: u32,        // element offset of token 0 in x and y
}

struct SoftmaxParams {
    cols: u32,
    rows: u32,
    scale: f32,
    _pad: u32,
}

struct EltParams {
    n: u32,
    scale: f32,
    dim: u32,         // add_rows: length of the broadcast row
    _pad: u32,
}

struct MoeWeighParams {
    n: u32,           // outputs: tokens * dim
    dim: u32,
    k: u32,           // experts per token
    add: u32,         // 1: the sum is added to what out holds
}

struct CopyParams {
    n: u32,
    src_offset: u32,
    dst_offset: u32,
    _pad: u32,
}

struct AttnParams {
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    tab_first: u32,   // token table entry of token 0
    window: u32,      // sliding window (0: none)
    n_chunks: u32,    // chunks per (token, head) in the partials
    scale: f32,
    q_offset: u32,    // element offset of token 0 in q and out
    ring: u32,        // rows per sequence of a sliding-window ring (else 0xffffffff)
    _pad1: u32,
    _pad2: u32,
}

struct HeadNormParams {
    head_dim: u32,
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    stride: u32,      // values per token in x and y (q, k and v heads)
    base: u32,        // element offset of token 0
    eps: f32,
    _pad: u32,
}

struct RopeKvParams {
    head_dim: u32,
    n_rot: u32,
    n_head: u32,
    n_kv_head: u32,
    n_tokens: u32,
    tab_first: u32,   // token table entry of token 0
    neox: u32,
    freq_base: f32,
    stride: u32,      // values per token of the QKV product
    src_base: u32,    // element offset of token 0 in the product
    q_base: u32,      // element offset of token 0 in q
    ff_at: u32,       // token table word of the RoPE pair factors (0xffffffff: none)
    freq_scale: f32,  // every RoPE angle times this
    mscale: f32,      // every RoPE cosine and sine times this
    _pad1: u32,
    _pad2: u32,
}

struct ArgmaxParams {
    rows: u32,
    len: u32,         // items per row in this stage's input
    stride: u32,      // items between the starts of two input rows
    chunks: u32,      // workgroups (output pairs) per row
    pairs: u32,       // 0: the input is f32 values; 1: (key, index) pairs
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct TopkParams {
    rows: u32,
    len: u32,         // items per row in this stage's input
    stride: u32,      // items between the starts of two input rows
    chunks: u32,      // workgroups per row (each writes k pairs)
    pairs: u32,       // 0: the input is f32 values; 1: (key, index) pairs
    k: u32,           // pairs each workgroup writes
    _pad0: u32,
    _pad1: u32,
}

struct MoeRouteParams {
    n: u32,           // tokens
    n_expert: u32,
    k: u32,           // experts per token
    norm: u32,        // 1: weights divided by their sum
    scale: f32,       // weights times this unless it is 0 or 1
    l_offset: u32,    // token t's logits start at l_offset + t * l_stride
    l_stride: u32,
    runs_at: u32,     // the run table's first word in `out`
}

struct MoePackParams {
    nk: u32,          // (token, slot) pairs
    k: u32,           // slots per token
    n_expert: u32,
    maxc: u32,        // most columns a run
    runs_at: u32,     // where the packed runs go (and the router's first table was)
    down_at: u32,     // the router's second table (its experts are read there)
    max_runs: u32,    // room for runs: past the packed ones, empty runs
    gather_at: u32,   // each packed column's token
    // The two products' first workgroup counts: the indirect dispatches'
    // arguments, the runs the third.
    gxa: u32,
    gya: u32,
    gxb: u32,
    gyb: u32,
}

struct GatherParams {
    m: u32,           // columns gathered
    dim: u32,
    table_at: u32,
    _pad: u32,
}

struct MoeSharedParams {
    n: u32,           // tokens
    dim: u32,
    sy_offset: u32,   // the shared output of token t at sy_offset + t * dim
    _pad: u32,
}

// Gated DeltaNet (delta_conv, delta_norm, delta_scan, delta_gate): one
// sequence's tokens first .. first + n of rows of `ch` channels (q, k, v),
// its state from word state_at (the convolution's window, then from
// mat_at one head_v x head_k matrix per value head).
struct DeltaParams {
    ch: u32,
    kernel: u32,
    first: u32,
    n: u32,
    state_at: u32,
    mat_at: u32,
    head_k: u32,
    head_v: u32,
    n_k: u32,
    n_v: u32,
    grouped: u32,     // value head h reads key head h / (n_v / n_k); else h % n_k
    eps: f32,
    scale: f32,       // 1 / sqrt(head_k), on each output
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
