//! `POST /completion` (and `/completions`, its alias in llama-server):
//! llama-server's native completion API, over the same engine, sampling
//! and checks as the OpenAI routes (`generate.rs`).
//!
//! The prompt is a string, token ids, or a mix of both in one array
//! (`[1, 2, "text", 3]`: strings are tokenized in place, with BOS only when
//! the first element is a string), or `{"prompt_string": ...}`; an array
//! with no number in it is several prompts, answered with an array of
//! results in order. The response carries llama-server's fields:
//! `content`, `tokens` (with `return_tokens`), `stop`, `stop_type`
//! (`eos`, `word`, `limit`), `stopping_word`, `truncated` (always false:
//! a prompt that does not fit is refused with a 400, never cut),
//! `tokens_predicted`, `tokens_evaluated`, `generation_settings`, `timings`
//! and, with `n_probs`, `completion_probabilities`. With `stream: true`
//! each piece of text is one SSE `data:` event with `stop: false` and its
//! token ids, then one final event with `stop: true` and the summary
//! fields; there is no `[DONE]`, as in llama-server. With
//! `return_progress`, the prompt's processing comes first, as empty
//! results with `prompt_progress` (`total`, `cache`, `processed`,
//! `time_ms`): one when it starts and one after each chunk of the prompt.
//! `n` > 1 answers each prompt `n` times (each choice its own sampler
//! stream, seeded `seed + i`), every result in the array with its `index`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use lamina_engine::{
    Event, Events, FinishReason, GenerateParams, ModelInfo, Summary, Timings, TokenLogprob,
};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::generate::{choices, collect, job, timings, token_ids, Collected};
use super::params::{self, Api, Body, Sampling};
use super::shutdown::{self, CutSignal};
use super::structured;
use super::AppState;

/// How often an idle stream gets a comment line.
const PING: Duration = Duration::from_secs(10);

/// llama-server's `LLAMA_DEFAULT_SEED`: the seed reported for "random".
const RANDOM_SEED: u64 = 0xFFFF_FFFF;

/// What a native request asks for besides the sampling.
struct Native {
    return_tokens: bool,
    /// `response_fields`: only these (slash-separated paths) are returned.
    fields: Vec<String>,
    cache_prompt: bool,
}

pub async fn completion(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let b = Body::parse(&body?)?;
    let mut s = params::sampling(
        &b,
        &info,
        st.engine.max_tokens_cap(),
        Api::Native,
        &st.options.sampler,
    )?;
    s.post_sampling_probs = b.bool("post_sampling_probs")?.unwrap_or(false);
    s.draft = draft_limits(&b)?;
    let native = Native {
        return_tokens: b.bool("return_tokens")?.unwrap_or(false),
        fields: response_fields(&b)?,
        // A slot's cached prefix is reused whatever this says: the kernels
        // are batch invariant, so reuse cannot change the result.
        cache_prompt: b.bool("cache_prompt")?.unwrap_or(true),
    };
    let prompt = b
        .get("prompt")
        .cloned()
        .ok_or_else(|| ApiError::invalid("prompt", "prompt is required"))?;
    let info2 = info.clone();
    let prompts = st.prepare.run(move || prompts(&info2, &prompt)).await?;
    structured::compile(&st, &info, &mut s).await?;
    // `n` > 1: each prompt's choices in a row, each its own result.
    let jobs = prompts
        .into_iter()
        .map(|p| job(&st, &info, p, &s, "prompt").map(|j| choices(j, s.n)))
        .collect::<Result<Vec<_>, _>>()?
        .concat();

    if s.stream {
        let [one] = <[GenerateParams; 1]>::try_from(jobs).map_err(|_| {
            ApiError::invalid(
                "stream",
                "stream with several prompts or n > 1 is not supported on /completion: \
                 send one prompt per request, or use /v1/completions",
            )
        })?;
        let settings = generation_settings(&s, &one, &native);
        let rx = st.engine.submit(one.clone())?;
        let fin = Final::new(&st, &info, &s, one, settings, &native);
        return Ok(sse(rx, fin, st.cutoff.clone()).into_response());
    }

    // Every prompt is queued before any is awaited, so they decode together;
    // if one is refused (the queue is full), dropping the others' receivers
    // cancels them.
    let mut pending = Vec::with_capacity(jobs.len());
    for j in jobs {
        let rx = st.engine.submit(j.clone())?;
        pending.push((j, rx));
    }
    let mut results = Vec::with_capacity(pending.len());
    let outcomes = futures_util::future::try_join_all(pending.into_iter().map(|(j, rx)| {
        let cutoff = st.cutoff.clone();
        async move { collect(rx, cutoff).await.map(|c| (j, c)) }
    }))
    .await?;
    for (index, (j, c)) in outcomes.into_iter().enumerate() {
        let settings = generation_settings(&s, &j, &native);
        let mut fin = Final::new(&st, &info, &s, j, settings, &native);
        fin.index = index;
        let mut body = fin.body(&c.text, &c.tokens, &c.summary);
        if !c.logprobs.is_empty() {
            body["completion_probabilities"] = probabilities(&c.logprobs, s.post_sampling_probs);
        }
        results.push(select_fields(body, &native.fields));
    }
    Ok(match <[Value; 1]>::try_from(results) {
        Ok([one]) => Json(one).into_response(),
        Err(all) => Json(Value::Array(all)).into_response(),
    })
}

