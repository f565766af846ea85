//! The two real models, fetched from PyPI by `scripts/fetch-models.sh`.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use lamina_gguf::{GgmlType, LoadMode, Model};

fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("LAMINA_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lamina/models")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

#[test]
fn smollm2_layout() {
    let m = Model::open(
        model_path("SmolLM2-135M-Instruct.Q4_1.gguf"),
        LoadMode::Mmap,
    )
    .unwrap();
    let l = m.first().layout();
    assert_eq!((l.version, l.tensor_count, l.kv_count), (3, 272, 33));
    assert_eq!(l.data_offset, 1_785_664);
    assert_eq!((l.size_check.agree, l.size_check.total), (272, 272));
    let e = m.tensor("token_embd.weight").unwrap();
    assert_eq!(e.info.dims, [576, 49152]);
    assert_eq!(e.info.ty, GgmlType::Q8_0);
    assert_eq!(e.data.len(), 30_081_024);
    assert_eq!(
        m.get("general.architecture").unwrap().as_str(),
        Some("llama")
    );
    let tokens = m.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(tokens.len(), 49152);
}

#[test]
fn gemma3_layout_same_in_both_load_modes() {
    let p = model_path("gemma-3-270m-q4_k_m.gguf");
    let a = Model::open(&p, LoadMode::Mmap).unwrap();
    let b = Model::open(&p, LoadMode::Read).unwrap();
    assert!(a.first().is_mapped() && !b.first().is_mapped());
    assert_eq!(a.first().layout(), b.first().layout());
    let l = a.first().layout();
    assert_eq!((l.tensor_count, l.size_check.agree), (236, 236));
    for (x, y) in a.tensors().zip(b.tensors()) {
        assert_eq!(x.data, y.data);
    }
}
