//! `lamina run`: one prompt, streamed continuation, then the timings, as
//! llama-cli prints them. The layers are placed by `-ngl` (on the GPU, on the
//! CPU over the mapped weights, or split between them) through
//! `lamina_model::placement`, the same loader `serve` and `bench` use.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use lamina_chat::{builtin_for, ChatTemplate, RenderOptions};
use lamina_gguf::{LoadMode, Model};
use lamina_model::Logits;
use lamina_sampling::{Sampler, SamplerConfig};
use lamina_tokenizer::{Detokenizer, Tokenizer};
use serde_json::json;

pub struct RunArgs {
    pub file: PathBuf,
    pub prompt: String,
    pub n_predict: usize,
    /// `-c`: `None` for the default, `Some(0)` for the training context.
    pub n_ctx: Option<usize>,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
    pub repeat_penalty: f32,
    /// Render the prompt as one user turn with the model's chat template.
    pub chat: bool,
    pub json: bool,
    pub no_mmap: bool,
    pub ngl: lamina_model::placement::Ngl,
    pub gpu_memory: Option<u64>,
    pub kv: lamina_model::KvTypes,
    /// `--n-cpu-moe` ([`lamina_model::plan::PlanParams::cpu_moe`]).
    pub cpu_moe: usize,
    /// `-ot` ([`lamina_model::plan::ExpertRule`]).
    pub experts: Vec<lamina_model::plan::ExpertRule>,
}

/// What a generation produced, and how long each phase took.
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub load_ms: f64,
    pub prompt_ms: f64,
    pub predict_ms: f64,
    /// (peak resident, anonymous, file-backed) bytes right after loading.
    pub memory_after_load: Option<(u64, u64, u64)>,
    pub ngl: usize,
}

pub fn generate(a: &RunArgs, mut on_text: impl FnMut(&str)) -> anyhow::Result<Generation> {
    let t0 = Instant::now();
    let mode = if a.no_mmap {
        LoadMode::Read
    } else {
        LoadMode::Mmap
    };
    let file = Model::open(&a.file, mode)?;
    let n_ctx = context_size(
        a.n_ctx,
        lamina_model::Config::from_gguf(&file)?.context_length,
    );
    let load_args = lamina_model::placement::LoadArgs {
        ngl: a.ngl,
        gpu_memory: a.gpu_memory,
        n_ctx,
        n_parallel: 1,
        kv: a.kv,
        cpu_moe: a.cpu_moe,
        experts: a.experts.clone(),
        gpu: None,
    };
    let (model, table) = lamina_model::placement::load_with_progress(
        &file,
        &load_args,
        &crate::progress::uploads(a.json),
    )?;
    if !a.json {
        eprintln!("{table}");
    }
    let tok = Tokenizer::from_gguf(&file).context("building the tokenizer")?;
    let load_ms = ms(t0);
    let memory_after_load = crate::progress::memory();

    let prompt = if a.chat {
        let text = render_chat(&file, &tok, &a.prompt)?;
        // Templates usually write BOS themselves; never add a second one.
        let starts_with_bos = tok
            .bos()
            .and_then(|b| tok.token_text(b))
            .is_some_and(|b| text.starts_with(b));
        tok.encode(&text, !starts_with_bos, true)
    } else {
        tok.encode(&a.prompt, true, true)
    };
    if prompt.is_empty() {
        anyhow::bail!("the prompt is empty after tokenization");
    }
    let n_ctx = n_ctx.max(prompt.len() + 1);
    let budget = a.n_predict.min(n_ctx - prompt.len());
    let mut cache = model.new_cache(n_ctx)?;
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        seed: Some(a.seed),
        ..SamplerConfig::default()
    })?;
    let mut history = prompt.clone();

    let t1 = Instant::now();
    let mut logits = model.forward(&prompt, &mut cache, Logits::Last)?;
    // After every forward pass, before its token is shown: a file changed
    // under the map (truncated pages read as zeros) must not print garbage.
    file.check_unchanged()?;
    let prompt_ms = ms(t1);

    let t2 = Instant::now();
    let mut detok = Detokenizer::new();
    let mut tokens = Vec::new();
    let mut text = String::new();
    while tokens.len() < budget {
        let id = sampler.sample(&mut logits, &history);
        if tok.is_eog(id) {
            break;
        }
        tokens.push(id);
        history.push(id);
        let piece = detok.push(&tok, id);
        on_text(&piece);
        text.push_str(&piece);
        if tokens.len() == budget {
            break;
        }
        logits = model.forward(&[id], &mut cache, Logits::Last)?;
        file.check_unchanged()?;
    }
    let rest = detok.finish();
    on_text(&rest);
    text.push_str(&rest);
    Ok(Generation {
        prompt_tokens: prompt,
        tokens,
        text,
        load_ms,
        prompt_ms,
        predict_ms: ms(t2),
        memory_after_load,
        ngl: model.plan.ngl,
    })
}

