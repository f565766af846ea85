//! Writes the hostile-input corpus under `tests/corpus/gguf/`: one small file
//! per way a GGUF file can be wrong, and a MANIFEST naming the error each must
//! produce. The replay test (`tests/corpus.rs`) and the fuzz target read it.
//!
//! Run with: `cargo run -p lamina-gguf --example make_corpus`

use std::fmt::Write as _;
use std::path::Path;

/// A raw byte builder that can write anything, valid or not.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &[u8]) -> Self {
        self.u64(s.len() as u64).bytes(s)
    }
    fn header(counts: (u64, u64)) -> Self {
        Raw::default()
            .bytes(b"GGUF")
            .u32(3)
            .u64(counts.0)
            .u64(counts.1)
    }
    /// key, type 4 (u32), value
    fn kv_u32(self, key: &[u8], v: u32) -> Self {
        self.str(key).u32(4).u32(v)
    }
    fn tensor(self, name: &[u8], dims: &[u64], ty: u32, offset: u64) -> Self {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(mut self, n: usize) -> Self {
        while self.0.len() % 32 != 0 {
            self.0.push(0);
        }
        self.0.extend((0..n).map(|i| i as u8));
        self
    }
}

/// A valid file: two keys and two tensors (F32 [4, 2] = 32 bytes, Q4_0 [32, 3] = 54 bytes).
fn valid() -> Raw {
    Raw::header((2, 2))
        .kv_u32(b"general.alignment", 32)
        .str(b"general.name")
        .u32(8)
        .str(b"corpus")
        .tensor(b"a", &[4, 2], 0, 0)
        .tensor(b"b", &[32, 3], 2, 32)
        .data(32 + 54)
}

