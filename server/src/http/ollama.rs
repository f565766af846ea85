//! Ollama's API, so the apps and libraries written against a local Ollama
//! work against Lamina unchanged: `POST /api/chat` and `/api/generate`
//! (NDJSON streaming, on by default as in Ollama), `GET /api/tags`,
//! `POST /api/show`, `GET /api/ps` and `GET /api/version`.
//!
//! Lamina serves one model, so every route answers for it whatever `model`
//! names (as the OpenAI routes do). Requests go through the OpenAI route's
//! checks and engine job: `options` become the sampling fields
//! (`num_predict` is `max_tokens`, `stop` the stop strings …), `format`
//! (`"json"` or a JSON schema) constrains the output as `response_format`
//! does (`structured.rs`), and chat messages render through the model's
//! own template. Options that only tune Ollama's runtime (`num_ctx`,
//! `num_gpu`, `num_thread` …) are accepted and logged as not applied: the
//! server's command line decides those. Images are a 400 that says so. Errors are Ollama's `{"error": "..."}`.
//!
//! A chat request with `tools` has its answer read for calls (`tools.rs`):
//! each call comes as `message.tool_calls: [{"function": {"name",
//! "arguments"}}]` with the arguments as an object, on the final message,
//! or streamed on a line of its own once it is complete.
//!
//! `think` (true, false, or a level such as `"high"`, which means true)
//! turns the template's `enable_thinking` on or off; absent, the server's
//! `--reasoning` decides. Reasoning read out of the answer
//! (`reasoning.rs`) comes as `message.thinking` (`/api/chat`) or
//! `thinking` (`/api/generate`), streamed on lines of its own before the
//! answer's.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body as HttpBody, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use lamina_chat::{Piece, ToolCall};
use lamina_engine::{Event, Events, FinishReason, ModelInfo, Summary};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::generate::{collect_with, job, render_chat_text};
use super::params::{self, Body, Sampling};
use super::reasoning::{Reader, Thinking};
use super::shutdown::{self, CutSignal};
use super::structured;
use super::tools::Calls;
use super::AppState;

/// An [`ApiError`] answered as Ollama answers errors: `{"error": "..."}`.
pub struct OllamaError(ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        let mut resp = self.0.clone().into_response();
        *resp.body_mut() = HttpBody::from(json!({"error": self.0.message}).to_string());
        resp.headers_mut().remove(header::CONTENT_LENGTH);
        *resp.status_mut() = status;
        resp
    }
}

type Result<T> = std::result::Result<T, OllamaError>;

fn invalid(param: impl Into<String>, msg: impl Into<String>) -> OllamaError {
    OllamaError(ApiError::invalid(param, msg))
}

/// Ollama's `think`: a boolean, or a level (`"high"`, `"medium"`,
/// `"low"`) that asks for thinking.
fn think(b: &Body) -> Result<Option<bool>> {
    match b.get("think") {
        None => Ok(None),
        Some(Value::Bool(on)) => Ok(Some(*on)),
        Some(Value::String(level)) if ["high", "medium", "low"].contains(&level.as_str()) => {
            Ok(Some(true))
        }
        Some(_) => Err(invalid(
            "think",
            "think must be a boolean or one of \"high\", \"medium\", \"low\"",
        )),
    }
}

