//! One MCP server process: newline-delimited JSON-RPC 2.0 over its stdin
//! and stdout (the MCP "stdio" transport), its stderr drained into a bounded
//! tail for diagnostics.
//!
//! Requests are multiplexed by id: each waits on its own reply, so
//! concurrent calls share one process and a reply that arrives after its
//! request gave up is dropped, never handed to the next request.
//! Notifications and the server's own requests are skipped.
//!
//! The child leads its own process group and [`Transport::close`] kills the
//! whole group, so a grandchild that inherited the pipes cannot keep them
//! open. Nothing waits for an end-of-file that a surviving grandchild could
//! withhold: the pipe readers are aborted on close, not joined.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::cancel::Cancel;
use crate::config::ServerConfig;
use crate::error::CallError;

/// The protocol revision this client speaks (the one llama-server sends).
pub const PROTOCOL_VERSION: &str = "2024-11-05";

/// A line longer than this is dropped: a child that never writes a newline
/// must not grow the buffer without bound.
const MAX_LINE: usize = 8 * 1024 * 1024;

/// How much of the child's stderr is kept for error messages.
const STDERR_TAIL: usize = 4096;

/// After the child exits, how long its last replies may still be read from
/// the pipe before waiting requests are told it closed.
const EXIT_GRACE: Duration = Duration::from_millis(200);

/// How long [`Transport::close`] waits for the killed child to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(2);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// A running MCP server.
pub struct Transport {
    server: String,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    pending: Pending,
    next_id: AtomicU64,
    /// Cleared when the child exits or its stdout closes.
    alive: Arc<AtomicBool>,
    /// Set once the child is reaped: its pid (the group id) may then be
    /// reused, so the group must not be signalled any more.
    reaped: Arc<AtomicBool>,
    pgid: Option<i32>,
    stderr_tail: Arc<Mutex<String>>,
    kill: Mutex<Option<oneshot::Sender<()>>>,
    exited: tokio::sync::Mutex<Option<oneshot::Receiver<()>>>,
    pumps: Mutex<Vec<JoinHandle<()>>>,
}

