//! A constraint whose next mask is computed on its own thread, ahead of
//! the logits it will be applied to.
//!
//! The mask for step n+1 depends only on the tokens sampled up to step n,
//! so it can be computed while the model runs step n+1's forward pass.
//! Computing a mask walks the vocabulary's trie through the grammar's
//! lexer and parser (docs/perf/server.md, 2026-12-05, "structured output's
//! costs"), which on the engine thread would add to every constrained
//! token's latency and hold up every other sequence in the step. Here the
//! engine hands the sampled token over ([`Ahead::commit`]) and goes on to
//! the next forward pass; when the logits arrive the mask is usually
//! waiting ([`Ahead::mask`]). One thread per constrained sequence, parked
//! on a channel between tokens; it ends when the sequence drops its
//! handle. A request without a constraint starts no thread and pays
//! nothing.

use std::sync::mpsc;

use crate::constraint::{Constraint, Mask};
use crate::error::GrammarError;

/// The engine's handle on a constraint running on its own thread.
#[derive(Debug)]
pub struct Ahead {
    commits: mpsc::Sender<u32>,
    masks: mpsc::Receiver<Result<Mask, GrammarError>>,
}

impl Ahead {
    /// Moves `c` onto a thread that computes its first mask at once.
    pub fn start(mut c: Constraint) -> Result<Ahead, GrammarError> {
        let (commits, commit_rx) = mpsc::channel::<u32>();
        let (mask_tx, masks) = mpsc::channel();
        std::thread::Builder::new()
            .name("lamina-grammar".into())
            .spawn(move || loop {
                let mask = c.mask();
                let failed = mask.is_err();
                if mask_tx.send(mask).is_err() || failed {
                    return;
                }
                // Parked until the next token, or gone when the sequence is.
                let Ok(id) = commit_rx.recv() else { return };
                if let Err(e) = c.commit(id) {
                    let _ = mask_tx.send(Err(e));
                    return;
                }
            })
            .map_err(|_| GrammarError::Worker)?;
        Ok(Ahead { commits, masks })
    }

    /// The mask for the next token, waiting for it if it is still being
    /// computed. Call once per [`Ahead::commit`] (and once first).
    pub fn mask(&mut self) -> Result<Mask, GrammarError> {
        self.masks.recv().map_err(|_| GrammarError::Worker)?
    }

    /// The token sampled under the last mask: the thread starts on the
    /// next mask at once.
    pub fn commit(&mut self, id: u32) -> Result<(), GrammarError> {
        self.commits.send(id).map_err(|_| GrammarError::Worker)
    }
}
