//! Speculative decoding changes the speed, never the text: with n-gram
//! drafts (`--spec-type ngram-simple`) of 1 to 8 tokens, every request
//! gets the tokens it gets without them, greedy and seeded at temperature
//! 0.8 (and with a repetition penalty over its history), alone and among
//! other sequences, on both real models, on the CPU and with every layer
//! on the (software) GPU. Prompts that repeat text get drafts accepted;
//! prose gets drafts rejected, which rewinds the cache. A copy task shows
//! drafts were verified and accepted (the counters), so a speculation that
//! silently did nothing would fail here.
//!
//! Run with `cargo test -p lamina-engine --test speculative` (the real
//! models must be fetched by `scripts/fetch-models.sh`).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lamina_engine::{
    DraftLimits, Engine, EngineConfig, Event, GenerateParams, ModelInfo, SpecType, Speculation,
    Summary,
};
use lamina_model::placement::Ngl;
use lamina_sampling::SamplerConfig;

fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("LAMINA_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lamina/models")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// Slots of the engines below: a request runs beside up to 7 others.
const SLOTS: usize = 8;

/// Tokens each request generates.
const GEN: usize = 16;

/// An engine drafting with a short key (3 tokens), so drafts are made
/// often, accepted on repeated text and rejected on prose.
fn start(model: &str, ngl: Ngl) -> (Engine, Arc<ModelInfo>) {
    let mut cfg = EngineConfig::new(model_path(model));
    cfg.n_parallel = SLOTS;
    cfg.n_ctx = Some(SLOTS * 256);
    cfg.max_queue = 256;
    cfg.ngl = ngl;
    cfg.warmup = false;
    cfg.cache_ram = None;
    cfg.spec = Speculation {
        kind: SpecType::NgramSimple,
        n_max: 8,
        n_min: 0,
        ngram_n: 3,
        ngram_m: 48,
    };
    let e = Engine::start(cfg).unwrap();
    let info = e.wait_ready(Duration::from_secs(120)).unwrap();
    (e, info)
}

/// Prompts whose continuation copies from them, and prose that does not.
const PROMPTS: [&str; 5] = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n\
     def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "one two three four five six seven eight nine ten\n\
     one two three four five six seven eight nine ten\none two three",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. \
     The quick brown",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
];

/// The samplers each prompt runs with: greedy, seeded at temperature 0.8,
/// and seeded with a repetition penalty over the history.
fn samplers() -> [SamplerConfig; 3] {
    [
        SamplerConfig::greedy(),
        SamplerConfig {
            temperature: 0.8,
            seed: Some(7),
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.8,
            repeat_penalty: 1.3,
            repeat_last_n: 64,
            seed: Some(11),
            ..SamplerConfig::default()
        },
    ]
}

fn params(prompt: Vec<u32>, sampler: SamplerConfig, n_max: usize) -> GenerateParams {
    GenerateParams {
        prompt,
        sampler,
        max_tokens: GEN,
        stop: Vec::new(),
        logprobs: None,
        post_sampling: false,
        timeout: None,
        constraint: None,
        progress: false,
        timings_per_token: false,
        draft: DraftLimits {
            n_max: Some(n_max),
            n_min: None,
        },
    }
}

/// A request's tokens and summary.
fn collect(mut rx: lamina_engine::Events) -> (Vec<u32>, Summary) {
    let mut ids = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Token { id, .. } => ids.push(id),
            Event::Text(_) | Event::Progress(_) => {}
            Event::Done(s) => return (ids, s),
            Event::Error(e) => panic!("{e}"),
        }
    }
    panic!("the stream ended without Done");
}

