//! What a request asks of the engine, and what flows back while it runs.

use std::time::Duration;

use lamina_grammar::Constraint;
use lamina_sampling::SamplerConfig;
use tokio::sync::mpsc;

use crate::error::EngineError;

/// One generation: a tokenized prompt and how to continue it.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// The prompt, already tokenized (with BOS where the model wants one).
    pub prompt: Vec<u32>,
    pub sampler: SamplerConfig,
    /// Tokens to generate at most; the engine also stops at the end of the
    /// slot's context and at the server-wide cap.
    pub max_tokens: usize,
    /// Generation ends before the first of these appears in the text.
    pub stop: Vec<String>,
    /// Alternatives to report per token with `logprobs`; `None`: no log-probs.
    pub logprobs: Option<usize>,
    /// Report the log-probabilities of the distribution the token was drawn
    /// from, after the sampler chain (llama-server's
    /// `post_sampling_probs`), instead of the model's own.
    pub post_sampling: bool,
    /// Wall-clock budget for this request, on top of the server-wide one.
    pub timeout: Option<Duration>,
    /// A shape the output must keep (JSON mode, a schema, a grammar, a
    /// required tool call), compiled for this model's vocabulary: each
    /// token is sampled from those its mask allows.
    pub constraint: Option<Constraint>,
    /// Send [`Event::Progress`] when the prompt starts and after each of its
    /// chunks (llama-server's `return_progress`).
    pub progress: bool,
    /// Send the request's timings so far with every token and progress
    /// report (llama-server's `timings_per_token`).
    pub timings_per_token: bool,
    /// This request's draft lengths (`speculative.n_max`/`n_min`), each
    /// `None` for the server's (`--draft-max`/`--draft-min`). Drafts are
    /// made only where the server has a `--spec-type`.
    pub draft: crate::draft::DraftLimits,
}

/// How far a prompt has been processed, as llama-server's `prompt_progress`
/// reports it: `processed` counts the reused `cache` tokens too, so the
/// first report has `processed == cache` and the last `processed == total`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub total: usize,
    pub cache: usize,
    pub processed: usize,
    /// Since the sequence took its slot.
    pub time_ms: u64,
    /// The timings so far, with `GenerateParams::timings_per_token`.
    pub timings: Option<Timings>,
}

/// Why a sequence ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens`, the context, or the time limit.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The log-probability of a sampled token and of the most likely alternatives,
/// from the model's distribution before sampling changed it, or (with
/// `GenerateParams::post_sampling`) from the sampler chain's, where the
/// alternatives are only those the chain kept.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    /// The token's bytes (may be part of a UTF-8 character).
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// `(id, bytes, logprob)`, most likely first.
    pub top: Vec<(u32, Vec<u8>, f32)>,
}

/// llama-server's per-request `timings`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens reused from the slot's cache.
    pub cache_n: usize,
    /// Prompt tokens processed (the prompt less `cache_n`).
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    /// From submission to the first generated token (queueing included).
    pub ttft_ms: f64,
    /// Drafted tokens verified, and those of them accepted (llama-server's
    /// `draft_n` and `draft_n_accepted`, shown only where speculation ran).
    pub draft_n: usize,
    pub draft_n_accepted: usize,
}

impl Timings {
    pub fn prompt_per_second(&self) -> f64 {
        per_second(self.prompt_n, self.prompt_ms)
    }

    /// Decode steps spent generating, as llama-server counts them: the
    /// first token comes from the prompt's last logits and costs none.
    pub fn decode_steps(&self) -> usize {
        self.predicted_n.saturating_sub(1)
    }

    /// Generation speed over the decode steps (0 for a single token).
    pub fn predicted_per_second(&self) -> f64 {
        per_second(self.decode_steps(), self.predicted_ms)
    }
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1e3 / ms
    } else {
        0.0
    }
}

/// How a finished sequence ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub timings: Timings,
}

/// What the engine sends back for a request, in order: any number of
/// `Token` and `Text`, then exactly one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token (its text follows in `Text` once it is safe to show).
    Token {
        id: u32,
        logprob: Option<TokenLogprob>,
        /// The timings up to this token, with
        /// `GenerateParams::timings_per_token`.
        timings: Option<Timings>,
    },
    /// Text ready to show: complete UTF-8, no part of a stop string.
    Text(String),
    /// The prompt's processing, when the request asked for it.
    Progress(Progress),
    Done(Summary),
    Error(EngineError),
}

/// An embedding request's answer: every prompt token's hidden state after
/// the final norm, `n_embd` floats each, in order; or why there is none.
pub type HiddenReply = tokio::sync::oneshot::Receiver<Result<Vec<f32>, EngineError>>;

/// The answer to [`crate::Engine::erase_slot`]: how many tokens the slot
/// held, or why it was not erased.
pub type EraseReply = tokio::sync::oneshot::Receiver<Result<usize, EngineError>>;

/// The receiving end a handler reads. Dropping it cancels the request at the
/// engine's next step.
pub type Events = mpsc::UnboundedReceiver<Event>;
