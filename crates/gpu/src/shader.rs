//! WGSL composition and the pipeline cache.
//!
//! Kernels are the `.wgsl` files under `shaders/`, embedded with
//! `include_str!`. A kernel is composed by plain text: every `{{NAME}}` is
//! replaced by its value from the kernel's definitions, then every line
//! `#include "path"` is replaced by that file (paths relative to `shaders/`,
//! or `gen/…` for the lattice tables generated from Rust, see `grids`; a
//! file included twice is pasted once). Nothing else is preprocessed, so the
//! composed text is exactly what naga and the driver see, and what a
//! [`GpuError::ShaderCompile`] carries.
//!
//! Every variant the runtime can ask for is listed by `all_kernels`; a unit
//! test composes and validates each with naga under the capabilities the
//! device actually requests.

use std::sync::Arc;

use crate::device::{block_on, lock, Gpu};
use crate::error::GpuError;

macro_rules! sources {
    ($($path:literal),* $(,)?) => {
        /// Every file under `shaders/`, by path relative to that folder.
        pub(crate) const SOURCES: &[(&str, &str)] = &[
            $(($path, include_str!(concat!("../../../shaders/", $path))),)*
        ];
    };
}

sources!(
    "common/params.wgsl",
    "common/ranked.wgsl",
    "common/attn_io.wgsl",
    "common/bytes.wgsl",
    "common/unit_dot.wgsl",
    "common/x_storage.wgsl",
    "common/x_uniform.wgsl",
    "common/x_storage4.wgsl",
    "common/dq32_pair.wgsl",
    "common/act.wgsl",
    "common/w4_on.wgsl",
    "common/w4_off.wgsl",
    "common/unit_x_on.wgsl",
    "common/unit_x_off.wgsl",
    "common/walk_lanes.wgsl",
    "common/lane_fold.wgsl",
    "common/walk_groups.wgsl",
    "common/rms.wgsl",
    "common/xnorm_on.wgsl",
    "common/xnorm_off.wgsl",
    "common/rope_rot.wgsl",
    "common/rope_epi_on.wgsl",
    "common/rope_epi_off.wgsl",
    "common/norm_epi_on.wgsl",
    "common/norm_epi_off.wgsl",
    "common/runs_on.wgsl",
    "common/runs_off.wgsl",
    "common/split.wgsl",
    "quant/k4_scales.wgsl",
    "quant/f32.wgsl",
    "quant/f16.wgsl",
    "quant/bf16.wgsl",
    "quant/q4_0.wgsl",
    "quant/q4_1.wgsl",
    "quant/q5_0.wgsl",
    "quant/q5_1.wgsl",
    "quant/q8_0.wgsl",
    "quant/q2_k.wgsl",
    "quant/q3_k.wgsl",
    "quant/q4_k.wgsl",
    "quant/q5_k.wgsl",
    "quant/q6_k.wgsl",
    "quant/iq4_nl.wgsl",
    "quant/iq4_xs.wgsl",
    "quant/tq2_0.wgsl",
    "quant/tq1_0.wgsl",
    "quant/e2m1.wgsl",
    "quant/mxfp4.wgsl",
    "quant/nvfp4.wgsl",
    "quant/iq_signs.wgsl",
    "quant/iq2_xxs.wgsl",
    "quant/iq2_xs.wgsl",
    "quant/iq2_s.wgsl",
    "quant/iq3_xxs.wgsl",
    "quant/iq3_s.wgsl",
    "quant/iq1_grid.wgsl",
    "quant/iq1_s.wgsl",
    "quant/iq1_m.wgsl",
    "matvec.wgsl",
    "matvec_rows.wgsl",
    "matmul_tiled.wgsl",
    "get_rows.wgsl",
    "rms_norm.wgsl",
    "rope.wgsl",
    "softmax.wgsl",
    "glu.wgsl",
    "binary.wgsl",
    "scale.wgsl",
    "copy.wgsl",
    "copy_f32.wgsl",
    "add_rows.wgsl",
    "attention.wgsl",
    "attention_combine.wgsl",
    "attention_lanes.wgsl",
    "add_rms_norm.wgsl",
    "glu_split.wgsl",
    "head_norm.wgsl",
    "delta_conv.wgsl",
    "delta_norm.wgsl",
    "delta_scan.wgsl",
    "delta_gate.wgsl",
    "rope_kv.wgsl",
    "rope_kv_q8.wgsl",
    "moe_weigh.wgsl",
    "moe_route.wgsl",
    "moe_pack.wgsl",
    "moe_shared.wgsl",
    "gather_cols.wgsl",
    "argmax.wgsl",
    "topk.wgsl",
    "common/kv_vec.wgsl",
    "common/kv_q8.wgsl",
);

