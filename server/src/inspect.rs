//! `lamina inspect FILE`: what a GGUF file is, told to a person (or, with
//! `--json`, to a program). Reads only the header and tables; the only tensor
//! bytes it touches are none.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use lamina_gguf::{Array, Layout, MetadataEntry, Model, Value};
use serde_json::{json, Map, Value as Json};

/// How many metadata pairs the hand-read header walks through.
const HEADER_PAIRS: usize = 3;
/// Bytes of one field shown in the hex walk before eliding.
const HEX_FIELD_MAX: usize = 12;

pub use lamina_model::plan::human_size;

fn hex(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(HEX_FIELD_MAX)];
    let mut s: String = shown.iter().map(|b| format!("{b:02x} ")).collect();
    if bytes.len() > HEX_FIELD_MAX {
        let _ = write!(s, "… ({} bytes)", bytes.len());
    }
    s.trim_end().to_owned()
}

/// The first bytes of the file, each field named, as one would read them in a
/// hex editor with the spec open beside it.
fn header_walk(out: &mut String, bytes: &[u8], layout: &Layout) {
    let w = if layout.version == 1 { 4 } else { 8 };
    let mut line = |at: u64, len: u64, what: &str, meaning: String| {
        let (a, b) = (at as usize, (at + len) as usize);
        let _ = writeln!(
            out,
            "  {at:>8}  {:<48}  {what:<14} {meaning}",
            hex(&bytes[a..b.min(bytes.len())])
        );
    };
    line(0, 4, "magic", "\"GGUF\"".into());
    line(4, 4, "version", layout.version.to_string());
    line(8, w, "tensor_count", layout.tensor_count.to_string());
    line(8 + w, w, "kv_count", layout.kv_count.to_string());
    for e in layout.metadata.iter().take(HEADER_PAIRS) {
        let s = &e.span;
        line(s.start, w, "key length", e.key.len().to_string());
        line(
            s.start + w,
            e.key.len() as u64,
            "key",
            format!("{:?}", e.key),
        );
        line(s.type_at, 4, "value type", e.value.value_type().to_string());
        match &e.value {
            Value::String(v) => {
                line(s.value_at, w, "string length", v.len().to_string());
                line(s.value_at + w, v.len() as u64, "value", short(&e.value));
            }
            Value::Array(a) => {
                line(s.value_at, 4, "element type", a.element_type().to_string());
                line(s.value_at + 4, w, "count", a.len().to_string());
                let first = s.value_at + 4 + w;
                line(first, s.end - first, "elements", String::new());
            }
            v => line(s.value_at, s.end - s.value_at, "value", short(v)),
        }
    }
    if let Some(e) = layout.metadata.get(HEADER_PAIRS) {
        let _ = writeln!(
            out,
            "  {:>8}  … {} more pairs",
            e.span.start,
            layout.metadata.len() - HEADER_PAIRS
        );
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 72 {
        let cut: String = s.chars().take(69).collect();
        format!("{cut}…")
    } else {
        s
    }
}

fn array_json(a: &Array) -> Json {
    if let Array::Array(items) = a {
        return Json::Array(items.iter().map(array_json).collect());
    }
    Json::Array(
        (0..a.len())
            .filter_map(|i| a.get(i))
            .map(|v| scalar_json(&v))
            .collect(),
    )
}

fn scalar_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(a) => array_json(a),
    }
}

fn entry_json(e: &MetadataEntry, full: bool) -> Json {
    match &e.value {
        Value::Array(a) => {
            let mut m = Map::new();
            m.insert("type".into(), json!("array"));
            m.insert("element_type".into(), json!(a.element_type().name()));
            m.insert("count".into(), json!(a.len()));
            m.insert("bytes".into(), json!(e.span.end - e.span.value_at));
            if full {
                m.insert("value".into(), array_json(a));
            }
            Json::Object(m)
        }
        v => json!({"type": v.value_type().name(), "value": scalar_json(v)}),
    }
}

