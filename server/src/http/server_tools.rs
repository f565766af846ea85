//! llama-server's `/tools` endpoint: `GET /tools` lists the tools,
//! `POST /tools` `{"tool": NAME, "params": {...}, "stream": bool}` runs one
//! (`lamina-tools` has them; this is only HTTP).
//!
//! Off unless `--tools` (or another tool source) is configured: then both
//! routes answer 403 `feature_disabled`, as llama-server does. These tools
//! read and write files and run commands on the server's host, so turning
//! them on is the operator's decision, never a request's.
//!
//! A tool that ran and failed answers 200 with an `"error"` field (the
//! model reads it); a call that could not be made is a status: 400 bad
//! body or parameters, 404 unknown tool (or `stream` on one that cannot),
//! 500 a runtime that cannot be used. Headers, set by the client and never
//! by the model: `x-tool-cwd` (the directory relative paths resolve
//! against), `x-tool-runtime` (`docker-container:<id>`, `ssh:<target>`...),
//! `x-resp-type: base64` (`read_file` answers the raw bytes).
//!
//! A streamed call answers SSE: `data: {"chunk": "..."}` events with the
//! output as it comes, then `data: {"done": true}` (with `"error"` when it
//! failed). The tool runs on a blocking thread; a client that hangs up
//! stops it (its process group is killed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lamina_tools::{CallContext, ToolError, Tools};
use serde_json::{json, Value};

use super::params::Body as JsonBody;
use super::{ApiError, AppState};

/// Events a streamed call queues before the tool waits for the client.
const STREAM_BUFFER: usize = 16;

/// 403 as llama-server answers a feature it was started without.
fn disabled() -> ApiError {
    ApiError {
        status: StatusCode::FORBIDDEN,
        kind: "feature_disabled",
        message: "this feature is disabled".into(),
        param: None,
        code: None,
        context: None,
    }
}

impl From<ToolError> for ApiError {
    fn from(e: ToolError) -> Self {
        match &e {
            ToolError::UnknownTool(_) | ToolError::NoStream(_) => {
                let mut err = ApiError::not_found(e.to_string());
                err.kind = "invalid_request_error";
                err
            }
            ToolError::InvalidParams { param, .. } => {
                ApiError::invalid(param.clone(), e.to_string())
            }
            ToolError::Runtime(_) => ApiError::internal(e.to_string()),
        }
    }
}

fn tools(st: &AppState) -> Result<Arc<Tools>, ApiError> {
    st.options.tools.clone().ok_or_else(disabled)
}

pub async fn list(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let tools = tools(&st)?;
    if let Some(mcp) = &st.mcp {
        mcp.warmed().await;
    }
    let entries: Vec<Value> = tools.entries().iter().map(|e| e.to_json()).collect();
    Ok(Json(Value::Array(entries)))
}

pub async fn call(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tools = tools(&st)?;
    if let Some(mcp) = &st.mcp {
        mcp.warmed().await;
    }
    let b = JsonBody::parse(&body?)?;
    let name = b
        .str("tool")?
        .ok_or_else(|| ApiError::invalid("tool", "tool is required"))?
        .to_owned();
    let params = match b.0.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(ApiError::invalid("params", "params must be an object")),
    };
    let stream = b.bool("stream")?.unwrap_or(false);
    let mut ctx = context(&headers);
    let gone = CancelOnDrop::default();
    ctx.cancel = Some(gone.0.clone());

    if stream {
        return call_stream(tools, name, params, ctx, gone);
    }
    // Dropped with this future when the client hangs up mid-call.
    let _gone = gone;
    let answer = tokio::task::spawn_blocking(move || tools.call(&name, params, &ctx))
        .await
        .map_err(|e| ApiError::internal(format!("the tool call failed: {e}")))??;
    Ok(Json(answer).into_response())
}

/// Sets its flag when dropped: the request (or its response body) is gone,
/// so the command it runs is stopped (set after a finished call too, where
/// nothing is left to stop).
#[derive(Default)]
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The call's headers (a model's `cwd` or `runtime` parameter is never
/// read: these are the client's).
fn context(h: &HeaderMap) -> CallContext {
    let get = |name: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    CallContext {
        cwd: get("x-tool-cwd"),
        runtime: get("x-tool-runtime"),
        base64: get("x-resp-type").as_deref() == Some("base64"),
        cancel: None,
    }
}

fn call_stream(
    tools: Arc<Tools>,
    name: String,
    params: Value,
    ctx: CallContext,
    gone: CancelOnDrop,
) -> Result<Response, ApiError> {
    tools.prepare_stream(&name, &params, &ctx)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Value>(STREAM_BUFFER);
    tokio::task::spawn_blocking(move || {
        // A failed send: the client hung up and the body was dropped, so
        // the tool is stopped.
        let mut on_chunk = |chunk: &str| tx.blocking_send(json!({"chunk": chunk})).is_ok();
        let done = match tools.call_stream(&name, params, &ctx, &mut on_chunk) {
            Ok(()) => json!({"done": true}),
            Err(e) => json!({"done": true, "error": e.to_string()}),
        };
        let _ = tx.blocking_send(done);
    });
    // The guard lives as long as the body: a client that hangs up drops it.
    let events = futures_util::stream::unfold((rx, gone), |(mut rx, gone)| async move {
        let v = rx.recv().await?;
        let frame = Bytes::from(format!("data: {v}\n\n"));
        Some((Ok::<_, std::convert::Infallible>(frame), (rx, gone)))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response())
}
