//! A sequence's recurrent state (`kv/state.rs`), through the tests'
//! stand-in recurrent block (`lamina-recurrent-test`: block 0 recurrent,
//! block 1 attention) in a synthetic file: a prompt gives the bits of its
//! tokens one by one and a sequence its own bits beside others; truncation
//! goes back to a checkpoint and continues with the same bits; save and
//! restore, and a copy to another slot (prefix sharing), keep state and
//! checkpoints; the checkpoints stay within their byte budget; placement
//! keeps the recurrent block on the CPU and counts its state. On the CPU
//! alone and with the attention block and the head on the GPU.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, OnceLock};

use lamina_gguf::{File, GgmlType, Model, Value, Writer};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::plan::{self, Device, PlanParams};
use lamina_model::{CpuModel, HybridCache, HybridModel, KvCache, Logits};

const ARCH: &str = "lamina-recurrent-test";
const E: usize = 64;
const FF: usize = 96;
const HEADS: usize = 4;
const VOCAB: usize = 100;
const CH: usize = 24;
const KERNEL: usize = 4;
const N_CTX: usize = 32;

fn noise(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5
        })
        .collect()
}

fn file() -> Model {
    let mut seed = 0x5eed_cafe_u64;
    let mut w = Writer::new().kv("general.architecture", Value::String(ARCH.into()));
    for (k, v) in [
        ("block_count", 2),
        ("embedding_length", E as u32),
        ("feed_forward_length", FF as u32),
        ("attention.head_count", HEADS as u32),
        ("attention.head_count_kv", 2),
        ("context_length", 256),
        ("vocab_size", VOCAB as u32),
        ("ssm.inner_size", CH as u32),
        ("ssm.conv_kernel", KERNEL as u32),
        ("full_attention_interval", 2),
    ] {
        w = w.kv(format!("{ARCH}.{k}"), Value::U32(v));
    }
    let mut add = |w: Writer, name: &str, dims: &[usize], norm: bool| {
        let n: usize = dims.iter().product();
        let vals: Vec<f32> = noise(n, &mut seed)
            .into_iter()
            .map(|v| if norm { 1.0 + v } else { v })
            .collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        w.tensor(name, &dims, GgmlType::F32, bytes)
    };
    w = add(w, "token_embd.weight", &[E, VOCAB], false);
    let hd = E / HEADS;
    for il in 0..2 {
        let n = |s: &str| format!("blk.{il}.{s}");
        w = add(w, &n("attn_norm.weight"), &[E], true);
        if il == 0 {
            w = add(w, &n("ssm_in.weight"), &[E, CH], false);
            w = add(w, &n("ssm_conv1d.weight"), &[KERNEL, CH], false);
            w = add(w, &n("ssm_a"), &[CH], false);
            w = add(w, &n("ssm_out.weight"), &[CH, E], false);
        } else {
            w = add(w, &n("attn_q.weight"), &[E, HEADS * hd], false);
            w = add(w, &n("attn_k.weight"), &[E, 2 * hd], false);
            w = add(w, &n("attn_v.weight"), &[E, 2 * hd], false);
            w = add(w, &n("attn_output.weight"), &[HEADS * hd, E], false);
        }
        w = add(w, &n("ffn_norm.weight"), &[E], true);
        w = add(w, &n("ffn_gate.weight"), &[E, FF], false);
        w = add(w, &n("ffn_up.weight"), &[E, FF], false);
        w = add(w, &n("ffn_down.weight"), &[FF, E], false);
    }
    w = add(w, "output_norm.weight", &[E], true);
    Model::from_shards(vec![File::from_bytes(w.to_bytes()).unwrap()]).unwrap()
}

fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| Arc::new(Gpu::new(GpuOptions::default()).unwrap()))
        .clone()
}

/// The model at `-ngl ngl` (0: the CPU alone), checkpoints of `budget`
/// bytes a sequence.
fn model(file: &Model, ngl: usize, budget: u64) -> HybridModel<'_> {
    let mut cpu = CpuModel::load(file).unwrap();
    cpu.config.kv.checkpoint_bytes = budget;
    let params = PlanParams {
        n_ctx: N_CTX,
        ..PlanParams::default()
    };
    let p = plan::plan(file, &cpu.config, ngl, &params);
    HybridModel::new(cpu, p, (ngl > 0).then(gpu)).unwrap()
}

const TOKENS: [u32; 12] = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26];
const PLACEMENTS: [usize; 2] = [0, 3];
const BUDGET: u64 = 1 << 20;

