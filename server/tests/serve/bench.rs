//! `lamina bench serve` end to end: a tiny run, its JSON checked for shape.

use std::process::Command;

use serde_json::Value;

use super::model;

/// `lamina bench serve ARGS --json`, which must succeed: its report.
fn bench_json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["bench", "serve"])
        .args(args)
        .arg("--json")
        .env_remove("LAMINA_API_KEY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn bench_serve_reports_every_level_in_json() {
    let v = bench_json(&[
        "-m",
        &model(),
        "--clients",
        "1,2",
        "--requests-per-client",
        "1",
        "--max-tokens",
        "2",
        "--timeout",
        "120",
        "--temperature",
        "0.5",
    ]);
    assert_eq!(v["model"], "SmolLM2-135M-Instruct.Q4_1.gguf", "{v}");
    assert_eq!(v["temperature"], 0.5, "{v}");
    assert_eq!(v["parallel"], 2, "{v}");
    assert_eq!(v["max_tokens"], 2, "{v}");
    assert_eq!(v["requests_per_client"], 1, "{v}");
    assert!(v["placement"].as_str().unwrap().contains("layers"), "{v}");
    let levels = v["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2, "{v}");
    for (level, clients) in levels.iter().zip([1u64, 2]) {
        assert_eq!(level["clients"], clients, "{level}");
        assert_eq!(level["requests"], clients, "{level}");
        assert_eq!(level["errors"], 0, "{level}");
        let tokens = level["generated_tokens"].as_u64().unwrap();
        assert!((clients..=2 * clients).contains(&tokens), "{level}");
        for key in [
            "wall_s",
            "tokens_per_s",
            "requests_per_s",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "latency_p50_ms",
        ] {
            let x = level[key].as_f64().unwrap_or(f64::NAN);
            assert!(x.is_finite() && x > 0.0, "{key} in {level}");
        }
        // Order statistics keep the per-request order: TTFT <= latency.
        let ms = |key: &str| level[key].as_f64().unwrap();
        assert!(ms("ttft_p50_ms") <= ms("ttft_p99_ms"), "{level}");
        assert!(ms("ttft_p50_ms") <= ms("latency_p50_ms"), "{level}");
    }
}

/// `--conversation`: each client's requests are the turns of one
/// conversation (each resends the history), two conversations over one
/// slot, every turn answered.
#[test]
fn bench_serve_runs_conversations() {
    let v = bench_json(&[
        "-m",
        &model(),
        "--conversation",
        "--clients",
        "2",
        "--parallel",
        "1",
        "--requests-per-client",
        "3",
        "--max-tokens",
        "4",
        "--timeout",
        "120",
    ]);
    assert_eq!(v["conversation"], true, "{v}");
    assert_eq!(v["parallel"], 1, "{v}");
    // A slot sized for a conversation's three turns.
    assert_eq!(v["n_ctx_slot"], 3 * (4 + 256), "{v}");
    let level = &v["levels"][0];
    assert_eq!(
        (level["requests"].as_u64(), level["errors"].as_u64()),
        (Some(6), Some(0)),
        "{level}"
    );
    assert!(level["generated_tokens"].as_u64().unwrap() >= 6, "{level}");
}

/// `--server`: the same client measures a server in another process (how
/// `benches/serve-peer.sh` compares Lamina with llama-server), and a server
/// that is not there is a clear error, not a hang.
#[test]
fn bench_serve_measures_a_running_server() {
    let server = super::Server::start(&["--parallel", "2"], &[]);
    let addr = format!("127.0.0.1:{}", server.port);
    let v = bench_json(&[
        "--server",
        &addr,
        "--clients",
        "2",
        "--requests-per-client",
        "2",
        "--max-tokens",
        "3",
        "--timeout",
        "120",
    ]);
    assert_eq!(v["server"], addr.as_str(), "{v}");
    let level = &v["levels"][0];
    assert_eq!(level["requests"], 4, "{v}");
    assert_eq!(level["errors"], 0, "{v}");
    let tokens = level["generated_tokens"].as_u64().unwrap();
    assert!((4..=12).contains(&tokens), "{v}");
    // The server counted those requests too: it really was the one measured.
    let (done, metrics) = server.metric("lamina_sequences_finished_total");
    assert!(done.is_some_and(|n| n >= 5.0), "{metrics}");
    drop(server);

    // Nothing listens there any more.
    let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["bench", "serve", "--server", &addr, "--clients", "1"])
        .args(["--timeout", "5"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("warm-up"), "{stderr}");

    // A model and a server at once is refused before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["bench", "serve", "--server", &addr, "-m", "x.gguf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--server"));

    // So is a temperature below 0, naming the flag.
    let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["bench", "serve", "--server", &addr, "--temperature=-1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--temperature"));
}
