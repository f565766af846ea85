//! Shared by the binary's test files: where the real models are.
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
