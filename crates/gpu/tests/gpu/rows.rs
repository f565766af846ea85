//! Row lookup (token embedding) for every supported type.

use super::common;

use common::Rng;
use lamina_gpu::SUPPORTED;

/// Bound on ‖gpu − ref‖ / ‖ref‖ for row lookup. Dequantization is exact
/// except that the GPU fuses `q·d − m` into one fma (Q4_1, Q5_1, Q2_K, Q4_K,
/// Q5_K) where the reference rounds twice: at most one f32 rounding
/// (6e-8 relative) per weight.
const ROWS_REL_TOL: f64 = 1e-6;

#[test]
fn rows_match_reference_for_every_type() {
    let (_turn, gpu) = common::gpu();
    let (rows, ids) = (37usize, [5u32, 0, 36, 5, 17]);
    let mut failures = Vec::new();
    for ty in SUPPORTED {
        let cols = match ty.block_size() {
            1 => 1101,
            32 => 32 * 7,
            _ => 256 * 3,
        };
        let mut rng = Rng::new(0xe3b ^ ty.id() as u64);
        let data = common::random_weight(&mut rng, ty, rows, cols);
        let deq = common::dequantize(ty, &data, rows, cols);
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| {
                deq[i as usize * cols..(i as usize + 1) * cols]
                    .iter()
                    .map(|&v| v as f64)
            })
            .collect();
        let w = gpu.upload_weight(ty, rows, cols, &data).unwrap();
        let idt = gpu.upload_u32(&ids).unwrap();
        let y = common::poisoned(gpu, ids.len() * cols);
        let mut b = gpu.batch();
        b.get_rows(&w, &idt, &y).unwrap();
        b.submit().unwrap();
        let err = common::rel_err(&gpu.read_f32(&y).unwrap(), &want);
        if !common::within(err, ROWS_REL_TOL) {
            failures.push(format!("{ty}: relative error {err:e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
