//! Both real models' logits and block dispatches, bit for bit as the build
//! before the block program (`tests/reference/bits/real.txt`): a prompt as
//! one batch, decode steps, and a step of two sequences, with every layer
//! on the CPU, half of them on the GPU, and all.
#![allow(clippy::unwrap_used)]

mod common;

use common::model_path;
use lamina_gguf::{LoadMode, Model};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::plan::{self, PlanParams};
use lamina_model::{CpuModel, HybridModel};

const PROMPT: [u32; 9] = [1, 504, 3458, 314, 260, 1345, 282, 2246, 30];

#[test]
fn real_models_keep_their_bits() {
    let gpu = std::sync::Arc::new(Gpu::new(GpuOptions::default()).unwrap());
    let mut lines = Vec::new();
    for name in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        let file = Model::open(model_path(name), LoadMode::Mmap).unwrap();
        let n_layer = CpuModel::load(&file).unwrap().config.n_layer;
        for ngl in [0, n_layer / 2, n_layer + 1] {
            let cpu = CpuModel::load(&file).unwrap();
            let params = PlanParams {
                n_ctx: 64,
                ..PlanParams::default()
            };
            let p = plan::plan(&file, &cpu.config, ngl, &params);
            let m = HybridModel::new(cpu, p, (ngl > 0).then(|| gpu.clone())).unwrap();
            let out = common::fixed_run(&m, &PROMPT, &[11, 12, 13], 6, 64);
            let d = (ngl > 0).then(|| m.block_dispatches());
            lines.push(common::bits_line(&format!("{name} -ngl {ngl}"), &out, d));
        }
    }
    common::check_bits("real.txt", &lines);
}
