//! `POST /v1/responses` (and `/responses`): OpenAI's Responses API, as
//! llama-server serves it: stateless, so `previous_response_id` is a 400
//! that names it and every request carries its whole conversation.
//!
//! A request becomes the chat route's messages and fields: `instructions`
//! is the system message; `input` is a string (one user turn) or a list of
//! items: messages (`role`, `content` as a string or `input_text` /
//! `output_text` parts), `function_call` items (joined to the assistant
//! turn before them as its `tool_calls`), `function_call_output` items
//! (`tool` messages) and `reasoning` items (the assistant turn's
//! `reasoning_content`). `tools` are flat function tools (`name`,
//! `description`, `parameters`), `max_output_tokens` is `max_tokens`,
//! `reasoning.effort: "none"` turns thinking off. It then goes through the
//! chat route's checks, template and job, and the answer is read for
//! reasoning and calls (`reasoning.rs`).
//!
//! The response's `output` holds a `reasoning` item, `message` items of
//! `output_text`, and a `function_call` item per call, in the order the
//! model wrote them; `status` is `incomplete` (with
//! `incomplete_details.reason: "max_output_tokens"`) when the limit cut
//! the answer. Streamed, the events are OpenAI's: `response.created`,
//! `response.in_progress`, then per item `response.output_item.added`,
//! its content events (`response.content_part.added`,
//! `response.output_text.delta` …, `response.reasoning_text.delta`,
//! `response.function_call_arguments.delta`) and their `…done` events,
//! `response.output_item.done`, and last `response.completed` (or
//! `response.incomplete`) with the whole response. As in llama-server, the
//! last event also carries `timings`; with `return_progress`, more
//! `response.in_progress` events carry `prompt_progress`, and with
//! `timings_per_token` each `response.output_text.delta` the timings so far.

mod wire;

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
use lamina_engine::{Event, Events, Summary, Timings};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::generate::{collect_with, job, render_chat_text, timings};
use super::params::{self, Body, Sampling};
use super::reasoning::{self, Reader, Thinking};
use super::shutdown::{self, CutSignal};
use super::stream::progress;
use super::tools::{self, Calls};
use super::AppState;
use wire::{Output, ResponseObject, StreamEvent, Usage};

/// How often an idle stream gets a comment line.
const PING: Duration = Duration::from_secs(10);

pub async fn create(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let b = Body::parse(&body?)?;
    if b.str("previous_response_id")?
        .is_some_and(|id| !id.is_empty())
    {
        return Err(ApiError::invalid(
            "previous_response_id",
            "previous_response_id is not supported: this server keeps no responses; \
             send the whole conversation in input",
        ));
    }
    let mut s = sampling(&st, &info, &b)?;
    let messages = messages(&b)?;
    let choice = tools::openai_choice(tool_choice(&b)?.as_ref())?;
    // As on the chat route: "none" leaves the tools out of the prompt,
    // "required" and a named function force a call.
    let tools = tools(&b)?.filter(|_| choice.offers_tools());
    let parallel = b.bool("parallel_tool_calls")?.unwrap_or(false);
    let effort = b.get("reasoning").and_then(|r| r.get("effort"));
    let asked = reasoning::effort_switch(effort)?;
    let thinking = Thinking::decide(&st, &info, None, asked, b.get("reasoning_format"))?;
    let kwargs = thinking.kwargs(None);
    let (prompt, text) =
        render_chat_text(&st, &info, messages, tools.clone(), Some(kwargs)).await?;
    let open = thinking.left_open(&text);
    if let Some(w) = tools::forced(&info, tools.as_ref(), &choice, parallel, open)? {
        super::structured::add(&mut s, w)?;
    }
    super::structured::compile(&st, &info, &mut s).await?;
    let calls = Calls::new(&info, tools.as_ref(), choice.offers_tools());
    let reader = Reader::new(&info, &thinking, &text, calls);
    let rx = st.engine.submit(job(&st, &info, prompt, &s, "input")?)?;
    let head = Head {
        id: format!("resp_{}", super::random_id()),
        created_at: super::unix_time(),
        model: st.model_id(&info),
        instructions: b.str("instructions")?.map(str::to_owned),
        max_output_tokens: s.max_tokens,
        temperature: s.sampler.temperature,
        top_p: s.sampler.top_p,
        tools: b
            .get("tools")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        tool_choice: b.get("tool_choice").cloned().unwrap_or(json!("auto")),
        parallel_tool_calls: parallel,
    };
    if s.stream {
        return Ok(sse(rx, head, reader, st.cutoff.clone()).into_response());
    }
    // The answer is always read, so text comes back as pieces.
    let reader = reader.or_else(|| Some(Reader::plain()));
    let done = collect_with(rx, st.cutoff.clone(), reader).await?;
    let mut out = Output::new();
    for p in done.pieces.unwrap_or_default() {
        out.piece(p);
    }
    out.close();
    Ok(Json(head.response(out.items, Some(&done.summary))).into_response())
}

