//! The flag groups that more than one command shares, each declared once:
//! where layers run ([`Placement`]), the sampling defaults
//! ([`SamplingArgs`]), and `lamina serve`'s own ([`ServeCli`]), which takes
//! llama-server's spellings as well as Lamina's. The single-dash long flags
//! of llama.cpp (`-ngl`, `-np`, `-fa`, `-ub` …) and the llama-server flags
//! Lamina refuses by name live in `llama_flags.rs`.

use std::path::PathBuf;

use lamina_model::placement::Ngl;
use lamina_model::{KvType, KvTypes};
use lamina_sampling::SamplerConfig;

pub fn parse_size(s: &str) -> Result<u64, String> {
    lamina_model::plan::parse_size(s)
        .ok_or_else(|| format!("{s:?} is not a size like 8GiB or 512MiB"))
}

/// Where layers run, for the commands that load a model once.
#[derive(clap::Args, Debug, Clone)]
pub struct Placement {
    /// Slots on the GPU: blocks plus the output layer, which goes first
    /// (llama.cpp's rule); `all`, or `auto` to fit --gpu-memory (hardware
    /// GPUs only). Also -ngl.
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "ngl",
        alias = "gpu-layers",
        short = 'g',
        env = "LAMINA_N_GPU_LAYERS",
        default_value = "auto"
    )]
    pub ngl: Ngl,
    /// GPU memory budget for placement, e.g. 6GiB.
    #[arg(long, env = "LAMINA_GPU_MEMORY", value_parser = parse_size)]
    pub gpu_memory: Option<u64>,
    #[command(flatten)]
    pub cache: CacheTypes,
    #[command(flatten)]
    pub moe: MoeFlags,
}

/// llama.cpp's placement of a mixture of experts' routed experts
/// (`ffn_{gate,up,down}_exps`). An offloaded mixture-of-experts block runs
/// its attention, norms, router and shared expert on the GPU; its routed
/// experts stay in system RAM and run on the CPU (a split block) unless
/// `--n-cpu-moe N` sends those of the blocks from N on to the GPU.
/// Unlike llama.cpp, whose experts go with their block unless told
/// otherwise, Lamina keeps them in RAM by default: its GPU experts are
/// routed on the CPU too, a wait for the device per block and step.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct MoeFlags {
    /// Keep every block's routed experts in system RAM, run on the CPU,
    /// the rest of each offloaded block on the GPU (llama.cpp's --cpu-moe,
    /// also -cmoe). Lamina's default; wins over --n-cpu-moe.
    #[arg(long = "cpu-moe")]
    pub cpu_moe: bool,
    /// Keep only the routed experts of the first N blocks in system RAM;
    /// the later offloaded blocks' go to the GPU with their block
    /// (llama.cpp's --n-cpu-moe, also -ncmoe; 0: every offloaded block's).
    /// Their tokens are routed on the GPU, where a step runs their experts
    /// without waiting for the host (a CPU-backed device waits once per
    /// block for a step of several tokens, to pack each expert's tokens).
    #[arg(long = "n-cpu-moe", value_name = "N")]
    pub n_cpu_moe: Option<usize>,
    /// PATTERN=CPU|GPU[,...]: place the routed experts whose tensor names
    /// match PATTERN (a regex searched in the name, as llama.cpp's
    /// -ot/--override-tensor) in system RAM or on the GPU with their
    /// offloaded block, over --cpu-moe/--n-cpu-moe; repeatable, the first
    /// match wins, and a block's three expert tensors stay together (in RAM
    /// if any is sent there). llama.cpp's GPU buffer names (CUDA0, Vulkan0)
    /// mean the GPU. A pattern that matches any other tensor is an error:
    /// the rest follows -ngl. Also -ot.
    #[arg(long = "override-tensor", value_name = "PATTERN=CPU|GPU")]
    pub override_tensor: Vec<String>,
}

impl MoeFlags {
    /// The blocks whose routed experts stay in RAM: the first
    /// [`lamina_model::plan::PlanParams::cpu_moe`].
    pub fn blocks(&self) -> usize {
        match (self.cpu_moe, self.n_cpu_moe) {
            (false, Some(n)) => n,
            _ => usize::MAX,
        }
    }

