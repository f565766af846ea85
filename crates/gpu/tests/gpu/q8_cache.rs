//! q8_0 caches on the GPU (llama.cpp's `-ctk q8_0 -ctv q8_0`): the cache
//! writer stores the blocks the CPU's cache stores (`lamina_quant`'s
//! `q8_0_row`, ggml's rounding), in the GPU's 9-word block, and attention
//! over them gives the bits it gives over f32 caches holding the widened
//! values, in both attention kernels.

use super::common;

use common::Rng;
use lamina_gpu::{
    attention_scratch_len, Attention, Gpu, KvElem, QkvLayout, Tensor, TokenRow, TokenTable,
    KV_Q8_BLOCK, KV_Q8_WORDS,
};
use lamina_quant::kv::{q8_0_row, Q8_0_BYTES};

/// The CPU cache's q8_0 bytes of `x`, and the values it widens them to.
fn cpu_q8(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; x.len() / KV_Q8_BLOCK * Q8_0_BYTES];
    q8_0_row(x, &mut q);
    // The widening the CPU cache's rows go through (KvRows over q8_0).
    let mut wide = vec![0f32; x.len()];
    lamina_quant::dequantize(lamina_gguf::GgmlType::Q8_0, &q, &mut wide).unwrap();
    (q, wide)
}

/// 34-byte host blocks (f16 scale, 32 quants) as the GPU's 9-word blocks
/// (8 words of quants, then the scale in the low half of word 8).
fn gpu_words(blocks: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(blocks.len() / Q8_0_BYTES * KV_Q8_WORDS);
    for b in blocks.chunks_exact(Q8_0_BYTES) {
        out.extend(
            b[2..]
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
        );
        out.push(u16::from_le_bytes([b[0], b[1]]) as u32);
    }
    out
}

fn run(gpu: &Gpu, n: usize, record: impl FnOnce(&mut lamina_gpu::Batch, &Tensor)) -> Vec<f32> {
    let y = common::poisoned(gpu, n);
    let mut b = gpu.batch();
    record(&mut b, &y);
    b.submit().unwrap();
    gpu.read_f32(&y).unwrap()
}

/// RoPE and the cache writes into q8_0 caches store the blocks the CPU
/// would store for the values rope_kv writes into f32 caches, and the
/// same rotated queries: plain and NeoX pairs, a partial rotation, blocks
/// whose pairs reach into another block, values outside the rotation, and
/// an all-zero block (scale 0, no NaN).
#[test]
fn rope_kv_stores_the_cpus_q8_0_blocks() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(41);
    let (n_head, n_kv_head, hd) = (4, 2, 64);
    let layout = |kv| QkvLayout {
        n_head,
        n_kv_head,
        head_dim: hd,
        kv,
    };
    let l32 = layout(KvElem::F32);
    let (stride, kvd, qd) = (l32.stride(), n_kv_head * hd, n_head * hd);
    let (tokens, first, n, pos0, rows) = (6, 1, 4, 37, 48);
    let mut qkv: Vec<f32> = rng.vec(tokens * stride).iter().map(|v| v * 3.0).collect();
    // Token `first`'s second value head is all zeros.
    let z = first * stride + qd + kvd + hd;
    qkv[z..z + hd].fill(0.0);
    // One value far larger than its block's others: most quants round to
    // small integers, where ties and the rounding direction show.
    qkv[first * stride + qd + 5] = 40.0;
    // Ties: a value block whose scale is exactly 1, holding halves, which
    // ggml rounds away from zero (WGSL's round() would go to even).
    let t = (first + 1) * stride + qd + kvd;
    qkv[t..t + 8].copy_from_slice(&[127.0, 2.5, -0.5, 3.5, -6.5, 0.5, -1.5, 126.5]);
    let qkvt = gpu.upload_f32(&qkv).unwrap();
    for (neox, n_rot) in [(false, 64), (true, 64), (true, 32), (false, 16)] {
        let rope = common::rope(hd, n_rot, n_head, pos0, neox);
        let (q32, q8) = (
            common::poisoned(gpu, tokens * qd),
            common::poisoned(gpu, tokens * qd),
        );
        let (k32, v32) = (
            gpu.tensor(rows * kvd).unwrap(),
            gpu.tensor(rows * kvd).unwrap(),
        );
        let words = KvElem::Q8_0.words(rows * kvd);
        let (k8, v8) = (gpu.tensor(words).unwrap(), gpu.tensor(words).unwrap());
        let mut b = gpu.batch();
        b.rope_kv(&qkvt, &qkvt, &q32, &k32, &v32, &l32, &rope, first, n)
            .unwrap();
        b.rope_kv(
            &qkvt,
            &qkvt,
            &q8,
            &k8,
            &v8,
            &layout(KvElem::Q8_0),
            &rope,
            first,
            n,
        )
        .unwrap();
        b.submit().unwrap();
        let what = format!("neox {neox}, n_rot {n_rot}");
        let span = first * qd..(first + n) * qd;
        assert_eq!(
            gpu.read_u32(&q8).unwrap()[span.clone()],
            gpu.read_u32(&q32).unwrap()[span],
            "{what}: queries"
        );
        for (name, c32, c8) in [("keys", &k32, &k8), ("values", &v32, &v8)] {
            let written = pos0 * kvd..(pos0 + n) * kvd;
            let vals = &gpu.read_f32(c32).unwrap()[written.clone()];
            let (blocks, _) = cpu_q8(vals);
            let want = gpu_words(&blocks);
            let got = gpu.read_u32(c8).unwrap();
            let got = &got[KvElem::Q8_0.words(written.start)..][..want.len()];
            let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(
                diff,
                0,
                "{what}: {name}: {diff} of {} words differ",
                want.len()
            );
        }
    }
    // Heads that split a block are refused, not written across heads.
    let l48 = QkvLayout {
        head_dim: 48,
        ..layout(KvElem::Q8_0)
    };
    let rope = common::rope(48, 48, n_head, 0, false);
    let words = KvElem::Q8_0.words(rows * 2 * 48);
    let (kc, vc) = (gpu.tensor(words).unwrap(), gpu.tensor(words).unwrap());
    let q = gpu.tensor(tokens * qd).unwrap();
    let err = gpu
        .batch()
        .rope_kv(&qkvt, &qkvt, &q, &kc, &vc, &l48, &rope, 0, 1)
        .unwrap_err();
    assert!(err.to_string().contains("multiple of 32"), "{err}");
}

