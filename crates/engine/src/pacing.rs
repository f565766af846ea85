//! How many prompt tokens a step may take while other sequences decode.
//!
//! A step runs every active sequence together, so a prompt chunk in it
//! delays every decoding sequence's next token by what the chunk costs. On
//! a small CPU a 512-token chunk is more than a second (docs/perf/server.md,
//! 2026-12-05, "the step budget"), which a reader of a stream sees as the
//! answer freezing whenever someone else sends a long prompt. The pacer
//! measures what steps cost and, while anyone decodes, gives prompts only
//! the tokens that fit a time budget per step; with nobody decoding a
//! prompt takes the whole batch (`n_batch`), which is what finishes it
//! soonest.
//!
//! The cost model is a line: a step of `n` tokens costs `fixed + n ×
//! per_token`. `fixed` (one pass over the weights, the host's share of a
//! step) is learnt from steps without prompt tokens, `per_token` from steps
//! with them; both are exponentially weighted means, so they follow a
//! machine that slows down (another process, a longer context) or speeds up.
//! A chunk's size never changes a result: the kernels give the same bits at
//! any batch size, so pacing moves time around and nothing else.

use std::time::Duration;

/// What a prompt may take before any step with prompt tokens has been
/// measured: small enough not to stall a decoder long on any model this
/// engine serves, big enough to measure.
const FIRST_CHUNK: usize = 32;

/// Prompt tokens a step always gets while a prompt waits, so prefill makes
/// progress however tight the budget (a budget below one decode step).
pub(crate) const MIN_CHUNK: usize = 16;

/// The most prompt tokens a paced chunk leaves for a step of their own: a
/// shorter rest joins the chunk, over the budget. A step costs the
/// decoders its fixed part (a pass over the weights) whatever its tokens,
/// and a tail costs little beside a chunk (docs/perf/server.md,
/// 2026-12-07, "a prompt's tail beside its chunk").
const TAIL: usize = MIN_CHUNK / 2;

/// Steps with fewer prompt tokens are not used to learn `per_token`: their
/// time is mostly the fixed part, and dividing it by a handful of tokens
/// would overstate a token's cost many times.
const MIN_SAMPLE: usize = 8;

/// Weight of the newest measurement in the running means.
const WEIGHT: f64 = 0.3;

/// The default budget: the longest a step with prompt tokens in it should
/// hold back the sequences that decode. 200 ms is about where a reader of a
/// stream starts to see it stop. On a 2-core CPU one 512-token chunk holds
/// every stream for seconds, while the tokens this budget allows there
/// prefill at the speed of 64-token chunks, so a prompt loses little
/// (docs/perf/server.md, 2026-12-05, "the step budget").
pub const DEFAULT_BUDGET: Duration = Duration::from_millis(200);

/// Learns what steps cost and sizes prompt chunks from it.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    /// `None`: no pacing, every prompt takes `n_batch` a step.
    budget: Option<Duration>,
    /// Seconds of a step whatever its tokens.
    fixed: Option<f64>,
    /// Seconds each token adds to a step.
    per_token: Option<f64>,
}

fn mean(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| o + WEIGHT * (new - o))
}

impl Pacer {
    pub fn new(budget: Option<Duration>) -> Self {
        Self {
            budget: budget.filter(|b| !b.is_zero()),
            fixed: None,
            per_token: None,
        }
    }

    /// Prompt tokens this step may take over all prefilling sequences, with
    /// `decoding` sequences each feeding one token; at most `n_batch`. With
    /// nobody decoding, or no budget, `usize::MAX`: each prompt takes up to
    /// `n_batch`.
    pub fn allowance(&self, n_batch: usize, decoding: usize) -> usize {
        let Some(budget) = self.budget else {
            return usize::MAX;
        };
        if decoding == 0 {
            return usize::MAX;
        }
        let Some(per_token) = self.per_token.filter(|p| *p > 0.0) else {
            return FIRST_CHUNK.min(n_batch).max(1);
        };
        let fixed = self.fixed.unwrap_or(0.0);
        let room = budget.as_secs_f64() - fixed - decoding as f64 * per_token;
        let fits = (room / per_token).floor();
        // `fits` may be negative or NaN-free huge; clamp before converting.
        let fits = if fits.is_finite() && fits > 0.0 {
            fits.min(n_batch as f64) as usize
        } else {
            0
        };
        fits.max(MIN_CHUNK).min(n_batch).max(1)
    }

    /// Learns from a step that ran `prompt` prompt tokens and `decoding`
    /// single decode tokens in `elapsed`.
    pub fn observe(&mut self, prompt: usize, decoding: usize, elapsed: Duration) {
        if self.budget.is_none() {
            return;
        }
        let t = elapsed.as_secs_f64();
        if prompt == 0 {
            if decoding > 0 {
                let tokens = decoding as f64 * self.per_token.unwrap_or(0.0);
                self.fixed = Some(mean(self.fixed, (t - tokens).max(0.0)));
            }
            return;
        }
        if prompt < MIN_SAMPLE {
            return;
        }
        let fixed = self.fixed.unwrap_or(0.0);
        let per = (t - fixed).max(0.0) / (prompt + decoding) as f64;
        if per > 0.0 {
            self.per_token = Some(mean(self.per_token, per));
        }
    }

