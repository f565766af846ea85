//! The scheduling loop: slots, admission with prompt-prefix reuse, and one
//! step at a time over every active sequence.
//!
//! Each slot owns a KV cache for `n_ctx_slot` positions and remembers which
//! tokens it holds, so a request whose prompt starts with them (the same
//! system prompt, a growing chat) only processes the rest. A step hands the
//! backend every active sequence's next input together (one batched forward
//! pass on the CPU model): a chunk of at most `n_batch` prompt tokens while a
//! sequence is prefilling, then one token per step while decoding, so
//! a new request joins at the next step and a long prompt cannot stall the
//! others for more than a chunk. A sequence whose receiver is gone (client
//! disconnected) is freed before its next forward call.
//!
//! Greedy outputs do not depend on what else runs: every sequence has its own
//! cache and sampler, and the backend computes each independently.
//!
//! The model files are checked before and after every forward call (and
//! every second while idle): the map shows whatever the file holds now, so a
//! file changed during a step may have fed it other weights, or zeros where
//! a truncation cut pages off. A step with a change on either side is never
//! sampled from; every sequence and waiting request fails with the change,
//! and [`run`] returns it for the engine to refuse everything after.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lamina_grammar::Ahead;
use lamina_model::Candidates;
use lamina_sampling::{top_logprobs, PostProbs, Sampler};
use lamina_tokenizer::{Detokenizer, Tokenizer};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::backend::{Backend, Cache};
use crate::draft::{Acceptance, SpecType, Speculation};
use crate::error::EngineError;
use crate::metrics::{Metrics, SlotView};
use crate::model_info::ModelInfo;
use crate::pacing::Pacer;
use crate::prompt_cache::{common_prefix, PromptCache};
use crate::request::{
    Event, FinishReason, GenerateParams, Progress, Summary, Timings, TokenLogprob,
};
use crate::stop::StopMatcher;

/// How often an idle engine checks its model files, so that `/health`
/// reports a changed file without waiting for a request.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Why [`run`] returned without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Every sender is gone and nothing runs: the engine stops.
    Closed,
    /// Nothing ran for the idle time it was given: the model may be
    /// released until the next request (`--sleep-idle-seconds`).
    Idle,
}

/// `Ok` while the model files are the ones loaded.
pub(crate) type Unchanged<'a> = &'a dyn Fn() -> Result<(), EngineError>;

/// A queued request.
pub(crate) struct Job {
    pub work: Work,
    pub submitted: Instant,
}

/// Where a hidden-state request's answer goes.
pub(crate) type HiddenSender = oneshot::Sender<Result<Vec<f32>, EngineError>>;

/// What a queued request asks for, and where its answer goes.
pub(crate) enum Work {
    /// A generation, streamed as events (boxed: its parameters are most
    /// of a job's size, and the queue holds every kind).
    Generate(Box<GenerateParams>, tmpsc::UnboundedSender<Event>),
    /// Every token's final hidden state for this prompt (embeddings).
    Hidden(Vec<u32>, HiddenSender),
    /// Empty, save or restore slot `.0`'s cache once no request holds it;
    /// the reply is how many tokens it held, saved or restored.
    Erase(usize, SlotOp, EraseSender),
}

/// What a slot action does (llama-server's `/slots/N?action=…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotOp {
    Erase,
    /// Write the slot's tokens and cache to this file.
    Save(std::path::PathBuf),
    /// Read a file `Save` wrote into the slot.
    Restore(std::path::PathBuf),
}

/// Where an erase's answer goes.
pub(crate) type EraseSender = oneshot::Sender<Result<usize, EngineError>>;

impl Job {
    fn prompt(&self) -> &[u32] {
        match &self.work {
            Work::Generate(p, _) => &p.prompt,
            Work::Hidden(t, _) => t,
            Work::Erase(..) => &[],
        }
    }

    /// The client is gone.
    fn is_closed(&self) -> bool {
        match &self.work {
            Work::Generate(_, events) => events.is_closed(),
            Work::Hidden(_, reply) => reply.is_closed(),
            Work::Erase(_, _, reply) => reply.is_closed(),
        }
    }

