//! The `lamina` binary: the command line over the library crates.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};
use cli::{parse_size, Placement, SamplingArgs, ServeCli};
use lamina_gguf::{LoadMode, Model};

mod bench;
mod bench_serve;
mod bench_spec;
mod cli;
mod cli_doc;
mod devices;
mod fit;
mod http;
mod hub;
mod inspect;
mod llama_flags;
mod progress;
mod run;
mod score;
mod serve;
mod synth;

#[derive(Parser)]
#[command(
    name = "lamina",
    version,
    about = "An OpenAI-compatible inference server for GGUF models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a GGUF file holds: header, metadata, tensor table, and whether its layout is sound.
    Inspect {
        /// The .gguf file (for a split model, its first shard).
        file: PathBuf,
        /// Print the facts as one JSON object.
        #[arg(long)]
        json: bool,
        /// Dump arrays in full instead of summarising them.
        #[arg(long)]
        full: bool,
        /// Read the file into memory instead of mapping it.
        #[arg(long)]
        no_mmap: bool,
    },
    /// Generate a continuation of one prompt, streamed to stdout, then the timings.
    Run {
        #[arg(short = 'm', long = "model", required_unless_present = "hf_repo")]
        file: Option<PathBuf>,
        #[command(flatten)]
        hf: cli::HfArgs,
        /// With -hf: the hub cache only, never the network (also
        /// HF_HUB_OFFLINE=1).
        #[arg(long)]
        offline: bool,
        #[arg(short = 'p', long)]
        prompt: String,
        /// Positions of the KV cache: 4096 when not given (or the training
        /// context, if smaller); 0 is the training context. A value past the
        /// training context is used, with a warning, as llama.cpp does.
        #[arg(short = 'c', long = "ctx-size")]
        ctx: Option<usize>,
        #[command(flatten)]
        sampling: SamplingArgs,
        /// Wrap the prompt in the model's chat template as one user turn.
        #[arg(long)]
        chat: bool,
        /// CPU threads (default: all cores).
        #[arg(short = 't', long)]
        threads: Option<usize>,
        /// Print one JSON object instead of streaming.
        #[arg(long)]
        json: bool,
        #[arg(long)]
        no_mmap: bool,
        #[command(flatten)]
        placement: Placement,
    },
    /// Download a model from the Hugging Face hub into its cache and print its local path, for -m.
    ///
    /// The cache is huggingface_hub's (HF_HUB_CACHE, else HF_HOME/hub, else
    /// ~/.cache/huggingface/hub): a file either downloaded is found by the
    /// other. HF_TOKEN authenticates, HF_ENDPOINT names a mirror.
    Pull {
        /// ORG/REPO or ORG/REPO:QUANT: the .gguf whose name holds QUANT (any case;
        /// Q4_K_M, else the first .gguf, when none is named), every shard of
        /// a split model.
        name: String,
        /// The file of the repo to take instead of the quant's.
        #[arg(long = "hf-file", value_name = "FILE")]
        hf_file: Option<String>,
        /// The cache only, never the network (also HF_HUB_OFFLINE=1): an
        /// error if the model is not there.
        #[arg(long)]
        offline: bool,
    },
    /// Serve the model over an OpenAI-compatible HTTP API (also llama-server's native one).
    Serve(Box<ServeCli>),
    /// Print the token ids of TEXT (and their pieces), like llama-tokenize.
    Tokenize {
        #[arg(short = 'm', long = "model")]
        file: PathBuf,
        text: String,
        /// Do not add BOS even where the file says to.
        #[arg(long)]
        no_bos: bool,
        /// Treat control-token text as plain text.
        #[arg(long)]
        no_parse_special: bool,
        /// Print the ids as one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Teacher-forced log-probabilities: reads {"prompt_ids", "forced_tokens",
    /// "top"} on stdin, prints {"steps": [{"top": [[id, logprob]...], "forced_logprob"}]}.
    Score {
        #[arg(short = 'm', long = "model")]
        file: PathBuf,
        #[command(flatten)]
        placement: Placement,
    },
    /// Plan layer placement for a GPU memory budget, from the header alone.
    Fit {
        /// The .gguf file (for a split model, its first shard).
        #[arg(short = 'm', long = "model")]
        file: PathBuf,
        /// GPU memory budget, e.g. 8GiB (default: a table for common card sizes).
        #[arg(long, value_parser = parse_size)]
        gpu_memory: Option<u64>,
        /// Total context in tokens (default: several sizes).
        #[arg(short = 'c', long = "ctx-size")]
        ctx: Option<usize>,
        /// Sequences decoded together.
        #[arg(long, default_value_t = 1)]
        parallel: usize,
        #[command(flatten)]
        cache: cli::CacheTypes,
        #[command(flatten)]
        moe: cli::MoeFlags,
        #[arg(long)]
        json: bool,
        /// Probe the CPU's and GPU's bandwidth and predict decode tokens/s per -ngl.
        #[arg(long)]
        measure: bool,
    },
    /// Write a GGUF with random quantized weights in a real model's shape
    /// (SmolLM2's, Llama 3.2 1B's or 3.1 8B's, a small phi3, a qwen3moe /
    /// qwen2moe mixture of experts, or a Qwen3.5/3.6 hybrid) for tests and
    /// benchmarks at scale.
    Synth {
        /// smollm2, 1b, 8b, phi3-tiny, qwen3moe-tiny, qwen2moe-tiny,
        /// qwen3moe-small, 30b-a3b, qwen35-tiny, qwen35-0.8b, qwen36-27b or
        /// qwen36-35b-a3b.
        #[arg(long, default_value = "1b")]
        shape: String,
        /// Weight type of every matrix (norms are F32): F16, Q4_0, Q4_1,
        /// Q5_0, Q5_1, Q8_0, Q2_K … Q6_K.
        #[arg(long = "type", default_value = "Q4_0")]
        ty: String,
        /// Copy this GGUF's tokenizer (and vocabulary size), so `run` and
        /// `serve` work on the result.
        #[arg(long)]
        vocab_from: Option<PathBuf>,
        /// Vocabulary size without --vocab-from (SmolLM2's).
        #[arg(long, default_value_t = 49152)]
        vocab: u64,
        #[arg(short = 'o', long)]
        output: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// PATTERN=TYPE: matrices whose name contains PATTERN get TYPE
        /// (llama-quantize's --tensor-type); also IQ4_NL, IQ4_XS, IQ2_XXS,
        /// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, Q8_1. Repeatable; the
        /// first match wins.
        #[arg(long = "tensor-type")]
        tensor_type: Vec<String>,
        /// Write only the metadata (the tokenizer of --vocab-from), no tensors.
        #[arg(long)]
        vocab_only: bool,
        /// Llama 3.x RoPE scaling with this factor (rope_freqs.weight, low
        /// and high frequency factors 1 and 4 over 8192 original positions,
        /// as llama.cpp's converter writes it); 0: none. Default: the
        /// shape's own (32 for 1b, 8 for 8b, none for the others)
        #[arg(long)]
        llama3_rope: Option<f32>,
        /// phi3 shapes: LongRoPE factors (long and short sets, a trained
        /// context of 512 of the file's 8192, the attention factor Phi-3's
        /// converter derives from them), as the 128k-context files carry
        #[arg(long)]
        long_rope: bool,
        /// YaRN RoPE scaling with this factor (rope.scaling.type yarn, an
        /// original context of the file's 8192 over the factor), as
        /// Qwen's long-context files declare it
        #[arg(long)]
        yarn: Option<f32>,
    },
    /// Measure kernels or a model: figures, with the machine's yardsticks beside them.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// List the GPU adapters wgpu sees, with the limits that matter for inference.
    Devices {
        #[arg(long)]
        json: bool,
    },
    /// Print docs/cli.md: every subcommand's --help as markdown.
    #[command(hide = true)]
    CliDoc,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Mat-vec GB/s per weight type (GPU beside a copy kernel, CPU beside
    /// memcpy) and GPU mat-mul GFLOP/s.
    Kernels {
        #[arg(long, default_value_t = 4096)]
        rows: usize,
        #[arg(long, default_value_t = 4096)]
        cols: usize,
        #[arg(long, default_value_t = 20)]
        iters: u32,
        /// Columns of the mat-mul measurement, one count or several
        /// (`16,64,512`: where the small-N and tiled kernels cross on a
        /// device); 0 skips it.
        #[arg(long, value_delimiter = ',', default_value = "512")]
        matmul_cols: Vec<usize>,
        /// Also the GPU mat-vec at the real models' own shapes (SmolLM2's
        /// 576×576 … 49152×576 head, Gemma 3's 640×2048 … 262144×640 head),
        /// each beside a copy kernel moving the same bytes.
        #[arg(long)]
        model_shapes: bool,
        /// Only the GPU kernels.
        #[arg(long, conflicts_with = "cpu_only")]
        gpu_only: bool,
        /// Only the CPU kernels.
        #[arg(long)]
        cpu_only: bool,
        /// CPU threads (default: all cores).
        #[arg(short = 't', long)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Prompt processing (pp) and generation (tg) tokens/s, as llama-bench measures them.
    Model {
        #[arg(short = 'm', long = "model")]
        file: PathBuf,
        #[arg(short = 'p', long = "n-prompt", default_value_t = 128)]
        n_prompt: usize,
        #[arg(short = 'n', long = "n-gen", default_value_t = 64)]
        n_gen: usize,
        #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
        reps: usize,
        /// Tokens already in the cache when pp and tg run (llama-bench's -d):
        /// the cost of attention over a long context.
        #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
        depth: usize,
        #[arg(
            long = "n-gpu-layers",
            visible_alias = "ngl",
            short = 'g',
            default_value = "0"
        )]
        ngl: lamina_model::placement::Ngl,
        #[command(flatten)]
        cache: cli::CacheTypes,
        #[command(flatten)]
        moe: cli::MoeFlags,
        /// CPU threads (default: all cores).
        #[arg(short = 't', long)]
        threads: Option<usize>,
        /// Also decode this many sequences together (comma-separated
        /// levels, as llama-batched-bench's -npl): aggregate tokens/s of
        /// one step for all of them.
        #[arg(long = "npl", value_delimiter = ',')]
        npl: Vec<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Generation tokens/s with and without speculative decoding, on ten
    /// requests that rewrite a function with one change (they copy from
    /// their prompt), alternating the two; the tokens must be the same.
    Spec {
        #[arg(short = 'm', long = "model")]
        file: PathBuf,
        #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
        n_gen: usize,
        #[arg(short = 'r', long = "repetitions", default_value_t = 1)]
        reps: usize,
        #[arg(
            long = "n-gpu-layers",
            visible_alias = "ngl",
            short = 'g',
            default_value = "0"
        )]
        ngl: lamina_model::placement::Ngl,
        #[command(flatten)]
        spec: cli::SpecArgs,
        /// CPU threads (default: all cores).
        #[arg(short = 't', long)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// The server under load: concurrent streaming chat clients over loopback
    /// HTTP; generated tokens/s, time to first token and latency per level.
    Serve {
        /// The model to serve in this process; not with --server.
        #[arg(short = 'm', long = "model", required_unless_present = "server")]
        file: Option<PathBuf>,
        /// Measure a server already listening at HOST:PORT (another Lamina,
        /// llama-server…) instead of starting one: the same client, so two
        /// servers compare on equal terms.
        #[arg(long, conflicts_with_all = ["file", "parallel", "ctx", "ngl"])]
        server: Option<String>,
        /// Concurrency levels, run in turn.
        #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
        clients: Vec<usize>,
        /// Requests each client sends, one after another.
        #[arg(long, default_value_t = 4)]
        requests_per_client: usize,
        /// max_tokens of every request.
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
        /// temperature of every request: 0 is greedy; above 0 each request
        /// samples with the server's other defaults (top_k 40, top_p 0.95,
        /// min_p 0.05) and a seed of its own, so a run repeats.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Server slots (default: the largest level).
        #[arg(long, visible_alias = "np")]
        parallel: Option<usize>,
        /// Total context (default: max_tokens + 256 per slot).
        #[arg(short = 'c', long = "ctx-size")]
        ctx: Option<usize>,
        #[arg(
            long = "n-gpu-layers",
            visible_alias = "ngl",
            short = 'g',
            default_value = "0"
        )]
        ngl: lamina_model::placement::Ngl,
        /// Seconds one request may take before it counts as failed.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Each client holds one conversation: every request after its
        /// first sends the conversation so far (the earlier prompts and
        /// replies) and a follow-up question, as a chat app does.
        #[arg(long)]
        conversation: bool,
        /// The served model's host prompt cache in MiB (serve's
        /// --cache-ram; -1: no limit, 0: off).
        #[arg(long = "cache-ram", conflicts_with = "server", allow_negative_numbers = true,
              value_parser = clap::value_parser!(i64).range(-1..))]
        cache_ram: Option<i64>,
        /// CPU threads (default: all cores).
        #[arg(short = 't', long)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
}

