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

fn lamina_text(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The "free device memory" line of adapter `index` in `lamina devices`.
fn free_memory_line(text: &str, index: u64) -> String {
    let head = format!("[{index}] ");
    text.lines()
        .skip_while(|l| !l.starts_with(&head))
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .find(|l| l.trim_start().starts_with("free device memory"))
        .unwrap_or_else(|| panic!("no free memory line for adapter {index} in:\n{text}"))
        .to_string()
}

/// Every Vulkan device's name, and whether its driver offers what reading a
/// memory budget takes (`VK_EXT_memory_budget`, Vulkan 1.1): asked of the
/// Vulkan loader directly, not through Lamina's device code, so the answer
/// is the driver's own.
fn vulkan_budget_offered() -> Vec<(String, bool)> {
    use ash::vk;
    // SAFETY: loads the system's Vulkan loader, as wgpu does; nothing of
    // it outlives this function.
    let entry = unsafe { ash::Entry::load() }.expect("no Vulkan loader: install libvulkan1");
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_1);
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: a valid create info with no layers or extensions; the
    // instance is destroyed below, after its last use.
    let instance = unsafe { entry.create_instance(&info, None) }.unwrap();
    // SAFETY: queries on a live instance and the devices it returned.
    let found = unsafe {
        instance
            .enumerate_physical_devices()
            .unwrap()
            .into_iter()
            .map(|pd| {
                let props = instance.get_physical_device_properties(pd);
                let name = props.device_name_as_c_str().unwrap().to_string_lossy();
                let budget = instance
                    .enumerate_device_extension_properties(pd)
                    .unwrap()
                    .iter()
                    .any(|e| e.extension_name_as_c_str() == Ok(ash::ext::memory_budget::NAME));
                (
                    name.into_owned(),
                    budget && props.api_version >= vk::API_VERSION_1_1,
                )
            })
            .collect()
    };
    // SAFETY: nothing made from the instance is still alive.
    unsafe { instance.destroy_instance(None) };
    found
}

/// What holds on any driver: the software adapter is listed with its
/// limits, and `lamina devices` says what it knows of free memory, a
/// figure or "not reported by the driver" (an older Mesa has no budget).
#[test]
fn devices_lists_the_software_adapter() {
    let list = lamina_json(&["devices", "--json"]);
    let list = list.as_array().unwrap();
    assert!(
        !list.is_empty(),
        "no adapter: install mesa-vulkan-drivers (scripts/install-deps.sh)"
    );
    assert!(list[0]["max_storage_buffer_binding_size"].as_u64().unwrap() > 0);
    let vulkan = list
        .iter()
        .find(|a| a["backend"] == "vulkan")
        .expect("no Vulkan adapter: install mesa-vulkan-drivers (scripts/install-deps.sh)");
    assert_eq!(
        vulkan["free_memory"].is_null(),
        vulkan["device_memory"].is_null(),
        "free memory and its heaps' size come from one query: {vulkan}"
    );
    let text = lamina_text(&["devices"]);
    let line = free_memory_line(&text, vulkan["index"].as_u64().unwrap());
    assert!(
        line.ends_with("(the driver's budget)") || line.ends_with("not reported by the driver"),
        "{line}"
    );
}

/// Free memory is reported exactly for the Vulkan adapters whose driver
/// offers a budget (Mesa 25's lavapipe does, bookworm's 22.3 does not), and
/// is no more than the device-local heaps hold; the others say it is "not
/// reported by the driver".
#[test]
fn free_memory_is_reported_exactly_where_the_driver_offers_a_budget() {
    let offered = vulkan_budget_offered();
    let list = lamina_json(&["devices", "--json"]);
    let text = lamina_text(&["devices"]);
    let vulkan: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["backend"] == "vulkan")
        .collect();
    assert!(
        !vulkan.is_empty(),
        "no Vulkan adapter: install mesa-vulkan-drivers (scripts/install-deps.sh)"
    );
    for a in vulkan {
        let name = a["name"].as_str().unwrap();
        let budget = offered
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("the loader lists no {name:?}: {offered:?}"))
            .1;
        let line = free_memory_line(&text, a["index"].as_u64().unwrap());
        if budget {
            let free = a["free_memory"].as_u64().unwrap_or(0);
            let size = a["device_memory"].as_u64().unwrap_or(0);
            assert!(free > 0 && free <= size, "{name}: free {free} of {size}");
            assert!(line.ends_with("(the driver's budget)"), "{name}: {line}");
        } else {
            assert!(
                a["free_memory"].is_null() && a["device_memory"].is_null(),
                "{name} offers no budget, yet: {a}"
            );
            assert!(
                line.ends_with("not reported by the driver"),
                "{name}: {line}"
            );
        }
    }
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
