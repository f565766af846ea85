//! Anthropic's Messages API: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, so clients written for Claude (the
//! `anthropic` SDK, Claude-Code-style agents) talk to a local model.
//!
//! A request is translated into the chat messages the OpenAI route renders:
//! `system` (a string or text blocks) becomes the first message, text blocks
//! are joined, an assistant's `tool_use` blocks become `tool_calls`, a
//! user's `tool_result` blocks become `tool` messages, and `tools`
//! (`name`, `description`, `input_schema`) become OpenAI function tools for
//! the template. An assistant's `thinking` blocks reach the template as
//! `reasoning_content` (as llama-server passes them), for templates that
//! keep reasoning inside a tool loop. Images and documents are refused with a 400 that says so: no
//! model Lamina serves reads them. The answer is a text block, or, when the
//! request has `tools` (and `tool_choice` is not `none`) and the model
//! calls one, its text and a `tool_use` block per call (`id`, `name`,
//! `input`) with `stop_reason: "tool_use"`; streamed, each call is a
//! `tool_use` block whose input comes as one `input_json_delta` once the
//! call is complete (`tools.rs`).
//! `tool_choice` `any` or `tool` forces a call by grammar, and `none`
//! leaves the tools out of the prompt.
//!
//! Reasoning (`reasoning.rs`) comes first as a `thinking` block with an
//! empty `signature` (a local model has nothing to sign, as in
//! llama-server); streamed, as `thinking_delta`s and a `signature_delta`
//! before the block closes. The request's `thinking: {"type": "enabled"}`
//! or `{"type": "disabled"}` turns the template's `enable_thinking` on or
//! off; its `budget_tokens` is accepted and not enforced (thinking is not
//! cut short).
//!
//! Errors have Anthropic's shape, `{"type": "error", "error": {"type",
//! "message"}}`, with its error types. `x-api-key` is accepted for
//! `--api-key` as `Authorization: Bearer` is (mod.rs).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use lamina_chat::{Piece, ToolCall};
use lamina_engine::{Event, Events, FinishReason, ModelInfo, Summary};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::generate::{collect_with, job, render_chat_text};
use super::params::{Body, Sampling};
use super::reasoning::{Reader, Thinking};
use super::shutdown::{self, CutSignal};
use super::structured;
use super::tools::{forced, Calls, Choice};
use super::AppState;

/// An [`ApiError`] answered in Anthropic's error shape.
pub struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error `type` for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

fn error_body(e: &ApiError) -> Value {
    json!({
        "type": "error",
        "error": {"type": error_type(e.status), "message": e.message},
    })
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        // Keep whatever headers the OpenAI-shaped answer carries (Retry-After
        // on a 503), with Anthropic's body.
        let mut resp = self.0.clone().into_response();
        let body = error_body(&self.0).to_string();
        *resp.body_mut() = axum::body::Body::from(body);
        resp.headers_mut()
            .remove(axum::http::header::CONTENT_LENGTH);
        *resp.status_mut() = status;
        resp
    }
}

type Result<T> = std::result::Result<T, AnthropicError>;

fn invalid(param: impl Into<String>, msg: impl Into<String>) -> AnthropicError {
    AnthropicError(ApiError::invalid(param, msg))
}

/// The text of a `content` or `system` given as a string or as blocks; only
/// text blocks are allowed (`what` names the field in errors).
fn text_of(v: &Value, what: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                match (block_type(b), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => parts.push(t),
                    (ty, _) => return Err(unsupported_block(&format!("{what}[{j}]"), ty)),
                }
            }
            Ok(parts.concat())
        }
        Value::Null => Ok(String::new()),
        _ => Err(invalid(
            what,
            format!("{what} must be a string or an array of text blocks"),
        )),
    }
}

fn block_type(b: &Value) -> Option<&str> {
    b.get("type").and_then(Value::as_str)
}

fn unsupported_block(at: &str, ty: Option<&str>) -> AnthropicError {
    match ty {
        Some("image") => invalid(at, "image input is not supported by this server"),
        Some("document") => invalid(at, "document input is not supported by this server"),
        Some(t) => invalid(
            at,
            format!("{at}: content blocks of type {t:?} are not supported here"),
        ),
        None => invalid(at, format!("{at} must be a content block with a type")),
    }
}

