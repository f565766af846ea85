//! `lamina tokenize` and `lamina score`: the tokenizer and the model's
//! log-probabilities, as a user (or a test against a reference) asks for them.

use std::io::Read as _;
use std::path::Path;

use anyhow::{bail, Context as _};
use lamina_gguf::{LoadMode, Model};
use lamina_model::placement::{self, LoadArgs, Ngl};
use lamina_model::Logits;
use lamina_tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::json;

/// Most top log-probs a step may report.
const MAX_TOP: usize = 1000;

pub fn tokenize(
    file: &Path,
    text: &str,
    bos: bool,
    parse_special: bool,
    as_json: bool,
) -> anyhow::Result<()> {
    let model = Model::open(file, LoadMode::Mmap)?;
    let tok = Tokenizer::from_gguf(&model).context("building the tokenizer")?;
    let ids = tok.encode(text, bos, parse_special);
    if as_json {
        println!("{}", json!(ids));
        return Ok(());
    }
    for id in ids {
        let piece = String::from_utf8_lossy(&tok.token_to_piece_with(id, true)).into_owned();
        println!("{id:>8} -> {piece:?}");
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScoreRequest {
    prompt_ids: Vec<u32>,
    forced_tokens: Vec<u32>,
    #[serde(default = "default_top")]
    top: usize,
}

fn default_top() -> usize {
    20
}

/// Teacher forcing: the prompt as one batch, then each forced token in turn;
/// step `t` is the distribution after `prompt + forced[..t]`.
pub fn score(
    file: &Path,
    ngl: Ngl,
    gpu_memory: Option<u64>,
    kv: lamina_model::KvTypes,
    cpu_moe: usize,
    experts: Vec<lamina_model::plan::ExpertRule>,
) -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .context("reading the request from stdin")?;
    let req: ScoreRequest = serde_json::from_str(&input).context("parsing the request")?;
    if req.prompt_ids.is_empty() || req.forced_tokens.is_empty() {
        bail!("prompt_ids and forced_tokens must both be non-empty");
    }
    if req.top > MAX_TOP {
        bail!("top must be <= {MAX_TOP}");
    }
    let model = Model::open(file, LoadMode::Mmap)?;
    let n_ctx = req.prompt_ids.len() + req.forced_tokens.len();
    let args = LoadArgs {
        ngl,
        gpu_memory,
        n_ctx,
        n_parallel: 1,
        kv,
        cpu_moe,
        experts,
        gpu: None,
    };
    let (m, _) = placement::load(&model, &args)?;
    let mut cache = m.new_cache(n_ctx)?;
    let mut logits = m.forward(&req.prompt_ids, &mut cache, Logits::Last)?;
    let mut steps = Vec::with_capacity(req.forced_tokens.len());
    for (t, &forced) in req.forced_tokens.iter().enumerate() {
        let top = lamina_sampling::top_logprobs(&logits, req.top);
        let forced_lp = log_prob(&logits, forced)
            .with_context(|| format!("forced token {forced} is outside the vocabulary"))?;
        steps.push(json!({
            "top": top.iter().map(|(id, lp)| json!([id, lp])).collect::<Vec<_>>(),
            "forced_logprob": forced_lp,
        }));
        if t + 1 < req.forced_tokens.len() {
            logits = m.forward(&[forced], &mut cache, Logits::Last)?;
        }
    }
    // A file truncated under the map reads zeros: print nothing computed so.
    model.check_unchanged()?;
    println!("{}", json!({ "steps": steps, "ngl": m.plan.ngl }));
    Ok(())
}

/// `logit − logsumexp`, accumulated in f64.
fn log_prob(logits: &[f32], id: u32) -> Option<f64> {
    let x = f64::from(*logits.get(id as usize)?);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (f64::from(l) - max).exp())
            .sum::<f64>()
            .ln();
    Some(x - lse)
}