/// A shader file: one of [`SOURCES`], or a table generated from Rust
/// (`gen/…`, see `crate::grids`).
fn source(path: &str) -> Option<&'static str> {
    SOURCES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, s)| *s)
        .or_else(|| crate::grids::source(path))
}

/// One kernel variant: a root file and the text substitutions applied to it
/// and to everything it includes. `name` is unique per variant and keys the
/// pipeline cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KernelSpec {
    pub name: String,
    pub root: &'static str,
    pub defs: Vec<(&'static str, String)>,
}

impl KernelSpec {
    pub fn new(root: &'static str) -> Self {
        KernelSpec {
            name: root.trim_end_matches(".wgsl").to_string(),
            root,
            defs: Vec::new(),
        }
    }

    /// Adds a substitution; the value becomes part of the variant's name.
    pub fn def(mut self, key: &'static str, value: impl Into<String>) -> Self {
        let value = value.into();
        self.name = format!("{}:{}={}", self.name, key, value);
        self.defs.push((key, value));
        self
    }

    /// The composed WGSL.
    pub fn compose(&self) -> Result<String, GpuError> {
        let mut out = String::new();
        let mut seen = Vec::new();
        self.include(self.root, &mut seen, &mut out, 0)?;
        Ok(out)
    }

    fn err(&self, message: String) -> GpuError {
        GpuError::Compose {
            kernel: self.name.clone(),
            message,
        }
    }

    fn substitute(&self, path: &str, text: &str) -> Result<String, GpuError> {
        let mut text = text.to_string();
        for (key, value) in &self.defs {
            text = text.replace(&format!("{{{{{key}}}}}"), value);
        }
        if let Some(at) = text.find("{{") {
            let end = text[at..].find("}}").map_or(text.len(), |e| at + e + 2);
            return Err(self.err(format!(
                "{path}: no definition for `{}`",
                &text[at..end.min(at + 40)]
            )));
        }
        Ok(text)
    }

