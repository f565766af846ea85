//! Resumable streams, as llama-server's web UI uses them: a streamed chat
//! or completion request with an `X-Conversation-Id` header keeps running
//! when its client goes away (a page reload, a dropped connection), its
//! server-sent events kept in a buffer under that id, and
//!
//! - `GET /v1/stream?conv_id=ID&from=N` replays them from byte N, then
//!   follows the generation live until it ends (404 once the session is
//!   gone, 400 when N is older than the buffer still holds);
//! - `DELETE /v1/stream?conv_id=ID` is the user's Stop: it cancels the
//!   generation and forgets the session (204, also when there was none);
//! - `POST /v1/streams/lookup` with `{"conversation_ids": [...]}` says which
//!   of the ids the caller names have a session (the id itself or
//!   `ID::model`), never listing ids it was not asked about.
//!
//! A new request under an id replaces (and cancels) the session before it:
//! one live generation per conversation.
//!
//! Bounds, since every session holds memory past its request: each keeps
//! at most [`MAX_BYTES`] (the oldest bytes are dropped first, as
//! llama-server's 4 MiB ring does), a finished session is forgotten
//! [`TTL`] after it ends, and at most [`MAX_SESSIONS`] exist at once (the
//! oldest finished one makes room; when all are live, the new request
//! streams without being resumable, and the log says so). An id is at most
//! [`MAX_ID_BYTES`].

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

use super::error::ApiError;
use super::AppState;

/// Bytes of events one session keeps (llama-server keeps 4 MiB).
pub const MAX_BYTES: usize = 4 << 20;
/// How long a finished session stays (llama-server's 300 s).
pub const TTL: Duration = Duration::from_secs(300);
/// Sessions at once.
pub const MAX_SESSIONS: usize = 64;
/// Longest conversation id.
pub const MAX_ID_BYTES: usize = 256;
/// The request header that names the conversation.
pub const HEADER: &str = "x-conversation-id";

/// The events of one generation, as sent on the wire.
struct Buf {
    chunks: VecDeque<Bytes>,
    /// Bytes dropped from the front to stay within [`MAX_BYTES`].
    dropped: u64,
    /// Bytes ever written.
    total: u64,
    ended: Option<(Instant, u64)>,
}

struct Session {
    id: String,
    started_unix: u64,
    buf: Mutex<Buf>,
    /// Wakes readers when bytes arrive or the session ends.
    more: Notify,
    /// Cancels the producer (the user's Stop, or a replacing request).
    cancel: watch::Sender<bool>,
}

impl Session {
    fn push(&self, b: Bytes) {
        let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        buf.total += b.len() as u64;
        buf.chunks.push_back(b);
        // The bytes held are those written less those dropped.
        while buf.total - buf.dropped > MAX_BYTES as u64 {
            let Some(front) = buf.chunks.pop_front() else {
                break;
            };
            buf.dropped += front.len() as u64;
        }
        drop(buf);
        self.more.notify_waiters();
    }

    fn end(&self) {
        let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        if buf.ended.is_none() {
            buf.ended = Some((Instant::now(), unix_time()));
        }
        drop(buf);
        self.more.notify_waiters();
    }

    /// The bytes from `from` that are there now, and whether the session
    /// has ended; `Err` when `from` was dropped.
    fn read(&self, from: u64) -> Result<(Bytes, bool), u64> {
        let buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        if from < buf.dropped {
            return Err(buf.dropped);
        }
        let mut out = Vec::new();
        let mut at = buf.dropped;
        for c in &buf.chunks {
            let end = at + c.len() as u64;
            if end > from {
                let skip = from.saturating_sub(at) as usize;
                out.extend_from_slice(&c[skip..]);
            }
            at = end;
        }
        Ok((Bytes::from(out), buf.ended.is_some()))
    }
}

