//! Whether a mapped file is still the file that was opened.
//!
//! A map shows the file's current bytes, not the bytes it had when it was
//! opened: a same-size overwrite in place silently changes the weights, and a
//! truncation cuts pages off (`crate::mapping` turns those into zeros). A
//! file keeps its open handle and the identity it had then (device, inode,
//! size, modification time); [`Watch::check`] compares them with an `fstat`
//! of that handle, which costs a syscall and no I/O, so it can run around
//! every step that reads the map.
//!
//! Replacing the file by rename (`mv new.gguf model.gguf`) is not a change:
//! the handle still names the old inode, whose bytes nobody touched.
//!
//! The modification time has the filesystem's granularity: a same-size
//! overwrite within the same tick as the open itself is not seen.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What a file looked like through its handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: Option<SystemTime>,
}

impl Identity {
    pub fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        let (dev, ino) = {
            use std::os::unix::fs::MetadataExt as _;
            (meta.dev(), meta.ino())
        };
        #[cfg(not(unix))]
        let (dev, ino) = (0, 0);
        Self {
            dev,
            ino,
            size: meta.len(),
            mtime: meta.modified().ok(),
        }
    }
}

/// How a file differs from what was opened.
#[derive(Debug, thiserror::Error)]
pub enum Change {
    #[error(
        "it was truncated while mapped: pages under the map vanished, and reads of them now give zeros"
    )]
    PagesLost,
    #[error("its size changed from {was} to {now} bytes")]
    Resized { was: u64, now: u64 },
    #[error("it was written in place (its modification time changed)")]
    Modified,
    #[error("its handle no longer names the same file (device or inode changed)")]
    Replaced,
    #[error("its status could not be read: {0}")]
    Stat(#[source] std::io::Error),
}

/// A mapped file that changed: what was computed from it may be wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}: the model file changed while in use: {change}", path.display())]
pub struct FileChanged {
    pub path: PathBuf,
    #[source]
    pub change: Change,
}

/// An open file and the identity it had when opened.
#[derive(Debug)]
pub struct Watch {
    file: fs::File,
    at_open: Identity,
}

impl Watch {
    pub fn new(file: fs::File, at_open: Identity) -> Self {
        Self { file, at_open }
    }

    pub fn identity(&self) -> Identity {
        self.at_open
    }

    /// `Ok` while the handle's file still looks as it did when opened and
    /// its map is intact (`lost`: the map was replaced with zeros).
    pub fn check(&self, path: &Path, lost: bool) -> Result<(), FileChanged> {
        let changed = |change| FileChanged {
            path: path.to_path_buf(),
            change,
        };
        if lost {
            return Err(changed(Change::PagesLost));
        }
        let now = Identity::of(&self.file.metadata().map_err(|e| changed(Change::Stat(e)))?);
        compare(&self.at_open, &now).map_err(changed)
    }
}

/// The first difference that matters, the most telling first.
pub fn compare(was: &Identity, now: &Identity) -> Result<(), Change> {
    if now.size != was.size {
        return Err(Change::Resized {
            was: was.size,
            now: now.size,
        });
    }
    if (now.dev, now.ino) != (was.dev, was.ino) {
        return Err(Change::Replaced);
    }
    if now.mtime != was.mtime {
        return Err(Change::Modified);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn id(size: u64, secs: u64) -> Identity {
        Identity {
            dev: 1,
            ino: 2,
            size,
            mtime: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)),
        }
    }

    #[test]
    fn each_field_is_a_change() {
        let was = id(100, 5);
        assert!(compare(&was, &was).is_ok());
        assert!(matches!(
            compare(&was, &id(50, 6)),
            Err(Change::Resized { was: 100, now: 50 })
        ));
        assert!(matches!(compare(&was, &id(100, 6)), Err(Change::Modified)));
        let moved = Identity { ino: 3, ..was };
        assert!(matches!(compare(&was, &moved), Err(Change::Replaced)));
    }
}