fn thread_pool(threads: Option<usize>) -> anyhow::Result<()> {
    if let Some(t) = threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global()
            .context("starting the CPU thread pool")?;
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Inspect {
            file,
            json,
            full,
            no_mmap,
        } => {
            let mode = if no_mmap {
                LoadMode::Read
            } else {
                LoadMode::Mmap
            };
            let model = Model::open(&file, mode)?;
            if json {
                println!("{}", inspect::to_json(&model, full));
            } else {
                print!("{}", inspect::to_text(&model, full));
            }
        }
        Command::Pull {
            name,
            hf_file,
            offline,
        } => {
            let hub = hub::Hub::from_env(offline, |k| std::env::var(k).ok());
            let pulled = hub::pull(&hub, &name, hf_file.as_deref())?;
            if pulled.downloaded == 0 {
                eprintln!("{name}: in the cache already");
            }
            for p in &pulled.paths {
                println!("{}", p.display());
            }
        }
        Command::Run {
            file,
            hf,
            offline,
            prompt,
            ctx,
            sampling,
            chat,
            threads,
            json,
            no_mmap,
            placement,
        } => {
            thread_pool(threads)?;
            let file = hf.model(file, offline)?;
            let sampler = sampling.sampler_with(&lamina_model::FileSampling::open(&file))?;
            run::run(run::RunArgs {
                file,
                prompt,
                // llama-cli's -1: until the context is full.
                n_predict: match sampling.n_predict {
                    None => 64,
                    Some(_) => sampling.n_predict().unwrap_or(usize::MAX),
                },
                n_ctx: ctx,
                temperature: sampler.temperature,
                top_k: sampler.top_k,
                top_p: sampler.top_p,
                min_p: sampler.min_p,
                seed: sampler.seed.unwrap_or(0),
                repeat_penalty: sampler.repeat_penalty,
                chat,
                json,
                no_mmap,
                ngl: placement.ngl,
                gpu_memory: placement.gpu_memory,
                kv: placement.cache.types(),
                cpu_moe: placement.moe.blocks(),
                experts: placement.moe.rules()?,
            })?
        }
        Command::Serve(a) => {
            thread_pool(a.threads)?;
            serve::run(serve_args(*a)?)?
        }
        Command::Synth {
            shape,
            ty,
            vocab_from,
            vocab,
            output,
            seed,
            vocab_only,
            tensor_type,
            llama3_rope,
            long_rope,
            yarn,
        } => synth::run(synth::SynthArgs {
            shape: &shape,
            ty: &ty,
            vocab_from: vocab_from.as_deref(),
            vocab,
            output: &output,
            seed,
            tensor_types: &tensor_type,
            vocab_only,
            llama3_rope,
            long_rope,
            yarn,
        })?,
        Command::Fit {
            file,
            gpu_memory,
            ctx,
            parallel,
            cache,
            moe,
            json,
            measure,
        } => fit::run(fit::FitArgs {
            cpu_moe: moe.blocks(),
            experts: moe.rules()?,
            file: &file,
            budget: gpu_memory,
            n_ctx: ctx,
            n_parallel: parallel.max(1),
            kv: cache.types(),
            json,
            measure,
        })?,
        Command::Bench {
            what:
                BenchCommand::Kernels {
                    rows,
                    cols,
                    iters,
                    matmul_cols,
                    model_shapes,
                    gpu_only,
                    cpu_only,
                    threads,
                    json,
                },
        } => {
            thread_pool(threads)?;
            bench::kernels(&bench::KernelArgs {
                rows,
                cols,
                iters: iters.max(1),
                gpu: !cpu_only,
                cpu: !gpu_only,
                matmul_cols,
                model_shapes,
                json,
            })?
        }
        Command::Bench {
            what:
                BenchCommand::Serve {
                    file,
                    server,
                    clients,
                    requests_per_client,
                    max_tokens,
                    temperature,
                    parallel,
                    ctx,
                    ngl,
                    timeout,
                    conversation,
                    cache_ram,
                    threads,
                    json,
                },
        } => {
            thread_pool(threads)?;
            let target = match (server, file) {
                (Some(addr), _) => bench_serve::Target::Server(addr),
                (None, Some(file)) => bench_serve::Target::Model(file),
                (None, None) => {
                    anyhow::bail!("bench serve needs --model FILE or --server HOST:PORT")
                }
            };
            bench_serve::run(&bench_serve::ServeBenchArgs {
                target,
                clients,
                requests_per_client,
                max_tokens,
                temperature,
                parallel,
                n_ctx: ctx,
                ngl,
                timeout_s: timeout,
                conversation,
                cache_ram: cache_ram.map(cache_ram_bytes),
                json,
            })?
        }
        Command::Bench {
            what:
                BenchCommand::Model {
                    file,
                    n_prompt,
                    n_gen,
                    reps,
                    depth,
                    ngl,
                    cache,
                    moe,
                    threads,
                    npl,
                    json,
                },
        } => {
            thread_pool(threads)?;
            bench::model(&bench::ModelArgs {
                file,
                n_prompt,
                n_gen,
                reps,
                depth,
                ngl,
                kv: cache.types(),
                cpu_moe: moe.blocks(),
                experts: moe.rules()?,
                npl,
                json,
            })?
        }
        Command::Bench {
            what:
                BenchCommand::Spec {
                    file,
                    n_gen,
                    reps,
                    ngl,
                    spec,
                    threads,
                    json,
                },
        } => {
            thread_pool(threads)?;
            bench_spec::run(&bench_spec::SpecBenchArgs {
                file,
                ngl,
                spec: spec.speculation(),
                n_gen,
                reps,
                json,
            })?
        }
        Command::Tokenize {
            file,
            text,
            no_bos,
            no_parse_special,
            json,
        } => score::tokenize(&file, &text, !no_bos, !no_parse_special, json)?,
        Command::Score { file, placement } => score::score(
            &file,
            placement.ngl,
            placement.gpu_memory,
            placement.cache.types(),
            placement.moe.blocks(),
            placement.moe.rules()?,
        )?,
        Command::Devices { json } => devices::run(json).context("listing GPU adapters")?,
        Command::CliDoc => print!("{}", cli_doc::markdown(Cli::command())),
    }
    Ok(())
}

