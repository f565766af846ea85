//! The GPU's plan for a step: each block's program ([`crate::program`])
//! turned into the dispatches that record it, with their fusions. A pure
//! function of the programs, the device's kind ([`DeviceTraits`]), what
//! the weights' uploads allow ([`WeightFacts`]) and the step's shape, so
//! its choices are unit-tested without a device; the recorder
//! (`record.rs`) records the plan and decides nothing.
//!
//! The fusions, where their conditions hold:
//! - the attention norm in the QKV product's prologue and the feed-forward
//!   norm in the gate/up product's, with the residual adds in the
//!   epilogues of o and down (a "folded" block: every product a mat-vec or
//!   small-N kernel, a device that prefers the prologue, no post-norms,
//!   gate and up one weight whose epilogue takes the activation);
//! - RoPE and the cache writes in the QKV product's epilogue (nothing
//!   between them: no biases or head norms; one weight in one binding;
//!   every sequence's cache in the step's buffers; not a q8_0 cache);
//! - on a CPU-backed device, the residual adds of o and down with the next
//!   norm in their last workgroup ([`lamina_gpu::NormAfter`]);
//! - otherwise the norms run as add + norm kernels after each residual.

use crate::program::{Op, Program};

/// What a device prefers, from its kind (see `lamina_gpu::Gpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceTraits {
    /// Every width of step runs the one-thread-per-row small-N kernels
    /// (a CPU-backed device); else only steps of up to
    /// [`lamina_gpu::MAX_SMALL_COLS`] columns do.
    pub small_n_everywhere: bool,
    /// Norms fold into the products' prologues (hardware GPUs).
    pub norm_prologue: bool,
}

impl DeviceTraits {
    pub fn of(g: &lamina_gpu::Gpu) -> Self {
        DeviceTraits {
            small_n_everywhere: g.adapter_info().device_type == "cpu",
            norm_prologue: g.norm_prologue(),
        }
    }

    /// An `n`-column product runs a kernel that takes prologues and
    /// epilogues.
    fn fuses(self, n: usize) -> bool {
        n <= lamina_gpu::MAX_SMALL_COLS || self.small_n_everywhere
    }
}

/// What a block's GPU weights allow, decided at upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightFacts {
    /// Q, K and V stacked as one weight (one type), in one binding, into
    /// a cache whose rows the RoPE epilogue can write (not q8_0).
    pub qkv_rope: bool,
    /// Gate and up stacked as one weight in one binding with an even
    /// number of rows: its product's epilogue takes the activation.
    pub gate_up_glu: bool,
    /// Gate and up stacked as one weight (else one product per type).
    pub gate_up_one: bool,
    /// The o and down products' shapes let their last workgroup norm the
    /// new hidden state (a CPU-backed device, see
    /// `lamina_gpu::Batch::norm_epilogue_fuses`).
    pub wo_norm_after: bool,
    pub down_norm_after: bool,
}

