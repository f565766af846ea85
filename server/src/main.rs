//! The `lamina` binary: the command line over the library crates.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use lamina_gguf::{LoadMode, Model};

mod bench;
mod bench_serve;
mod devices;
mod fit;
mod http;
mod inspect;
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
        #[arg(short = 'm', long = "model")]
        file: PathBuf,
        #[arg(short = 'p', long)]
        prompt: String,
        /// Tokens to generate at most.
        #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
        n_predict: usize,
        /// Positions of the KV cache: 4096 when not given (or the training
        /// context, if smaller); 0 is the training context. A value past the
        /// training context is used, with a warning, as llama.cpp does.
        #[arg(short = 'c', long = "ctx-size")]
        ctx: Option<usize>,
        /// 0 is greedy.
        #[arg(long = "temp", default_value_t = 0.8)]
        temperature: f32,
        /// 0 disables.
        #[arg(long, default_value_t = 40)]
        top_k: usize,
        #[arg(long, default_value_t = 0.95)]
        top_p: f32,
        #[arg(long, default_value_t = 0.05)]
        min_p: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// 1 is off.
        #[arg(long, default_value_t = 1.0)]
        repeat_penalty: f32,
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
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve {
        #[arg(short = 'm', long = "model", env = "LAMINA_MODEL")]
        file: PathBuf,
        /// Address to bind; the default keeps the server on this machine.
        #[arg(long, env = "LAMINA_HOST", default_value = "127.0.0.1")]
        host: String,
        /// 0 picks a free port (the log says which).
        #[arg(long, env = "LAMINA_PORT", default_value_t = 8080)]
        port: u16,
        /// Total context, split evenly over the slots (default: 4096 per slot,
        /// or the model's training context if smaller).
        #[arg(short = 'c', long = "ctx-size", env = "LAMINA_CTX_SIZE")]
        ctx: Option<usize>,
        /// Requests decoded at once, each in its own slot.
        #[arg(
            long,
            visible_alias = "np",
            env = "LAMINA_PARALLEL",
            default_value_t = 4
        )]
        parallel: usize,
        /// Require this key (`Authorization: Bearer KEY`) on every route but /health.
        #[arg(
            long,
            env = "LAMINA_API_KEY",
            conflicts_with = "api_key_file",
            hide_env_values = true
        )]
        api_key: Option<String>,
        /// Read the API key from a file.
        #[arg(long, env = "LAMINA_API_KEY_FILE")]
        api_key_file: Option<PathBuf>,
        /// A Jinja chat template to use instead of the file's.
        #[arg(long, env = "LAMINA_CHAT_TEMPLATE_FILE")]
        chat_template_file: Option<PathBuf>,
        /// Let message content write control tokens: a user's
        /// `<|im_start|>system` becomes the token, not text (the old behaviour).
        #[arg(long, env = "LAMINA_PARSE_SPECIAL_IN_CONTENT")]
        parse_special_in_content: bool,
        /// Seconds open requests get to finish after SIGTERM/SIGINT; past
        /// it the process exits non-zero (a second signal exits at once).
        #[arg(
            long = "shutdown-grace",
            env = "LAMINA_SHUTDOWN_GRACE",
            default_value_t = 30
        )]
        shutdown_grace: u64,
        /// Requests that may wait for a slot; past that, 503 at once.
        #[arg(long, env = "LAMINA_MAX_QUEUE", default_value_t = 64)]
        max_queue: usize,
        /// Upper bound on max_tokens, and the default when a request gives none.
        #[arg(long, env = "LAMINA_MAX_TOKENS", default_value_t = 4096)]
        max_tokens: usize,
        /// Seconds a request may run before it ends with finish_reason "length".
        #[arg(long = "timeout", env = "LAMINA_TIMEOUT", default_value_t = 600)]
        timeout_s: u64,
        /// Largest request body accepted, e.g. 1MiB.
        #[arg(long, env = "LAMINA_BODY_LIMIT", value_parser = parse_size, default_value = "1MiB")]
        body_limit: u64,
        /// Seconds a client has to send a request's headers, and again its
        /// body; idle keep-alive connections close after it too.
        #[arg(long, env = "LAMINA_READ_TIMEOUT", default_value_t = 30)]
        read_timeout: u64,
        /// CPU threads (default: all cores).
        #[arg(short = 't', long, env = "LAMINA_THREADS")]
        threads: Option<usize>,
        /// Slots on the GPU (blocks plus the output layer, which goes first),
        /// `all`, or `auto` to fit --gpu-memory on a hardware GPU.
        #[arg(
            long = "n-gpu-layers",
            visible_alias = "ngl",
            short = 'g',
            env = "LAMINA_N_GPU_LAYERS",
            default_value = "auto"
        )]
        ngl: lamina_model::placement::Ngl,
        /// GPU memory budget for placement, e.g. 6GiB.
        #[arg(long, env = "LAMINA_GPU_MEMORY", value_parser = parse_size)]
        gpu_memory: Option<u64>,
        /// Read the model into memory instead of mapping it: it then takes
        /// its size in RAM, and changes to the file cannot reach the server.
        #[arg(long, env = "LAMINA_NO_MMAP")]
        no_mmap: bool,
    },
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
        #[arg(long)]
        json: bool,
        /// Probe the CPU's and GPU's bandwidth and predict decode tokens/s per -ngl.
        #[arg(long)]
        measure: bool,
    },
    /// Write a llama-shaped GGUF with random quantized weights (SmolLM2's,
    /// Llama 3.2 1B's or Llama 3.1 8B's shape) for benchmarks at scale.
    Synth {
        /// smollm2, 1b or 8b.
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
        /// Write only the metadata (the tokenizer of --vocab-from), no tensors.
        #[arg(long)]
        vocab_only: bool,
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
}