    /// The `-ot` rules, in order.
    pub fn rules(&self) -> anyhow::Result<Vec<lamina_model::plan::ExpertRule>> {
        let mut out = Vec::new();
        for s in &self.override_tensor {
            out.extend(lamina_model::plan::ExpertRule::parse_list(s).map_err(anyhow::Error::msg)?);
        }
        Ok(out)
    }
}

/// The KV cache's element types, as llama.cpp spells them. f16 by default
/// (llama.cpp's default too): half of f32's bytes, a median 0.001 nats
/// from the exact model (lamina-model's exact-reference test measures it).
#[derive(clap::Args, Debug, Clone)]
pub struct CacheTypes {
    /// Keys' type in the KV cache: f32, f16 or q8_0 (layers on the GPU
    /// take the same type for keys and values). Also -ctk.
    #[arg(
        long = "cache-type-k",
        env = "LAMINA_CACHE_TYPE_K",
        default_value = "f16"
    )]
    pub k: KvType,
    /// Values' type in the KV cache: f32, f16 or q8_0. Also -ctv.
    #[arg(
        long = "cache-type-v",
        env = "LAMINA_CACHE_TYPE_V",
        default_value = "f16"
    )]
    pub v: KvType,
    /// Sliding-window layers (Gemma 3's local ones) keep every position
    /// instead of a ring of their window plus one step, as llama.cpp's
    /// --swa-full.
    #[arg(long)]
    pub swa_full: bool,
    /// MiB of host memory each sequence may keep in checkpoints of its
    /// recurrent state (hybrid models' recurrent blocks), newest kept: how
    /// far back a conversation's prefix can be reused without processing
    /// it again. Counted by fit and the placement table. 0: none.
    #[arg(
        long,
        env = "LAMINA_CTX_CHECKPOINT_RAM",
        default_value_t = lamina_model::kv::DEFAULT_CHECKPOINT_BYTES >> 20,
        value_name = "MIB"
    )]
    pub ctx_checkpoint_ram: u64,
}

impl CacheTypes {
    pub fn types(&self) -> KvTypes {
        KvTypes {
            k: self.k,
            v: self.v,
            swa_full: self.swa_full,
            checkpoint_bytes: self.ctx_checkpoint_ram.saturating_mul(1 << 20),
        }
    }
}

/// Sampling, as llama.cpp spells it. For `run` these are the sampler's
/// settings; for `serve` they are the server-wide defaults that a request's
/// own fields override (`-n` included: a default, not a cap).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SamplingArgs {
    /// Tokens to generate; -1: until the context is full or the model stops
    /// (run's default is 64; serve's, the room left in the slot).
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict",
          env = "LAMINA_N_PREDICT", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub n_predict: Option<i64>,
    /// 0 is greedy (default 0.8).
    #[arg(long = "temp", visible_alias = "temperature", env = "LAMINA_TEMP")]
    pub temperature: Option<f32>,
    /// 0 disables (default 40).
    #[arg(long, env = "LAMINA_TOP_K")]
    pub top_k: Option<usize>,
    /// Default 0.95.
    #[arg(long, env = "LAMINA_TOP_P")]
    pub top_p: Option<f32>,
    /// Default 0.05.
    #[arg(long, env = "LAMINA_MIN_P")]
    pub min_p: Option<f32>,
    /// 1 is off (the default).
    #[arg(long, env = "LAMINA_REPEAT_PENALTY")]
    pub repeat_penalty: Option<f32>,
    /// -1 (llama.cpp's spelling) or none: a random seed per request; run's
    /// default is 0.
    #[arg(short = 's', long, env = "LAMINA_SEED", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub seed: Option<i64>,
}

impl SamplingArgs {
    /// The sampler these flags describe, on top of the library's defaults.
    #[cfg(test)]
    pub fn sampler(&self) -> anyhow::Result<SamplerConfig> {
        self.sampler_with(&lamina_model::FileSampling::default())
    }