    fn fail(self, e: EngineError) {
        match self.work {
            Work::Generate(_, events) => {
                let _ = events.send(Event::Error(e));
            }
            Work::Hidden(_, reply) => {
                let _ = reply.send(Err(e));
            }
            Work::Erase(_, _, reply) => {
                let _ = reply.send(Err(e));
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_tokens: usize,
    pub timeout: Duration,
    pub n_batch: usize,
    /// How long a step with prompt tokens may hold back the sequences that
    /// decode; `None`: prompts take `n_batch` a step regardless.
    pub step_budget: Option<Duration>,
    /// The host prompt cache's size in bytes; `None`: none.
    pub cache_ram: Option<u64>,
    pub spec: Speculation,
}

pub(crate) struct Slot<C> {
    cache: C,
    /// The tokens whose keys and values `cache` holds, in order.
    tokens: Vec<u32>,
    seq: Option<Sequence>,
    /// When a request last took it (admissions counted), for
    /// [`free_slot`]'s least recently used.
    last_used: u64,
}

/// A request while it runs in a slot.
struct Sequence {
    events: tmpsc::UnboundedSender<Event>,
    sampler: Sampler,
    detok: Detokenizer,
    stop: StopMatcher,
    prompt: Vec<u32>,
    /// Index of the next prompt token to process.
    next_prompt: usize,
    /// The token sampled last, to be fed at the next step.
    next_input: Option<u32>,
    /// Prompt and generated tokens, for the repetition penalties.
    history: Vec<u32>,
    generated: usize,
    max_tokens: usize,
    logprobs: Option<usize>,
    /// `logprobs` after the sampler chain (`GenerateParams::post_sampling`).
    post_sampling: bool,
    /// The output's constraint, on its own thread: its mask for the next
    /// token is computed while the forward pass computes the logits (the
    /// mask depends only on tokens already sampled), and waited for only
    /// when sampling needs it.
    grammar: Option<Ahead>,
    deadline: Instant,
    submitted: Instant,
    started: Instant,
    prompt_done: Option<Instant>,
    cache_n: usize,
    /// Report the prompt's progress (`GenerateParams::progress`).
    progress: bool,
    /// Timings with every token and report
    /// (`GenerateParams::timings_per_token`).
    timings_per_token: bool,
    /// Its draft lengths; `None`: it does not speculate (no `--spec-type`,
    /// `speculative.n_max` 0, or a constraint: a grammar's mask is
    /// computed one token ahead, on its own thread, and a drafted run
    /// would wait for it token by token).
    draft: Option<Draft>,
    acceptance: Acceptance,
}

/// A speculating sequence's draft lengths, its request's or the server's.
#[derive(Debug, Clone, Copy)]
struct Draft {
    n_max: usize,
    n_min: usize,
}

impl Sequence {
    fn prefilling(&self) -> bool {
        self.next_prompt < self.prompt.len()
    }

    /// Whether a step that feeds it `n` more tokens samples its next token
    /// (a prompt chunk that does not end the prompt does not).
    fn samples_after(&self, n: usize) -> bool {
        self.next_prompt + n >= self.prompt.len()
    }

    /// Whether its next token is just the argmax of the raw logits: no
    /// log-probabilities to report, no grammar to mask with, and a plain
    /// greedy sampler ([`Sampler::is_plain_greedy`]).
    fn picks_argmax(&self) -> bool {
        self.logprobs.is_none() && self.grammar.is_none() && self.sampler.is_plain_greedy()
    }

    /// `Some(k)` when its next token depends only on its `k` best raw
    /// logits: no log-probabilities, no grammar, and a top-k sampler with
    /// no bias or penalty ([`lamina_sampling::Sampler::top_k_only`]).
    fn top_k_only(&self) -> Option<usize> {
        if self.logprobs.is_some() || self.grammar.is_some() {
            return None;
        }
        self.sampler.top_k_only()
    }

    /// Sends where the prompt stands, when the request asked; a client that
    /// went away is noticed at the next step.
    fn report_progress(&self) {
        if self.progress {
            let timings = self.timings_per_token.then(|| {
                let mut t = self.timings();
                // No prompt token processed yet: no prompt time either
                // (the clock started when the slot was taken).
                if t.prompt_n == 0 {
                    t.prompt_ms = 0.0;
                }
                t
            });
            let _ = self.events.send(Event::Progress(Progress {
                total: self.prompt.len(),
                cache: self.cache_n,
                processed: self.next_prompt,
                time_ms: self.started.elapsed().as_millis() as u64,
                timings,
            }));
        }
    }

    fn timings(&self) -> Timings {
        let now = Instant::now();
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
        let prompt_end = self.prompt_done.unwrap_or(now);
        Timings {
            cache_n: self.cache_n,
            prompt_n: self.next_prompt.saturating_sub(self.cache_n),
            prompt_ms: ms(self.started, prompt_end),
            predicted_n: self.generated,
            predicted_ms: self.prompt_done.map_or(0.0, |t| ms(t, now)),
            ttft_ms: self.prompt_done.map_or(0.0, |t| ms(self.submitted, t)),
            draft_n: self.acceptance.drafted as usize,
            draft_n_accepted: self.acceptance.accepted as usize,
        }
    }
}

/// How a sequence left its slot.
enum Exit {
    Finished(FinishReason),
    Dropped,
    Failed(EngineError),
    /// The model file changed: logged once by the engine, not per sequence.
    FileChanged(EngineError),
}

struct Ctx<'a> {
    tok: &'a Tokenizer,
    metrics: &'a Metrics,
    outstanding: &'a AtomicUsize,
    limits: Limits,
}

/// The slots' caches, allocated before the model is announced as ready so
/// that an allocation failure is a load error.
pub(crate) fn slots<B: Backend>(
    backend: &B,
    info: &ModelInfo,
) -> Result<Vec<Slot<B::Cache>>, lamina_model::ModelError> {
    // Made together, so the GPU layers' caches share buffers and a step
    // over several slots runs their attention in one dispatch per layer.
    Ok(backend
        .new_caches(info.n_parallel, info.n_ctx_slot)?
        .into_iter()
        .map(|cache| Slot {
            cache,
            tokens: Vec::new(),
            seq: None,
            last_used: 0,
        })
        .collect())
}

/// Sequences whose decode steps [`warm_up`] runs: 1 to this many at once
/// (the small-N kernels' widest; more columns reuse their kernels).
const WARM_SEQS: usize = 8;

/// The longest prompt chunk [`warm_up`] runs alone: with the decode steps'
/// column counts, every count of the small-N kernels and every remainder
/// after whole groups of 8.
const WARM_PROMPT: usize = 16;

/// Runs the steps a server meets first, on the slots' own caches, and
/// forgets them: decode steps of 1 to [`WARM_SEQS`] sequences, reading
/// back picks (greedy requests) and, where the device selects them,
/// top-k candidates (sampled ones); one sequence's prompt chunks of every
/// length the decode steps did not cover, up to [`WARM_PROMPT`] tokens;
/// and a paced prompt chunk beside 1 to [`WARM_SEQS`] - 1 decodes.
///
/// A GPU compiles a kernel the first time a step needs it, which on a
/// CPU-backed device is slow even with the driver's cache warm, and the
/// first requests of every shape paid it: before there was a warm-up it
/// was a large share of `lamina bench serve`'s levels on lavapipe
/// (docs/perf/server.md, 2026-12-07, "warm-up, kept scratch, shared prompt
/// starts"). llama-server warms up at start too (`--no-warmup` turns it
/// off there and here).
pub(crate) fn warm_up<B: Backend>(
    backend: &B,
    slots: &mut [Slot<B::Cache>],
) -> Result<(), lamina_model::ModelError> {
    // The backend's calls fill the caches only (never `tokens`).
    let forget = |slots: &mut [Slot<B::Cache>]| {
        for s in slots.iter_mut() {
            s.cache.truncate(0);
        }
    };
    fn first<T>(
        r: Vec<Result<T, lamina_model::ModelError>>,
    ) -> Result<(), lamina_model::ModelError> {
        r.into_iter().find_map(Result::err).map_or(Ok(()), Err)
    }
    let top = backend.top_on_device();
    let token = [0u32];
    for seqs in 1..=slots.len().min(WARM_SEQS) {
        let mut work: Vec<(&[u32], &mut B::Cache)> = slots[..seqs]
            .iter_mut()
            .map(|s| (&token[..], &mut s.cache))
            .collect();
        first(backend.forward_batch_argmax(&mut work))?;
        // Reading the logits back takes no kernel of its own; selecting
        // top-k candidates on the device does.
        if let Some(k) = top {
            let default_k = lamina_sampling::SamplerConfig::default().top_k;
            first(backend.forward_batch_top(&mut work, k.min(default_k)))?;
        }
        drop(work);
        forget(slots);
    }
    let prompt: Vec<u32> = vec![0; WARM_PROMPT];
    // The decode steps above ran every column count up to their widest,
    // which is what the products' kernels depend on.
    let decoded = slots.len().min(WARM_SEQS);
    if let Some(slot) = slots.first_mut() {
        for n in (decoded + 1).max(2)..=WARM_PROMPT.min(slot.cache.capacity()) {
            first(backend.forward_batch_argmax(&mut [(&prompt[..n], &mut slot.cache)]))?;
            slot.cache.truncate(0);
        }
    }
    // A prompt's chunk beside sequences that decode: the step a server
    // under load runs most (the pacer gives such a chunk `MIN_CHUNK`
    // tokens, the warm prompt's length).
    let chunk = &prompt[..WARM_PROMPT.min(crate::pacing::MIN_CHUNK)];
    for decoding in 1..slots.len().min(WARM_SEQS) {
        let fits = slots.iter().all(|s| s.cache.capacity() > chunk.len());
        if !fits {
            break;
        }
        let mut work: Vec<(&[u32], &mut B::Cache)> = slots[..=decoding]
            .iter_mut()
            .enumerate()
            .map(|(i, s)| (if i == 0 { chunk } else { &token[..] }, &mut s.cache))
            .collect();
        first(backend.forward_batch_argmax(&mut work))?;
        drop(work);
        forget(slots);
    }
    Ok(())
}

/// Serves jobs (`first` before any other) until every sender is gone and
/// nothing is running ([`Ended::Closed`]), until nothing has run for
/// `idle` ([`Ended::Idle`]), or until the model files changed (`Err`, once
/// every sequence and waiting request has failed with that error).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<B: Backend>(
    backend: &B,
    info: &ModelInfo,
    mut slots: Vec<Slot<B::Cache>>,
    limits: Limits,
    rx: &mpsc::Receiver<Job>,
    metrics: &Metrics,
    outstanding: &AtomicUsize,
    unchanged: Unchanged<'_>,
    first: Option<Job>,
    idle: Option<Duration>,
) -> Result<Ended, EngineError> {
    let ctx = Ctx {
        tok: &info.tokenizer,
        metrics,
        outstanding,
        limits,
    };
    metrics
        .kv_capacity
        .store(info.n_ctx_slot * info.n_parallel, Relaxed);
    publish_slots(metrics, &slots);
    let mut waiting: VecDeque<Job> = first.into_iter().collect();
    let mut idle_since = Instant::now();
    // Erases whose slot was busy: done when its request ends.
    let mut erases: Vec<Job> = Vec::new();
    let mut pacer = Pacer::new(limits.step_budget);
    // Lives as long as the caches: released with them when the model sleeps.
    let mut prompt_cache = limits.cache_ram.map(PromptCache::new);
    let mut admissions = 0u64;
    let mut open = true;
    loop {
        let busy = slots.iter().any(|s| s.seq.is_some());
        // A pending erase is done below as soon as its slot is idle.
        if !busy && waiting.is_empty() && erases.is_empty() {
            if !open {
                return Ok(Ended::Closed);
            }
            let wait = match idle {
                Some(d) => {
                    let left = d.saturating_sub(idle_since.elapsed());
                    if left.is_zero() {
                        return Ok(Ended::Idle);
                    }
                    left.min(IDLE_CHECK)
                }
                None => IDLE_CHECK,
            };
            // Idle: sleep until a request arrives, looking at the files now
            // and then.
            match rx.recv_timeout(wait) {
                Ok(job) => waiting.push_back(job),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    unchanged()?;
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(Ended::Closed),
            }
        } else {
            idle_since = Instant::now();
        }
        loop {
            match rx.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        waiting.retain(|job| {
            let gone = job.is_closed();
            if gone {
                metrics.dropped();
                metrics.queued.fetch_sub(1, Relaxed);
                outstanding.fetch_sub(1, Relaxed);
            }
            !gone
        });
        // An erase does not wait its turn for a free slot: it is done as
        // soon as its own slot is idle, before a waiting request takes it.
        let (erase, rest): (VecDeque<Job>, VecDeque<Job>) = std::mem::take(&mut waiting)
            .into_iter()
            .partition(|j| matches!(j.work, Work::Erase(..)));
        waiting = rest;
        metrics.queued.fetch_sub(erase.len(), Relaxed);
        erases.extend(erase);
        erases = std::mem::take(&mut erases)
            .into_iter()
            .filter_map(|job| erase_if_idle(backend, &mut slots, job, &ctx))
            .collect();
        while let Some(i) = free_slot(&slots, waiting.front()) {
            let Some(job) = waiting.pop_front() else {
                break;
            };
            metrics.queued.fetch_sub(1, Relaxed);
            admissions += 1;
            slots[i].last_used = admissions;
            match job.work {
                Work::Generate(params, events) => {
                    if let Some(pc) = prompt_cache.as_mut() {
                        stash(backend, pc, &slots[i], &params.prompt, metrics);
                    }
                    share_prefix(backend, &mut slots, i, &params.prompt);
                    if let Some(pc) = prompt_cache.as_mut() {
                        recall(backend, pc, &mut slots[i], &params.prompt, metrics);
                    }
                    admit(&mut slots[i], *params, events, job.submitted, &ctx, i)
                }
                Work::Hidden(tokens, reply) => {
                    hidden(backend, &mut slots[i], &tokens, reply, &ctx, unchanged)
                }
                // Taken out of `waiting` above.
                Work::Erase(_, _, reply) => {
                    let _ = reply.send(Err(EngineError::Stopped));
                    outstanding.fetch_sub(1, Relaxed);
                }
            }
        }
        // Published before the step as well as after it: a request taken
        // out of the queue above holds its slot from now on, and a first
        // step (a long prompt) must not show it as neither queued nor
        // active, nor let a reader see 0 while its slot is still held.
        publish_active(metrics, &slots);
        if let Err(e) = step(backend, &mut slots, &ctx, &mut pacer, unchanged) {
            for job in erases {
                refuse_one(job, &e, metrics, outstanding);
            }
            fail_all(&mut slots, waiting, &e, &ctx);
            metrics.kv_used.store(0, Relaxed);
            metrics.active.store(0, Relaxed);
            return Err(e);
        }
        let used = slots.iter().map(|s| s.cache.len()).sum();
        metrics.kv_used.store(used, Relaxed);
        let held = slots.iter().map(|s| s.cache.checkpoint_bytes()).sum();
        metrics.checkpoint_bytes.store(held, Relaxed);
        publish_slots(metrics, &slots);
        publish_active(metrics, &slots);
    }
}

/// The gauge of slots a request holds.
fn publish_active<C: Cache>(metrics: &Metrics, slots: &[Slot<C>]) {
    metrics
        .active
        .store(slots.iter().filter(|s| s.seq.is_some()).count(), Relaxed);
}

/// Does an erase job whose slot no request holds (answering how many
/// tokens it held); gives the job back while its slot is busy.
fn erase_if_idle<B: Backend>(
    backend: &B,
    slots: &mut [Slot<B::Cache>],
    job: Job,
    ctx: &Ctx<'_>,
) -> Option<Job> {
    let id = match &job.work {
        Work::Erase(id, ..) => *id,
        _ => return Some(job),
    };
    if slots.get(id).is_some_and(|s| s.seq.is_some()) {
        return Some(job);
    }
    let Work::Erase(_, op, reply) = job.work else {
        return None;
    };
    ctx.outstanding.fetch_sub(1, Relaxed);
    // `Engine::erase_slot` checked the id; a bad one is still an answer.
    let Some(slot) = slots.get_mut(id) else {
        let _ = reply.send(Err(EngineError::Invalid {
            param: "id_slot",
            message: format!("no slot {id}"),
        }));
        return None;
    };
    let n = match op {
        SlotOp::Erase => {
            let n = slot.tokens.len();
            slot.cache.truncate(0);
            slot.tokens.clear();
            tracing::debug!(slot = id, erased = n, "slot erased");
            n
        }
        SlotOp::Save(path) => match save_slot(backend, slot, &path) {
            Ok(n) => n,
            Err(e) => {
                let _ = reply.send(Err(e));
                return None;
            }
        },
        SlotOp::Restore(path) => match restore_slot(backend, slot, &path) {
            Ok(n) => n,
            Err(e) => {
                let _ = reply.send(Err(e));
                return None;
            }
        },
    };
    // Shown before the answer, so a client that reads /slots next sees it.
    let used = slots.iter().map(|s| s.cache.len()).sum();
    ctx.metrics.kv_used.store(used, Relaxed);
    publish_slots(ctx.metrics, slots);
    let _ = reply.send(Ok(n));
    None
}

/// A saved slot's file: this magic and version, the token count and the
/// tokens (u32, little-endian), then the backend's cache bytes.
const SLOT_MAGIC: &[u8; 8] = b"LMSLOT\x01\x00";

fn slot_error(what: String) -> EngineError {
    EngineError::Invalid {
        param: "filename",
        message: what,
    }
}

/// Writes the slot's tokens and cache to `path` (through a temporary file
/// renamed over it, so a reader never sees half a slot); the token count.
fn save_slot<B: Backend>(
    backend: &B,
    slot: &Slot<B::Cache>,
    path: &std::path::Path,
) -> Result<usize, EngineError> {
    let n = slot.cache.len().min(slot.tokens.len());
    let state = backend
        .save_cache(&slot.cache)
        .map_err(|e| slot_error(format!("saving the slot: {e}")))?;
    let mut out = Vec::with_capacity(SLOT_MAGIC.len() + 8 + 4 * n + state.len());
    out.extend_from_slice(SLOT_MAGIC);
    out.extend_from_slice(&(n as u64).to_le_bytes());
    for t in &slot.tokens[..n] {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&state);
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, &out)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| slot_error(format!("writing {}: {e}", path.display())))?;
    tracing::info!(bytes = out.len(), tokens = n, file = %path.display(), "slot saved");
    Ok(n)
}