/// The prompts of a request: one, or (an array with no number in it) one
/// per element.
fn prompts(info: &ModelInfo, p: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    match p {
        Value::Array(a) if !a.iter().any(Value::is_number) => {
            if a.is_empty() {
                return Err(ApiError::invalid("prompt", "prompt must not be empty"));
            }
            a.iter()
                .enumerate()
                .map(|(i, sub)| subprompt(info, sub, &format!("prompt[{i}]")))
                .collect()
        }
        _ => Ok(vec![subprompt(info, p, "prompt")?]),
    }
}

pub(super) fn subprompt(info: &ModelInfo, p: &Value, param: &str) -> Result<Vec<u32>, ApiError> {
    match p {
        Value::String(text) => Ok(info.tokenizer.encode(text, true, true)),
        Value::Array(a) => mixed(info, a, param),
        Value::Object(o) => {
            if o.contains_key("multimodal_data") {
                return Err(ApiError::invalid(
                    format!("{param}.multimodal_data"),
                    "multimodal_data: this server has no multimodal model",
                ));
            }
            match o.get("prompt_string") {
                Some(Value::String(text)) => Ok(info.tokenizer.encode(text, true, true)),
                Some(Value::Array(a)) => mixed(info, a, param),
                _ => Err(ApiError::invalid(
                    format!("{param}.prompt_string"),
                    format!("{param}.prompt_string must be a string or an array of token ids and strings"),
                )),
            }
        }
        _ => Err(ApiError::invalid(
            param,
            format!(
                "{param} must be a string, an array of token ids and strings, \
                 or an object with prompt_string"
            ),
        )),
    }
}

/// Token ids and strings in one sequence, as llama-server's
/// `tokenize_mixed`: BOS only before a leading string.
fn mixed(info: &ModelInfo, a: &[Value], param: &str) -> Result<Vec<u32>, ApiError> {
    let mut out = Vec::new();
    for (i, v) in a.iter().enumerate() {
        match v {
            Value::String(text) => out.extend(info.tokenizer.encode(text, i == 0, true)),
            Value::Number(_) => out.extend(token_ids(
                std::slice::from_ref(v),
                info.config.n_vocab,
                param,
            )?),
            _ => {
                return Err(ApiError::invalid(
                    param,
                    format!("{param} may hold only token ids and strings (element {i} is {v})"),
                ))
            }
        }
    }
    Ok(out)
}