/// The request's conversation as OpenAI-style chat messages.
fn messages(b: &Body) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    if let Some(system) = b.get("system") {
        let text = text_of(system, "system")?;
        if !text.is_empty() {
            out.push(json!({"role": "system", "content": text}));
        }
    }
    let list = match b.get("messages") {
        None => return Err(invalid("messages", "messages is required")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(invalid("messages", "messages must be an array")),
    };
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str);
        let role = match role {
            Some(r @ ("user" | "assistant")) => r,
            _ => {
                return Err(invalid(
                    format!("{at}.role"),
                    format!("{at}.role must be \"user\" or \"assistant\""),
                ))
            }
        };
        let content = m.get("content").unwrap_or(&Value::Null);
        let blocks = match content {
            Value::String(s) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            Value::Array(blocks) => blocks,
            _ => {
                return Err(invalid(
                    format!("{at}.content"),
                    format!("{at}.content must be a string or an array of content blocks"),
                ))
            }
        };
        let (mut text, mut calls, mut results) = (String::new(), Vec::new(), Vec::new());
        let mut thinking = String::new();
        for (j, block) in blocks.iter().enumerate() {
            let bat = format!("{at}.content[{j}]");
            match block_type(block) {
                Some("text") => match block.get("text").and_then(Value::as_str) {
                    Some(t) => text.push_str(t),
                    None => return Err(invalid(&bat, format!("{bat}.text must be a string"))),
                },
                // An assistant turn's reasoning goes to the template as
                // `reasoning_content`, as llama-server passes it: templates
                // that show reasoning (Qwen3's) keep it where it belongs,
                // after the last user turn in a tool loop, and drop the rest.
                Some("thinking") => {
                    if let Some(t) = block.get("thinking").and_then(Value::as_str) {
                        thinking.push_str(t);
                    }
                }
                // Encrypted reasoning: nothing a local template can show.
                Some("redacted_thinking") => {}
                Some("tool_use") if role == "assistant" => {
                    let name = block
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid(&bat, format!("{bat}.name must be a string")))?;
                    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                    calls.push(json!({
                        "id": block.get("id").cloned().unwrap_or(Value::Null),
                        "type": "function",
                        "function": {"name": name, "arguments": input.to_string()},
                    }));
                }
                Some("tool_result") if role == "user" => {
                    let content = block.get("content").unwrap_or(&Value::Null);
                    let mut result = text_of(content, &format!("{bat}.content"))?;
                    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                        result = format!("Error: {result}");
                    }
                    results.push(json!({
                        "role": "tool",
                        "tool_call_id": block.get("tool_use_id").cloned().unwrap_or(Value::Null),
                        "content": result,
                    }));
                }
                ty => return Err(unsupported_block(&bat, ty)),
            }
        }
        // Tool results answer the calls of the turn before, so they come
        // first; text the user wrote beside them follows.
        out.extend(results);
        let mut msg = if role == "assistant" && !calls.is_empty() {
            json!({"role": "assistant", "content": text, "tool_calls": calls})
        } else if !text.is_empty() || role == "assistant" {
            json!({"role": role, "content": text})
        } else {
            continue;
        };
        if role == "assistant" && !thinking.is_empty() {
            msg["reasoning_content"] = json!(thinking);
        }
        out.push(msg);
    }
    Ok(out)
}

/// Anthropic tools as the OpenAI function tools chat templates expect.
fn tools(b: &Body) -> Result<Option<Value>> {
    let list = match b.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(invalid("tools", "tools must be an array")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
            invalid(
                format!("tools[{i}].name"),
                format!("tools[{i}].name must be a string"),
            )
        })?;
        let mut function = Map::new();
        function.insert("name".into(), json!(name));
        if let Some(d) = t.get("description") {
            function.insert("description".into(), d.clone());
        }
        function.insert(
            "parameters".into(),
            t.get("input_schema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        );
        out.push(json!({"type": "function", "function": function}));
    }
    Ok((!out.is_empty()).then_some(Value::Array(out)))
}