    fn include(
        &self,
        path: &str,
        seen: &mut Vec<String>,
        out: &mut String,
        depth: usize,
    ) -> Result<(), GpuError> {
        if depth > 8 {
            return Err(self.err(format!("includes nested too deep at {path}")));
        }
        if seen.iter().any(|s| s == path) {
            return Ok(());
        }
        seen.push(path.to_string());
        let raw = source(path).ok_or_else(|| self.err(format!("no shader file `{path}`")))?;
        let text = self.substitute(path, raw)?;
        for line in text.lines() {
            match line.trim().strip_prefix("#include") {
                Some(rest) => {
                    let target = rest.trim().trim_matches('"');
                    let target = target.to_string();
                    self.include(&target, seen, out, depth + 1)?;
                }
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        Ok(())
    }
}

/// The runtime checks every kernel is compiled with: wgpu's defaults but
/// `force_loop_bounding`. That option makes naga add a hidden iteration
/// counter to every loop, so that a shader with an infinite loop cannot be
/// miscompiled; it also hides each loop's trip count from the driver's
/// compiler, which then unrolls nothing (the mat-vec is slower with it on
/// lavapipe: docs/perf/kernels.md, 2026-12-03). Lamina compiles only its
/// own kernels, and every loop in them runs to a constant or to a bound
/// taken from a uniform parameter that the host has checked, so the
/// counter guards nothing. Bounds checks stay on.
const RUNTIME_CHECKS: wgpu::ShaderRuntimeChecks = wgpu::ShaderRuntimeChecks {
    force_loop_bounding: false,
    ..wgpu::ShaderRuntimeChecks::checked()
};

/// A compiled kernel.
#[derive(Debug)]
pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// The kernel's name with its definitions (the profile's key).
    pub name: String,
}

impl Gpu {
    /// The compiled pipeline for `spec`, compiling it on first use.
    pub(crate) fn pipeline(&self, spec: &KernelSpec) -> Result<Arc<Pipeline>, GpuError> {
        if let Some(p) = lock(&self.pipelines).get(&spec.name) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.compile(&spec.name, spec.compose()?)?);
        lock(&self.pipelines).insert(spec.name.clone(), p.clone());
        Ok(p)
    }

    /// Compiles composed WGSL with entry point `main`.
    pub(crate) fn compile(&self, kernel: &str, source: String) -> Result<Pipeline, GpuError> {
        let compile_err = |message: String| GpuError::ShaderCompile {
            kernel: kernel.to_string(),
            message,
            wgsl: source.clone(),
        };
        let module = self
            .scoped(kernel, 0, || {
                let desc = wgpu::ShaderModuleDescriptor {
                    label: Some(kernel),
                    source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
                };
                // SAFETY: see `RUNTIME_CHECKS`: bounds checks stay on; only the
                // loop counters naga would add are left out, and every loop in
                // `shaders/` is bounded.
                unsafe {
                    self.device
                        .create_shader_module_trusted(desc, RUNTIME_CHECKS)
                }
            })
            .map_err(|e| compile_err(e.to_string()))?;
        let info = block_on(module.get_compilation_info());
        let errors: Vec<String> = info
            .messages
            .iter()
            .filter(|m| m.message_type == wgpu::CompilationMessageType::Error)
            .map(|m| m.message.clone())
            .collect();
        if !errors.is_empty() {
            return Err(compile_err(errors.join("\n")));
        }
        let pipeline = self
            .scoped(kernel, 0, || {
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(kernel),
                        layout: None,
                        module: &module,
                        entry_point: Some("main"),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &[],
                            // Every kernel writes its workgroup memory before reading it.
                            zero_initialize_workgroup_memory: false,
                        },
                        cache: None,
                    })
            })
            .map_err(|e| compile_err(e.to_string()))?;
        let layout = pipeline.get_bind_group_layout(0);
        Ok(Pipeline {
            pipeline,
            layout,
            name: kernel.to_string(),
        })
    }
}