/// llama.cpp's `llama_ftype` names for `general.file_type` (include/llama.h):
/// what the file says it is, which the storage types may contradict.
fn file_type_name(id: u64) -> Option<&'static str> {
    Some(match id {
        0 => "ALL_F32",
        1 => "MOSTLY_F16",
        2 => "MOSTLY_Q4_0",
        3 => "MOSTLY_Q4_1",
        7 => "MOSTLY_Q8_0",
        8 => "MOSTLY_Q5_0",
        9 => "MOSTLY_Q5_1",
        10 => "MOSTLY_Q2_K",
        11 => "MOSTLY_Q3_K_S",
        12 => "MOSTLY_Q3_K_M",
        13 => "MOSTLY_Q3_K_L",
        14 => "MOSTLY_Q4_K_S",
        15 => "MOSTLY_Q4_K_M",
        16 => "MOSTLY_Q5_K_S",
        17 => "MOSTLY_Q5_K_M",
        18 => "MOSTLY_Q6_K",
        19 => "MOSTLY_IQ2_XXS",
        20 => "MOSTLY_IQ2_XS",
        21 => "MOSTLY_Q2_K_S",
        22 => "MOSTLY_IQ3_XS",
        23 => "MOSTLY_IQ3_XXS",
        24 => "MOSTLY_IQ1_S",
        25 => "MOSTLY_IQ4_NL",
        26 => "MOSTLY_IQ3_S",
        27 => "MOSTLY_IQ3_M",
        28 => "MOSTLY_IQ2_S",
        29 => "MOSTLY_IQ2_M",
        30 => "MOSTLY_IQ4_XS",
        31 => "MOSTLY_IQ1_M",
        32 => "MOSTLY_BF16",
        36 => "MOSTLY_TQ1_0",
        37 => "MOSTLY_TQ2_0",
        38 => "MOSTLY_MXFP4_MOE",
        39 => "MOSTLY_NVFP4",
        40 => "MOSTLY_Q1_0",
        41 => "MOSTLY_Q2_0",
        _ => return None,
    })
}

