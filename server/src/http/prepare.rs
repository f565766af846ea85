//! The bounded pool that turns a request into prompt tokens: rendering the
//! chat template and tokenizing.
//!
//! Both are CPU work kept off the async workers. tokio's blocking pool
//! grows to hundreds of threads, so a template that takes its whole budget
//! (see `lamina_chat::Limits`: ~50 ms, a few MiB) would, under N concurrent
//! requests, take N threads and N budgets at once. Here at most
//! [`default_slots`] preparations run together; the others wait for a slot,
//! and a request that cannot get one within the server's request timeout
//! (`--timeout`) is answered 503, as when the queue is full.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::error::ApiError;

/// Slots by default: the machine's cores, at least 2 (so one slow render
/// cannot hold up every other) and at most 4. A preparation holds its
/// thread for at most a render's time limit, and more threads than cores
/// would only make them share the same CPUs with the decoding threads.
pub fn default_slots() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4))
}

pub struct Prepare {
    slots: Arc<Semaphore>,
    /// Longest a request waits for a slot.
    wait: Duration,
}

impl Prepare {
    pub fn new(slots: usize, wait: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            wait,
        }
    }

    /// Runs `f` on a blocking thread once a slot is free.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let permit = match tokio::time::timeout(self.wait, self.slots.clone().acquire_owned()).await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(ApiError::internal("the prompt pool was closed")),
            Err(_) => {
                return Err(ApiError::unavailable(
                    format!(
                        "no prompt could be prepared within {} s (--timeout): every \
                             template slot was busy",
                        self.wait.as_secs_f64()
                    ),
                    "server_overloaded",
                ))
            }
        };
        // The permit moves to the thread: a request whose client leaves
        // still holds its slot until the work it started is done, so the
        // bound is on threads, not on waiting requests.
        tokio::task::spawn_blocking(move || {
            let _slot = permit;
            f()
        })
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    use axum::http::StatusCode;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_most_the_slots_run_at_once() {
        let pool = Arc::new(Prepare::new(2, Duration::from_secs(30)));
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let jobs: Vec<_> = (0..8)
            .map(|_| {
                let (pool, now, peak) = (pool.clone(), now.clone(), peak.clone());
                tokio::spawn(async move {
                    pool.run(move || {
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(30));
                        now.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .await
                })
            })
            .collect();
        for job in jobs {
            job.await.unwrap().unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_request_waits_for_a_slot_no_longer_than_its_timeout() {
        let pool = Prepare::new(1, Duration::from_millis(200));
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel();
        let busy = pool.run(move || {
            let _ = started.send(());
            let _ = held.recv();
            Ok(())
        });
        let waiting = async {
            running.await.unwrap();
            let t0 = std::time::Instant::now();
            let r = pool.run(|| Ok(())).await;
            let _ = release.send(());
            (r, t0.elapsed())
        };
        let (done, (r, took)) = tokio::join!(busy, waiting);
        done.unwrap();
        let e = r.unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.code, Some("server_overloaded"));
        assert!(e.message.contains("--timeout"), "{}", e.message);
        assert!(
            took >= Duration::from_millis(190) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }
}
