//! The HTTP layer: OpenAI-compatible routes over the engine.
//!
//! [`app`] builds the router from an [`AppState`], so tests drive it with
//! `tower::ServiceExt::oneshot` and no socket. Handlers never touch the
//! model: they validate, render and tokenize, then hand the engine a job and
//! read its events. Every error leaves through `ApiError` (`error.rs`).
//!
//! Templates are rendered and prompts tokenized in a bounded pool
//! (`prepare.rs`); open requests end with an error when the shutdown grace
//! runs out (`shutdown.rs`).
//!
//! Layers, outermost first: status counting for `/metrics`, CORS (which
//! answers preflights itself, before the key is asked for), a handler's
//! panic turned into a 500, the API key (every route but `/health`), the body
//! limit, and (on routes) the body read under `--read-timeout`. [`serve`]
//! runs the router on a listener with the same timeout on headers.

mod anthropic;
mod cors;
mod cors_proxy;
mod embed;
mod error;
#[cfg(test)]
mod fault_tests;
mod gcp;
mod generate;
#[cfg(test)]
mod hybrid_tests;
mod listen;
pub mod mcp;
mod misc;
mod native;
mod ollama;
mod page;
mod params;
mod prepare;
pub mod reasoning;
mod rerank;
mod responses;
mod resume;
mod server_tools;
pub mod shutdown;
mod stream;
mod structured;
#[cfg(test)]
mod tests;
mod tools;

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::FutureExt as _;
use http_body_util::BodyExt as _;
use lamina_engine::{Engine, ModelInfo, Status};
use lamina_sampling::SamplerConfig;

pub use cors::Cors;
pub use error::ApiError;
pub use gcp::Gcp;
pub use listen::serve;
pub use prepare::default_slots as default_prepare_slots;

/// How long a client has to send a request's headers, and again its body.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a request waits for a prompt slot unless told (`--timeout`'s
/// default).
const DEFAULT_PREPARE_WAIT: Duration = Duration::from_secs(600);
/// What the command line sets for the HTTP layer.
#[derive(Debug, Clone)]
pub struct Options {
    /// `-a/--alias`, sorted and without repeats: the first is the model's
    /// name in responses, instead of the file's.
    pub aliases: Vec<String>,
    /// `--tags`, sorted and without repeats.
    pub tags: Vec<String>,
    /// The sampling a request gets for every field it leaves out
    /// (`--temp`, `--top-k`, `--seed` …).
    pub sampler: SamplerConfig,
    /// `-n/--n-predict`: tokens to generate when a request names no limit.
    pub n_predict: Option<usize>,
    /// Serve `/metrics` (else 501, as llama-server without `--metrics`).
    pub metrics: bool,
    pub cors: Cors,
    /// Serve the chat page at `/` (`--no-webui` turns it off, as in
    /// llama-server: `/` is then a 404 like any unknown route).
    pub web_ui: bool,
    /// `--reasoning`: whether thinking-capable templates think.
    pub reasoning: reasoning::ReasoningMode,
    /// `--reasoning-format`: how reasoning comes back.
    pub reasoning_format: lamina_chat::ReasoningFormat,
    /// Serve GET /slots (`--no-slots`: 501).
    pub slots: bool,
    /// `--slot-save-path`: where slot saves go (else save and restore 501).
    pub slot_save_path: Option<std::path::PathBuf>,
    /// `--embedding`: serve the embedding endpoints (else 501).
    pub embedding: bool,
    /// `--pooling`; `None`: the file's, else none.
    pub pooling: Option<lamina_engine::pooling::Pooling>,
    /// `--embd-normalize`: the default norm of pooled embeddings.
    pub embd_normalize: i32,
    /// `--reranking`: serve `/rerank` (else 501).
    pub reranking: bool,
    /// `AIP_MODE=PREDICTION`: Vertex AI's predict route.
    pub gcp: Option<Gcp>,
    /// `--verbose`: completion responses carry `__verbose` unless a
    /// request says `verbose: false`, as in llama-server.
    pub verbose: bool,
    /// `--ui-mcp-proxy`: serve /cors-proxy (else 403).
    pub cors_proxy: bool,
    /// `--tools`: the tools `/tools` lists and runs (`None`: 403, the
    /// feature is off).
    pub tools: Option<Arc<lamina_tools::Tools>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            aliases: Vec::new(),
            tags: Vec::new(),
            sampler: SamplerConfig::default(),
            n_predict: None,
            metrics: true,
            cors: Cors::default(),
            web_ui: true,
            reasoning: reasoning::ReasoningMode::default(),
            reasoning_format: lamina_chat::ReasoningFormat::default(),
            slots: true,
            slot_save_path: None,
            embedding: false,
            pooling: None,
            embd_normalize: 2,
            reranking: false,
            gcp: None,
            verbose: false,
            cors_proxy: false,
            tools: None,
        }
    }
}