/// The prompt in two chunks (`TOKENS[..5]`, `TOKENS[5..9]`: checkpoints
/// at 5 and 9), then its tokens one at a time up to `len`.
fn chunks_then_decode(m: &HybridModel<'_>, cache: &mut HybridCache, len: usize) {
    m.forward(&TOKENS[..5], cache, Logits::Last).unwrap();
    m.forward(&TOKENS[5..9], cache, Logits::Last).unwrap();
    for &t in &TOKENS[9..len] {
        m.forward(&[t], cache, Logits::Last).unwrap();
    }
}

/// Each token's logits, fed one at a time.
fn one_by_one(m: &HybridModel<'_>, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = m.new_cache(N_CTX).unwrap();
    tokens
        .iter()
        .map(|&t| m.forward(&[t], &mut cache, Logits::Last).unwrap())
        .collect()
}

#[test]
fn placement_keeps_the_recurrent_block_on_the_cpu_and_counts_its_state() {
    let f = file();
    let m = model(&f, 3, BUDGET);
    let dev: Vec<Device> = m.plan.slots.iter().map(|s| s.device).collect();
    assert_eq!(dev, [Device::Cpu, Device::Gpu, Device::Gpu]);
    assert_eq!(m.plan.held[0].tensor, "blk.0.ssm_in.weight");
    // One sequence: its state (window and recurrence) and the budget.
    let state = (KERNEL * CH * 4) as u64;
    assert_eq!(m.plan.slots[0].kv_bytes, state + BUDGET);
    let c = &m.config();
    assert!(c.is_recurrent(0) && !c.is_recurrent(1));
    assert_eq!(lamina_model::memory::state_bytes(c, 2), state + BUDGET);
    let e = lamina_model::ModelError::UnsupportedArch("x".into()).to_string();
    assert!(!e.contains(ARCH), "{e}");
}

#[test]
fn a_prompt_gives_the_bits_of_its_tokens_one_by_one() {
    let f = file();
    for ngl in PLACEMENTS {
        let m = model(&f, ngl, BUDGET);
        let each = one_by_one(&m, &TOKENS);
        let mut cache = m.new_cache(N_CTX).unwrap();
        let all = m.forward(&TOKENS, &mut cache, Logits::From(0)).unwrap();
        for (i, l) in each.iter().enumerate() {
            assert_eq!(
                &all[i * VOCAB..(i + 1) * VOCAB],
                &l[..],
                "-ngl {ngl} token {i}"
            );
        }
        // In two steps of several tokens, the same.
        let mut cache = m.new_cache(N_CTX).unwrap();
        let mut split = m
            .forward(&TOKENS[..5], &mut cache, Logits::From(0))
            .unwrap();
        split.extend(
            m.forward(&TOKENS[5..], &mut cache, Logits::From(0))
                .unwrap(),
        );
        assert_eq!(split, all, "-ngl {ngl}");
        // The state matters: a token's logits depend on what came before.
        assert_ne!(each[1], one_by_one(&m, &TOKENS[1..2])[0], "-ngl {ngl}");
    }
}

#[test]
fn several_sequences_in_one_step_keep_their_own_state() {
    let f = file();
    for ngl in PLACEMENTS {
        let m = model(&f, ngl, BUDGET);
        let (a, b) = (&TOKENS[..7], &TOKENS[3..]);
        let alone_a = one_by_one(&m, a);
        let alone_b = one_by_one(&m, b);
        let mut caches = m.new_caches(2, N_CTX).unwrap();
        let (ca, cb) = caches.split_at_mut(1);
        // A prompt beside a prompt, then each decodes beside the other.
        let mut work: Vec<(&[u32], &mut HybridCache)> =
            vec![(&a[..4], &mut ca[0]), (&b[..2], &mut cb[0])];
        let got = m.forward_multi(&mut work).unwrap();
        assert_eq!(got[0], alone_a[3], "-ngl {ngl}");
        assert_eq!(got[1], alone_b[1], "-ngl {ngl}");
        for i in 0..3 {
            let mut work: Vec<(&[u32], &mut HybridCache)> = vec![
                (&a[4 + i..5 + i], &mut ca[0]),
                (&b[2 + i..3 + i], &mut cb[0]),
            ];
            let got = m.forward_multi(&mut work).unwrap();
            assert_eq!(got[0], alone_a[4 + i], "-ngl {ngl} step {i}");
            assert_eq!(got[1], alone_b[2 + i], "-ngl {ngl} step {i}");
        }
    }
}

