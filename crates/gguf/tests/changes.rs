//! A mapped file changed under the map is reported, never silently read:
//! a same-size overwrite, a truncation (whose pages would raise SIGBUS and
//! read zeros instead), a shard of a split model; a rename over the path and
//! a file read into memory are not changes.
#![allow(clippy::unwrap_used)]

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, SystemTime};

use lamina_gguf::{Change, GgmlType, LoadMode, Model, Value, Writer};

mod common;

use common::TempDir;

/// A file with one tensor `t` of `n` F32 ones: several pages of data.
fn gguf(kv: &[(&str, Value)], n: usize) -> Vec<u8> {
    gguf_named(kv, "t", n)
}

fn gguf_named(kv: &[(&str, Value)], name: &str, n: usize) -> Vec<u8> {
    let mut w = Writer::new().kv("general.architecture", Value::String("llama".into()));
    for (k, v) in kv {
        w = w.kv(*k, v.clone());
    }
    let data: Vec<u8> = (0..n).flat_map(|_| 1f32.to_le_bytes()).collect();
    w.tensor(name, &[n as u64], GgmlType::F32, data).to_bytes()
}

/// Writes `bytes` with a modification time an hour back, so that a write
/// made by the test cannot fall in the same timestamp tick.
fn write_old(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
}

/// Overwrites the last `n` bytes in place with other bytes: same length.
fn scribble_tail(path: &Path, n: usize) {
    let mut f = std::fs::File::options().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.seek(SeekFrom::Start(len - n as u64)).unwrap();
    f.write_all(&vec![0xA5; n]).unwrap();
}

fn sum(data: &[u8]) -> u64 {
    std::hint::black_box(data)
        .iter()
        .map(|&b| u64::from(b))
        .sum()
}

#[test]
fn a_same_size_overwrite_in_place_is_a_change() {
    let d = TempDir::new("changes", "overwrite");
    let p = d.0.join("m.gguf");
    write_old(&p, &gguf(&[], 4096));
    let m = Model::open(&p, LoadMode::Mmap).unwrap();
    m.check_unchanged().unwrap();
    scribble_tail(&p, 64);
    assert_eq!(
        std::fs::metadata(&p).unwrap().len(),
        m.first().bytes().len() as u64
    );
    let e = m.check_unchanged().unwrap_err();
    assert!(matches!(e.change, Change::Modified), "{e}");
    assert_eq!(e.path, p);
    assert!(e.to_string().contains("m.gguf"), "{e}");
}

#[test]
fn a_truncated_map_reads_zeros_instead_of_raising_sigbus_and_is_reported() {
    let d = TempDir::new("changes", "truncate");
    let p = d.0.join("m.gguf");
    let n = 64 * 1024; // 256 KiB of tensor data: many pages past any header
    write_old(&p, &gguf(&[], n));
    let m = Model::open(&p, LoadMode::Mmap).unwrap();
    let t = m.tensor("t").unwrap();
    assert_eq!(sum(t.data), sum(&1f32.to_le_bytes()) * n as u64);

    // What `cp new.gguf m.gguf` does first. Every page of the map is past
    // the end now: touching one raises SIGBUS, which used to kill the
    // process.
    std::fs::File::create(&p).unwrap();
    assert_eq!(sum(t.data), 0, "the lost map reads zeros");
    let e = m.check_unchanged().unwrap_err();
    assert!(matches!(e.change, Change::PagesLost), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
    drop(m);

    // The slot is free again, and a new map of the file starts clean.
    write_old(&p, &gguf(&[], n));
    let m = Model::open(&p, LoadMode::Mmap).unwrap();
    assert_eq!(
        sum(m.tensor("t").unwrap().data),
        sum(&1f32.to_le_bytes()) * n as u64
    );
    m.check_unchanged().unwrap();
}

#[test]
fn a_resize_without_touching_the_map_is_a_change() {
    let d = TempDir::new("changes", "resize");
    let p = d.0.join("m.gguf");
    write_old(&p, &gguf(&[], 4096));
    let m = Model::open(&p, LoadMode::Mmap).unwrap();
    let len = m.first().bytes().len() as u64;
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let e = m.check_unchanged().unwrap_err();
    assert!(
        matches!(e.change, Change::Resized { was, now } if was == len && now == len / 2),
        "{e}"
    );
}

#[test]
fn a_changed_shard_of_a_split_model_is_named() {
    let d = TempDir::new("changes", "split");
    let split = |no: u16| {
        [
            ("split.no", Value::U16(no)),
            ("split.count", Value::U16(2)),
            ("split.tensors.count", Value::I32(2)),
        ]
    };
    // Tensor names are unique across shards.
    let second = gguf_named(&split(1), "u", 4096);
    let first = d.0.join("m-00001-of-00002.gguf");
    let other = d.0.join("m-00002-of-00002.gguf");
    write_old(&first, &gguf(&split(0), 4096));
    write_old(&other, &second);
    let m = Model::open(&first, LoadMode::Mmap).unwrap();
    assert_eq!(m.shards().len(), 2);
    m.check_unchanged().unwrap();
    scribble_tail(&other, 16);
    let e = m.check_unchanged().unwrap_err();
    assert_eq!(e.path, other, "{e}");
    assert!(matches!(e.change, Change::Modified), "{e}");
}

#[test]
fn a_rename_over_the_path_leaves_the_open_file_intact() {
    let d = TempDir::new("changes", "rename");
    let p = d.0.join("m.gguf");
    write_old(&p, &gguf(&[], 4096));
    let m = Model::open(&p, LoadMode::Mmap).unwrap();
    let before = sum(m.tensor("t").unwrap().data);
    let new = d.0.join("new.gguf");
    std::fs::write(&new, b"not a model").unwrap();
    std::fs::rename(&new, &p).unwrap();
    m.check_unchanged().unwrap();
    assert_eq!(sum(m.tensor("t").unwrap().data), before);
}

#[test]
fn a_file_read_into_memory_is_never_changed() {
    let d = TempDir::new("changes", "read");
    let p = d.0.join("m.gguf");
    write_old(&p, &gguf(&[], 4096));
    let m = Model::open(&p, LoadMode::Read).unwrap();
    let before = sum(m.tensor("t").unwrap().data);
    std::fs::File::create(&p).unwrap();
    m.check_unchanged().unwrap();
    assert_eq!(sum(m.tensor("t").unwrap().data), before);
}
