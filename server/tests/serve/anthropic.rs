//! The official `anthropic` Python client against `lamina serve`'s
//! Messages API (`anthropic_client.py` beside this file holds the checks).

use std::process::Command;

use super::Server;

#[test]
fn the_anthropic_python_client_works_unchanged() {
    let probe = Command::new("python3")
        .args(["-c", "import anthropic"])
        .output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "python3 with the `anthropic` package is needed: run scripts/install-deps.sh"
    );
    // The client sends no temperature: the server-wide default makes the
    // answers greedy, so they can be compared with the OpenAI route's.
    let server = Server::start(
        &["--parallel", "2", "-c", "4096", "--temp", "0"],
        &[("LAMINA_API_KEY", "test-key")],
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/serve/anthropic_client.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", server.port))
        .arg("test-key")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "anthropic client checks failed:\n{text}"
    );
}