/// Where layers run, for the commands that load a model once.
#[derive(clap::Args)]
struct Placement {
    /// Slots on the GPU: blocks plus the output layer, which goes first
    /// (llama.cpp's rule); `all`, or `auto` to fit --gpu-memory (hardware
    /// GPUs only).
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "ngl",
        short = 'g',
        default_value = "auto"
    )]
    ngl: lamina_model::placement::Ngl,
    /// GPU memory budget for placement, e.g. 6GiB.
    #[arg(long, value_parser = parse_size)]
    gpu_memory: Option<u64>,
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
        /// Columns of the mat-mul measurement (0 skips it).
        #[arg(long, default_value_t = 512)]
        matmul_cols: usize,
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
    /// The server under load: concurrent streaming chat clients over loopback
    /// HTTP; generated tokens/s, time to first token and latency per level.
    Serve {
        #[arg(short = 'm', long = "model")]
        file: PathBuf,
        /// Concurrency levels, run in turn.
        #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
        clients: Vec<usize>,
        /// Requests each client sends, one after another.
        #[arg(long, default_value_t = 4)]
        requests_per_client: usize,
        /// max_tokens of every request.
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
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
        Command::Run {
            file,
            prompt,
            n_predict,
            ctx,
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            repeat_penalty,
            chat,
            threads,
            json,
            no_mmap,
            placement,
        } => {
            thread_pool(threads)?;
            run::run(run::RunArgs {
                file,
                prompt,
                n_predict,
                n_ctx: ctx,
                temperature,
                top_k,
                top_p,
                min_p,
                seed,
                repeat_penalty,
                chat,
                json,
                no_mmap,
                ngl: placement.ngl,
                gpu_memory: placement.gpu_memory,
            })?
        }
        Command::Serve {
            file,
            host,
            port,
            ctx,
            parallel,
            api_key,
            api_key_file,
            chat_template_file,
            parse_special_in_content,
            shutdown_grace,
            max_queue,
            max_tokens,
            timeout_s,
            body_limit,
            read_timeout,
            threads,
            ngl,
            gpu_memory,
            no_mmap,
        } => {
            thread_pool(threads)?;
            serve::run(serve::ServeArgs {
                file,
                host,
                port,
                n_ctx: ctx,
                parallel,
                api_key,
                api_key_file,
                chat_template_file,
                parse_special_in_content,
                max_queue,
                max_tokens,
                timeout_s,
                body_limit: usize::try_from(body_limit).unwrap_or(usize::MAX),
                read_timeout_s: read_timeout,
                ngl,
                gpu_memory,
                shutdown_grace_s: shutdown_grace,
                no_mmap,
            })?
        }
        Command::Synth {
            shape,
            ty,
            vocab_from,
            vocab,
            output,
            seed,
            vocab_only,
        } => synth::run(synth::SynthArgs {
            shape: &shape,
            ty: &ty,
            vocab_from: vocab_from.as_deref(),
            vocab,
            output: &output,
            seed,
            vocab_only,
        })?,
        Command::Fit {
            file,
            gpu_memory,
            ctx,
            parallel,
            json,
            measure,
        } => fit::run(fit::FitArgs {
            file: &file,
            budget: gpu_memory,
            n_ctx: ctx,
            n_parallel: parallel.max(1),
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
                    clients,
                    requests_per_client,
                    max_tokens,
                    parallel,
                    ctx,
                    ngl,
                    timeout,
                    threads,
                    json,
                },
        } => {
            thread_pool(threads)?;
            bench_serve::run(&bench_serve::ServeBenchArgs {
                file,
                clients,
                requests_per_client,
                max_tokens,
                parallel,
                n_ctx: ctx,
                ngl,
                timeout_s: timeout,
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
                npl,
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
        Command::Score { file, placement } => {
            score::score(&file, placement.ngl, placement.gpu_memory)?
        }
        Command::Devices { json } => devices::run(json).context("listing GPU adapters")?,
    }
    Ok(())
}

fn parse_size(s: &str) -> Result<u64, String> {
    lamina_model::plan::parse_size(s)
        .ok_or_else(|| format!("{s:?} is not a size like 8GiB or 512MiB"))
}

/// llama.cpp's single-dash long flags, as its users type them, in the
/// spelling clap parses (clap would read `-ngl` as `-n gl`).
fn llama_cpp_spellings(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const SPELLINGS: [(&str, &str); 2] = [("-ngl", "--n-gpu-layers"), ("-np", "--parallel")];
    args.map(|a| {
        let Some(s) = a.to_str() else { return a };
        for (short, long) in SPELLINGS {
            if s == short {
                return long.into();
            }
            if let Some(v) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                return format!("{long}={v}").into();
            }
        }
        a
    })
    .collect()
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(llama_cpp_spellings(std::env::args_os()));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, no backtrace: the message names the problem and the byte offset.
            eprintln!("lamina: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod spelling_tests {
    use super::llama_cpp_spellings;

    fn args(v: &[&str]) -> Vec<String> {
        llama_cpp_spellings(v.iter().map(|s| s.into()))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn llama_cpp_flags_are_read_as_lamina_spells_them() {
        assert_eq!(
            args(&["lamina", "serve", "-ngl", "99", "-np=8", "-n", "16"]),
            [
                "lamina",
                "serve",
                "--n-gpu-layers",
                "99",
                "--parallel=8",
                "-n",
                "16"
            ]
        );
        // A value that merely starts like a flag is left alone.
        assert_eq!(args(&["-p", "-nglx"]), ["-p", "-nglx"]);
        let cli = <super::Cli as clap::Parser>::try_parse_from(llama_cpp_spellings(
            ["lamina", "run", "-m", "f.gguf", "-p", "hi", "-ngl", "99"]
                .iter()
                .map(|s| s.into()),
        ));
        assert!(cli.is_ok(), "{:?}", cli.err());
    }
}
