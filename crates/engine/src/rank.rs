//! Reranking scores from a prompt's hidden states: llama.cpp's pooling
//! `rank` (`build_pooling` in its `llama-graph.cpp`), for the causal models
//! Lamina runs.
//!
//! A reranking prompt is the query and a document in one sequence; its
//! score comes from the last token's row after the final norm (a causal
//! model has seen everything only there), through the file's ranking head
//! when it has one: `cls.weight` (a dense layer and tanh, BERT-style) and
//! then `cls.output.weight` (the projection to the scores), each with an
//! optional bias, and a softmax over the outputs for Qwen3 rerankers, whose
//! head holds the "yes" and "no" rows of the output matrix. The score is the
//! first output.
//!
//! A model without a head (an ordinary chat model) gets what llama-server
//! answers for it: the first component of that last row. That number is not
//! a relevance judgement, so `lamina serve --reranking` warns of it at load.

use lamina_gguf::Model;

use crate::error::EngineError;

/// A dense layer read from the file, dequantized to f32 (ranking heads are
/// small: `n_out` is a handful of rows).
#[derive(Debug, Clone)]
struct Dense {
    /// `n_out` rows of `n_in`.
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    n_in: usize,
    n_out: usize,
}

impl Dense {
    /// `name.weight` (and `name.bias` when present), whose rows are
    /// `n_in` long; `None` when the file has no such weight.
    fn read(file: &Model, name: &str, n_in: usize) -> Result<Option<Self>, EngineError> {
        let Some(t) = file.tensor(&format!("{name}.weight")) else {
            return Ok(None);
        };
        let bad = |why: String| EngineError::Load(format!("ranking head {name}.weight: {why}"));
        if t.info.row_len() != n_in as u64 {
            return Err(bad(format!(
                "rows of {} weights, and the layer before gives {n_in}",
                t.info.row_len()
            )));
        }
        let n_out = usize::try_from(t.info.n_rows()).map_err(|_| bad("too many rows".into()))?;
        let w = dequantize(t, n_in * n_out).map_err(bad)?;
        let b = match file.tensor(&format!("{name}.bias")) {
            Some(bt) if bt.info.n_elements == n_out as u64 => Some(
                dequantize(bt, n_out)
                    .map_err(|e| EngineError::Load(format!("ranking head {name}.bias: {e}")))?,
            ),
            Some(bt) => {
                return Err(EngineError::Load(format!(
                    "ranking head {name}.bias has {} values for {n_out} outputs",
                    bt.info.n_elements
                )))
            }
            None => None,
        };
        Ok(Some(Dense { w, b, n_in, n_out }))
    }

    fn apply(&self, x: &[f32]) -> Vec<f32> {
        self.w
            .chunks_exact(self.n_in)
            .take(self.n_out)
            .enumerate()
            .map(|(i, row)| {
                let dot: f32 = row.iter().zip(x).map(|(w, v)| w * v).sum();
                dot + self
                    .b
                    .as_ref()
                    .and_then(|b| b.get(i))
                    .copied()
                    .unwrap_or(0.0)
            })
            .collect()
    }
}

fn dequantize(t: lamina_gguf::Tensor<'_>, n: usize) -> Result<Vec<f32>, String> {
    let mut out = vec![0.0f32; n];
    lamina_quant::dequantize(t.info.ty, t.data, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// A model's ranking head.
#[derive(Debug, Clone)]
pub struct RankHead {
    cls: Option<Dense>,
    out: Option<Dense>,
    softmax: bool,
}

impl RankHead {
    /// The file's head, or `None` when it has neither `cls` nor
    /// `cls.output`.
    pub(crate) fn from_gguf(
        file: &Model,
        arch: &str,
        n_embd: usize,
    ) -> Result<Option<Self>, EngineError> {
        let cls = Dense::read(file, "cls", n_embd)?;
        let n_in = cls.as_ref().map_or(n_embd, |c| c.n_out);
        let out = Dense::read(file, "cls.output", n_in)?;
        if cls.is_none() && out.is_none() {
            return Ok(None);
        }
        Ok(Some(RankHead {
            cls,
            out,
            softmax: lamina_model::arch::find(arch).is_some_and(|r| r.rank_softmax),
        }))
    }

    /// The outputs of the head for one pooled row.
    fn outputs(&self, row: &[f32]) -> Vec<f32> {
        let mut cur = row.to_vec();
        if let Some(cls) = &self.cls {
            cur = cls.apply(&cur);
            cur.iter_mut().for_each(|v| *v = v.tanh());
        }
        if let Some(out) = &self.out {
            cur = out.apply(&cur);
        }
        if self.softmax {
            let max = cur.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = cur.iter().map(|v| (v - max).exp()).sum();
            cur.iter_mut().for_each(|v| *v = (*v - max).exp() / sum);
        }
        cur
    }
}

/// The score of a reranking prompt from its hidden rows (`n_embd` floats
/// per token): the head's first output on the last row, or without a head
/// the last row's first component (as llama-server). `None` for no rows.
pub fn score(rows: &[f32], n_embd: usize, head: Option<&RankHead>) -> Option<f32> {
    let last = rows.chunks_exact(n_embd.max(1)).next_back()?;
    match head {
        Some(h) => h.outputs(last).first().copied(),
        None => last.first().copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(w: &[f32], b: Option<&[f32]>, n_in: usize) -> Dense {
        Dense {
            w: w.to_vec(),
            b: b.map(<[f32]>::to_vec),
            n_in,
            n_out: w.len() / n_in,
        }
    }

    #[test]
    fn without_a_head_the_score_is_the_last_rows_first_component() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(score(&rows, 3, None), Some(4.0));
        assert_eq!(score(&[], 3, None), None);
    }

    #[test]
    fn a_head_projects_the_last_row() {
        let head = RankHead {
            cls: None,
            out: Some(dense(&[1.0, 0.0, 1.0, 0.0, 1.0, 0.0], Some(&[0.5, 0.0]), 3)),
            softmax: false,
        };
        // 4 + 6 + 0.5 from the last row [4, 5, 6].
        assert_eq!(
            score(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, Some(&head)),
            Some(10.5)
        );
    }

    #[test]
    fn a_qwen3_head_answers_the_probability_of_its_first_row() {
        let head = RankHead {
            cls: None,
            out: Some(dense(&[1.0, 0.0, 0.0, 1.0], None, 2)),
            softmax: true,
        };
        let s = score(&[2.0, 0.0], 2, Some(&head)).unwrap_or_default();
        let want = 1.0 / (1.0 + (-2.0f32).exp());
        assert!((s - want).abs() < 1e-6, "{s} vs {want}");
    }

    #[test]
    fn a_dense_cls_layer_goes_through_tanh() {
        let head = RankHead {
            cls: Some(dense(&[1.0, 1.0], None, 2)),
            out: None,
            softmax: false,
        };
        let s = score(&[0.25, 0.25], 2, Some(&head)).unwrap_or_default();
        assert!((s - 0.5f32.tanh()).abs() < 1e-6);
    }
}
