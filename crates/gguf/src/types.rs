//! The ggml tensor type table: every type id ggml defines, its name, weights
//! per block and bytes per block (ggml `include/ggml.h`, `src/ggml.c`
//! `type_traits`). Ids that ggml removed stay in the table by name so that a
//! file using one gets "removed type Q4_2", not "unknown type 4".

use std::fmt;

/// A storage type of tensor data. The discriminant is the on-disk id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    IQ2XXS = 16,
    IQ2XS = 17,
    IQ3XXS = 18,
    IQ1S = 19,
    IQ4NL = 20,
    IQ3S = 21,
    IQ2S = 22,
    IQ4XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// What the table says about an id that is not a live type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeIdError {
    /// ggml once defined this id and removed it; files using it cannot be read.
    Removed { id: u32, name: &'static str },
    /// No ggml version defines this id.
    Unknown { id: u32 },
}

impl std::error::Error for TypeIdError {}

impl fmt::Display for TypeIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Removed { id, name } => write!(f, "removed ggml type {name} (id {id})"),
            Self::Unknown { id } => write!(f, "unknown ggml type id {id}"),
        }
    }
}

/// Names of the ids ggml removed: 4–5 (the old Q4_2/Q4_3), 31–33 and 36–38 (the
/// interleaved layouts that are now repacked at load time instead of stored).
const REMOVED: [(u32, &str); 8] = [
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

impl GgmlType {
    /// Every live type, in id order.
    pub const ALL: [GgmlType; 35] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Q8K,
        Self::IQ2XXS,
        Self::IQ2XS,
        Self::IQ3XXS,
        Self::IQ1S,
        Self::IQ4NL,
        Self::IQ3S,
        Self::IQ2S,
        Self::IQ4XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
        Self::NVFP4,
        Self::Q1_0,
        Self::Q2_0,
    ];

    /// Looks up an on-disk id.
    pub fn from_id(id: u32) -> Result<Self, TypeIdError> {
        if let Some(t) = Self::ALL.iter().find(|t| **t as u32 == id) {
            return Ok(*t);
        }
        match REMOVED.iter().find(|(r, _)| *r == id) {
            Some((_, name)) => Err(TypeIdError::Removed { id, name }),
            None => Err(TypeIdError::Unknown { id }),
        }
    }

    /// Looks up a type by its ggml name (`"Q4_K"`, `"IQ4_XS"`, `"F32"` …).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.name() == name)
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// `(name, weights per block, bytes per block)` as ggml's `type_traits` has them.
    const fn traits(self) -> (&'static str, u64, u64) {
        use GgmlType::*;
        match self {
            F32 => ("F32", 1, 4),
            F16 => ("F16", 1, 2),
            Q4_0 => ("Q4_0", 32, 18),
            Q4_1 => ("Q4_1", 32, 20),
            Q5_0 => ("Q5_0", 32, 22),
            Q5_1 => ("Q5_1", 32, 24),
            Q8_0 => ("Q8_0", 32, 34),
            Q8_1 => ("Q8_1", 32, 36),
            Q2K => ("Q2_K", 256, 84),
            Q3K => ("Q3_K", 256, 110),
            Q4K => ("Q4_K", 256, 144),
            Q5K => ("Q5_K", 256, 176),
            Q6K => ("Q6_K", 256, 210),
            Q8K => ("Q8_K", 256, 292),
            IQ2XXS => ("IQ2_XXS", 256, 66),
            IQ2XS => ("IQ2_XS", 256, 74),
            IQ3XXS => ("IQ3_XXS", 256, 98),
            IQ1S => ("IQ1_S", 256, 50),
            IQ4NL => ("IQ4_NL", 32, 18),
            IQ3S => ("IQ3_S", 256, 110),
            IQ2S => ("IQ2_S", 256, 82),
            IQ4XS => ("IQ4_XS", 256, 136),
            I8 => ("I8", 1, 1),
            I16 => ("I16", 1, 2),
            I32 => ("I32", 1, 4),
            I64 => ("I64", 1, 8),
            F64 => ("F64", 1, 8),
            IQ1M => ("IQ1_M", 256, 56),
            BF16 => ("BF16", 1, 2),
            TQ1_0 => ("TQ1_0", 256, 54),
            TQ2_0 => ("TQ2_0", 256, 66),
            MXFP4 => ("MXFP4", 32, 17),
            NVFP4 => ("NVFP4", 64, 36),
            Q1_0 => ("Q1_0", 128, 18),
            Q2_0 => ("Q2_0", 64, 18),
        }
    }

    /// ggml's name for the type, as `gguf-py` prints it.
    pub const fn name(self) -> &'static str {
        self.traits().0
    }

    /// Weights per block (1 for plain element types).
    pub const fn block_size(self) -> u64 {
        self.traits().1
    }

    /// Bytes per block.
    pub const fn type_size(self) -> u64 {
        self.traits().2
    }

    /// True for the quantized block types (everything with blocks of more than one weight).
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Byte offsets of the f16 scale fields (d, and m or dmin where the block
    /// has one) in one block of a type that has them: what a generator of
    /// random valid blocks must keep finite (synthetic models, kernel tests).
    /// Empty for float types and for types whose scales are not f16 fields
    /// this table knows (IQ1_M, MXFP4).
    pub fn f16_scale_offsets(self) -> &'static [usize] {
        use GgmlType::*;
        match self {
            Q4_0 | Q5_0 | Q8_0 | IQ4NL | IQ4XS => &[0],
            // The IQ1–IQ3 grids (but IQ1_M, whose scale is spread over its
            // sub-block scales) start with their f16 d.
            IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S => &[0],
            // Q8_1: d, then s (d times the sum of the quants).
            Q4_1 | Q5_1 | Q4K | Q5K | Q8_1 => &[0, 2],
            Q2K => &[80, 82],
            Q3K => &[108],
            Q6K => &[208],
            TQ1_0 => &[52],
            TQ2_0 => &[64],
            _ => &[],
        }
    }

    /// Bytes of `n` weights, or `None` if `n` is not a whole number of blocks or
    /// the byte count overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        if n % self.block_size() != 0 {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Ok(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        let mut ids: Vec<u32> = GgmlType::ALL.iter().map(|t| t.id()).collect();
        ids.extend(REMOVED.iter().map(|r| r.0));
        ids.sort_unstable();
        // Ids 0..=42 are all accounted for, live or removed.
        assert_eq!(ids, (0..=42).collect::<Vec<_>>());
    }

    #[test]
    fn removed_and_unknown_ids_are_named() {
        assert_eq!(
            GgmlType::from_id(4),
            Err(TypeIdError::Removed {
                id: 4,
                name: "Q4_2"
            })
        );
        assert_eq!(GgmlType::from_id(43), Err(TypeIdError::Unknown { id: 43 }));
        assert_eq!(
            GgmlType::from_id(u32::MAX).unwrap_err().to_string(),
            "unknown ggml type id 4294967295"
        );
    }

    #[test]
    fn bits_per_weight_match_ggml() {
        // A few well-known figures: Q4_0 4.5 bpw, Q4_K 4.5, Q6_K 6.5625, IQ2_XXS 2.0625.
        let bpw = |t: GgmlType| 8.0 * t.type_size() as f64 / t.block_size() as f64;
        assert_eq!(bpw(GgmlType::Q4_0), 4.5);
        assert_eq!(bpw(GgmlType::Q4K), 4.5);
        assert_eq!(bpw(GgmlType::Q6K), 6.5625);
        assert_eq!(bpw(GgmlType::IQ2XXS), 2.0625);
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q8_0.bytes_for(u64::MAX - 31), None);
    }
}