/// Reads a file [`save_slot`] wrote into the slot; the token count. A file
/// of another model or cache layout is refused and the slot left empty.
fn restore_slot<B: Backend>(
    backend: &B,
    slot: &mut Slot<B::Cache>,
    path: &std::path::Path,
) -> Result<usize, EngineError> {
    let data =
        std::fs::read(path).map_err(|e| slot_error(format!("reading {}: {e}", path.display())))?;
    let bad = || {
        slot_error(format!(
            "{} is not a slot this server saved",
            path.display()
        ))
    };
    let rest = data.strip_prefix(SLOT_MAGIC.as_slice()).ok_or_else(bad)?;
    let (n, rest) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
    let n = usize::try_from(u64::from_le_bytes(*n)).map_err(|_| bad())?;
    if n > slot.cache.capacity() || n.checked_mul(4).is_none_or(|b| b > rest.len()) {
        return Err(bad());
    }
    let (toks, state) = rest.split_at(4 * n);
    let tokens: Vec<u32> = toks
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    slot.tokens.clear();
    let held = backend
        .restore_cache(&mut slot.cache, state)
        .map_err(|e| slot_error(format!("{}: {e}", path.display())))?;
    if held != n {
        slot.cache.truncate(0);
        return Err(bad());
    }
    slot.tokens = tokens;
    tracing::info!(tokens = n, file = %path.display(), "slot restored");
    Ok(n)
}

