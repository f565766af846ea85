//! One GGUF file, memory-mapped (or read) and validated, with zero-copy
//! views of its tensor data.

use std::fs;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::read::{parse, Layout, TensorInfo};
use crate::value::Value;

/// How the bytes of a file are brought into memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadMode {
    /// Map the file: tensor data is paged in on first touch and never copied.
    #[default]
    Mmap,
    /// Read the whole file into memory (`--no-mmap`): for filesystems where
    /// mapping is slow or unavailable. Same API.
    Read,
}

/// The bytes behind a file.
#[derive(Debug)]
pub enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
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
                // SAFETY: the map is read-only. Another process truncating or
                // rewriting the file while it is mapped would be undefined
                // behaviour; like every mmap-based model loader (llama.cpp
                // included) we accept that model files are not edited in place
                // while they are being served.
                let map = unsafe { memmap2::Mmap::map(&f) }.map_err(io)?;
                Storage::Mapped(map)
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
        matches!(self.storage, Storage::Mapped(_))
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