/// A comma-separated flag value as a sorted list without repeats or
/// blanks (llama-server keeps aliases and tags in a `std::set`).
pub fn list(value: Option<&str>) -> Vec<String> {
    let set: std::collections::BTreeSet<String> = value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    set.into_iter().collect()
}

/// What every handler shares.
pub struct AppState {
    pub engine: Engine,
    /// `None`: no key is required.
    pub api_key: Option<String>,
    pub body_limit: usize,
    /// Deadline for reading a request body ([`DEFAULT_READ_TIMEOUT`] unless
    /// set with [`AppState::with_read_timeout`]).
    pub read_timeout: Duration,
    pub started_unix: u64,
    pub http: StatusCounts,
    /// Where templates are rendered and prompts tokenized: a bounded pool.
    pub prepare: prepare::Prepare,
    /// Fires when the shutdown grace runs out and open requests must end.
    pub cutoff: shutdown::CutSignal,
    pub options: Options,
    /// Streams kept under their `X-Conversation-Id` ([`resume`]).
    pub streams: resume::Sessions,
    /// The MCP servers among the tools (`Options::tools` lists and calls
    /// them); `None`: none configured.
    pub mcp: Option<Arc<mcp::Mcp>>,
}

impl AppState {
    pub fn new(engine: Engine, api_key: Option<String>, body_limit: usize) -> Self {
        Self {
            engine,
            api_key: api_key.filter(|k| !k.is_empty()),
            body_limit,
            read_timeout: DEFAULT_READ_TIMEOUT,
            started_unix: unix_time(),
            http: StatusCounts::default(),
            prepare: prepare::Prepare::new(prepare::default_slots(), DEFAULT_PREPARE_WAIT),
            cutoff: shutdown::CutSignal::never(),
            options: Options::default(),
            streams: resume::Sessions::default(),
            mcp: None,
        }
    }

    pub fn with_mcp(mut self, mcp: Arc<mcp::Mcp>) -> Self {
        self.mcp = Some(mcp);
        self
    }

    pub fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// The model's name in responses: the first alias, or the file's.
    pub fn model_id(&self, info: &ModelInfo) -> String {
        self.options
            .aliases
            .first()
            .cloned()
            .unwrap_or_else(|| info.id.clone())
    }

    /// Tokens to generate for a request that names no limit: `-n` when
    /// given, never past the room left in a slot or the server's cap.
    /// Sampling from OpenAI chat fields (`temperature`, `max_tokens`, `stop`
    /// …) that another API's request was translated into, with the chat
    /// route's checks and the server's defaults.
    pub fn chat_sampling(
        &self,
        info: &ModelInfo,
        fields: serde_json::Map<String, serde_json::Value>,
    ) -> Result<params::Sampling, ApiError> {
        params::sampling(
            &params::Body(fields),
            info,
            self.engine.max_tokens_cap(),
            params::Api::Chat,
            &self.options.sampler,
        )
    }

    pub fn default_max_tokens(&self, info: &ModelInfo, prompt_len: usize) -> usize {
        let room = self.engine.default_max_tokens(info, prompt_len);
        self.options.n_predict.map_or(room, |n| n.min(room))
    }

    pub fn with_read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// `slots` preparations at once, each waiting at most `wait` for a slot
    /// (the server's request timeout).
    pub fn with_prepare(mut self, slots: usize, wait: Duration) -> Self {
        self.prepare = prepare::Prepare::new(slots, wait);
        self
    }