/// One dispatch group of a block (one dispatch unless it says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// RMSNorm of the hidden state into `h` (the attention norm).
    Norm,
    /// The QKV product, a dispatch per stacked part, the attention norm in
    /// its prologue where `norm`.
    Qkv {
        norm: bool,
    },
    /// The QKV product with RoPE and the cache writes in its epilogue.
    QkvRope {
        norm: bool,
    },
    /// The QKV biases.
    Bias,
    /// Per-head norms of q and k.
    HeadNorms,
    /// RoPE and the cache writes, a dispatch per run of sequences whose
    /// caches share buffers.
    RopeStore,
    /// Attention, a dispatch per run of sequences.
    Attend,
    /// The o product with the residual add in its epilogue; where
    /// `norm_after`, its last workgroup norms the sum into `h`.
    OutAdd {
        norm_after: bool,
    },
    /// The o product alone.
    Out,
    /// The attention's residual add (after its post-norm) into the spare
    /// buffer, with the feed-forward norm of the sum into `h`.
    AttnResidual,
    /// The stacked gate/up product with the activation in its epilogue,
    /// the feed-forward norm in its prologue where `norm`.
    GateUpAct {
        norm: bool,
    },
    /// Gate/up products of differing types, then the activation.
    GateUp,
    Act,
    /// The down product with the residual add in its epilogue; where
    /// `norm_after`, its last workgroup norms the sum into `h`.
    DownAdd {
        norm_after: bool,
    },
    /// The down product alone.
    Down,
    /// The feed-forward's residual add (after its post-norm) back into the
    /// hidden state, with the next norm (the next block's, or the head's)
    /// into `h`.
    FfnResidual,
    /// A mixture's router and shared expert: the submission ends here
    /// unless the experts are routed on the device.
    Router,
    /// The routed experts (on the device, or on the host between two
    /// submissions); their sum lands in `o`.
    Experts,
    /// The tests' stand-in recurrent block, which has no GPU arm.
    Recurrent,
    /// A Gated DeltaNet block from the normed input in `h` to its output
    /// product in `o`: its input products, then per sequence the
    /// convolution, the delta rule and the gated norm, then `ssm_out`.
    DeltaNet,
    /// Attention's output gate: the gate's product from `h`, then
    /// `sigmoid(gate) · attn`, which the output product reads.
    OutputGate,
}

/// A block's dispatches and whether `h` holds the next norm after them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    pub dispatches: Vec<Dispatch>,
    pub normed: bool,
}

/// A step's plan: the first block's attention norm where it runs alone
/// (counted outside the blocks, as the head's norm is), each block's
/// dispatches, and whether the head's norm runs alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepPlan {
    pub first_norm: bool,
    pub blocks: Vec<BlockPlan>,
    pub head_norm: bool,
}

/// The widths of step that plan alike: a plan depends on the width only
/// through whether it runs the mat-vec and small-N kernels (at most
/// [`lamina_gpu::MAX_SMALL_COLS`] columns), so each width up to that is its
/// own class and every wider step one more.
pub fn step_class(n: usize) -> usize {
    n.min(lamina_gpu::MAX_SMALL_COLS + 1)
}

/// Whether a block folds its norms into its products for an `n`-column
/// step (see the module's header).
fn folds(p: &Program, w: &WeightFacts, d: DeviceTraits, n: usize) -> bool {
    // A Gated DeltaNet block and an output gate read the normed input
    // again after their first product: it must be in `h`.
    let reads_h_again = p.has(|o| matches!(o, Op::DeltaNet | Op::OutputGate));
    d.fuses(n)
        && d.norm_prologue
        && !p.post_norms()
        && p.moe().is_none()
        && w.gate_up_glu
        && !reads_h_again
}

/// The plan of an `n`-column step over `blocks`; `one_run`: every
/// sequence's cache shares the step's buffers.
pub fn plan_step(
    blocks: &[(&Program, &WeightFacts)],
    d: DeviceTraits,
    n: usize,
    one_run: bool,
) -> StepPlan {
    let first_norm = blocks.first().is_some_and(|(p, w)| !folds(p, w, d, n));
    let mut normed = first_norm;
    let mut out = Vec::with_capacity(blocks.len());
    for (p, w) in blocks {
        let plan = plan_block(p, w, d, n, one_run, normed);
        normed = plan.normed;
        out.push(plan);
    }
    StepPlan {
        first_norm,
        blocks: out,
        head_norm: !normed,
    }
}

