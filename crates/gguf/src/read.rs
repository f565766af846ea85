//! The bounded parser: header, metadata, tensor table, alignment, data offset.
//!
//! Every count and length read from the file is checked against the bytes
//! that remain before anything is allocated from it, so a hostile file costs
//! at most a small multiple of its own size in memory, and every loop is
//! bounded by the file's length. Nested arrays are read recursively, but no
//! deeper than [`MAX_ARRAY_DEPTH`].

use std::collections::HashSet;

use crate::error::{GgufError, Result};
use crate::types::GgmlType;
use crate::value::{Array, Value, ValueType};

/// `"GGUF"` as bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of each tensor when the file does not say.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u64 = 4;
/// ggml's `GGML_MAX_NAME` is 64 including the NUL, so names hold 63 bytes.
pub const MAX_TENSOR_NAME: usize = 63;
/// How many array levels the reader accepts (1 = a plain array). llama.cpp
/// accepts only plain arrays; the spec allows nesting, so a little is read.
pub const MAX_ARRAY_DEPTH: usize = 4;

/// Where one metadata pair lies in the file (absolute byte offsets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSpan {
    /// The key's length prefix.
    pub start: u64,
    /// The value type id.
    pub type_at: u64,
    /// The value (for arrays: the element type id).
    pub value_at: u64,
    /// One past the last byte of the value.
    pub end: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MetadataEntry {
    pub key: String,
    pub value: Value,
    pub span: KvSpan,
}

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` (ne0) is the contiguous axis, the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Relative to the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    /// Computed from the shape and the type's block size, never read from the file.
    pub n_bytes: u64,
    /// Absolute offset of this entry in the tensor table.
    pub info_at: u64,
}

impl TensorInfo {
    /// Weights per row (ne0).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of ne1..).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// How the sizes computed from shapes compare with the offsets in the table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SizeCheck {
    /// Tensors whose computed size, padded to the alignment, ends exactly where
    /// the next tensor (or the file) begins.
    pub agree: usize,
    pub total: usize,
}

/// Everything the header and tables of one file say, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub version: u32,
    pub tensor_count: u64,
    pub kv_count: u64,
    pub metadata: Vec<MetadataEntry>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset where the tensor table ends.
    pub table_end: u64,
    /// Absolute offset of the data section (`table_end` rounded up to the alignment).
    pub data_offset: u64,
    pub file_len: u64,
    pub size_check: SizeCheck,
}

impl Layout {
    /// Zero bytes between the table and the data section.
    pub fn padding(&self) -> u64 {
        self.data_offset - self.table_end
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata
            .iter()
            .find(|e| e.key == key)
            .map(|e| &e.value)
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? / a * a)
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Version 1 files use 32-bit counts and lengths.
    v1: bool,
}

impl<'a> Cursor<'a> {
    fn at(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                offset: self.at(),
                what,
                need: n,
                have: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count or length: u32 in version 1, u64 after.
    fn len(&mut self, what: &'static str) -> Result<u64> {
        if self.v1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    fn len_width(&self) -> u64 {
        if self.v1 {
            4
        } else {
            8
        }
    }

    /// Rejects `count` items of at least `min_size` bytes each that cannot fit
    /// in what remains; this is what keeps allocations proportional to the file.
    fn check_count(&self, at: u64, count: u64, min_size: u64, what: &'static str) -> Result<()> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.remaining() => Ok(()),
            _ => Err(GgufError::CountTooLarge {
                offset: at,
                what,
                count,
                remaining: self.remaining(),
            }),
        }
    }

    fn bytes_of_string(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let at = self.at();
        let n = self.len(what)?;
        if n > self.remaining() {
            return Err(GgufError::CountTooLarge {
                offset: at,
                what,
                count: n,
                remaining: self.remaining(),
            });
        }
        self.take(n, what)
    }

    /// A string that must be valid UTF-8 (keys, tensor names).
    fn strict_string(&mut self, what: &'static str) -> Result<String> {
        let at = self.at();
        let b = self.bytes_of_string(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| GgufError::BadUtf8 { offset: at, what })
    }

    /// A string value. Invalid UTF-8 is replaced rather than rejected: some
    /// SentencePiece vocabularies carry raw single-byte pieces, and refusing
    /// the whole file for one token would be worse than a replacement char.
    fn value_string(&mut self) -> Result<String> {
        let b = self.bytes_of_string("string value")?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    fn scalar(&mut self, ty: ValueType) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>("u8 value")?[0]),
            ValueType::I8 => Value::I8(self.array::<1>("i8 value")?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array("u16 value")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16 value")?)),
            ValueType::U32 => Value::U32(self.u32("u32 value")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32 value")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32 value")?)),
            // gguf.cpp reads an int8 and treats any non-zero as true.
            ValueType::Bool => Value::Bool(self.array::<1>("bool value")?[0] != 0),
            ValueType::String => Value::String(self.value_string()?),
            ValueType::U64 => Value::U64(self.u64("u64 value")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64 value")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64 value")?)),
            ValueType::Array => unreachable!("arrays are read by read_array"),
        })
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType> {
        let at = self.at();
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or_else(|| GgufError::BadValueType {
            offset: at,
            key: key.to_owned(),
            type_id: id,
        })
    }

    fn read_value(&mut self, ty: ValueType, key: &str) -> Result<Value> {
        if ty == ValueType::Array {
            Ok(Value::Array(self.read_array(key, 1)?))
        } else {
            self.scalar(ty)
        }
    }

    fn read_array(&mut self, key: &str, depth: usize) -> Result<Array> {
        let at = self.at();
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::ArrayTooDeep {
                offset: at,
                key: key.to_owned(),
                limit: MAX_ARRAY_DEPTH,
            });
        }
        let ty = self.value_type(key)?;
        let count_at = self.at();
        let count = self.len("array length")?;
        let min_size = match ty {
            ValueType::String => self.len_width(),
            ValueType::Array => 4 + self.len_width(),
            t => t.fixed_size().unwrap_or(1),
        };
        self.check_count(count_at, count, min_size, "array length")?;
        let n = count as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let raw = self.take(count * min_size, "array elements")?;
                Array::$variant(
                    raw.chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(count, "array elements")?.to_vec()),
            ValueType::I8 => Array::I8(
                self.take(count, "array elements")?
                    .iter()
                    .map(|&b| b as i8)
                    .collect(),
            ),
            ValueType::Bool => Array::Bool(
                self.take(count, "array elements")?
                    .iter()
                    .map(|&b| b != 0)
                    .collect(),
            ),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value_string()?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.read_array(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

/// Parses and validates the whole layout of one GGUF file held in `buf`.
pub fn parse(buf: &[u8]) -> Result<Layout> {
    let mut c = Cursor {
        buf,
        pos: 0,
        v1: false,
    };
    let magic: [u8; 4] = c.array("magic")?;
    if magic != MAGIC {
        // A big-endian writer stores the magic as a u32 in its own order.
        if magic == *b"FUGG" {
            return Err(GgufError::BigEndian);
        }
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    // gguf.cpp's trick: a big-endian v3 read little-endian is 0x03000000.
    if version != 0 && version & 0xFFFF == 0 {
        return Err(GgufError::BigEndian);
    }
    if !(1..=3).contains(&version) {
        return Err(GgufError::BadVersion { version });
    }
    c.v1 = version == 1;

    let tensor_count_at = c.at();
    let tensor_count = c.len("tensor count")?;
    let kv_count_at = c.at();
    let kv_count = c.len("metadata count")?;
    // Smallest possible entries: a key of one byte with a u8 value; a tensor
    // info with a one-byte name and no dimensions.
    let w = c.len_width();
    c.check_count(kv_count_at, kv_count, w + 1 + 4 + 1, "metadata count")?;
    c.check_count(
        tensor_count_at,
        tensor_count,
        w + 1 + 4 + 4 + 8,
        "tensor count",
    )?;

    let mut metadata: Vec<MetadataEntry> = Vec::with_capacity(kv_count as usize);
    let mut keys = HashSet::with_capacity(kv_count as usize);
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..kv_count {
        let start = c.at();
        let key = c.strict_string("metadata key")?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { offset: start });
        }
        if !keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey { offset: start, key });
        }
        let type_at = c.at();
        let ty = c.value_type(&key)?;
        let value_at = c.at();
        let value = c.read_value(ty, &key)?;
        if key == "general.alignment" {
            alignment = check_alignment(&value, value_at)?;
        }
        metadata.push(MetadataEntry {
            key,
            value,
            span: KvSpan {
                start,
                type_at,
                value_at,
                end: c.at(),
            },
        });
    }

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(tensor_count as usize);
    let mut names = HashSet::with_capacity(tensor_count as usize);
    for _ in 0..tensor_count {
        tensors.push(read_tensor_info(&mut c, &mut names)?);
    }
    let table_end = c.at();
    let file_len = buf.len() as u64;
    let data_offset = align_up(table_end, alignment).ok_or(GgufError::BadAlignment {
        offset: table_end,
        reason: "pushes the data section past 2^64".into(),
    })?;
    let size_check = check_offsets(&tensors, alignment, data_offset, file_len)?;
    Ok(Layout {
        version,
        tensor_count,
        kv_count,
        metadata,
        tensors,
        alignment,
        table_end,
        data_offset,
        file_len,
        size_check,
    })
}

fn check_alignment(value: &Value, offset: u64) -> Result<u64> {
    let bad = |reason: String| GgufError::BadAlignment { offset, reason };
    match *value {
        Value::U32(0) => Err(bad("is 0".into())),
        Value::U32(a) if !a.is_power_of_two() => Err(bad(format!("is {a}, not a power of two"))),
        Value::U32(a) => Ok(a.into()),
        ref v => Err(bad(format!("has type {}, expected UINT32", v.value_type()))),
    }
}

fn read_tensor_info(c: &mut Cursor<'_>, names: &mut HashSet<String>) -> Result<TensorInfo> {
    let info_at = c.at();
    let name = c.strict_string("tensor name")?;
    if name.len() > MAX_TENSOR_NAME {
        return Err(GgufError::NameTooLong {
            offset: info_at,
            len: name.len(),
            name,
        });
    }
    if !names.insert(name.clone()) {
        return Err(GgufError::DuplicateTensor {
            offset: info_at,
            name,
        });
    }
    let n_dims = u64::from(c.u32("dimension count")?);
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            offset: info_at,
            name,
            n_dims,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.len("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;
    let shape_err = |reason: String| GgufError::BadShape {
        offset: info_at,
        name: name.clone(),
        reason,
    };
    // ggml stores ne as int64: each dimension and their product must fit.
    let mut n_elements: u64 = 1;
    for &d in &dims {
        if d > i64::MAX as u64 {
            return Err(shape_err(format!("dimension {d} does not fit in int64")));
        }
        n_elements = n_elements
            .checked_mul(d)
            .filter(|n| *n <= i64::MAX as u64)
            .ok_or_else(|| shape_err(format!("element count of {dims:?} overflows int64")))?;
    }
    let ty = GgmlType::from_id(type_id).map_err(|source| GgufError::BadTensorType {
        offset: info_at,
        name: name.clone(),
        source,
    })?;
    let row = dims.first().copied().unwrap_or(1);
    if row % ty.block_size() != 0 {
        return Err(shape_err(format!(
            "row of {row} weights is not a whole number of {ty} blocks of {}",
            ty.block_size()
        )));
    }
    let n_bytes = ty
        .bytes_for(n_elements)
        .filter(|b| *b <= i64::MAX as u64)
        .ok_or_else(|| shape_err(format!("byte size of {dims:?} {ty} overflows")))?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_elements,
        n_bytes,
        info_at,
    })
}

/// Every tensor must start aligned, lie inside the file, and begin at or after
/// the end of the one before it in the table (so none overlap). Gaps are legal
/// by the spec but counted as disagreement, as llama.cpp's contiguity rule would.
fn check_offsets(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<SizeCheck> {
    let mut agree = 0;
    let mut prev: Option<(&TensorInfo, u64)> = None;
    let data_len = file_len.saturating_sub(data_offset);
    for (i, t) in tensors.iter().enumerate() {
        let bad = |reason: String| GgufError::BadOffset {
            offset: t.info_at,
            name: t.name.clone(),
            reason,
        };
        if t.offset % alignment != 0 {
            return Err(bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                t.offset
            )));
        }
        let Some(abs) = data_offset.checked_add(t.offset) else {
            return Err(bad(format!("offset {} wraps around", t.offset)));
        };
        let Some(end) = t.offset.checked_add(t.n_bytes) else {
            return Err(bad(format!(
                "offset {} + {} bytes wraps around",
                t.offset, t.n_bytes
            )));
        };
        if abs > file_len || end > data_len {
            return Err(bad(format!(
                "data [{abs}, {}) lies past the end of the file ({file_len} bytes): the file is truncated or the table is wrong",
                abs.saturating_add(t.n_bytes)
            )));
        }
        if let Some((p, p_end)) = prev {
            if t.offset < p_end {
                return Err(bad(format!(
                    "offset {} overlaps tensor {:?}, which ends at {p_end}",
                    t.offset, p.name
                )));
            }
        }
        let padded_end = align_up(end, alignment).unwrap_or(u64::MAX);
        let next_start = tensors.get(i + 1).map(|n| n.offset);
        let agrees = match next_start {
            Some(n) => n == padded_end,
            // The last tensor: nothing unexplained may follow it.
            None => padded_end >= data_len,
        };
        agree += usize::from(agrees);
        prev = Some((t, end));
    }
    Ok(SizeCheck {
        agree,
        total: tensors.len(),
    })
}
