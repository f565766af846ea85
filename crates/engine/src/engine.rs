//! The engine handle: starts the engine thread, reports readiness, admits
//! requests into a bounded queue and hands back their event streams.
//!
//! Threading: one OS thread owns the model (it opens the file and builds the
//! forward pass there, because the weights borrow the mapped file) and runs
//! the scheduler. Handlers talk to it only through channels: a job goes in
//! over a `std::sync::mpsc` channel, events come back over a tokio channel
//! per request, so the HTTP side never blocks on a forward pass.
//!
//! A mapped model file can change under the server (a copy over it, a
//! re-download into the same path). The scheduler checks the files around
//! every step (`lamina_gguf::Model::check_unchanged`); once one changed, the
//! engine fails what ran in that step, refuses every later request, and its
//! status says [`Status::Broken`] so `/health` tells an orchestrator to
//! restart the process.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lamina_gguf::{LoadMode, Model};
use lamina_model::placement::{self, LoadArgs, Ngl};
use tokio::sync::mpsc as tmpsc;

use crate::backend::Backend as _;
use crate::error::EngineError;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::model_info::{self, InfoParams, ModelInfo};
use crate::request::{EraseReply, Events, GenerateParams, HiddenReply};
use crate::scheduler::{self, Ended, Job, Limits, SlotOp, Work};

/// How to start an engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model: PathBuf,
    /// Total context over all slots; `None`: 4096 per slot (or the model's
    /// training context, if smaller).
    pub n_ctx: Option<usize>,
    /// Sequences decoded together; each gets `n_ctx / n_parallel` positions.
    pub n_parallel: usize,
    /// Requests that may wait for a slot; one more is refused at once.
    pub max_queue: usize,
    /// Server-wide cap on generated tokens per request.
    pub max_tokens: usize,
    /// Server-wide wall-clock limit per request.
    pub timeout: Duration,
    /// Prompt tokens processed per step, so a long prompt does not stall the
    /// sequences that are decoding.
    pub n_batch: usize,
    /// The longest a step with prompt tokens may hold back the sequences
    /// that decode beside it: prompts then get the chunk that fits, at the
    /// speed measured so far. `None`: `n_batch` whatever it costs.
    pub step_budget: Option<Duration>,
    /// A chat template to use instead of the file's.
    pub chat_template: Option<String>,
    /// Let message content write control tokens (`<|im_start|>` typed by a
    /// user becomes the token), as before content was guarded.
    pub parse_special_in_content: bool,
    /// Layers on the GPU (`-ngl`), as `lamina run` places them.
    pub ngl: Ngl,
    /// GPU memory budget for placement.
    pub gpu_memory: Option<u64>,
    /// The KV cache's element types (`-ctk` / `-ctv`).
    pub kv: lamina_model::KvTypes,
    /// Offloaded blocks whose routed experts stay in host memory: the
    /// first `cpu_moe` (`--n-cpu-moe`; `usize::MAX`, the default, all).
    pub cpu_moe: usize,
    /// `-ot` rules for the routed experts ([`lamina_model::plan::ExpertRule`]).
    pub experts: Vec<lamina_model::plan::ExpertRule>,
    /// Map the file (the default) or read it into memory (`--no-mmap`), where
    /// changes to the file cannot reach the server.
    pub load_mode: LoadMode,
    /// `--sleep-idle-seconds`: after this long with nothing to run, the
    /// weights and KV caches are released, and loaded again by the next
    /// request that needs the model. `None`: never.
    pub sleep_idle: Option<Duration>,
    /// Whether top-k samplers' candidates are selected on the GPU holding
    /// the head: always, never (the host selects from the logits), or
    /// (`None`, the default) on any device that is not CPU-backed
    /// (`HybridModel::select_top_on_gpu`): for tests and comparisons.
    pub select_top_on_gpu: Option<bool>,
    /// Run the first steps' shapes once at load, so that a GPU compiles
    /// their kernels before the first request (`--no-warmup` turns it
    /// off; see `scheduler::warm_up`).
    pub warmup: bool,
    /// Bytes of host memory the prompt cache may hold (llama-server's
    /// `--cache-ram`, see prompt_cache.rs); `None`: no prompt cache.
    pub cache_ram: Option<u64>,
    /// A device already open to place layers on (a program embedding the
    /// engine, or a test that holds it); `None` opens one as `ngl` asks.
    pub gpu: Option<Arc<lamina_gpu::Gpu>>,
    /// Speculative decoding (`--spec-type`, `--draft-max`, …; draft.rs).
    pub spec: crate::draft::Speculation,
}

