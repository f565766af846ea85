//! Tool calls forced in the XML format of Qwen3-Coder and Qwen3.5, on a
//! model that could never write one itself: a synthetic `qwen35` file
//! (`lamina synth --shape qwen35-tiny`, random weights, SmolLM2's
//! tokenizer) served with Qwen3.5's own template, which makes the server
//! read and force calls in that format. The official `openai` and
//! `anthropic` Python clients (`forced_xml_client.py` beside this file)
//! ask for required and named calls, streamed and not, with thinking on
//! (the template leaves `<think>` open) and off, and must get calls to the
//! allowed tools with arguments typed by their schemas.
//!
//! Ollama's API has no `tool_choice`, so nothing forces a call there.

use std::path::PathBuf;
use std::process::Command;

use super::{model, Server};

/// The synthetic model, written by the built binary into `dir`.
fn synth(dir: &std::path::Path) -> PathBuf {
    let out = dir.join("qwen35-tiny.gguf");
    let run = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["synth", "--shape", "qwen35-tiny", "--type", "Q8_0"])
        .args(["--vocab-from", &model(), "--seed", "3", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "lamina synth failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    out
}

#[test]
fn official_clients_get_typed_forced_xml_calls_from_a_random_model() {
    for package in ["openai", "anthropic"] {
        let probe = Command::new("python3")
            .args(["-c", &format!("import {package}")])
            .output();
        assert!(
            probe.is_ok_and(|o| o.status.success()),
            "python3 with the `{package}` package is needed: run scripts/install-deps.sh"
        );
    }
    let dir = std::env::temp_dir().join(format!("lamina-forced-xml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = synth(&dir);
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let template = here.join("../tests/templates/templates/Qwen3.5-4B.jinja");
    let server = Server::start_with(
        file.to_str().unwrap(),
        &[
            "--chat-template-file",
            template.to_str().unwrap(),
            "--parallel",
            "2",
            "-c",
            "4096",
            // Anthropic's client sends no temperature.
            "--temp",
            "0",
        ],
        &[("LAMINA_API_KEY", "test-key")],
    );
    let out = Command::new("python3")
        .arg(here.join("tests/serve/forced_xml_client.py"))
        .arg(format!("http://127.0.0.1:{}", server.port))
        .arg("test-key")
        .output()
        .unwrap();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "forced XML checks failed:\n{text}");
}