/// Anthropic's `tool_choice`: `auto`, `none`, `any` (a call is required)
/// or `tool` with a name (that call is required); with
/// `disable_parallel_tool_use`, a required call is one call.
fn tool_choice(b: &Body) -> Result<(Choice, bool)> {
    let Some(choice) = b.get("tool_choice") else {
        return Ok((Choice::Auto, false));
    };
    let parallel = choice.get("disable_parallel_tool_use") != Some(&Value::Bool(true));
    match choice.get("type").and_then(Value::as_str) {
        Some("none") => Ok((Choice::None, false)),
        Some("auto") => Ok((Choice::Auto, parallel)),
        Some("any") => Ok((Choice::Required, parallel)),
        Some("tool") if choice.get("name").is_some_and(Value::is_string) => {
            let name = choice.get("name").and_then(Value::as_str).unwrap_or_default();
            Ok((Choice::Named(name.to_owned()), parallel))
        }
        _ => Err(invalid(
            "tool_choice",
            "tool_choice must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", \"name\": ...}",
        )),
    }
}

/// A `tool_use` block for a call.
fn tool_use(call: &ToolCall) -> Value {
    let id = call
        .id
        .clone()
        .unwrap_or_else(|| format!("toolu_{}", super::random_id()));
    json!({"type": "tool_use", "id": id, "name": call.name, "input": call.arguments})
}

/// The content blocks of an answer read for tool calls.
fn blocks(pieces: &[Piece]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => match out.last_mut() {
                Some(Value::Object(b)) if b.get("type").is_some_and(|v| v == "text") => {
                    let joined = format!("{}{t}", b["text"].as_str().unwrap_or_default());
                    b.insert("text".into(), json!(joined));
                }
                _ => out.push(json!({"type": "text", "text": t})),
            },
            Piece::Call(c) => out.push(tool_use(c)),
            Piece::Reasoning(_) => {}
        }
    }
    if out.is_empty() {
        out.push(json!({"type": "text", "text": ""}));
    }
    out
}

/// Anthropic's `thinking`: `enabled` or `disabled` (`None` when absent:
/// the server's `--reasoning` decides).
fn thinking_switch(b: &Body) -> Result<Option<bool>> {
    let Some(t) = b.get("thinking") else {
        return Ok(None);
    };
    match t.get("type").and_then(Value::as_str) {
        Some("enabled") => Ok(Some(true)),
        Some("disabled") => Ok(Some(false)),
        _ => Err(invalid(
            "thinking",
            "thinking must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
        )),
    }
}

/// The request's reasoning, and its prompt's tokens and text (rendered in
/// the bounded pool).
async fn prompt(
    st: &AppState,
    info: &Arc<ModelInfo>,
    b: &Body,
    tools: Option<Value>,
) -> Result<(Thinking, Vec<u32>, String)> {
    let messages = Value::Array(messages(b)?);
    let thinking = Thinking::decide(st, info, None, thinking_switch(b)?, None)?;
    let kwargs = thinking.kwargs(None);
    let (tokens, text) = render_chat_text(st, info, messages, tools, Some(kwargs)).await?;
    Ok((thinking, tokens, text))
}

/// Sampling from Anthropic's fields, through the OpenAI route's checks:
/// `max_tokens` is required, `stop_sequences` are stop strings.
fn sampling(st: &AppState, info: &ModelInfo, b: &Body) -> Result<Sampling> {
    let mut o = Map::new();
    match b.get("max_tokens") {
        Some(v) => {
            o.insert("max_tokens".into(), v.clone());
        }
        None => return Err(invalid("max_tokens", "max_tokens is required")),
    }
    for k in ["temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = b.get(k) {
            o.insert(k.into(), v.clone());
        }
    }
    match b.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(v @ Value::Array(a)) if a.iter().all(Value::is_string) => {
            o.insert("stop".into(), v.clone());
        }
        Some(_) => {
            return Err(invalid(
                "stop_sequences",
                "stop_sequences must be an array of strings",
            ))
        }
    }
    Ok(st.chat_sampling(info, o)?)
}