/// Speculation as asked, except for a model with recurrent blocks: a
/// rejected draft would send their state back to a checkpoint (`kv/state.rs`
/// in lamina-model), not to the last accepted token, and every verifying
/// step would take a checkpoint; such models decode plainly until drafts
/// can be rolled back cheaply there.
fn speculation_for(
    spec: crate::draft::Speculation,
    c: &lamina_model::Config,
) -> crate::draft::Speculation {
    if c.recurrent.is_some() && spec.kind != crate::draft::SpecType::None {
        tracing::warn!("speculative decoding is off: this model has recurrent blocks");
        return crate::draft::Speculation {
            kind: crate::draft::SpecType::None,
            ..spec
        };
    }
    spec
}

/// llama-server's default `--cache-ram`: 8192 MiB. Only what is saved is
/// taken, and a save that would leave the host short is not kept.
pub const DEFAULT_CACHE_RAM: u64 = 8192 << 20;

/// The prompt cache's size when none is asked for: [`DEFAULT_CACHE_RAM`],
/// or a quarter of the host memory available now where that is less. A
/// local app's machine is not the server's alone, and a cache that fills
/// whatever is free would take it from the other programs by and by.
pub fn default_cache_ram() -> u64 {
    let quarter = lamina_model::memory::available().map_or(u64::MAX, |a| a.bytes / 4);
    DEFAULT_CACHE_RAM.min(quarter)
}

impl EngineConfig {
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Self {
            model: model.into(),
            n_ctx: None,
            n_parallel: 4,
            max_queue: 64,
            max_tokens: 4096,
            timeout: Duration::from_secs(600),
            n_batch: 512,
            step_budget: Some(crate::pacing::DEFAULT_BUDGET),
            chat_template: None,
            parse_special_in_content: false,
            ngl: Ngl::Auto,
            gpu_memory: None,
            kv: lamina_model::KvTypes::default(),
            cpu_moe: usize::MAX,
            experts: Vec::new(),
            load_mode: LoadMode::Mmap,
            sleep_idle: None,
            select_top_on_gpu: None,
            warmup: true,
            cache_ram: Some(default_cache_ram()),
            gpu: None,
            spec: crate::draft::Speculation::default(),
        }
    }
}

/// Loading, ready, or failed for good.
#[derive(Debug, Clone)]
pub enum Status {
    Loading,
    Ready(Arc<ModelInfo>),
    Failed(String),
    /// Was ready, and can no longer compute (the model file changed under
    /// it): every request fails with this error until the process restarts.
    Broken(EngineError),
}

struct Shared {
    state: OnceLock<Result<Arc<ModelInfo>, String>>,
    /// Set once by the engine thread when it stops computing for good.
    broken: OnceLock<EngineError>,
    jobs: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
    /// Requests admitted and not yet finished: running plus waiting.
    outstanding: Arc<AtomicUsize>,
    n_parallel: usize,
    max_queue: usize,
    max_tokens: usize,
    /// The model is released for idleness (`EngineConfig::sleep_idle`).
    sleeping: Arc<AtomicBool>,
}

