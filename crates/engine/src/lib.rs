//! Lamina's engine: one thread owns the model and runs every request.
//!
//! - [`Engine`] (`engine.rs`): starts the thread, reports readiness, admits
//!   requests into a bounded queue and returns each one's event stream.
//! - `scheduler.rs`: slots with their own KV caches, prompt-prefix reuse,
//!   one step over every active sequence (continuous batching at the
//!   granularity the backend offers), cancellation of abandoned requests.
//! - [`Backend`] (`backend.rs`): the seam to the forward pass; the CPU model
//!   and the hybrid model (layers on the GPU and the CPU) implement it.
//! - `pacing.rs`: how many prompt tokens a step may take while others
//!   decode, so a long prompt never freezes the streams beside it.
//! - [`StopMatcher`] (`stop.rs`): stop strings held back while they form.
//! - Constrained decoding (JSON mode, schemas, grammars, required tool
//!   calls) is `lamina-grammar`'s: a sequence with a constraint has its
//!   logits masked before sampling, the mask computed on another thread
//!   during the forward pass (`scheduler.rs`).
//! - `draft.rs`: speculative decoding's drafts (n-gram prompt lookup) and
//!   the rule that stops a slot's drafting when it loses; `scheduler.rs`
//!   verifies a sequence's draft in one step and keeps what sampling
//!   confirms, so speculation changes the speed and never the text.
//! - [`Metrics`] (`metrics.rs`): counters for `/metrics`.
//!
//! Nothing here knows HTTP: the server turns [`Event`]s into JSON or SSE.
//!
//! Test with `cargo test -p lamina-engine` (the real models must be fetched
//! by `scripts/fetch-models.sh`).

mod backend;
mod draft;
mod engine;
mod error;
mod metrics;
mod model_info;
mod pacing;
pub mod pooling;
mod prompt_cache;
pub mod rank;
mod request;
mod scheduler;
mod stop;

pub use backend::{Backend, Cache};
pub use draft::{ngram_simple, DraftLimits, SpecType, Speculation};
pub use engine::{default_cache_ram, Engine, EngineConfig, Status, DEFAULT_CACHE_RAM};
pub use error::{EngineError, ModelFault};
pub use lamina_grammar::Constraint;
pub use metrics::{Metrics, MetricsSnapshot, SlotView};
pub use model_info::{ModelInfo, TemplateOrigin};
pub use pacing::DEFAULT_BUDGET as DEFAULT_STEP_BUDGET;
pub use request::{
    EraseReply, Event, Events, FinishReason, GenerateParams, HiddenReply, Progress, Summary,
    Timings, TokenLogprob,
};
pub use scheduler::SlotOp;
pub use stop::{Pushed, StopMatcher};
