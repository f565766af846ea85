//! Speculative decoding's drafts: n-gram prompt lookup (llama.cpp's
//! `--spec-type ngram-simple`) and the rule that turns a slot's drafting
//! off when it loses.
//!
//! A sequence's draft is a guess at its next tokens, taken from its own
//! prompt and output: the last `n` tokens (the key) are looked for earlier
//! in the sequence, and the (at most `m`) tokens that followed their last
//! earlier occurrence are the draft. The scheduler feeds the pending token
//! and the draft through the target in one step and samples each position
//! in order with the sequence's own sampler, keeping drafted tokens while
//! they equal what was sampled (`scheduler.rs`). The text is the text of
//! plain decoding: the kernels are batch invariant, so each position's
//! logits are the bits one token at a time would give, and the sampler
//! draws exactly once per emitted token, in the same order. Drafts change
//! the speed only.
//!
//! Invariants: a draft is never longer than what the sequence may still
//! emit, what its cache can hold, or what one step of its cache takes (a
//! sliding-window ring must keep the window of every position the step
//! rewinds to); the scheduler bounds it before asking.

use std::str::FromStr;

/// Which drafts a server makes (`--spec-type`, llama-server's spelling).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SpecType {
    /// No speculation (the default).
    #[default]
    None,
    /// The tokens that followed the last earlier occurrence of the
    /// sequence's last `n` tokens.
    NgramSimple,
}

impl SpecType {
    /// The names `--spec-type` takes.
    pub const NAMES: [&'static str; 2] = ["none", "ngram-simple"];

    pub fn as_str(self) -> &'static str {
        match self {
            SpecType::None => "none",
            SpecType::NgramSimple => "ngram-simple",
        }
    }
}

impl FromStr for SpecType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(SpecType::None),
            "ngram-simple" => Ok(SpecType::NgramSimple),
            other => Err(format!(
                "unknown speculative decoding type {other:?}: this server knows {}",
                Self::NAMES.join(", ")
            )),
        }
    }
}

/// A server's speculation settings (`--spec-type`, `--draft-max`,
/// `--draft-min`, `--spec-ngram-size-n`, `--spec-ngram-size-m`), with
/// llama-server's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    pub kind: SpecType,
    /// The longest draft (`--draft-max`), unless a request asks for less
    /// or more (`speculative.n_max`).
    pub n_max: usize,
    /// A shorter draft is not verified (`--draft-min`).
    pub n_min: usize,
    /// The key's length (`--spec-ngram-size-n`).
    pub ngram_n: usize,
    /// The most tokens a lookup drafts (`--spec-ngram-size-m`).
    pub ngram_m: usize,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            kind: SpecType::None,
            n_max: 16,
            n_min: 0,
            ngram_n: 12,
            ngram_m: 48,
        }
    }
}

/// A request's own draft lengths (`speculative.n_max` and
/// `speculative.n_min` on the native API), each `None` for the server's;
/// `n_max` 0 turns speculation off for it. As in llama-server, `n_min` is
/// at most `n_max`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftLimits {
    pub n_max: Option<usize>,
    pub n_min: Option<usize>,
}

/// The tokens that followed the last earlier occurrence of the last `n`
/// tokens of `history`, at most `max`; empty when there is none.
pub fn ngram_simple(history: &[u32], n: usize, max: usize) -> Vec<u32> {
    let len = history.len();
    if n == 0 || max == 0 || len <= n {
        return Vec::new();
    }
    let key = &history[len - n..];
    // Starts of earlier occurrences, latest first; the key itself (at
    // `len - n`) is not one.
    (0..len - n)
        .rev()
        .find(|&i| &history[i..i + n] == key)
        .map(|i| history[i + n..(i + n + max).min(len)].to_vec())
        .unwrap_or_default()
}

/// Drafted tokens a slot must have verified before [`Acceptance::pays`]
/// judges it.
pub(crate) const JUDGE_AFTER: u64 = 32;

/// The share of drafted tokens that must be accepted for drafting to go
/// on. A step that verifies `d` drafted tokens and accepts `a` of them
/// emits `1 + a` tokens for the cost of `1 + βd` one-token steps, where β
/// is what one more column costs: drafting pays while `a / d > β`. On
/// SmolLM2 on the 2-core CPU a step of 2, 4 and 8 tokens took 1.25, 1.6
/// and 3.3 times one token's (docs/perf/speculative.md): β 0.2–0.33.
pub(crate) const MIN_ACCEPTED: f64 = 0.3;

/// One sequence's drafts so far.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Acceptance {
    pub drafted: u64,
    pub accepted: u64,
}

impl Acceptance {
    /// Whether drafting still pays: until [`JUDGE_AFTER`] drafted tokens,
    /// yes; then while at least [`MIN_ACCEPTED`] of them were accepted. A
    /// slot that stops drafting does not start again within the request.
    pub fn pays(&self) -> bool {
        self.drafted < JUDGE_AFTER || self.accepted as f64 >= MIN_ACCEPTED * self.drafted as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_earlier_occurrence_of_the_key_is_continued() {
        // 1 2 3 occurs twice before the end; the later one is continued.
        let h = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3];
        assert_eq!(ngram_simple(&h, 3, 8), vec![7, 8, 1, 2, 3]);
        assert_eq!(ngram_simple(&h, 3, 2), vec![7, 8]);
        // A longer key with no earlier occurrence, then one with.
        assert!(ngram_simple(&h, 4, 8).is_empty());
        let r = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3];
        assert_eq!(ngram_simple(&r, 4, 3), vec![4, 1, 2]);
        // Nothing to look up.
        assert!(ngram_simple(&h, 0, 8).is_empty());
        assert!(ngram_simple(&h, 3, 0).is_empty());
        assert!(ngram_simple(&[1, 2], 3, 8).is_empty());
        // The occurrence just before the key: drafts up to the end.
        assert_eq!(ngram_simple(&[5, 5, 5], 1, 4), vec![5]);
    }

    #[test]
    fn drafting_stops_once_too_few_drafts_are_accepted() {
        let a = |drafted, accepted| Acceptance { drafted, accepted };
        assert!(a(0, 0).pays());
        assert!(a(JUDGE_AFTER - 1, 0).pays());
        assert!(!a(JUDGE_AFTER, 0).pays());
        assert!(a(100, 30).pays());
        assert!(!a(100, 29).pays());
    }

    #[test]
    fn spec_types_are_spelled_as_llama_server_spells_them() {
        for name in SpecType::NAMES {
            assert_eq!(name.parse::<SpecType>().unwrap().as_str(), name);
        }
        let err = "draft-mtp".parse::<SpecType>().unwrap_err();
        assert!(err.contains("ngram-simple"), "{err}");
    }
}
