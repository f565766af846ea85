//! The lattice tables of the IQ1–IQ3 types (ggml's `iq2xxs_grid` …
//! `iq1s_grid`) as WGSL source: each is a shader file `gen/<table>.wgsl`
//! holding one array, which a decoder under `shaders/quant/` pulls in with
//! `#include` like any other piece. The text is generated from
//! [`lamina_quant::iq_tables`], the tables the CPU decodes with, so the two
//! sides cannot drift apart.
//!
//! Why arrays in the shader rather than a storage buffer uploaded once per
//! device: a table binding would add a binding to every weight kernel of
//! these types (mat-vec, small-N, tiled, row lookup, each split variant) and
//! a per-device upload, while an array in the source leaves the kernels'
//! bind group layouts and dispatch code the same for every type. The arrays
//! are `var<private>` with a constant initializer, never written: naga
//! indexes those through a pointer, while a run-time index into a WGSL
//! `const` array makes it copy the whole array into a local variable at
//! every access (on lavapipe an IQ1_S mat-vec then took minutes to compile
//! and ran far slower: docs/perf/kernels.md, 2026-12-05). Mesa then turns
//! the unwritten array into constant data (`nir_opt_large_constants`).
//!
//! The 8-weight grids take only three values, so they are packed to two
//! bits per weight (the value's position in [`IQ2_LEVELS`] or
//! [`IQ1_LEVELS`]), 16 bits per entry, entry `2i` in the low half of word
//! `i` and `2i + 1` in the high half; the decoders map a code back to its
//! value with exact arithmetic. Packed, IQ1_S's grid is 1024 words instead
//! of 4096, and lavapipe's compile time grows with the array (same entry).
//! The 4-weight IQ3 grids keep one byte per weight (512 words at most).
//! `grids_round_trip` checks every packed entry against its table.
//!
//! ggml's `ksigns_iq2xs` needs no table: entry `s` is `s` with bit 7 set
//! where that makes the number of set bits even, which the decoders compute
//! (`shaders/quant/iq_signs.wgsl`; checked against the table below).

use std::fmt::Write;
use std::sync::LazyLock;

use lamina_quant::iq_tables as t;

/// `var<private> NAME: array<u32, N> = array<u32, N>(...)`, entries in hex.
fn wgsl_u32(name: &str, what: &str, words: &[u32]) -> String {
    let mut s = format!(
        "// {what}: generated from lamina_quant::iq_tables.\nvar<private> {name}: array<u32, {n}> = array<u32, {n}>(",
        n = words.len()
    );
    for (i, w) in words.iter().enumerate() {
        if i % 8 == 0 {
            s.push_str("\n    ");
        }
        // Writing to a String cannot fail.
        let _ = write!(s, "0x{w:08x}u,");
    }
    s.push_str("\n);\n");
    s
}

/// The three magnitudes of the IQ2 grids, in code order
/// (`shaders/quant/iq_signs.wgsl`, `iq2_mags`).
pub(crate) const IQ2_LEVELS: [u8; 3] = [8, 25, 43];

/// The three int8 weights of the IQ1 grid (-1, 0, 1), in code order
/// (`shaders/quant/iq1_grid.wgsl`).
pub(crate) const IQ1_LEVELS: [u8; 3] = [0xff, 0, 1];

/// 8-weight entries packed two bits per weight, two entries per word. A byte
/// outside `levels` would become code 3, which `grids_round_trip` catches.
fn pack2(entries: &[u64], levels: &[u8; 3]) -> Vec<u32> {
    let code = |e: u64| -> u32 {
        e.to_le_bytes().iter().enumerate().fold(0, |acc, (j, b)| {
            let c = levels.iter().position(|l| l == b).unwrap_or(3) as u32;
            acc | (c << (2 * j))
        })
    };
    entries
        .chunks(2)
        .map(|p| code(p[0]) | p.get(1).map_or(0, |&e| code(e) << 16))
        .collect()
}