pub async fn messages_route(
    State(st): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let info = st.ready()?;
    let b = Body::parse(&body.map_err(ApiError::from)?)?;
    let mut s = sampling(&st, &info, &b)?;
    let (choice, parallel) = tool_choice(&b)?;
    let tools = tools(&b)?.filter(|_| choice.offers_tools());
    let calls = Calls::new(&info, tools.as_ref(), choice.offers_tools());
    let (thinking, tokens, text) = prompt(&st, &info, &b, tools.clone()).await?;
    let open = thinking.left_open(&text);
    if let Some(w) = forced(&info, tools.as_ref(), &choice, parallel, open)? {
        structured::add(&mut s, w)?;
    }
    structured::compile(&st, &info, &mut s).await?;
    let calls = Reader::new(&info, &thinking, &text, calls);
    let n_prompt = tokens.len();
    let rx = st
        .engine
        .submit(job(&st, &info, tokens, &s, "messages")?)
        .map_err(ApiError::from)?;
    let msg = Message {
        id: format!("msg_{}", super::random_id()),
        model: st.model_id(&info),
        stop: s.stop.clone(),
        info: info.clone(),
        n_prompt,
    };
    if s.stream {
        return Ok(sse(rx, msg, st.cutoff.clone(), calls).into_response());
    }
    let done = collect_with(rx, st.cutoff.clone(), calls).await?;
    let (mut reason, mut sequence) = msg.stop_reason(&done.text, &done.tokens, &done.summary);
    let mut content = match &done.pieces {
        Some(pieces) => {
            if pieces.iter().any(|p| matches!(p, Piece::Call(_))) && reason != "max_tokens" {
                (reason, sequence) = ("tool_use", Value::Null);
            }
            blocks(pieces)
        }
        None => vec![json!({"type": "text", "text": done.text})],
    };
    if let Some(r) = &done.reasoning {
        content.insert(
            0,
            json!({"type": "thinking", "thinking": r, "signature": ""}),
        );
    }
    Ok(Json(json!({
        "id": msg.id,
        "type": "message",
        "role": "assistant",
        "model": msg.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(&done.summary),
    }))
    .into_response())
}

pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let info = st.ready()?;
    let b = Body::parse(&body.map_err(ApiError::from)?)?;
    let (choice, _) = tool_choice(&b)?;
    let tools = tools(&b)?.filter(|_| choice.offers_tools());
    let (_, tokens, _) = prompt(&st, &info, &b, tools).await?;
    Ok(Json(json!({"input_tokens": tokens.len()})).into_response())
}

fn usage(s: &Summary) -> Value {
    json!({
        "input_tokens": s.prompt_tokens,
        "output_tokens": s.completion_tokens,
        "cache_read_input_tokens": s.timings.cache_n,
        "cache_creation_input_tokens": 0,
    })
}

/// What the response and every stream event of one request repeat.
struct Message {
    id: String,
    model: String,
    stop: Vec<String>,
    info: Arc<ModelInfo>,
    n_prompt: usize,
}

impl Message {
    /// `end_turn` for an end-of-generation token, `stop_sequence` (and
    /// which) when a stop string cut the text, `max_tokens` for the limit.
    fn stop_reason(&self, text: &str, tokens: &[u32], s: &Summary) -> (&'static str, Value) {
        if s.finish == FinishReason::Length {
            return ("max_tokens", Value::Null);
        }
        if tokens
            .last()
            .is_some_and(|&t| self.info.tokenizer.is_eog(t))
        {
            return ("end_turn", Value::Null);
        }
        // A stop string cut the text: the tokens run on past it into it.
        let whole = self.info.tokenizer.decode(tokens);
        let after = whole.get(text.len()..).unwrap_or_default();
        match self.stop.iter().find(|w| after.contains(w.as_str())) {
            Some(w) => ("stop_sequence", json!(w)),
            None => ("end_turn", Value::Null),
        }
    }
}

/// How often an idle stream gets a `ping` event.
const PING: Duration = Duration::from_secs(10);

struct StreamState {
    rx: Events,
    msg: Message,
    cutoff: CutSignal,
    out: VecDeque<SseEvent>,
    text: String,
    tokens: Vec<u32>,
    started: bool,
    ended: bool,
    /// The reader of the answer, when it is read for reasoning or calls.
    calls: Option<Reader>,
    /// The index of the text block open now.
    open_text: Option<usize>,
    /// The index of the thinking block open now.
    open_thinking: Option<usize>,
    /// Blocks started so far.
    n_blocks: usize,
    called: bool,
}

