//! Counters the engine keeps for `/metrics`: plain atomics written by the
//! engine thread and read by any handler, so reading never waits on a step.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::request::Timings;

#[derive(Debug, Default)]
pub struct Metrics {
    started: AtomicU64,
    finished: AtomicU64,
    dropped: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    prompt_us: AtomicU64,
    predicted_us: AtomicU64,
    ttft_us: AtomicU64,
    ttft_count: AtomicU64,
    paced_steps: AtomicU64,
    /// Forward calls (llama.cpp's `n_decode`), the sequences they carried,
    /// and the most tokens one of them took.
    steps: AtomicU64,
    step_sequences: AtomicU64,
    step_tokens_max: AtomicU64,
    argmax_steps: AtomicU64,
    top_k_steps: AtomicU64,
    prompt_cache_entries: AtomicUsize,
    prompt_cache_bytes: AtomicU64,
    prompt_cache_restores: AtomicU64,
    prompt_cache_restored_tokens: AtomicU64,
    drafts: AtomicU64,
    draft_tokens: AtomicU64,
    draft_accepted: AtomicU64,
    /// What each slot holds, as of the end of the last step.
    pub(crate) slots: std::sync::Mutex<Vec<SlotView>>,
    pub(crate) queued: AtomicUsize,
    pub(crate) active: AtomicUsize,
    pub(crate) kv_used: AtomicUsize,
    pub(crate) kv_capacity: AtomicUsize,
    /// Host bytes the slots' recurrent-state checkpoints hold.
    pub(crate) checkpoint_bytes: AtomicU64,
}

/// One slot as `/slots` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotView {
    pub id: usize,
    /// Positions its cache can hold.
    pub n_ctx: usize,
    /// Positions its cache holds (a finished request's tokens stay, for
    /// prefix reuse).
    pub n_cached: usize,
    /// A request holds it.
    pub is_processing: bool,
    /// Tokens generated so far by the request holding it.
    pub n_decoded: usize,
    /// Tokens that request may still generate.
    pub n_remain: usize,
}

/// A consistent-enough copy of the counters (each read is atomic; the set
/// is not, which Prometheus scrapes tolerate).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Sequences that got a slot.
    pub started: u64,
    /// Sequences that ran to a finish reason.
    pub finished: u64,
    /// Sequences (or queued requests) whose client went away.
    pub dropped: u64,
    /// Requests refused because the queue was full.
    pub rejected: u64,
    /// Sequences ended by a model fault.
    pub failed: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub generated_tokens: u64,
    pub prompt_seconds: f64,
    pub predicted_seconds: f64,
    pub ttft_seconds_sum: f64,
    pub ttft_count: u64,
    /// Steps whose prompt tokens were cut to the step budget so that the
    /// decoding sequences beside them were not held back.
    pub paced_steps: u64,
    /// Forward calls.
    pub steps: u64,
    /// Sequences over all forward calls (busy slots per call, summed).
    pub step_sequences: u64,
    /// The most tokens one forward call took.
    pub step_tokens_max: u64,
    /// Forward calls whose sequences all picked greedily from the raw
    /// logits: the backend returned the picks, not the logits.
    pub argmax_steps: u64,
    /// Forward calls whose sequences each needed only their argmax or their
    /// top-k candidates: the backend returned those, not the logits.
    pub top_k_steps: u64,
    /// Prompts the host prompt cache holds, and their bytes.
    pub prompt_cache_entries: usize,
    pub prompt_cache_bytes: u64,
    /// Prompts restored from the host prompt cache into a slot, and the
    /// tokens they held for their requests.
    pub prompt_cache_restores: u64,
    pub prompt_cache_restored_tokens: u64,
    /// Drafts verified by the target, their tokens, and those of them
    /// accepted (speculative decoding; `draft.rs`).
    pub drafts: u64,
    pub draft_tokens: u64,
    pub draft_accepted: u64,
    pub queued: usize,
    pub active: usize,
    pub kv_used: usize,
    pub kv_capacity: usize,
    pub checkpoint_bytes: u64,
}

fn us(ms: f64) -> u64 {
    (ms * 1e3).max(0.0) as u64
}

