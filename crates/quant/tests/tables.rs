//! Properties of the generated IQ lookup tables that ggml's definitions imply; a
//! mistake in `scripts/gen-iq-tables.py` (wrong unpacking order or width) breaks them.

use lamina_quant::iq_tables::*;

fn bytes_u64(grid: &[u64]) -> impl Iterator<Item = u8> + '_ {
    grid.iter().flat_map(|e| e.to_le_bytes())
}

fn bytes_u32(grid: &[u32]) -> impl Iterator<Item = u8> + '_ {
    grid.iter().flat_map(|e| e.to_le_bytes())
}

#[test]
fn sizes_match_ggml() {
    assert_eq!(IQ2XXS_GRID.len(), 256);
    assert_eq!(IQ2XS_GRID.len(), 512);
    assert_eq!(IQ2S_GRID.len(), 1024);
    assert_eq!(IQ3XXS_GRID.len(), 256);
    assert_eq!(IQ3S_GRID.len(), 512);
    assert_eq!(IQ1S_GRID.len(), 2048);
    assert_eq!(KSIGNS_IQ2XS.len(), 128);
    assert_eq!(KMASK_IQ2XS, [1, 2, 4, 8, 16, 32, 64, 128]);
}

#[test]
fn grid_entries_come_from_their_level_sets() {
    assert!(bytes_u64(&IQ2XXS_GRID).all(|b| [0x08, 0x19, 0x2b].contains(&b)));
    assert!(bytes_u64(&IQ2XS_GRID).all(|b| [0x08, 0x19, 0x2b].contains(&b)));
    assert!(bytes_u64(&IQ2S_GRID).all(|b| [0x08, 0x19, 0x2b].contains(&b)));
    let iq3xxs = [0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e];
    assert!(bytes_u32(&IQ3XXS_GRID).all(|b| iq3xxs.contains(&b)));
    assert!(bytes_u32(&IQ3S_GRID).all(|b| b % 2 == 1 && b <= 15));
    assert!(bytes_u64(&IQ1S_GRID).all(|b| [-1, 0, 1].contains(&(b as i8))));
}

#[test]
fn grids_are_sorted_and_distinct() {
    // ggml lists the magnitude grids in increasing order of the packed value; no entry repeats.
    assert!(IQ2XXS_GRID.windows(2).all(|w| w[0] < w[1]));
    assert!(IQ2XS_GRID.windows(2).all(|w| w[0] < w[1]));
    assert!(IQ2S_GRID.windows(2).all(|w| w[0] < w[1]));
    assert!(IQ3XXS_GRID.windows(2).all(|w| w[0] < w[1]));
    assert!(IQ3S_GRID.windows(2).all(|w| w[0] < w[1]));
    let mut seen = std::collections::HashSet::new();
    assert!(IQ1S_GRID.iter().all(|e| seen.insert(*e)));
}

#[test]
fn first_entries_match_ggml_common_h() {
    assert_eq!(IQ2XXS_GRID[0], 0x0808080808080808);
    assert_eq!(IQ2XXS_GRID[255], 0x2b2b2b1908081908);
    assert_eq!(IQ3XXS_GRID[0], 0x04040404);
    assert_eq!(IQ1S_GRID[0], 0xffffffffffffffff);
    assert_eq!(IQ1S_GRID[1], 0xffffffffffffff01);
}

#[test]
fn sign_table_completes_even_parity() {
    for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
        assert_eq!(usize::from(s & 0x7F), i);
        assert_eq!(s.count_ones() % 2, 0, "entry {i}");
    }
}

#[test]
fn value_tables() {
    assert_eq!(
        KVALUES_IQ4NL,
        [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
    );
    assert_eq!(
        KVALUES_MXFP4,
        [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    );
}
