//! `POST /v1/chat/completions` and `POST /v1/completions`: a body becomes a
//! tokenized prompt and [`GenerateParams`], the engine runs it, and the
//! events become one JSON response or an SSE stream (`stream.rs`).
//!
//! Every check happens before the request reaches the engine, so a bad
//! request (streaming or not) gets its status code, never a 200 stream that
//! then fails.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lamina_chat::{Piece, Prompt, RenderOptions, ToolCall};
use lamina_engine::{Event, GenerateParams, ModelInfo, Summary, Timings, TokenLogprob};
use serde_json::{json, Value};

use super::error::ApiError;
use super::params::{self, Api, Body, Ending, Sampling};
use super::reasoning::{self, reasoning_of, Reader, Thinking};
use super::resume;
use super::shutdown::{self, CutSignal};
use super::stream;
use super::structured;
use super::tools::{self, Calls};
use super::AppState;

/// What every response and chunk of one request repeats.
#[derive(Debug, Clone)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub api: Api,
}

impl Meta {
    pub fn new(model: String, api: Api) -> Self {
        let prefix = match api {
            Api::Chat => "chatcmpl-",
            Api::Completion | Api::Native => "cmpl-",
        };
        Meta {
            id: format!("{prefix}{}", super::random_id()),
            created: super::unix_time(),
            model,
            api,
        }
    }
}

pub async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let conv = resume::conversation_id(&headers)?;
    let info = st.ready()?;
    let b = Body::parse(&body?)?;
    let mut s = params::sampling(
        &b,
        &info,
        st.engine.max_tokens_cap(),
        Api::Chat,
        &st.options.sampler,
    )?;
    let c = chat_prompt(&st, &info, &b).await?;
    let parallel = b.bool("parallel_tool_calls")?.unwrap_or(false);
    let open = c.thinking.left_open(&c.text);
    if let Some(w) = tools::forced(&info, c.tools.as_ref(), &c.choice, parallel, open)? {
        structured::add(&mut s, w)?;
    }
    // Each choice reads its own answer.
    let readers = (0..s.n)
        .map(|_| {
            let calls = Calls::new(&info, c.tools.as_ref(), c.choice.offers_tools());
            Reader::new(&info, &c.thinking, &c.text, calls)
        })
        .collect();
    let at = (&*st, &info, conv);
    run(at, c.tokens, s, "messages", Api::Chat, readers).await
}

/// `POST /v1/chat/completions/input_tokens`: how many tokens the chat
/// route's prompt for this body would have (llama-server's count, with
/// its `object`), without generating.
pub async fn chat_input_tokens(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let b = Body::parse(&body?)?;
    let c = chat_prompt(&st, &info, &b).await?;
    Ok(
        Json(json!({"input_tokens": c.tokens.len(), "object": "response.input_tokens"}))
            .into_response(),
    )
}

/// A chat body's prompt and what reading its answer needs.
struct ChatPrompt {
    tokens: Vec<u32>,
    text: String,
    tools: Option<Value>,
    choice: tools::Choice,
    thinking: Thinking,
}

async fn chat_prompt(
    st: &AppState,
    info: &Arc<ModelInfo>,
    b: &Body,
) -> Result<ChatPrompt, ApiError> {
    let messages = params::messages(b)?;
    let choice = tools::openai_choice(b.get("tool_choice"))?;
    // "none" offers no tools: the prompt does not list them.
    let tools = params::tools(b)?.filter(|_| choice.offers_tools()).cloned();
    let kwargs = params::template_kwargs(b)?;
    let asked = reasoning::effort_switch(b.get("reasoning_effort"))?;
    let thinking = Thinking::decide(st, info, kwargs, asked, b.get("reasoning_format"))?;
    let kwargs = thinking.kwargs(kwargs.cloned());
    let (messages, ending) = params::ending(b, messages)?;
    let (tokens, text) =
        render_chat_ending(st, info, messages, tools.clone(), Some(kwargs), ending).await?;
    Ok(ChatPrompt {
        tokens,
        text,
        tools,
        choice,
        thinking,
    })
}