fn one_tensor(dims: &[u64], ty: u32, offset: u64) -> Raw {
    Raw::header((1, 0)).tensor(b"t", dims, ty, offset).data(64)
}

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/gguf");
    std::fs::create_dir_all(&dir)?;
    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    let mut add = |name, bytes: Vec<u8>, expect| cases.push((name, bytes, expect));

    add("valid.gguf", valid().0, "");
    let mut b = valid().0;
    b[3] = b'X';
    add("bad_magic.gguf", b, "bad magic");
    let mut b = valid().0;
    b[4..8].copy_from_slice(&0u32.to_le_bytes());
    add("version_0.gguf", b, "unsupported GGUF version 0");
    let mut b = valid().0;
    b[4..8].copy_from_slice(&4u32.to_le_bytes());
    add("version_4.gguf", b, "unsupported GGUF version 4");
    let mut b = valid().0;
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    add("big_endian.gguf", b, "big-endian");
    let mut b = valid().0;
    b[0..4].copy_from_slice(b"FUGG");
    add("big_endian_magic.gguf", b, "big-endian");
    add(
        "tensor_count_huge.gguf",
        Raw::header((u64::MAX - 1, 0)).data(64).0,
        "tensor count",
    );
    add(
        "kv_count_huge.gguf",
        Raw::header((0, u64::MAX)).data(64).0,
        "metadata count",
    );
    add(
        "key_length_past_end.gguf",
        Raw::header((0, 1)).u64(1 << 40).bytes(b"abc").data(64).0,
        "metadata key 1099511627776 cannot fit",
    );
    add(
        "string_value_past_end.gguf",
        Raw::header((0, 1)).str(b"k").u32(8).u64(u64::MAX).0,
        "string value",
    );
    add(
        "array_2pow60.gguf",
        Raw::header((0, 1))
            .str(b"k")
            .u32(9)
            .u32(4)
            .u64(1 << 60)
            .data(64)
            .0,
        "array length 1152921504606846976 cannot fit",
    );
    add(
        "string_array_huge.gguf",
        Raw::header((0, 1))
            .str(b"k")
            .u32(9)
            .u32(8)
            .u64(1 << 40)
            .data(64)
            .0,
        "array length",
    );
    let mut deep = Raw::header((0, 1)).str(b"deep").u32(9);
    for _ in 0..10_000 {
        deep = deep.u32(9).u64(1);
    }
    add(
        "nested_arrays_deep.gguf",
        deep.u32(4).u64(0).data(64).0,
        "nests arrays deeper than 4",
    );
    add(
        "unknown_value_type.gguf",
        Raw::header((0, 1)).str(b"k").u32(13).u32(0).data(64).0,
        "unknown value type 13",
    );
    add(
        "duplicate_key.gguf",
        Raw::header((0, 2))
            .kv_u32(b"k", 1)
            .kv_u32(b"k", 2)
            .data(64)
            .0,
        "duplicate metadata key \"k\"",
    );
    add(
        "empty_key.gguf",
        Raw::header((0, 1)).kv_u32(b"", 1).data(64).0,
        "empty metadata key",
    );
    add(
        "key_not_utf8.gguf",
        Raw::header((0, 1)).kv_u32(b"\xff\xfe", 1).data(64).0,
        "not valid UTF-8",
    );
    add(
        "alignment_0.gguf",
        Raw::header((0, 1))
            .kv_u32(b"general.alignment", 0)
            .data(64)
            .0,
        "general.alignment is 0",
    );
    add(
        "alignment_not_pow2.gguf",
        Raw::header((0, 1))
            .kv_u32(b"general.alignment", 48)
            .data(64)
            .0,
        "not a power of two",
    );
    add(
        "alignment_wrong_type.gguf",
        Raw::header((0, 1))
            .str(b"general.alignment")
            .u32(10)
            .u64(32)
            .data(64)
            .0,
        "expected UINT32",
    );
    add(
        "too_many_dims.gguf",
        one_tensor(&[1, 1, 1, 1, 1], 0, 0).0,
        "at most 4",
    );
    add(
        "dim_product_overflow.gguf",
        one_tensor(&[1 << 32, 1 << 32], 0, 0).0,
        "overflows int64",
    );
    add(
        "dim_negative.gguf",
        one_tensor(&[u64::MAX], 0, 0).0,
        "does not fit in int64",
    );
    add(
        "byte_size_overflow.gguf",
        one_tensor(&[1 << 62], 0, 0).0,
        "byte size",
    );
    add(
        "partial_block.gguf",
        one_tensor(&[33, 1], 2, 0).0,
        "not a whole number of Q4_0 blocks",
    );
    add(
        "unknown_tensor_type.gguf",
        one_tensor(&[4], 99, 0).0,
        "unknown ggml type id 99",
    );
    add(
        "removed_tensor_type.gguf",
        one_tensor(&[32], 4, 0).0,
        "removed ggml type Q4_2",
    );
    add(
        "offset_past_end.gguf",
        one_tensor(&[4], 0, 1 << 40).0,
        "past the end of the file",
    );
    add(
        "offset_wraps.gguf",
        one_tensor(&[4], 0, u64::MAX - 31).0,
        "wraps around",
    );
    add(
        "offset_misaligned.gguf",
        one_tensor(&[4], 0, 4).0,
        "not a multiple of the alignment 32",
    );
    // b starts inside a (a is 64 bytes, b at 32).
    add(
        "overlapping_tensors.gguf",
        Raw::header((2, 0))
            .tensor(b"a", &[16], 0, 0)
            .tensor(b"b", &[16], 0, 32)
            .data(160)
            .0,
        "overlaps tensor \"a\"",
    );
    let mut b = valid().0;
    b.truncate(b.len() - 10);
    add("data_short.gguf", b, "past the end of the file");
    add(
        "duplicate_tensor.gguf",
        Raw::header((2, 0))
            .tensor(b"a", &[4], 0, 0)
            .tensor(b"a", &[4], 0, 32)
            .data(64)
            .0,
        "duplicate tensor name \"a\"",
    );
    add(
        "tensor_name_64_bytes.gguf",
        Raw::header((1, 0))
            .tensor(&[b'n'; 64], &[4], 0, 0)
            .data(32)
            .0,
        "ggml allows at most 63",
    );
    let mut v1 = Raw::default().bytes(b"GGUF").u32(1).u32(1).u32(1);
    v1 = v1.u32(1).bytes(b"k").u32(4).u32(7);
    v1 = v1.u32(1).bytes(b"t").u32(1).u32(4).u32(0).u64(0).data(16);
    add("valid_v1.gguf", v1.0, "");

    let mut manifest =
        String::from("# file<TAB>expected error substring (empty: the file is valid)\n");
    for (name, bytes, expect) in &cases {
        std::fs::write(dir.join(name), bytes)?;
        let _ = writeln!(manifest, "{name}\t{expect}");
    }
    std::fs::write(dir.join("MANIFEST"), manifest)?;
    println!("wrote {} files to {}", cases.len(), dir.display());
    Ok(())
}
