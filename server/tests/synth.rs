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

/// A matrix of a type the GPU has no kernel for keeps its block, and every
/// block before it, on the CPU at `--ngl all`: the load says which tensor
/// and why, `fit` plans the same, and the answer is the CPU's.
#[test]
fn a_tensor_without_a_gpu_kernel_stays_on_the_cpu_with_its_block() {
    let dir = std::env::temp_dir().join(format!("lamina-synth-gap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("gap.gguf");
    let file = out.to_str().unwrap();
    let vocab = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    // IQ3_S and IQ2_XXS have CPU dequantizers and no WGSL kernel.
    let no_kernel = [GgmlType::IQ3S, GgmlType::IQ2XXS];
    assert!(no_kernel.iter().all(|&t| !lamina_gpu::has_kernel(t)));
    let r = lamina(&[
        "synth",
        "--shape",
        "smollm2",
        "--type",
        "q4_0",
        "--tensor-type",
        "blk.20.ffn_down=IQ3_S",
        "--tensor-type",
        "blk.3.ffn_down=iq2_xxs",
        "--vocab-from",
        vocab.to_str().unwrap(),
        "-o",
        file,
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let m = Model::open(&out, LoadMode::Mmap).unwrap();
    let ty = |name: &str| m.tensor(name).unwrap().info.ty;
    assert_eq!(ty("blk.20.ffn_down.weight"), GgmlType::IQ3S);
    assert_eq!(ty("blk.3.ffn_down.weight"), GgmlType::IQ2XXS);
    assert_eq!(ty("blk.20.ffn_up.weight"), GgmlType::Q4_0);

    let run = |ngl: &str, json: bool| {
        let mut args = vec![
            "run", "-m", file, "-p", "Hello", "-n", "6", "--temp", "0", "--ngl", ngl,
        ];
        if json {
            args.push("--json");
        }
        let r = lamina(&args);
        let err = String::from_utf8_lossy(&r.stderr).into_owned();
        assert!(r.status.success(), "{err}");
        (r.stdout, err)
    };
    let json = |out: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&out).unwrap();
    let cpu = json(run("0", true).0);
    let all = json(run("all", true).0);
    assert_eq!(all["tokens"], cpu["tokens"]);
    assert_eq!(
        (cpu["ngl"].as_u64(), all["ngl"].as_u64()),
        (Some(0), Some(10))
    );
    let (_, log) = run("all", false);
    assert!(
        log.contains(
            "blk.20 and every slot before it stayed on the CPU: no GPU kernel for \
             blk.20.ffn_down.weight (IQ3_S) (-ngl asked 31, placed 10)"
        ),
        "{log}"
    );
    assert!(log.contains("blk.21-29  GPU"), "{log}");

    let r = lamina(&["fit", "-m", file, "--json"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.last().unwrap()["ngl"], 10, "{v}");
    assert_eq!(
        v["held_by_missing_kernels"][0]["tensor"],
        "blk.20.ffn_down.weight"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