/// What `/slots` shows: each slot's cache and request, now.
fn publish_slots<C: Cache>(metrics: &Metrics, slots: &[Slot<C>]) {
    if let Ok(mut views) = metrics.slots.lock() {
        views.clear();
        views.extend(slots.iter().enumerate().map(|(id, s)| {
            SlotView {
                id,
                n_ctx: s.cache.capacity(),
                n_cached: s.cache.len(),
                is_processing: s.seq.is_some(),
                n_decoded: s.seq.as_ref().map_or(0, |q| q.generated),
                n_remain: s
                    .seq
                    .as_ref()
                    .map_or(0, |q| q.max_tokens.saturating_sub(q.generated)),
            }
        }));
    }
}

/// The free slot a waiting job takes; `None` when no slot is free or
/// nothing waits. First a slot that loses fewer than [`SHARE_MIN`] of the
/// tokens it holds to the job's prompt: one whose tokens the prompt
/// continues (the same conversation; the longest such start first), else
/// an empty one. Only then a slot that loses more (its tokens go to the
/// host prompt cache first, when there is one): the one with the longest
/// start of the prompt, then the least recently used, as llama-server
/// takes its least recently used slot.
///
/// The pick decides what is lost, not what is reused: [`share_prefix`]
/// then lends the slot the longest start any other slot holds, and
/// [`recall`] the prompt cache's. Taking the slot with the longest start,
/// as before, threw away a conversation held in one slot for a prompt
/// that only shared its system prompt while an empty slot sat idle.
fn free_slot<C>(slots: &[Slot<C>], job: Option<&Job>) -> Option<usize> {
    pick_slot(slots, job?.prompt())
}

/// [`free_slot`] for a prompt.
fn pick_slot<C>(slots: &[Slot<C>], prompt: &[u32]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.seq.is_none())
        .map(|(i, s)| {
            let lcp = common_prefix(&s.tokens, prompt);
            let keeps = s.tokens.len() - lcp < SHARE_MIN;
            (
                keeps,
                lcp,
                std::cmp::Reverse(s.last_used),
                std::cmp::Reverse(i),
            )
        })
        .max()
        .map(|(.., std::cmp::Reverse(i))| i)
}

/// Fails every running sequence and every waiting request with `e`.
fn fail_all<C: Cache>(
    slots: &mut [Slot<C>],
    waiting: VecDeque<Job>,
    e: &EngineError,
    ctx: &Ctx<'_>,
) {
    for slot in slots.iter_mut() {
        slot.cache.truncate(0);
        slot.tokens.clear();
        finish(slot, Exit::FileChanged(e.clone()), ctx);
    }
    for job in waiting {
        ctx.metrics.queued.fetch_sub(1, Relaxed);
        refuse_one(job, e, ctx.metrics, ctx.outstanding);
    }
}

/// After [`run`] gave up: answers every job still sent with `e`, until the
/// last sender is gone.
pub(crate) fn refuse(
    rx: &mpsc::Receiver<Job>,
    e: &EngineError,
    metrics: &Metrics,
    outstanding: &AtomicUsize,
) {
    while let Ok(job) = rx.recv() {
        metrics.queued.fetch_sub(1, Relaxed);
        refuse_one(job, e, metrics, outstanding);
    }
}

/// Answers one received job with `e`.
pub(crate) fn refuse_job(job: Job, e: &EngineError, metrics: &Metrics, outstanding: &AtomicUsize) {
    metrics.queued.fetch_sub(1, Relaxed);
    refuse_one(job, e, metrics, outstanding);
}

fn refuse_one(job: Job, e: &EngineError, metrics: &Metrics, outstanding: &AtomicUsize) {
    metrics.failed();
    outstanding.fetch_sub(1, Relaxed);
    job.fail(e.clone());
}

/// The fewest prompt tokens another slot must save a request for
/// [`share_prefix`] to copy its cache: a few tokens prefill about as fast.
const SHARE_MIN: usize = 8;

/// And the most positions the copy may move per token it saves: it moves
/// the shared positions (and a sliding-window layer's whole ring), each
/// position's keys and values cost microseconds to move and a prompt
/// token's prefill hundreds of times that, but a slot that already holds
/// all but a few tokens of a long shared start would move far more than it
/// saves.
const SHARE_RATIO: usize = 64;

/// Before a request takes slot `i`: when another slot, busy or not, holds
/// a start of `prompt` at least [`SHARE_MIN`] tokens longer than slot
/// `i`'s own (the same system prompt, sent by another client), and not
/// [`SHARE_RATIO`] times fewer than the positions it shares, slot `i`
/// takes a copy of that start of that slot's cache and tokens, and
/// [`admit`]'s prefix reuse then prefills only the rest. Without it every
/// slot prefilled a shared system prompt once for itself. llama-server
/// shares prompts across slots the same way, through its prompt cache.
/// The copy (the backend's [`Backend::copy_cache`]) leaves the source as it
/// was; a failed one leaves slot `i` empty, which costs a full prefill
/// and nothing else.
fn share_prefix<B: Backend>(backend: &B, slots: &mut [Slot<B::Cache>], i: usize, prompt: &[u32]) {
    let Some(own) = slots.get(i).map(|s| common_prefix(&s.tokens, prompt)) else {
        return;
    };
    let best = slots
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(j, s)| (common_prefix(&s.tokens, prompt).min(s.cache.len()), j))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let Some((n, j)) = best.filter(|&(n, _)| worth_sharing(own, n)) else {
        return;
    };
    let (src, dst) = if j < i {
        let (a, b) = slots.split_at_mut(i);
        (&a[j], &mut b[0])
    } else {
        let (a, b) = slots.split_at_mut(j);
        (&b[0], &mut a[i])
    };
    match backend.copy_cache(&src.cache, &mut dst.cache, n) {
        Ok(()) => {
            // Fewer than `n` where a sliding-window ring no longer holds
            // the window before it (Backend::copy_cache); never more, even
            // from a backend that broke that promise.
            let kept = dst.cache.len().min(n);
            dst.tokens.clear();
            dst.tokens.extend_from_slice(&src.tokens[..kept]);
            tracing::debug!(from = j, to = i, tokens = kept, "prompt prefix shared");
        }
        Err(e) => {
            dst.cache.truncate(0);
            dst.tokens.clear();
            tracing::debug!(from = j, to = i, "prompt prefix not shared: {e}");
        }
    }
}

/// Host memory a prompt cache entry must leave free: a saved prompt is a
/// convenience, never worth pushing the host into swap or the OOM killer.
const CACHE_RAM_RESERVE: u64 = 512 << 20;

/// Before slot `slot` takes a request that drops at least [`SHARE_MIN`]
/// of the tokens it holds (its prompt does not continue them): its
/// positions go to the host prompt cache (prompt_cache.rs) unless the
/// cache already holds them, so the conversation they belong to can
/// resume from them when it comes back. A failed save, or one that would leave the host short of memory,
/// keeps nothing (and, for memory, lowers the cache's limit to two fifths
/// of what it holds, as llama-server does when an allocation fails): the
/// request goes on.
fn stash<B: Backend>(
    backend: &B,
    pc: &mut PromptCache,
    slot: &Slot<B::Cache>,
    prompt: &[u32],
    metrics: &Metrics,
) {
    let held = slot.tokens.len().min(slot.cache.len());
    let tokens = &slot.tokens[..held];
    // What the request throws away must be worth a save: not the last few
    // tokens of a reply that the same prompt asks for again. (llama-server
    // saves a slot it picked for resembling the request only when the
    // request keeps less than half of it, so a history that is 60 % system
    // prompt and 40 % conversation loses the conversation there; not here.)
    if held - common_prefix(tokens, prompt).min(held) < SHARE_MIN || !pc.wants(tokens) {
        return;
    }
    // Whether `needed` more bytes would leave the host short; if so the
    // cache shrinks.
    let short = |pc: &mut PromptCache, needed: u64| {
        let short = lamina_model::memory::check_host(needed, CACHE_RAM_RESERVE).is_err();
        if short {
            pc.shrink_to(pc.bytes() / 5 * 2);
            tracing::warn!(
                "host memory is short: the prompt cache keeps {} bytes",
                pc.bytes()
            );
        }
        short
    };
    // The bytes a position took in the cache's last save, or none yet.
    let guess = pc
        .bytes_per_token()
        .map_or(0, |b| b.saturating_mul(held as u64));
    if short(pc, guess) {
        return;
    }
    match backend.save_cache(&slot.cache) {
        Ok(state) => {
            // Taken now: the check is against what is left.
            if short(pc, 0) {
                return;
            }
            let bytes = state.len();
            if pc.insert(tokens.to_vec(), state) {
                tracing::debug!(tokens = held, bytes, "prompt saved to the host cache");
            }
        }
        Err(e) => tracing::debug!("prompt not saved to the host cache: {e}"),
    }
    metrics.prompt_cache(pc.len(), pc.bytes());
}