    /// Open requests end when `cutoff`'s [`shutdown::Cutoff`] cuts them.
    pub fn with_cutoff(mut self, cutoff: shutdown::CutSignal) -> Self {
        self.cutoff = cutoff;
        self
    }

    /// The model, or 503 while it loads (or once it cannot compute).
    pub fn ready(&self) -> Result<Arc<ModelInfo>, ApiError> {
        match self.engine.status() {
            Status::Ready(info) => Ok(info),
            Status::Loading => Err(ApiError::unavailable("Loading model", "model_loading")),
            Status::Failed(e) => Err(ApiError::unavailable(
                format!("the model failed to load: {e}"),
                "model_failed",
            )),
            Status::Broken(e) => Err(e.into()),
        }
    }
}

/// Responses by status code.
#[derive(Default)]
pub struct StatusCounts(Mutex<BTreeMap<u16, u64>>);

impl StatusCounts {
    fn add(&self, status: u16) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(status).or_default() += 1;
        }
    }

    pub fn snapshot(&self) -> Vec<(u16, u64)> {
        self.0
            .lock()
            .map(|m| m.iter().map(|(&k, &v)| (k, v)).collect())
            .unwrap_or_default()
    }
}

pub fn app(state: Arc<AppState>) -> Router {
    let limit = state.body_limit;
    let page = if state.options.web_ui {
        Router::new()
            .route("/", get(page::index))
            .route("/chat.js", get(page::script))
            .route("/chat.css", get(page::style))
    } else {
        Router::new()
    };
    let routes = page
        .route("/health", get(misc::health))
        .route("/v1/health", get(misc::health))
        .route("/v1/models", get(misc::models))
        .route("/models", get(misc::models))
        .route("/v1/chat/completions", post(generate::chat))
        .route("/chat/completions", post(generate::chat))
        .route(
            "/v1/chat/completions/input_tokens",
            post(generate::chat_input_tokens),
        )
        .route(
            "/chat/completions/input_tokens",
            post(generate::chat_input_tokens),
        )
        .route("/v1/completions", post(generate::completion))
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route("/v1/messages", post(anthropic::messages_route))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/v1/embeddings", post(embed::openai))
        .route("/embedding", post(embed::native))
        .route("/embeddings", post(embed::native))
        .route("/rerank", post(rerank::rerank))
        .route("/reranking", post(rerank::rerank))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/v1/reranking", post(rerank::rerank))
        // llama-server's native API; `/completions` is its alias there too
        // (only `/v1/completions` is OpenAI's).
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route("/apply-template", post(misc::apply_template))
        .route("/props", get(misc::props))
        .route("/metrics", get(misc::metrics))
        .route("/slots", get(misc::slots))
        .route("/slots/{id}", post(misc::slot_action))
        .route("/v1/stream", get(resume::get).delete(resume::delete))
        .route("/v1/streams/lookup", post(resume::lookup))
        .route("/tools", get(server_tools::list).post(server_tools::call))
        .route(
            "/cors-proxy",
            get(cors_proxy::proxy).post(cors_proxy::proxy),
        );
    // Lets the tests check that a panicking handler is a 500 and no more.
    #[cfg(test)]
    let routes = routes.route("/test/panic", get(panics));
    let routes = match &state.options.gcp {
        // The instances go through the same routes, read and checked as
        // any request (the key was checked on the predict request itself).
        Some(g) => {
            let inner: Router = routes
                .clone()
                .route_layer(middleware::from_fn_with_state(state.clone(), read_body))
                .with_state(state.clone());
            let routes = routes.route(
                &g.predict_route,
                post(move |headers, body| gcp::predict(inner.clone(), headers, body)),
            );
            match &g.health_route {
                Some(h) => routes.route(h, get(misc::health)),
                None => routes,
            }
        }
        None => routes,
    };
    routes
        .route_layer(middleware::from_fn_with_state(state.clone(), read_body))
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn(catch_panic))
        .layer(middleware::from_fn_with_state(state.clone(), cors::layer))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