impl Transport {
    /// Spawns the server's process and starts reading its pipes; no
    /// message is sent yet (see [`Transport::start`]).
    pub fn spawn(config: &ServerConfig) -> Result<Self, CallError> {
        let mut cmd = Command::new(&config.command);
        cmd.args(&config.args)
            .envs(&config.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(cwd) = &config.cwd {
            cmd.current_dir(cwd);
        }
        #[cfg(unix)]
        cmd.process_group(0);
        let mut child = cmd.spawn().map_err(|source| CallError::Spawn {
            server: config.name.clone(),
            command: config.command.clone(),
            source,
        })?;
        let pgid = child.id().and_then(|pid| i32::try_from(pid).ok());
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();

        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let reaped = Arc::new(AtomicBool::new(false));
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        let mut pumps = Vec::new();
        if let Some(stdout) = stdout {
            pumps.push(tokio::spawn(read_replies(
                stdout,
                pending.clone(),
                alive.clone(),
                config.name.clone(),
            )));
        }
        if let Some(stderr) = stderr {
            pumps.push(tokio::spawn(drain_stderr(
                stderr,
                stderr_tail.clone(),
                config.name.clone(),
            )));
        }
        let (kill_tx, kill_rx) = oneshot::channel();
        let (exited_tx, exited_rx) = oneshot::channel();
        tokio::spawn(watch_child(
            child,
            pgid,
            kill_rx,
            exited_tx,
            Watched {
                pending: pending.clone(),
                alive: alive.clone(),
                reaped: reaped.clone(),
            },
        ));
        Ok(Self {
            server: config.name.clone(),
            stdin: tokio::sync::Mutex::new(stdin),
            pending,
            next_id: AtomicU64::new(1),
            alive,
            reaped,
            pgid,
            stderr_tail,
            kill: Mutex::new(Some(kill_tx)),
            exited: tokio::sync::Mutex::new(Some(exited_rx)),
            pumps: Mutex::new(pumps),
        })
    }

    /// Spawns the server and runs the `initialize` handshake within `limit`.
    /// A server that fails the handshake is closed before the error returns.
    pub async fn start(
        config: &ServerConfig,
        limit: Duration,
        cancel: &Cancel,
    ) -> Result<Self, CallError> {
        let transport = Self::spawn(config)?;
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "lamina", "version": env!("CARGO_PKG_VERSION")},
        });
        let handshake = async {
            transport
                .request("initialize", params, limit, cancel)
                .await?;
            transport.notify("notifications/initialized").await
        };
        match handshake.await {
            Ok(()) => Ok(transport),
            Err(e) => {
                transport.close().await;
                Err(e)
            }
        }
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// Whether the child still runs with its stdout open. Never blocks.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// The tail of the child's stderr, for error messages and logs.
    pub fn diagnostics(&self) -> String {
        lock(&self.stderr_tail).trim().to_owned()
    }

    /// Sends a request and waits for its reply's `result`, at most
    /// `timeout`, or until `cancel` fires.
    pub async fn request(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
        cancel: &Cancel,
    ) -> Result<Value, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        // Removes the entry however this returns, so a late reply is dropped.
        let _pending = PendingEntry {
            pending: &self.pending,
            id,
        };
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let exchange = async {
            self.send(&message).await?;
            rx.await.map_err(|_| self.closed())
        };
        let reply = tokio::select! {
            reply = exchange => reply?,
            () = tokio::time::sleep(timeout) => {
                return Err(CallError::TimedOut {
                    server: self.server.clone(),
                    method: method.to_owned(),
                    timeout,
                })
            }
            () = cancel.cancelled() => return Err(CallError::Cancelled),
        };
        if let Some(error) = reply.get("error") {
            return Err(CallError::Rpc {
                server: self.server.clone(),
                method: method.to_owned(),
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: match error {
                    Value::String(s) => s.clone(),
                    e => e
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown error")
                        .to_owned(),
                },
            });
        }
        match reply.get("result") {
            Some(result) => Ok(result.clone()),
            None => Err(CallError::NoResult {
                server: self.server.clone(),
                method: method.to_owned(),
            }),
        }
    }

    /// Sends a notification (no id, no reply).
    pub async fn notify(&self, method: &str) -> Result<(), CallError> {
        self.send(&json!({"jsonrpc": "2.0", "method": method}))
            .await
    }

    async fn send(&self, message: &Value) -> Result<(), CallError> {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        let mut stdin = self.stdin.lock().await;
        let Some(writer) = stdin.as_mut() else {
            return Err(self.closed());
        };
        let written = async {
            writer.write_all(&line).await?;
            writer.flush().await
        };
        if written.await.is_err() {
            *stdin = None;
            self.alive.store(false, Ordering::Release);
            return Err(self.closed());
        }
        Ok(())
    }

    fn closed(&self) -> CallError {
        CallError::Closed {
            server: self.server.clone(),
            diagnostics: self.diagnostics(),
        }
    }

    /// Kills the server's process group and waits (briefly) for the child
    /// to be reaped. Idempotent.
    pub async fn close(&self) {
        self.alive.store(false, Ordering::Release);
        if let Some(kill) = lock(&self.kill).take() {
            let _ = kill.send(());
        }
        // Closing stdin first lets a well-behaved server see end-of-input.
        self.stdin.lock().await.take();
        if let Some(exited) = self.exited.lock().await.take() {
            let _ = tokio::time::timeout(REAP_WAIT, exited).await;
        }
        for pump in lock(&self.pumps).drain(..) {
            pump.abort();
        }
        lock(&self.pending).clear();
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        // Dropped without close (the runtime is going away): kill the group
        // now, since the watcher task may never run again.
        if !self.reaped.load(Ordering::Acquire) {
            kill_group(self.pgid);
        }
        for pump in lock(&self.pumps).drain(..) {
            pump.abort();
        }
    }
}

struct PendingEntry<'a> {
    pending: &'a Pending,
    id: u64,
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        lock(self.pending).remove(&self.id);
    }
}

