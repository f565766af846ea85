//! A model: one GGUF file or the shards of a split one
//! (`name-00001-of-00003.gguf`, written by `llama-gguf-split`), opened as one.
//!
//! As in llama.cpp: open with the first shard; the others are found by name;
//! each shard carries `split.no` equal to its index; tensor names are unique
//! across shards; the total equals `split.tensors.count`. Metadata is read
//! from the first shard, which holds all of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::file::{File, LoadMode};
use crate::read::TensorInfo;
use crate::value::Value;
use crate::watch::FileChanged;

pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS: &str = "split.tensors.count";

/// A tensor of a model: its table entry, which shard holds it, and its bytes.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub info: &'a TensorInfo,
    pub shard: usize,
    pub data: &'a [u8],
}

#[derive(Debug)]
pub struct Model {
    shards: Vec<File>,
    /// (shard, index in that shard's table), in shard then table order.
    order: Vec<(usize, usize)>,
    by_name: HashMap<String, usize>,
}

/// Splits `name-00001-of-00003.gguf` into (`name`, 1, 3).
pub fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let file = path.file_name()?.to_str()?;
    let stem = file.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((prefix.to_owned(), no.parse().ok()?, count.parse().ok()?))
}

/// The path of shard `no` (1-based) of `count`, beside `first`.
pub fn split_path(first: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    first.with_file_name(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

fn split_key(f: &File, key: &str) -> Result<Option<u64>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            GgufError::Split(format!(
                "{}: {key} is {} {v}, expected an unsigned integer",
                f.path().display(),
                v.value_type()
            ))
        }),
    }
}

impl Model {
    /// Opens a model from its only file or its first shard.
    pub fn open(path: impl AsRef<Path>, mode: LoadMode) -> Result<Self> {
        let path = path.as_ref();
        let first = File::open(path, mode)?;
        let count = split_key(&first, KEY_SPLIT_COUNT)?.unwrap_or(1);
        if count <= 1 {
            return Self::from_shards(vec![first]);
        }
        let no = split_key(&first, KEY_SPLIT_NO)?.unwrap_or(0);
        if no != 0 {
            return Err(GgufError::Split(format!(
                "{} is shard {} of {count}; open the first shard (-00001-of-{count:05}.gguf)",
                path.display(),
                no + 1
            )));
        }
        if count > 99_999 {
            return Err(GgufError::Split(format!(
                "split.count {count} is not plausible"
            )));
        }
        let Some((prefix, _, _)) = parse_split_name(path) else {
            return Err(GgufError::Split(format!(
                "{} says split.count = {count} but its name is not NAME-00001-of-{count:05}.gguf, so the other shards cannot be found",
                path.display()
            )));
        };
        let mut shards = vec![first];
        for i in 1..count as u32 {
            let p = split_path(path, &prefix, i + 1, count as u32);
            if !p.exists() {
                return Err(GgufError::Split(format!(
                    "shard {} of {count} is missing: {}",
                    i + 1,
                    p.display()
                )));
            }
            let f = File::open(&p, mode)?;
            let got = split_key(&f, KEY_SPLIT_NO)?;
            if got != Some(u64::from(i)) {
                return Err(GgufError::Split(format!(
                    "{}: split.no is {}, expected {i}",
                    p.display(),
                    got.map_or("missing".to_owned(), |g| g.to_string())
                )));
            }
            shards.push(f);
        }
        Self::from_shards(shards)
    }

    /// Assembles already-opened shards (in order) into one model.
    pub fn from_shards(shards: Vec<File>) -> Result<Self> {
        let mut order = Vec::new();
        let mut by_name = HashMap::new();
        for (s, f) in shards.iter().enumerate() {
            for (i, t) in f.tensors().iter().enumerate() {
                if by_name.insert(t.name.clone(), order.len()).is_some() {
                    return Err(GgufError::Split(format!(
                        "tensor {:?} is duplicated (again in {})",
                        t.name,
                        f.path().display()
                    )));
                }
                order.push((s, i));
            }
        }
        if shards.len() > 1 {
            let expected = split_key(&shards[0], KEY_SPLIT_TENSORS)?;
            if expected != Some(order.len() as u64) {
                return Err(GgufError::Split(format!(
                    "{} tensors expected (split.tensors.count) but {} found",
                    expected.map_or("an unknown number of".to_owned(), |e| e.to_string()),
                    order.len()
                )));
            }
        }
        Ok(Self {
            shards,
            order,
            by_name,
        })
    }

    /// `Ok` while every shard is still the file that was opened (see
    /// [`File::check_unchanged`]); the error names the first that is not.
    pub fn check_unchanged(&self) -> Result<(), FileChanged> {
        self.shards.iter().try_for_each(File::check_unchanged)
    }

    pub fn shards(&self) -> &[File] {
        &self.shards
    }

    /// The first shard, which holds the metadata.
    pub fn first(&self) -> &File {
        &self.shards[0]
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.first().get(key)
    }

    pub fn tensor_count(&self) -> usize {
        self.order.len()
    }

    fn at(&self, idx: usize) -> Tensor<'_> {
        let (s, i) = self.order[idx];
        let f = &self.shards[s];
        let info = &f.tensors()[i];
        Tensor {
            info,
            shard: s,
            data: f.tensor_data(info),
        }
    }

    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        self.by_name.get(name).map(|&i| self.at(i))
    }

    pub fn tensors(&self) -> impl Iterator<Item = Tensor<'_>> + '_ {
        (0..self.order.len()).map(|i| self.at(i))
    }
}