/// Every prompt × sampler without drafts (alone, one after another), then
/// with drafts of 1 to 8 tokens: the greedy one of each prompt alone, then
/// all of them at once, up to [`SLOTS`] in a step: 55 cases. Returns the
/// cases checked and the drafted tokens accepted over all of them.
fn check(model: &str, ngl: Ngl) -> (usize, usize) {
    let (engine, info) = start(model, ngl);
    let tok = &info.tokenizer;
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p, true, true)).collect();
    let mut want = Vec::new();
    for p in &prompts {
        for s in samplers() {
            let (ids, sum) = collect(engine.submit(params(p.clone(), s, 0)).unwrap());
            assert_eq!(sum.timings.draft_n, 0, "{model}: no drafts when off");
            want.push(ids);
        }
    }
    let cases: Vec<(usize, SamplerConfig)> = prompts
        .iter()
        .enumerate()
        .flat_map(|(i, _)| samplers().into_iter().map(move |s| (i, s)))
        .collect();
    let what =
        |c: usize, k: usize| format!("{model} {ngl:?}: prompt {} sampler {} k {k}", c / 3, c % 3);
    let mut checked = 0;
    let mut accepted = 0;
    // Alone: the greedy case of each prompt, with k = 1 and 8.
    for k in [1, 8] {
        for (c, (i, s)) in cases.iter().enumerate().filter(|(c, _)| c % 3 == 0) {
            let (ids, sum) = collect(
                engine
                    .submit(params(prompts[*i].clone(), s.clone(), k))
                    .unwrap(),
            );
            assert_eq!(ids, want[c], "{} alone", what(c, k));
            accepted += sum.timings.draft_n_accepted;
            checked += 1;
        }
    }
    // Among others: every case with three of the k, every k over the
    // cases, all queued at once (up to SLOTS in a step).
    let mut rxs = Vec::new();
    for shift in [0, 3, 5] {
        for (c, (i, s)) in cases.iter().enumerate() {
            let k = 1 + (c + shift) % 8;
            let rx = engine
                .submit(params(prompts[*i].clone(), s.clone(), k))
                .unwrap();
            rxs.push((c, k, rx));
        }
    }
    for (c, k, rx) in rxs {
        let (ids, sum) = collect(rx);
        assert_eq!(ids, want[c], "{} among others", what(c, k));
        assert!(sum.timings.draft_n_accepted <= sum.timings.draft_n);
        accepted += sum.timings.draft_n_accepted;
        checked += 1;
    }
    let m = engine.metrics();
    assert!(m.draft_accepted <= m.draft_tokens);
    (checked, accepted)
}

#[test]
fn smollm2_on_the_cpu_speculates_without_changing_a_token() {
    let (cases, accepted) = check(SMOLLM2, Ngl::Layers(0));
    assert!(
        cases >= 55 && accepted > 0,
        "{cases} cases, {accepted} accepted"
    );
}

#[test]
fn smollm2_on_the_gpu_speculates_without_changing_a_token() {
    let (cases, accepted) = check(SMOLLM2, Ngl::All);
    assert!(
        cases >= 55 && accepted > 0,
        "{cases} cases, {accepted} accepted"
    );
}

#[test]
fn gemma3_on_the_cpu_speculates_without_changing_a_token() {
    let (cases, accepted) = check(GEMMA3, Ngl::Layers(0));
    assert!(
        cases >= 55 && accepted > 0,
        "{cases} cases, {accepted} accepted"
    );
}

#[test]
fn gemma3_on_the_gpu_speculates_without_changing_a_token() {
    let (cases, accepted) = check(GEMMA3, Ngl::All);
    assert!(
        cases >= 55 && accepted > 0,
        "{cases} cases, {accepted} accepted"
    );
}

/// A task that copies from its prompt: drafts are verified and most are
/// accepted, the request's timings and the server's counters say so, and
/// the tokens are those of plain decoding.
#[test]
fn a_copy_task_accepts_drafts_and_counts_them() {
    let (engine, info) = start(SMOLLM2, Ngl::Layers(0));
    let tok = &info.tokenizer;
    let prompt = tok.encode(PROMPTS[1], true, true);
    let greedy = SamplerConfig::greedy;
    let (plain, off) = collect(engine.submit(params(prompt.clone(), greedy(), 0)).unwrap());
    let (drafted, on) = collect(engine.submit(params(prompt, greedy(), 8)).unwrap());
    assert_eq!(drafted, plain);
    assert_eq!((off.timings.draft_n, off.timings.draft_n_accepted), (0, 0));
    let t = on.timings;
    assert!(t.draft_n > 0 && t.draft_n_accepted > 0, "{t:?}");
    // Copying a counted list: most drafts are right.
    assert!(2 * t.draft_n_accepted >= t.draft_n, "{t:?}");
    // The server's counters are this request's.
    let m = engine.metrics();
    assert_eq!(m.draft_tokens, t.draft_n as u64);
    assert_eq!(m.draft_accepted, t.draft_n_accepted as u64);
    assert!(m.drafts > 0 && m.drafts <= m.draft_tokens, "{m:?}");
}
