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
    /// Skip the engine's warm-up steps at load (`EngineConfig::warmup`).
    pub no_warmup: bool,
    /// The host prompt cache's bytes (`EngineConfig::cache_ram`); `None`:
    /// the engine's default.
    pub cache_ram: Option<Option<u64>>,
    /// Prompt tokens per step (`-b`/`-ub`); `None`: the engine's default.
    pub n_batch: Option<usize>,
    /// Speculative decoding (`--spec-type`, `--draft-max`, …).
    pub spec: lamina_engine::Speculation,
    /// `--step-budget-ms`; `None`: prompts are not paced.
    pub step_budget: Option<Duration>,
    /// `--tools`, split at commas (empty: `/tools` is off).
    pub tools: Vec<String>,
    /// `--tools-runtime`: where the tools run.
    pub tools_runtime: Option<String>,
    /// What the HTTP layer takes from the command line.
    pub http: http::Options,
    /// `--mcp-servers-json`/`--mcp-servers-config`: served at /tools.
    pub mcp_servers: Vec<lamina_mcp::ServerConfig>,
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    init_tracing(a.http.verbose);
    let tools = tools(
        &a.tools,
        a.tools_runtime.as_deref(),
        !a.mcp_servers.is_empty(),
    )?;
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
    rt.block_on(serve(a, tools, api_key, chat_template))
}

/// The tools `--tools` enables, run where `--tools-runtime` says; `None`
/// when it names none and there are no MCP servers (`mcp`) to add to them.
fn tools(
    names: &[String],
    runtime: Option<&str>,
    mcp: bool,
) -> anyhow::Result<Option<lamina_tools::Tools>> {
    if names.is_empty() {
        if runtime.is_some() {
            tracing::warn!("--tools-runtime without --tools: no tools to run");
        }
        return Ok(mcp
            .then(|| lamina_tools::Tools::new(&[], None))
            .transpose()?);
    }
    let tools = lamina_tools::Tools::new(names, runtime).context("--tools")?;
    let enabled: Vec<String> = tools.entries().into_iter().map(|e| e.name).collect();
    tracing::warn!(
        "built-in tools enabled ({}): POST /tools reads and writes files and runs shell \
         commands as this user{}; do not expose this server to untrusted clients",
        enabled.join(", "),
        runtime.map_or(String::new(), |r| format!(" (runtime {r})"))
    );
    Ok(Some(tools))
}

struct StopTools(Option<Arc<lamina_tools::Tools>>);

impl Drop for StopTools {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.shutdown();
        }
    }
}

async fn serve(
    mut a: ServeArgs,
    tools: Option<lamina_tools::Tools>,
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
        warmup: !a.no_warmup,
        spec: a.spec,
        cache_ram: a
            .cache_ram
            .unwrap_or_else(|| Some(lamina_engine::default_cache_ram())),
        ..EngineConfig::new(&a.file)
    })?;
    let keyed = api_key.is_some();
    let reranking = a.http.reranking;
    let read_timeout = Duration::from_secs(a.read_timeout_s.max(1));
    let (cutoff, cut_signal) = http::shutdown::channel();
    // The MCP servers' tools are discovered while the model loads; a
    // listing asked for before that ends waits for it.
    let mcp = (!a.mcp_servers.is_empty()).then(|| Arc::new(http::mcp::Mcp::new(a.mcp_servers)));
    let mut warm_up = mcp
        .clone()
        .map(|mcp| tokio::spawn(async move { mcp.warm_up().await }));
    let tools = tools.map(|t| {
        Arc::new(match &mcp {
            Some(mcp) => t.with_source(Box::new(http::mcp::McpSource::new(
                mcp.clone(),
                tokio::runtime::Handle::current(),
            ))),
            None => t,
        })
    });
    // Stops the container `--tools-runtime docker:<image>` started, however
    // serving ends.
    let _stop_tools = StopTools(tools.clone());
    a.http.tools = tools;
    let state = AppState::new(engine.clone(), api_key, a.body_limit)
        .with_read_timeout(read_timeout)
        .with_prepare(
            http::default_prepare_slots(),
            Duration::from_secs(a.timeout_s.max(1)),
        )
        .with_cutoff(cut_signal)
        .with_options(a.http);
    let state = match &mcp {
        Some(mcp) => state.with_mcp(mcp.clone()),
        None => state,
    };
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
    if let Some(warm_up) = warm_up.take() {
        let _ = warm_up.await;
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
    // Calls to MCP tools end now (with an error) rather than hold the exit.
    if let Some(mcp) = &mcp {
        mcp.shutdown().await;
    }
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
