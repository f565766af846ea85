//! Ending open requests when `--shutdown-grace` runs out.
//!
//! `lamina serve` stops accepting on the first signal and lets open
//! requests finish. When the grace period ends, [`Cutoff::cut`] tells every
//! request still running to stop: a stream sends a final error event
//! (`data: {"error": ...}`, then `data: [DONE]`) and ends, a request
//! waiting for its whole answer gets a 503, and the process then exits
//! non-zero, saying how many it cut.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use super::error::ApiError;

/// Held by whoever decides when the grace is over.
pub struct Cutoff {
    tx: watch::Sender<bool>,
    cut: Arc<AtomicUsize>,
}

/// Held by every request, to hear the cut.
#[derive(Clone)]
pub struct CutSignal {
    rx: watch::Receiver<bool>,
    cut: Arc<AtomicUsize>,
}

/// A cutoff and the signal its requests listen to.
pub fn channel() -> (Cutoff, CutSignal) {
    let (tx, rx) = watch::channel(false);
    let cut = Arc::new(AtomicUsize::new(0));
    (
        Cutoff {
            tx,
            cut: cut.clone(),
        },
        CutSignal { rx, cut },
    )
}

impl Cutoff {
    /// Ends every open request.
    pub fn cut(&self) {
        self.tx.send_replace(true);
    }

    /// Requests that were ended by [`Cutoff::cut`].
    pub fn cut_count(&self) -> usize {
        self.cut.load(Ordering::Acquire)
    }
}

impl CutSignal {
    /// A signal that never fires (no cutoff holds it): for servers run
    /// without a shutdown grace, such as the tests' and `bench serve`'s.
    pub fn never() -> Self {
        channel().1
    }

    /// Resolves when the open requests are cut, counting this one.
    pub async fn cut(&mut self) {
        loop {
            if *self.rx.borrow_and_update() {
                self.cut.fetch_add(1, Ordering::AcqRel);
                return;
            }
            if self.rx.changed().await.is_err() {
                // The cutoff is gone: nobody can cut any more.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// What a cut request is told.
pub fn error() -> ApiError {
    ApiError::unavailable(
        "the server is shutting down and ended this request before it finished \
         (--shutdown-grace)",
        "server_shutting_down",
    )
}