/// `--chat-template`: a built-in format by llama.cpp's name, or Jinja source
/// given inline (llama-server takes both in the one flag).
fn chat_template_named(t: &str) -> anyhow::Result<String> {
    if let Some(b) = lamina_chat::Builtin::from_name(t) {
        return Ok(b.source().to_owned());
    }
    if t.contains("{{") || t.contains("{%") {
        return Ok(t.to_owned());
    }
    let names: Vec<&str> = lamina_chat::Builtin::ALL.iter().map(|b| b.name()).collect();
    anyhow::bail!(
        "--chat-template {t:?}: not a template Lamina has built in ({}) nor Jinja source; \
         --chat-template-file reads one from a file",
        names.join(", ")
    )
}

/// `lamina serve`'s flags as the server takes them.
fn serve_args(a: ServeCli) -> anyhow::Result<serve::ServeArgs> {
    let file = a.hf.model(a.file.clone(), a.llama.offline)?;
    let sampler = a
        .sampling
        .sampler_with(&lamina_model::FileSampling::open(&file))?;
    let (reasoning, reasoning_format) = a.llama.reasoning()?;
    let gcp = http::Gcp::from_env(|k| std::env::var(k).ok()).map_err(anyhow::Error::msg)?;
    // Vertex AI names the port in AIP_HTTP_PORT (8080 unless set), over
    // --port, as llama-server takes it.
    let port = match &gcp {
        Some(_) => {
            let aip = std::env::var("AIP_HTTP_PORT").unwrap_or_default();
            let port = if aip.is_empty() {
                8080
            } else {
                aip.parse::<u16>()
                    .map_err(|e| anyhow::anyhow!("AIP_HTTP_PORT={aip}: {e}"))?
            };
            if port != a.port {
                tracing::warn!(
                    "Vertex AI mode: AIP_HTTP_PORT {port} replaces --port {}",
                    a.port
                );
            }
            port
        }
        None => a.port,
    };
    Ok(serve::ServeArgs {
        spec: a.spec.speculation(),
        n_batch: a.llama.prefill_chunk()?,
        step_budget: (a.step_budget_ms > 0)
            .then(|| std::time::Duration::from_millis(a.step_budget_ms)),
        http: http::Options {
            aliases: http::list(a.llama.alias.as_deref()),
            tags: http::list(a.llama.tags.as_deref()),
            sampler,
            n_predict: a.sampling.n_predict(),
            metrics: !a.llama.no_metrics,
            web_ui: !a.llama.no_webui,
            slots: !a.llama.no_slots,
            slot_save_path: a.llama.slot_save_path.clone(),
            embedding: a.llama.embedding,
            pooling: a.llama.pooling,
            embd_normalize: a.llama.embd_normalize,
            reranking: a.llama.reranking,
            gcp,
            verbose: a.llama.verbose,
            cors_proxy: a.llama.ui_mcp_proxy && !a.llama.no_ui_mcp_proxy,
            // Built in serve::run: a `--tools-runtime` container starts there.
            tools: None,
            reasoning,
            reasoning_format,
            cors: http::Cors {
                origins: a.llama.cors_origins.clone(),
                methods: a.llama.cors_methods.clone(),
                headers: a.llama.cors_headers.clone(),
                credentials: !a.llama.no_cors_credentials,
            },
        },
        tools: http::list(a.llama.tools.as_deref()),
        tools_runtime: a.llama.tools_runtime.clone().filter(|r| !r.is_empty()),
        file,
        host: a.host,
        port,
        n_ctx: a.ctx,
        parallel: a.parallel,
        api_key: a.api_key,
        api_key_file: a.api_key_file,
        chat_template_file: a.chat_template_file,
        chat_template: a
            .chat_template
            .as_deref()
            .map(chat_template_named)
            .transpose()?,
        parse_special_in_content: a.parse_special_in_content,
        max_queue: a.max_queue,
        max_tokens: a.max_tokens,
        timeout_s: a.timeout_s,
        body_limit: usize::try_from(a.body_limit).unwrap_or(usize::MAX),
        read_timeout_s: a.read_timeout,
        ngl: a.placement.ngl,
        gpu_memory: a.placement.gpu_memory,
        kv: a.placement.cache.types(),
        cpu_moe: a.placement.moe.blocks(),
        experts: a.placement.moe.rules()?,
        shutdown_grace_s: a.shutdown_grace,
        // 0 is llama-server's "sleep at once"; -1 never.
        sleep_idle: u64::try_from(a.llama.sleep_idle_seconds)
            .ok()
            .map(std::time::Duration::from_secs),
        no_mmap: a.no_mmap,
        no_warmup: a.no_warmup,
        cache_ram: a.cache_ram_mib.map(cache_ram_bytes),
        mcp_servers: mcp_servers(
            a.llama.mcp_servers_config.as_deref(),
            a.llama.mcp_servers_json.as_deref(),
        )?,
    })
}

