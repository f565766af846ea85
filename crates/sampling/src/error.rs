//! Configuration errors, each naming the field and the bound it broke.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be a finite number (got {0})")]
    Temperature(f32),
    #[error("top_p must be in (0, 1] (got {0})")]
    TopP(f32),
    #[error("min_p must be in [0, 1] (got {0})")]
    MinP(f32),
    #[error("repeat_penalty must be a finite number > 0 (got {0})")]
    RepeatPenalty(f32),
    #[error("repeat_last_n must be >= -1 (got {0})")]
    RepeatLastN(i32),
    #[error("presence_penalty must be a finite number (got {0})")]
    PresencePenalty(f32),
    #[error("frequency_penalty must be a finite number (got {0})")]
    FrequencyPenalty(f32),
    #[error("logit_bias for token {token} must be a number or -inf (got {bias})")]
    LogitBias { token: u32, bias: f32 },
    #[error("this sampler's draw needs the whole vocabulary's logits, not its top-k candidates")]
    NeedsLogits,
}