async fn count(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    st.http.add(resp.status().as_u16());
    resp
}

#[cfg(test)]
async fn panics() -> &'static str {
    panic!("a handler panicked on purpose")
}

/// A panic in a handler becomes a 500 in the error shape, and the server
/// goes on serving (the panic message goes to the log, not to the client).
async fn catch_panic(req: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(resp) => resp,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!("a request handler panicked: {what}");
            ApiError::internal("the server failed while handling this request").into_response()
        }
    }
}

/// Reads the whole body (at most `--body-limit` bytes) within
/// `--read-timeout`, so a client that sends its headers and then trickles
/// the body cannot hold a connection open: past the deadline it gets 408.
/// A `Content-Length` past the limit is answered 413 from the headers alone.
async fn read_body(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let (parts, mut body) = req.into_parts();
    let declared = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.body_limit as u64) {
        drain(body);
        return ApiError::too_large().into_response();
    }
    match tokio::time::timeout(st.read_timeout, collect(&mut body, st.body_limit)).await {
        Ok(Ok(Some(bytes))) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Ok(None)) => {
            drain(body);
            ApiError::too_large().into_response()
        }
        Ok(Err(e)) => ApiError::bad_body(format!("reading the request body: {e}")).into_response(),
        Err(_) => ApiError::body_timeout(st.read_timeout).into_response(),
    }
}

/// The body's bytes, or `None` once it passes `limit` (the rest is left in
/// `body` for [`drain`]).
async fn collect(body: &mut Body, limit: usize) -> Result<Option<Bytes>, axum::Error> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if buf.len().saturating_add(data.len()) > limit {
                return Ok(None);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Some(Bytes::from(buf)))
}

/// Most bytes, and longest time, spent reading a refused body.
const DRAIN_BYTES: usize = 8 * 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads and discards a refused request's body, up to [`DRAIN_BYTES`] or
/// [`DRAIN_TIME`], while the refusal is written. Closing a socket that still
/// holds unread bytes sends a reset, and a client still writing its body
/// then sees EPIPE or "connection reset" instead of the 413 or 401; read
/// for a bounded while, the client gets to read the status.
fn drain(mut body: Body) {
    tokio::spawn(async move {
        let read = async {
            let mut n = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                n += frame.data_ref().map_or(0, Bytes::len);
                if n > DRAIN_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIME, read).await;
    });
}

/// Every route but `/health` needs the key when one is set, given as
/// `Authorization: Bearer KEY` (OpenAI's SDKs) or `X-Api-Key: KEY`.
async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let path = req.uri().path();
        // Vertex AI's health checks send no key, as they send none to /health.
        let gcp_health = st
            .options
            .gcp
            .as_ref()
            .and_then(|g| g.health_route.as_deref());
        let public = matches!(path, "/health" | "/v1/health")
            || page::PUBLIC.contains(&path)
            || gcp_health == Some(path);
        if !public && !presented_key_matches(req.headers(), key) {
            drain(req.into_body());
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

fn presented_key_matches(h: &HeaderMap, key: &str) -> bool {
    let bearer = h
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let header = h.get("x-api-key").and_then(|v| v.to_str().ok());
    bearer
        .or(header)
        .is_some_and(|given| constant_time_eq(given.as_bytes(), key.as_bytes()))
}

/// Compares without stopping at the first difference, so the time taken
/// says nothing about how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 32 random alphanumerics for response ids, from the process's randomly
/// keyed hasher and a counter (unique per process, unpredictable enough for
/// an id; not a secret).
pub fn random_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut out = String::with_capacity(32);
    let state = std::collections::hash_map::RandomState::new();
    for round in 0..4u64 {
        let mut h = state.build_hasher();
        h.write_u64(n);
        h.write_u64(round);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        let mut x = h.finish();
        for _ in 0..8 {
            out.push(char::from(ALPHABET[(x % ALPHABET.len() as u64) as usize]));
            x /= ALPHABET.len() as u64;
        }
    }
    out
}

/// `system_fingerprint` and `build_info`.
pub fn fingerprint() -> String {
    format!("lamina-{}", env!("CARGO_PKG_VERSION"))
}
