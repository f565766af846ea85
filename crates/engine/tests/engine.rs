//! The engine on the real SmolLM2 model: greedy output equals a plain
//! forward-and-argmax loop, alone and among other sequences; stop strings,
//! max_tokens, cancellation, prefix reuse and the bounded queue; on the GPU,
//! greedy steps that read back picks pick what the logits give, and top-k
//! samplers that draw from candidates selected there draw what the logits
//! give.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use lamina_engine::{
    Engine, EngineConfig, EngineError, Event, FinishReason, GenerateParams, Summary,
};
use lamina_gguf::{LoadMode, Model};
use lamina_model::placement::Ngl;
use lamina_model::{CpuModel, KvCache, Logits};
use lamina_sampling::{argmax, SamplerConfig};
use lamina_tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    let dir = std::env::var_os("LAMINA_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lamina/models")
        });
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

fn start(parallel: usize, max_queue: usize) -> Engine {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_parallel = parallel;
    cfg.n_ctx = Some(512 * parallel);
    cfg.max_queue = max_queue;
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(60)).unwrap();
    e
}

/// Four prompts for the tests that run several sequences at once.
const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
];

fn params(prompt: Vec<u32>, max_tokens: usize) -> GenerateParams {
    GenerateParams {
        prompt,
        sampler: SamplerConfig::greedy(),
        max_tokens,
        stop: Vec::new(),
        logprobs: None,
        post_sampling: false,
        timeout: None,
        constraint: None,
        progress: false,
        timings_per_token: false,
        draft: Default::default(),
    }
}

/// Collects a request's events: (token ids, text, finish reason).
fn collect(mut rx: lamina_engine::Events) -> (Vec<u32>, String, FinishReason) {
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Token { id, .. } => ids.push(id),
            Event::Text(t) => text.push_str(&t),
            Event::Done(s) => {
                // An end-of-generation token is counted but not sent.
                let eog =
                    usize::from(s.finish == FinishReason::Stop && s.completion_tokens > ids.len());
                assert_eq!(s.completion_tokens, ids.len() + eog);
                return (ids, text, s.finish);
            }
            Event::Progress(_) => panic!("progress was not asked for"),
            Event::Error(e) => panic!("{e}"),
        }
    }
    panic!("the stream ended without Done");
}

/// The oracle: the forward pass and argmax, nothing else.
fn plain_greedy(prompt: &[u32], n: usize) -> Vec<u32> {
    let file = Model::open(model_path(), LoadMode::Mmap).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let model = CpuModel::load(&file).unwrap();
    let mut cache = KvCache::new(&model.config, 512).unwrap();
    let mut logits = model.forward(prompt, &mut cache, Logits::Last).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let id = argmax(&logits);
        if tok.is_eog(id) {
            break;
        }
        out.push(id);
        logits = model.forward(&[id], &mut cache, Logits::Last).unwrap();
    }
    out
}

fn tokenize(text: &str) -> Vec<u32> {
    let file = Model::open(model_path(), LoadMode::Mmap).unwrap();
    Tokenizer::from_gguf(&file)
        .unwrap()
        .encode(text, true, true)
}

#[test]
fn greedy_alone_and_among_others_equals_the_plain_loop() {
    let prompts = PROMPTS;
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| plain_greedy(&tokenize(p), 8))
        .collect();
    let engine = start(4, 4);
    let alone = collect(engine.submit(params(tokenize(prompts[0]), 8)).unwrap());
    assert_eq!(alone.0, want[0]);
    assert_eq!(alone.2, FinishReason::Length);
    // All four at once, in one scheduling loop.
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(params(tokenize(p), 8)).unwrap())
        .collect();
    for (rx, w) in rxs.into_iter().zip(&want) {
        assert_eq!(&collect(rx).0, w);
    }
    let m = engine.metrics();
    assert_eq!(m.finished, 5);
    assert_eq!(m.generated_tokens, 40);
    // The gauge is stored after the step that sent the last Done.
    let t = std::time::Instant::now();
    while engine.metrics().active != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "active never returned to 0"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sampled requests with seeds draw the same tokens alone as four at
