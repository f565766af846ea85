//! A shutdown signal that every request waits on beside its reply, so a
//! slow tool cannot hold the server's exit for its whole timeout.

use tokio::sync::watch;

/// Fires once, for everyone holding a [`Cancel`].
#[derive(Debug)]
pub struct Canceller(watch::Sender<bool>);

/// Heard by requests: [`Cancel::cancelled`] resolves once the canceller fires.
#[derive(Debug, Clone)]
pub struct Cancel(watch::Receiver<bool>);

impl Canceller {
    pub fn new() -> Self {
        Self(watch::channel(false).0)
    }

    pub fn cancel(&self) {
        self.0.send_replace(true);
    }

    pub fn signal(&self) -> Cancel {
        Cancel(self.0.subscribe())
    }
}

impl Default for Canceller {
    fn default() -> Self {
        Self::new()
    }
}

impl Cancel {
    /// A signal nobody can fire.
    pub fn never() -> Self {
        Canceller::new().signal()
    }

    pub fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    pub async fn cancelled(&self) {
        let mut rx = self.0.clone();
        loop {
            if *rx.borrow_and_update() {
                return;
            }
            if rx.changed().await.is_err() {
                // The canceller is gone, so nobody can fire it any more.
                std::future::pending::<()>().await;
            }
        }
    }
}
