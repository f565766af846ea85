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
//! the final chunk then says `finish_reason: "tool_calls"`.
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
use lamina_engine::{Event, Events, TokenLogprob};
use serde_json::{json, Value};

use super::error::ApiError;
use super::generate::{chat_logprobs, completion_logprobs, timings, usage, Meta};
use super::params::Api;
use super::shutdown::{self, CutSignal};
use super::tools::{self, Calls};

/// How often an idle stream gets a comment line.
const PING: Duration = Duration::from_secs(10);

struct State {
    rx: Events,
    meta: Meta,
    include_usage: bool,
    /// Log-probs of tokens whose text has not been sent yet.
    logprobs: Vec<TokenLogprob>,
    want_logprobs: bool,
    out: VecDeque<SseEvent>,
    started: bool,
    ended: bool,
    cutoff: CutSignal,
    /// The parser of the answer, when it is read for tool calls.
    calls: Option<Calls>,
    /// Tool calls sent so far.
    n_calls: usize,
}

pub fn sse(
    rx: Events,
    meta: Meta,
    include_usage: bool,
    cutoff: CutSignal,
    calls: Option<Calls>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let st = State {
        rx,
        cutoff,
        meta,
        include_usage,
        logprobs: Vec::new(),
        want_logprobs: false,
        out: VecDeque::new(),
        started: false,
        ended: false,
        calls,
        n_calls: 0,
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
                    let c = st.chunk(json!({"role": "assistant", "content": null}), None);
                    st.push(c);
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
                Some(Event::Token { id, logprob }) => {
                    if let Some(lp) = logprob {
                        st.want_logprobs = true;
                        st.logprobs.push(lp);
                    }
                    if let Some(c) = &mut st.calls {
                        let pieces = c.token(id);
                        st.pieces(pieces);
                    }
                }
                Some(Event::Text(text)) => match &mut st.calls {
                    Some(c) => {
                        let pieces = c.text(&text);
                        st.pieces(pieces);
                    }
                    None => {
                        let c = st.chunk(json!({"content": text}), None);
                        st.push(c);
                    }
                },
                Some(Event::Done(summary)) => {
                    let mut finish = summary.finish.as_str();
                    if let Some(c) = &mut st.calls {
                        let pieces = c.finish();
                        st.pieces(pieces);
                        if st.n_calls > 0 {
                            finish = tools::finish_reason(summary.finish);
                        }
                    }
                    let mut last = st.chunk(json!({}), Some(finish));
                    last["timings"] = timings(&summary.timings);
                    st.push(last);
                    if st.include_usage {
                        let mut u = st.base();
                        u["choices"] = json!([]);
                        u["usage"] = usage(&summary);
                        u["timings"] = timings(&summary.timings);
                        st.push(u);
                    }
                    st.finish();
                }
                Some(Event::Error(e)) => {
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

    /// One chunk; `delta` is the chat delta (its `content` becomes `text`
    /// for completions). Pending log-probs ride along.
    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> Value {
        let lps = std::mem::take(&mut self.logprobs);
        let logprobs = (self.want_logprobs && !lps.is_empty()).then(|| match self.meta.api {
            Api::Chat => chat_logprobs(&lps),
            Api::Completion | Api::Native => completion_logprobs(&lps),
        });
        let choice = match self.meta.api {
            Api::Chat => json!({
                "index": 0,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            Api::Completion | Api::Native => json!({
                "index": 0,
                "text": delta.get("content").and_then(Value::as_str).unwrap_or_default(),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        };
        let mut c = self.base();
        c["choices"] = json!([choice]);
        c
    }

    /// Text and tool calls of an answer read for calls, as chunks.
    fn pieces(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            let delta = match p {
                Piece::Text(text) => json!({"content": text}),
                Piece::Call(call) => {
                    let mut c = tools::openai_call(&call, tools::call_id(&call));
                    c["index"] = json!(self.n_calls);
                    self.n_calls += 1;
                    json!({"tool_calls": [c]})
                }
            };
            let c = self.chunk(delta, None);
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
