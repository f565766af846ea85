//! `lamina bench spec`: generation tokens/s with and without speculative
//! decoding, on a task that copies from its prompt.
//!
//! Ten chat requests each ask to rewrite a short function with one change,
//! so most of the answer is in the prompt. The engine runs in this process
//! with one slot; each request runs without drafts (`speculative.n_max` 0)
//! and with them, alternately, greedily, and the two answers must be the
//! same tokens (speculation changes the speed, never the text: a difference
//! is an error). Reported per mode: generation tokens/s over the decode
//! steps (llama-server's `predicted_per_second`, summed over the requests),
//! and the drafts' acceptance.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use lamina_engine::{DraftLimits, Engine, EngineConfig, Event, GenerateParams, Speculation};
use lamina_model::placement::Ngl;
use lamina_sampling::SamplerConfig;
use serde_json::json;

pub struct SpecBenchArgs {
    pub file: PathBuf,
    pub ngl: Ngl,
    pub spec: Speculation,
    pub n_gen: usize,
    pub reps: usize,
    pub json: bool,
}

/// The functions to rewrite, and the change each asks for.
const TASKS: [(&str, &str); 10] = [
    (
        "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * item.quantity\n    return result",
        "rename `result` to `acc`",
    ),
    (
        "def greet(name):\n    if not name:\n        return \"Hello, stranger!\"\n    return \"Hello, \" + name + \"!\"",
        "say \"Hi\" instead of \"Hello\"",
    ),
    (
        "def is_even(n):\n    if n % 2 == 0:\n        return True\n    else:\n        return False",
        "rename the function to `even`",
    ),
    (
        "def read_lines(path):\n    with open(path) as f:\n        lines = f.readlines()\n    return [line.strip() for line in lines]",
        "rename `path` to `filename`",
    ),
    (
        "def max_of(values):\n    best = values[0]\n    for v in values[1:]:\n        if v > best:\n            best = v\n    return best",
        "rename `best` to `largest`",
    ),
    (
        "def count_words(text):\n    counts = {}\n    for word in text.split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts",
        "rename `counts` to `freq`",
    ),
    (
        "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x",
        "rename `x` to `value`",
    ),
    (
        "def average(numbers):\n    if len(numbers) == 0:\n        return 0\n    return sum(numbers) / len(numbers)",
        "return None instead of 0 for an empty list",
    ),
    (
        "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n            print(\"FizzBuzz\")\n        elif i % 3 == 0:\n            print(\"Fizz\")\n        elif i % 5 == 0:\n            print(\"Buzz\")\n        else:\n            print(i)",
        "rename `i` to `k`",
    ),
    (
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
        "rename `result` to `product`",
    ),
];

/// One request's outcome.
struct Run {
    tokens: Vec<u32>,
    decode_steps: usize,
    ms: f64,
    draft_n: usize,
    accepted: usize,
}

fn run_one(engine: &Engine, prompt: &[u32], n_gen: usize, n_max: usize) -> anyhow::Result<Run> {
    let mut rx = engine.submit(GenerateParams {
        prompt: prompt.to_vec(),
        sampler: SamplerConfig::greedy(),
        max_tokens: n_gen,
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
    })?;
    let mut tokens = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Token { id, .. } => tokens.push(id),
            Event::Done(s) => {
                return Ok(Run {
                    tokens,
                    decode_steps: s.timings.decode_steps(),
                    ms: s.timings.predicted_ms,
                    draft_n: s.timings.draft_n,
                    accepted: s.timings.draft_n_accepted,
                })
            }
            Event::Error(e) => bail!("{e}"),
            _ => {}
        }
    }
    bail!("the request ended without an answer")
}

/// Sums of one mode's runs.
#[derive(Default)]
struct Totals {
    decode_steps: usize,
    ms: f64,
    draft_n: usize,
    accepted: usize,
}

impl Totals {
    fn add(&mut self, r: &Run) {
        self.decode_steps += r.decode_steps;
        self.ms += r.ms;
        self.draft_n += r.draft_n;
        self.accepted += r.accepted;
    }