/// once, where a step's sequences choose their tokens in parallel: each
/// draw depends on its own logits, sampler and random stream only.
#[test]
fn seeded_sampling_alone_and_among_others_draws_the_same() {
    let prompts = PROMPTS;
    let sampled = |p: &str, seed: u64| GenerateParams {
        sampler: SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(seed),
            ..SamplerConfig::default()
        },
        ..params(tokenize(p), 12)
    };
    let engine = start(4, 4);
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .zip(1..)
        .map(|(p, seed)| collect(engine.submit(sampled(p, seed)).unwrap()).0)
        .collect();
    let rxs: Vec<_> = prompts
        .iter()
        .zip(1..)
        .map(|(p, seed)| engine.submit(sampled(p, seed)).unwrap())
        .collect();
    let together: Vec<Vec<u32>> = rxs.into_iter().map(|rx| collect(rx).0).collect();
    assert_eq!(together, alone);
    // Sampled at temperature 1 over the whole vocabulary: not the greedy
    // tokens (so the draws were made), and different across the seeds.
    assert_ne!(alone[0], plain_greedy(&tokenize(prompts[0]), 12));
    let again = collect(engine.submit(sampled(prompts[0], 99)).unwrap()).0;
    assert_ne!(again, alone[0]);
}

/// Four slots with every layer and the head on the (software) GPU;
/// `select_top`: whether top-k candidates are selected there (`None`: as
/// the device's kind decides).
fn gpu_engine(select_top: Option<bool>) -> Engine {
    gpu_engine_warm(select_top, true)
}

/// [`gpu_engine`], warmed up at load or not (`EngineConfig::warmup`).
fn gpu_engine_warm(select_top: Option<bool>, warmup: bool) -> Engine {
    let mut cfg = EngineConfig::new(model_path());
    cfg.warmup = warmup;
    cfg.n_parallel = 4;
    cfg.n_ctx = Some(4 * 256);
    cfg.max_queue = 8;
    cfg.ngl = Ngl::All;
    cfg.select_top_on_gpu = select_top;
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(60)).unwrap();
    e
}

/// The warm-up's steps (every slot decoding, prompt chunks, both beside
/// each other) leave nothing behind: the slots start empty, and requests
/// get the tokens an engine that skipped the warm-up gives them, alone and
/// four at once.
#[test]
fn the_warm_up_leaves_the_slots_as_it_found_them() {
    let warm = gpu_engine(None);
    let snap = warm.metrics();
    assert_eq!((snap.kv_used, snap.started), (0, 0));
    let cold = gpu_engine_warm(None, false);
    let prompts = PROMPTS;
    let greedy = |p: &str| params(tokenize(p), 8);
    let first = |e: &Engine| collect(e.submit(greedy(prompts[0])).unwrap()).0;
    assert_eq!(first(&warm), first(&cold));
    let together = |e: &Engine| -> Vec<Vec<u32>> {
        let rxs: Vec<_> = prompts
            .iter()
            .map(|p| e.submit(greedy(p)).unwrap())
            .collect();
        rxs.into_iter().map(|rx| collect(rx).0).collect()
    };
    assert_eq!(together(&warm), together(&cold));
}

/// Every layer and the head on the (software) GPU: plain greedy requests
/// run steps that read back each sequence's pick, and produce the tokens
/// the same requests produce when they ask for a log-probability, which
/// makes their steps read the logits; so does a step that mixes both.
#[test]
fn greedy_steps_on_the_gpu_pick_what_the_logits_give() {
    let engine = gpu_engine(None);
    let prompts = PROMPTS;
    let greedy = |p: &str| params(tokenize(p), 8);
    let with_logprob = |p: &str| GenerateParams {
        logprobs: Some(1),
        ..greedy(p)
    };
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| collect(engine.submit(with_logprob(p)).unwrap()).0)
        .collect();
    assert_eq!(
        engine.metrics().argmax_steps,
        0,
        "log-probabilities need logits"
    );
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(greedy(p)).unwrap())
        .collect();
    for (rx, w) in rxs.into_iter().zip(&want) {
        assert_eq!(&collect(rx).0, w);
    }
    // At least each decode step of the four read picks.
    let picked = engine.metrics().argmax_steps;
    assert!(picked >= 7, "{picked} steps read picks");
    // One request wanting a log-probability beside three that do not.
    let rxs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let q = if i == 1 { with_logprob(p) } else { greedy(p) };
            engine.submit(q).unwrap()
        })
        .collect();
    for (rx, w) in rxs.into_iter().zip(&want) {
        assert_eq!(&collect(rx).0, w);
    }
}

