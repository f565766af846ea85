//! A GGUF writer: builds valid files for tests and synthetic models.
//!
//! Tensors are laid out in insertion order, each padded to the alignment, as
//! llama.cpp's writer does. Version 1 output (32-bit counts) exists so that
//! the reader's v1 path is tested against something.

use crate::read::{DEFAULT_ALIGNMENT, MAGIC};
use crate::types::GgmlType;
use crate::value::{Array, Value};

#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Vec<u8>,
    /// The byte length of a tensor whose data [`Writer::write_with`] asks
    /// for when it writes it (`data` is then empty).
    pub deferred: Option<u64>,
}

impl TensorSpec {
    fn len(&self) -> u64 {
        self.deferred.unwrap_or(self.data.len() as u64)
    }
}

#[derive(Clone, Debug)]
pub struct Writer {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorSpec>,
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}

impl Writer {
    pub fn new() -> Self {
        Self {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Writes version 1, 2 or 3 (1 uses 32-bit counts and lengths).
    pub fn version(mut self, v: u32) -> Self {
        self.version = v;
        self
    }

    /// Sets the alignment and writes it as `general.alignment` (u32). The
    /// value must be a power of two.
    pub fn alignment(mut self, a: u32) -> Self {
        self.alignment = a.into();
        self.metadata.retain(|(k, _)| k != "general.alignment");
        self.metadata
            .push(("general.alignment".into(), Value::U32(a)));
        self
    }

    pub fn kv(mut self, key: impl Into<String>, value: Value) -> Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Adds a tensor; `data` must hold exactly the bytes its shape and type imply.
    pub fn tensor(
        mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Self {
        self.tensors.push(TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            data,
            deferred: None,
        });
        self
    }

    /// Adds a tensor of `bytes` bytes whose data is produced while writing
    /// ([`Writer::write_with`]), so a file larger than memory can be written.
    pub fn tensor_deferred(
        mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        bytes: u64,
    ) -> Self {
        self.tensors.push(TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            data: Vec::new(),
            deferred: Some(bytes),
        });
        self
    }

    /// Writes the file to `out`, asking `fill(i, tensor, buf)` for the bytes
    /// of each deferred tensor `i` (it must leave exactly the declared length
    /// in `buf`); tensors with data are written as they are.
    pub fn write_with<W: std::io::Write>(
        &self,
        out: &mut W,
        mut fill: impl FnMut(usize, &TensorSpec, &mut Vec<u8>),
    ) -> std::io::Result<()> {
        let header = self.header();
        out.write_all(&header)?;
        let a = self.alignment;
        let mut buf = Vec::new();
        for (i, t) in self.tensors.iter().enumerate() {
            let data = match t.deferred {
                Some(len) => {
                    buf.clear();
                    fill(i, t, &mut buf);
                    if buf.len() as u64 != len {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("{}: {} bytes, declared {len}", t.name, buf.len()),
                        ));
                    }
                    &buf[..]
                }
                None => &t.data[..],
            };
            out.write_all(data)?;
            let pad = (data.len() as u64).div_ceil(a) * a - data.len() as u64;
            out.write_all(&vec![0u8; pad as usize])?;
        }
        Ok(())
    }

    fn len(&self, out: &mut Vec<u8>, n: u64) {
        if self.version == 1 {
            out.extend_from_slice(&(n as u32).to_le_bytes());
        } else {
            out.extend_from_slice(&n.to_le_bytes());
        }
    }

    fn string(&self, out: &mut Vec<u8>, s: &str) {
        self.len(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }

    fn value(&self, out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.push(*x as u8),
            Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => out.push(u8::from(*x)),
            Value::String(s) => self.string(out, s),
            Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Array(a) => self.array(out, a),
        }
    }

    fn array(&self, out: &mut Vec<u8>, a: &Array) {
        out.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
        self.len(out, a.len() as u64);
        if let Array::Array(items) = a {
            for item in items {
                self.array(out, item);
            }
            return;
        }
        for i in 0..a.len() {
            if let Some(v) = a.get(i) {
                self.value(out, &v);
            }
        }
    }

    /// Serialises the file. Returns the bytes and each tensor's data offset.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.header();
        let a = self.alignment;
        let pad = |n: u64| n.div_ceil(a) * a;
        for t in &self.tensors {
            // Deferred tensors have no bytes here: zeros of their length.
            match t.deferred {
                Some(len) => out.resize(out.len() + len as usize, 0),
                None => out.extend_from_slice(&t.data),
            }
            out.resize(pad(out.len() as u64) as usize, 0);
        }
        out
    }

    /// Everything before the first tensor's data, padded to the alignment.
    fn header(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        self.len(&mut out, self.tensors.len() as u64);
        self.len(&mut out, self.metadata.len() as u64);
        for (k, v) in &self.metadata {
            self.string(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            self.value(&mut out, v);
        }
        let a = self.alignment;
        let pad = |n: u64| n.div_ceil(a) * a;
        let mut offset = 0u64;
        for t in &self.tensors {
            self.string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for &d in &t.dims {
                self.len(&mut out, d);
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += pad(t.len());
        }
        out.resize(pad(out.len() as u64) as usize, 0);
        out
    }
}
