//! The lattice tables of the IQ1–IQ3 types (ggml's `iq2xxs_grid` …
//! `iq1s_grid`) as WGSL source: each is a shader file `gen/<table>.wgsl`
//! holding one `const` array, which a decoder under `shaders/quant/` pulls in
//! with `#include` like any other piece. The text is generated from
//! [`lamina_quant::iq_tables`], the tables the CPU decodes with, so the two
//! sides cannot drift apart.
//!
//! Why `const` arrays rather than a storage buffer uploaded once per device:
//! a table binding would add a binding to every weight kernel of these types
//! (mat-vec, small-N, tiled, row lookup, each split variant) and a per-device
//! upload, while a `const` array leaves the kernels' bind group layouts and
//! dispatch code as they are for every type. Drivers place such an array,
//! read at run-time indices, in constant memory (Mesa's
//! `nir_opt_large_constants`), so it costs a table lookup, as a bound buffer
//! would. The price is shader text (up to ~40 KB for IQ1_S) and compile time
//! for the variants of these types only.
//!
//! A 64-bit entry (eight weights, one per byte) becomes two `u32` words, low
//! word first: entry `i` is words `2i` (weights 0..3) and `2i + 1` (4..7).
//! ggml's `ksigns_iq2xs` needs no table: entry `s` is `s` with bit 7 set
//! where that makes the number of set bits even, which the decoders compute
//! (`shaders/quant/iq_signs.wgsl`; checked against the table below).

use std::fmt::Write;
use std::sync::LazyLock;

use lamina_quant::iq_tables as t;

/// `const NAME = array<u32, N>(...)` with every entry in hex.
fn wgsl_u32(name: &str, what: &str, words: &[u32]) -> String {
    let mut s = format!(
        "// {what}: generated from lamina_quant::iq_tables.\nconst {name} = array<u32, {}>(",
        words.len()
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

fn split_u64(entries: &[u64]) -> Vec<u32> {
    entries
        .iter()
        .flat_map(|&e| [e as u32, (e >> 32) as u32])
        .collect()
}

static GRIDS: LazyLock<Vec<(&'static str, String)>> = LazyLock::new(|| {
    let u64s = |name: &str, what: &str, e: &[u64]| wgsl_u32(name, what, &split_u64(e));
    vec![
        (
            "gen/iq2xxs_grid.wgsl",
            u64s("IQ2XXS_GRID", "IQ2_XXS grid, two words per entry", &t::IQ2XXS_GRID),
        ),
        (
            "gen/iq2xs_grid.wgsl",
            u64s("IQ2XS_GRID", "IQ2_XS grid, two words per entry", &t::IQ2XS_GRID),
        ),
        (
            "gen/iq2s_grid.wgsl",
            u64s("IQ2S_GRID", "IQ2_S grid, two words per entry", &t::IQ2S_GRID),
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
            u64s(
                "IQ1S_GRID",
                "IQ1_S / IQ1_M grid (int8 weights), two words per entry",
                &t::IQ1S_GRID,
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
    fn tables_keep_every_entry_in_order() {
        let text = source("gen/iq2xxs_grid.wgsl").unwrap_or_default();
        assert!(text.contains("const IQ2XXS_GRID = array<u32, 512>("));
        let e = t::IQ2XXS_GRID[1];
        let words = format!("0x{:08x}u,0x{:08x}u,", e as u32, (e >> 32) as u32);
        assert!(text.contains(&words), "{words}");
        let text = source("gen/iq1s_grid.wgsl").unwrap_or_default();
        assert_eq!(text.matches("u,").count(), 2 * t::IQ1S_GRID.len());
        assert!(source("gen/none.wgsl").is_none());
    }
}
