//! Property tests: whatever the writer writes, the reader reads back identical.
#![allow(clippy::unwrap_used)]

use lamina_gguf::{Array, File, GgmlType, Value, Writer};
use proptest::prelude::*;

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        // NaN != NaN would fail the comparison without saying anything useful.
        (-1e30f32..1e30).prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::String),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        (-1e300f64..1e300).prop_map(Value::F64),
    ]
}

fn array() -> impl Strategy<Value = Array> {
    let leaf = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Array::U8),
        prop::collection::vec(any::<i32>(), 0..8).prop_map(Array::I32),
        prop::collection::vec(-1e6f32..1e6, 0..8).prop_map(Array::F32),
        prop::collection::vec(".{0,6}", 0..8).prop_map(Array::String),
        prop::collection::vec(any::<u64>(), 0..8).prop_map(Array::U64),
        prop::collection::vec(any::<bool>(), 0..8).prop_map(Array::Bool),
    ];
    // Nesting up to the reader's limit of 4 levels.
    leaf.prop_recursive(3, 16, 3, |inner| {
        prop::collection::vec(inner, 0..3).prop_map(Array::Array)
    })
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![scalar(), array().prop_map(Value::Array)]
}

const TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::MXFP4,
];

fn tensor() -> impl Strategy<Value = (Vec<u64>, GgmlType, u8)> {
    (
        0..TYPES.len(),
        1u64..4,
        prop::collection::vec(1u64..4, 0..3),
        any::<u8>(),
    )
        .prop_map(|(t, blocks, rest, fill)| {
            let ty = TYPES[t];
            let mut dims = vec![blocks * ty.block_size()];
            dims.extend(rest);
            (dims, ty, fill)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn write_then_read_is_identity(
        version in 1u32..=3,
        align_pow in 0u32..8,
        kvs in prop::collection::btree_map("[a-z]{1,8}(\\.[a-z_]{1,8}){0,2}", value(), 0..8),
        tensors in prop::collection::vec(tensor(), 0..5),
    ) {
        let alignment = 1u32 << align_pow;
        let mut w = Writer::new().version(version).alignment(alignment);
        let kvs: Vec<(String, Value)> =
            kvs.into_iter().filter(|(k, _)| k != "general.alignment").collect();
        for (k, v) in &kvs {
            w = w.kv(k.clone(), v.clone());
        }
        let mut expect = Vec::new();
        for (i, (dims, ty, fill)) in tensors.iter().enumerate() {
            let n: u64 = dims.iter().product();
            let data: Vec<u8> = (0..ty.bytes_for(n).unwrap())
                .map(|j| fill.wrapping_add(j as u8))
                .collect();
            let name = format!("blk.{i}.weight");
            w = w.tensor(name.clone(), dims, *ty, data.clone());
            expect.push((name, dims.clone(), *ty, data));
        }
        let file = File::from_bytes(w.to_bytes()).unwrap();
        let layout = file.layout();
        prop_assert_eq!(layout.version, version);
        prop_assert_eq!(layout.alignment, u64::from(alignment));
        prop_assert_eq!(layout.data_offset % u64::from(alignment), 0);
        // general.alignment first, then the keys in order.
        prop_assert_eq!(layout.metadata.len(), kvs.len() + 1);
        for ((k, v), e) in kvs.iter().zip(&layout.metadata[1..]) {
            prop_assert_eq!(k, &e.key);
            prop_assert_eq!(v, &e.value);
        }
        prop_assert_eq!(file.tensors().len(), expect.len());
        for (t, (name, dims, ty, data)) in file.tensors().iter().zip(&expect) {
            prop_assert_eq!(&t.name, name);
            prop_assert_eq!(&t.dims, dims);
            prop_assert_eq!(t.ty, *ty);
            prop_assert_eq!(file.tensor_data(t), &data[..]);
        }
        prop_assert_eq!(layout.size_check.agree, expect.len());
    }
}

/// A file written with deferred tensors (bytes produced while writing) is
/// the file written with the same bytes up front.
#[test]
fn deferred_tensors_write_the_same_file() {
    let data: Vec<Vec<u8>> = vec![(0..18u8).collect(), (0..68u8).rev().collect()];
    let up_front = Writer::new()
        .kv("general.architecture", Value::String("llama".into()))
        .tensor("a", &[32], GgmlType::Q4_0, data[0].clone())
        .tensor("b", &[2, 32], GgmlType::Q8_0, data[1].clone())
        .to_bytes();
    let deferred = Writer::new()
        .kv("general.architecture", Value::String("llama".into()))
        .tensor_deferred("a", &[32], GgmlType::Q4_0, 18)
        .tensor("b", &[2, 32], GgmlType::Q8_0, data[1].clone());
    let mut out = Vec::new();
    deferred
        .write_with(&mut out, |i, _, buf| buf.extend_from_slice(&data[i]))
        .unwrap();
    assert_eq!(out, up_front);
    // A fill of the wrong length is an error, not a corrupt file.
    let err = deferred
        .write_with(&mut Vec::new(), |_, _, buf| buf.push(0))
        .unwrap_err();
    assert!(err.to_string().contains("declared 18"), "{err}");
}