    /// The sampler these flags describe, on top of the model file's own
    /// defaults (`general.sampling.*`, as llama.cpp reads them), on top of
    /// the library's.
    pub fn sampler_with(&self, file: &lamina_model::FileSampling) -> anyhow::Result<SamplerConfig> {
        let d = SamplerConfig::default();
        let check = |name: &str, v: Option<f32>, lo: f32, hi: f32| match v {
            Some(x) if !(x.is_finite() && (lo..=hi).contains(&x)) => {
                anyhow::bail!("--{name} must be between {lo} and {hi} (got {x})")
            }
            _ => Ok(()),
        };
        check("temp", self.temperature, 0.0, 100.0)?;
        check("top-p", self.top_p, 0.0, 1.0)?;
        check("min-p", self.min_p, 0.0, 1.0)?;
        check("repeat-penalty", self.repeat_penalty, 0.0, 10.0)?;
        if self.repeat_penalty == Some(0.0) {
            anyhow::bail!("--repeat-penalty must be greater than 0 (1 is off)");
        }
        Ok(SamplerConfig {
            temperature: self
                .temperature
                .or(file.temperature)
                .unwrap_or(d.temperature),
            top_k: self.top_k.or(file.top_k).unwrap_or(d.top_k),
            // llama.cpp's top-p 0 keeps one token; Lamina's sampler needs p > 0.
            top_p: self
                .top_p
                .filter(|&p| p > 0.0)
                .or(file.top_p)
                .unwrap_or(d.top_p),
            min_p: self.min_p.or(file.min_p).unwrap_or(d.min_p),
            repeat_penalty: self
                .repeat_penalty
                .or(file.repeat_penalty)
                .unwrap_or(d.repeat_penalty),
            repeat_last_n: file.repeat_last_n.unwrap_or(d.repeat_last_n),
            seed: self.seed.and_then(|s| u64::try_from(s).ok()),
            ..d
        })
    }

    /// `-n` as a count: `None` when not given or -1.
    pub fn n_predict(&self) -> Option<usize> {
        self.n_predict.and_then(|n| usize::try_from(n).ok())
    }
}

/// A model by name on the Hugging Face hub, as llama.cpp's -hf takes it.
#[derive(clap::Args, Debug, Clone)]
pub struct HfArgs {
    /// A model on the Hugging Face hub, ORG/REPO or ORG/REPO:QUANT (Q4_K_M when no
    /// quant is named): downloaded into the hub cache, or taken from it.
    /// Also -hf.
    #[arg(
        long = "hf-repo",
        value_name = "ORG/REPO[:QUANT]",
        conflicts_with = "file"
    )]
    pub hf_repo: Option<String>,
    /// The file of --hf-repo to take instead of the quant's. Also -hff.
    #[arg(long = "hf-file", value_name = "FILE", requires = "hf_repo")]
    pub hf_file: Option<String>,
}

impl HfArgs {
    /// The local model file: `file` itself, or the one --hf-repo resolves
    /// to (downloaded first if the cache lacks it).
    pub fn model(&self, file: Option<PathBuf>, offline: bool) -> anyhow::Result<PathBuf> {
        if let Some(file) = file {
            return Ok(file);
        }
        let Some(name) = &self.hf_repo else {
            anyhow::bail!("no model: pass -m FILE or -hf ORG/REPO[:QUANT]");
        };
        let hub = crate::hub::Hub::from_env(offline, |k| std::env::var(k).ok());
        let pulled = crate::hub::pull(&hub, name, self.hf_file.as_deref())?;
        pulled
            .paths
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("{name}: no file resolved"))
    }
}