/// Every kernel variant the runtime can build (used by the validation test).
#[cfg(test)]
pub(crate) fn all_kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for ty in crate::quant::SUPPORTED {
        for spec in crate::ops::matvec_variants(ty, false) {
            v.push(spec);
        }
        v.push(crate::ops::tiled_spec(ty));
        v.push(crate::ops::get_rows_spec(ty));
    }
    v.extend(crate::ops::elementwise_specs());
    v.extend(crate::ops::fused_specs());
    v.extend(crate::ops::delta_specs());
    v.extend(crate::ops::topk_specs());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validation with the capabilities a device gets from `features`, the same
    /// mapping wgpu-core applies when it validates a module.
    fn validate(spec: &KernelSpec, features: wgpu::Features) -> naga::Module {
        let src = spec.compose().unwrap_or_else(|e| panic!("{e}"));
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}: {}", spec.name, e.emit_to_string(&src)));
        let mut validator = wgpu_naga_bridge::create_validator(
            features,
            wgpu::DownlevelFlags::all(),
            naga::valid::ValidationFlags::all(),
        );
        if let Err(e) = validator.validate(&module) {
            panic!("{}: {}", spec.name, e.emit_to_string(&src));
        }
        module
    }

    #[test]
    fn every_kernel_validates_without_optional_features() {
        // The portable kernels must compile on an adapter with neither
        // SHADER_F16 nor SUBGROUP; that is the smallest set a device requests.
        let kernels = all_kernels();
        assert!(kernels.len() > 60, "{} kernels", kernels.len());
        for spec in &kernels {
            validate(spec, wgpu::Features::empty());
        }
    }

    #[test]
    fn subgroup_kernels_validate_with_subgroups() {
        // The one-thread-per-row mat-vecs that share activations through
        // subgroupBroadcast, on a device that has SUBGROUP.
        let mut n = 0;
        for ty in crate::quant::SUPPORTED {
            for spec in crate::ops::matvec_variants(ty, true) {
                if spec.name.contains("SG=on") {
                    validate(&spec, wgpu::Features::SUBGROUP);
                    n += 1;
                }
            }
        }
        assert!(n > 60, "{n} kernels");
        // And the prompt attention with its tokens across the lanes.
        for spec in crate::ops::attention_lanes_specs() {
            validate(&spec, wgpu::Features::SUBGROUP);
        }
    }

    #[test]
    fn f16_cache_kernels_validate_with_shader_f16() {
        let specs = crate::ops::f16_cache_specs();
        assert!(specs.len() > 20, "{} kernels", specs.len());
        for spec in &specs {
            assert!(
                spec.compose().unwrap().contains("enable f16;"),
                "{}",
                spec.name
            );
            validate(spec, wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP);
        }
    }

    #[test]
    fn missing_definition_and_include_are_errors() {
        let spec = KernelSpec::new("matvec.wgsl");
        let err = spec.compose().unwrap_err().to_string();
        assert!(err.contains("no definition"), "{err}");
        let spec = KernelSpec::new("no_such.wgsl");
        assert!(spec
            .compose()
            .unwrap_err()
            .to_string()
            .contains("no shader file"));
    }

    #[test]
    fn params_structs_match_wgsl_sizes() {
        let spec = crate::ops::matvec_spec(
            lamina_gguf::GgmlType::F32,
            1,
            crate::ops::MatvecShape::CANDIDATES[0],
            None,
            None,
            false,
        );
        let module = validate(&spec, wgpu::Features::empty());
        let size_of = |name: &str| -> u32 {
            let (_, ty) = module
                .types
                .iter()
                .find(|(_, t)| t.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no struct {name}"));
            ty.inner.size(module.to_ctx())
        };
        for (name, size) in crate::params::SIZES {
            assert_eq!(size_of(name) as usize, *size, "{name}");
        }
    }
}

#[cfg(test)]
mod device_tests {
    use crate::{Gpu, GpuError, GpuOptions};

    #[test]
    fn a_bad_shader_is_an_error_naming_the_kernel() {
        let gpu = match Gpu::new(GpuOptions::default()) {
            Ok(gpu) => gpu,
            Err(GpuError::NoAdapter { .. }) => return,
            Err(e) => panic!("{e}"),
        };
        let src = "@compute @workgroup_size(1) fn main() { let a: u32 = 1.5; }".to_string();
        match gpu.compile("broken_kernel", src) {
            Err(GpuError::ShaderCompile {
                kernel,
                message,
                wgsl,
            }) => {
                assert_eq!(kernel, "broken_kernel");
                assert!(!message.is_empty());
                assert!(wgsl.contains("1.5"));
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
        // The device is still usable afterwards.
        let t = gpu
            .upload_f32(&[1.0, 2.0])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            gpu.read_f32(&t).unwrap_or_else(|e| panic!("{e}")),
            [1.0, 2.0]
        );
    }
}