static GRIDS: LazyLock<Vec<(&'static str, String)>> = LazyLock::new(|| {
    let iq2 = |name: &str, what: &str, e: &[u64]| wgsl_u32(name, what, &pack2(e, &IQ2_LEVELS));
    vec![
        (
            "gen/iq2xxs_grid.wgsl",
            iq2("IQ2XXS_GRID", "IQ2_XXS grid, 2-bit codes", &t::IQ2XXS_GRID),
        ),
        (
            "gen/iq2xs_grid.wgsl",
            iq2("IQ2XS_GRID", "IQ2_XS grid, 2-bit codes", &t::IQ2XS_GRID),
        ),
        (
            "gen/iq2s_grid.wgsl",
            iq2("IQ2S_GRID", "IQ2_S grid, 2-bit codes", &t::IQ2S_GRID),
        ),
        (
            "gen/iq3xxs_grid.wgsl",
            wgsl_u32("IQ3XXS_GRID", "IQ3_XXS grid", &t::IQ3XXS_GRID),
        ),
        (
            "gen/iq3s_grid.wgsl",
            wgsl_u32("IQ3S_GRID", "IQ3_S grid", &t::IQ3S_GRID),
        ),
        (
            "gen/iq1s_grid.wgsl",
            wgsl_u32(
                "IQ1S_GRID",
                "IQ1_S / IQ1_M grid, 2-bit codes",
                &pack2(&t::IQ1S_GRID, &IQ1_LEVELS),
            ),
        ),
    ]
});

/// The generated shader file at `path` (relative to `shaders/`), if any.
pub(crate) fn source(path: &str) -> Option<&'static str> {
    GRIDS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, s)| s.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksigns_is_the_even_parity_rule() {
        for (s, &k) in t::KSIGNS_IQ2XS.iter().enumerate() {
            let s = s as u32;
            assert_eq!(u32::from(k), s | ((s.count_ones() & 1) << 7), "{s}");
        }
    }

    #[test]
    fn grids_round_trip() {
        let unpack = |words: &[u32], i: usize, levels: &[u8; 3]| -> u64 {
            let c = (words[i / 2] >> (16 * (i % 2))) & 0xffff;
            (0..8).fold(0, |acc, j| {
                let l = levels[((c >> (2 * j)) & 3).min(2) as usize];
                acc | (u64::from(l) << (8 * j))
            })
        };
        for (grid, levels) in [
            (&t::IQ2XXS_GRID[..], &IQ2_LEVELS),
            (&t::IQ2XS_GRID[..], &IQ2_LEVELS),
            (&t::IQ2S_GRID[..], &IQ2_LEVELS),
            (&t::IQ1S_GRID[..], &IQ1_LEVELS),
        ] {
            let words = pack2(grid, levels);
            assert_eq!(words.len(), grid.len() / 2);
            for (i, &e) in grid.iter().enumerate() {
                // No code 3: every byte was one of the levels.
                let c = (words[i / 2] >> (16 * (i % 2))) & 0xffff;
                assert_eq!(c & (c >> 1) & 0x5555, 0, "entry {i}");
                assert_eq!(unpack(&words, i, levels), e, "entry {i}");
            }
        }
    }

    #[test]
    fn generated_files_hold_the_packed_words() {
        let text = source("gen/iq1s_grid.wgsl").unwrap_or_default();
        assert!(text.contains("var<private> IQ1S_GRID: array<u32, 1024> ="));
        let words = pack2(&t::IQ1S_GRID, &IQ1_LEVELS);
        assert!(text.contains(&format!("0x{:08x}u,0x{:08x}u,", words[0], words[1])));
        assert_eq!(text.matches("u,").count(), 1024);
        let text = source("gen/iq3s_grid.wgsl").unwrap_or_default();
        assert!(text.contains(&format!("0x{:08x}u,", t::IQ3S_GRID[511])));
        assert!(source("gen/none.wgsl").is_none());
    }
}