/// `lamina serve`'s flags: Lamina's own, then the groups.
#[derive(clap::Args, Debug)]
pub struct ServeCli {
    #[arg(
        short = 'm',
        long = "model",
        env = "LAMINA_MODEL",
        required_unless_present = "hf_repo"
    )]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub hf: HfArgs,
    /// Address to bind; the default keeps the server on this machine.
    #[arg(long, env = "LAMINA_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port (the log says which).
    #[arg(long, env = "LAMINA_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Total context, split evenly over the slots (default: 4096 per slot,
    /// or the model's training context if smaller).
    #[arg(short = 'c', long = "ctx-size", env = "LAMINA_CTX_SIZE")]
    pub ctx: Option<usize>,
    /// Requests decoded at once, each in its own slot. Also -np.
    #[arg(
        long,
        visible_alias = "np",
        env = "LAMINA_PARALLEL",
        default_value_t = 4
    )]
    pub parallel: usize,
    /// Require this key (`Authorization: Bearer KEY`) on every route but /health.
    #[arg(
        long,
        env = "LAMINA_API_KEY",
        conflicts_with = "api_key_file",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Read the API key from a file.
    #[arg(long, env = "LAMINA_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// A Jinja chat template to use instead of the file's.
    #[arg(long, env = "LAMINA_CHAT_TEMPLATE_FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// A chat template by llama.cpp's built-in name (chatml, llama3, gemma,
    /// mistral, phi3, command-r), or Jinja source given inline, instead of
    /// the file's.
    #[arg(
        long = "chat-template",
        env = "LAMINA_CHAT_TEMPLATE",
        conflicts_with = "chat_template_file"
    )]
    pub chat_template: Option<String>,
    /// Let message content write control tokens: a user's
    /// `<|im_start|>system` becomes the token, not text (the old behaviour).
    #[arg(long, env = "LAMINA_PARSE_SPECIAL_IN_CONTENT")]
    pub parse_special_in_content: bool,
    /// Seconds open requests get to finish after SIGTERM/SIGINT; past
    /// it the process exits non-zero (a second signal exits at once).
    #[arg(
        long = "shutdown-grace",
        env = "LAMINA_SHUTDOWN_GRACE",
        default_value_t = 30
    )]
    pub shutdown_grace: u64,
    /// Milliseconds a step with prompt tokens may hold back the streams
    /// decoding beside it: while anyone decodes, a prompt gets the chunk
    /// that fits, at the speed the server has measured. 0: every step takes
    /// a whole -b/-ub chunk, however long it holds the others.
    #[arg(
        long = "step-budget-ms",
        env = "LAMINA_STEP_BUDGET_MS",
        default_value_t = lamina_engine::DEFAULT_STEP_BUDGET.as_millis() as u64
    )]
    pub step_budget_ms: u64,
    /// Requests that may wait for a slot; past that, 503 at once.
    #[arg(long, env = "LAMINA_MAX_QUEUE", default_value_t = 64)]
    pub max_queue: usize,
    /// Upper bound on a request's max_tokens / n_predict.
    #[arg(long, env = "LAMINA_MAX_TOKENS", default_value_t = 4096)]
    pub max_tokens: usize,
    /// Seconds a request may run before it ends with finish_reason "length".
    #[arg(long = "timeout", env = "LAMINA_TIMEOUT", default_value_t = 600)]
    pub timeout_s: u64,
    /// Largest request body accepted, e.g. 1MiB.
    #[arg(long, env = "LAMINA_BODY_LIMIT", value_parser = parse_size, default_value = "1MiB")]
    pub body_limit: u64,
    /// Seconds a client has to send a request's headers, and again its
    /// body; idle keep-alive connections close after it too.
    #[arg(long, env = "LAMINA_READ_TIMEOUT", default_value_t = 30)]
    pub read_timeout: u64,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long, env = "LAMINA_THREADS")]
    pub threads: Option<usize>,
    /// Read the model into memory instead of mapping it: it then takes
    /// its size in RAM, and changes to the file cannot reach the server.
    #[arg(long, env = "LAMINA_NO_MMAP")]
    pub no_mmap: bool,
    /// Do not run the first steps' shapes at load: with layers on a GPU, the
    /// first requests then compile the kernels they need (llama-server's
    /// `--no-warmup`).
    #[arg(long, env = "LAMINA_NO_WARMUP")]
    pub no_warmup: bool,
    /// MiB of host memory for the prompt cache: a slot's cache is saved
    /// there when the slot goes to another prompt, and restored when its
    /// conversation comes back (llama-server's --cache-ram; -1: no limit,
    /// 0: off). Default: 8192, or a quarter of the memory available at
    /// start where that is less. A save that would leave the host short
    /// is not kept. Also -cram.
    #[arg(long = "cache-ram", env = "LAMINA_CACHE_RAM", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub cache_ram_mib: Option<i64>,
    #[command(flatten)]
    pub placement: Placement,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub llama: LlamaServerArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Speculative decoding, spelled as llama-server spells it. Drafts change