/// Chat messages rendered by the model's template (with the generation
/// prompt) and tokenized: CPU work bounded by the body limit and the
/// template's limits, run in the bounded pool. Every chat-shaped route
/// (OpenAI's, Anthropic's, Ollama's, the Responses API) renders through
/// here. The text comes back too: it says where the prompt leaves the
/// answer (inside a think block or not).
pub async fn render_chat_text(
    st: &AppState,
    info: &Arc<ModelInfo>,
    messages: Value,
    tools: Option<Value>,
    kwargs: Option<serde_json::Map<String, Value>>,
) -> Result<(Vec<u32>, String), ApiError> {
    let ending = Ending::Render {
        add_generation_prompt: true,
    };
    render_chat_ending(st, info, messages, tools, kwargs, ending).await
}

/// [`render_chat_text`], ending as `ending` says: a continued (prefilled)
/// assistant message is the generation prompt and then its text, which the
/// model goes on from.
pub async fn render_chat_ending(
    st: &AppState,
    info: &Arc<ModelInfo>,
    messages: Value,
    tools: Option<Value>,
    kwargs: Option<serde_json::Map<String, Value>>,
    ending: Ending,
) -> Result<(Vec<u32>, String), ApiError> {
    let info = info.clone();
    st.prepare
        .run(move || {
            let prompt = render_ending(&info, &messages, tools.as_ref(), kwargs.as_ref(), &ending)?;
            let tokens = info.encode_prompt(&prompt);
            Ok((tokens, prompt.text))
        })
        .await
}

/// The prompt text of `messages` ending as `ending` says (`/apply-template`
/// shows it; the chat route tokenizes it).
pub fn render_ending(
    info: &ModelInfo,
    messages: &Value,
    tools: Option<&Value>,
    kwargs: Option<&serde_json::Map<String, Value>>,
    ending: &Ending,
) -> Result<Prompt, ApiError> {
    let add_generation_prompt = match ending {
        Ending::Render {
            add_generation_prompt,
        } => *add_generation_prompt,
        Ending::Continue(_) => true,
    };
    // llama.cpp's extra variables: today's date, which Llama 3.x templates
    // print (`Today Date:`) and otherwise fix to a day of their own; a
    // request's `chat_template_kwargs` may set them.
    let now = info.template.clock().now();
    let mut vars = serde_json::Map::new();
    vars.insert(
        "date_string".into(),
        json!(now.format("%d %b %Y").to_string()),
    );
    vars.insert("datetime".into(), json!(now.format("%b %d %Y").to_string()));
    vars.extend(info.template.family_variables(tools));
    vars.extend(
        kwargs
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let mut prompt = info.template.render_prompt(
        messages,
        &RenderOptions {
            tools,
            add_generation_prompt,
            kwargs: Some(&vars),
            ..RenderOptions::default()
        },
    )?;
    if let Ending::Continue(text) = ending {
        info.template.append_request_text(&mut prompt, text);
    }
    Ok(prompt)
}

pub async fn completion(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let conv = resume::conversation_id(&headers)?;
    let info = st.ready()?;
    let b = Body::parse(&body?)?;
    let s = params::sampling(
        &b,
        &info,
        st.engine.max_tokens_cap(),
        Api::Completion,
        &st.options.sampler,
    )?;
    let prompt = match b.get("prompt") {
        None => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(text)) => {
            let (info2, text) = (info.clone(), text.clone());
            st.prepare
                .run(move || Ok(info2.tokenizer.encode(&text, true, true)))
                .await?
        }
        // A single-element array holding a string is how the SDKs send one prompt.
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            let (info2, text) = (info.clone(), a[0].as_str().unwrap_or_default().to_owned());
            st.prepare
                .run(move || Ok(info2.tokenizer.encode(&text, true, true)))
                .await?
        }
        Some(Value::Array(a)) => token_ids(a, info.config.n_vocab, "prompt")?,
        Some(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "prompt must be a string or an array of token ids (one prompt per request)",
            ))
        }
    };
    let readers = (0..s.n).map(|_| None).collect();
    let at = (&*st, &info, conv);
    run(at, prompt, s, "prompt", Api::Completion, readers).await
}

