//! One GGUF file, memory-mapped (or read) and validated, with zero-copy
//! views of its tensor data. A mapped file keeps its handle, so that
//! [`File::check_unchanged`] can tell when the file changed under the map.

use std::fs;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::mapping::Map;
use crate::read::{parse, Layout, TensorInfo};
use crate::value::Value;
use crate::watch::{FileChanged, Identity, Watch};

/// How the bytes of a file are brought into memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadMode {
    /// Map the file: tensor data is paged in on first touch and never copied.
    /// The map shows the file as it is now: if it is written in place, or
    /// truncated (whose lost pages then read as zeros, not SIGBUS; see
    /// [`crate::mapping`]), [`File::check_unchanged`] says so, and whoever
    /// computes from the bytes must ask it afterwards.
    #[default]
    Mmap,
    /// Read the whole file into memory (`--no-mmap`): for filesystems where
    /// mapping is slow or unavailable, and where later changes to the file
    /// must not reach the reader. Same API.
    Read,
}

/// The bytes behind a file.
#[derive(Debug)]
pub enum Storage {
    /// A map, with the handle it was made from and the file's identity then.
    Mapped {
        map: Map,
        watch: Watch,
    },
    Owned(Vec<u8>),
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped { map, .. } => map,
            Storage::Owned(v) => v,
        }
    }
}

/// One parsed GGUF file.
#[derive(Debug)]
pub struct File {
    path: PathBuf,
    storage: Storage,
    layout: Layout,
}

impl File {
    pub fn open(path: impl AsRef<Path>, mode: LoadMode) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let storage = match mode {
            LoadMode::Mmap => {
                let f = fs::File::open(&path).map_err(io)?;
                // The identity first, and a map of exactly the size it
                // records: a change after this point is one `check` sees.
                let at_open = Identity::of(&f.metadata().map_err(io)?);
                let map = Map::new(&f, at_open.size).map_err(io)?;
                Storage::Mapped {
                    map,
                    watch: Watch::new(f, at_open),
                }
            }
            LoadMode::Read => Storage::Owned(fs::read(&path).map_err(io)?),
        };
        Self::from_storage(path, storage)
    }

    /// Parses a file held in memory (tests, fuzzing, the writer's output).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_storage(PathBuf::from("<memory>"), Storage::Owned(bytes))
    }

    fn from_storage(path: PathBuf, storage: Storage) -> Result<Self> {
        let layout = parse(&storage)?;
        Ok(Self {
            path,
            storage,
            layout,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.storage
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }

    /// `Ok` while the bytes are still those of the file as it was opened.
    /// A read file always is; a mapped one is not once the file was
    /// truncated (its map then reads zeros), resized or written in place.
    /// One `fstat`: cheap enough to run around every use of the weights.
    pub fn check_unchanged(&self) -> Result<(), FileChanged> {
        match &self.storage {
            Storage::Mapped { map, watch } => watch.check(&self.path, map.lost()),
            Storage::Owned(_) => Ok(()),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.layout.get(key)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.layout.tensors
    }

    /// The bytes of a tensor of this file: a slice of the map, bounds checked
    /// when the file was opened.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.layout.data_offset + t.offset) as usize;
        &self.storage[start..start + t.n_bytes as usize]
    }
}