/// Ollama's time stamps: RFC 3339 in UTC with nanoseconds.
fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// `options` keys that map onto a sampling field, and their OpenAI names.
const SAMPLING: [(&str, &str); 10] = [
    ("temperature", "temperature"),
    ("top_k", "top_k"),
    ("top_p", "top_p"),
    ("min_p", "min_p"),
    ("seed", "seed"),
    ("repeat_penalty", "repeat_penalty"),
    ("repeat_last_n", "repeat_last_n"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("stop", "stop"),
];

/// Options Ollama takes that tune its runtime, not the answer: the server's
/// own flags decide these here.
const RUNTIME: [&str; 12] = [
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "num_keep",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "vocab_only",
    "penalize_newline",
];

/// Sampling from Ollama's `options` and `format`, through the OpenAI
/// route's range checks.
fn sampling(st: &AppState, info: &ModelInfo, b: &Body) -> Result<Sampling> {
    let mut o = Map::new();
    // Ollama streams unless told otherwise.
    o.insert("stream".into(), json!(b.bool("stream")?.unwrap_or(true)));
    match b.get("options") {
        None | Some(Value::Null) => {}
        Some(Value::Object(opts)) => {
            let mut ignored = Vec::new();
            for (k, v) in opts {
                if let Some((_, to)) = SAMPLING.iter().find(|(from, _)| from == k) {
                    o.insert((*to).into(), v.clone());
                } else if k == "num_predict" {
                    // -1: until the context is full; -2: the same here.
                    match v.as_i64() {
                        Some(n) if n < 0 => {}
                        _ => {
                            o.insert("max_tokens".into(), v.clone());
                        }
                    }
                } else if RUNTIME.contains(&k.as_str()) {
                    ignored.push(k.as_str());
                } else {
                    return Err(invalid(
                        format!("options.{k}"),
                        format!("options.{k} is not an option this server knows"),
                    ));
                }
            }
            if !ignored.is_empty() {
                tracing::warn!(
                    "ollama options not applied (the command line sets them): {}",
                    ignored.join(", ")
                );
            }
        }
        Some(_) => return Err(invalid("options", "options must be an object")),
    }
    let format = structured::ollama_format(b.get("format"))?;
    let mut s = st.chat_sampling(info, o)?;
    s.wanted = format;
    Ok(s)
}

/// A 400 for a non-empty `images` list at `param`: no model Lamina serves
/// reads images (an empty list is what some clients always send).
fn refuse_images(images: Option<&Value>, param: &str) -> Result<()> {
    if images.is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) {
        return Err(invalid(
            param,
            "image input is not supported by this server",
        ));
    }
    Ok(())
}

/// Ollama chat messages as the template takes them: `images` refused,
/// `tool_calls` and tool results passed through.
fn chat_messages(b: &Body) -> Result<Value> {
    let list = match b.get("messages") {
        None | Some(Value::Null) => return Ok(Value::Array(Vec::new())),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(invalid("messages", "messages must be an array")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(invalid(
                format!("messages[{i}]"),
                format!("messages[{i}] must be an object"),
            ));
        };
        refuse_images(m.get("images"), &format!("messages[{i}].images"))?;
        let mut m = m.clone();
        m.remove("images");
        // Ollama's tool calls carry `arguments` as an object; the chat
        // templates written for OpenAI's shape read a JSON string.
        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
            for call in calls {
                if let Some(args) = call.pointer_mut("/function/arguments") {
                    if args.is_object() {
                        *args = Value::String(args.to_string());
                    }
                }
            }
        }
        out.push(Value::Object(m));
    }
    if out.is_empty() {
        return Ok(Value::Array(out));
    }
    // The OpenAI route's checks (roles, content shapes) on the result.
    let mut wrapped = Map::new();
    wrapped.insert("messages".into(), Value::Array(out));
    Ok(params::messages(&Body(wrapped))?)
}

/// Which route a request came to: the shape of each streamed line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Generate,
}

/// What every line of one answer repeats, and the final line's extras.
#[derive(Clone)]
struct Answer {
    route: Route,
    model: String,
    started: Instant,
    /// `/api/generate`: the prompt tokens, for the final `context`.
    context: Option<Vec<u32>>,
}

impl Answer {
    fn line(&self, text: &str) -> Value {
        let mut v = json!({"model": self.model, "created_at": now_rfc3339(), "done": false});
        match self.route {
            Route::Chat => v["message"] = json!({"role": "assistant", "content": text}),
            Route::Generate => v["response"] = json!(text),
        }
        v
    }

    /// A streamed line of reasoning.
    fn thinking_line(&self, text: &str) -> Value {
        let mut v = self.line("");
        match self.route {
            Route::Chat => v["message"]["thinking"] = json!(text),
            Route::Generate => v["thinking"] = json!(text),
        }
        v
    }

    /// A streamed line that carries a call (chat only).
    fn call_line(&self, call: &ToolCall) -> Value {
        let mut v = self.line("");
        v["message"]["tool_calls"] = tool_calls([call]);
        v
    }