/// Every layer and the head on the (software) GPU, selecting top-k
/// candidates there: seeded top-k requests (the default chain), alone and
/// four at a time, beside greedy ones, draw the tokens an engine that reads
/// the logits draws; a request with a penalty or a log-probability makes
/// its steps read the logits.
#[test]
fn top_k_steps_on_the_gpu_draw_what_the_logits_give() {
    let prompts = PROMPTS;
    let sampled = |p: &str, seed: u64| GenerateParams {
        sampler: SamplerConfig {
            temperature: 1.5,
            seed: Some(seed),
            ..SamplerConfig::default()
        },
        ..params(tokenize(p), 10)
    };
    // Request i: sampled, except the third, greedy.
    let request = |i: usize, p: &str| {
        if i == 2 {
            params(tokenize(p), 10)
        } else {
            sampled(p, i as u64 + 1)
        }
    };
    let run = |e: &Engine| -> Vec<Vec<u32>> {
        let rxs: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| e.submit(request(i, p)).unwrap())
            .collect();
        rxs.into_iter().map(|rx| collect(rx).0).collect()
    };
    let host = gpu_engine(Some(false));
    let want = run(&host);
    assert_eq!(host.metrics().top_k_steps, 0, "the host selects");
    drop(host);
    let gpu = gpu_engine(Some(true));
    assert_eq!(run(&gpu), want);
    let together = gpu.metrics().top_k_steps;
    assert!(together >= 9, "{together} steps read candidates");
    // Alone, one after another: the same draws.
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(collect(gpu.submit(request(i, p)).unwrap()).0, want[i]);
    }
    assert!(gpu.metrics().top_k_steps > together);
    // Drawn at temperature 1.5: not all greedy (so the draws were made).
    assert_ne!(want[0], plain_greedy(&tokenize(prompts[0]), 10));
    // A repeat penalty needs the logits: its steps read them, with the
    // draws an engine reading logits makes.
    let penalised = |p: &str| GenerateParams {
        sampler: SamplerConfig {
            repeat_penalty: 1.3,
            ..sampled(p, 7).sampler
        },
        ..sampled(p, 7)
    };
    let before = gpu.metrics().top_k_steps;
    let a = collect(gpu.submit(penalised(prompts[1])).unwrap()).0;
    assert_eq!(gpu.metrics().top_k_steps, before);
    drop(gpu);
    let host = gpu_engine(Some(false));
    assert_eq!(collect(host.submit(penalised(prompts[1])).unwrap()).0, a);
}

#[test]
fn stop_string_ends_generation_and_is_not_shown() {
    let engine = start(1, 1);
    let prompt = tokenize("The capital of France is");
    let (_, full, _) = collect(engine.submit(params(prompt.clone(), 12)).unwrap());
    // Greedy continues " Paris.\n\nThe United States ..."
    let cut = full.find('.').unwrap();
    let mut p = params(prompt, 12);
    p.stop = vec![".".into()];
    let (_, text, finish) = collect(engine.submit(p).unwrap());
    assert_eq!(finish, FinishReason::Stop);
    assert_eq!(text, full[..cut]);
}

/// A request's tokens and its closing summary (what `collect` checks, it
/// leaves to the caller).
fn tokens_and_summary(mut rx: lamina_engine::Events) -> (Vec<u32>, Summary) {
    let mut ids = Vec::new();
    loop {
        match rx.blocking_recv().unwrap() {
            Event::Token { id, .. } => ids.push(id),
            Event::Done(s) => return (ids, s),
            Event::Text(_) | Event::Progress(_) => {}
            Event::Error(e) => panic!("{e}"),
        }
    }
}

#[test]
fn prefix_reuse_is_reported_and_changes_nothing() {
    let engine = start(1, 1);
    let prompt = tokenize("The capital of France is a city that");
    let first = engine.submit(params(prompt.clone(), 4)).unwrap();
    let (a, _, _) = collect(first);
    let (ids, s) = tokens_and_summary(engine.submit(params(prompt.clone(), 4)).unwrap());
    assert_eq!(s.timings.cache_n, prompt.len() - 1);
    assert_eq!(s.timings.prompt_n, 1);
    assert_eq!(ids, a);
}