/// After [`share_prefix`]: when an entry of the host prompt cache holds at
/// least [`SHARE_MIN`] more tokens of `prompt` than `slot` now does (and
/// passes the cache's own rule, [`PromptCache::best`]), it is restored into
/// the slot and cut to what `prompt` shares with it. A failed restore
/// leaves the slot empty, which costs a full prefill and nothing else.
fn recall<B: Backend>(
    backend: &B,
    pc: &mut PromptCache,
    slot: &mut Slot<B::Cache>,
    prompt: &[u32],
    metrics: &Metrics,
) {
    let held = slot.tokens.len().min(slot.cache.len());
    let kept = common_prefix(&slot.tokens[..held], prompt);
    let Some((i, n)) = pc
        .best(prompt, kept, held)
        .filter(|&(_, n)| n >= kept.saturating_add(SHARE_MIN))
    else {
        return;
    };
    let Some(entry) = pc.take(i) else {
        return;
    };
    metrics.prompt_cache(pc.len(), pc.bytes());
    match backend.restore_cache(&mut slot.cache, &entry.state) {
        Ok(_) => {
            slot.cache.truncate(n);
            // Fewer than `n` where a sliding-window ring no longer holds
            // the window before it; never more than the entry's tokens.
            let got = slot.cache.len().min(n).min(entry.tokens.len());
            slot.tokens.clear();
            slot.tokens.extend_from_slice(&entry.tokens[..got]);
            metrics.prompt_restored(got);
            tracing::debug!(tokens = got, "prompt restored from the host cache");
        }
        Err(e) => {
            slot.cache.truncate(0);
            slot.tokens.clear();
            tracing::debug!("prompt not restored from the host cache: {e}");
        }
    }
}

/// Whether a slot holding `shared` positions of the start of a prompt
/// should lend them to a slot that holds `own` of that start.
fn worth_sharing(own: usize, shared: usize) -> bool {
    shared >= own.saturating_add(SHARE_MIN) && (shared - own).saturating_mul(SHARE_RATIO) >= shared
}

/// Runs an embedding request's prompt in `slot` at once, from an empty
/// cache (llama.cpp's embeddings attend to their own tokens only), and sends
/// the rows. It holds the other sequences back for one prompt's forward
/// pass, as a prefill chunk would; `check_hidden` kept it within a slot.
/// The slot then remembers the prompt, so a generation that starts with it
/// reuses its cache.
fn hidden<B: Backend>(
    backend: &B,
    slot: &mut Slot<B::Cache>,
    tokens: &[u32],
    reply: HiddenSender,
    ctx: &Ctx<'_>,
    unchanged: Unchanged<'_>,
) {
    ctx.outstanding.fetch_sub(1, Relaxed);
    if reply.is_closed() {
        ctx.metrics.dropped();
        return;
    }
    slot.cache.truncate(0);
    slot.tokens.clear();
    ctx.metrics.stepped(1, tokens.len());
    let t0 = Instant::now();
    let result = unchanged()
        .and_then(|()| {
            backend
                .hidden(tokens, &mut slot.cache)
                .map_err(EngineError::from)
        })
        .and_then(|rows| unchanged().map(|()| rows));
    match result {
        Ok(rows) => {
            slot.tokens.extend_from_slice(tokens);
            ctx.metrics.embedded(tokens.len(), t0.elapsed());
            let _ = reply.send(Ok(rows));
        }
        Err(e) => {
            slot.cache.truncate(0);
            ctx.metrics.failed();
            let _ = reply.send(Err(e));
        }
    }
}

fn admit<C: Cache>(
    slot: &mut Slot<C>,
    p: GenerateParams,
    events: tmpsc::UnboundedSender<Event>,
    submitted: Instant,
    ctx: &Ctx<'_>,
    index: usize,
) {
    let now = Instant::now();
    // At least the last prompt token is processed again: its logits are
    // where generation starts.
    let reuse = common_prefix(&slot.tokens, &p.prompt).min(p.prompt.len().saturating_sub(1));
    slot.cache.truncate(reuse);
    // A sliding-window ring that no longer holds the window before `reuse`
    // keeps less (nothing): the cache says what it kept.
    let reuse = slot.cache.len();
    slot.tokens.truncate(reuse);
    let room = slot.cache.capacity().saturating_sub(p.prompt.len());
    let max_tokens = p.max_tokens.min(ctx.limits.max_tokens).min(room);
    let timeout = p
        .timeout
        .map_or(ctx.limits.timeout, |t| t.min(ctx.limits.timeout));
    let refuse = |events: &tmpsc::UnboundedSender<Event>, e: EngineError| {
        let _ = events.send(Event::Error(e));
        ctx.outstanding.fetch_sub(1, Relaxed);
    };
    let sampler = match Sampler::new(p.sampler) {
        Ok(s) => s,
        Err(e) => {
            let message = e.to_string();
            return refuse(
                &events,
                EngineError::Invalid {
                    param: "sampling",
                    message,
                },
            );
        }
    };
    let spec = ctx.limits.spec;
    let n_max = p.draft.n_max.unwrap_or(spec.n_max);
    let draft =
        (spec.kind != SpecType::None && p.constraint.is_none() && n_max > 0).then_some(Draft {
            n_max,
            n_min: p.draft.n_min.unwrap_or(spec.n_min).min(n_max),
        });
    let grammar = match p.constraint.map(Ahead::start).transpose() {
        Ok(g) => g,
        Err(e) => return refuse(&events, EngineError::Constraint(e.to_string())),
    };
    tracing::debug!(
        slot = index,
        prompt = p.prompt.len(),
        cached = reuse,
        max_tokens,
        "sequence admitted"
    );
    ctx.metrics.started();
    let seq = slot.seq.insert(Sequence {
        events,
        sampler,
        detok: Detokenizer::new(),
        stop: StopMatcher::new(p.stop),
        history: p.prompt.clone(),
        prompt: p.prompt,
        next_prompt: reuse,
        next_input: None,
        generated: 0,
        max_tokens,
        logprobs: p.logprobs,
        post_sampling: p.post_sampling,
        grammar,
        deadline: now + timeout,
        submitted,
        started: now,
        prompt_done: None,
        cache_n: reuse,
        progress: p.progress,
        timings_per_token: p.timings_per_token,
        draft,
        acceptance: Acceptance::default(),
    });
    // llama-server's first report: nothing processed beyond the cache yet.
    seq.report_progress();
}

