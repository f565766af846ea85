//! `lamina bench serve`: the server under load, as its clients see it.
//!
//! Starts the server in this process on a free loopback port (the router,
//! accept loop and engine of `lamina serve`), sends one warm-up request, then
//! for each concurrency level runs that many clients at once. Each client
//! sends `--requests-per-client` streaming chat completions one after
//! another over plain HTTP/1.1 (a different short prompt each, temperature
//! 0 unless `--temperature` says otherwise, a fixed `max_tokens`) and times
//! the first content delta and the end of the stream. Per level: generated
//! tokens per second of the level's wall time, requests per second, p50 and
//! p99 time to first token, p50 end-to-end latency. Everything is bounded: the counts are capped and
//! every request has a deadline.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use lamina_engine::{Engine, EngineConfig};
use lamina_model::placement::Ngl;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};

use crate::http::{self, AppState};

/// What is measured.
pub enum Target {
    /// A model served in this process.
    Model(PathBuf),
    /// A server already listening at `HOST:PORT` (any OpenAI-compatible
    /// one: the client only speaks streaming chat completions).
    Server(String),
}

pub struct ServeBenchArgs {
    pub target: Target,
    /// Concurrency levels, run in this order.
    pub clients: Vec<usize>,
    pub requests_per_client: usize,
    pub max_tokens: usize,
    /// Every request's temperature; above 0, each request also sends a
    /// seed of its own (its number), so a run repeats.
    pub temperature: f32,
    /// Server slots; `None`: the largest level.
    pub parallel: Option<usize>,
    /// Total context; `None`: `max_tokens + 256` per slot.
    pub n_ctx: Option<usize>,
    pub ngl: Ngl,
    /// Seconds one request may take before it counts as failed.
    pub timeout_s: u64,
    /// Each client's requests are the turns of one conversation.
    pub conversation: bool,
    /// The served model's host prompt cache (`EngineConfig::cache_ram`);
    /// `None`: the engine's default.
    pub cache_ram: Option<Option<u64>>,
    pub json: bool,
}

const MAX_CLIENTS: usize = 256;
const MAX_REQUESTS_PER_CLIENT: usize = 1000;
const MAX_LEVELS: usize = 16;
const MAX_TOKENS: usize = 4096;

/// Short prompts that invite answers longer than the usual `max_tokens`.
const TOPICS: [&str; 16] = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe a walk through a forest in autumn.",
    "What should I pack for a week of hiking?",
    "Explain photosynthesis to a ten-year-old.",
    "Write a poem about the sea at night.",
    "Give me three tips for learning to cook.",
    "Describe how bread is made, step by step.",
    "Why is the sky blue? Explain in detail.",
    "Tell me about the history of the printing press.",
    "Write a letter to a friend about a trip to the mountains.",
    "Explain what a compiler does.",
    "Describe a busy market in the morning.",
    "How do bees make honey?",
    "Write a short fable about a fox and a crow.",
    "Explain how rain forms.",
];

/// What a conversation's client asks after each reply (`--conversation`).
const FOLLOW_UPS: [&str; 6] = [
    "Tell me more about that.",
    "Can you give an example?",
    "Why is that so?",
    "Summarise what you said in one sentence.",
    "What would change if it were the other way around?",
    "Go on.",
];

/// What one request measured.
struct Sample {
    /// To the first non-empty content delta.
    ttft: Option<Duration>,
    /// To `data: [DONE]`.
    latency: Duration,
    /// `usage.completion_tokens` (content deltas if the usage chunk is missing).
    tokens: u64,
    /// The reply's content.
    text: String,
}

struct Level {
    clients: usize,
    samples: Vec<Sample>,
    errors: Vec<String>,
    wall: Duration,
}

impl Level {
    fn tokens(&self) -> u64 {
        self.samples.iter().map(|s| s.tokens).sum()
    }

    fn ttft_ms(&self, pct: f64) -> Option<f64> {
        percentile(self.samples.iter().filter_map(|s| s.ttft).collect(), pct)
    }

    fn latency_ms(&self, pct: f64) -> Option<f64> {
        percentile(self.samples.iter().map(|s| s.latency).collect(), pct)
    }

    fn per_second(&self, n: f64) -> f64 {
        n / self.wall.as_secs_f64().max(1e-9)
    }

    fn to_json(&self, requests_per_client: usize) -> Value {
        json!({
            "clients": self.clients,
            "requests": self.clients * requests_per_client,
            "errors": self.errors.len(),
            "generated_tokens": self.tokens(),
            "wall_s": self.wall.as_secs_f64(),
            "tokens_per_s": self.per_second(self.tokens() as f64),
            "requests_per_s": self.per_second(self.samples.len() as f64),
            "ttft_p50_ms": self.ttft_ms(50.0),
            "ttft_p99_ms": self.ttft_ms(99.0),
            "latency_p50_ms": self.latency_ms(50.0),
        })
    }
}