/// Attention over q8_0 caches gives the bits it gives over f32 caches
/// holding the values the CPU widens the blocks to: decode steps deep in
/// the cache (attention.wgsl, several chunks), a prompt (the lanes kernel
/// where the device takes it), heads of 64, 128 and 256, grouped heads and
/// a window.
#[test]
fn attention_over_q8_0_caches_equals_f32_caches_of_the_widened_values() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(43);
    // (tokens, first position, heads, KV heads, head size, window)
    for (n_tokens, pos0, n_head, n_kv_head, hd, window) in [
        (1, 600, 9, 3, 64, 0),
        (2, 300, 4, 1, 128, 100),
        (80, 0, 6, 2, 64, 0),
        (20, 3, 4, 1, 256, 5),
        (70, 190, 4, 4, 32, 0),
    ] {
        let kv_len = pos0 + n_tokens;
        let kvd = n_kv_head * hd;
        let q: Vec<f32> = rng
            .vec(n_tokens * n_head * hd)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let big = |x: Vec<f32>| -> Vec<f32> { x.iter().map(|v| v * 3.0).collect() };
        let (kq, kw) = cpu_q8(&big(rng.vec(kv_len * kvd)));
        let (vq, vw) = cpu_q8(&big(rng.vec(kv_len * kvd)));
        let host: Vec<TokenRow> = (pos0..kv_len)
            .map(|p| TokenRow {
                row: p as u32,
                pos: p as u32,
            })
            .collect();
        let flat: Vec<u32> = host.iter().flat_map(|e| [e.row, e.pos]).collect();
        let tab = gpu.upload_u32(&flat).unwrap();
        let table = TokenTable {
            host: &host,
            gpu: &tab,
        };
        let qt = gpu.upload_f32(&q).unwrap();
        let scores = common::poisoned(gpu, attention_scratch_len(n_tokens, n_head, hd, kv_len));
        let a = Attention {
            n_tokens,
            n_head,
            n_kv_head,
            head_dim: hd,
            pos0: 0,
            window,
            scale: 1.0 / (hd as f32).sqrt(),
            kv: KvElem::F32,
            ring: 0,
        };
        let (k32, v32) = (gpu.upload_f32(&kw).unwrap(), gpu.upload_f32(&vw).unwrap());
        let want = run(gpu, q.len(), |b, y| {
            b.attention_rows(&qt, &k32, &v32, &scores, y, &a, table, 0)
                .unwrap()
        });
        let (k8, v8) = (
            gpu.upload_u32(&gpu_words(&kq)).unwrap(),
            gpu.upload_u32(&gpu_words(&vq)).unwrap(),
        );
        let a8 = Attention {
            kv: KvElem::Q8_0,
            ..a
        };
        let got = run(gpu, q.len(), |b, y| {
            b.attention_rows(&qt, &k8, &v8, &scores, y, &a8, table, 0)
                .unwrap()
        });
        assert!(want.iter().all(|x| x.is_finite()), "{a:?}: unwritten");
        let diff = (0..q.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .count();
        assert_eq!(diff, 0, "{a8:?}: {diff} of {} outputs differ", q.len());
        // Caches one block short of the last row are refused by size.
        let short = gpu
            .upload_u32(&gpu_words(&kq)[..(kv_len * kvd / 32 - 1) * KV_Q8_WORDS])
            .unwrap();
        let err = gpu
            .batch()
            .attention_rows(&qt, &short, &v8, &scores, &qt, &a8, table, 0)
            .unwrap_err();
        assert!(err.to_string().contains("caches of"), "{err}");
    }
}