/// the speed, never the text: each is verified by the model in one step
/// and only what sampling confirms is kept.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Drafts without a draft model: none (the default) or ngram-simple
    /// (the tokens that followed the last earlier occurrence of the
    /// sequence's last --spec-ngram-size-n tokens: code edits, summaries,
    /// anything that copies from its prompt). A slot stops drafting for
    /// the rest of its request once too few drafts are accepted.
    #[arg(long = "spec-type", env = "LAMINA_SPEC_TYPE", default_value = "none",
          value_parser = clap::builder::PossibleValuesParser::new(lamina_engine::SpecType::NAMES))]
    pub spec_type: String,
    /// Most tokens drafted per step; a request's `speculative.n_max`
    /// overrides it. Also --draft, --draft-n.
    #[arg(
        long = "draft-max",
        alias = "draft",
        alias = "draft-n",
        env = "LAMINA_DRAFT_MAX",
        default_value_t = 16
    )]
    pub draft_max: usize,
    /// A shorter draft is not verified; a request's `speculative.n_min`
    /// overrides it. Also --draft-n-min.
    #[arg(
        long = "draft-min",
        alias = "draft-n-min",
        env = "LAMINA_DRAFT_MIN",
        default_value_t = 0
    )]
    pub draft_min: usize,
    /// Tokens of the key ngram-simple looks up.
    #[arg(long = "spec-ngram-size-n", default_value_t = 12,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub ngram_n: u16,
    /// Most tokens one ngram-simple lookup drafts.
    #[arg(long = "spec-ngram-size-m", default_value_t = 48,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub ngram_m: u16,
}

impl SpecArgs {
    /// The engine's settings.
    pub fn speculation(&self) -> lamina_engine::Speculation {
        lamina_engine::Speculation {
            kind: self.spec_type.parse().unwrap_or_default(),
            n_max: self.draft_max,
            n_min: self.draft_min.min(self.draft_max),
            ngram_n: usize::from(self.ngram_n),
            ngram_m: usize::from(self.ngram_m),
        }
    }
}