    /// The last line: `done`, the reason, the counts and durations (ns).
    fn done(&self, text: &str, tokens: &[u32], s: &Summary) -> Value {
        let mut v = self.line(text);
        let ns = |ms: f64| (ms * 1e6).max(0.0) as u64;
        let t = &s.timings;
        v["done"] = json!(true);
        v["done_reason"] = json!(match s.finish {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        });
        v["total_duration"] = json!(self.started.elapsed().as_nanos() as u64);
        v["load_duration"] = json!(0);
        // The whole prompt, as Ollama counts it (a reused prefix included):
        // clients read it as the prompt's size.
        v["prompt_eval_count"] = json!(s.prompt_tokens);
        v["prompt_eval_duration"] = json!(ns(t.prompt_ms));
        v["eval_count"] = json!(s.completion_tokens);
        v["eval_duration"] = json!(ns(t.predicted_ms));
        if let Some(ctx) = &self.context {
            let all: Vec<u32> = ctx.iter().chain(tokens).copied().collect();
            v["context"] = json!(all);
        }
        v
    }
}

/// Ollama's `tool_calls`: the arguments stay an object.
fn tool_calls<'a>(calls: impl IntoIterator<Item = &'a ToolCall>) -> Value {
    calls
        .into_iter()
        .map(|c| json!({"function": {"name": c.name, "arguments": c.arguments}}))
        .collect()
}

async fn answer(
    st: &AppState,
    info: &Arc<ModelInfo>,
    prompt: Vec<u32>,
    s: &mut Sampling,
    a: Answer,
    calls: Option<Reader>,
) -> Result<Response> {
    structured::compile(st, info, s).await?;
    let param = match a.route {
        Route::Chat => "messages",
        Route::Generate => "prompt",
    };
    let rx = st
        .engine
        .submit(job(st, info, prompt, s, param)?)
        .map_err(ApiError::from)?;
    if s.stream {
        return Ok(ndjson(rx, a, st.cutoff.clone(), calls));
    }
    let done = collect_with(rx, st.cutoff.clone(), calls).await?;
    let (content, calls) = done.content_and_calls();
    let mut v = a.done(&content, &done.tokens, &done.summary);
    if !calls.is_empty() {
        v["message"]["tool_calls"] = tool_calls(calls);
    }
    if let Some(r) = &done.reasoning {
        match a.route {
            Route::Chat => v["message"]["thinking"] = json!(r),
            Route::Generate => v["thinking"] = json!(r),
        }
    }
    Ok(Json(v).into_response())
}

pub async fn chat(
    State(st): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let started = Instant::now();
    let info = st.ready()?;
    let b = Body::parse(&body.map_err(ApiError::from)?)?;
    let mut s = sampling(&st, &info, &b)?;
    let messages = chat_messages(&b)?;
    let tools = params::tools(&b)?.cloned();
    // Ollama has no `tool_choice`: tools given are tools the model may call.
    let calls = Calls::new(&info, tools.as_ref(), true);
    let thinking = Thinking::decide(&st, &info, None, think(&b)?, None)?;
    let (prompt, text) =
        render_chat_text(&st, &info, messages, tools, Some(thinking.kwargs(None))).await?;
    let calls = Reader::new(&info, &thinking, &text, calls);
    let a = Answer {
        route: Route::Chat,
        model: model_name(&st, &info),
        started,
        context: None,
    };
    answer(&st, &info, prompt, &mut s, a, calls).await
}

pub async fn generate(
    State(st): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let started = Instant::now();
    let info = st.ready()?;
    let b = Body::parse(&body.map_err(ApiError::from)?)?;
    let mut s = sampling(&st, &info, &b)?;
    refuse_images(b.get("images"), "images")?;
    for (field, what) in [
        ("suffix", "fill-in-the-middle (suffix)"),
        ("template", "a per-request template (Ollama's Go templates)"),
    ] {
        if b.str(field)?.is_some_and(|v| !v.is_empty()) {
            return Err(invalid(
                field,
                format!("{what} is not supported by this server"),
            ));
        }
    }
    let text = b.str("prompt")?.unwrap_or_default().to_owned();
    let model = model_name(&st, &info);
    if text.is_empty() {
        // Ollama's way to load a model: an empty prompt answers at once.
        return Ok(Json(json!({"model": model, "created_at": now_rfc3339(),
            "response": "", "done": true, "done_reason": "load"}))
        .into_response());
    }
    let context = match b.get("context") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => super::generate::token_ids(a, info.config.n_vocab, "context")?,
        Some(_) => return Err(invalid("context", "context must be an array of token ids")),
    };
    let thinking = Thinking::decide(&st, &info, None, think(&b)?, None)?;
    let (new, reader) = if b.bool("raw")?.unwrap_or(false) {
        let (info2, text) = (info.clone(), text);
        let tokens = st
            .prepare
            .run(move || Ok(info2.tokenizer.encode(&text, true, true)))
            .await?;
        // A raw prompt is the caller's own: nothing is read out of it.
        (tokens, None)
    } else {
        let mut messages = Vec::new();
        if let Some(system) = b.str("system")? {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": text}));
        let kwargs = Some(thinking.kwargs(None));
        let (tokens, rendered) =
            render_chat_text(&st, &info, Value::Array(messages), None, kwargs).await?;
        (tokens, Reader::new(&info, &thinking, &rendered, None))
    };
    let prompt: Vec<u32> = context.into_iter().chain(new).collect();
    let a = Answer {
        route: Route::Generate,
        model,
        started,
        context: Some(prompt.clone()),
    };
    answer(&st, &info, prompt, &mut s, a, reader).await
}

