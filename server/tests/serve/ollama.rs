//! The official `ollama` Python client against `lamina serve`'s Ollama
//! API (`ollama_client.py` beside this file holds the checks).

use std::process::Command;

use super::Server;

#[test]
fn the_ollama_python_client_works_unchanged() {
    let probe = Command::new("python3")
        .args(["-c", "import ollama"])
        .output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "python3 with the `ollama` package is needed: run scripts/install-deps.sh"
    );
    let server = Server::start(
        &["--parallel", "2", "-c", "4096"],
        &[("LAMINA_API_KEY", "test-key")],
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve/ollama_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", server.port))
        .arg("test-key")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ollama client checks failed:\n{text}");
}