/// A cheap, clonable handle to the engine thread. The thread stops when the
/// last handle is dropped and every running sequence has ended.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("ready", &self.info().is_some())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Spawns the engine thread, which loads the model and then serves.
    /// Returns at once; [`Engine::status`] says when the model is ready.
    pub fn start(cfg: EngineConfig) -> Result<Engine, EngineError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let n_parallel = cfg.n_parallel.max(1);
        let shared = Arc::new(Shared {
            state: OnceLock::new(),
            broken: OnceLock::new(),
            jobs: tx,
            metrics: Arc::new(Metrics::default()),
            outstanding: Arc::new(AtomicUsize::new(0)),
            n_parallel,
            max_queue: cfg.max_queue,
            max_tokens: cfg.max_tokens.max(1),
            sleeping: Arc::new(AtomicBool::new(false)),
        });
        let engine = Engine {
            shared: shared.clone(),
        };
        // The thread holds no handle, only what it needs, so dropping the
        // last `Engine` closes the job channel and lets it exit.
        let metrics = shared.metrics.clone();
        let outstanding = shared.outstanding.clone();
        let sleeping = shared.sleeping.clone();
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("lamina-engine".into())
            .spawn(move || {
                let publish = |p: Published| {
                    if let Some(s) = weak.upgrade() {
                        match p {
                            Published::Loaded(r) => {
                                let _ = s.state.set(r);
                            }
                            Published::Broken(e) => {
                                let _ = s.broken.set(e);
                            }
                        }
                    }
                };
                // A failure is published as the status, and whoever started
                // the engine reports it (`serve` as its one error line):
                // logging it here too would print it twice.
                if let Err(e) = load_and_serve(&cfg, rx, metrics, outstanding, &sleeping, publish) {
                    tracing::debug!("{e}");
                }
            })
            .map_err(|e| EngineError::Load(format!("starting the engine thread: {e}")))?;
        Ok(engine)
    }

    pub fn status(&self) -> Status {
        if let Some(e) = self.shared.broken.get() {
            return Status::Broken(e.clone());
        }
        match self.shared.state.get() {
            None => Status::Loading,
            Some(Ok(info)) => Status::Ready(info.clone()),
            Some(Err(e)) => Status::Failed(e.clone()),
        }
    }

    /// Whether the model is released for idleness (llama-server's
    /// `is_sleeping`); the next request that needs it loads it again.
    pub fn is_sleeping(&self) -> bool {
        self.shared.sleeping.load(Ordering::Acquire)
    }

    /// The model, once loaded (still there when broken, for `/metrics`).
    pub fn info(&self) -> Option<Arc<ModelInfo>> {
        match self.shared.state.get() {
            Some(Ok(info)) => Some(info.clone()),
            _ => None,
        }
    }

    /// Blocks until the model is loaded or failed, or `timeout` passes.
    pub fn wait_ready(&self, timeout: Duration) -> Result<Arc<ModelInfo>, EngineError> {
        let end = Instant::now().checked_add(timeout);
        loop {
            match self.status() {
                Status::Ready(info) => return Ok(info),
                Status::Failed(e) => return Err(EngineError::Load(e)),
                Status::Broken(e) => return Err(e),
                Status::Loading if end.is_some_and(|end| Instant::now() >= end) => {
                    return Err(EngineError::NotReady("still loading".into()))
                }
                Status::Loading => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// Every slot as the last step left it (empty until the first step,
    /// or while idle since the start).
    pub fn slots(&self) -> Vec<crate::SlotView> {
        self.shared.metrics.slots()
    }

    /// The generation cap a request gets when it names none: the room left in
    /// a slot after the prompt, and never more than the server-wide cap.
    pub fn default_max_tokens(&self, info: &ModelInfo, prompt_len: usize) -> usize {
        info.n_ctx_slot
            .saturating_sub(prompt_len)
            .min(self.shared.max_tokens)
    }

    /// The server-wide cap on `max_tokens`.
    pub fn max_tokens_cap(&self) -> usize {
        self.shared.max_tokens
    }

    /// Queues a generation. Fails at once when the model is not ready, the
    /// prompt does not fit a slot, or the queue is full.
    pub fn submit(&self, params: GenerateParams) -> Result<Events, EngineError> {
        let info = self.ready()?;
        check_fits(&info, &params)?;
        let (tx, rx) = tmpsc::unbounded_channel();
        self.enqueue(Work::Generate(Box::new(params), tx))?;
        Ok(rx)
    }

    /// Queues an embedding request: `prompt` runs once, from an empty cache,
    /// and its every token's final hidden state comes back on the reply.
    /// Fails at once when the model is not ready, the
    /// prompt is empty or longer than a slot, or the queue is full.
    pub fn submit_hidden(&self, prompt: Vec<u32>) -> Result<HiddenReply, EngineError> {
        let info = self.ready()?;
        if prompt.is_empty() {
            return Err(EngineError::Invalid {
                param: "input",
                message: "input content cannot be empty".into(),
            });
        }
        if prompt.len() > info.n_ctx_slot {
            // "too large", as llama-server says it (its tests look for it).
            return Err(EngineError::Invalid {
                param: "input",
                message: format!(
                    "input is too large to process: {} tokens, and a slot holds {} \
                     (raise the context size)",
                    prompt.len(),
                    info.n_ctx_slot
                ),
            });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.enqueue(Work::Hidden(prompt, tx))?;
        Ok(rx)
    }

    /// Forgets what slot `id` caches (llama-server's `POST /slots/{id}?
    /// action=erase`): at once when no request holds it, else as soon as
    /// its request ends, as llama-server defers it. The reply is how many
    /// tokens it held. Fails at once for a slot that does not exist, or
    /// when the model is not ready or the queue is full.
    pub fn erase_slot(&self, id: usize) -> Result<EraseReply, EngineError> {
        self.slot_action(id, SlotOp::Erase)
    }

    /// [`Engine::erase_slot`] for any slot action: erase, or save to / restore
    /// from a file (the caller chose and checked the path).
    pub fn slot_action(&self, id: usize, op: SlotOp) -> Result<EraseReply, EngineError> {
        let info = self.ready()?;
        if id >= info.n_parallel {
            return Err(EngineError::Invalid {
                param: "id_slot",
                message: format!(
                    "no slot {id}: this server has {} (ids 0 to {})",
                    info.n_parallel,
                    info.n_parallel - 1
                ),
            });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.enqueue(Work::Erase(id, op, tx))?;
        Ok(rx)
    }

    fn ready(&self) -> Result<Arc<ModelInfo>, EngineError> {
        match self.status() {
            Status::Ready(info) => Ok(info),
            Status::Loading => Err(EngineError::NotReady("loading the model".into())),
            Status::Failed(e) => Err(EngineError::NotReady(e)),
            Status::Broken(e) => Err(e),
        }
    }

    fn enqueue(&self, work: Work) -> Result<(), EngineError> {
        let s = &self.shared;
        let limit = s.n_parallel + s.max_queue;
        let admitted = s
            .outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            });
        if let Err(n) = admitted {
            s.metrics.rejected();
            return Err(EngineError::Overloaded {
                active: n.min(s.n_parallel),
                queued: n.saturating_sub(s.n_parallel),
                limit,
            });
        }
        s.metrics.queued.fetch_add(1, Ordering::Relaxed);
        let job = Job {
            work,
            submitted: Instant::now(),
        };
        if s.jobs.send(job).is_err() {
            s.outstanding.fetch_sub(1, Ordering::AcqRel);
            s.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(EngineError::Stopped);
        }
        Ok(())
    }
}

/// The prompt must leave room for at least one generated token in a slot.
fn check_fits(info: &ModelInfo, p: &GenerateParams) -> Result<(), EngineError> {
    if p.prompt.is_empty() {
        return Err(EngineError::Invalid {
            param: "prompt",
            message: "the prompt is empty after tokenization".into(),
        });
    }
    if p.prompt.len() >= info.n_ctx_slot {
        return Err(EngineError::ContextExceeded {
            n_prompt: p.prompt.len(),
            n_ctx: info.n_ctx_slot,
        });
    }
    let n_vocab = info.config.n_vocab;
    if let Some(&bad) = p.prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(EngineError::Invalid {
            param: "prompt",
            message: format!("token id {bad} is outside the vocabulary of {n_vocab}"),
        });
    }
    Ok(())
}

/// What the engine thread tells the handles.
enum Published {
    Loaded(Result<Arc<ModelInfo>, String>),
    Broken(EngineError),
}

fn load_and_serve(
    cfg: &EngineConfig,
    rx: mpsc::Receiver<Job>,
    metrics: Arc<Metrics>,
    outstanding: Arc<AtomicUsize>,
    sleeping: &AtomicBool,
    publish: impl Fn(Published),
) -> Result<(), EngineError> {
    let t0 = Instant::now();
    let fail = |e: EngineError| {
        publish(Published::Loaded(Err(e.to_string())));
        e
    };
    let file = Model::open(&cfg.model, cfg.load_mode)
        .map_err(|e| fail(EngineError::Load(format!("{}: {e}", cfg.model.display()))))?;
    // Placement needs the context first: the per-slot size decides the KV
    // cache the plan accounts for.
    let config = lamina_model::Config::from_gguf(&file)
        .map_err(|e| fail(EngineError::Load(e.to_string())))?;
    let (n_ctx_slot, _) = model_info::slot_context(&config, cfg.n_ctx, cfg.n_parallel);
    let load = LoadArgs {
        ngl: cfg.ngl,
        gpu_memory: cfg.gpu_memory,
        n_ctx: n_ctx_slot.saturating_mul(cfg.n_parallel.max(1)),
        n_parallel: cfg.n_parallel.max(1),
        kv: cfg.kv,
        cpu_moe: cfg.cpu_moe,
        experts: cfg.experts.clone(),
        gpu: cfg.gpu.clone(),
    };
    let (mut model, table) =
        placement::load(&file, &load).map_err(|e| fail(EngineError::Load(e.to_string())))?;
    model.select_top_on_gpu(cfg.select_top_on_gpu);
    let mut info = model_info::build(
        &file,
        model.config(),
        &InfoParams {
            path: &cfg.model,
            n_ctx: cfg.n_ctx,
            n_parallel: cfg.n_parallel,
            template_override: cfg.chat_template.as_deref(),
            parse_special_in_content: cfg.parse_special_in_content,
        },
    )
    .map_err(fail)?;
    info.placement = table;
    let mut slots = scheduler::slots(&model, &info)
        .map_err(|e| fail(EngineError::Load(format!("allocating the KV cache: {e}"))))?;
    if cfg.warmup && model.compiles_kernels() {
        let t = Instant::now();
        scheduler::warm_up(&model, &mut slots)
            .map_err(|e| fail(EngineError::Load(format!("warming up: {e}"))))?;
        tracing::info!(
            "warmed up in {:.0} ms (the first steps' kernels compiled)",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    // Loading read the weights (uploads, repacking): they must be the file's.
    file.check_unchanged()
        .map_err(|e| fail(EngineError::from(e)))?;
    let info = Arc::new(info);
    tracing::info!(
        "model {} loaded in {:.0} ms: {} with {} blocks, {} parameters, vocabulary {}",
        info.id,
        t0.elapsed().as_secs_f64() * 1e3,
        info.config.arch.name(),
        info.config.n_layer,
        info.n_params,
        info.config.n_vocab
    );
    tracing::info!("{}", info.placement);
    tracing::info!(
        "chat template: {:?}; {} slots of {} tokens",
        info.template_origin,
        info.n_parallel,
        info.n_ctx_slot
    );
    publish(Published::Loaded(Ok(info.clone())));
    // Published before any request hears of it, so that a client told of
    // the change and asking /health next is told the same.
    let unchanged = || {
        file.check_unchanged().map_err(|e| {
            let e = EngineError::from(e);
            // One line naming the file; the requests it fails say the same.
            tracing::error!("{e}; every request is refused from now on and /health answers 503");
            publish(Published::Broken(e.clone()));
            e
        })
    };
    let limits = Limits {
        max_tokens: cfg.max_tokens.max(1),
        timeout: cfg.timeout,
        n_batch: cfg.n_batch.max(1),
        step_budget: cfg.step_budget,
        cache_ram: cfg.cache_ram,
        spec: speculation_for(cfg.spec, model.config()),
    };
    let mut loaded = Some((model, slots));
    let mut first = None;
    loop {
        let (model, slots) = match loaded.take() {
            Some(l) => l,
            // Woken from sleep: the same file, placed and cached as before.
            None => {
                let t0 = Instant::now();
                let reloaded = unchanged().and_then(|()| {
                    let (model, _) = placement::load(&file, &load)
                        .map_err(|e| EngineError::Load(e.to_string()))?;
                    let slots = scheduler::slots(&model, &info)
                        .map_err(|e| EngineError::Load(format!("allocating the KV cache: {e}")))?;
                    Ok((model, slots))
                });
                sleeping.store(false, Ordering::Release);
                match reloaded {
                    Ok(l) => {
                        tracing::info!(
                            "awake: the model is loaded again ({:.0} ms)",
                            t0.elapsed().as_secs_f64() * 1e3
                        );
                        l
                    }
                    Err(e) => {
                        tracing::error!("waking from sleep: {e}; every request is refused");
                        publish(Published::Broken(e.clone()));
                        if let Some(job) = first.take() {
                            scheduler::refuse_job(job, &e, &metrics, &outstanding);
                        }
                        scheduler::refuse(&rx, &e, &metrics, &outstanding);
                        return Ok(());
                    }
                }
            }
        };
        let served = scheduler::run(
            &model,
            &info,
            slots,
            limits,
            &rx,
            &metrics,
            &outstanding,
            &unchanged,
            first.take(),
            cfg.sleep_idle,
        );
        match served {
            Ok(Ended::Closed) => return Ok(()),
            Ok(Ended::Idle) => {
                // The weights (GPU buffers, CPU copies) and the KV caches
                // go; the tokenizer and template stay, so the routes that
                // need no forward pass answer as before.
                drop(model);
                sleeping.store(true, Ordering::Release);
                tracing::info!(
                    "idle for {:?}: sleeping, the model's memory is released until the next request",
                    cfg.sleep_idle.unwrap_or_default()
                );
                match rx.recv() {
                    Ok(job) => first = Some(job),
                    Err(_) => return Ok(()),
                }
            }
            Err(e) => {
                scheduler::refuse(&rx, &e, &metrics, &outstanding);
                return Ok(());
            }
        }
    }
}