/// Nearest-rank percentile, in milliseconds.
fn percentile(mut v: Vec<Duration>, pct: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let rank = ((pct / 100.0) * v.len() as f64).ceil() as usize;
    let i = rank.clamp(1, v.len()) - 1;
    Some(v[i].as_secs_f64() * 1e3)
}

pub fn run(a: &ServeBenchArgs) -> anyhow::Result<()> {
    let max_clients = a.clients.iter().copied().max().unwrap_or(0);
    if a.clients.is_empty() || a.clients.len() > MAX_LEVELS {
        bail!("--clients takes 1 to {MAX_LEVELS} levels");
    }
    if a.clients.contains(&0) || max_clients > MAX_CLIENTS {
        bail!("--clients levels must be 1 to {MAX_CLIENTS}");
    }
    if !(1..=MAX_REQUESTS_PER_CLIENT).contains(&a.requests_per_client) {
        bail!("--requests-per-client must be 1 to {MAX_REQUESTS_PER_CLIENT}");
    }
    if !(1..=MAX_TOKENS).contains(&a.max_tokens) {
        bail!("--max-tokens must be 1 to {MAX_TOKENS}");
    }
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        bail!("--temperature must be 0 or more");
    }
    let timeout = Duration::from_secs(a.timeout_s.max(1));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lamina-bench")
        .build()
        .context("starting the async runtime")?;
    let threads = rayon::current_num_threads();
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let (levels, header) = match &a.target {
        Target::Server(addr) => {
            let addr = resolve(addr)?;
            if !a.json {
                eprintln!(
                    "the server at {addr}: {} requests per client, max_tokens {}, streaming, \
                     temperature {}",
                    a.requests_per_client, a.max_tokens, a.temperature
                );
            }
            let levels = rt.block_on(measure(a, addr, timeout))?;
            (levels, json!({ "server": addr.to_string() }))
        }
        Target::Model(file) => {
            let parallel = a.parallel.unwrap_or(max_clients).max(1);
            let defaults = EngineConfig::new(file);
            let engine = Engine::start(EngineConfig {
                // A conversation's last turn holds all of its turns.
                n_ctx: Some(a.n_ctx.unwrap_or(parallel * slot_context(a))),
                n_parallel: parallel,
                max_queue: max_clients,
                max_tokens: a.max_tokens,
                timeout,
                ngl: a.ngl,
                cache_ram: a.cache_ram.unwrap_or(defaults.cache_ram),
                ..defaults
            })?;
            let info = engine
                .wait_ready(Duration::from_secs(600))
                .context("loading the model")?;
            if !a.json {
                eprintln!("{}", info.placement);
                eprintln!(
                    "{}: --parallel {parallel} ({} tokens per slot), {threads} threads, {build} \
                     build; {} requests per client{}, max_tokens {}, streaming, temperature {}",
                    info.id,
                    info.n_ctx_slot,
                    a.requests_per_client,
                    if a.conversation {
                        " (one conversation each)"
                    } else {
                        ""
                    },
                    a.max_tokens,
                    a.temperature
                );
            }
            let levels = rt.block_on(drive(a, engine, timeout))?;
            let header = json!({
                "model": info.id,
                "placement": info.placement,
                "parallel": parallel,
                "n_ctx_slot": info.n_ctx_slot,
                "conversation": a.conversation,
                "threads": threads,
                "build": build,
            });
            (levels, header)
        }
    };

    let failed: usize = levels.iter().map(|l| l.errors.len()).sum();
    if a.json {
        let mut out = header;
        out["max_tokens"] = json!(a.max_tokens);
        out["temperature"] = json!(a.temperature);
        out["requests_per_client"] = json!(a.requests_per_client);
        out["levels"] = json!(levels
            .iter()
            .map(|l| l.to_json(a.requests_per_client))
            .collect::<Vec<_>>());
        println!("{out}");
    } else {
        print!("{}", table(&levels, a.requests_per_client));
    }
    if let Some(first) = levels.iter().find_map(|l| l.errors.first()) {
        bail!("{failed} requests failed; the first: {first}");
    }
    Ok(())
}

fn table(levels: &[Level], requests_per_client: usize) -> String {
    use std::fmt::Write as _;
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| clients | requests | errors | generated tokens | wall s | tokens/s | requests/s | TTFT p50 ms | TTFT p99 ms | latency p50 ms |"
    );
    let _ = writeln!(
        s,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for l in levels {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {} | {} | {} |",
            l.clients,
            l.clients * requests_per_client,
            l.errors.len(),
            l.tokens(),
            l.wall.as_secs_f64(),
            l.per_second(l.tokens() as f64),
            l.per_second(l.samples.len() as f64),
            ms(l.ttft_ms(50.0)),
            ms(l.ttft_ms(99.0)),
            ms(l.latency_ms(50.0)),
        );
    }
    s
}