/// NDJSON lines as the engine's events arrive: one per piece of text (or
/// tool call), then the final line; an `{"error": ...}` line if the
/// request fails midway.
fn ndjson(rx: Events, a: Answer, cutoff: CutSignal, calls: Option<Reader>) -> Response {
    struct St {
        rx: Events,
        a: Answer,
        cutoff: CutSignal,
        tokens: Vec<u32>,
        ended: bool,
        calls: Option<Reader>,
    }
    impl St {
        /// The lines of an answer's pieces.
        fn lines(&self, pieces: Vec<Piece>) -> String {
            let mut out = String::new();
            for p in pieces {
                let line = match p {
                    Piece::Text(t) => self.a.line(&t),
                    Piece::Reasoning(t) => self.a.thinking_line(&t),
                    Piece::Call(c) => self.a.call_line(&c),
                };
                out.push_str(&format!("{line}\n"));
            }
            out
        }
    }
    let st = St {
        rx,
        a,
        cutoff,
        tokens: Vec::new(),
        ended: false,
        calls,
    };
    let lines = stream::unfold(st, |mut st| async move {
        loop {
            if st.ended {
                return None;
            }
            let ev = tokio::select! {
                ev = st.rx.recv() => ev,
                () = st.cutoff.cut() => {
                    st.ended = true;
                    let line = json!({"error": shutdown::error().message});
                    return Some((Ok::<_, std::convert::Infallible>(format!("{line}\n")), st));
                }
            };
            let line = match ev {
                Some(Event::Token { id, .. }) => {
                    st.tokens.push(id);
                    let lines = match &mut st.calls {
                        Some(c) => {
                            let pieces = c.token(id);
                            st.lines(pieces)
                        }
                        None => String::new(),
                    };
                    if lines.is_empty() {
                        continue;
                    }
                    return Some((Ok(lines), st));
                }
                // Ollama's API has no progress reports; none is asked for.
                Some(Event::Progress(_)) => continue,
                Some(Event::Text(t)) => match &mut st.calls {
                    Some(c) => {
                        let pieces = c.text(&t);
                        let lines = st.lines(pieces);
                        if lines.is_empty() {
                            continue;
                        }
                        return Some((Ok(lines), st));
                    }
                    None => st.a.line(&t),
                },
                Some(Event::Done(summary)) => {
                    st.ended = true;
                    let mut lines = match &mut st.calls {
                        Some(c) => {
                            let pieces = c.finish();
                            st.lines(pieces)
                        }
                        None => String::new(),
                    };
                    lines.push_str(&format!("{}\n", st.a.done("", &st.tokens, &summary)));
                    return Some((Ok(lines), st));
                }
                Some(Event::Error(e)) => {
                    st.ended = true;
                    json!({"error": ApiError::from(e).message})
                }
                None => {
                    st.ended = true;
                    json!({"error": "the engine ended the request without a result"})
                }
            };
            return Some((Ok(format!("{line}\n")), st));
        }
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        HttpBody::from_stream(lines),
    )
        .into_response()
}

fn model_name(st: &AppState, info: &ModelInfo) -> String {
    st.model_id(info)
}

/// llama.cpp's `general.file_type` (llama_ftype) as Ollama names the
/// quantization level.
fn quantization_level(file_type: Option<u64>) -> &'static str {
    match file_type {
        Some(0) => "F32",
        Some(1) => "F16",
        Some(2) => "Q4_0",
        Some(3) => "Q4_1",
        Some(7) => "Q8_0",
        Some(8) => "Q5_0",
        Some(9) => "Q5_1",
        Some(10) => "Q2_K",
        Some(11) => "Q3_K_S",
        Some(12) => "Q3_K_M",
        Some(13) => "Q3_K_L",
        Some(14) => "Q4_K_S",
        Some(15) => "Q4_K_M",
        Some(16) => "Q5_K_S",
        Some(17) => "Q5_K_M",
        Some(18) => "Q6_K",
        Some(19) => "IQ2_XXS",
        Some(20) => "IQ2_XS",
        Some(21) => "Q2_K_S",
        Some(22) => "IQ3_XS",
        Some(23) => "IQ3_XXS",
        Some(24) => "IQ1_S",
        Some(25) => "IQ4_NL",
        Some(26) => "IQ3_S",
        Some(27) => "IQ3_M",
        Some(28) => "IQ2_S",
        Some(29) => "IQ2_M",
        Some(30) => "IQ4_XS",
        Some(31) => "IQ1_M",
        Some(32) => "BF16",
        Some(36) => "TQ1_0",
        Some(37) => "TQ2_0",
        Some(38) => "MXFP4",
        _ => "unknown",
    }
}