/// The server's sessions, by conversation id.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    /// Forgets finished sessions past [`TTL`]; the caller holds the map.
    fn sweep(map: &mut HashMap<String, Arc<Session>>) {
        map.retain(|_, s| {
            let buf = s.buf.lock().unwrap_or_else(|p| p.into_inner());
            !matches!(buf.ended, Some((at, _)) if at.elapsed() > TTL)
        });
    }

    /// A fresh session under `id`, cancelling the one it replaces; `None`
    /// when [`MAX_SESSIONS`] are all live.
    fn create(&self, id: &str) -> Option<Arc<Session>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        Self::sweep(&mut map);
        if let Some(old) = map.remove(id) {
            let _ = old.cancel.send(true);
        }
        if map.len() >= MAX_SESSIONS {
            let oldest = map
                .iter()
                .filter_map(|(k, s)| {
                    let buf = s.buf.lock().unwrap_or_else(|p| p.into_inner());
                    buf.ended.map(|(at, _)| (at, k.clone()))
                })
                .min();
            map.remove(&oldest?.1);
        }
        let (cancel, _) = watch::channel(false);
        let s = Arc::new(Session {
            id: id.to_string(),
            started_unix: unix_time(),
            buf: Mutex::new(Buf {
                chunks: VecDeque::new(),
                dropped: 0,
                total: 0,
                ended: None,
            }),
            more: Notify::new(),
            cancel,
        });
        map.insert(id.to_string(), s.clone());
        Some(s)
    }

    fn get(&self, id: &str) -> Option<Arc<Session>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        Self::sweep(&mut map);
        map.get(id).cloned()
    }

    fn cancel(&self, id: &str) {
        let gone = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(s) = gone {
            let _ = s.cancel.send(true);
            s.end();
        }
    }

    /// The sessions whose id is one of `ids` or `ID::something`.
    fn lookup(&self, ids: &[String]) -> Vec<Arc<Session>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        Self::sweep(&mut map);
        let mut out: Vec<Arc<Session>> = map
            .values()
            .filter(|s| {
                ids.iter().any(|id| {
                    s.id == *id
                        || s.id
                            .strip_prefix(id.as_str())
                            .is_some_and(|r| r.starts_with("::"))
                })
            })
            .cloned()
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

fn unix_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The request's conversation id, if it names one; a 400 for an id that
/// is not visible ASCII or is longer than [`MAX_ID_BYTES`].
pub fn conversation_id(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(HEADER) else {
        return Ok(None);
    };
    let id = v
        .to_str()
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= MAX_ID_BYTES)
        .ok_or_else(|| {
            ApiError::invalid(
                "X-Conversation-Id",
                format!("the conversation id must be 1 to {MAX_ID_BYTES} bytes of visible ASCII"),
            )
        })?;
    Ok(Some(id.to_string()))
}

/// `sse`, a streamed response, made resumable under `id`: a task drains it
/// into the session whether or not anyone reads, and the client reads the
/// session from its start. Without room for a session, `sse` as it is.
pub fn tee(st: &AppState, id: &str, sse: Response) -> Response {
    let Some(session) = st.streams.create(id) else {
        tracing::warn!(
            "{MAX_SESSIONS} resumable streams are live: conversation {id:?} streams without one"
        );
        return sse;
    };
    let (parts, body) = sse.into_parts();
    let mut frames = body.into_data_stream();
    let producer = session.clone();
    let mut cancel = session.cancel.subscribe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                f = frames.next() => match f {
                    Some(Ok(b)) => producer.push(b),
                    Some(Err(_)) | None => break,
                },
                // Dropping `frames` drops the request's event receiver:
                // the engine frees its slot at the next step.
                _ = cancel.changed() => break,
            }
        }
        producer.end();
    });
    let mut resp = reader(session, 0);
    *resp.status_mut() = parts.status;
    for (k, v) in &parts.headers {
        resp.headers_mut().insert(k, v.clone());
    }
    resp
}