/// `--cache-ram MIB` as the engine takes it: 0 off, -1 no limit.
fn cache_ram_bytes(mib: i64) -> Option<u64> {
    match mib {
        0 => None,
        ..0 => Some(u64::MAX),
        mib => Some(mib.unsigned_abs().saturating_mul(1 << 20)),
    }
}

/// `--mcp-servers-config` and `--mcp-servers-json`, read before anything
/// starts so a bad config stops the server with the reason.
fn mcp_servers(
    file: Option<&std::path::Path>,
    json: Option<&str>,
) -> anyhow::Result<Vec<lamina_mcp::ServerConfig>> {
    let mut sources = Vec::new();
    if let Some(file) = file {
        sources.push(lamina_mcp::config::read(file).context("--mcp-servers-config")?);
    }
    if let Some(json) = json {
        sources.push(lamina_mcp::config::parse(json).context("--mcp-servers-json")?);
    }
    Ok(lamina_mcp::config::merge(sources))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(llama_flags::rewrite(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => match llama_flags::explain(&e) {
            Some(line) => {
                eprintln!("lamina: {line}");
                // clap's status for a usage error.
                return ExitCode::from(2);
            }
            None => e.exit(),
        },
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, no backtrace: the message names the problem and the byte offset.
            eprintln!("lamina: {e:#}");
            ExitCode::FAILURE
        }
    }
}