impl Metrics {
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            started: self.started.load(Relaxed),
            finished: self.finished.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            failed: self.failed.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            cached_tokens: self.cached_tokens.load(Relaxed),
            generated_tokens: self.generated_tokens.load(Relaxed),
            prompt_seconds: self.prompt_us.load(Relaxed) as f64 / 1e6,
            predicted_seconds: self.predicted_us.load(Relaxed) as f64 / 1e6,
            ttft_seconds_sum: self.ttft_us.load(Relaxed) as f64 / 1e6,
            ttft_count: self.ttft_count.load(Relaxed),
            paced_steps: self.paced_steps.load(Relaxed),
            steps: self.steps.load(Relaxed),
            step_sequences: self.step_sequences.load(Relaxed),
            step_tokens_max: self.step_tokens_max.load(Relaxed),
            argmax_steps: self.argmax_steps.load(Relaxed),
            top_k_steps: self.top_k_steps.load(Relaxed),
            prompt_cache_entries: self.prompt_cache_entries.load(Relaxed),
            prompt_cache_bytes: self.prompt_cache_bytes.load(Relaxed),
            prompt_cache_restores: self.prompt_cache_restores.load(Relaxed),
            prompt_cache_restored_tokens: self.prompt_cache_restored_tokens.load(Relaxed),
            drafts: self.drafts.load(Relaxed),
            draft_tokens: self.draft_tokens.load(Relaxed),
            draft_accepted: self.draft_accepted.load(Relaxed),
            queued: self.queued.load(Relaxed),
            active: self.active.load(Relaxed),
            kv_used: self.kv_used.load(Relaxed),
            kv_capacity: self.kv_capacity.load(Relaxed),
            checkpoint_bytes: self.checkpoint_bytes.load(Relaxed),
        }
    }

    pub(crate) fn started(&self) {
        self.started.fetch_add(1, Relaxed);
    }

    pub(crate) fn rejected(&self) {
        self.rejected.fetch_add(1, Relaxed);
    }

    pub(crate) fn dropped(&self) {
        self.dropped.fetch_add(1, Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.failed.fetch_add(1, Relaxed);
    }

    /// A forward call that asked for greedy picks only.
    pub(crate) fn argmax_step(&self) {
        self.argmax_steps.fetch_add(1, Relaxed);
    }

    pub(crate) fn top_k_step(&self) {
        self.top_k_steps.fetch_add(1, Relaxed);
    }

    /// What the host prompt cache holds now.
    pub(crate) fn prompt_cache(&self, entries: usize, bytes: u64) {
        self.prompt_cache_entries.store(entries, Relaxed);
        self.prompt_cache_bytes.store(bytes, Relaxed);
    }

    /// A prompt restored from the host prompt cache, holding `tokens`.
    pub(crate) fn prompt_restored(&self, tokens: usize) {
        self.prompt_cache_restores.fetch_add(1, Relaxed);
        self.prompt_cache_restored_tokens
            .fetch_add(tokens as u64, Relaxed);
    }

    /// One forward call over `sequences` sequences and `tokens` tokens.
    pub(crate) fn stepped(&self, sequences: usize, tokens: usize) {
        self.steps.fetch_add(1, Relaxed);
        self.step_sequences.fetch_add(sequences as u64, Relaxed);
        self.step_tokens_max.fetch_max(tokens as u64, Relaxed);
    }

    /// A verified draft of `drafted` tokens, `accepted` of them kept.
    pub(crate) fn drafted(&self, drafted: usize, accepted: usize) {
        self.drafts.fetch_add(1, Relaxed);
        self.draft_tokens.fetch_add(drafted as u64, Relaxed);
        self.draft_accepted.fetch_add(accepted as u64, Relaxed);
    }

    /// The slots as the last step left them.
    pub fn slots(&self) -> Vec<SlotView> {
        self.slots.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub(crate) fn paced(&self) {
        self.paced_steps.fetch_add(1, Relaxed);
    }

    pub(crate) fn first_token(&self, ttft_ms: f64) {
        self.ttft_us.fetch_add(us(ttft_ms), Relaxed);
        self.ttft_count.fetch_add(1, Relaxed);
    }

    /// Adds a sequence's work, whether it finished or was cut short.
    /// An embedding request's prompt, processed and answered.
    pub(crate) fn embedded(&self, prompt: usize, took: std::time::Duration) {
        self.finished.fetch_add(1, Relaxed);
        self.prompt_tokens.fetch_add(prompt as u64, Relaxed);
        self.prompt_us.fetch_add(took.as_micros() as u64, Relaxed);
    }

    pub(crate) fn account(&self, t: &Timings, finished: bool) {
        if finished {
            self.finished.fetch_add(1, Relaxed);
        }
        self.prompt_tokens.fetch_add(t.prompt_n as u64, Relaxed);
        self.cached_tokens.fetch_add(t.cache_n as u64, Relaxed);
        self.generated_tokens
            .fetch_add(t.predicted_n as u64, Relaxed);
        self.prompt_us.fetch_add(us(t.prompt_ms), Relaxed);
        self.predicted_us.fetch_add(us(t.predicted_ms), Relaxed);
    }
}
