//! `lamina fit` and `lamina devices` as a user runs them.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::model_path;
use serde_json::Value;

fn lamina_json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn fit_plans_every_ngl_and_respects_the_budget() {
    let m = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    let m = m.to_str().unwrap();
    let all = lamina_json(&["fit", "-m", m, "-c", "2048", "--json"]);
    assert_eq!(all["n_layer"], 30);
    let rows = all["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 32, "-ngl 0 ..= 31");
    let gpu: Vec<u64> = rows
        .iter()
        .map(|r| r["gpu_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(gpu[0], 0);
    assert!(
        gpu.windows(2).all(|w| w[0] < w[1]),
        "GPU bytes grow with -ngl"
    );
    // Every byte is somewhere: weights on one device or the other.
    let weights: Vec<u64> = rows
        .iter()
        .map(|r| {
            r["gpu_weight_bytes"].as_u64().unwrap() + r["cpu_bytes"].as_u64().unwrap()
                - (r["kv_bytes"].as_u64().unwrap() - r["gpu_kv_bytes"].as_u64().unwrap())
        })
        .collect();
    // The tied head is an extra GPU copy of the embedding, so totals grow by it once.
    assert!(weights[1] > weights[0] && weights[1..].windows(2).all(|w| w[0] == w[1]));

    let tight = lamina_json(&[
        "fit",
        "-m",
        m,
        "-c",
        "2048",
        "--gpu-memory",
        "100MiB",
        "--json",
    ]);
    let n = tight["recommended_ngl"].as_u64().unwrap() as usize;
    assert!(
        n > 0 && n < 31,
        "100 MiB fits some but not all of SmolLM2: {n}"
    );
    let usable = 100 * 1024 * 1024 - tight["margin_bytes"].as_u64().unwrap();
    assert!(gpu[n] <= usable && gpu[n + 1] > usable);
}

#[test]
fn devices_lists_the_software_adapter() {
    let list = lamina_json(&["devices", "--json"]);
    let list = list.as_array().unwrap();
    assert!(
        !list.is_empty(),
        "no adapter: install mesa-vulkan-drivers (scripts/install-deps.sh)"
    );
    assert!(list[0]["max_storage_buffer_binding_size"].as_u64().unwrap() > 0);
    // Lavapipe's Vulkan driver has VK_EXT_memory_budget: free memory is
    // reported, and is no more than the device-local heaps hold.
    let vulkan = list.iter().find(|a| a["backend"] == "vulkan").unwrap();
    let free = vulkan["free_memory"].as_u64().unwrap();
    let size = vulkan["device_memory"].as_u64().unwrap();
    assert!(free > 0 && free <= size, "free {free} of {size}");
}

#[test]
fn fit_measure_predicts_decode_speed_per_ngl() {
    let m = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    let v = lamina_json(&[
        "fit",
        "-m",
        m.to_str().unwrap(),
        "-c",
        "512",
        "--measure",
        "--json",
    ]);
    assert!(v["probe"]["cpu_gb_per_s"].as_f64().unwrap() > 0.0);
    let rows = v["rows"].as_array().unwrap();
    let cpu_only = rows[0]["predicted_tokens_per_second"].as_f64().unwrap();
    assert!(cpu_only > 0.0 && cpu_only.is_finite());
    // The all-CPU prediction is the probe's own decode step: the bytes the
    // prediction charges at -ngl 0 are the bytes the probe's speed divides.
    let step_ms = v["probe"]["cpu_step_ms"].as_f64().unwrap();
    assert!(
        (cpu_only * step_ms / 1e3 - 1.0).abs() < 1e-9,
        "predicted {cpu_only} tokens/s from a step of {step_ms} ms"
    );
    if v["probe"]["gpu_gb_per_s"].is_number() {
        let all = rows.last().unwrap()["predicted_tokens_per_second"]
            .as_f64()
            .unwrap();
        assert!(all > 0.0 && all.is_finite());
    }
}
