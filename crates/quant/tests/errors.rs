//! Malformed inputs are reported as structured errors, never panics.

#![allow(clippy::unwrap_used)]

use lamina_quant::{dequantize, supports, GgmlType, QuantError};

#[test]
fn unsupported_types_are_errors() {
    for ty in [GgmlType::I8, GgmlType::I32, GgmlType::F64] {
        assert!(!supports(ty));
        assert_eq!(
            dequantize(ty, &[0; 8], &mut [0.0; 8]),
            Err(QuantError::Unsupported { ty })
        );
    }
}

#[test]
fn partial_blocks_and_wrong_lengths_are_errors() {
    let ty = GgmlType::Q4_0;
    assert_eq!(
        dequantize(ty, &[0; 19], &mut [0.0; 32]),
        Err(QuantError::PartialBlock {
            ty,
            bytes: 19,
            type_size: 18
        })
    );
    assert_eq!(
        dequantize(ty, &[0; 36], &mut [0.0; 32]),
        Err(QuantError::LengthMismatch {
            ty,
            what: "dst",
            expected: 64,
            actual: 32
        })
    );
    let err = dequantize(ty, &[0; 17], &mut []).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Q4_0: 17 bytes is not a whole number of 18-byte blocks"
    );
    // Empty input is zero blocks, not an error.
    assert_eq!(dequantize(ty, &[], &mut []), Ok(()));
}