/// `135M`, `1.2B`: parameters as Ollama shows them.
fn parameter_size(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else {
        format!("{:.0}M", n / 1e6)
    }
}

fn details(info: &ModelInfo) -> Value {
    let family = info.config.arch.name();
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": parameter_size(info.n_params),
        "quantization_level": quantization_level(info.file_type),
    })
}

fn modified_at(info: &ModelInfo) -> String {
    std::fs::metadata(&info.path)
        .and_then(|m| m.modified())
        .map(chrono::DateTime::<chrono::Utc>::from)
        .unwrap_or_else(|_| chrono::Utc::now())
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub async fn tags(State(st): State<Arc<AppState>>) -> Result<Response> {
    let info = st.ready()?;
    let name = model_name(&st, &info);
    Ok(Json(json!({"models": [{
        "name": name,
        "model": name,
        "modified_at": modified_at(&info),
        "size": info.size_bytes,
        "digest": "",
        "details": details(&info),
    }]}))
    .into_response())
}

pub async fn ps(State(st): State<Arc<AppState>>) -> Result<Response> {
    let info = st.ready()?;
    let name = model_name(&st, &info);
    // Loaded for as long as the server runs: a year from now stands for that.
    let expires = chrono::Utc::now() + chrono::Duration::days(365);
    Ok(Json(json!({"models": [{
        "name": name,
        "model": name,
        "size": info.size_bytes,
        "digest": "",
        "details": details(&info),
        "expires_at": expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "size_vram": 0,
        "context_length": info.n_ctx_slot,
    }]}))
    .into_response())
}

pub async fn show(State(st): State<Arc<AppState>>) -> Result<Response> {
    let info = st.ready()?;
    let c = &info.config;
    let arch = c.arch.name();
    let template = info.template.source().to_owned();
    let mut model_info = Map::new();
    let mut put = |k: String, v: Value| {
        model_info.insert(k, v);
    };
    put("general.architecture".into(), json!(arch));
    put("general.parameter_count".into(), json!(info.n_params));
    put(format!("{arch}.context_length"), json!(c.context_length));
    put(format!("{arch}.embedding_length"), json!(c.n_embd));
    put(format!("{arch}.block_count"), json!(c.n_layer));
    put(format!("{arch}.feed_forward_length"), json!(c.n_ff));
    put(format!("{arch}.attention.head_count"), json!(c.n_head));
    put(
        format!("{arch}.attention.head_count_kv"),
        json!(c.n_head_kv),
    );
    put(format!("{arch}.vocab_size"), json!(c.n_vocab));
    let mut capabilities = vec!["completion"];
    if template.contains("tools") {
        capabilities.push("tools");
    }
    let stop: Vec<String> = info
        .tokenizer
        .eog_ids()
        .filter_map(|id| info.tokenizer.token_text(id).map(str::to_owned))
        .collect();
    let parameters: String = stop
        .iter()
        .map(|s| format!("stop {}\n", json!(s)))
        .collect();
    Ok(Json(json!({
        "modelfile": format!("FROM {}\nTEMPLATE {}\n", info.path.display(), json!(template)),
        "parameters": parameters,
        "template": template,
        "details": details(&info),
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": modified_at(&info),
    }))
    .into_response())
}

pub async fn version() -> Response {
    // Lamina's own version: it is not Ollama, and says so.
    Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `/api/embed` and `/api/embeddings`: not served yet.
/// `POST /api/embed`: `input` a string or a list of strings, each answered
/// with one L2-normalized vector (as Ollama normalizes), pooled as the
/// server's `--pooling` says; `truncate` (default true) cuts an input to a
/// slot's context instead of refusing it.
pub async fn embed(
    State(st): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let started = Instant::now();
    let b = Body::parse(&body.map_err(ApiError::from)?)?;
    let info = st.ready()?;
    let pooling = ollama_pooling(&st, &info)?;
    let texts: Vec<String> = match b.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("input", "input must be a string or a list of strings"))?,
        Some(_) => {
            return Err(invalid(
                "input",
                "input must be a string or a non-empty list of strings",
            ))
        }
        None => return Err(invalid("input", "input is required")),
    };
    let truncate = b.bool("truncate")?.unwrap_or(true);
    let prompts = tokenize_inputs(&info, &texts, truncate)?;
    let (vectors, tokens) = super::embed::embed_prompts(&st, &info, prompts, pooling, 2).await?;
    let embeddings: Vec<Vec<f32>> = vectors.into_iter().filter_map(|mut v| v.pop()).collect();
    Ok(Json(json!({
        "model": b.str("model")?.map_or_else(|| st.model_id(&info), str::to_owned),
        "embeddings": embeddings,
        "total_duration": started.elapsed().as_nanos() as u64,
        "load_duration": 0,
        "prompt_eval_count": tokens,
    }))
    .into_response())
}