/// The cache's positions for `-c`: 4096 by default, or the training
/// context if smaller; 0 is the training context. An explicit value past the
/// training context is used, with a warning, as llama.cpp does (its
/// "n_ctx_per_seq > n_ctx_train -- possible training context overflow"):
/// silently capping it hid what the user asked for, and a request too
/// large for the machine is refused by the cache's memory check instead.
fn context_size(requested: Option<usize>, train: usize) -> usize {
    const DEFAULT: usize = 4096;
    let train = train.max(1);
    match requested {
        None => DEFAULT.min(train),
        Some(0) => train,
        Some(c) => {
            if c > train {
                eprintln!(
                    "lamina: warning: -c {c} is past the model's training context of {train}; \
                     using it as asked (output past {train} positions may degrade)"
                );
            }
            c
        }
    }
}

/// The file's chat template, or the built-in one its architecture and
/// vocabulary call for, rendered for one user message.
fn render_chat(file: &Model, tok: &Tokenizer, user: &str) -> anyhow::Result<String> {
    let piece = |id: Option<u32>| {
        id.and_then(|i| tok.token_text(i))
            .unwrap_or_default()
            .to_owned()
    };
    let source = match file.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
        Some(s) => s.to_owned(),
        None => {
            let arch = file
                .get("general.architecture")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            builtin_for(arch, |t| tok.token_id(t).is_some())
                .source()
                .to_owned()
        }
    };
    let template = ChatTemplate::new(&source, &piece(tok.bos()), &piece(tok.eos()))?;
    let messages = json!([{"role": "user", "content": user}]);
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    Ok(template.render(&messages, &opts)?)
}

fn memory_json((hwm, anon, file): (u64, u64, u64)) -> serde_json::Value {
    json!({"peak_resident_bytes": hwm, "anonymous_bytes": anon, "file_bytes": file})
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1e3 / ms
    } else {
        0.0
    }
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let stream = !a.json;
    let g = generate(&a, |s| {
        if stream {
            print!("{s}");
            let _ = std::io::stdout().flush();
        }
    })?;
    let (pn, gn) = (g.prompt_tokens.len(), g.tokens.len());
    if a.json {
        println!(
            "{}",
            json!({
                "prompt_tokens": g.prompt_tokens,
                "tokens": g.tokens,
                "text": g.text,
                "timings": {
                    "load_ms": g.load_ms,
                    "prompt_n": pn,
                    "prompt_ms": g.prompt_ms,
                    "prompt_per_second": per_second(pn, g.prompt_ms),
                    "predicted_n": gn,
                    "predicted_ms": g.predict_ms,
                    "predicted_per_second": per_second(gn, g.predict_ms),
                },
                "ngl": g.ngl,
                "memory_after_load": g.memory_after_load.map(memory_json),
                "memory_at_end": crate::progress::memory().map(memory_json),
            })
        );
        return Ok(());
    }
    println!();
    eprintln!("\nload time   = {:10.2} ms", g.load_ms);
    eprintln!(
        "prompt eval = {:10.2} ms / {pn:5} tokens ({:8.2} tokens per second)",
        g.prompt_ms,
        per_second(pn, g.prompt_ms)
    );
    eprintln!(
        "eval        = {:10.2} ms / {gn:5} tokens ({:8.2} tokens per second)",
        g.predict_ms,
        per_second(gn, g.predict_ms)
    );
    Ok(())
}