/// A slot that holds the start of a new request's prompt lends it to the
/// slot the request gets: a second client's request with the same long
/// start, sent while the first still decodes in the other slot, prefills
/// only the rest, and gets the tokens it gets from a fresh engine.
fn a_busy_slots_prompt_start_is_shared(engine: &Engine, fresh: &Engine) {
    let system = "You are a careful assistant. You answer in full sentences, \
                  you explain your reasoning, and you never make up facts. ";
    let first = tokenize(&format!("{system}Tell me about the city of Paris."));
    let second = tokenize(&format!("{system}Why is the sea salty?"));
    let shared = first
        .iter()
        .zip(&second)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(shared >= 16, "{shared} shared tokens");
    let mut long = engine.submit(params(first, 60)).unwrap();
    // Its prompt is in slot 0 once its first token is out.
    loop {
        match long.blocking_recv().unwrap() {
            Event::Token { .. } => break,
            Event::Text(_) | Event::Progress(_) => {}
            other => panic!("{other:?}"),
        }
    }
    let (ids, s) = tokens_and_summary(engine.submit(params(second.clone(), 6)).unwrap());
    assert_eq!(s.timings.cache_n, shared);
    assert_eq!(s.timings.prompt_n, second.len() - shared);
    assert_eq!(ids, collect(fresh.submit(params(second, 6)).unwrap()).0);
    // The lender was left as it was: it runs to its end.
    let (_, s) = tokens_and_summary(long);
    assert_eq!((s.finish, s.completion_tokens), (FinishReason::Length, 60));
}

#[test]
fn a_busy_slots_prompt_start_is_shared_on_the_cpu() {
    a_busy_slots_prompt_start_is_shared(&start(2, 2), &start(2, 2));
}

#[test]
fn a_busy_slots_prompt_start_is_shared_on_the_gpu() {
    a_busy_slots_prompt_start_is_shared(&gpu_engine(None), &gpu_engine_warm(None, false));
}

/// A conversation whose slot went to another prompt resumes from the host
/// prompt cache: its second turn reuses the first turn's prompt and reply
/// (restored into the slot, `cache_n`) and gets the tokens a fresh engine
/// gives; without the cache it prefills them again. `engine` has one slot.
fn a_conversation_resumes_from_the_host_prompt_cache(
    engine: &Engine,
    without: &Engine,
    fresh: &Engine,
) {
    let first = tokenize(
        "You are a careful assistant. You answer in full sentences. \
         Question: what is the capital of France? Answer:",
    );
    let other = tokenize("Once upon a time, in a land far away, there lived a dragon");
    let run = |e: &Engine, prompt: &[u32], n: usize| {
        tokens_and_summary(e.submit(params(prompt.to_vec(), n)).unwrap())
    };
    let (reply, done) = run(engine, &first, 6);
    run(without, &first, 6);
    // The slot goes to another prompt: the conversation leaves it.
    let lcp = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (_, s) = run(engine, &other, 4);
    assert_eq!(s.timings.cache_n, lcp(&first, &other));
    run(without, &other, 4);
    let m = engine.metrics();
    assert_eq!(m.prompt_cache_entries, 1);
    assert!(m.prompt_cache_bytes > 0);
    // The second turn: the first turn, its reply, and more.
    let mut second = first.clone();
    second.extend_from_slice(&reply);
    second.extend(tokenize(" And of Italy? Answer:").into_iter().skip(1));
    // The slot held the first prompt and the reply tokens fed back: all
    // but the last when max_tokens cut it (that one was sampled and never
    // fed back), all when an end-of-generation token ended it.
    let held = first.len() + reply.len() - usize::from(done.finish == FinishReason::Length);
    let (ids, s) = run(engine, &second, 6);
    assert_eq!(s.timings.cache_n, held);
    assert_eq!(s.timings.prompt_n, second.len() - held);
    assert_eq!(ids, run(fresh, &second, 6).0);
    let m = engine.metrics();
    assert_eq!(
        (m.prompt_cache_restores, m.prompt_cache_restored_tokens),
        (1, held as u64)
    );
    // Restored entries leave the cache; the slot's last prompt was saved.
    assert_eq!(m.prompt_cache_entries, 1);
    // Without the cache the slot held the other prompt: nothing reused
    // but what it shares with it.
    let (_, s) = run(without, &second, 6);
    assert_eq!(s.timings.cache_n, lcp(&other, &second));
    assert_eq!(without.metrics().prompt_cache_restores, 0);
}