/// Sampling from the Responses fields, through the chat route's checks.
fn sampling(
    st: &AppState,
    info: &lamina_engine::ModelInfo,
    b: &Body,
) -> Result<Sampling, ApiError> {
    let mut o = Map::new();
    // llama-server's own fields, which its Responses route also reads.
    for k in [
        "temperature",
        "top_p",
        "stream",
        "seed",
        "top_k",
        "min_p",
        "return_progress",
        "timings_per_token",
    ] {
        if let Some(v) = b.get(k) {
            o.insert(k.into(), v.clone());
        }
    }
    if let Some(v) = b.get("max_output_tokens") {
        o.insert("max_tokens".into(), v.clone());
    }
    // `text.format` is the chat route's `response_format`.
    if let Some(format) = b.get("text").and_then(|t| t.get("format")) {
        o.insert("response_format".into(), format.clone());
    }
    st.chat_sampling(info, o).map_err(|mut e| {
        // Name the field as this API spells it.
        if e.param.as_deref() == Some("max_tokens") {
            e.param = Some("max_output_tokens".into());
            e.message = e.message.replace("max_tokens", "max_output_tokens");
        }
        e
    })
}

/// The text of a message's `content`: a string, or text parts
/// (`input_text`, `output_text`; `refusal` as its text).
fn content_text(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let pat = format!("{at}[{j}]");
                let ty = part.get("type").and_then(Value::as_str);
                let field = match ty {
                    Some("input_text" | "output_text" | "text") => "text",
                    Some("refusal") => "refusal",
                    Some("input_image") => {
                        return Err(ApiError::invalid(
                            pat,
                            "image input is not supported by this server",
                        ))
                    }
                    Some("input_file") => {
                        return Err(ApiError::invalid(
                            pat,
                            "file input is not supported by this server",
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &pat,
                            format!("{pat}.type must be \"input_text\" or \"output_text\""),
                        ))
                    }
                };
                let t = part.get(field).and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid(&pat, format!("{pat}.{field} must be a string"))
                })?;
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid(
            at,
            format!("{at} must be a string or an array of content parts"),
        )),
    }
}

/// The assistant turn that a call or reasoning item joins: the last
/// message when it is an assistant's, else a new one.
fn assistant_turn(out: &mut Vec<Map<String, Value>>) -> &mut Map<String, Value> {
    let last_is_assistant = out
        .last()
        .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
    if !last_is_assistant {
        // Empty rather than null content: many templates concatenate it
        // (llama.cpp makes the same substitution).
        let mut m = Map::new();
        m.insert("role".into(), json!("assistant"));
        m.insert("content".into(), json!(""));
        out.push(m);
    }
    let last = out.len() - 1;
    &mut out[last]
}

/// A message as a map (what [`json!`] of an object gives).
fn message(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The conversation as chat messages, checked as the chat route checks
/// them.
fn messages(b: &Body) -> Result<Value, ApiError> {
    let mut out: Vec<Map<String, Value>> = Vec::new();
    if let Some(system) = b.str("instructions")? {
        out.push(message(json!({"role": "system", "content": system})));
    }
    match b.get("input") {
        None => return Err(ApiError::invalid("input", "input is required")),
        Some(Value::String(s)) => out.push(message(json!({"role": "user", "content": s}))),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                input_item(&mut out, item, &format!("input[{i}]"))?;
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "input",
                "input must be a string or an array of input items",
            ))
        }
    }
    let mut wrapped = Map::new();
    let out = out.into_iter().map(Value::Object).collect();
    wrapped.insert("messages".into(), Value::Array(out));
    params::messages(&Body(wrapped)).map_err(|mut e| {
        if let Some(p) = &e.param {
            e.param = Some(p.replace("messages", "input"));
        }
        e
    })
}

