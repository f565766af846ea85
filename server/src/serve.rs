//! `lamina serve`: the OpenAI-compatible HTTP server.
//!
//! Binds first (so `/health` answers 503 while the model loads), starts the
//! engine thread, logs the model and its placement, then
//! `listening on http://HOST:PORT` once requests can be served. Ctrl-C or
//! SIGTERM stops accepting connections and lets open ones finish for
//! `--shutdown-grace` seconds; then every request still open is ended (a
//! stream with a final error event) and the process exits non-zero. A
//! second signal exits at once. A client
//! has `--read-timeout` seconds to send a request's headers, and again its
//! body; an idle keep-alive connection is closed after the same time.
//!
//! The model is mapped unless `--no-mmap`. A mapped file that changes under
//! the server (copied over, re-downloaded into the same path) is detected by
//! the engine, which then answers 503 to everything, `/health` included, and
//! never computes from it; replacing the file by rename leaves the mapped
//! one intact, and the server goes on serving it until restarted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use lamina_engine::{Engine, EngineConfig, Status};
use lamina_gguf::LoadMode;
use tokio::net::TcpListener;

use crate::http::{self, AppState};

pub struct ServeArgs {
    pub file: PathBuf,
    pub host: String,
    pub port: u16,
    /// `--sleep-idle-seconds`: `None` never.
    pub sleep_idle: Option<Duration>,
    pub n_ctx: Option<usize>,
    pub parallel: usize,
    pub api_key: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub chat_template_file: Option<PathBuf>,
    /// `--chat-template`, resolved to Jinja source.
    pub chat_template: Option<String>,
    pub parse_special_in_content: bool,
    pub max_queue: usize,
    pub max_tokens: usize,
    pub timeout_s: u64,
    pub body_limit: usize,
    pub read_timeout_s: u64,
    pub ngl: lamina_model::placement::Ngl,
    pub gpu_memory: Option<u64>,
    pub kv: lamina_model::KvTypes,
    /// `--n-cpu-moe` ([`lamina_model::plan::PlanParams::cpu_moe`]).
    pub cpu_moe: usize,
    /// `-ot` ([`lamina_model::plan::ExpertRule`]).
    pub experts: Vec<lamina_model::plan::ExpertRule>,
    pub shutdown_grace_s: u64,
    /// Read the model into memory rather than mapping it.
    pub no_mmap: bool,
    /// Prompt tokens per step (`-b`/`-ub`); `None`: the engine's default.
    pub n_batch: Option<usize>,
    /// `--step-budget-ms`; `None`: prompts are not paced.
    pub step_budget: Option<Duration>,
    /// What the HTTP layer takes from the command line.
    pub http: http::Options,
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    init_tracing(a.http.verbose);
    let api_key = match (&a.api_key, &a.api_key_file) {
        (Some(k), _) => Some(k.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading --api-key-file {}", f.display()))?
                .trim()
                .to_owned(),
        ),
        (None, None) => None,
    };
    if api_key.as_deref() == Some("") {
        bail!("the API key is empty");
    }
    let chat_template = match (&a.chat_template, &a.chat_template_file) {
        (Some(source), _) => Some(source.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading --chat-template-file {}", f.display()))?,
        ),
        (None, None) => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lamina-http")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(serve(a, api_key, chat_template))
}

async fn serve(
    a: ServeArgs,
    api_key: Option<String>,
    chat_template: Option<String>,
) -> anyhow::Result<()> {
    // `--host a,b`: one listener per address, all on one port (with
    // `--port 0`, the one the first address was given), as llama-server
    // listens. An address that cannot be bound fails the start.
    let mut listeners = Vec::new();
    let mut port = a.port;
    for host in a.host.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        let listener = TcpListener::bind((host, port))
            .await
            .with_context(|| format!("binding {host}:{port}"))?;
        port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    if listeners.is_empty() {
        bail!("--host names no address");
    }
    let locals: Vec<SocketAddr> = listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<Result<_, _>>()?;

    // The update stays for fields added to EngineConfig later.
    #[allow(clippy::needless_update)]
    let engine = Engine::start(EngineConfig {
        model: a.file.clone(),
        n_ctx: a.n_ctx,
        n_parallel: a.parallel.max(1),
        max_queue: a.max_queue,
        max_tokens: a.max_tokens.max(1),
        timeout: Duration::from_secs(a.timeout_s.max(1)),
        chat_template,
        parse_special_in_content: a.parse_special_in_content,
        ngl: a.ngl,
        gpu_memory: a.gpu_memory,
        kv: a.kv,
        cpu_moe: a.cpu_moe,
        experts: a.experts,
        load_mode: if a.no_mmap {
            LoadMode::Read
        } else {
            LoadMode::Mmap
        },
        n_batch: a.n_batch.unwrap_or(EngineConfig::new(&a.file).n_batch),
        step_budget: a.step_budget,
        sleep_idle: a.sleep_idle,
        ..EngineConfig::new(&a.file)
    })?;
    let keyed = api_key.is_some();
    let reranking = a.http.reranking;
    let read_timeout = Duration::from_secs(a.read_timeout_s.max(1));
    let (cutoff, cut_signal) = http::shutdown::channel();
    let state = AppState::new(engine.clone(), api_key, a.body_limit)
        .with_read_timeout(read_timeout)
        .with_prepare(
            http::default_prepare_slots(),
            Duration::from_secs(a.timeout_s.max(1)),
        )
        .with_cutoff(cut_signal)
        .with_options(a.http);
    let app = http::app(Arc::new(state));
    let mut signals = Signals::new().context("installing the signal handlers")?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let servers: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let mut stopped = stopped.clone();
            tokio::spawn(http::serve(
                listener,
                app.clone(),
                read_timeout,
                async move {
                    let _ = stopped.wait_for(|s| *s).await;
                },
            ))
        })
        .collect();
    // Done when every listener's server is.
    let mut server = tokio::spawn(async move {
        for s in futures_util::future::join_all(servers).await {
            s?;
        }
        Ok::<(), tokio::task::JoinError>(())
    });

    loop {
        match engine.status() {
            // Broken only after it was ready: serve, and answer 503.
            Status::Ready(info) => {
                if reranking && info.rank_head.is_none() {
                    tracing::warn!(
                        "--reranking: this model has no ranking head (cls.output); its scores \
                         are the last token's first hidden component, as llama-server's, not a \
                         judgement of relevance"
                    );
                }
                break;
            }
            Status::Broken(_) => break,
            Status::Failed(e) => bail!("{e}"),
            Status::Loading => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    if !keyed && locals.iter().any(|l| !l.ip().is_loopback()) {
        tracing::warn!("listening beyond this machine without an API key (--api-key)");
    }
    for local in &locals {
        let url_host = match local {
            SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
            SocketAddr::V4(v4) => v4.ip().to_string(),
        };
        tracing::info!("listening on http://{url_host}:{}", local.port());
    }
    tokio::select! {
        done = &mut server => {
            done.context("the HTTP server task failed")?.context("the HTTP server task failed")?;
            tracing::info!("stopped");
            return Ok(());
        }
        () = signals.next() => {}
    }
    let grace = Duration::from_secs(a.shutdown_grace_s);
    tracing::info!(
        "shutting down: no new connections; open ones have {}s to finish \
         (--shutdown-grace); a second signal exits now",
        grace.as_secs()
    );
    let _ = stop.send(true);
    tokio::select! {
        done = &mut server => {
            done.context("the HTTP server task failed")?.context("the HTTP server task failed")?;
            tracing::info!("stopped");
            return Ok(());
        }
        // An operator who signals twice wants the process gone, whatever
        // is still streaming.
        () = signals.next() => {
            tracing::warn!("second signal: exiting without waiting for open requests");
            std::process::exit(130);
        }
        () = tokio::time::sleep(grace) => {}
    }
    // The grace is over: end what is still open, give the final events
    // a moment to reach their clients, and exit non-zero either way.
    cutoff.cut();
    tokio::select! {
        _ = &mut server => {}
        () = tokio::time::sleep(CUT_FLUSH) => {}
        () = signals.next() => std::process::exit(130),
    }
    bail!(
        "requests still open after --shutdown-grace {}s; ended {} of them with an error; exiting",
        grace.as_secs(),
        cutoff.cut_count()
    )
}

/// How long the requests cut at the end of the grace get to send their
/// final event before the process exits.
const CUT_FLUSH: Duration = Duration::from_secs(2);

/// SIGINT and SIGTERM, each delivery once (registered before serving, so a
/// second signal is seen rather than killing the process half-way).
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                int: signal(SignalKind::interrupt())?,
                term: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.int.recv() => {},
            _ = self.term.recv() => {},
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The log on stderr: RUST_LOG when set, else info (with `--verbose`,
/// Lamina's own debug lines too, not those of the HTTP libraries).
fn init_tracing(verbose: bool) {
    use std::io::IsTerminal as _;
    let default = if verbose {
        "info,lamina=debug,lamina_engine=debug"
    } else {
        "info"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