/// Serves on a free loopback port, warms up, runs every level, stops.
async fn drive(
    a: &ServeBenchArgs,
    engine: Engine,
    timeout: Duration,
) -> anyhow::Result<Vec<Level>> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding a loopback port")?;
    let addr = listener.local_addr()?;
    let app = http::app(Arc::new(AppState::new(engine, None, 1 << 20)));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve(
        listener,
        app,
        http::DEFAULT_READ_TIMEOUT,
        async move {
            let _ = stopped.await;
        },
    ));
    let levels = measure(a, addr, timeout).await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    levels
}

/// `HOST:PORT` as one socket address (the first the name resolves to).
fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("--server {addr}: not HOST:PORT"))?
        .next()
        .with_context(|| format!("--server {addr}: the name resolves to no address"))
}

/// Warms the server at `addr` up, then runs every level against it.
async fn measure(
    a: &ServeBenchArgs,
    addr: SocketAddr,
    timeout: Duration,
) -> anyhow::Result<Vec<Level>> {
    // A request's deadline on the client side: the server's own limit, and
    // a margin for the response to arrive.
    let deadline = timeout + Duration::from_secs(10);

    let warm = body(&[user("Say hello.")], a, 0);
    tokio::time::timeout(deadline, request(addr, warm))
        .await
        .map_err(|_| anyhow::anyhow!("the warm-up request timed out"))?
        .context("the warm-up request")?;

    let mut levels = Vec::new();
    let mut n = 0usize;
    for &clients in &a.clients {
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..clients {
            let turns: Vec<usize> = (0..a.requests_per_client)
                .map(|k| n + k * clients + c)
                .collect();
            let conversation = a.conversation;
            let (max_tokens, temperature) = (a.max_tokens, a.temperature);
            tasks.spawn(async move {
                let mut out = Vec::new();
                // A conversation's messages so far; otherwise one prompt each.
                let mut messages = Vec::new();
                for (k, &i) in turns.iter().enumerate() {
                    if !conversation || k == 0 {
                        messages = vec![user(&prompt(i))];
                    }
                    let b = body_with(&messages, max_tokens, temperature, i);
                    let r = match tokio::time::timeout(deadline, request(addr, b)).await {
                        Ok(r) => r.map_err(|e| format!("{e:#}")),
                        Err(_) => Err(format!("no answer within {} s", deadline.as_secs())),
                    };
                    if let Ok(s) = &r {
                        messages.push(json!({"role": "assistant", "content": s.text}));
                        messages.push(user(FOLLOW_UPS[k % FOLLOW_UPS.len()]));
                    }
                    out.push(r);
                }
                out
            });
        }
        n += clients * a.requests_per_client;
        let mut level = Level {
            clients,
            samples: Vec::new(),
            errors: Vec::new(),
            wall: Duration::ZERO,
        };
        while let Some(done) = tasks.join_next().await {
            for r in done.context("a client task failed")? {
                match r {
                    Ok(s) => level.samples.push(s),
                    Err(e) => level.errors.push(e),
                }
            }
        }
        level.wall = start.elapsed();
        levels.push(level);
    }
    Ok(levels)
}

/// The prompt of request `n`: every request's prompt differs, so between
/// two requests only the template's opening is a shared prefix.
fn prompt(n: usize) -> String {
    format!("Request {n}. {}", TOPICS[n % TOPICS.len()])
}

/// A slot's context when the model is served here: a request's reply and
/// 256 tokens for its prompt, times the turns of a conversation.
fn slot_context(a: &ServeBenchArgs) -> usize {
    let turns = if a.conversation {
        a.requests_per_client.max(1)
    } else {
        1
    };
    (a.max_tokens + 256).saturating_mul(turns)
}

fn user(content: &str) -> Value {
    json!({"role": "user", "content": content})
}

/// Request `n`'s body: its messages, and for a positive temperature the
/// seed `n`.
fn body(messages: &[Value], a: &ServeBenchArgs, n: usize) -> String {
    body_with(messages, a.max_tokens, a.temperature, n)
}