fn response_fields(b: &Body) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "response_fields",
            "response_fields must be an array of strings",
        )
    };
    match b.get("response_fields") {
        None => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// llama-server's `__verbose`: the native result of a request's first
/// choice (its generated tokens included, and the prompt as text with its
/// special tokens), for an OpenAI-shaped response.
pub(super) fn verbose(
    st: &AppState,
    info: &Arc<ModelInfo>,
    s: &Sampling,
    j: GenerateParams,
    c: &Collected,
) -> Value {
    let native = Native {
        return_tokens: true,
        fields: Vec::new(),
        cache_prompt: true,
    };
    let settings = generation_settings(s, &j, &native);
    let fin = Final::new(st, info, s, j, settings, &native);
    let mut body = fin.body(&c.text, &c.tokens, &c.summary);
    if !c.logprobs.is_empty() {
        body["completion_probabilities"] = probabilities(&c.logprobs, s.post_sampling_probs);
    }
    body
}

/// Only the named fields, each under its full path as the key
/// (`"generation_settings/n_predict"`), as llama-server returns them.
fn select_fields(body: Value, fields: &[String]) -> Value {
    if fields.is_empty() {
        return body;
    }
    let mut out = Map::new();
    for f in fields {
        let mut at = Some(&body);
        for part in f.split('/') {
            at = at.and_then(|v| v.get(part));
        }
        if let Some(v) = at {
            out.insert(f.clone(), v.clone());
        }
    }
    Value::Object(out)
}

/// llama-server's `generation_settings`, for what Lamina's sampler has.
fn generation_settings(s: &Sampling, j: &GenerateParams, n: &Native) -> Value {
    let c = &s.sampler;
    // llama-server's shape; a ban (-inf) is null, as its JSON writes an
    // infinite float.
    let bias: Vec<Value> = c
        .logit_bias
        .iter()
        .map(|&(id, b)| json!({"bias": b.is_finite().then_some(b), "token": id}))
        .collect();
    json!({
        "seed": c.seed.unwrap_or(RANDOM_SEED),
        "temperature": c.temperature,
        "top_k": c.top_k,
        "top_p": c.top_p,
        "min_p": c.min_p,
        "repeat_last_n": c.repeat_last_n,
        "repeat_penalty": c.repeat_penalty,
        "presence_penalty": c.presence_penalty,
        "frequency_penalty": c.frequency_penalty,
        // Lamina has no adaptive-p sampler: llama-server's values for "off".
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
        "max_tokens": j.max_tokens,
        "n_predict": j.max_tokens,
        "n_probs": s.logprobs.unwrap_or(0),
        "post_sampling_probs": s.post_sampling_probs,
        "stream": s.stream,
        "stop": s.stop,
        "ignore_eos": s.ignore_eos,
        "cache_prompt": n.cache_prompt,
        "logit_bias": bias,
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
    })
}

/// The most drafted tokens a request may ask to verify per step.
const DRAFT_MAX: i64 = 1024;

/// llama-server's per-request speculation keys, spelled as it reads them
/// (flat keys with a dot): `speculative.n_max` (0 turns drafting off for
/// the request) and `speculative.n_min`, each over the server's
/// `--draft-max`/`--draft-min`; `n_min` is cut to `n_max`, as there.
/// `speculative.p_min` is checked and has no effect: it bounds a draft
/// model's confidence, and n-gram drafts have none.
fn draft_limits(b: &Body) -> Result<lamina_engine::DraftLimits, ApiError> {
    let n = |name| -> Result<Option<usize>, ApiError> {
        Ok(b.int(name, 0, DRAFT_MAX)?.map(|v| v as usize))
    };
    let n_max = n("speculative.n_max")?;
    let n_min = n("speculative.n_min")?;
    b.number("speculative.p_min", 0.0, 1.0)?;
    Ok(lamina_engine::DraftLimits {
        n_max,
        n_min: match (n_min, n_max) {
            (Some(lo), Some(hi)) => Some(lo.min(hi)),
            (lo, _) => lo,
        },
    })
}

/// Everything the final result needs besides what the engine reports.
struct Final {
    index: usize,
    model: String,
    prompt: Vec<u32>,
    prompt_text: String,
    stop: Vec<String>,
    settings: Value,
    return_tokens: bool,
    /// Probabilities are the sampler chain's (`post_sampling_probs`).
    post_sampling: bool,
    info: Arc<ModelInfo>,
}

impl Final {
    fn new(
        st: &AppState,
        info: &Arc<ModelInfo>,
        s: &Sampling,
        j: GenerateParams,
        settings: Value,
        n: &Native,
    ) -> Self {
        Final {
            index: 0,
            model: st.model_id(info),
            prompt_text: info.tokenizer.decode_with(&j.prompt, true),
            prompt: j.prompt,
            stop: s.stop.clone(),
            settings,
            return_tokens: n.return_tokens,
            post_sampling: s.post_sampling_probs,
            info: info.clone(),
        }
    }

    /// The result with `stop: true`; `text` and `tokens` are the whole
    /// completion (streams pass what their last event carries).
    fn body(&self, text: &str, all_tokens: &[u32], summary: &Summary) -> Value {
        let (stop_type, word) = self.stop_type(text, all_tokens, summary);
        json!({
            "index": self.index,
            "content": text,
            "tokens": if self.return_tokens { all_tokens.to_vec() } else { Vec::new() },
            "stop": true,
            "model": self.model,
            "tokens_predicted": summary.completion_tokens,
            "tokens_evaluated": summary.prompt_tokens,
            "generation_settings": self.settings,
            "prompt": self.prompt_text,
            "has_new_line": text.contains('\n'),
            "truncated": false,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": self.prompt.len() + summary.completion_tokens,
            "timings": timings(&summary.timings),
        })
    }

    /// `eos` when the last token ends generation, `word` (and which) when a
    /// stop string cut the text, `limit` for max_tokens, the context or
    /// the time limit.
    fn stop_type(&self, text: &str, tokens: &[u32], summary: &Summary) -> (&'static str, String) {
        if summary.finish == FinishReason::Length {
            return ("limit", String::new());
        }
        if tokens
            .last()
            .is_some_and(|&t| self.info.tokenizer.is_eog(t))
        {
            return ("eos", String::new());
        }
        // A stop string cuts the text: the tokens run on past `text` into it.
        let whole = self.info.tokenizer.decode(tokens);
        let after = whole.get(text.len()..).unwrap_or_default();
        let word = self
            .stop
            .iter()
            .find(|w| after.starts_with(w.as_str()))
            .or_else(|| self.stop.iter().find(|w| after.contains(w.as_str())));
        match word {
            Some(w) => ("word", w.clone()),
            // The engine does not pass the end-of-generation token on.
            None => ("eos", String::new()),
        }
    }
}

/// llama-server's `completion_probabilities`: per token its id, text,
/// bytes and log-probability, and the `top_logprobs` alternatives; with
/// `post_sampling_probs`, the sampler chain's `prob` and `top_probs`
/// instead, as llama-server spells them.
fn probabilities(lps: &[TokenLogprob], post: bool) -> Value {
    let entry = |id: u32, bytes: &[u8], logprob: f32| {
        let mut e = json!({
            "id": id,
            "token": String::from_utf8_lossy(valid_prefix(bytes)),
            "bytes": bytes,
        });
        if post {
            e["prob"] = json!(logprob.exp());
        } else {
            e["logprob"] = json!(logprob);
        }
        e
    };
    let top_key = if post { "top_probs" } else { "top_logprobs" };
    lps.iter()
        .map(|lp| {
            let mut e = entry(lp.id, lp.bytes.as_slice(), lp.logprob);
            e[top_key] = lp
                .top
                .iter()
                .map(|(id, b, l)| entry(*id, b.as_slice(), *l))
                .collect();
            e
        })
        .collect()
}

/// The bytes up to a UTF-8 character cut at the end (llama-server's
/// `validate_utf8`): the piece's text never ends in a replacement character.
fn valid_prefix(bytes: &[u8]) -> &[u8] {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes,
        Err(e) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
        Err(_) => bytes,
    }
}