/// A poisoned lock only means another thread panicked while holding it;
/// the maps and strings behind these locks stay usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn kill_group(pgid: Option<i32>) {
    #[cfg(unix)]
    if let Some(pgid) = pgid.filter(|&p| p > 0) {
        // SAFETY: killpg only sends a signal; the group is the one this
        // transport's child leads, and it has not been reaped yet, so the
        // id cannot name anyone else's group.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
    #[cfg(not(unix))]
    let _ = pgid;
}

struct Watched {
    pending: Pending,
    alive: Arc<AtomicBool>,
    reaped: Arc<AtomicBool>,
}

/// Owns the child: waits for it to exit or to be told to kill it.
async fn watch_child(
    mut child: Child,
    pgid: Option<i32>,
    kill: oneshot::Receiver<()>,
    exited: oneshot::Sender<()>,
    w: Watched,
) {
    let killed = tokio::select! {
        _ = child.wait() => false,
        _ = kill => true,
    };
    if killed {
        kill_group(pgid);
        let _ = child.kill().await;
    }
    w.reaped.store(true, Ordering::Release);
    w.alive.store(false, Ordering::Release);
    let _ = exited.send(());
    if !killed {
        // Replies written just before exiting may still sit in the pipe.
        tokio::time::sleep(EXIT_GRACE).await;
    }
    // Dropping the senders tells every waiting request the server is gone.
    lock(&w.pending).clear();
}

/// Hands each reply on stdout to the request waiting for its id.
async fn read_replies(
    stdout: impl AsyncRead + Unpin,
    pending: Pending,
    alive: Arc<AtomicBool>,
    server: String,
) {
    let mut lines = Lines::new(stdout);
    while let Some(line) = lines.next().await {
        let Ok(message) = serde_json::from_slice::<Value>(&line) else {
            tracing::debug!(%server, "MCP server wrote a line that is not JSON; skipped");
            continue;
        };
        // A notification (no id) or a request from the server (a method):
        // nothing waits for either.
        if message.get("method").is_some() {
            continue;
        }
        let Some(id) = message.get("id").and_then(Value::as_u64) else {
            continue;
        };
        if let Some(waiter) = lock(&pending).remove(&id) {
            let _ = waiter.send(message);
        }
    }
    alive.store(false, Ordering::Release);
    lock(&pending).clear();
}

async fn drain_stderr(stderr: impl AsyncRead + Unpin, tail: Arc<Mutex<String>>, server: String) {
    let mut lines = Lines::new(stderr);
    while let Some(line) = lines.next().await {
        let line = String::from_utf8_lossy(&line);
        tracing::debug!(%server, "MCP server stderr: {line}");
        let mut tail = lock(&tail);
        tail.push_str(&line);
        tail.push('\n');
        if tail.len() > STDERR_TAIL {
            let mut cut = tail.len() - STDERR_TAIL;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail.drain(..cut);
        }
    }
}

/// Newline-delimited frames from a pipe, each at most [`MAX_LINE`] bytes.
struct Lines<R> {
    inner: R,
    buf: Vec<u8>,
    /// Bytes of `buf` already known to hold no newline.
    scanned: usize,
    /// Dropping the rest of an over-long line.
    skipping: bool,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            scanned: 0,
            skipping: false,
        }
    }

    async fn next(&mut self) -> Option<Vec<u8>> {
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + pos;
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                self.scanned = 0;
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                let skipped = std::mem::take(&mut self.skipping);
                if skipped || line.len() > MAX_LINE || line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(line);
            }
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_LINE {
                tracing::warn!("MCP server wrote a line over {MAX_LINE} bytes; dropped");
                self.buf.clear();
                self.scanned = 0;
                self.skipping = true;
            }
            let n = self.inner.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_split_skip_blank_and_drop_overlong() {
        let mut input = b"{\"a\":1}\r\n\n  \n{\"b\":2}\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
        input.extend_from_slice(b"\n{\"c\":3}\npartial");
        let mut lines = Lines::new(&input[..]);
        let mut frames = Vec::new();
        while let Some(line) = lines.next().await {
            // Compared as text so a failure prints a line, not megabytes.
            frames.push(String::from_utf8_lossy(&line[..line.len().min(40)]).into_owned());
        }
        // The over-long line is dropped, and an unterminated last line is
        // not a frame.
        assert_eq!(frames, ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"]);
    }
}
