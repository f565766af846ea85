//! Server-sent events for `stream: true`, in OpenAI's order: a role delta
//! first (chat), one chunk per piece of text (never a split UTF-8
//! character: the engine only sends whole ones), a final chunk with
//! `finish_reason` (and llama-server's `timings`), the usage chunk when
//! `stream_options.include_usage` asks for it, then `data: [DONE]`. Comment
//! pings keep an idle connection open while a request waits in the queue.
//!
//! When the request's tools have the answer read for calls (`tools.rs`),
//! text streams as it becomes certain not to be part of a call, and each
//! call comes as one `delta.tool_calls` chunk (`index`, `id`, `type`,
//! `function.name` and the whole `function.arguments`) once it is complete;
//! the final chunk then says `finish_reason: "tool_calls"`. Reasoning
//! split off the answer (`reasoning.rs`) streams as `delta.reasoning_content`
//! chunks before the content.
//!
//! With llama-server's `return_progress`, chunks with an empty delta and
//! `prompt_progress` (`total`, `cache`, `processed`, `time_ms`) report the
//! prompt's processing before the first token: one when it starts, then
//! one after each chunk of the prompt.
//!
//! With `timings_per_token`, each chunk after a token (and each progress
//! chunk) carries llama-server's `timings` so far.
//!
//! A request with `n` > 1 streams its choices interleaved as their tokens
//! come, each chunk carrying its choice's `index`; every choice ends with
//! its own `finish_reason` chunk, and the usage chunk and `[DONE]` follow
//! the last.
//!
//! The stream owns the request's event receiver: when the client goes away,
//! axum drops the stream, the receiver closes, and the engine frees the
//! slot at its next step. When the shutdown grace runs out, the stream ends
//! with a final error event (code `server_shutting_down`) and `[DONE]`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use lamina_chat::Piece;
use lamina_engine::{Event, Events, Progress, Summary, Timings, TokenLogprob};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::generate::{chat_logprobs, completion_logprobs, timings, usage_all, Meta};
use super::params::Api;
use super::reasoning::Reader;
use super::shutdown::{self, CutSignal};
use super::tools;

/// How often an idle stream gets a comment line.
const PING: Duration = Duration::from_secs(10);

/// One choice's progress.
struct Choice {
    /// Log-probs of tokens whose text has not been sent yet.
    logprobs: Vec<TokenLogprob>,
    /// The reader of the answer, when it is read for reasoning or calls.
    reader: Option<Reader>,
    /// Tool calls sent so far.
    n_calls: usize,
    /// The timings the last token came with (`timings_per_token`), for
    /// the next chunk.
    timings: Option<Timings>,
    done: Option<Summary>,
}

struct State {
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    meta: Meta,
    include_usage: bool,
    want_logprobs: bool,
    choices: Vec<Choice>,
    out: VecDeque<SseEvent>,
    started: bool,
    ended: bool,
    cutoff: CutSignal,
}

/// The events of every choice on one channel, each with its index. A
/// forwarder ends when its choice ends or when the stream is dropped (the
/// client went away), and dropping its receiver cancels the choice.
fn merge(rxs: Vec<Events>) -> mpsc::UnboundedReceiver<(usize, Event)> {
    let (tx, merged) = mpsc::unbounded_channel();
    for (i, mut rx) in rxs.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Some(ev) => if tx.send((i, ev)).is_err() { break },
                        None => break,
                    },
                    () = tx.closed() => break,
                }
            }
        });
    }
    merged
}

