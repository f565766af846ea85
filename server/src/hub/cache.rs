//! The Hugging Face hub cache, laid out as the `huggingface_hub` Python
//! package lays it out, so either can use what the other downloaded:
//!
//! ```text
//! {cache}/models--{org}--{repo}/
//!     blobs/{etag}                   the bytes (the etag of an LFS file is its sha256)
//!     blobs/{etag}.incomplete        a download under way, resumed from its length
//!     snapshots/{commit}/{file}      a relative symlink to ../../blobs/{etag}
//!     refs/main                      the commit `main` last resolved to
//! ```
//!
//! The cache root is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`. A blob only ever appears under its final name
//! after its digest was checked, so a present blob is complete.

use std::path::{Component, Path, PathBuf};

use super::HubError;

/// The cache root from the environment (`var` reads a variable).
pub fn root(var: impl Fn(&str) -> Option<String>) -> PathBuf {
    let set = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set("HF_HUB_CACHE") {
        return dir;
    }
    if let Some(home) = set("HF_HOME") {
        return home.join("hub");
    }
    let base = set("XDG_CACHE_HOME")
        .or_else(|| set("HOME").map(|h| h.join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("huggingface").join("hub")
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |error| HubError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// One repo's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    dir: PathBuf,
}

impl RepoCache {
    pub fn new(root: &Path, repo: &str) -> Self {
        Self {
            dir: root.join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{etag}.incomplete"))
    }

    /// `snapshots/{commit}/{file}`; a name that would leave the snapshot
    /// (absolute, `..`) is refused rather than joined.
    pub fn pointer(&self, commit: &str, file: &str) -> Result<PathBuf, HubError> {
        let rel = Path::new(file);
        let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
        if !plain || !safe_segment(commit) {
            return Err(HubError::BadPath(format!("{commit}/{file}")));
        }
        Ok(self.dir.join("snapshots").join(commit).join(rel))
    }

    /// The commit `refs/{revision}` holds, if the cache has it.
    pub fn read_ref(&self, revision: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.dir.join("refs").join(revision)).ok()?;
        let commit = text.trim().to_string();
        safe_segment(&commit).then_some(commit)
    }

    /// Records `revision` → `commit` (no trailing newline, as
    /// `huggingface_hub` writes it).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        let refs = self.dir.join("refs");
        std::fs::create_dir_all(&refs).map_err(io(&refs))?;
        let path = refs.join(revision);
        if self.read_ref(revision).as_deref() == Some(commit) {
            return Ok(());
        }
        std::fs::write(&path, commit).map_err(io(&path))
    }

    /// Every file of a cached snapshot, as repo-relative names.
    pub fn snapshot_files(&self, commit: &str) -> Vec<String> {
        let base = self.dir.join("snapshots").join(commit);
        let mut out = Vec::new();
        let mut stack = vec![base.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(&base) {
                    out.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        out.sort();
        out
    }

    /// Points `snapshots/{commit}/{file}` at `blobs/{etag}` by a relative
    /// link, replacing a stale one.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf, HubError> {
        let pointer = self.pointer(commit, file)?;
        let parent = pointer.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        // From the pointer's folder up to the repo folder, then down.
        let depth = Path::new(file).components().count() + 1;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        if std::fs::symlink_metadata(&pointer).is_ok() {
            std::fs::remove_file(&pointer).map_err(io(&pointer))?;
        }
        symlink(&target, &pointer).map_err(io(&pointer))?;
        Ok(pointer)
    }
}

/// `.locks/models--{org}--{repo}/{etag}.lock` held for as long as this
/// lives: the lock `huggingface_hub` takes on the same file while it writes
/// that blob, so two downloads of one file (from either) take turns.
pub struct BlobLock {
    _file: std::fs::File,
}

impl RepoCache {
    pub fn lock(&self, etag: &str) -> Result<BlobLock, HubError> {
        let root = self.dir.parent().unwrap_or(Path::new("."));
        let name = self.dir.file_name().unwrap_or_default();
        let dir = root.join(".locks").join(name);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let path = dir.join(format!("{etag}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        flock(&file).map_err(io(&path))?;
        Ok(BlobLock { _file: file })
    }
}

/// Waits for the exclusive lock; closing the file releases it.
#[cfg(unix)]
fn flock(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    loop {
        // SAFETY: the descriptor is open for as long as `file` is borrowed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(not(unix))]
fn flock(_file: &std::fs::File) -> std::io::Result<()> {
    Ok(())
}

/// A name usable as one path segment (a commit, an etag).
pub fn safe_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// Where symlinks are not available `huggingface_hub` also falls back to a
/// copy of the blob.
#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    let blob = link.parent().unwrap_or(Path::new(".")).join(target);
    std::fs::copy(blob, link).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_follows_huggingface_hub() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            root(env(&[("HF_HUB_CACHE", "/c"), ("HF_HOME", "/h")])),
            PathBuf::from("/c")
        );
        assert_eq!(root(env(&[("HF_HOME", "/h")])), PathBuf::from("/h/hub"));
        assert_eq!(
            root(env(&[("HOME", "/u")])),
            PathBuf::from("/u/.cache/huggingface/hub")
        );
    }

    #[test]
    fn paths_and_links() {
        let tmp = std::env::temp_dir().join(format!("lamina-hub-cache-{}", std::process::id()));
        let c = RepoCache::new(&tmp, "org/name");
        assert!(c.dir().ends_with("models--org--name"));
        assert!(c.pointer("abc", "../x").is_err());
        assert!(c.pointer("abc", "/x").is_err());
        assert!(c.pointer("..", "x").is_err());
        std::fs::create_dir_all(c.dir().join("blobs")).unwrap();
        std::fs::write(c.blob("e1"), b"hi").unwrap();
        let p = c.link("abc", "sub/f.gguf", "e1").unwrap();
        assert_eq!(
            std::fs::read_link(&p).unwrap(),
            PathBuf::from("../../../blobs/e1")
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"hi");
        assert_eq!(c.snapshot_files("abc"), ["sub/f.gguf"]);
        c.write_ref("main", "abc").unwrap();
        assert_eq!(c.read_ref("main").as_deref(), Some("abc"));
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
