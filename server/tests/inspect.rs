//! `lamina inspect` against llama.cpp's own Python reader on the real models,
//! and its behaviour on malformed files.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::model_path;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn lamina(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(args)
        .output()
        .unwrap()
}

fn inspect_json(path: &Path) -> Value {
    let out = lamina(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn reference_json(path: &Path) -> Value {
    let out = Command::new("python3")
        .arg(repo().join("scripts/gguf-reference.py"))
        .arg(path)
        .output()
        .expect("python3 with the gguf package (scripts/install-deps.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn agrees_with_gguf_py(name: &str) {
    let path = model_path(name);
    let ours = inspect_json(&path);
    let theirs = reference_json(&path);
    for k in [
        "version",
        "tensor_count",
        "kv_count",
        "alignment",
        "data_offset",
    ] {
        assert_eq!(ours[k], theirs[k], "{name}: {k}");
    }
    let (a, b) = (
        ours["tensors"].as_array().unwrap(),
        theirs["tensors"].as_array().unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        for k in ["name", "shape", "type", "offset", "bytes"] {
            assert_eq!(x[k], y[k], "{name}: tensor {} field {k}", y["name"]);
        }
    }
    let (a, b) = (
        ours["metadata"].as_object().unwrap(),
        theirs["metadata"].as_object().unwrap(),
    );
    assert_eq!(a.len(), b.len(), "{name}: metadata keys");
    for (k, y) in b {
        let x = &a[k];
        assert_eq!(x["type"], y["type"], "{name}: {k}");
        if y["type"] == "array" {
            assert_eq!(x["element_type"], y["element_type"], "{name}: {k}");
            assert_eq!(x["count"], y["count"], "{name}: {k}");
        }
    }
    let total = ours["tensor_count"].as_u64().unwrap();
    assert_eq!(ours["size_check"]["agree"].as_u64(), Some(total));
    assert_eq!(ours["size_check"]["total"].as_u64(), Some(total));
}

#[test]
fn smollm2_agrees_with_gguf_py() {
    agrees_with_gguf_py("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_agrees_with_gguf_py() {
    agrees_with_gguf_py("gemma-3-270m-q4_k_m.gguf");
}

#[test]
fn text_report_names_the_verdict() {
    let out = lamina(&[
        "inspect",
        model_path("gemma-3-270m-q4_k_m.gguf").to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("236/236 tensor sizes agree with their offsets"),
        "{text}"
    );
    assert!(text.contains("magic"));
    assert!(text.contains("blk.17"));
}

#[test]
fn malformed_files_exit_nonzero_with_one_line() {
    let corpus = repo().join("tests/corpus/gguf");
    let manifest = std::fs::read_to_string(corpus.join("MANIFEST")).unwrap();
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        let (name, expect) = line.split_once('\t').unwrap();
        if expect.is_empty() {
            continue;
        }
        let out = lamina(&["inspect", corpus.join(name).to_str().unwrap()]);
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(
            err.contains(expect) && err.contains("at byte"),
            "{name}: {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let out = lamina(&["inspect", "/nonexistent/x.gguf"]);
    assert_eq!(out.status.code(), Some(1));
}

/// The summary says what the file claims and what it holds: Gemma 3's file
/// is tagged Q4_K_M, yet most of its bytes are Q8_0 (the tied 262144-token
/// embedding). The bits per weight and the storage shares are recomputed
/// here from gguf-py's tensor table, an independent reader.
#[test]
fn summary_names_the_file_type_and_what_is_really_stored() {
    let path = model_path("gemma-3-270m-q4_k_m.gguf");
    let ours = inspect_json(&path);
    let theirs = reference_json(&path);
    let s = &ours["summary"];
    assert_eq!(s["file_type"], 15);
    assert_eq!(s["file_type_name"], "MOSTLY_Q4_K_M");
    assert!(s["draft_head"].is_null());
    let tensors = theirs["tensors"].as_array().unwrap();
    let bytes: u64 = tensors.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    let weights: u64 = tensors
        .iter()
        .map(|t| {
            t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product::<u64>()
        })
        .sum();
    let bpw = s["bits_per_weight"].as_f64().unwrap();
    assert!(
        (bpw - bytes as f64 * 8.0 / weights as f64).abs() < 1e-9,
        "{bpw}"
    );
    let storage = s["storage"].as_array().unwrap();
    assert_eq!(storage[0]["type"], "Q8_0", "{storage:?}");
    let q8: u64 = tensors
        .iter()
        .filter(|t| t["type"] == "Q8_0")
        .map(|t| t["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(storage[0]["bytes"].as_u64(), Some(q8));
    let text = String::from_utf8(lamina(&["inspect", path.to_str().unwrap()]).stdout).unwrap();
    assert!(text.contains("File type: MOSTLY_Q4_K_M (15)"), "{text}");
    assert!(text.contains("Stored as: Q8_0 72.9%"), "{text}");
}