/// Token ids from a JSON array, each checked against the vocabulary.
pub fn token_ids(a: &[Value], n_vocab: usize, param: &str) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|v| {
            v.as_u64()
                .filter(|&id| id < n_vocab as u64)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    ApiError::invalid(
                        param,
                        format!("{param} must hold token ids below the vocabulary size {n_vocab} (got {v})"),
                    )
                })
        })
        .collect()
}

/// The engine's job for a tokenized prompt, or the 400 that says why the
/// prompt and its limit do not fit a slot.
pub fn job(
    st: &AppState,
    info: &ModelInfo,
    prompt: Vec<u32>,
    s: &Sampling,
    prompt_param: &'static str,
) -> Result<GenerateParams, ApiError> {
    let n_slot = info.n_ctx_slot;
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            prompt_param,
            format!("{prompt_param} is empty after tokenization"),
        ));
    }
    let too_long = |msg: String| {
        let mut e = ApiError::invalid(prompt_param, msg);
        e.code = Some("context_length_exceeded");
        e
    };
    if prompt.len() >= n_slot {
        // llama-server's type and numbers, which its clients read.
        let mut e = too_long(format!(
            "the prompt has {} tokens, but the context of a slot is {n_slot} tokens and at least one must be left to generate",
            prompt.len()
        ));
        e.kind = "exceed_context_size_error";
        e.context = Some((prompt.len(), n_slot));
        return Err(e);
    }
    let max_tokens = match s.max_tokens {
        Some(m) if prompt.len() + m > n_slot => {
            let mut e = too_long(format!(
                "the prompt has {} tokens and {} is {m}: together {} exceed the context of a slot, {n_slot} tokens",
                prompt.len(),
                s.max_tokens_param,
                prompt.len() + m
            ));
            e.param = Some(s.max_tokens_param.into());
            return Err(e);
        }
        Some(m) => m,
        None => st.default_max_tokens(info, prompt.len()),
    };
    Ok(GenerateParams {
        prompt,
        sampler: s.sampler.clone(),
        max_tokens,
        stop: s.stop.clone(),
        logprobs: s.logprobs,
        post_sampling: s.post_sampling_probs,
        timeout: None,
        constraint: s.constraint.clone(),
        // As in llama-server, only a stream reports progress.
        progress: s.stream && s.return_progress,
        timings_per_token: s.stream && s.timings_per_token,
        draft: s.draft,
    })
}

/// The jobs of a request's `n` choices: the same prompt, each with its
/// own sampler stream. With a seed, choice `i` samples with `seed + i`, so
/// the first is what `n: 1` gives and every choice is reproducible.
pub fn choices(one: GenerateParams, n: usize) -> Vec<GenerateParams> {
    (0..n)
        .map(|i| {
            let mut j = one.clone();
            j.sampler.seed = one.sampler.seed.map(|s| s.wrapping_add(i as u64));
            j
        })
        .collect()
}

/// Submits every job before any is awaited, so the choices decode
/// together; if one is refused (the queue is full), dropping the others'
/// receivers cancels them.
pub fn submit_all(
    st: &AppState,
    jobs: Vec<GenerateParams>,
) -> Result<Vec<lamina_engine::Events>, ApiError> {
    jobs.into_iter()
        .map(|j| st.engine.submit(j).map_err(ApiError::from))
        .collect()
}

