//! Embeddings from a prompt's hidden states: llama.cpp's pooling types and
//! its `common_embd_normalize`.
//!
//! The hidden states are the ones after the model's final norm (what the
//! output head would multiply), one row of `n_embd` per prompt token, as
//! llama.cpp takes them for a decoder-only model.

/// How a prompt's rows become one embedding (llama.cpp's
/// `llama_pooling_type`; `rank` is not an embedding here but `--reranking`,
/// in `crate::rank`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's row (llama-server's native endpoint only).
    None,
    /// The mean of the rows.
    Mean,
    /// The first row.
    Cls,
    /// The last row.
    Last,
}

impl Pooling {
    /// `--pooling`'s spelling.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            "rank" => Err(
                "pooling 'rank' scores query and document pairs: start the server with \
                     --reranking and use POST /rerank"
                    .into(),
            ),
            other => Err(format!(
                "unknown pooling {other:?} (none, mean, cls or last)"
            )),
        }
    }

    /// The value of a file's `{arch}.pooling_type` key (`None` for one that
    /// is not a pooling Lamina computes).
    pub fn from_gguf(v: u64) -> Option<Self> {
        match v {
            0 => Some(Pooling::None),
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// `rows` (whole rows of `n_embd` floats) pooled: every row for
/// [`Pooling::None`], else one. The mean sums in f64, in token order.
pub fn pool(rows: &[f32], n_embd: usize, pooling: Pooling) -> Vec<Vec<f32>> {
    let mut it = rows.chunks_exact(n_embd.max(1));
    match pooling {
        Pooling::None => it.map(<[f32]>::to_vec).collect(),
        Pooling::Cls => it.next().map(<[f32]>::to_vec).into_iter().collect(),
        Pooling::Last => it.next_back().map(<[f32]>::to_vec).into_iter().collect(),
        Pooling::Mean => {
            let n = it.len();
            if n == 0 {
                return Vec::new();
            }
            let mut sum = vec![0.0f64; n_embd];
            for row in it {
                for (s, v) in sum.iter_mut().zip(row) {
                    *s += f64::from(*v);
                }
            }
            vec![sum.iter().map(|s| (s / n as f64) as f32).collect()]
        }
    }
}

/// llama.cpp's `common_embd_normalize`: `-1` leaves `v` as it is, `0`
/// scales the largest magnitude to 32760 (an int16 range), `2` is the
/// Euclidean norm, any other `p` the p-norm (`1`: taxicab). A zero vector
/// stays zero.
pub fn normalize(v: &mut [f32], norm: i32) {
    let sum: f64 = match norm {
        -1 => return,
        0 => v.iter().fold(0.0f64, |m, x| m.max(f64::from(x.abs()))) / 32760.0,
        2 => v
            .iter()
            .map(|x| f64::from(*x) * f64::from(*x))
            .sum::<f64>()
            .sqrt(),
        p => v
            .iter()
            .map(|x| f64::from(x.abs()).powi(p))
            .sum::<f64>()
            .powf(1.0 / f64::from(p)),
    };
    let scale = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= scale);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pooling_takes_its_rows() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0];
        assert_eq!(
            pool(&rows, 2, Pooling::None),
            vec![vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 9.0]]
        );
        assert_eq!(pool(&rows, 2, Pooling::Cls), vec![vec![1.0, 2.0]]);
        assert_eq!(pool(&rows, 2, Pooling::Last), vec![vec![5.0, 9.0]]);
        assert_eq!(pool(&rows, 2, Pooling::Mean), vec![vec![3.0, 5.0]]);
        assert!(pool(&[], 2, Pooling::Mean).is_empty());
    }

    #[test]
    fn norms_follow_llama_cpp() {
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, 2);
        assert_eq!(v, [0.6, -0.8]);
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, 1);
        assert!((v[0] - 3.0 / 7.0).abs() < 1e-7 && (v[1] + 4.0 / 7.0).abs() < 1e-7);
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, 0);
        assert_eq!(v, [24570.0, -32760.0]);
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, -1);
        assert_eq!(v, [3.0, -4.0]);
        let mut v = [0.0f32, 0.0];
        normalize(&mut v, 2);
        assert_eq!(v, [0.0, 0.0]);
    }

    #[test]
    fn pooling_names_and_file_values() {
        for p in [Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last] {
            assert_eq!(Pooling::parse(p.as_str()), Ok(p));
        }
        assert!(Pooling::parse("rank").unwrap_err().contains("reranking"));
        assert!(Pooling::parse("max").is_err());
        assert_eq!(Pooling::from_gguf(1), Some(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(4), None);
    }
}
