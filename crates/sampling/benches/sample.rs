//! Time per sampled token with llama.cpp's default chain (top_k 40, top_p
//! 0.95, min_p 0.05, temperature 0.8) over logits of SmolLM2's, Qwen's and
//! Gemma 3's vocabulary sizes: the host's part of a sampled step, which on
//! a GPU that returns the logits is all the host does per sequence.
//! `cargo bench -p lamina-sampling`; compare builds, alternating.

use lamina_sampling::{Sampler, SamplerConfig};
use std::time::Instant;

fn main() {
    const ROUNDS: u32 = 1000;
    for vocab in [49_152usize, 151_936, 262_144] {
        // Deterministic logits spread over 20 nats, as a model's are.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let logits: Vec<f32> = (0..vocab)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 100_000) as f32 / 5_000.0
            })
            .collect();
        let cfg = SamplerConfig {
            seed: Some(1),
            ..SamplerConfig::default()
        };
        let Ok(mut s) = Sampler::new(cfg) else {
            return;
        };
        let mut work = logits.clone();
        let mut picks = 0u64;
        let mut run = |n: u32| {
            let t = Instant::now();
            for _ in 0..n {
                // The sampler may change its input (bias, penalties).
                work.copy_from_slice(&logits);
                picks = picks.wrapping_add(u64::from(s.sample(&mut work, &[1, 2, 3])));
            }
            t.elapsed() / n
        };
        run(50);
        let per = run(ROUNDS);
        println!("vocabulary {vocab:>6}: {per:>10.1?} a token (picks sum {picks})");
    }
}