/// What a reader of the seed article checks by hand: the file type the
/// file claims, the storage types it actually holds (by bytes) and the bits
/// per weight, and whether it carries a draft (multi-token prediction /
/// `nextn`) head.
struct Summary {
    file_type: Option<(u64, Option<&'static str>)>,
    bits_per_weight: f64,
    /// (type, bytes), most bytes first.
    storage: Vec<(lamina_gguf::GgmlType, u64)>,
    /// The draft head's key and tensors, if any.
    draft: Option<String>,
}

fn summary(model: &Model) -> Summary {
    let (mut bytes, mut weights) = (0u64, 0u64);
    let mut storage: Vec<(lamina_gguf::GgmlType, u64)> = Vec::new();
    let mut nextn_tensors = 0usize;
    for t in model.tensors() {
        bytes = bytes.saturating_add(t.info.n_bytes);
        weights = weights.saturating_add(t.info.n_elements);
        match storage.iter_mut().find(|(ty, _)| *ty == t.info.ty) {
            Some(e) => e.1 = e.1.saturating_add(t.info.n_bytes),
            None => storage.push((t.info.ty, t.info.n_bytes)),
        }
        if t.info.name.contains(".nextn.") || t.info.name.starts_with("nextn.") {
            nextn_tensors += 1;
        }
    }
    storage.sort_by_key(|e| std::cmp::Reverse(e.1));
    let arch = model
        .get("general.architecture")
        .and_then(Value::as_str)
        .unwrap_or("");
    let key = format!("{arch}.nextn_predict_layers");
    let layers = model.get(&key).and_then(Value::as_u64).filter(|&n| n > 0);
    let draft = match (layers, nextn_tensors) {
        (None, 0) => None,
        (Some(n), t) => Some(format!("{key} = {n}, {t} nextn tensors")),
        (None, t) => Some(format!("{t} nextn tensors (no {key} key)")),
    };
    Summary {
        file_type: model
            .get("general.file_type")
            .and_then(Value::as_u64)
            .map(|id| (id, file_type_name(id))),
        bits_per_weight: if weights == 0 {
            0.0
        } else {
            bytes as f64 * 8.0 / weights as f64
        },
        storage,
        draft,
    }
}

pub fn to_json(model: &Model, full: bool) -> Json {
    let s = summary(model);
    let stored: u64 = s.storage.iter().map(|e| e.1).sum();
    let l = model.first().layout();
    let metadata: Map<String, Json> = l
        .metadata
        .iter()
        .map(|e| (e.key.clone(), entry_json(e, full)))
        .collect();
    let tensors: Vec<Json> = model
        .tensors()
        .map(|t| {
            json!({
                "name": t.info.name,
                "shape": t.info.dims,
                "type": t.info.ty.name(),
                "offset": t.info.offset,
                "bytes": t.info.n_bytes,
                "shard": t.shard,
            })
        })
        .collect();
    let (agree, total) = model.shards().iter().fold((0, 0), |(a, t), s| {
        let c = s.layout().size_check;
        (a + c.agree, t + c.total)
    });
    json!({
        "version": l.version,
        "tensor_count": model.tensor_count(),
        "kv_count": l.kv_count,
        "alignment": l.alignment,
        "data_offset": l.data_offset,
        "padding_bytes": l.padding(),
        "file_bytes": l.file_len,
        "shards": model.shards().len(),
        "metadata": metadata,
        "tensors": tensors,
        "size_check": {"agree": agree, "total": total},
        "summary": {
            "file_type": s.file_type.map(|(id, _)| id),
            "file_type_name": s.file_type.and_then(|(_, name)| name),
            "bits_per_weight": s.bits_per_weight,
            "storage": s.storage.iter().map(|(ty, b)| json!({
                "type": ty.name(), "bytes": b,
                "share": *b as f64 / stored.max(1) as f64,
            })).collect::<Vec<_>>(),
            "draft_head": s.draft,
        },
    })
}

/// The layer a tensor belongs to: `blk.N` or its first name segment.
fn group(name: &str) -> String {
    let mut parts = name.split('.');
    match (parts.next(), parts.next()) {
        (Some("blk"), Some(n)) => format!("blk.{n}"),
        (Some(first), _) => first.to_owned(),
        _ => name.to_owned(),
    }
}

pub fn to_text(model: &Model, full: bool) -> String {
    let f = model.first();
    let l = f.layout();
    let mut out = String::new();
    let _ = writeln!(out, "{}", f.path().display());
    let _ = writeln!(
        out,
        "GGUF v{}, {} tensors, {} metadata pairs, {} ({} shard{})\n",
        l.version,
        model.tensor_count(),
        l.kv_count,
        human_size(model.shards().iter().map(|s| s.layout().file_len).sum()),
        model.shards().len(),
        if model.shards().len() == 1 { "" } else { "s" }
    );

    let s = summary(model);
    let total: u64 = s.storage.iter().map(|e| e.1).sum();
    let claimed = match s.file_type {
        Some((id, Some(name))) => format!("{name} ({id})"),
        Some((id, None)) => format!("{id} (a file type llama.cpp does not name)"),
        None => "not given".to_owned(),
    };
    let held: Vec<String> = s
        .storage
        .iter()
        .map(|(ty, b)| {
            format!(
                "{} {:.1}%",
                ty.name(),
                100.0 * *b as f64 / total.max(1) as f64
            )
        })
        .collect();
    let _ = writeln!(out, "File type: {claimed}");
    let _ = writeln!(
        out,
        "Stored as: {} ({:.2} bits per weight over all tensors)",
        held.join(", "),
        s.bits_per_weight
    );
    let _ = writeln!(
        out,
        "Draft head: {}\n",
        s.draft.as_deref().unwrap_or("none")
    );

    let _ = writeln!(out, "Header, read by hand (offset, bytes, field, meaning):");
    header_walk(&mut out, f.bytes(), l);

    let meta_bytes: u64 = l.metadata.iter().map(|e| e.span.end - e.span.start).sum();
    let _ = writeln!(
        out,
        "\nMetadata: {} pairs, {}",
        l.metadata.len(),
        human_size(meta_bytes)
    );
    for e in &l.metadata {
        let bytes = e.span.end - e.span.start;
        let share = 100.0 * bytes as f64 / meta_bytes.max(1) as f64;
        let shown = match (&e.value, full) {
            (Value::Array(a), true) => array_json(a).to_string(),
            (Value::Array(a), false) => format!("[{}; {}]", a.element_type(), a.len()),
            (v, _) => short(v),
        };
        let _ = writeln!(
            out,
            "  {:<44} {:<8} {shown}  ({}, {share:.1}%)",
            e.key,
            e.value.value_type().name(),
            human_size(bytes)
        );
    }

    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let mut by_group: Vec<(String, u64)> = Vec::new();
    for t in model.tensors() {
        let e = by_type.entry(t.info.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.info.n_bytes;
        let g = group(&t.info.name);
        match by_group.iter_mut().find(|(n, _)| *n == g) {
            Some(x) => x.1 += t.info.n_bytes,
            None => by_group.push((g, t.info.n_bytes)),
        }
    }
    let total: u64 = model.tensors().map(|t| t.info.n_bytes).sum();
    let _ = writeln!(
        out,
        "\nTensors: {} in {}",
        model.tensor_count(),
        human_size(total)
    );
    let _ = writeln!(out, "  by type:");
    for (ty, (n, b)) in &by_type {
        let _ = writeln!(out, "    {ty:<8} {n:>5} tensors  {:>12}", human_size(*b));
    }
    let _ = writeln!(out, "  by layer:");
    for (g, b) in &by_group {
        let _ = writeln!(out, "    {g:<20} {:>12}", human_size(*b));
    }
    let mut largest: Vec<_> = model.tensors().collect();
    largest.sort_by_key(|t| std::cmp::Reverse(t.info.n_bytes));
    let _ = writeln!(out, "  largest:");
    for t in largest.iter().take(5) {
        let _ = writeln!(
            out,
            "    {:<32} {:<8} {:<20} {:>12}",
            t.info.name,
            t.info.ty.name(),
            format!("{:?}", t.info.dims),
            human_size(t.info.n_bytes)
        );
    }

    let _ = writeln!(out, "\nVerdict:");
    for s in model.shards() {
        let sl = s.layout();
        let aligned = s.tensors().iter().all(|t| t.offset % sl.alignment == 0);
        if model.shards().len() > 1 {
            let _ = writeln!(out, "  {}", s.path().display());
        }
        let _ = writeln!(
            out,
            "  {}/{} tensor sizes agree with their offsets",
            sl.size_check.agree, sl.size_check.total
        );
        let _ = writeln!(
            out,
            "  tensor table ends at byte {}, {} bytes of padding, data section at byte {} (alignment {})",
            sl.table_end,
            sl.padding(),
            sl.data_offset,
            sl.alignment
        );
        let _ = writeln!(
            out,
            "  every tensor aligned to {}: {}",
            sl.alignment,
            if aligned { "yes" } else { "no" }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_gguf::{File, GgmlType, Writer};

    fn model(w: Writer) -> Model {
        Model::from_shards(vec![File::from_bytes(w.to_bytes()).unwrap()]).unwrap()
    }

    #[test]
    fn a_draft_head_is_named_by_its_key_and_tensors() {
        let f32s = |n: usize| vec![0u8; 4 * n];
        let base = Writer::new()
            .kv("general.architecture", Value::String("glm4moe".into()))
            .kv("general.file_type", Value::U32(99))
            .tensor("blk.0.attn_norm.weight", &[4], GgmlType::F32, f32s(4));
        let plain = summary(&model(base.clone()));
        assert!(plain.draft.is_none());
        assert_eq!(plain.file_type, Some((99, None)));
        assert!((plain.bits_per_weight - 32.0).abs() < 1e-12);
        let with = base
            .kv("glm4moe.nextn_predict_layers", Value::U32(1))
            .tensor("blk.1.nextn.eh_proj", &[4, 2], GgmlType::F32, f32s(8));
        let draft = summary(&model(with)).draft.unwrap();
        assert!(draft.contains("nextn_predict_layers = 1"), "{draft}");
        assert!(draft.contains("1 nextn tensors"), "{draft}");
    }
}