/// llama-server's serving flags, as it spells them.
#[derive(clap::Args, Debug)]
pub struct LlamaServerArgs {
    /// The model's name in /v1/models and in every response (default: the
    /// file's name). Several, comma-separated, are all listed as `aliases`;
    /// the first in sorted order is the name, as in llama-server.
    #[arg(short = 'a', long, env = "LAMINA_ALIAS")]
    pub alias: Option<String>,
    /// Comma-separated labels listed as the model's `tags` in /v1/models.
    #[arg(long, env = "LAMINA_TAGS")]
    pub tags: Option<String>,
    /// Origins allowed to call the server from a browser: `localhost` (the
    /// default) allows only http(s)://localhost, 127.0.0.1 and `[::1]` on any
    /// port; `*` allows any origin; otherwise a comma-separated list.
    #[arg(long, env = "LAMINA_CORS_ORIGINS", default_value = "localhost")]
    pub cors_origins: String,
    /// Access-Control-Allow-Methods of a preflight.
    #[arg(
        long,
        env = "LAMINA_CORS_METHODS",
        default_value = "GET, POST, DELETE, OPTIONS"
    )]
    pub cors_methods: String,
    /// Access-Control-Allow-Headers of a preflight.
    #[arg(long, env = "LAMINA_CORS_HEADERS", default_value = "*")]
    pub cors_headers: String,
    /// Send Access-Control-Allow-Credentials: false instead of true.
    #[arg(long)]
    pub no_cors_credentials: bool,
    /// Accepted: credentials are allowed by default (as llama-server does).
    #[arg(long, hide = true, conflicts_with = "no_cors_credentials")]
    pub cors_credentials: bool,
    /// Completion responses carry llama-server's `__verbose` object (the
    /// native result, with the prompt as text) unless a request sends
    /// `verbose: false`, and the log shows debug lines unless RUST_LOG
    /// says otherwise.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Serve GET /metrics (the default; llama-server needs this flag).
    #[arg(long, conflicts_with = "no_metrics")]
    pub metrics: bool,
    /// Answer GET /metrics with 501, as llama-server does without --metrics.
    #[arg(long, env = "LAMINA_NO_METRICS")]
    pub no_metrics: bool,
    /// Most prompt tokens one step processes (llama.cpp's logical batch);
    /// the prefill chunk is the smaller of -b and -ub (default 512).
    #[arg(short = 'b', long = "batch-size", env = "LAMINA_BATCH_SIZE")]
    pub batch_size: Option<usize>,
    /// Also the prefill chunk (llama.cpp's physical batch). Also -ub.
    #[arg(long = "ubatch-size", env = "LAMINA_UBATCH_SIZE")]
    pub ubatch_size: Option<usize>,
    /// Accepted, changes nothing: templates are always rendered by Lamina's
    /// Jinja engine.
    #[arg(long, conflicts_with = "no_jinja")]
    pub jinja: bool,
    /// Accepted, changes nothing: Lamina has no non-Jinja template path.
    #[arg(long)]
    pub no_jinja: bool,
    /// on, off or auto; accepted, changes nothing: Lamina's attention is
    /// one kernel whatever this says. Also -fa.
    #[arg(long = "flash-attn", value_parser = ["on", "off", "auto"])]
    pub flash_attn: Option<String>,
    /// Accepted, changes nothing: requests are always decoded together.
    #[arg(long = "cont-batching")]
    pub cont_batching: bool,
    /// With -hf: the hub cache only, never the network (also
    /// HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
    /// Built-in tools for agents, served at GET/POST /tools: a comma list of
    /// read_file, file_glob_search, grep_search, exec_shell_command,
    /// write_file, edit_file, get_info, or `all`. SECURITY: these read and
    /// write files and run shell commands on this host as this user, for
    /// any client that can reach the server: never enable them where
    /// untrusted clients can connect. Off by default (/tools answers 403).
    #[arg(long, env = "LAMINA_TOOLS", value_name = "TOOL1,TOOL2,...")]
    pub tools: Option<String>,
    /// Where the built-in tools run instead of this host:
    /// `docker:<image>` or `podman:<image>` (a container started with the
    /// server and removed when it stops), `docker-container:<id>` or
    /// `podman-container:<id>` (a running one), `ssh:<target>` (a POSIX
    /// host, key-based auth and a trusted host key required).
    #[arg(
        long = "tools-runtime",
        env = "LAMINA_TOOLS_RUNTIME",
        value_name = "OPTION"
    )]
    pub tools_runtime: Option<String>,
    /// Do not serve the chat page at `/`.
    #[arg(long = "no-webui", alias = "no-ui")]
    pub no_webui: bool,
    /// MCP servers to spawn, as JSON: `{"mcpServers": {NAME: {"command",
    /// "args", "env", "cwd", "timeout_ms"}}}`. Their tools are listed by
    /// GET /tools as NAME_TOOL and called by POST /tools.
    #[arg(long = "mcp-servers-json", value_name = "JSON")]
    pub mcp_servers_json: Option<String>,
    /// The same MCP server config, read from a file (both may be given;
    /// a name in both keeps the file's).
    #[arg(long = "mcp-servers-config", value_name = "FILE")]
    pub mcp_servers_config: Option<std::path::PathBuf>,
    /// Serve /cors-proxy?url=…, which forwards a GET or POST to a remote
    /// (http://) MCP server for the web UI. Off by default: it makes the
    /// server fetch URLs on a client's behalf.
    #[arg(
        long = "ui-mcp-proxy",
        alias = "webui-mcp-proxy",
        overrides_with = "no_ui_mcp_proxy"
    )]
    pub ui_mcp_proxy: bool,
    /// Keep /cors-proxy off (the default).
    #[arg(
        long = "no-ui-mcp-proxy",
        alias = "no-webui-mcp-proxy",
        overrides_with = "ui_mcp_proxy"
    )]
    pub no_ui_mcp_proxy: bool,
    /// Answer GET /slots with 501 (it shows the slots by default, as in
    /// llama-server).
    #[arg(long = "no-slots", conflicts_with = "slots")]
    pub no_slots: bool,
    /// Accepted: GET /slots is served by default.
    #[arg(long)]
    pub slots: bool,
    /// A directory where POST /slots/N?action=save writes a slot's tokens
    /// and KV cache and action=restore reads them back (llama-server's
    /// flag; without it those actions are a 501).
    #[arg(long = "slot-save-path")]
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Serve embeddings (`/v1/embeddings`, `/embedding`, Ollama's
    /// `/api/embed`): the hidden state after the model's final norm, pooled
    /// by --pooling. Generation is served as well.
    #[arg(long = "embedding", alias = "embeddings")]
    pub embedding: bool,
    /// none, mean, cls or last: how a prompt's rows become one embedding
    /// (default: the file's `pooling_type`, else none, as llama-server).
    #[arg(long, value_parser = lamina_engine::pooling::Pooling::parse)]
    pub pooling: Option<lamina_engine::pooling::Pooling>,
    /// The norm embeddings are divided by (llama.cpp's --embd-normalize):
    /// -1 none, 0 max absolute to int16, 1 taxicab, 2 Euclidean, p p-norm.
    #[arg(
        long = "embd-normalize",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub embd_normalize: i32,
    /// Serve reranking (`/rerank`, `/v1/rerank`): each document scored with
    /// the query from the last token's hidden state, through the file's
    /// ranking head (`cls.output`) when it has one. A chat model without a
    /// head gets llama-server's answer, which is not a relevance judgement.
    #[arg(long = "reranking", alias = "rerank")]
    pub reranking: bool,
    /// After this many seconds with no request for the model, release its
    /// weights and KV caches (`/props` says `is_sleeping`); the next request
    /// that needs it loads it again. -1 (the default): never.
    #[arg(long = "sleep-idle-seconds", default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub sleep_idle_seconds: i64,
    /// Whether a thinking-capable chat template (one that writes `<think>`)
    /// is asked to think (`enable_thinking`): on, off, or auto (as the
    /// template can). A request's `chat_template_kwargs.enable_thinking`
    /// overrides it. Also -rea.
    #[arg(long = "reasoning", env = "LAMINA_REASONING", default_value = "auto",
          value_parser = ["on", "off", "auto"])]
    pub reasoning: String,
    /// How reasoning comes back: deepseek (or auto, the default) in
    /// `reasoning_content`, none left in the content, deepseek-legacy both.
    #[arg(long = "reasoning-format", env = "LAMINA_REASONING_FORMAT", default_value = "auto",
          value_parser = ["none", "auto", "deepseek", "deepseek-legacy"])]
    pub reasoning_format: String,
    /// -1: thinking is not limited (the default); 0: no thinking, as
    /// --reasoning off. A positive budget is not implemented.
    #[arg(long = "reasoning-budget", env = "LAMINA_REASONING_BUDGET",
          allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    pub reasoning_budget: Option<i64>,
}

