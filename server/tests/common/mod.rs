//! Shared by the binary's test files: where the real models are, and how
//! their error lines are read.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;

/// A real model fetched by `scripts/fetch-models.sh` (into `$LAMINA_MODELS`,
/// default `~/.cache/lamina/models`). Missing is a failure, never a skip.
pub fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("LAMINA_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lamina/models")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

/// The bytes available in a memory error line ("… needs N bytes … but M
/// bytes are available …").
pub fn available_bytes(line: &str) -> u64 {
    line.split("but ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no available bytes in {line}"))
}
