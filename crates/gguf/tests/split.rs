//! Split models: shards written with the writer, opened as one model.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use lamina_gguf::{GgmlType, LoadMode, Model, Value, Writer};

mod common;

use common::TempDir;

fn shard(no: u16, count: u16, total: i32, names: &[&str]) -> Vec<u8> {
    let mut w = Writer::new()
        .kv("split.no", Value::U16(no))
        .kv("split.count", Value::U16(count))
        .kv("split.tensors.count", Value::I32(total));
    if no == 0 {
        w = w.kv("general.architecture", Value::String("llama".into()));
    }
    for (i, n) in names.iter().enumerate() {
        w = w.tensor(*n, &[4], GgmlType::F32, vec![no as u8 * 16 + i as u8; 16]);
    }
    w.to_bytes()
}

fn write_shards(dir: &Path, shards: &[Vec<u8>]) -> PathBuf {
    let n = shards.len();
    for (i, s) in shards.iter().enumerate() {
        std::fs::write(dir.join(format!("m-{:05}-of-{n:05}.gguf", i + 1)), s).unwrap();
    }
    dir.join(format!("m-00001-of-{n:05}.gguf"))
}

#[test]
fn three_shards_open_as_one_model() {
    let d = TempDir::new("split", "ok");
    let first = write_shards(
        &d.0,
        &[
            shard(0, 3, 4, &["a", "b"]),
            shard(1, 3, 4, &["c"]),
            shard(2, 3, 4, &["d"]),
        ],
    );
    for mode in [LoadMode::Mmap, LoadMode::Read] {
        let m = Model::open(&first, mode).unwrap();
        assert_eq!(m.shards().len(), 3);
        assert_eq!(m.tensor_count(), 4);
        assert_eq!(
            m.get("general.architecture").unwrap().as_str(),
            Some("llama")
        );
        let c = m.tensor("c").unwrap();
        assert_eq!(c.shard, 1);
        assert_eq!(c.data, &[16u8; 16]);
        assert_eq!(m.tensor("d").unwrap().data, &[32u8; 16]);
        let names: Vec<_> = m.tensors().map(|t| t.info.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
    }
}

#[test]
fn missing_shard_is_named() {
    let d = TempDir::new("split", "missing");
    let first = write_shards(
        &d.0,
        &[shard(0, 3, 3, &["a"]), shard(1, 3, 3, &["b"]), vec![]],
    );
    std::fs::remove_file(d.0.join("m-00003-of-00003.gguf")).unwrap();
    let err = Model::open(&first, LoadMode::Mmap).unwrap_err().to_string();
    assert!(err.contains("shard 3 of 3 is missing"), "{err}");
}

#[test]
fn mismatched_shard_index_is_an_error() {
    let d = TempDir::new("split", "mismatch");
    let first = write_shards(&d.0, &[shard(0, 2, 2, &["a"]), shard(0, 2, 2, &["b"])]);
    let err = Model::open(&first, LoadMode::Mmap).unwrap_err().to_string();
    assert!(err.contains("split.no is 0, expected 1"), "{err}");
}

#[test]
fn opening_a_later_shard_is_an_error() {
    let d = TempDir::new("split", "later");
    write_shards(&d.0, &[shard(0, 2, 2, &["a"]), shard(1, 2, 2, &["b"])]);
    let err = Model::open(d.0.join("m-00002-of-00002.gguf"), LoadMode::Mmap)
        .unwrap_err()
        .to_string();
    assert!(err.contains("open the first shard"), "{err}");
}

#[test]
fn tensor_total_and_duplicates_are_checked() {
    let d = TempDir::new("split", "total");
    let first = write_shards(&d.0, &[shard(0, 2, 5, &["a"]), shard(1, 2, 5, &["b"])]);
    let err = Model::open(&first, LoadMode::Mmap).unwrap_err().to_string();
    assert!(err.contains("5 tensors expected"), "{err}");

    let d = TempDir::new("split", "dup");
    let first = write_shards(&d.0, &[shard(0, 2, 2, &["a"]), shard(1, 2, 2, &["a"])]);
    let err = Model::open(&first, LoadMode::Mmap).unwrap_err().to_string();
    assert!(err.contains("\"a\" is duplicated"), "{err}");
}