/// With a slot free, a new conversation does not take the slot that holds
/// another: that one's next turn then finds its whole history in place
/// (no prompt cache here), and its tokens are a fresh engine's.
#[test]
fn a_new_conversation_leaves_an_idle_one_in_its_slot() {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_parallel = 2;
    cfg.n_ctx = Some(2 * 512);
    cfg.cache_ram = None;
    let engine = Engine::start(cfg).unwrap();
    engine.wait_ready(Duration::from_secs(60)).unwrap();
    let first =
        tokenize("You are a careful assistant. Question: what is the capital of France? Answer:");
    let other = tokenize("Once upon a time, in a land far away, there lived a dragon");
    let run = |prompt: &[u32], n: usize| {
        tokens_and_summary(engine.submit(params(prompt.to_vec(), n)).unwrap())
    };
    let (reply, done) = run(&first, 6);
    run(&other, 4);
    let mut second = first.clone();
    second.extend_from_slice(&reply);
    second.extend(tokenize(" And of Italy? Answer:").into_iter().skip(1));
    let held = first.len() + reply.len() - usize::from(done.finish == FinishReason::Length);
    let (ids, s) = run(&second, 6);
    assert_eq!(s.timings.cache_n, held);
    assert_eq!(
        ids,
        collect(start(1, 1).submit(params(second, 6)).unwrap()).0
    );
}

fn one_slot(cache_ram: Option<u64>, ngl: Ngl) -> Engine {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_parallel = 1;
    cfg.n_ctx = Some(512);
    cfg.max_queue = 2;
    cfg.ngl = ngl;
    cfg.cache_ram = cache_ram;
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(60)).unwrap();
    e
}

#[test]
fn a_conversation_resumes_from_the_host_prompt_cache_on_the_cpu() {
    a_conversation_resumes_from_the_host_prompt_cache(
        &one_slot(Some(64 << 20), Ngl::Layers(0)),
        &one_slot(None, Ngl::Layers(0)),
        &one_slot(None, Ngl::Layers(0)),
    );
}

#[test]
fn a_conversation_resumes_from_the_host_prompt_cache_on_the_gpu() {
    a_conversation_resumes_from_the_host_prompt_cache(
        &one_slot(Some(64 << 20), Ngl::All),
        &one_slot(None, Ngl::All),
        &one_slot(None, Ngl::All),
    );
}

/// An entry larger than the limit is not kept: the conversation prefills
/// again, as without a cache.
#[test]
fn a_prompt_larger_than_the_cache_is_not_kept() {
    let engine = one_slot(Some(1024), Ngl::Layers(0));
    let first = tokenize("You are a careful assistant. Question: what is the capital of France?");
    let other = tokenize("Once upon a time, in a land far away");
    tokens_and_summary(engine.submit(params(first.clone(), 2)).unwrap());
    tokens_and_summary(engine.submit(params(other, 2)).unwrap());
    let (_, s) = tokens_and_summary(engine.submit(params(first, 2)).unwrap());
    assert!(s.timings.cache_n <= 1, "{}", s.timings.cache_n);
    let m = engine.metrics();
    assert_eq!((m.prompt_cache_entries, m.prompt_cache_restores), (0, 0));
}

#[test]
fn dropped_receiver_frees_the_slot_and_queue_is_bounded() {
    let engine = start(1, 1);
    let prompt = tokenize("Once upon a time");
    let long = engine.submit(params(prompt.clone(), 400)).unwrap();
    let queued = engine.submit(params(prompt.clone(), 2)).unwrap();
    match engine.submit(params(prompt.clone(), 2)) {
        Err(EngineError::Overloaded { limit: 2, .. }) => {}
        other => panic!("expected Overloaded, got {other:?}"),
    }
    // The client of the long request goes away: the queued one must run.
    drop(long);
    let (ids, _, _) = collect(queued);
    assert_eq!(ids.len(), 2);
    let m = engine.metrics();
    assert_eq!(m.dropped, 1);
    assert_eq!(m.rejected, 1);
    // And the engine keeps serving.
    assert_eq!(
        collect(engine.submit(params(prompt, 3)).unwrap()).0.len(),
        3
    );
}