/// `POST /api/embeddings`, Ollama's older endpoint: one `prompt`, one
/// vector, not normalized (as Ollama answers it).
pub async fn embeddings(
    State(st): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let b = Body::parse(&body.map_err(ApiError::from)?)?;
    let info = st.ready()?;
    let pooling = ollama_pooling(&st, &info)?;
    let prompt = b
        .str("prompt")?
        .ok_or_else(|| invalid("prompt", "prompt is required"))?
        .to_owned();
    let prompts = tokenize_inputs(&info, &[prompt], true)?;
    let (mut vectors, _) = super::embed::embed_prompts(&st, &info, prompts, pooling, -1).await?;
    let v = vectors.pop().and_then(|mut v| v.pop()).unwrap_or_default();
    Ok(Json(json!({ "embedding": v })).into_response())
}

/// The server's pooling for Ollama's endpoints, which carry one vector per
/// input: pooling none cannot answer them.
fn ollama_pooling(st: &AppState, info: &ModelInfo) -> Result<lamina_engine::pooling::Pooling> {
    let pooling = super::embed::enabled(st, info)?;
    if pooling == lamina_engine::pooling::Pooling::None {
        return Err(invalid(
            "pooling",
            "this model names no pooling: start the server with --pooling mean, cls or last",
        ));
    }
    Ok(pooling)
}

/// Each text tokenized as a prompt; with `truncate`, cut to a slot's
/// context (keeping its start, as Ollama does).
fn tokenize_inputs(info: &ModelInfo, texts: &[String], truncate: bool) -> Result<Vec<Vec<u32>>> {
    texts
        .iter()
        .map(|t| {
            let mut ids = info.tokenizer.encode(t, true, true);
            if truncate {
                ids.truncate(info.n_ctx_slot);
            }
            Ok(ids)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_levels_read_as_ollama_shows_them() {
        assert_eq!(parameter_size(134_515_008), "135M");
        assert_eq!(parameter_size(8_030_261_248), "8.0B");
        assert_eq!(quantization_level(Some(15)), "Q4_K_M");
        assert_eq!(quantization_level(Some(3)), "Q4_1");
        assert_eq!(quantization_level(None), "unknown");
    }

    #[test]
    fn tool_call_arguments_become_json_strings_and_images_are_refused() {
        let Value::Object(m) = json!({"messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18 C"},
        ]}) else {
            panic!()
        };
        let Ok(m) = chat_messages(&Body(m)) else {
            panic!("refused")
        };
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        let Value::Object(img) = json!({"messages": [
            {"role": "user", "content": "what is this?", "images": ["AAAA"]}]})
        else {
            panic!()
        };
        let Err(OllamaError(e)) = chat_messages(&Body(img)) else {
            panic!("an image was accepted")
        };
        assert!(e.message.contains("image input is not supported"));
    }
}