impl StreamState {
    fn push(&mut self, name: &str, data: Value) {
        self.out
            .push_back(SseEvent::default().event(name).data(data.to_string()));
    }

    /// The open text block's index, starting one if none is open.
    fn text_block(&mut self) -> usize {
        if let Some(i) = self.open_text {
            return i;
        }
        let i = self.n_blocks;
        self.n_blocks += 1;
        self.open_text = Some(i);
        self.push(
            "content_block_start",
            json!({"type": "content_block_start", "index": i,
                   "content_block": {"type": "text", "text": ""}}),
        );
        i
    }

    fn text_delta(&mut self, text: &str) {
        self.close_thinking();
        let i = self.text_block();
        self.push(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i,
                   "delta": {"type": "text_delta", "text": text}}),
        );
    }

    fn thinking_delta(&mut self, text: &str) {
        let i = match self.open_thinking {
            Some(i) => i,
            None => {
                self.close_text();
                let i = self.n_blocks;
                self.n_blocks += 1;
                self.open_thinking = Some(i);
                self.push(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i,
                           "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                );
                i
            }
        };
        self.push(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i,
                   "delta": {"type": "thinking_delta", "thinking": text}}),
        );
    }

    /// Anthropic's clients expect a `signature_delta` before a thinking
    /// block closes; a local model's signature is empty.
    fn close_thinking(&mut self) {
        if let Some(i) = self.open_thinking.take() {
            self.push(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": i,
                       "delta": {"type": "signature_delta", "signature": ""}}),
            );
            self.push(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            );
        }
    }

    fn close_text(&mut self) {
        if let Some(i) = self.open_text.take() {
            self.push(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            );
        }
    }

    /// Pieces of an answer read for calls: text deltas, and a `tool_use`
    /// block per call with its whole input as one delta.
    fn pieces(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p {
                Piece::Text(t) => self.text_delta(&t),
                Piece::Reasoning(t) => self.thinking_delta(&t),
                Piece::Call(call) => {
                    self.close_thinking();
                    self.close_text();
                    self.called = true;
                    let i = self.n_blocks;
                    self.n_blocks += 1;
                    let mut block = tool_use(&call);
                    block["input"] = json!({});
                    self.push(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": i, "content_block": block}),
                    );
                    self.push(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                               "delta": {"type": "input_json_delta",
                                         "partial_json": call.arguments_json()}}),
                    );
                    self.push(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    );
                }
            }
        }
    }

    fn error(&mut self, e: &ApiError) {
        self.push("error", error_body(e));
        self.ended = true;
    }
}

