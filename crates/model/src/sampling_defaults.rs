//! The sampler defaults a model file carries (`general.sampling.*`, written
//! by llama.cpp's converter from a model's `generation_config.json`):
//! llama.cpp uses them wherever the command line is silent, and so does
//! Lamina, so a model whose authors ask for temperature 0.6 and top-p 0.95
//! gets them without the user knowing the numbers.

use std::path::Path;

use lamina_gguf::{LoadMode, Model, Value};

/// The file's values, each `None` when the key is absent or out of range
/// (a bad value is ignored, as a missing one: the sampler's own default
/// applies).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FileSampling {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i32>,
}

fn float(model: &Model, key: &str, lo: f64, hi: f64) -> Option<f32> {
    let v = model.get(key).and_then(Value::as_f64)?;
    (v.is_finite() && (lo..=hi).contains(&v)).then_some(v as f32)
}

impl FileSampling {
    pub fn read(model: &Model) -> Self {
        let int = |key: &str| model.get(key).and_then(Value::as_int);
        FileSampling {
            temperature: float(model, "general.sampling.temp", 0.0, 100.0),
            top_k: int("general.sampling.top_k")
                .and_then(|k| usize::try_from(k).ok())
                .filter(|&k| k <= u32::MAX as usize),
            // Lamina's top-p must be above 0 (llama.cpp's 0 keeps one token).
            top_p: float(model, "general.sampling.top_p", 0.0, 1.0).filter(|&p| p > 0.0),
            min_p: float(model, "general.sampling.min_p", 0.0, 1.0),
            repeat_penalty: float(model, "general.sampling.penalty_repeat", 0.0, 10.0)
                .filter(|&p| p > 0.0),
            repeat_last_n: int("general.sampling.penalty_last_n")
                .and_then(|n| i32::try_from(n).ok())
                .filter(|&n| n >= -1),
        }
    }

    /// The defaults of the model at `path` (its first shard's header), or
    /// none when it cannot be opened: loading it reports why.
    pub fn open(path: &Path) -> Self {
        Model::open(path, LoadMode::Mmap)
            .map(|m| Self::read(&m))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_gguf::{File, Writer};

    fn model(kvs: Vec<(&str, Value)>) -> Model {
        let mut w = Writer::new().kv("general.architecture", Value::String("llama".into()));
        for (k, v) in kvs {
            w = w.kv(k, v);
        }
        Model::from_shards(vec![File::from_bytes(w.to_bytes()).unwrap()]).unwrap()
    }

    #[test]
    fn reads_the_keys_and_ignores_values_out_of_range() {
        let m = model(vec![
            ("general.sampling.temp", Value::F32(0.6)),
            ("general.sampling.top_k", Value::I32(20)),
            ("general.sampling.top_p", Value::F32(0.95)),
            ("general.sampling.min_p", Value::F32(2.0)),
            ("general.sampling.penalty_repeat", Value::F32(1.1)),
            ("general.sampling.penalty_last_n", Value::I32(-7)),
        ]);
        let s = FileSampling::read(&m);
        assert_eq!(s.temperature, Some(0.6));
        assert_eq!(s.top_k, Some(20));
        assert_eq!(s.top_p, Some(0.95));
        assert_eq!(s.min_p, None, "min-p 2 is out of range");
        assert_eq!(s.repeat_penalty, Some(1.1));
        assert_eq!(s.repeat_last_n, None, "-7 is not a window");
        assert_eq!(FileSampling::read(&model(vec![])), FileSampling::default());
        let wrong_type = model(vec![("general.sampling.temp", Value::String("hot".into()))]);
        assert_eq!(FileSampling::read(&wrong_type).temperature, None);
    }
}