struct StreamState {
    rx: Events,
    fin: Final,
    /// Ids and log-probs of tokens whose text has not been sent yet.
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    /// Text held back until a token goes with it.
    text: String,
    all_tokens: Vec<u32>,
    all_text: String,
    out: VecDeque<SseEvent>,
    ended: bool,
    /// Fires when the shutdown grace runs out: the stream ends with an error.
    cutoff: CutSignal,
    /// The timings the last token came with (`timings_per_token`).
    timings: Option<Timings>,
}

fn sse(
    rx: Events,
    fin: Final,
    cutoff: CutSignal,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let st = StreamState {
        rx,
        fin,
        tokens: Vec::new(),
        logprobs: Vec::new(),
        text: String::new(),
        all_tokens: Vec::new(),
        all_text: String::new(),
        out: VecDeque::new(),
        ended: false,
        cutoff,
        timings: None,
    };
    let events = stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.out.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.ended {
                return None;
            }
            let ev = tokio::select! {
                ev = st.rx.recv() => ev,
                () = st.cutoff.cut() => {
                    st.push(shutdown::error().body());
                    st.ended = true;
                    continue;
                }
            };
            match ev {
                Some(Event::Token {
                    id,
                    logprob,
                    timings: t,
                }) => {
                    if t.is_some() {
                        st.timings = t;
                    }
                    st.tokens.push(id);
                    st.all_tokens.push(id);
                    st.logprobs.extend(logprob);
                }
                Some(Event::Progress(p)) => {
                    // Before the first token: an empty partial result with
                    // llama-server's `prompt_progress`.
                    let mut chunk = st.partial();
                    chunk["prompt_progress"] = super::stream::progress(&p);
                    if let Some(t) = &p.timings {
                        chunk["timings"] = timings(t);
                    }
                    st.push(chunk);
                }
                Some(Event::Text(t)) => {
                    st.text.push_str(&t);
                    st.all_text.push_str(&t);
                    // A piece of text goes out with the tokens it came from.
                    if !st.tokens.is_empty() {
                        let chunk = st.partial();
                        st.push(chunk);
                    }
                }
                Some(Event::Done(summary)) => {
                    if !st.text.is_empty() {
                        let chunk = st.partial();
                        st.push(chunk);
                    }
                    // The text and ids went out already; the summary
                    // fields (stop_type reads the whole text) come last.
                    let mut last = st.fin.body("", &[], &summary);
                    let (stop_type, word) =
                        st.fin.stop_type(&st.all_text, &st.all_tokens, &summary);
                    last["stop_type"] = json!(stop_type);
                    last["stopping_word"] = json!(word);
                    last["has_new_line"] = json!(st.all_text.contains('\n'));
                    st.push(last);
                    st.ended = true;
                }
                Some(Event::Error(e)) => {
                    st.push(ApiError::from(e).body());
                    st.ended = true;
                }
                None => {
                    st.push(
                        ApiError::internal("the engine ended the request without a result").body(),
                    );
                    st.ended = true;
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(PING).text("ping"))
}

impl StreamState {
    fn partial(&mut self) -> Value {
        let tokens = std::mem::take(&mut self.tokens);
        let lps = std::mem::take(&mut self.logprobs);
        let mut c = json!({
            "index": self.fin.index,
            "content": std::mem::take(&mut self.text),
            "tokens": tokens,
            "stop": false,
            "tokens_predicted": self.all_tokens.len(),
            "tokens_evaluated": self.fin.prompt.len(),
        });
        if !lps.is_empty() {
            c["completion_probabilities"] = probabilities(&lps, self.fin.post_sampling);
        }
        if let Some(t) = self.timings.take() {
            c["timings"] = timings(&t);
        }
        c
    }

    fn push(&mut self, v: Value) {
        self.out.push_back(SseEvent::default().data(v.to_string()));
    }
}