fn input_item(out: &mut Vec<Map<String, Value>>, item: &Value, at: &str) -> Result<(), ApiError> {
    let str_field = |name: &str| -> Result<&str, ApiError> {
        item.get(name).and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(
                format!("{at}.{name}"),
                format!("{at}.{name} must be a string"),
            )
        })
    };
    let ty = item.get("type").and_then(Value::as_str);
    match (ty, item.get("role").and_then(Value::as_str)) {
        (None | Some("message"), Some(role)) => {
            let role = match role {
                "user" | "system" | "developer" | "assistant" => role,
                _ => {
                    return Err(ApiError::invalid(
                        format!("{at}.role"),
                        format!(
                            "{at}.role must be \"user\", \"system\", \"developer\" or \"assistant\""
                        ),
                    ))
                }
            };
            let content = content_text(
                item.get("content").unwrap_or(&Value::Null),
                &format!("{at}.content"),
            )?;
            out.push(message(json!({"role": role, "content": content})));
        }
        (Some("function_call"), _) => {
            let call = json!({
                "id": str_field("call_id")?,
                "type": "function",
                "function": {"name": str_field("name")?, "arguments": str_field("arguments")?},
            });
            let turn = assistant_turn(out);
            match turn.get_mut("tool_calls") {
                Some(Value::Array(calls)) => calls.push(call),
                _ => {
                    turn.insert("tool_calls".into(), json!([call]));
                }
            }
        }
        (Some("function_call_output"), _) => {
            let output = match item.get("output") {
                Some(v @ (Value::String(_) | Value::Array(_))) => {
                    content_text(v, &format!("{at}.output"))?
                }
                _ => {
                    return Err(ApiError::invalid(
                        format!("{at}.output"),
                        format!("{at}.output must be a string or an array of input_text parts"),
                    ))
                }
            };
            out.push(message(
                json!({"role": "tool", "tool_call_id": str_field("call_id")?,
                                    "content": output}),
            ));
        }
        (Some("reasoning"), _) => {
            // Its text, else its summary's.
            let texts = |field: &str| -> String {
                item.get(field)
                    .and_then(Value::as_array)
                    .map(|parts| {
                        parts
                            .iter()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .unwrap_or_default()
            };
            let mut text = texts("content");
            if text.is_empty() {
                text = texts("summary");
            }
            if !text.is_empty() {
                assistant_turn(out).insert("reasoning_content".into(), json!(text));
            }
        }
        (Some(other), _) => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!(
                    "{at}.type {other:?} is not supported (messages, function_call, \
                     function_call_output and reasoning items are)"
                ),
            ))
        }
        (None, None) => {
            return Err(ApiError::invalid(
                at,
                format!("{at} must be a message (with a role) or an item with a type"),
            ))
        }
    }
    Ok(())
}

/// Flat Responses function tools (`{"type": "function", "name", ...}`) as
/// the chat route's (`{"type": "function", "function": {...}}`).
fn tools(b: &Body) -> Result<Option<Value>, ApiError> {
    let list = match b.get("tools") {
        None => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("tools", "tools must be an array")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!("{at}.type {other:?} is not supported: only function tools are"),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!("{at}.type must be \"function\""),
                ))
            }
        }
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            return Err(ApiError::invalid(
                format!("{at}.name"),
                format!("{at}.name must be a string"),
            ));
        };
        let mut function = Map::new();
        function.insert("name".into(), json!(name));
        for k in ["description", "parameters", "strict"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                function.insert(k.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok((!out.is_empty()).then_some(Value::Array(out)))
}

/// The Responses `tool_choice` in the chat route's shape: a named
/// function is `{"type": "function", "name": ...}` here.
fn tool_choice(b: &Body) -> Result<Option<Value>, ApiError> {
    Ok(match b.get("tool_choice") {
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o.get("name") {
                Some(name) => Some(json!({"type": "function", "function": {"name": name}})),
                None => Some(Value::Object(o.clone())),
            }
        }
        other => other.cloned(),
    })
}

/// What the response object repeats besides its output.
struct Head {
    id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<usize>,
    temperature: f32,
    top_p: f32,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
}

impl Head {
    /// The response with `output`; `done` is the summary once finished
    /// (`None` while in progress).
    fn response(&self, output: Vec<wire::OutputItem>, done: Option<&Summary>) -> ResponseObject {
        let (status, incomplete) = match done {
            Some(s) => wire::status(s.finish),
            None => ("in_progress", None),
        };
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            completed_at: done.map(|_| super::unix_time()),
            status,
            incomplete_details: incomplete,
            error: None,
            model: self.model.clone(),
            instructions: self.instructions.clone(),
            max_output_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            tools: self.tools.clone(),
            tool_choice: self.tool_choice.clone(),
            parallel_tool_calls: self.parallel_tool_calls,
            previous_response_id: None,
            store: false,
            output,
            usage: done.map(Usage::of),
        }
    }
}

