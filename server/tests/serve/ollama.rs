//! The official `ollama` Python client against `lamina serve`'s Ollama
//! API (`ollama_client.py` beside this file holds the checks).

use super::python_client_checks;

#[test]
fn the_ollama_python_client_works_unchanged() {
    python_client_checks(
        "ollama",
        &[
            "--parallel",
            "2",
            "-c",
            "4096",
            "--embedding",
            "--pooling",
            "mean",
        ],
    );
}
