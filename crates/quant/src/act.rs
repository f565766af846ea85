//! Gated activations over whole rows: `g ← act(g) · u` for SwiGLU (SiLU) and
//! GeGLU (GELU, tanh approximation).
//!
//! Both are `x / (1 + e^(−z))` for some `z` (SiLU: `z = x`; GELU's tanh form
//! `½x(1 + tanh(v))` equals `x / (1 + e^(−2v))`), so one exponential serves
//! both. libm's `expf` is a call per element that the compiler cannot
//! vectorise, and on a prompt it was a tenth of the forward pass; [`exp`] here
//! is branch-free f32 arithmetic (Cody–Waite reduction, Cephes' polynomial,
//! within 2 ulp of the true value over the range that matters) that compiles
//! to 16-lane AVX-512 or 8-lane AVX2 code. It uses no fused multiply-adds, so
//! every path (AVX-512, AVX2, portable) gives the same bits, and the result
//! of an element never depends on its neighbours: batch invariant.

/// Which gated activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// `silu(g) · u`
    Silu,
    /// `gelu_tanh(g) · u`
    GeluTanh,
}

/// `g[i] ← act(g[i]) · u[i]` over the common length.
pub fn glu(kind: Glu, g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let (g, u) = (&mut g[..n], &u[..n]);
    #[cfg(all(target_arch = "x86_64", lamina_avx512))]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature was just detected.
        unsafe { glu_avx512(kind, g, u) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature was just detected.
        unsafe { glu_avx2(kind, g, u) };
        return;
    }
    glu_body(kind, g, u);
}

/// `silu(x) = x / (1 + e^(−x))`, as [`glu`] computes it.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `gelu_tanh(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))`, as [`glu`] computes it.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let v = SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x);
    x / (1.0 + exp(-2.0 * v))
}

#[cfg(all(target_arch = "x86_64", lamina_avx512))]
#[target_feature(enable = "avx512f")]
unsafe fn glu_avx512(kind: Glu, g: &mut [f32], u: &[f32]) {
    glu_body(kind, g, u);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn glu_avx2(kind: Glu, g: &mut [f32], u: &[f32]) {
    glu_body(kind, g, u);
}

/// The loop every path compiles: one branch outside, none inside, so it
/// vectorises at whatever width the enclosing function enables.
#[inline(always)]
fn glu_body(kind: Glu, g: &mut [f32], u: &[f32]) {
    match kind {
        Glu::Silu => g.iter_mut().zip(u).for_each(|(g, u)| *g = silu(*g) * u),
        Glu::GeluTanh => g
            .iter_mut()
            .zip(u)
            .for_each(|(g, u)| *g = gelu_tanh(*g) * u),
    }
}

/// `e^x` in f32 without branches: `x = n·ln 2 + r` with `|r| ≤ ½ln 2`
/// (ln 2 split in two parts so `r` is exact), `e^r` by Cephes' `expf`
/// polynomial, and `2^n` built in the exponent bits. Inputs are clamped to
/// where `2^n` stays a normal number, so the result saturates near 0 and
/// near `f32::MAX` instead of reaching 0 or ∞; both ends give the right
/// activation (`x / (1 + huge)` is ~0, `x / (1 + tiny)` is `x`). NaN stays NaN
/// in the activations (`x` is NaN there).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 = C1 + C2, C1 with few mantissa bits so n·C1 is exact.
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to an integer (ties to even) in the low bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * C1 - n * C2;
    let mut p = 1.987_569_2e-4;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes: 5.0000001201e-1, which is 0.5 in f32
    let er = p * r * r + r + 1.0;
    // n is in −126..=127 after the clamp (2ⁿ a normal number); its bits
    // sit in t's low mantissa.
    let n = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits(((n + 127) as u32) << 23);
    er * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between `a` and the f64 value `b`.
    fn ulps(a: f32, b: f64) -> f64 {
        let b32 = b as f32;
        let ulp = f64::from(f32::from_bits(b32.abs().to_bits() + 1) - b32.abs());
        (f64::from(a) - b).abs() / ulp
    }

    #[test]
    fn exp_is_within_two_ulp_over_the_activation_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let u = ulps(exp(x), f64::from(x).exp());
            worst = worst.max(u);
            x += 0.000_731;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
    }

    #[test]
    fn exp_saturates_instead_of_overflowing() {
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
        assert!(exp(1000.0).is_finite() && exp(1000.0) > 1e38);
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn activations_track_the_f64_formulas() {
        let mut x = -30.0f32;
        while x < 30.0 {
            let xd = f64::from(x);
            let silu_ref = xd / (1.0 + (-xd).exp());
            let v = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd * xd * xd);
            // ½x(1 + tanh v) in the form that does not cancel for negative x.
            let gelu_ref = xd / (1.0 + (-2.0 * v).exp());
            // GELU's argument v is rounded to f32 before e^(−2v), as it was
            // before tanh in the libm form: its relative error grows with |v|.
            for (got, want, cond) in [(silu(x), silu_ref, 0.0), (gelu_tanh(x), gelu_ref, v.abs())] {
                let tol = (4e-7 + 5e-7 * cond) * want.abs() + 1e-30;
                assert!(
                    (f64::from(got) - want).abs() <= tol,
                    "x {x}: {got} vs {want}"
                );
            }
            x += 0.0137;
        }
        // The far tails: exactly the input, or a vanishing negative.
        assert_eq!(silu(100.0), 100.0);
        assert!(silu(-100.0).abs() < 1e-30);
        assert_eq!(gelu_tanh(50.0), 50.0);
        assert!(gelu_tanh(-50.0).abs() < 1e-30);
    }

    #[test]
    fn every_path_gives_the_scalar_bits() {
        // Odd lengths so the vector loops' tails run too.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 24.0 - 12.0
        };
        let g0: Vec<f32> = (0..1037).map(|_| next()).collect();
        let u: Vec<f32> = (0..1037).map(|_| next()).collect();
        for kind in [Glu::Silu, Glu::GeluTanh] {
            let scalar: Vec<f32> = g0
                .iter()
                .zip(&u)
                .map(|(g, u)| match kind {
                    Glu::Silu => silu(*g) * u,
                    Glu::GeluTanh => gelu_tanh(*g) * u,
                })
                .collect();
            let mut g = g0.clone();
            glu(kind, &mut g, &u);
            assert_eq!(
                g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                scalar.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{kind:?}"
            );
            let mut g = g0.clone();
            glu_body(kind, &mut g, &u);
            assert_eq!(
                g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                scalar.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{kind:?} portable"
            );
        }
    }
}
