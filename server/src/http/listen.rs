//! The accept loop: HTTP/1.1 connections from a listener to the router.
//!
//! `axum::serve` cannot bound how long a client takes to send its headers,
//! so a client that opens connections and dribbles bytes (slowloris) could
//! hold them forever. Here each connection is hyper's HTTP/1.1 connection
//! with a header read timeout: a client gets `read_timeout` to send a
//! request's headers, and an idle keep-alive connection is closed after the
//! same time. (The body gets its own deadline in `mod.rs`.)
//!
//! Shutdown: when `shutdown` resolves the listener closes, idle connections
//! close, and open requests (streams included) run to their end.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the
/// open connections to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        // Header names go out as `Access-Control-Allow-Origin`, as
        // llama-server writes them: HTTP says case does not matter, but
        // clients that copy headers into a plain dict (llama.cpp's own
        // tests among them) look names up exactly.
        .title_case_headers(true);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Stream deltas are small writes; do not hold them back (Nagle).
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                // A header timeout, a reset, a malformed request: the
                // client's problem, not the server's.
                tracing::debug!("connection closed: {e}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Errors of one connection that died in the queue are skipped; anything
/// else (out of file descriptors, most likely) gets a pause before the next
/// accept, so the loop does not spin.
async fn accept_failed(e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!("accepting a connection: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