/// Generates for one request: `at` is the server, the model and the
/// request's conversation id (`X-Conversation-Id`: a stream is then
/// resumable, [`resume`]).
async fn run(
    (st, info, conv): (&AppState, &Arc<ModelInfo>, Option<String>),
    prompt: Vec<u32>,
    mut s: Sampling,
    prompt_param: &'static str,
    api: Api,
    readers: Vec<Option<Reader>>,
) -> Result<Response, ApiError> {
    structured::compile(st, info, &mut s).await?;
    let one = job(st, info, prompt, &s, prompt_param)?;
    // Only a whole response carries `__verbose`: a stream's chunks do not.
    let verbose = (s.verbose.unwrap_or(st.options.verbose) && !s.stream).then(|| one.clone());
    let jobs = choices(one, s.n);
    let rxs = submit_all(st, jobs)?;
    let meta = Meta::new(st.model_id(info), api);
    if s.stream {
        let sse =
            stream::sse(rxs, meta, s.include_usage, st.cutoff.clone(), readers).into_response();
        return Ok(match conv {
            Some(id) => resume::tee(st, &id, sse),
            None => sse,
        });
    }
    let done = futures_util::future::try_join_all(
        rxs.into_iter()
            .zip(readers)
            .map(|(rx, r)| collect_with(rx, st.cutoff.clone(), r)),
    )
    .await?;
    let mut body = response(&meta, &done, s.logprobs.is_some());
    if let (Some(j), Some(first)) = (verbose, done.first()) {
        body["__verbose"] = super::native::verbose(st, info, &s, j, first);
    }
    Ok(Json(body).into_response())
}

/// A finished request, gathered from its events.
pub struct Collected {
    pub text: String,
    /// The generated token ids, in order.
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub summary: Summary,
    /// The answer as text, reasoning and tool calls, when it was read for
    /// them.
    pub pieces: Option<Vec<Piece>>,
    /// The reasoning, when the answer had any.
    pub reasoning: Option<String>,
}

impl Collected {
    /// The text outside tool calls, and the calls (none when the answer
    /// was not read for them).
    pub fn content_and_calls(&self) -> (String, Vec<&ToolCall>) {
        match &self.pieces {
            Some(p) => tools::split(p),
            None => (self.text.clone(), Vec::new()),
        }
    }
}

pub async fn collect(rx: lamina_engine::Events, cutoff: CutSignal) -> Result<Collected, ApiError> {
    collect_with(rx, cutoff, None).await
}

/// [`collect`], with the answer read for reasoning and tool calls by
/// `calls`.
pub async fn collect_with(
    mut rx: lamina_engine::Events,
    mut cutoff: CutSignal,
    mut calls: Option<Reader>,
) -> Result<Collected, ApiError> {
    let (mut text, mut logprobs, mut tokens) = (String::new(), Vec::new(), Vec::new());
    let mut pieces = Vec::new();
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            () = cutoff.cut() => return Err(shutdown::error()),
        };
        let Some(ev) = ev else { break };
        match ev {
            Event::Token { id, logprob, .. } => {
                tokens.push(id);
                logprobs.extend(logprob);
                if let Some(c) = &mut calls {
                    pieces.extend(c.token(id));
                }
            }
            // Only streams ask for progress reports.
            Event::Progress(_) => {}
            Event::Text(t) => {
                if let Some(c) = &mut calls {
                    pieces.extend(c.text(&t));
                }
                text.push_str(&t);
            }
            Event::Done(summary) => {
                let mut reasoning = None;
                let pieces = calls.map(|mut c| {
                    pieces.extend(c.finish());
                    reasoning = c
                        .legacy_reasoning()
                        .map(str::to_owned)
                        .or_else(|| reasoning_of(&pieces));
                    pieces
                });
                return Ok(Collected {
                    text,
                    tokens,
                    logprobs,
                    summary,
                    pieces,
                    reasoning,
                });
            }
            Event::Error(e) => return Err(e.into()),
        }
    }
    Err(ApiError::internal(
        "the engine ended the request without a result",
    ))
}