/// One forward call for every active sequence, then sampling for those that
/// have their next logits. `Err` (nothing sampled) when the model files
/// changed before or during the call. While some sequences decode, the
/// prompts in the step share what `pacer` allows (pacing.rs).
fn step<B: Backend>(
    backend: &B,
    slots: &mut [Slot<B::Cache>],
    ctx: &Ctx<'_>,
    pacer: &mut Pacer,
    unchanged: Unchanged<'_>,
) -> Result<(), EngineError> {
    let now = Instant::now();
    // Leave before spending a forward call on them.
    for slot in slots.iter_mut() {
        let Some(seq) = &slot.seq else { continue };
        if seq.events.is_closed() {
            finish(slot, Exit::Dropped, ctx);
        } else if now >= seq.deadline {
            finish(slot, Exit::Finished(FinishReason::Length), ctx);
        }
    }

    let n_batch = ctx.limits.n_batch;
    let active = || slots.iter().filter_map(|s| s.seq.as_ref());
    let decoding = active()
        .filter(|s| !s.prefilling() && s.next_input.is_some())
        .count();
    let remaining: Vec<usize> = active()
        .filter(|s| s.prefilling())
        .map(|s| s.prompt.len() - s.next_prompt)
        .collect();
    let allowance = pacer.allowance(n_batch, decoding);
    let mut shares = Pacer::split(allowance, n_batch, &remaining).into_iter();
    if allowance != usize::MAX && remaining.iter().any(|&r| r > 0) {
        let wanted: usize = remaining.iter().map(|&r| r.min(n_batch)).sum();
        if wanted > allowance {
            ctx.metrics.paced();
        }
    }

    let mut inputs: Vec<(usize, Vec<u32>)> = Vec::new();
    // Per input, the rows of logits it needs: 1, or its pending token and
    // draft (speculative decoding: draft.rs).
    let mut keep: Vec<usize> = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        let Some(seq) = &slot.seq else { continue };
        let input = if seq.prefilling() {
            let take = shares.next().unwrap_or(0);
            if take == 0 {
                continue;
            }
            seq.prompt[seq.next_prompt..seq.next_prompt + take].to_vec()
        } else if let Some(id) = seq.next_input {
            let mut input = vec![id];
            input.extend(draft_for(backend, seq, &slot.cache, &ctx.limits.spec));
            input
        } else {
            continue;
        };
        keep.push(if seq.prefilling() { 1 } else { input.len() });
        inputs.push((i, input));
    }
    if inputs.is_empty() {
        return Ok(());
    }
    unchanged()?;
    let (mut prompt_tokens, mut decoded) = (0, 0);
    for (i, input) in &inputs {
        if slots[*i].seq.as_ref().is_some_and(Sequence::prefilling) {
            prompt_tokens += input.len();
        } else {
            decoded += 1;
        }
    }
    ctx.metrics
        .stepped(inputs.len(), inputs.iter().map(|(_, t)| t.len()).sum());
    // When every sequence that samples this step picks the argmax of the
    // raw logits, the backend returns the picks alone (a GPU then reads
    // back a token per sequence, not the vocabulary); when each needs its
    // argmax or its top-k candidates, and the backend selects those where
    // the logits are, the candidates (a GPU reads back k pairs).
    let want = read_want(slots, &inputs, backend.top_on_device());
    let drafted = keep.iter().any(|&k| k > 1);
    let t0 = Instant::now();
    let results: Vec<Result<Vec<Next>, lamina_model::ModelError>> = {
        let mut caches: Vec<Option<&mut B::Cache>> =
            slots.iter_mut().map(|s| Some(&mut s.cache)).collect();
        let mut work: Vec<(&[u32], &mut B::Cache)> = Vec::with_capacity(inputs.len());
        for (i, input) in &inputs {
            if let Some(cache) = caches.get_mut(*i).and_then(Option::take) {
                work.push((input.as_slice(), cache));
            }
        }
        let one = |n: Next| vec![n];
        match want {
            // A step that verifies drafts: every kept row, in one call.
            Want::Argmax if drafted => {
                ctx.metrics.argmax_step();
                let picks = backend.forward_batch_rows_argmax(&mut work, &keep);
                let rows = |p: Vec<u32>| p.into_iter().map(Next::Pick).collect();
                picks.into_iter().map(|r| r.map(rows)).collect()
            }
            _ if drafted => {
                let v = backend.config().n_vocab.max(1);
                let logits = backend.forward_batch_rows(&mut work, &keep);
                let rows = |l: Vec<f32>| l.chunks(v).map(|r| Next::Logits(r.to_vec())).collect();
                logits.into_iter().map(|r| r.map(rows)).collect()
            }
            Want::Argmax => {
                ctx.metrics.argmax_step();
                let picks = backend.forward_batch_argmax(&mut work);
                picks
                    .into_iter()
                    .map(|r| r.map(Next::Pick).map(one))
                    .collect()
            }
            Want::Top(k) => {
                ctx.metrics.top_k_step();
                let top = backend.forward_batch_top(&mut work, k);
                top.into_iter().map(|r| r.map(Next::Top).map(one)).collect()
            }
            Want::Logits => {
                let logits = backend.forward_batch(&mut work);
                logits
                    .into_iter()
                    .map(|r| r.map(Next::Logits).map(one))
                    .collect()
            }
        }
    };
    pacer.observe(prompt_tokens, decoded, t0.elapsed());
    // A change during the call may have fed it other bytes, or zeros where
    // a truncation cut pages off (see lamina_gguf::mapping): discard it all.
    unchanged()?;

    // Each sequence's bookkeeping in slot order; those that sample then
    // choose their tokens together (`choose_all`) and stream them in the
    // same order.
    let mut sampling: Vec<(usize, Next)> = Vec::with_capacity(inputs.len());
    let mut verifying: Vec<(usize, Vec<u32>, Vec<Next>)> = Vec::new();
    for (((i, input), result), k) in inputs.into_iter().zip(results).zip(keep) {
        let slot = &mut slots[i];
        let mut rows = match result {
            Ok(n) if n.len() == k => n,
            Ok(_) => {
                slot.cache.truncate(0);
                slot.tokens.clear();
                let e = EngineError::Sampling("a step returned another number of rows".into());
                finish(slot, Exit::Failed(e), ctx);
                continue;
            }
            Err(e) => {
                // The cache may hold part of this call: forget all of it.
                slot.cache.truncate(0);
                slot.tokens.clear();
                finish(slot, Exit::Failed(EngineError::from(e)), ctx);
                continue;
            }
        };
        if k > 1 {
            verifying.push((i, input, rows));
            continue;
        }
        let Some(next) = rows.pop() else { continue };
        slot.tokens.extend_from_slice(&input);
        let Some(seq) = slot.seq.as_mut() else {
            continue;
        };
        if seq.prefilling() {
            seq.next_prompt += input.len();
            seq.report_progress();
            if seq.prefilling() {
                continue;
            }
            let t = Instant::now();
            seq.prompt_done = Some(t);
            ctx.metrics
                .first_token(t.duration_since(seq.submitted).as_secs_f64() * 1e3);
        }
        sampling.push((i, next));
    }
    for (i, chosen) in choose_all(slots, sampling) {
        let slot = &mut slots[i];
        let Some(seq) = slot.seq.as_mut() else {
            continue;
        };
        let exit = sample_one(seq, chosen, slot.cache.len(), slot.cache.capacity(), ctx);
        if let Some(exit) = exit {
            finish(slot, exit, ctx);
        }
    }
    for (i, input, rows) in verifying {
        verify(&mut slots[i], &input, rows, ctx);
    }
    Ok(())
}

/// The draft to verify after `seq`'s pending token, this step: none where
/// the sequence does not speculate or its drafts no longer pay
/// ([`Acceptance::pays`]); never longer than it may still emit less one,
/// than its cache holds after the pending token, or than one step of its
/// cache takes (a sliding-window ring keeps the window of every position a
/// rejected draft rewinds to); none when shorter than its `n_min`.
fn draft_for<B: Backend>(
    backend: &B,
    seq: &Sequence,
    cache: &B::Cache,
    spec: &Speculation,
) -> Vec<u32> {
    let Some(limits) = seq.draft else {
        return Vec::new();
    };
    if !seq.acceptance.pays() {
        return Vec::new();
    }
    let step = lamina_model::kv::max_step(backend.config(), cache.capacity());
    let most = [
        limits.n_max,
        spec.ngram_m,
        seq.max_tokens.saturating_sub(seq.generated + 1),
        cache.capacity().saturating_sub(cache.len() + 1),
        step.saturating_sub(1),
    ]
    .into_iter()
    .min()
    .unwrap_or(0);
    let draft = match spec.kind {
        SpecType::None => return Vec::new(),
        SpecType::NgramSimple => crate::draft::ngram_simple(&seq.history, spec.ngram_n, most),
    };
    if draft.len() < limits.n_min.max(1) {
        return Vec::new();
    }
    draft
}