/// A response that streams `s` from byte `from` until it ends.
fn reader(s: Arc<Session>, from: u64) -> Response {
    let body = futures_util::stream::unfold((s, from, false), |(s, at, over)| async move {
        if over {
            return None;
        }
        loop {
            let got = {
                // Registered before the read, so bytes pushed in between
                // wake it.
                let more = s.more.notified();
                tokio::pin!(more);
                more.as_mut().enable();
                match s.read(at) {
                    Ok((b, ended)) if !b.is_empty() => Some((b, ended)),
                    Ok((_, true)) => return None,
                    Ok((_, false)) => {
                        more.await;
                        None
                    }
                    // The ring moved past the reader: it ends here.
                    Err(_) => return None,
                }
            };
            if let Some((b, ended)) = got {
                let next = at + b.len() as u64;
                return Some((Ok::<_, Infallible>(b), (s, next, ended)));
            }
        }
    });
    let mut resp = Body::from_stream(body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[derive(Deserialize)]
pub struct StreamQuery {
    conv_id: Option<String>,
    from: Option<String>,
}

fn conv_id(q: &StreamQuery) -> Result<&str, ApiError> {
    q.conv_id
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::invalid("conv_id", "missing conversation id (conv_id)"))
}

/// `GET /v1/stream?conv_id=ID&from=N`.
pub async fn get(
    State(st): State<Arc<AppState>>,
    Query(q): Query<StreamQuery>,
) -> Result<Response, ApiError> {
    let id = conv_id(&q)?;
    let from = match q.from.as_deref().filter(|s| !s.is_empty()) {
        None => 0,
        Some(f) => f
            .parse::<u64>()
            .map_err(|_| ApiError::invalid("from", format!("{f:?} is not a byte offset")))?,
    };
    let s = st
        .streams
        .get(id)
        .ok_or_else(|| ApiError::not_found("stream not found or expired"))?;
    if let Err(kept) = s.read(from) {
        return Err(ApiError::invalid(
            "from",
            format!(
                "stream offset {from} is lost (the stream keeps bytes from {kept}): restart it"
            ),
        ));
    }
    Ok(reader(s, from))
}

/// `DELETE /v1/stream?conv_id=ID`.
pub async fn delete(
    State(st): State<Arc<AppState>>,
    Query(q): Query<StreamQuery>,
) -> Result<Response, ApiError> {
    st.streams.cancel(conv_id(&q)?);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
pub struct LookupBody {
    #[serde(default)]
    conversation_ids: Vec<Value>,
}

/// `POST /v1/streams/lookup`.
pub async fn lookup(
    State(st): State<Arc<AppState>>,
    body: Result<Json<LookupBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(b) = body.map_err(|e| ApiError::bad_body(format!("invalid body: {e}")))?;
    let ids: Vec<String> = b
        .conversation_ids
        .iter()
        .filter_map(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .take(MAX_SESSIONS * 4)
        .map(str::to_string)
        .collect();
    let found: Vec<Value> = st
        .streams
        .lookup(&ids)
        .iter()
        .map(|s| {
            let buf = s.buf.lock().unwrap_or_else(|p| p.into_inner());
            json!({
                "conversation_id": s.id,
                "is_done": buf.ended.is_some(),
                "total_bytes": buf.total,
                "started_at": s.started_unix,
                "completed_at": buf.ended.map_or(0, |(_, t)| t),
            })
        })
        .collect();
    Ok(Json(found).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_gets_bytes_from_its_offset_and_the_ring_drops_the_oldest() {
        let sessions = Sessions::default();
        let s = sessions.create("c").unwrap();
        s.push(Bytes::from_static(b"data: 1\n\n"));
        s.push(Bytes::from_static(b"data: 2\n\n"));
        assert_eq!(
            s.read(0).unwrap().0,
            Bytes::from_static(b"data: 1\n\ndata: 2\n\n")
        );
        assert_eq!(s.read(15).unwrap().0, Bytes::from_static(b"2\n\n"));
        assert!(!s.read(0).unwrap().1);
        s.end();
        assert!(s.read(18).unwrap().1);
        // Past the cap the front goes, and an offset before it is refused.
        let big = sessions.create("big").unwrap();
        for _ in 0..5 {
            big.push(Bytes::from(vec![b'x'; 1 << 20]));
        }
        assert_eq!(big.read(0), Err(1 << 20));
        assert_eq!(big.read(1 << 20).unwrap().0.len(), 4 << 20);
    }

    #[test]
    fn a_new_request_replaces_and_cancels_the_old_session_and_room_is_bounded() {
        let sessions = Sessions::default();
        let old = sessions.create("c").unwrap();
        let mut cancelled = old.cancel.subscribe();
        let new = sessions.create("c").unwrap();
        assert!(cancelled.has_changed().unwrap() && *cancelled.borrow_and_update());
        assert!(Arc::ptr_eq(&sessions.get("c").unwrap(), &new));
        // Lookup names the id itself and its `::model` variants, nothing else.
        sessions.create("c::org/model").unwrap();
        sessions.create("cd").unwrap();
        let ids: Vec<String> = sessions
            .lookup(&["c".into()])
            .iter()
            .map(|s| s.id.clone())
            .collect();
        assert_eq!(ids, ["c", "c::org/model"]);
        // All live: no room for one more; a finished one makes room.
        for i in 0..MAX_SESSIONS - 3 {
            sessions.create(&format!("x{i}")).unwrap();
        }
        assert!(sessions.create("one-too-many").is_none());
        sessions.get("x0").unwrap().end();
        assert!(sessions.create("one-too-many").is_some());
        assert!(sessions.get("x0").is_none());
    }
}
