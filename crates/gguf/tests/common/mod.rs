//! Shared by the reader's test files.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;

/// A fresh folder under the system's temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `lamina-{suite}-{tag}-{pid}`: tests running at once never share one.
    pub fn new(suite: &str, tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("lamina-{suite}-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