/// Samples a drafted step's rows in order, as plain decoding would sample
/// them one step at a time: each row with the sequence's own sampler (so a
/// seeded sampler draws once per emitted token), each token streamed and
/// checked as [`sample_one`] does; a drafted token is kept while it equals
/// what was sampled at its position, and the first that does not ends the
/// run (the sampled token is the next input). The cache then forgets the
/// positions of the drafts that were not kept.
fn verify<C: Cache>(slot: &mut Slot<C>, input: &[u32], rows: Vec<Next>, ctx: &Ctx<'_>) {
    let draft = &input[1..];
    let base = slot.cache.len().saturating_sub(input.len());
    let cap = slot.cache.capacity();
    let mut kept = 0;
    let mut exit = None;
    if let Some(seq) = slot.seq.as_mut() {
        seq.acceptance.drafted += draft.len() as u64;
        for (j, next) in rows.into_iter().enumerate() {
            let chosen = match next {
                Next::Logits(logits) => choose(seq, logits),
                Next::Pick(id) => Ok((id, None)),
                Next::Top(c) => choose_top(seq, &c),
            };
            let token = chosen.as_ref().ok().map(|&(id, _)| id);
            // The cache holds the pending token and the drafts kept so far.
            exit = sample_one(seq, chosen, base + 1 + j, cap, ctx);
            if exit.is_some() || draft.get(j).is_none_or(|&d| Some(d) != token) {
                break;
            }
            kept += 1;
            seq.acceptance.accepted += 1;
        }
        ctx.metrics.drafted(draft.len(), kept);
    }
    let valid = base + 1 + kept;
    slot.cache.truncate(valid);
    slot.tokens.extend_from_slice(&input[..1 + kept]);
    if slot.cache.len() != valid {
        // Not reached: draft_for keeps drafts within one step of the
        // rings. A cache that lost positions cannot continue the sequence.
        slot.cache.truncate(0);
        slot.tokens.clear();
        exit = Some(Exit::Failed(EngineError::Sampling(
            "the cache could not forget a rejected draft".into(),
        )));
    }
    if let Some(exit) = exit {
        finish(slot, exit, ctx);
    }
}

/// What a step reads back for the sequences that sample after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// Each one's argmax: all are plain greedy.
    Argmax,
    /// Each one's argmax and `k` best logits: each is plain greedy or
    /// draws from its top-k alone, and the backend selects them itself.
    Top(usize),
    Logits,
}

/// [`Want`] for a step feeding `inputs` (slot, tokens) to `slots`, where
/// the backend selects up to `top_max` candidates itself.
fn read_want<C>(slots: &[Slot<C>], inputs: &[(usize, Vec<u32>)], top_max: Option<usize>) -> Want {
    // The most candidates a sequence needs (0: all greedy so far), or
    // `None` once one needs the logits.
    let mut k = Some(0);
    for (i, input) in inputs {
        let Some(seq) = slots[*i].seq.as_ref() else {
            continue;
        };
        if !seq.samples_after(input.len()) || seq.picks_argmax() {
            continue;
        }
        k = match (k, seq.top_k_only()) {
            (Some(k), Some(n)) if top_max.is_some_and(|max| n <= max) => Some(k.max(n)),
            _ => None,
        };
    }
    match k {
        Some(0) => Want::Argmax,
        Some(k) => Want::Top(k),
        None => Want::Logits,
    }
}

/// A token and where its log-probability comes from, or why the sequence
/// ends instead ([`choose`]).
type Chosen = Result<(u32, Option<LogprobFrom>), Exit>;

/// Chooses the next token of every sequence in `work` (its slot and what
/// the step gave it), each from its own logits, mask and sampler, so the
/// choices are the same in any order: in parallel where several need the
/// logits (a sampled step over a large vocabulary costs the host a
/// noticeable share of a GPU step, which its other work does not hide:
/// docs/perf/server.md, 2026-12-06, "greedy picks and the top-k sampling
/// pass").
fn choose_all<C>(slots: &mut [Slot<C>], work: Vec<(usize, Next)>) -> Vec<(usize, Chosen)> {
    let parallel = work
        .iter()
        .filter(|(_, n)| matches!(n, Next::Logits(_)))
        .nth(1)
        .is_some();
    let mut seqs: Vec<Option<&mut Sequence>> = slots.iter_mut().map(|s| s.seq.as_mut()).collect();
    let jobs: Vec<(usize, Option<&mut Sequence>, Next)> = work
        .into_iter()
        .map(|(i, next)| (i, seqs.get_mut(i).and_then(Option::take), next))
        .collect();
    let one = |(i, seq, next): (usize, Option<&mut Sequence>, Next)| {
        let chosen = match (seq, next) {
            (Some(seq), Next::Logits(logits)) => choose(seq, logits),
            (Some(seq), Next::Top(c)) => choose_top(seq, &c),
            // The step asked for picks only when nothing else was wanted.
            (_, Next::Pick(id)) => Ok((id, None)),
            // Not reached: every entry's slot holds its sequence.
            (None, Next::Logits(_) | Next::Top(_)) => Err(Exit::Dropped),
        };
        (i, chosen)
    };
    if parallel {
        use rayon::prelude::*;
        jobs.into_par_iter().map(one).collect()
    } else {
        jobs.into_iter().map(one).collect()
    }
}

/// What a step gave a sequence: its last logits, or (a step of greedy
/// sequences only, [`Sequence::picks_argmax`]) their argmax, or (a step of
/// greedy and top-k samplers, [`Want::Top`]) its argmax and candidates.
enum Next {
    Logits(Vec<f32>),
    Pick(u32),
    Top(Candidates),
}

/// The token of a sequence that needs only its argmax or its top-k
/// candidates ([`Sequence::top_k_only`]), which a step selected for it.
fn choose_top(seq: &mut Sequence, c: &Candidates) -> Result<(u32, Option<LogprobFrom>), Exit> {
    if seq.picks_argmax() {
        return Ok((c.argmax, None));
    }
    seq.sampler
        .sample_top(&c.best)
        .map(|id| (id, None))
        .map_err(|e| Exit::Failed(EngineError::Sampling(e.to_string())))
}

/// Where a token's reported log-probability comes from.
enum LogprobFrom {
    /// The sampler chain's distribution.
    Post(PostProbs),
    /// The model's logits, before bias and penalties, and how many top
    /// alternatives to report.
    Raw(Vec<f32>, usize),
}

/// Picks the next token from `logits` (mask, bias, penalties, sampler) and
/// says where its log-probability comes from, if the request wants one.
fn choose(seq: &mut Sequence, mut logits: Vec<f32>) -> Result<(u32, Option<LogprobFrom>), Exit> {
    // Log-probabilities describe the model, before bias and penalties,
    // unless the request asked for the sampler's distribution.
    let post = seq.logprobs.filter(|_| seq.post_sampling);
    let raw = seq
        .logprobs
        .filter(|_| !seq.post_sampling)
        .map(|n| (logits.clone(), n));
    let mask = match seq.grammar.as_mut().map(Ahead::mask).transpose() {
        Ok(m) => m,
        Err(e) => return Err(Exit::Failed(EngineError::Constraint(e.to_string()))),
    };
    if let Some(m) = &mask {
        m.apply(&mut logits);
    }
    let (id, from) = match post {
        Some(n) => {
            let (id, p) = seq.sampler.sample_with_probs(&mut logits, &seq.history, n);
            (id, Some(LogprobFrom::Post(p)))
        }
        None => (
            seq.sampler.sample(&mut logits, &seq.history),
            raw.map(|(l, n)| LogprobFrom::Raw(l, n)),
        ),
    };
    // Fail closed: the sampler falls back to the argmax when every logit
    // is -inf, which happens when `logit_bias` bans all the grammar allows.
    if mask.as_ref().is_some_and(|m| !m.allows(id)) {
        return Err(Exit::Failed(EngineError::Constraint(
            "logit_bias bans every token the output's constraint allows here".into(),
        )));
    }
    Ok((id, from))
}

