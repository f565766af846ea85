//! The official `anthropic` Python client against `lamina serve`'s
//! Messages API (`anthropic_client.py` beside this file holds the checks).

use super::python_client_checks;

#[test]
fn the_anthropic_python_client_works_unchanged() {
    // The client sends no temperature: the server-wide default makes the
    // answers greedy, so they can be compared with the OpenAI route's.
    python_client_checks(
        "anthropic",
        &["--parallel", "2", "-c", "4096", "--temp", "0"],
    );
}
