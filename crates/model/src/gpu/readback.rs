//! What a step reads back: logits, greedy picks or top-k candidates.

use crate::error::ModelError;

/// What a step reads back from the GPU: the logits, only each sequence's
/// argmax of them (greedy decoding), or its argmax and its `k` best logits
/// (top-k sampling, [`super::HybridModel::forward_multi_top`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Readback {
    Logits,
    Argmax,
    Top(usize),
}

/// A GPU step's result, as [`Readback`] asked: logits (one sequence's, or
/// several packed one after another), each sequence's pick, or its pick
/// and candidates.
#[derive(Debug)]
pub(super) enum Stepped {
    Logits(Vec<f32>),
    Picks(Vec<u32>),
    Top(Vec<Candidates>),
}

/// One sequence's result of a step, as [`Readback`] asked, for each of
/// the rows it kept (its last token's alone, except for
/// [`super::HybridModel::forward_multi_rows`]): logits one row after another,
/// picks, or candidates, in the order of its tokens.
#[derive(Debug)]
pub(super) enum Next {
    Logits(Vec<f32>),
    Picks(Vec<u32>),
    Tops(Vec<Candidates>),
}

/// A sequence's next-token candidates from a step of
/// [`super::HybridModel::forward_multi_top`]: what a greedy or a top-k sampler
/// needs of its logits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidates {
    /// The argmax of the logits, as lamina_sampling's `argmax` (ties to the
    /// lowest id, NaN never chosen, 0 when every logit is NaN).
    pub argmax: u32,
    /// The best logits with their ids, as lamina_sampling's `top_entries`
    /// gives them: best first in IEEE total order, ties to the lower id,
    /// NaN left out; fewer than asked where the row has fewer numbers.
    pub best: Vec<(u32, f32)>,
}

/// The error for a step that read back another thing than was asked: a
/// bug, reported rather than turned into a wrong token.
pub(super) fn misread() -> ModelError {
    ModelError::Step("a step read back another result than it was asked for".into())
}

impl Stepped {
    pub(super) fn into_logits(self) -> Result<Vec<f32>, ModelError> {
        match self {
            Stepped::Logits(l) => Ok(l),
            Stepped::Picks(_) | Stepped::Top(_) => Err(misread()),
        }
    }
}

impl Next {
    pub(super) fn into_logits(self) -> Result<Vec<f32>, ModelError> {
        match self {
            Next::Logits(l) => Ok(l),
            Next::Picks(_) | Next::Tops(_) => Err(misread()),
        }
    }

    /// The last row's pick.
    pub(super) fn into_pick(self) -> Result<u32, ModelError> {
        self.into_picks()?.pop().ok_or_else(misread)
    }

    pub(super) fn into_picks(self) -> Result<Vec<u32>, ModelError> {
        match self {
            Next::Picks(p) => Ok(p),
            Next::Logits(_) | Next::Tops(_) => Err(misread()),
        }
    }

    /// The last row's candidates.
    pub(super) fn into_top(self) -> Result<Candidates, ModelError> {
        match self {
            Next::Tops(mut t) => t.pop().ok_or_else(misread),
            Next::Logits(_) | Next::Picks(_) => Err(misread()),
        }
    }
}
