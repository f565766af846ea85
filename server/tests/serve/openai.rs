//! The official `openai` Python client against `lamina serve`
//! (`openai_client.py` beside this file holds the checks).

use super::python_client_checks;

#[test]
fn the_openai_python_client_works_unchanged() {
    python_client_checks(
        "openai",
        &[
            "--parallel",
            "4",
            "-c",
            "4096",
            "--embedding",
            "--pooling",
            "mean",
        ],
    );
}