/// Streams the token [`choose_all`] chose for one sequence and checks the
/// end conditions.
fn sample_one(
    seq: &mut Sequence,
    chosen: Chosen,
    cache_len: usize,
    cache_cap: usize,
    ctx: &Ctx<'_>,
) -> Option<Exit> {
    let (id, from) = match chosen {
        Ok(chosen) => chosen,
        Err(exit) => return Some(exit),
    };
    // The end-of-generation token counts as generated, as llama-server
    // counts it (`predicted_n`, `completion_tokens`), though it is not shown.
    seq.generated += 1;
    if ctx.tok.is_eog(id) {
        return Some(Exit::Finished(FinishReason::Stop));
    }
    seq.history.push(id);
    let logprob = from.map(|f| match f {
        LogprobFrom::Post(p) => post_logprob(ctx.tok, id, &p),
        LogprobFrom::Raw(l, n) => token_logprob(ctx.tok, &l, id, n),
    });
    let timings = seq.timings_per_token.then(|| seq.timings());
    if seq
        .events
        .send(Event::Token {
            id,
            logprob,
            timings,
        })
        .is_err()
    {
        return Some(Exit::Dropped);
    }
    let piece = seq.detok.push(ctx.tok, id);
    let pushed = seq.stop.push(&piece);
    if !pushed.text.is_empty() && seq.events.send(Event::Text(pushed.text)).is_err() {
        return Some(Exit::Dropped);
    }
    if pushed.stopped {
        return Some(Exit::Finished(FinishReason::Stop));
    }
    // The sampled token still has to enter the cache at the next step.
    if seq.generated >= seq.max_tokens || cache_len + 1 > cache_cap {
        return Some(Exit::Finished(FinishReason::Length));
    }
    // Only now that another token will be sampled: the next mask is
    // computed while the next forward pass runs.
    if let Some(g) = seq.grammar.as_mut() {
        if let Err(e) = g.commit(id) {
            return Some(Exit::Failed(EngineError::Constraint(e.to_string())));
        }
    }
    seq.next_input = Some(id);
    None
}

/// The sampler chain's probabilities as log-probabilities.
fn post_logprob(tok: &Tokenizer, id: u32, p: &PostProbs) -> TokenLogprob {
    TokenLogprob {
        id,
        bytes: tok.token_to_piece(id),
        logprob: p.chosen.ln(),
        top: p
            .top
            .iter()
            .map(|&(t, q)| (t, tok.token_to_piece(t), q.ln()))
            .collect(),
    }
}

fn token_logprob(tok: &Tokenizer, logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let lse = f64::from(max)
        + logits
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| (f64::from(l) - f64::from(max)).exp())
            .sum::<f64>()
            .ln();
    let chosen = logits
        .get(id as usize)
        .map_or(f32::NEG_INFINITY, |&l| (f64::from(l) - lse) as f32);
    TokenLogprob {
        id,
        bytes: tok.token_to_piece(id),
        logprob: chosen,
        top: top_logprobs(logits, n)
            .into_iter()
            .map(|(t, lp)| (t, tok.token_to_piece(t), lp))
            .collect(),
    }
}

/// Ends the slot's sequence: flushes held text, reports, frees the slot.
fn finish<C: Cache>(slot: &mut Slot<C>, exit: Exit, ctx: &Ctx<'_>) {
    let Some(mut seq) = slot.seq.take() else {
        return;
    };
    ctx.outstanding.fetch_sub(1, Relaxed);
    let timings = seq.timings();
    match exit {
        Exit::Finished(reason) => {
            ctx.metrics.account(&timings, true);
            if reason == FinishReason::Length {
                // A stop string can no longer complete: show what was held.
                let tail = seq.detok.finish();
                let pushed = seq.stop.push(&tail);
                let mut text = pushed.text;
                if !pushed.stopped {
                    text.push_str(&seq.stop.finish());
                }
                if !text.is_empty() {
                    let _ = seq.events.send(Event::Text(text));
                }
            }
            tracing::info!(
                prompt = seq.prompt.len(),
                cached = timings.cache_n,
                generated = timings.predicted_n,
                prompt_ms = format!("{:.1}", timings.prompt_ms),
                predicted_ms = format!("{:.1}", timings.predicted_ms),
                finish = reason.as_str(),
                "request done"
            );
            let _ = seq.events.send(Event::Done(Summary {
                finish: reason,
                prompt_tokens: seq.prompt.len(),
                completion_tokens: seq.generated,
                timings,
            }));
        }
        Exit::Dropped => {
            ctx.metrics.account(&timings, false);
            ctx.metrics.dropped();
            tracing::info!(
                generated = timings.predicted_n,
                "client went away; slot freed"
            );
        }
        Exit::Failed(e) => {
            ctx.metrics.account(&timings, false);
            ctx.metrics.failed();
            tracing::error!("sequence failed: {e}");
            let _ = seq.events.send(Event::Error(e));
        }
        Exit::FileChanged(e) => {
            ctx.metrics.account(&timings, false);
            ctx.metrics.failed();
            tracing::debug!(generated = timings.predicted_n, "sequence failed: {e}");
            let _ = seq.events.send(Event::Error(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_keeps_its_slot_while_another_is_free() {
        let slot = |tokens: Vec<u32>, last_used: u64| Slot {
            cache: (),
            tokens,
            seq: None,
            last_used,
        };
        let system: Vec<u32> = (1..=30).collect();
        let with = |rest: std::ops::Range<u32>| -> Vec<u32> {
            system.iter().copied().chain(rest).collect()
        };
        // Slot 0 holds conversation A, slot 1 nothing.
        let slots = vec![slot(with(100..200), 1), slot(Vec::new(), 0)];
        // A new conversation sharing only the system prompt takes the
        // empty slot (it borrows the system prompt from slot 0), not A's.
        assert_eq!(pick_slot(&slots, &with(500..520)), Some(1));
        // A's next turn takes A's slot.
        assert_eq!(pick_slot(&slots, &with(100..230)), Some(0));
        // Losing fewer than SHARE_MIN tokens of it (the same prompt asked
        // again, a reply regenerated) still counts as continuing it.
        assert_eq!(pick_slot(&slots, &with(100..195)), Some(0));
        // Every slot holds a conversation the prompt does not continue:
        // the longest start first, then the least recently used.
        let slots = vec![
            slot(with(100..200), 3),
            slot(with(200..300), 1),
            slot(with(300..400), 2),
        ];
        assert_eq!(pick_slot(&slots, &with(500..520)), Some(1));
        assert_eq!(pick_slot(&slots, &with(300..310)), Some(2));
        // Ties on all of it: the lowest index.
        let slots = vec![slot(Vec::new(), 0), slot(Vec::new(), 0)];
        assert_eq!(pick_slot(&slots, &with(0..5)), Some(0));
        assert_eq!(pick_slot::<()>(&[], &[1]), None);
    }

    #[test]
    fn a_slot_lends_a_prompt_start_only_where_the_copy_pays() {
        // A system prompt of 40 tokens to an empty slot: yes; to one that
        // holds 35 of them: no.
        assert!(worth_sharing(0, 40));
        assert!(!worth_sharing(35, 40));
        assert!(worth_sharing(0, SHARE_MIN));
        assert!(!worth_sharing(0, SHARE_MIN - 1));
        // A long start that the slot holds all but a few tokens of moves
        // more than it saves.
        let long = 100 * SHARE_RATIO;
        assert!(!worth_sharing(long - 99, long));
        assert!(worth_sharing(long - 100, long));
        // A slot never lends less than the request's own slot holds.
        assert!(!worth_sharing(50, 40));
    }
}
