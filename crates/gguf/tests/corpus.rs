//! Replays the hostile-input corpus (`tests/corpus/gguf`, written by the
//! `make_corpus` example): each file must give the error its MANIFEST names,
//! and no prefix of a valid file may parse or panic.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use lamina_gguf::{File, GgmlType, Value, Writer};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/gguf")
}

#[test]
fn every_corpus_file_gives_its_error() {
    let manifest = std::fs::read_to_string(corpus_dir().join("MANIFEST")).unwrap();
    let mut seen = 0;
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        let (name, expect) = line.split_once('\t').unwrap();
        let bytes = std::fs::read(corpus_dir().join(name)).unwrap();
        let result = File::from_bytes(bytes);
        if expect.is_empty() {
            assert!(result.is_ok(), "{name}: {}", result.unwrap_err());
        } else {
            let err = result.map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(expect), "{name}: got {err:?}, want {expect:?}");
            assert!(err.starts_with("at byte "), "{name}: no offset in {err:?}");
        }
        seen += 1;
    }
    let on_disk = std::fs::read_dir(corpus_dir()).unwrap().count() - 1;
    assert_eq!(seen, on_disk, "every corpus file is in the MANIFEST");
    assert!(seen >= 30);
}

fn small_valid_file() -> Vec<u8> {
    Writer::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(1))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(lamina_gguf::Array::String(vec!["a".into(), "bc".into()])),
        )
        .tensor("w", &[32, 2], GgmlType::Q8_0, vec![1; 68])
        .tensor("n", &[3], GgmlType::F32, vec![2; 12])
        .to_bytes()
}

#[test]
fn truncation_at_every_byte_is_an_error_with_an_offset() {
    let full = small_valid_file();
    let parsed = File::from_bytes(full.clone()).unwrap();
    let data_end = parsed.layout().data_offset as usize + 32 * 3 + 12;
    assert_eq!(parsed.layout().size_check.agree, 2);
    for len in 0..data_end {
        let err = match File::from_bytes(full[..len].to_vec()) {
            Ok(_) => panic!("a {len}-byte prefix of a {}-byte file parsed", full.len()),
            Err(e) => e.to_string(),
        };
        assert!(err.starts_with("at byte "), "prefix {len}: {err}");
    }
}

#[test]
fn flipping_any_header_byte_never_panics() {
    let full = small_valid_file();
    let table_end = File::from_bytes(full.clone()).unwrap().layout().table_end as usize;
    for i in 0..table_end {
        for v in [0u8, 0xff, 0x80, 0x01] {
            let mut b = full.clone();
            b[i] = v;
            let _ = File::from_bytes(b);
        }
    }
}