fn body_with(messages: &[Value], max_tokens: usize, temperature: f32, n: usize) -> String {
    let mut b = json!({
        "model": "bench",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if temperature > 0.0 {
        b["seed"] = json!(n);
    }
    b.to_string()
}

/// One streaming chat completion over a fresh connection, timed from the
/// connect to `data: [DONE]`.
async fn request(addr: SocketAddr, body: String) -> anyhow::Result<Sample> {
    let t0 = Instant::now();
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    write_all(&s, req.as_bytes()).await?;

    let mut buf = vec![0u8; 16 * 1024];
    let mut head = Vec::new();
    let (chunked, mut rest) = loop {
        let n = read_some(&s, &mut buf).await?;
        if n == 0 {
            bail!("the connection closed before the response headers");
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            let status = text.split_whitespace().nth(1).unwrap_or("");
            if status != "200" {
                let body = String::from_utf8_lossy(&head[end + 4..]).into_owned();
                bail!("HTTP {status}: {}", body.trim());
            }
            break (
                text.contains("transfer-encoding: chunked"),
                head.split_off(end + 4),
            );
        }
        if head.len() > 64 * 1024 {
            bail!("response headers longer than 64 KiB");
        }
    };

    let mut dechunk = Dechunk::default();
    let mut events = Events::default();
    loop {
        let data = if chunked {
            dechunk.push(&rest)?;
            std::mem::take(&mut dechunk.out)
        } else {
            std::mem::take(&mut rest)
        };
        if events.push(&data, t0)? {
            return Ok(Sample {
                ttft: events.ttft,
                latency: t0.elapsed(),
                tokens: events.usage.unwrap_or(events.deltas),
                text: events.text,
            });
        }
        let n = read_some(&s, &mut buf).await?;
        if n == 0 {
            bail!("the stream ended before data: [DONE]");
        }
        rest = buf[..n].to_vec();
    }
}

/// The SSE events of one response, read as they arrive.
#[derive(Default)]
struct Events {
    pending: Vec<u8>,
    ttft: Option<Duration>,
    deltas: u64,
    usage: Option<u64>,
    text: String,
}

impl Events {
    /// Takes the next bytes of the body; true once `data: [DONE]` came.
    fn push(&mut self, bytes: &[u8], t0: Instant) -> anyhow::Result<bool> {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue; // comments (pings) and other fields
                };
                let data = data.trim();
                if data == "[DONE]" {
                    return Ok(true);
                }
                let v: Value = serde_json::from_str(data)
                    .with_context(|| format!("an event that is not JSON: {data}"))?;
                if let Some(e) = v.get("error") {
                    bail!("the stream failed: {e}");
                }
                let content = v["choices"][0]["delta"]["content"].as_str();
                if let Some(c) = content.filter(|c| !c.is_empty()) {
                    self.text.push_str(c);
                    self.deltas += 1;
                    self.ttft.get_or_insert_with(|| t0.elapsed());
                }
                if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                    self.usage = Some(n);
                }
            }
        }
        Ok(false)
    }
}

/// Chunked transfer encoding, decoded as bytes arrive.
#[derive(Default)]
struct Dechunk {
    pending: Vec<u8>,
    out: Vec<u8>,
}

impl Dechunk {
    fn push(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.pending.extend_from_slice(bytes);
        loop {
            let Some(eol) = self.pending.windows(2).position(|w| w == b"\r\n") else {
                return Ok(());
            };
            let line = String::from_utf8_lossy(&self.pending[..eol]);
            let hex = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(hex, 16)
                .with_context(|| format!("a bad chunk size {hex:?}"))?;
            if size == 0 {
                return Ok(());
            }
            let end = eol + 2 + size + 2;
            if self.pending.len() < end {
                return Ok(());
            }
            self.out
                .extend_from_slice(&self.pending[eol + 2..eol + 2 + size]);
            self.pending.drain(..end);
        }
    }
}

async fn read_some(s: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        s.readable().await?;
        match s.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

async fn write_all(s: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        s.writable().await?;
        match s.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms = |v: &[u64]| v.iter().map(|&m| Duration::from_millis(m)).collect();
        assert_eq!(percentile(ms(&[]), 50.0), None);
        assert_eq!(percentile(ms(&[7]), 99.0), Some(7.0));
        assert_eq!(percentile(ms(&[4, 1, 3, 2]), 50.0), Some(2.0));
        assert_eq!(percentile(ms(&[4, 1, 3, 2]), 99.0), Some(4.0));
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(ms(&hundred), 99.0), Some(99.0));
    }

    #[test]
    fn chunks_and_events_split_anywhere() {
        let body = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n: ping\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
        let mut wire = Vec::new();
        for part in body.as_bytes().chunks(7) {
            wire.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            wire.extend_from_slice(part);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        let t0 = Instant::now();
        let (mut d, mut e) = (Dechunk::default(), Events::default());
        let mut done = false;
        for piece in wire.chunks(5) {
            d.push(piece).unwrap();
            done = e.push(&std::mem::take(&mut d.out), t0).unwrap();
            if done {
                break;
            }
        }
        assert!(done);
        assert_eq!((e.deltas, e.usage), (1, Some(3)));
        assert_eq!(e.text, "Hi");
        assert!(e.ttft.is_some());
    }
}