struct StreamState {
    rx: Events,
    head: Head,
    reader: Option<Reader>,
    output: Output,
    cutoff: CutSignal,
    out: VecDeque<SseEvent>,
    started: bool,
    ended: bool,
    /// The timings the last token came with (`timings_per_token`).
    timings: Option<Timings>,
}

impl StreamState {
    fn send(&mut self, ev: &StreamEvent) {
        self.send_with(ev, Map::new());
    }

    /// `ev` with llama-server's own fields beside OpenAI's
    /// (`prompt_progress`, `timings`).
    fn send_with(&mut self, ev: &StreamEvent, extra: Map<String, Value>) {
        let mut data = serde_json::to_value(ev).unwrap_or_default();
        if let Value::Object(o) = &mut data {
            o.extend(extra);
        }
        self.out
            .push_back(SseEvent::default().event(ev.name()).data(data.to_string()));
    }

    fn flush(&mut self) {
        for ev in self.output.take_events() {
            let mut extra = Map::new();
            if let (StreamEvent::TextDelta { .. }, Some(t)) = (&ev, &self.timings) {
                extra.insert("timings".into(), timings(t));
            }
            self.send_with(&ev, extra);
        }
    }

    fn error(&mut self, e: &ApiError) {
        self.out.push_back(
            SseEvent::default().event("error").data(
                json!({
                    "type": "error",
                    "sequence_number": self.output.seq(),
                    "code": e.code,
                    "message": e.message,
                    "param": e.param,
                })
                .to_string(),
            ),
        );
        self.ended = true;
    }
}

fn sse(
    rx: Events,
    head: Head,
    reader: Option<Reader>,
    cutoff: CutSignal,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let st = StreamState {
        rx,
        head,
        // The answer is always read, so text comes as pieces.
        reader: reader.or_else(|| Some(Reader::plain())),
        output: Output::new(),
        cutoff,
        out: VecDeque::new(),
        started: false,
        timings: None,
        ended: false,
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
                let response = st.head.response(Vec::new(), None);
                let s = st.output.seq();
                st.send(&StreamEvent::Created {
                    sequence_number: s,
                    response: response.clone(),
                });
                let s = st.output.seq();
                st.send(&StreamEvent::InProgress {
                    sequence_number: s,
                    response,
                });
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
                Some(Event::Token { id, timings: t, .. }) => {
                    if t.is_some() {
                        st.timings = t;
                    }
                    if let Some(r) = &mut st.reader {
                        for p in r.token(id) {
                            st.output.piece(p);
                        }
                    }
                    st.flush();
                }
                // llama-server's report: an in_progress event with
                // `prompt_progress` (and the timings when asked).
                Some(Event::Progress(p)) => {
                    let response = st.head.response(Vec::new(), None);
                    let s = st.output.seq();
                    let mut extra = Map::new();
                    extra.insert("prompt_progress".into(), progress(&p));
                    if let Some(t) = &p.timings {
                        extra.insert("timings".into(), timings(t));
                    }
                    st.send_with(
                        &StreamEvent::InProgress {
                            sequence_number: s,
                            response,
                        },
                        extra,
                    );
                }
                Some(Event::Text(text)) => {
                    if let Some(r) = &mut st.reader {
                        for p in r.text(&text) {
                            st.output.piece(p);
                        }
                    }
                    st.flush();
                }
                Some(Event::Done(summary)) => {
                    if let Some(r) = &mut st.reader {
                        for p in r.finish() {
                            st.output.piece(p);
                        }
                    }
                    st.output.close();
                    st.flush();
                    let response = st.head.response(st.output.items.clone(), Some(&summary));
                    let s = st.output.seq();
                    let last = if response.status == "completed" {
                        StreamEvent::Completed {
                            sequence_number: s,
                            response,
                        }
                    } else {
                        StreamEvent::Incomplete {
                            sequence_number: s,
                            response,
                        }
                    };
                    let mut extra = Map::new();
                    extra.insert("timings".into(), timings(&summary.timings));
                    st.send_with(&last, extra);
                    st.ended = true;
                }
                Some(Event::Error(e)) => st.error(&ApiError::from(e)),
                None => st.error(&ApiError::internal(
                    "the engine ended the request without a result",
                )),
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(PING).text("ping"))
}

#[cfg(test)]
mod tests;