/// One block's dispatches, `normed`: `h` holds its attention norm on entry.
pub fn plan_block(
    p: &Program,
    w: &WeightFacts,
    d: DeviceTraits,
    n: usize,
    one_run: bool,
    normed: bool,
) -> BlockPlan {
    use Dispatch::*;
    let folded = folds(p, w, d, n);
    let mut out = Vec::new();
    let mut h_normed = false;
    // Follows the program's ops; where a fusion takes an op into a
    // neighbour's dispatch, the op adds nothing of its own.
    let rope_fused = w.qkv_rope && d.fuses(n) && one_run && !p.qkv_bias() && !p.head_norms();
    let norm_after = !p.post_norms()
        && w.wo_norm_after
        && w.down_norm_after
        && (1..=lamina_gpu::MAX_SMALL_COLS).contains(&n);
    for op in &p.ops {
        match op {
            Op::AttnNorm => {
                if !folded && !normed {
                    out.push(Norm);
                }
            }
            Op::Qkv { bias, .. } => {
                out.push(if rope_fused {
                    QkvRope { norm: folded }
                } else {
                    Qkv { norm: folded }
                });
                if *bias {
                    out.push(Bias);
                }
            }
            Op::HeadNorms => out.push(HeadNorms),
            Op::RopeStore => {
                if !rope_fused {
                    out.push(RopeStore);
                }
            }
            Op::Attend => out.push(Attend),
            Op::AttnOut { .. } => {
                if folded {
                    out.push(OutAdd { norm_after: false });
                } else if norm_after && p.moe().is_none() {
                    out.push(OutAdd { norm_after: true });
                } else {
                    out.extend([Out, AttnResidual]);
                }
            }
            // Folded into the gate/up prologue, or normed by the residual
            // before it.
            Op::FfnNorm => {}
            Op::GatedFfn(_) => {
                if folded {
                    out.push(GateUpAct { norm: true });
                } else if w.gate_up_one {
                    out.push(GateUpAct { norm: false });
                } else {
                    out.extend([GateUp, Act]);
                }
            }
            Op::Experts(_) => out.extend([Router, Experts]),
            // No GPU arm yet: placement keeps recurrent blocks on the CPU
            // (plan.rs), and the upload refuses one; the recorder would
            // fail on this.
            Op::Recurrent { .. } => out.push(Recurrent),
            // Its output product lands in `o`; the residual add and the
            // next norm follow as after attention's Out.
            Op::DeltaNet => out.extend([DeltaNet, AttnResidual]),
            Op::OutputGate => out.push(OutputGate),
            Op::FfnOut { .. } => {
                if folded {
                    out.push(DownAdd { norm_after: false });
                } else if p.moe().is_some() {
                    out.push(FfnResidual);
                    h_normed = true;
                } else if norm_after {
                    out.push(DownAdd { norm_after: true });
                    h_normed = true;
                } else {
                    out.extend([Down, FfnResidual]);
                    h_normed = true;
                }
            }
        }
    }
    BlockPlan {
        dispatches: out,
        normed: h_normed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{test_config, ARCHS};
    use Dispatch::*;

    const LAVAPIPE: DeviceTraits = DeviceTraits {
        small_n_everywhere: true,
        norm_prologue: false,
    };
    const DISCRETE: DeviceTraits = DeviceTraits {
        small_n_everywhere: false,
        norm_prologue: true,
    };
    /// One type per block, every weight in one binding.
    const UNIFORM: WeightFacts = WeightFacts {
        qkv_rope: true,
        gate_up_glu: true,
        gate_up_one: true,
        wo_norm_after: true,
        down_norm_after: true,
    };
    /// A real Q4_K_M block: V and down in Q6_K (Q, K, V not one weight)
    /// on a hardware GPU (no norm-after epilogues).
    const MIXED: WeightFacts = WeightFacts {
        qkv_rope: false,
        gate_up_glu: true,
        gate_up_one: true,
        wo_norm_after: false,
        down_norm_after: false,
    };

    fn plan(arch: &str, w: WeightFacts, d: DeviceTraits, n: usize) -> Vec<Dispatch> {
        plan_of(arch, 0, w, d, n)
    }

    /// Block `il`'s plan (a hybrid's blocks differ).
    fn plan_of(arch: &str, il: usize, w: WeightFacts, d: DeviceTraits, n: usize) -> Vec<Dispatch> {
        let row = crate::arch::find(arch).expect("a row");
        let p = Program::new(&test_config(row.arch), il);
        plan_block(&p, &w, d, n, true, false).dispatches
    }

    /// Each architecture's dispatch groups per block: decoding and a
    /// 64-token prompt, on a discrete GPU and on a CPU-backed device.
    #[test]
    fn every_architecture_plans_its_dispatches() {
        let llama_decode_gpu = vec![
            QkvRope { norm: true },
            Attend,
            OutAdd { norm_after: false },
            GateUpAct { norm: true },
            DownAdd { norm_after: false },
        ];
        let llama_prompt_gpu = vec![
            Norm,
            Qkv { norm: false },
            RopeStore,
            Attend,
            Out,
            AttnResidual,
            GateUpAct { norm: false },
            Down,
            FfnResidual,
        ];
        let llama_cpu_backed = vec![
            Norm,
            QkvRope { norm: false },
            Attend,
            OutAdd { norm_after: true },
            GateUpAct { norm: false },
            DownAdd { norm_after: true },
        ];
        let llama_prompt_cpu_backed = vec![
            Norm,
            QkvRope { norm: false },
            Attend,
            Out,
            AttnResidual,
            GateUpAct { norm: false },
            Down,
            FfnResidual,
        ];
        // Every architecture but the tests' stand-in recurrent block, which
        // has no GPU arm.
        for row in ARCHS.iter().filter(|r| !r.test_only) {
            let a = row.name;
            let decode_gpu = plan(a, UNIFORM, DISCRETE, 1);
            let prompt_gpu = plan(a, UNIFORM, DISCRETE, 64);
            let decode_cpu = plan(a, UNIFORM, LAVAPIPE, 1);
            let prompt_cpu = plan(a, UNIFORM, LAVAPIPE, 64);
            match a {
                "llama" | "phi3" => {
                    assert_eq!(decode_gpu, llama_decode_gpu, "{a}");
                    assert_eq!(prompt_gpu, llama_prompt_gpu, "{a}");
                    assert_eq!(decode_cpu, llama_cpu_backed, "{a}");
                    assert_eq!(prompt_cpu, llama_prompt_cpu_backed, "{a}");
                }
                "qwen2" => {
                    let want = vec![
                        Qkv { norm: true },
                        Bias,
                        RopeStore,
                        Attend,
                        OutAdd { norm_after: false },
                        GateUpAct { norm: true },
                        DownAdd { norm_after: false },
                    ];
                    assert_eq!(decode_gpu, want, "{a}");
                }
                "qwen3" => {
                    let want = vec![
                        Norm,
                        Qkv { norm: false },
                        HeadNorms,
                        RopeStore,
                        Attend,
                        OutAdd { norm_after: true },
                        GateUpAct { norm: false },
                        DownAdd { norm_after: true },
                    ];
                    assert_eq!(decode_cpu, want, "{a}");
                }
                // Post-norms: never folded, never normed after.
                "gemma3" => {
                    let want = vec![
                        Norm,
                        Qkv { norm: false },
                        HeadNorms,
                        RopeStore,
                        Attend,
                        Out,
                        AttnResidual,
                        GateUpAct { norm: false },
                        Down,
                        FfnResidual,
                    ];
                    assert_eq!(decode_gpu, want, "{a}");
                    assert_eq!(decode_cpu, want, "{a}");
                }
                "qwen2moe" | "qwen3moe" => {
                    let attn: &[Dispatch] = if a == "qwen2moe" {
                        &[Qkv { norm: false }, Bias, RopeStore, Attend]
                    } else {
                        &[Qkv { norm: false }, HeadNorms, RopeStore, Attend]
                    };
                    let mut want = vec![Norm];
                    want.extend_from_slice(attn);
                    want.extend([Out, AttnResidual, Router, Experts, FfnResidual]);
                    assert_eq!(decode_gpu, want, "{a}");
                    assert_eq!(decode_cpu, want, "{a}");
                }
                // Block 0 is a Gated DeltaNet block: its output product
                // in `o`, then the residual and the feed-forward's norm
                // as after attention's Out. Block 3 attends, its output
                // gated before the output product.
                "qwen35" | "qwen35moe" | "qwen3next" => {
                    let (ffn, attn_out): (&[Dispatch], Dispatch) = if row.moe.is_some() {
                        (&[Router, Experts, FfnResidual], Out)
                    } else {
                        (
                            &[GateUpAct { norm: false }, DownAdd { norm_after: true }],
                            OutAdd { norm_after: true },
                        )
                    };
                    let mut want = vec![Norm, DeltaNet, AttnResidual];
                    want.extend_from_slice(ffn);
                    assert_eq!(decode_gpu, want, "{a}");
                    assert_eq!(decode_cpu, want, "{a}");
                    let mut want = vec![
                        Norm,
                        Qkv { norm: false },
                        HeadNorms,
                        RopeStore,
                        Attend,
                        OutputGate,
                        attn_out,
                    ];
                    if row.moe.is_some() {
                        want.push(AttnResidual);
                    }
                    want.extend_from_slice(ffn);
                    assert_eq!(plan_of(a, 3, UNIFORM, DISCRETE, 1), want, "{a}");
                }
                other => panic!("no expected plan for {other}"),
            }
        }
        // A real Q4_K_M block on a hardware GPU: Q, K and V as separate
        // products of two types, RoPE as its own kernel.
        assert_eq!(
            plan("llama", MIXED, DISCRETE, 1),
            vec![
                Qkv { norm: true },
                RopeStore,
                Attend,
                OutAdd { norm_after: false },
                GateUpAct { norm: true },
                DownAdd { norm_after: false },
            ]
        );
        // Gate and up of two types: the activation runs alone.
        let split_gate = WeightFacts {
            gate_up_glu: false,
            gate_up_one: false,
            ..UNIFORM
        };
        assert_eq!(
            plan("llama", split_gate, LAVAPIPE, 1),
            vec![
                Norm,
                QkvRope { norm: false },
                Attend,
                OutAdd { norm_after: true },
                GateUp,
                Act,
                DownAdd { norm_after: true },
            ]
        );
    }

    /// A step: the first norm runs alone where the first block does not
    /// fold it, each block leaves `h` normed or not for the next, and the
    /// head norms alone only where the last block did not norm for it.
    #[test]
    fn a_step_hands_the_norm_from_block_to_block() {
        let c = test_config(crate::config::Arch::Llama);
        let programs = Program::all(&c);
        let blocks: Vec<(&Program, &WeightFacts)> =
            programs.iter().map(|p| (p, &UNIFORM)).collect();
        let folded = plan_step(&blocks, DISCRETE, 1, true);
        assert!(!folded.first_norm && folded.head_norm);
        assert_eq!(folded.blocks.len(), c.n_layer);
        let unfolded = plan_step(&blocks, LAVAPIPE, 1, true);
        assert!(unfolded.first_norm && !unfolded.head_norm);
        // Only the first block norms its own input alone.
        assert!(unfolded
            .blocks
            .iter()
            .all(|b| !b.dispatches.contains(&Norm)));
        // Widths of one class plan alike.
        for (a, b) in [(9, 512), (1, 1), (8, 8)] {
            assert_eq!(step_class(a), step_class(b));
            for d in [LAVAPIPE, DISCRETE] {
                assert_eq!(
                    plan_step(&blocks, d, a, true),
                    plan_step(&blocks, d, b, true)
                );
            }
        }
        assert_ne!(step_class(7), step_class(8));
        assert_ne!(step_class(8), step_class(9));
        // Sequences whose caches do not share buffers: RoPE runs per run.
        let runs = plan_step(&blocks, DISCRETE, 1, false);
        assert!(runs.blocks[0].dispatches.contains(&RopeStore));
    }
}
