//! Our decoders against golden blocks dequantized by the numpy decoders of the `gguf`
//! Python package (an implementation independent of this crate), bit for bit.
//!
//! Regenerate the fixtures with `python3 scripts/gen-quant-fixtures.py` from the
//! repository root (needs `pip install gguf numpy`); `--check` verifies they are current.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use lamina_quant::{dequantize, supports, GgmlType};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant")
}

/// `(blocks, expected weights)` of `ty`, or `None` when no fixture exists for it.
fn fixture(ty: GgmlType) -> Option<(Vec<u8>, Vec<f32>)> {
    let dir = fixture_dir();
    let blocks = std::fs::read(dir.join(format!("{}.blocks", ty.name()))).ok()?;
    let raw = std::fs::read(dir.join(format!("{}.f32", ty.name()))).unwrap();
    let expected = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Some((blocks, expected))
}

/// Dequantizes the fixture of `ty` and returns the indices whose bits differ.
fn mismatches(ty: GgmlType) -> Vec<String> {
    let (blocks, expected) = fixture(ty).unwrap_or_else(|| panic!("no fixture for {ty}"));
    let mut got = vec![f32::NAN; expected.len()];
    dequantize(ty, &blocks, &mut got).unwrap();
    got.iter()
        .zip(&expected)
        .enumerate()
        .filter(|(_, (g, e))| g.to_bits() != e.to_bits())
        .map(|(i, (g, e))| {
            format!(
                "{ty}[{i}]: got {g:e} ({:#010x}), want {e:e} ({:#010x})",
                g.to_bits(),
                e.to_bits()
            )
        })
        .collect()
}

#[test]
fn every_supported_type_matches_its_golden_fixture_bit_for_bit() {
    let mut failures = Vec::new();
    let mut checked = Vec::new();
    for ty in GgmlType::ALL.into_iter().filter(|t| supports(*t)) {
        let bad = mismatches(ty);
        if !bad.is_empty() {
            failures.push(format!(
                "{ty}: {} of 1024 weights differ, e.g.\n  {}",
                bad.len(),
                bad[..bad.len().min(4)].join("\n  ")
            ));
        }
        checked.push(ty.name());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked.len() >= 28, "checked only {checked:?}");
}

#[test]
fn every_fixture_has_a_decoder() {
    let mut names: Vec<String> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".blocks").map(str::to_owned))
        .collect();
    names.sort();
    assert!(names.len() >= 28, "only {} fixtures", names.len());
    for name in names {
        let ty =
            GgmlType::from_name(&name).unwrap_or_else(|| panic!("fixture for unknown type {name}"));
        assert!(supports(ty), "fixture {name} has no decoder");
    }
}
