// The gated activations, shared by glu.wgsl, glu_split.wgsl and the mat-vec
// kernels' GLU epilogue so that every path computes the same bits:
//   silu(v)      = v / (1 + exp(-v))
//   gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
//                = v / (1 + exp(-2a)), a = sqrt(2/pi) (v + 0.044715 v^3)
// (the same function written without tanh, which overflows to NaN in naive
// implementations for large |a|). The cubic is an explicit fma, so no
// compiler has a contraction choice to make differently in different kernels.

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

fn gelu_tanh(v: f32) -> f32 {
    let a = 0.7978845608028654 * fma(0.044715 * v * v, v, v);
    return v / (1.0 + exp(-2.0 * a));
}

// An output gate (qwen35's attention): y = sigmoid(g) * u.
fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

// No activation (a plain mat-vec); never called.
fn none(v: f32) -> f32 {
    return v;
}