/// The stream's events in Anthropic's order: `message_start`, one text
/// block (`content_block_start`, a `content_block_delta` per piece of
/// text, `content_block_stop`), `message_delta` with the stop reason and
/// usage, `message_stop`; an `error` event if the request fails midway.
/// An answer read for tool calls opens its text block when text comes, and
/// a `tool_use` block after it for each call.
fn sse(
    rx: Events,
    msg: Message,
    cutoff: CutSignal,
    calls: Option<Reader>,
) -> Sse<impl futures_util::Stream<Item = std::result::Result<SseEvent, Infallible>>> {
    let st = StreamState {
        rx,
        msg,
        cutoff,
        out: VecDeque::new(),
        text: String::new(),
        tokens: Vec::new(),
        started: false,
        ended: false,
        calls,
        open_text: None,
        open_thinking: None,
        n_blocks: 0,
        called: false,
    };
    let events = stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.out.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.ended {
                return None;
            }
            if !st.started {
                st.started = true;
                let start = json!({
                    "type": "message_start",
                    "message": {
                        "id": st.msg.id, "type": "message", "role": "assistant",
                        "model": st.msg.model, "content": [],
                        "stop_reason": null, "stop_sequence": null,
                        "usage": {"input_tokens": st.msg.n_prompt, "output_tokens": 0},
                    },
                });
                st.push("message_start", start);
                if st.calls.is_none() {
                    st.text_block();
                }
                continue;
            }
            let ev = tokio::select! {
                ev = st.rx.recv() => ev,
                () = st.cutoff.cut() => {
                    st.error(&shutdown::error());
                    continue;
                }
            };
            match ev {
                Some(Event::Token { id, .. }) => {
                    st.tokens.push(id);
                    if let Some(c) = &mut st.calls {
                        let pieces = c.token(id);
                        st.pieces(pieces);
                    }
                }
                // This API has no progress reports; none is asked for.
                Some(Event::Progress(_)) => {}
                Some(Event::Text(text)) => {
                    st.text.push_str(&text);
                    match &mut st.calls {
                        Some(c) => {
                            let pieces = c.text(&text);
                            st.pieces(pieces);
                        }
                        None => st.text_delta(&text),
                    }
                }
                Some(Event::Done(summary)) => {
                    let (mut reason, mut sequence) =
                        st.msg.stop_reason(&st.text, &st.tokens, &summary);
                    if let Some(c) = &mut st.calls {
                        let pieces = c.finish();
                        st.pieces(pieces);
                    }
                    if st.called && reason != "max_tokens" {
                        (reason, sequence) = ("tool_use", Value::Null);
                    }
                    st.close_thinking();
                    // An answer with no text and no call still has its block.
                    if st.n_blocks == 0 {
                        st.text_block();
                    }
                    st.close_text();
                    st.push(
                        "message_delta",
                        json!({"type": "message_delta",
                               "delta": {"stop_reason": reason, "stop_sequence": sequence},
                               "usage": usage(&summary)}),
                    );
                    st.push("message_stop", json!({"type": "message_stop"}));
                    st.ended = true;
                }
                Some(Event::Error(e)) => st.error(&ApiError::from(e)),
                None => st.error(&ApiError::internal(
                    "the engine ended the request without a result",
                )),
            }
        }
    });
    Sse::new(events).keep_alive(
        KeepAlive::new().interval(PING).event(
            SseEvent::default()
                .event("ping")
                .data(json!({"type": "ping"}).to_string()),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Body {
        let Value::Object(m) = v else { panic!() };
        Body(m)
    }

    #[test]
    fn a_conversation_with_tools_becomes_chat_messages() {
        let b = body(json!({
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather "},
                                             {"type": "text", "text": "in Paris?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call the tool", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather",
                     "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1",
                     "content": [{"type": "text", "text": "18 C"}]},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "no",
                     "is_error": true},
                    {"type": "text", "text": "Thanks"}]},
            ],
        }));
        let m = messages(&b).unwrap_or_else(|_| panic!("translation failed"));
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[1],
            json!({"role": "user", "content": "Weather in Paris?"})
        );
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(m[2]["reasoning_content"], "call the tool");
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "t1", "content": "18 C"})
        );
        assert_eq!(m[4]["content"], "Error: no");
        assert_eq!(m[5], json!({"role": "user", "content": "Thanks"}));
        assert_eq!(m.len(), 6);
    }

    #[test]
    fn images_and_unknown_roles_are_refused_with_anthropic_errors() {
        let img = body(json!({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}));
        let Err(AnthropicError(e)) = messages(&img) else {
            panic!("an image was accepted")
        };
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.contains("image input is not supported"),
            "{}",
            e.message
        );
        assert_eq!(error_body(&e)["error"]["type"], "invalid_request_error");
        assert_eq!(error_body(&e)["type"], "error");

        let role = body(json!({"messages": [{"role": "system", "content": "x"}]}));
        assert!(messages(&role).is_err());
        assert!(messages(&body(json!({}))).is_err());
        // An empty conversation is accepted, as llama-server accepts it.
        assert_eq!(
            messages(&body(json!({"messages": []})))
                .ok()
                .map(|m| m.len()),
            Some(0)
        );
    }

    #[test]
    fn tools_become_function_tools() {
        let b = body(json!({"tools": [{"name": "f", "description": "d",
            "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}]}));
        let t = tools(&b).ok().flatten().unwrap_or(Value::Null);
        assert_eq!(t[0]["type"], "function");
        assert_eq!(t[0]["function"]["name"], "f");
        assert_eq!(
            t[0]["function"]["parameters"]["properties"]["a"]["type"],
            "string"
        );
        assert!(tools(&body(json!({"tools": [{"description": "no name"}]}))).is_err());
    }

    #[test]
    fn error_types_follow_the_status() {
        assert_eq!(error_type(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(
            error_type(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error"
        );
        assert_eq!(error_type(StatusCode::INTERNAL_SERVER_ERROR), "api_error");
    }
}