#[test]
fn prompt_longer_than_a_slot_is_refused_with_both_numbers() {
    let engine = start(1, 1);
    let err = engine.submit(params(vec![1; 600], 4)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("600") && msg.contains("512"), "{msg}");
}

#[test]
fn logprobs_are_normalised_and_include_the_chosen_token() {
    let engine = start(1, 1);
    let mut p = params(tokenize("The capital of France is"), 2);
    p.logprobs = Some(3);
    let mut rx = engine.submit(p).unwrap();
    let mut seen = 0;
    while let Some(ev) = rx.blocking_recv() {
        if let Event::Token { id, logprob, .. } = ev {
            let lp = logprob.unwrap();
            assert_eq!(lp.id, id);
            assert_eq!(lp.top.len(), 3);
            // Greedy: the chosen token is the most likely one.
            assert_eq!(lp.top[0].0, id);
            assert!((lp.top[0].2 - lp.logprob).abs() < 1e-4);
            assert!(lp.logprob <= 0.0);
            seen += 1;
        }
    }
    assert_eq!(seen, 2);
}

/// A model file written in place while the engine is idle: the idle check
/// sees it, the status turns broken, and every submission after fails with
/// the change; `load_mode: Read` is immune.
#[test]
fn a_file_changed_while_idle_breaks_the_engine_unless_it_was_read() {
    let dir = std::env::temp_dir().join(format!("lamina-engine-change-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    let prompt = tokenize("The capital of France is");
    for mode in [LoadMode::Mmap, LoadMode::Read] {
        std::fs::copy(model_path(), &path).unwrap();
        let mut cfg = EngineConfig::new(&path);
        cfg.n_parallel = 1;
        cfg.n_ctx = Some(512);
        cfg.load_mode = mode;
        let engine = Engine::start(cfg).unwrap();
        engine.wait_ready(Duration::from_secs(60)).unwrap();
        let want = collect(engine.submit(params(prompt.clone(), 4)).unwrap()).0;
        // Same length, other bytes (and a later modification time).
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_len(0).unwrap();
        f.set_len(std::fs::metadata(model_path()).unwrap().len())
            .unwrap();
        drop(f);
        std::thread::sleep(Duration::from_millis(1500));
        match mode {
            LoadMode::Mmap => {
                assert!(
                    matches!(engine.status(), lamina_engine::Status::Broken(_)),
                    "{:?}",
                    engine.status()
                );
                let err = engine.submit(params(prompt.clone(), 4)).unwrap_err();
                assert!(
                    matches!(&err, EngineError::FileChanged { path: p, .. } if p == &path),
                    "{err}"
                );
                assert!(err.to_string().contains("restart the server"), "{err}");
            }
            LoadMode::Read => {
                assert_eq!(
                    collect(engine.submit(params(prompt.clone(), 4)).unwrap()).0,
                    want
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `progress`, the prompt reports where it stands: first at the cache
/// (nothing processed yet), then after every chunk of `n_batch` tokens, up
/// to the whole prompt, all before the first token; a reused prefix counts
/// as processed from the start.
#[test]
fn progress_reports_each_prompt_chunk() {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_ctx = Some(512);
    cfg.n_batch = 16;
    let engine = Engine::start(cfg).unwrap();
    engine.wait_ready(Duration::from_secs(60)).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| 1000 + i).collect();
    let reports = |p: GenerateParams| {
        let mut rx = engine.submit(p).unwrap();
        let (mut seen, mut tokens_before_last) = (Vec::new(), 0);
        let mut tokens = 0;
        loop {
            match rx.blocking_recv().unwrap() {
                Event::Progress(p) => {
                    seen.push((p.total, p.cache, p.processed));
                    tokens_before_last = tokens;
                }
                Event::Token { .. } => tokens += 1,
                Event::Text(_) => {}
                Event::Done(_) => break,
                Event::Error(e) => panic!("{e}"),
            }
        }
        assert_eq!(
            tokens_before_last, 0,
            "every report comes before the first token"
        );
        seen
    };
    let mut p = params(prompt.clone(), 2);
    p.progress = true;
    assert_eq!(
        reports(p.clone()),
        vec![(40, 0, 0), (40, 0, 16), (40, 0, 32), (40, 0, 40)]
    );
    // The same prompt again: all but its last token is reused.
    assert_eq!(reports(p), vec![(40, 39, 39), (40, 39, 40)]);
    // Not asked, not sent.
    assert!(reports(params(prompt, 2)).is_empty());
}

/// Erasing a slot forgets its cache: the same prompt then reuses nothing.
/// A busy slot is erased when its request ends, never under it; a slot
/// that does not exist is refused at once.
#[test]
fn erase_slot_forgets_the_cache_once_the_slot_is_idle() {
    let engine = start(1, 4);
    let prompt: Vec<u32> = (0..20).map(|i| 2000 + i).collect();
    let cache_n = |p: GenerateParams| {
        let mut rx = engine.submit(p).unwrap();
        loop {
            match rx.blocking_recv().unwrap() {
                Event::Done(s) => return s.timings.cache_n,
                Event::Error(e) => panic!("{e}"),
                _ => {}
            }
        }
    };
    assert_eq!(cache_n(params(prompt.clone(), 3)), 0);
    assert_eq!(cache_n(params(prompt.clone(), 3)), 19);
    // The prompt and the tokens fed back after it: the last sampled one
    // never entered the cache.
    let erased = engine.erase_slot(0).unwrap().blocking_recv().unwrap();
    assert_eq!(erased.unwrap(), 20 + 2);
    assert_eq!(cache_n(params(prompt.clone(), 3)), 0);

    // Busy: the erase waits for the request, which finishes whole.
    let mut rx = engine.submit(params(prompt.clone(), 24)).unwrap();
    match rx.blocking_recv().unwrap() {
        Event::Token { .. } => {}
        other => panic!("{other:?}"),
    }
    let erase = engine.erase_slot(0).unwrap();
    let generated = loop {
        match rx.blocking_recv().unwrap() {
            Event::Done(s) => break s.completion_tokens,
            Event::Error(e) => panic!("{e}"),
            _ => {}
        }
    };
    assert_eq!(generated, 24);
    assert!(erase.blocking_recv().unwrap().is_ok());

    assert!(matches!(
        engine.erase_slot(1),
        Err(EngineError::Invalid {
            param: "id_slot",
            ..
        })
    ));
}

/// With `timings_per_token`, progress reports and tokens carry the timings
/// so far: the first report has no prompt work yet, the prompt's count
/// and time never go back, and each token counts itself.
#[test]
fn timings_per_token_ride_with_reports_and_tokens() {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_ctx = Some(512);
    cfg.n_batch = 16;
    let engine = Engine::start(cfg).unwrap();
    engine.wait_ready(Duration::from_secs(60)).unwrap();
    let mut p = params((0..40).map(|i| 3000 + i).collect(), 3);
    p.progress = true;
    p.timings_per_token = true;
    let mut rx = engine.submit(p).unwrap();
    let (mut reports, mut tokens) = (Vec::new(), Vec::new());
    loop {
        match rx.blocking_recv().unwrap() {
            Event::Progress(p) => reports.push(p.timings.unwrap()),
            Event::Token { timings, .. } => tokens.push(timings.unwrap()),
            Event::Text(_) => {}
            Event::Done(_) => break,
            Event::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(reports.len(), 4);
    assert_eq!((reports[0].prompt_n, reports[0].prompt_ms), (0, 0.0));
    assert_eq!(reports[3].prompt_n, 40);
    for w in reports.windows(2) {
        assert!(w[1].prompt_n > w[0].prompt_n && w[1].prompt_ms >= w[0].prompt_ms);
    }
    assert!(reports.iter().all(|t| t.predicted_n == 0));
    let counted: Vec<usize> = tokens.iter().map(|t| t.predicted_n).collect();
    assert_eq!(counted, (1..=tokens.len()).collect::<Vec<_>>());
    assert!(tokens.iter().all(|t| t.prompt_n == 40));
}
