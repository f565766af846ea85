//! `lamina synth`: the file it writes is a model every reader accepts, with
//! the shape it was asked for, and it runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::model_path;
use lamina_gguf::{GgmlType, LoadMode, Model};

/// Bound on |CPU − GPU| per teacher-forced log-prob of a synthetic model:
/// both decode the same weights and differ only in f32 summation order.
/// Measured 3e-4 nats on the IQ file (random weights sum less tamely than
/// the real models' ~3e-5, `score.rs`); one wrong sign rule in one IQ1_M
/// tensor moved it to 0.2.
const SYNTH_LOGPROB_TOL: f64 = 2e-3;

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
    // Q8_1 (ggml's activation type) has a CPU dequantizer and no WGSL
    // kernel; IQ3_S, in a block after it, has both and is offloaded.
    assert!(!lamina_gpu::has_kernel(GgmlType::Q8_1));
    assert!(lamina_gpu::has_kernel(GgmlType::IQ3S));
    let r = lamina(&[
        "synth",
        "--shape",
        "smollm2",
        "--type",
        "q4_0",
        "--tensor-type",
        "blk.20.ffn_down=Q8_1",
        "--tensor-type",
        "blk.25.ffn_down=iq3_s",
        "--vocab-from",
        vocab.to_str().unwrap(),
        "-o",
        file,
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let m = Model::open(&out, LoadMode::Mmap).unwrap();
    let ty = |name: &str| m.tensor(name).unwrap().info.ty;
    assert_eq!(ty("blk.20.ffn_down.weight"), GgmlType::Q8_1);
    assert_eq!(ty("blk.25.ffn_down.weight"), GgmlType::IQ3S);
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
             blk.20.ffn_down.weight (Q8_1) (-ngl asked 31, placed 10)"
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

/// Every IQ lattice type, one per block's `ffn_down` (SmolLM2's only
/// matrices with 256-weight rows), decodes on the GPU to the CPU's greedy
/// tokens: at `--ngl all` the whole model but the embedding is offloaded.
#[test]
fn iq_lattice_types_give_the_cpu_tokens_on_the_gpu() {
    let dir = std::env::temp_dir().join(format!("lamina-synth-iq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("iq.gguf");
    let file = out.to_str().unwrap();
    let vocab = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    let types = [
        ("blk.1.ffn_down", GgmlType::IQ2XXS),
        ("blk.2.ffn_down", GgmlType::IQ2XS),
        ("blk.3.ffn_down", GgmlType::IQ2S),
        ("blk.4.ffn_down", GgmlType::IQ3XXS),
        ("blk.5.ffn_down", GgmlType::IQ3S),
        ("blk.6.ffn_down", GgmlType::IQ1S),
        ("blk.7.ffn_down", GgmlType::IQ1M),
    ];
    let specs: Vec<String> = types
        .iter()
        .map(|(pat, ty)| format!("{pat}={}", ty.name()))
        .collect();
    let mut args = vec!["synth", "--shape", "smollm2", "--type", "q8_0"];
    for s in &specs {
        args.extend(["--tensor-type", s.as_str()]);
    }
    args.extend(["--vocab-from", vocab.to_str().unwrap(), "-o", file]);
    let r = lamina(&args);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let m = Model::open(&out, LoadMode::Mmap).unwrap();
    for (pat, ty) in types {
        assert_eq!(m.tensor(&format!("{pat}.weight")).unwrap().info.ty, ty);
        assert!(lamina_gpu::has_kernel(ty), "{ty}");
    }

    let run = |ngl: &str| {
        let r = lamina(&[
            "run", "-m", file, "-p", "Hello", "-n", "8", "--temp", "0", "--ngl", ngl, "--json",
        ]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        serde_json::from_slice::<serde_json::Value>(&r.stdout).unwrap()
    };
    let cpu = run("0");
    let all = run("all");
    assert_eq!(all["ngl"].as_u64(), Some(31), "{all}");
    assert_eq!(cpu["tokens"].as_array().map(Vec::len), Some(8), "{cpu}");
    assert_eq!(all["tokens"], cpu["tokens"]);

    // Greedy tokens of random weights have wide margins; the log-probs of
    // the same tokens, teacher-forced, show a wrong weight anywhere.
    let req = serde_json::json!({
        "prompt_ids": cpu["prompt_tokens"],
        "forced_tokens": cpu["tokens"],
        "top": 1,
    });
    let score = |ngl: &str| -> Vec<f64> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["score", "-m", file, "--ngl", ngl])
            // The kernels' difference: an f32 cache (f16 rounding of keys
            // the two devices sum in different orders would add its own).
            .args(["-ctk", "f32", "-ctv", "f32"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(req.to_string().as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["forced_logprob"].as_f64().unwrap())
            .collect()
    };
    let (lp_cpu, lp_gpu) = (score("0"), score("all"));
    assert_eq!(lp_cpu.len(), 8);
    let worst = lp_cpu
        .iter()
        .zip(&lp_gpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    eprintln!("IQ synth: worst log-prob difference CPU/GPU {worst:.2e} nats");
    assert!(worst < SYNTH_LOGPROB_TOL, "{lp_cpu:?} vs {lp_gpu:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `synth` writes mixtures of experts (3-D expert tensors, the routing
/// keys): every reader accepts them, they run, and at `--ngl all` their
/// blocks are split, the routed experts on the CPU (the table says so)
/// and the rest on the GPU, with the greedy tokens of `--ngl 0`.
/// llama.cpp's `-cmoe` places as the default does, `-ncmoe N` puts the
/// experts of blocks N.. on the GPU (the same tokens again); `fit` counts
/// the offloaded blocks' experts on the CPU.
#[test]
fn a_synthetic_mixture_of_experts_splits_its_blocks_with_the_experts_on_the_cpu() {
    let dir = std::env::temp_dir().join(format!("lamina-synth-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let vocab = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    for shape in ["qwen3moe-tiny", "qwen2moe-tiny"] {
        let out = dir.join(format!("{shape}.gguf"));
        let r = lamina(&[
            "synth",
            "--shape",
            shape,
            "--type",
            "q8_0",
            "--vocab-from",
            vocab.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let m = Model::open(&out, LoadMode::Mmap).unwrap();
        let t = m.tensor("blk.3.ffn_down_exps.weight").unwrap();
        assert_eq!(t.info.dims.len(), 3, "{shape}: experts are one 3-D tensor");
        assert_eq!(
            m.tensor("blk.0.ffn_gate_inp_shexp.weight").is_some(),
            shape == "qwen2moe-tiny"
        );
        let run = |ngl: &str, extra: &[&str]| {
            let mut args = vec![
                "run",
                "-m",
                out.to_str().unwrap(),
                "-p",
                "Hello",
                "-n",
                "6",
                "--temp",
                "0",
                "--ngl",
                ngl,
            ];
            args.extend_from_slice(extra);
            let r = lamina(&args);
            assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
            (
                String::from_utf8_lossy(&r.stdout).into_owned(),
                String::from_utf8_lossy(&r.stderr).into_owned(),
            )
        };
        let (cpu, _) = run("0", &[]);
        let (gpu, table) = run("all", &[]);
        assert!(!cpu.trim().is_empty());
        let experts = table
            .lines()
            .find(|l| l.contains("routed experts"))
            .unwrap_or_else(|| panic!("{shape}: no experts line in {table}"));
        assert!(
            experts.trim_start().starts_with("blk.0-3    CPU"),
            "{shape}: {experts}"
        );
        assert!(table.contains("blk.0-3    GPU"), "{shape}: {table}");
        assert!(table.contains("offloaded 5/5 layers"), "{shape}: {table}");
        // Attention and router on the GPU, experts on the CPU: the same
        // greedy tokens.
        assert_eq!(cpu, gpu, "{shape}");
        let (flagged, log) = run("all", &["-cmoe"]);
        assert_eq!(flagged, gpu, "{shape}: -cmoe places what no flag does");
        assert!(log.contains("blk.0-3    CPU"), "{shape}: {log}");
        let (two, log) = run("all", &["-ncmoe", "2"]);
        assert_eq!(two, cpu, "{shape}: experts of blocks 2 and 3 on the GPU");
        assert!(log.contains("blk.0-1    CPU"), "{shape}: {log}");
        assert!(log.contains("blk.2-3    GPU"), "{shape}: {log}");
        assert!(!log.contains("blk.2-3    CPU"), "{shape}: {log}");
        // llama.cpp's -ot: block 1's experts in RAM, the rest on the GPU
        // (the first match wins; CUDA0 means the GPU).
        let (ot, log) = run("all", &["-ot", r"blk\.1\.ffn_up_exps=CPU,exps=CUDA0"]);
        assert_eq!(ot, cpu, "{shape}: -ot");
        assert!(log.contains("blk.1      CPU"), "{shape}: {log}");
        assert!(log.contains("blk.0      GPU"), "{shape}: {log}");
        assert!(log.contains("blk.2-3    GPU"), "{shape}: {log}");
        // Only experts are placed by name: another tensor is refused, named.
        let r = lamina(&[
            "run",
            "-m",
            out.to_str().unwrap(),
            "-p",
            "Hello",
            "-n",
            "1",
            "--ngl",
            "all",
            "-ot",
            "attn_q=CPU",
        ]);
        assert!(!r.status.success());
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(err.contains("places only routed experts"), "{err}");
        let r = lamina(&["fit", "-m", out.to_str().unwrap(), "-c", "256", "--json"]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        let rows = v["rows"].as_array().unwrap();
        let experts = |i: usize| rows[i]["cpu_expert_bytes"].as_u64().unwrap();
        let all_experts: u64 = m
            .tensors()
            .filter(|t| t.info.name.contains("_exps."))
            .map(|t| t.info.n_bytes)
            .sum();
        assert!(all_experts > 0);
        assert_eq!(experts(0), 0, "{shape}: nothing offloaded");
        assert_eq!(experts(1), 0, "{shape}: the head alone");
        assert_eq!(experts(5), all_experts, "{shape}: every block split");
        let r = lamina(&[
            "fit",
            "-m",
            out.to_str().unwrap(),
            "-c",
            "256",
            "--json",
            "-ncmoe",
            "1",
        ]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        let row = &v["rows"].as_array().unwrap()[5];
        assert_eq!(row["cpu_expert_bytes"].as_u64().unwrap(), all_experts / 4);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