impl LlamaServerArgs {
    /// `--reasoning` and `--reasoning-format`, with `--reasoning-budget 0`
    /// read as thinking off.
    pub fn reasoning(
        &self,
    ) -> anyhow::Result<(
        crate::http::reasoning::ReasoningMode,
        lamina_chat::ReasoningFormat,
    )> {
        use crate::http::reasoning::ReasoningMode;
        let mut mode = ReasoningMode::from_name(&self.reasoning)
            .ok_or_else(|| anyhow::anyhow!("--reasoning must be on, off or auto"))?;
        match self.reasoning_budget {
            None | Some(-1) => {}
            Some(0) => mode = ReasoningMode::Off,
            Some(n) => anyhow::bail!(
                "--reasoning-budget {n}: a positive thinking budget is not implemented \
                 (-1: unlimited, 0: no thinking)"
            ),
        }
        let format =
            lamina_chat::ReasoningFormat::from_name(&self.reasoning_format).ok_or_else(|| {
                anyhow::anyhow!(
                    "--reasoning-format must be one of {}",
                    lamina_chat::ReasoningFormat::NAMES
                )
            })?;
        Ok((mode, format))
    }

    /// The prefill chunk, when -b or -ub set one.
    pub fn prefill_chunk(&self) -> anyhow::Result<Option<usize>> {
        let chunk = match (self.batch_size, self.ubatch_size) {
            (Some(b), Some(u)) => Some(b.min(u)),
            (b, u) => b.or(u),
        };
        if chunk == Some(0) {
            anyhow::bail!("--batch-size and --ubatch-size must be at least 1");
        }
        Ok(chunk)
    }
}

#[cfg(test)]
mod sampling_tests {
    use super::*;

    /// A flag beats the file's default, which beats the library's.
    #[test]
    fn flags_then_the_files_defaults_then_the_librarys() {
        let file = lamina_model::FileSampling {
            temperature: Some(0.6),
            top_k: Some(20),
            top_p: Some(0.95),
            repeat_last_n: Some(128),
            ..Default::default()
        };
        let flags = SamplingArgs {
            top_k: Some(5),
            ..Default::default()
        };
        let s = flags.sampler_with(&file).unwrap();
        let d = SamplerConfig::default();
        assert_eq!(s.temperature, 0.6);
        assert_eq!(s.top_k, 5);
        assert_eq!(s.top_p, 0.95);
        assert_eq!(s.min_p, d.min_p);
        assert_eq!(s.repeat_last_n, 128);
        let none = SamplingArgs::default().sampler().unwrap();
        assert_eq!((none.temperature, none.top_k), (d.temperature, d.top_k));
    }
}