/// A prompt in two chunks (checkpoints at 5 and 9), then three decoded
/// tokens: cutting back lands on a checkpoint, and going on from there
/// gives the bits of the first time.
#[test]
fn truncation_goes_back_to_a_checkpoint_and_continues_with_the_same_bits() {
    let f = file();
    for ngl in PLACEMENTS {
        let m = model(&f, ngl, BUDGET);
        let each = one_by_one(&m, &TOKENS);
        for (want, kept) in [(11, 9), (9, 9), (8, 5), (4, 0)] {
            let mut c = m.new_cache(N_CTX).unwrap();
            chunks_then_decode(&m, &mut c, 12);
            assert_eq!(c.len(), 12);
            c.truncate(want);
            assert_eq!(c.len(), kept, "-ngl {ngl} truncate({want})");
            for (i, &t) in TOKENS.iter().enumerate().skip(kept) {
                let got = m.forward(&[t], &mut c, Logits::Last).unwrap();
                assert_eq!(got, each[i], "-ngl {ngl} truncate({want}) token {i}");
            }
        }
    }
}

#[test]
fn save_restore_and_copy_keep_state_and_checkpoints() {
    let f = file();
    for ngl in PLACEMENTS {
        let m = model(&f, ngl, BUDGET);
        let each = one_by_one(&m, &TOKENS);
        let mut caches = m.new_caches(3, N_CTX).unwrap();
        let (src, rest) = caches.split_at_mut(1);
        let src = &mut src[0];
        chunks_then_decode(&m, src, 10);
        // Saved and restored into another slot: it goes on as the source,
        // and can still go back to the source's checkpoints.
        let bytes = m.save_cache(src).unwrap();
        let (a, b) = rest.split_at_mut(1);
        let restored = &mut a[0];
        assert_eq!(m.restore_cache(restored, &bytes).unwrap(), 10);
        let got = m.forward(&TOKENS[10..11], restored, Logits::Last).unwrap();
        assert_eq!(got, each[10], "-ngl {ngl} restored");
        restored.truncate(7);
        assert_eq!(restored.len(), 5, "-ngl {ngl}");
        let got = m.forward(&TOKENS[5..6], restored, Logits::Last).unwrap();
        assert_eq!(got, each[5], "-ngl {ngl} restored, cut back");
        // A cut-short save is refused and leaves the slot empty.
        assert!(m
            .restore_cache(restored, &bytes[..bytes.len() - 5])
            .is_err());
        assert_eq!(restored.len(), 0);
        // Copied (prefix sharing): the target keeps the checkpoint at or
        // before what it was lent, and goes on with the source's bits.
        let dst = &mut b[0];
        m.copy_cache(src, dst, 10).unwrap();
        assert_eq!(dst.len(), 10, "-ngl {ngl}");
        m.copy_cache(src, dst, 8).unwrap();
        assert_eq!(dst.len(), 5, "-ngl {ngl}");
        for (i, &t) in TOKENS.iter().enumerate().skip(5) {
            let got = m.forward(&[t], dst, Logits::Last).unwrap();
            assert_eq!(got, each[i], "-ngl {ngl} copied, token {i}");
        }
    }
}

/// The CPU cache's checkpoints: one per prompt chunk, the oldest leaving
/// when the budget is full, none larger than it kept.
#[test]
fn checkpoints_stay_within_their_budget() {
    let f = file();
    let mut cpu = CpuModel::load(&f).unwrap();
    let state = (KERNEL * CH * 4) as u64;
    cpu.config.kv.checkpoint_bytes = 2 * state;
    let mut cache = KvCache::new(&cpu.config, N_CTX).unwrap();
    for chunk in TOKENS.chunks(3) {
        cpu.forward(chunk, &mut cache, Logits::Last).unwrap();
        assert!(cache.checkpoints().bytes() <= 2 * state);
    }
    assert_eq!(cache.checkpoints().positions(), [9, 12]);
    // Decoding takes none.
    cpu.forward(&[1], &mut cache, Logits::Last).unwrap();
    assert_eq!(cache.checkpoints().positions(), [9, 12]);
    // A budget under one state keeps none: a cut goes back to the start.
    cpu.config.kv.checkpoint_bytes = state - 1;
    let mut cache = KvCache::new(&cpu.config, N_CTX).unwrap();
    cpu.forward(&TOKENS, &mut cache, Logits::Last).unwrap();
    assert!(cache.checkpoints().positions().is_empty());
    cache.truncate(11);
    assert_eq!(cache.len(), 0);
}
