//! `lamina synth`: the file it writes is a model every reader accepts, with
//! the shape it was asked for, and it runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::model_path;
use lamina_gguf::{GgmlType, LoadMode, Model};

fn lamina(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_synthetic_model_has_its_shape_and_runs() {
    let dir = std::env::temp_dir().join(format!("lamina-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("synth.gguf");
    let vocab = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    let r = lamina(&[
        "synth",
        "--shape",
        "smollm2",
        "--type",
        "q8_0",
        "--vocab-from",
        vocab.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let m = Model::open(&out, LoadMode::Mmap).unwrap();
    let f = &m.shards()[0];
    // Embedding, 30 blocks of 9 tensors, output norm, output.
    assert_eq!(f.tensors().len(), 2 + 30 * 9 + 1);
    let q = f
        .tensors()
        .iter()
        .find(|t| t.name == "blk.29.attn_q.weight")
        .unwrap();
    assert_eq!(q.ty, GgmlType::Q8_0);
    assert_eq!(q.dims, vec![576, 576]);
    let embd = f
        .tensors()
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .unwrap();
    assert_eq!(embd.dims, vec![576, 49152], "SmolLM2's vocabulary");
    // The copied tokenizer and random weights decode to finite logits.
    let r = lamina(&[
        "run",
        "-m",
        out.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "4",
        "--temp",
        "0",
        "--ngl",
        "0",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    // A shape whose rows are not whole blocks of the type is refused.
    let r = lamina(&[
        "synth",
        "--shape",
        "smollm2",
        "--type",
        "q4_k",
        "-o",
        dir.join("bad.gguf").to_str().unwrap(),
    ]);
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("not whole Q4_K blocks"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