pub fn sse(
    rxs: Vec<Events>,
    meta: Meta,
    include_usage: bool,
    cutoff: CutSignal,
    readers: Vec<Option<Reader>>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let st = State {
        rx: merge(rxs),
        cutoff,
        meta,
        include_usage,
        want_logprobs: false,
        choices: readers
            .into_iter()
            .map(|reader| Choice {
                logprobs: Vec::new(),
                reader,
                n_calls: 0,
                timings: None,
                done: None,
            })
            .collect(),
        out: VecDeque::new(),
        started: false,
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
                if st.meta.api == Api::Chat {
                    for i in 0..st.choices.len() {
                        let c = st.chunk(i, json!({"role": "assistant", "content": null}), None);
                        st.push(c);
                    }
                }
                continue;
            }
            let ev = tokio::select! {
                ev = st.rx.recv() => ev,
                () = st.cutoff.cut() => {
                    st.push(shutdown::error().body());
                    st.finish();
                    continue;
                }
            };
            match ev {
                Some((
                    i,
                    Event::Token {
                        id,
                        logprob,
                        timings: t,
                    },
                )) => {
                    if t.is_some() {
                        st.choices[i].timings = t;
                    }
                    if let Some(lp) = logprob {
                        st.want_logprobs = true;
                        st.choices[i].logprobs.push(lp);
                    }
                    if let Some(r) = &mut st.choices[i].reader {
                        let pieces = r.token(id);
                        st.pieces(i, pieces);
                    }
                }
                Some((i, Event::Progress(p))) => {
                    // llama-server's progress chunk: an empty delta (or
                    // text) with `prompt_progress`.
                    let delta = match st.meta.api {
                        Api::Chat => json!({}),
                        Api::Completion | Api::Native => json!({"content": ""}),
                    };
                    let mut c = st.chunk(i, delta, None);
                    c["prompt_progress"] = progress(&p);
                    if let Some(t) = &p.timings {
                        c["timings"] = timings(t);
                    }
                    st.push(c);
                }
                Some((i, Event::Text(text))) => match &mut st.choices[i].reader {
                    Some(r) => {
                        let pieces = r.text(&text);
                        st.pieces(i, pieces);
                    }
                    None => {
                        let c = st.chunk(i, json!({"content": text}), None);
                        st.push(c);
                    }
                },
                Some((i, Event::Done(summary))) => {
                    let mut finish = summary.finish.as_str();
                    if let Some(r) = &mut st.choices[i].reader {
                        let pieces = r.finish();
                        st.pieces(i, pieces);
                        if st.choices[i].n_calls > 0 {
                            finish = tools::finish_reason(summary.finish);
                        }
                    }
                    let mut last = st.chunk(i, json!({}), Some(finish));
                    last["timings"] = timings(&summary.timings);
                    st.push(last);
                    st.choices[i].done = Some(summary);
                    let all: Option<Vec<&Summary>> =
                        st.choices.iter().map(|c| c.done.as_ref()).collect();
                    if let Some(all) = all {
                        if st.include_usage {
                            let mut u = st.base();
                            u["choices"] = json!([]);
                            u["usage"] = usage_all(&all);
                            u["timings"] = timings(&all[0].timings);
                            st.push(u);
                        }
                        st.finish();
                    }
                }
                Some((_, Event::Error(e))) => {
                    st.push(ApiError::from(e).body());
                    st.finish();
                }
                None => {
                    st.push(
                        ApiError::internal("the engine ended the request without a result").body(),
                    );
                    st.finish();
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(PING).text("ping"))
}

/// llama-server's `prompt_progress` object.
pub fn progress(p: &Progress) -> Value {
    json!({
        "total": p.total,
        "cache": p.cache,
        "processed": p.processed,
        "time_ms": p.time_ms,
    })
}

impl State {
    fn base(&self) -> Value {
        json!({
            "id": self.meta.id,
            "object": match self.meta.api {
                Api::Chat => "chat.completion.chunk",
                Api::Completion | Api::Native => "text_completion",
            },
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": super::fingerprint(),
        })
    }

    /// One chunk of choice `i`; `delta` is the chat delta (its `content`
    /// becomes `text` for completions). Pending log-probs ride along.
    fn chunk(&mut self, i: usize, delta: Value, finish: Option<&str>) -> Value {
        let lps = std::mem::take(&mut self.choices[i].logprobs);
        let logprobs = (self.want_logprobs && !lps.is_empty()).then(|| match self.meta.api {
            Api::Chat => chat_logprobs(&lps),
            Api::Completion | Api::Native => completion_logprobs(&lps),
        });
        let choice = match self.meta.api {
            Api::Chat => json!({
                "index": i,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            Api::Completion | Api::Native => json!({
                "index": i,
                "text": delta.get("content").and_then(Value::as_str).unwrap_or_default(),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        };
        let mut c = self.base();
        c["choices"] = json!([choice]);
        if let Some(t) = self.choices[i].timings.take() {
            c["timings"] = timings(&t);
        }
        c
    }

    /// Text, reasoning and tool calls of a read answer, as chunks.
    fn pieces(&mut self, i: usize, pieces: Vec<Piece>) {
        for p in pieces {
            let delta = match p {
                Piece::Text(text) => json!({"content": text}),
                Piece::Reasoning(text) => json!({"reasoning_content": text}),
                Piece::Call(call) => {
                    let mut c = tools::openai_call(&call, tools::call_id(&call));
                    c["index"] = json!(self.choices[i].n_calls);
                    self.choices[i].n_calls += 1;
                    json!({"tool_calls": [c]})
                }
            };
            let c = self.chunk(i, delta, None);
            self.push(c);
        }
    }

    fn push(&mut self, v: Value) {
        self.out.push_back(SseEvent::default().data(v.to_string()));
    }

    fn finish(&mut self) {
        self.out.push_back(SseEvent::default().data("[DONE]"));
        self.ended = true;
    }
}
