//! The f32 element-wise operations of the forward pass, on the CPU. Sums
//! that feed a normalisation run in f64, as ggml's do (`ggml_float`).

/// `x ← x / √(mean(x²) + eps) · w`
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// Rotates the first `rope_dim` values of one head for position `pos`.
/// Adjacent pairs (`x[2i]`, `x[2i+1]`) in normal mode, (`x[i]`, `x[i+d/2]`) in NeoX
/// mode. Angles are computed in f64: θᵢ = pos · base^(−2i/d).
pub fn rope(x: &mut [f32], pos: usize, base: f32, rope_dim: usize, neox: bool) {
    let mut angles = Vec::new();
    rope_angles(pos, base, rope_dim, 1.0, None, 1.0, &mut angles);
    rope_with(x, &angles, neox);
}

/// The (sin θᵢ, cos θᵢ) of [`rope`] for position `pos`, into `out` (cleared),
/// with ggml's scalings: θᵢ = scale · (pos · base^(−2i/d) / factorᵢ) (linear
/// scaling and per-pair frequency factors; 1 and none leave θ as it was),
/// and both times `mscale` (LongRoPE's attention factor; 1: as they are).
/// Every head of a token turns by the same angles: computed once per token
/// (f64 `powf` and `sin_cos` per pair and head were a twentieth of a
/// prompt's time), with the same operations, so the same bits.
pub fn rope_angles(
    pos: usize,
    base: f32,
    rope_dim: usize,
    scale: f32,
    factors: Option<&[f32]>,
    mscale: f32,
    out: &mut Vec<(f64, f64)>,
) {
    let m = f64::from(mscale);
    out.clear();
    out.extend((0..rope_dim / 2).map(|i| {
        let mut theta = pos as f64 * f64::from(base).powf(-2.0 * i as f64 / rope_dim as f64);
        if let Some(f) = factors.and_then(|f| f.get(i)) {
            theta /= f64::from(*f);
        }
        let (s, c) = (theta * f64::from(scale)).sin_cos();
        (s * m, c * m)
    }));
}

/// [`rope`] with the angles of [`rope_angles`] (their count is half the
/// rotated dimensions).
pub fn rope_with(x: &mut [f32], angles: &[(f64, f64)], neox: bool) {
    let half = angles.len();
    for (i, &(s, c)) in angles.iter().enumerate() {
        let (a, b) = if neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (f64::from(x[a]), f64::from(x[b]));
        x[a] = (x0 * c - x1 * s) as f32;
        x[b] = (x0 * s + x1 * c) as f32;
    }
}

/// In-place softmax, subtracting the maximum first.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SiLU, as the CPU's gated products compute it ([`lamina_quant::act`]).
pub use lamina_quant::act::silu;

/// GELU, tanh approximation (Gemma's `gelu_pytorch_tanh`), as the CPU's gated
/// products compute it.
pub use lamina_quant::act::gelu_tanh;

/// `buf` with exactly `len` values, allocating only when it must grow. The
/// contents are stale: every user overwrites all of them.
pub(crate) fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_is_weight() {
        let mut x = vec![3.0f32; 8];
        rms_norm(&mut x, &[2.0; 8], 0.0);
        assert!(x.iter().all(|v| (v - 2.0).abs() < 1e-6));
    }

    #[test]
    fn rope_preserves_norm_and_pairs() {
        let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        for neox in [false, true] {
            let mut x = orig.clone();
            rope(&mut x, 7, 10000.0, 8, neox);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
            // Position 0 is the identity.
            let mut y = orig.clone();
            rope(&mut y, 0, 10000.0, 8, neox);
            assert_eq!(y, orig);
        }
        // Normal mode rotates (x0, x1) by pos radians for i = 0.
        let mut x = vec![1.0, 0.0];
        rope(&mut x, 1, 10000.0, 2, false);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn softmax_sums_to_one_and_activations() {
        let mut x = vec![1.0, 2.0, 3.0, 1000.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] > 0.999);
        assert!((silu(0.0)).abs() < 1e-7 && (silu(10.0) - 10.0).abs() < 1e-3);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
    }
}