    fn per_second(&self) -> f64 {
        if self.ms > 0.0 {
            self.decode_steps as f64 * 1e3 / self.ms
        } else {
            0.0
        }
    }
}

pub fn run(a: &SpecBenchArgs) -> anyhow::Result<()> {
    if a.spec.kind == lamina_engine::SpecType::None {
        bail!("--spec-type none: name a drafting type to compare (ngram-simple)");
    }
    let engine = Engine::start(EngineConfig {
        n_parallel: 1,
        n_ctx: Some(2048),
        ngl: a.ngl,
        cache_ram: None,
        spec: a.spec,
        ..EngineConfig::new(&a.file)
    })?;
    let info = engine
        .wait_ready(Duration::from_secs(600))
        .context("loading the model")?;
    let prompts: Vec<Vec<u32>> = TASKS
        .iter()
        .map(|(code, change)| {
            let messages = json!([{
                "role": "user",
                "content": format!(
                    "Rewrite this function with one change: {change}. Answer with the whole \
                     function only.\n\n```python\n{code}\n```"
                ),
            }]);
            let opts = lamina_chat::RenderOptions {
                add_generation_prompt: true,
                ..Default::default()
            };
            let rendered = info.template.render_prompt(&messages, &opts)?;
            Ok(info.encode_prompt(&rendered))
        })
        .collect::<anyhow::Result<_>>()?;
    // Warm-up: the first steps of each shape.
    run_one(&engine, &prompts[0], 8, 0)?;
    run_one(&engine, &prompts[0], 8, a.spec.n_max)?;
    let (mut off, mut on) = (Totals::default(), Totals::default());
    for rep in 0..a.reps.max(1) {
        for (i, p) in prompts.iter().enumerate() {
            // Alternate which runs first, so a drift in the machine's speed
            // falls on both.
            let order = if (rep + i) % 2 == 0 {
                [0, a.spec.n_max]
            } else {
                [a.spec.n_max, 0]
            };
            let mut got = Vec::new();
            for n_max in order {
                let r = run_one(&engine, p, a.n_gen, n_max)?;
                if n_max == 0 {
                    off.add(&r);
                } else {
                    on.add(&r);
                }
                got.push(r.tokens);
            }
            if got[0] != got[1] {
                bail!("task {i}: the tokens with drafts differ from the tokens without");
            }
        }
    }
    let speedup = if off.per_second() > 0.0 {
        on.per_second() / off.per_second()
    } else {
        0.0
    };
    let rate = if on.draft_n > 0 {
        on.accepted as f64 / on.draft_n as f64
    } else {
        0.0
    };
    if a.json {
        println!(
            "{}",
            json!({
                "model": info.id,
                "spec_type": a.spec.kind.as_str(),
                "draft_max": a.spec.n_max,
                "ngram_n": a.spec.ngram_n,
                "tasks": TASKS.len(),
                "reps": a.reps.max(1),
                "n_gen": a.n_gen,
                "plain_tg_per_second": off.per_second(),
                "spec_tg_per_second": on.per_second(),
                "speedup": speedup,
                "draft_n": on.draft_n,
                "draft_n_accepted": on.accepted,
            })
        );
    } else {
        println!(
            "{}: {} tasks x {} reps, up to {} tokens each, {}",
            info.id,
            TASKS.len(),
            a.reps.max(1),
            a.n_gen,
            info.placement.lines().next().unwrap_or("")
        );
        println!("| mode | tg tokens/s | decode steps' tokens | drafted | accepted |");
        println!("| --- | ---: | ---: | ---: | ---: |");
        println!(
            "| plain | {:.1} | {} | - | - |",
            off.per_second(),
            off.decode_steps
        );
        println!(
            "| {} --draft-max {} (n {}) | {:.1} | {} | {} | {} ({:.0} %) |",
            a.spec.kind.as_str(),
            a.spec.n_max,
            a.spec.ngram_n,
            on.per_second(),
            on.decode_steps,
            on.draft_n,
            on.accepted,
            rate * 100.0
        );
        println!("speed-up {speedup:.2}x; identical tokens in every task");
    }
    Ok(())
}