    /// Splits `allowance` over the prompts waiting in a step, first come
    /// first served (slot order): each takes what is left of its prompt, at
    /// most `n_batch`; a prompt after the allowance runs out waits a step.
    /// A prompt that would leave a tail of at most [`TAIL`] tokens takes it
    /// now, past the allowance.
    pub fn split(allowance: usize, n_batch: usize, remaining: &[usize]) -> Vec<usize> {
        let mut left = allowance;
        remaining
            .iter()
            .map(|&r| {
                let mut take = r.min(n_batch).min(left);
                if take > 0 && r - take <= TAIL && r <= n_batch {
                    take = r;
                }
                left = left.saturating_sub(take);
                take
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_short_tail_joins_its_chunk_and_a_long_one_waits() {
        // 16 allowed: a 19-token prompt goes at once, a 30-token one in two.
        assert_eq!(Pacer::split(16, 512, &[19]), vec![19]);
        assert_eq!(Pacer::split(16, 512, &[16 + TAIL + 1]), vec![16]);
        // The tail stretches the allowance for its own prompt only: the
        // next waits as before, and a prompt that got nothing takes nothing.
        assert_eq!(Pacer::split(16, 512, &[19, 5]), vec![19, 0]);
        assert_eq!(Pacer::split(16, 512, &[10, 9]), vec![10, 9]);
        assert_eq!(Pacer::split(16, 512, &[10, 20]), vec![10, 6]);
        // Never past a batch.
        assert_eq!(Pacer::split(16, 20, &[22]), vec![16]);
    }

    #[test]
    fn nobody_decoding_or_no_budget_means_whole_batches() {
        let p = Pacer::new(Some(ms(200)));
        assert_eq!(p.allowance(512, 0), usize::MAX);
        let off = Pacer::new(None);
        assert_eq!(off.allowance(512, 3), usize::MAX);
        let zero = Pacer::new(Some(Duration::ZERO));
        assert_eq!(zero.allowance(512, 3), usize::MAX);
    }

    #[test]
    fn before_any_measurement_a_prompt_gets_a_small_first_chunk() {
        let p = Pacer::new(Some(ms(200)));
        assert_eq!(p.allowance(512, 1), FIRST_CHUNK);
        assert_eq!(p.allowance(8, 1), 8);
    }

    #[test]
    fn the_chunk_fits_the_budget_at_the_measured_speed() {
        let mut p = Pacer::new(Some(ms(200)));
        // A decode step of 2 sequences: 12 ms. 512 prompt tokens beside
        // them: 12 + 514 × 4 ms.
        p.observe(0, 2, ms(12));
        p.observe(512, 2, ms(12 + 514 * 4));
        let n = p.allowance(512, 2);
        // (200 - 12 - 2 × 4) / 4 = 45 tokens.
        assert_eq!(n, 45);
        // What that step would then cost stays within the budget.
        let predicted = 12.0 + (n + 2) as f64 * 4.0;
        assert!(predicted <= 200.0, "{predicted}");
    }

    #[test]
    fn a_slower_machine_gets_smaller_chunks_and_never_less_than_the_floor() {
        let mut p = Pacer::new(Some(ms(200)));
        p.observe(0, 1, ms(10));
        p.observe(100, 1, ms(10 + 101));
        let fast = p.allowance(512, 1);
        for _ in 0..20 {
            p.observe(100, 1, ms(10 + 101 * 50));
        }
        let slow = p.allowance(512, 1);
        assert!(slow < fast, "{slow} vs {fast}");
        assert_eq!(slow, MIN_CHUNK);
        // And a budget larger than a whole batch costs gives the whole batch.
        let mut roomy = Pacer::new(Some(Duration::from_secs(60)));
        roomy.observe(100, 1, ms(101));
        assert_eq!(roomy.allowance(512, 1), 512);
    }

    #[test]
    fn tiny_prompt_steps_do_not_teach_the_token_cost() {
        let mut p = Pacer::new(Some(ms(200)));
        p.observe(2, 1, ms(500));
        assert_eq!(p.allowance(512, 1), FIRST_CHUNK);
    }

    #[test]
    fn the_allowance_goes_to_the_first_prompts() {
        assert_eq!(Pacer::split(40, 512, &[30, 100, 5]), vec![30, 10, 0]);
        assert_eq!(Pacer::split(usize::MAX, 512, &[600, 100]), vec![512, 100]);
        assert_eq!(Pacer::split(0, 512, &[10]), vec![0]);
    }
}