fn response(meta: &Meta, all: &[Collected], want_logprobs: bool) -> Value {
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(index, c)| choice(meta, index, c, want_logprobs))
        .collect();
    let summaries: Vec<&Summary> = all.iter().map(|c| &c.summary).collect();
    let first = summaries.first().map(|s| s.timings).unwrap_or_default();
    json!({
        "id": meta.id,
        "object": match meta.api { Api::Chat => "chat.completion", Api::Completion | Api::Native => "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": super::fingerprint(),
        "choices": choices,
        "usage": usage_all(&summaries),
        "timings": timings(&first),
    })
}

fn choice(meta: &Meta, index: usize, c: &Collected, want_logprobs: bool) -> Value {
    let finish = c.summary.finish.as_str();
    match meta.api {
        Api::Chat => {
            let (content, calls) = c.content_and_calls();
            let mut message = json!({"role": "assistant", "content": content});
            if let Some(r) = &c.reasoning {
                message["reasoning_content"] = json!(r);
            }
            let mut finish = finish;
            if !calls.is_empty() {
                // As OpenAI answers a call: no content unless the model
                // wrote some beside the calls.
                if content.is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = calls
                    .iter()
                    .map(|call| tools::openai_call(call, tools::call_id(call)))
                    .collect();
                finish = tools::finish_reason(c.summary.finish);
            }
            json!({
                "index": index,
                "message": message,
                "logprobs": want_logprobs.then(|| chat_logprobs(&c.logprobs)),
                "finish_reason": finish,
            })
        }
        Api::Completion | Api::Native => json!({
            "index": index,
            "text": c.text,
            "logprobs": want_logprobs.then(|| completion_logprobs(&c.logprobs)),
            "finish_reason": finish,
        }),
    }
}

/// The usage of a request's choices: the prompt once (every choice reads
/// the same one, as OpenAI counts it), the tokens of every choice.
pub fn usage_all(all: &[&Summary]) -> Value {
    let prompt = all.first().map_or(0, |s| s.prompt_tokens);
    let cached = all.first().map_or(0, |s| s.timings.cache_n);
    let completion: usize = all.iter().map(|s| s.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// llama-server's `timings` object.
pub fn timings(t: &Timings) -> Value {
    let per_token = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let mut v = json!({
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": per_token(t.prompt_ms, t.prompt_n),
        "prompt_per_second": t.prompt_per_second(),
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        // Per decode step, as llama-server: the first token took none.
        "predicted_per_token_ms": per_token(t.predicted_ms, t.decode_steps()),
        "predicted_per_second": t.predicted_per_second(),
    });
    // As llama-server: only where drafts were verified.
    if t.draft_n > 0 {
        v["draft_n"] = json!(t.draft_n);
        v["draft_n_accepted"] = json!(t.draft_n_accepted);
    }
    v
}

fn lp_entry(token: &[u8], logprob: f32) -> Value {
    json!({
        "token": String::from_utf8_lossy(token),
        "logprob": logprob,
        "bytes": token,
    })
}

/// OpenAI chat `logprobs`: `{content: [{token, logprob, bytes, top_logprobs}]}`.
pub fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = lp_entry(&lp.bytes, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|(_, b, l)| lp_entry(b, *l)).collect();
            e
        })
        .collect();
    json!({"content": content})
}

/// The legacy completions shape: parallel arrays.
pub fn completion_logprobs(lps: &[TokenLogprob]) -> Value {
    let mut offset = 0usize;
    let mut offsets = Vec::with_capacity(lps.len());
    for lp in lps {
        offsets.push(offset);
        offset += lp.bytes.len();
    }
    json!({
        "tokens": lps.iter().map(|lp| String::from_utf8_lossy(&lp.bytes).into_owned()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|lp| {
            lp.top.iter().map(|(_, b, l)| (String::from_utf8_lossy(b).into_owned(), json!(l))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}
