//! Adapter discovery and the device. [`Gpu::new`] opens one adapter with the
//! adapter's own limits (not wgpu's defaults, which cap storage bindings at
//! 128 MiB) and the optional features `SHADER_F16` and `SUBGROUP` where the
//! adapter has them. wgpu's default uncaptured-error handler panics; here every
//! fallible call runs inside an error scope and a fallback handler records
//! anything that escapes, so bad shaders and out-of-memory become
//! [`GpuError`] values.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Serialize;

use crate::error::GpuError;
use crate::shader::Pipeline;

/// What `lamina devices` prints about one adapter: identity and the limits
/// that decide which kernels and tensor sizes it can run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AdapterInfo {
    /// Position in [`list_adapters`] order; pass it as [`GpuOptions::adapter`].
    pub index: usize,
    pub name: String,
    /// `vulkan`, `metal`, `dx12`, `gl` …
    pub backend: String,
    /// `discrete`, `integrated`, `virtual`, `cpu` or `other`.
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    /// Whether the adapter runs compute shaders at all (some GL adapters do not).
    pub compute: bool,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub shader_f16: bool,
    pub subgroups: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    /// Device-local memory the driver says this process may still use (its
    /// budget less its usage, over the device-local heaps), and those
    /// heaps' size: from Vulkan's `VK_EXT_memory_budget` where the driver
    /// has it; `None` where nothing answers (other backends, older drivers).
    pub free_memory: Option<u64>,
    pub device_memory: Option<u64>,
}

/// Free and total device-local memory as the driver reports them.
#[derive(Clone, Copy, Debug)]
struct Budget {
    free: u64,
    size: u64,
}

/// Asks a Vulkan adapter's driver how much device-local memory this process
/// may still allocate (`VK_EXT_memory_budget`): wgpu reports limits, not
/// free memory, and a fixed guess is what makes layers spill to the CPU
/// while memory is free, or the first prompt run out. The extension's
/// budget already accounts for other processes on the device.
fn memory_budget(adapter: &wgpu::Adapter) -> Option<Budget> {
    use ash::vk;
    // SAFETY: the guard is dropped before this returns, and only queries
    // that take the physical device read-only are made through it.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let caps = hal.physical_device_capabilities();
    let shared = hal.shared_instance();
    if !caps.supports_extension(ash::ext::memory_budget::NAME)
        || shared.instance_api_version() < vk::API_VERSION_1_1
        || caps.properties().api_version < vk::API_VERSION_1_1
    {
        return None;
    }
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
    // SAFETY: Vulkan 1.1 on both the instance and the device (checked
    // above) makes vkGetPhysicalDeviceMemoryProperties2 core, and the
    // device has the extension whose struct is chained.
    unsafe {
        shared
            .raw_instance()
            .get_physical_device_memory_properties2(hal.raw_physical_device(), &mut props);
    }
    let mem = props.memory_properties;
    let heaps = mem.memory_heap_count.min(vk::MAX_MEMORY_HEAPS as u32) as usize;
    let (mut free, mut size) = (0u64, 0u64);
    for i in 0..heaps {
        if mem.memory_heaps[i]
            .flags
            .contains(vk::MemoryHeapFlags::DEVICE_LOCAL)
        {
            size = size.saturating_add(mem.memory_heaps[i].size);
            free = free.saturating_add(budget.heap_budget[i].saturating_sub(budget.heap_usage[i]));
        }
    }
    (size > 0).then_some(Budget { free, size })
}

impl AdapterInfo {
    fn from_adapter(index: usize, adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features = adapter.features();
        let downlevel = adapter.get_downlevel_capabilities();
        let subgroups = features.contains(wgpu::Features::SUBGROUP);
        let budget = memory_budget(adapter);
        AdapterInfo {
            index,
            name: info.name,
            backend: info.backend.to_str().to_string(),
            device_type: match info.device_type {
                wgpu::DeviceType::DiscreteGpu => "discrete",
                wgpu::DeviceType::IntegratedGpu => "integrated",
                wgpu::DeviceType::VirtualGpu => "virtual",
                wgpu::DeviceType::Cpu => "cpu",
                wgpu::DeviceType::Other => "other",
            }
            .to_string(),
            driver: info.driver,
            driver_info: info.driver_info,
            compute: downlevel
                .flags
                .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS),
            max_buffer_size: limits.max_buffer_size,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_compute_workgroup_size_x: limits.max_compute_workgroup_size_x,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups,
            subgroup_min_size: if subgroups { info.subgroup_min_size } else { 0 },
            subgroup_max_size: if subgroups { info.subgroup_max_size } else { 0 },
            free_memory: budget.map(|b| b.free),
            device_memory: budget.map(|b| b.size),
        }
    }

    /// Preference when no adapter is named: real GPUs before software ones.
    fn rank(&self) -> u32 {
        let ty = match self.device_type.as_str() {
            "discrete" => 0,
            "integrated" => 1,
            "virtual" => 2,
            "cpu" => 3,
            _ => 4,
        };
        // GL last within a kind: its compute support is the least complete.
        ty * 2 + u32::from(self.backend == "gl")
    }
}

impl fmt::Display for AdapterInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        writeln!(
            f,
            "[{}] {} ({}, {})",
            self.index, self.name, self.backend, self.device_type
        )?;
        writeln!(f, "    driver: {} {}", self.driver, self.driver_info)?;
        writeln!(
            f,
            "    compute: {}   shader-f16: {}   subgroups: {}",
            yes_no(self.compute),
            yes_no(self.shader_f16),
            if self.subgroups {
                format!(
                    "yes ({}..{})",
                    self.subgroup_min_size, self.subgroup_max_size
                )
            } else {
                "no".to_string()
            }
        )?;
        writeln!(
            f,
            "    max buffer: {:.0} MiB   max storage binding: {:.0} MiB",
            mib(self.max_buffer_size),
            mib(self.max_storage_buffer_binding_size)
        )?;
        write!(
            f,
            "    workgroup: size x ≤ {}, invocations ≤ {}, storage ≤ {} B, groups/dim ≤ {}",
            self.max_compute_workgroup_size_x,
            self.max_compute_invocations_per_workgroup,
            self.max_compute_workgroup_storage_size,
            self.max_compute_workgroups_per_dimension
        )
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// How to open the device.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Index into [`list_adapters`]; `None` picks the best adapter with compute
    /// (discrete, then integrated, then software).
    pub adapter: Option<usize>,
    /// Use at most this many bytes per storage binding even if the adapter
    /// allows more. Tests set it low (e.g. 1 MiB) to exercise the splitting
    /// of large weights; it never raises the adapter's own limit.
    pub max_storage_buffer_binding_size: Option<u64>,
    /// Do not request `SHADER_F16` and `SUBGROUP` even where available.
    pub portable: bool,
    /// Fold the RMSNorm into the products that consume it and the residual
    /// add into the products that feed it ([`Gpu::norm_prologue`]); `None`
    /// takes `LAMINA_GPU_NORM_PROLOGUE` (0 or 1) if set, else the device's
    /// default.
    pub norm_prologue: Option<bool>,
    /// On a CPU-backed device, let the product before each RMSNorm run it
    /// in its last workgroup ([`Gpu::norm_epilogue`]); `None` takes
    /// `LAMINA_GPU_NORM_EPILOGUE` (0 or 1) if set, else on.
    pub norm_epilogue: Option<bool>,
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

fn adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .into_iter()
        .filter(|a| a.get_info().backend != wgpu::Backend::Noop)
        .collect()
}

/// Every adapter wgpu finds on this machine, in a stable order.
pub fn list_adapters() -> Vec<AdapterInfo> {
    adapters(&instance())
        .iter()
        .enumerate()
        .map(|(i, a)| AdapterInfo::from_adapter(i, a))
        .collect()
}

/// An on/off choice: the option if the caller set it, else the
/// environment variable `var` (0 or 1; anything else is an error), else
/// `default`.
fn switch(
    opt: Option<bool>,
    var: &str,
    default: bool,
    info: &AdapterInfo,
) -> Result<bool, GpuError> {
    match (opt, std::env::var(var)) {
        (Some(on), _) => Ok(on),
        (None, Ok(v)) if v == "0" || v == "1" => Ok(v == "1"),
        (None, Ok(v)) => Err(GpuError::RequestDevice {
            adapter: info.name.clone(),
            message: format!("{var}={v:?} is not 0 or 1"),
        }),
        (None, Err(_)) => Ok(default),
    }
}

pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    pollster::block_on(f)
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it: every
/// structure guarded here stays consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Errors that escaped every error scope (wgpu reports some of them from
/// other threads or at submit time).
#[derive(Default)]
struct Escaped {
    errors: Vec<String>,
    lost: Option<String>,
}

/// An open device with its queue, limits and compiled kernels.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: AdapterInfo,
    features: wgpu::Features,
    limits: wgpu::Limits,
    binding_limit: u64,
    escaped: Arc<Mutex<Escaped>>,
    matvec: Option<crate::ops::MatvecShape>,
    lane_broadcast: bool,
    norm_prologue: bool,
    norm_epilogue: bool,
    attn_lanes: bool,
    /// Per-kernel (dispatches, seconds) when `LAMINA_GPU_PROFILE` is set.
    pub(crate) profile: Option<Mutex<HashMap<String, (u64, f64)>>>,
    /// Dispatches and submissions since the device was opened.
    pub(crate) dispatched: std::sync::atomic::AtomicU64,
    pub(crate) submitted: std::sync::atomic::AtomicU64,
    pub(crate) pipelines: Mutex<HashMap<String, Arc<Pipeline>>>,
    /// The parameter buffer and recent bind groups, shared by submissions.
    pub(crate) binds: Mutex<crate::ops::BindCache>,
    /// Mappable buffers kept for readbacks ([`Gpu::take_staging`]), so a
    /// step's logits or picks come back without a buffer made for them.
    pub(crate) staging: Mutex<Vec<wgpu::Buffer>>,
    /// Buffer allocations still to fail ([`Gpu::fail_next_allocations`]).
    pub(crate) failing: std::sync::atomic::AtomicUsize,
}

/// Host-side work of the submissions since the device was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCounters {
    /// Seconds from the start of each batch's recording to its submission.
    pub seconds: f64,
    /// Bind groups made, and reused from an earlier submission.
    pub bind_groups_made: u64,
    pub bind_groups_reused: u64,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("binding_limit", &self.binding_limit)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens the adapter `opts` names (or the best one) with its own limits.
    pub fn new(opts: GpuOptions) -> Result<Gpu, GpuError> {
        let instance = instance();
        let all = adapters(&instance);
        let infos: Vec<AdapterInfo> = all
            .iter()
            .enumerate()
            .map(|(i, a)| AdapterInfo::from_adapter(i, a))
            .collect();
        let index = match opts.adapter {
            Some(index) if index < all.len() => index,
            Some(index) => {
                return Err(GpuError::AdapterIndex {
                    index,
                    count: all.len(),
                })
            }
            None => infos
                .iter()
                .filter(|info| info.compute)
                .min_by_key(|info| (info.rank(), info.index))
                .map(|info| info.index)
                .ok_or_else(|| GpuError::NoAdapter {
                    backends: format!("{:?}", wgpu::Instance::enabled_backend_features()),
                })?,
        };
        let (adapter, info) = (&all[index], infos[index].clone());
        if !info.compute {
            return Err(GpuError::RequestDevice {
                adapter: info.name,
                message: "adapter has no compute shaders".into(),
            });
        }

        let mut features = wgpu::Features::empty();
        if !opts.portable {
            features |=
                adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP);
        }
        let limits = adapter.limits();
        let (device, queue) = block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("lamina"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| GpuError::RequestDevice {
            adapter: info.name.clone(),
            message: e.to_string(),
        })?;

        // Read before the device is made, so a typo fails fast and names itself.
        let matvec =
            match std::env::var("LAMINA_GPU_MATVEC") {
                Ok(v) => Some(crate::ops::MatvecShape::parse(&v).ok_or_else(|| {
                    GpuError::RequestDevice {
                        adapter: info.name.clone(),
                        message: format!(
                            "LAMINA_GPU_MATVEC={v:?} is not `tpr,rpt,wg` with tpr a power of two \
                         ≤ 32, rpt 1..=4, wg a power of two in tpr..=256"
                        ),
                    }
                })?),
                Err(_) => None,
            };
        let escaped = Arc::new(Mutex::new(Escaped::default()));
        let sink = escaped.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).errors.push(e.to_string());
        }));
        let sink = escaped.clone();
        device.set_device_lost_callback(move |reason, message| {
            lock(&sink).lost = Some(format!("{reason:?}: {message}"));
        });

        let device_limits = device.limits();
        let mut binding_limit = device_limits.max_storage_buffer_binding_size;
        if let Some(cap) = opts.max_storage_buffer_binding_size {
            binding_limit = binding_limit.min(cap);
        }
        // Buffers are also bounded by max_buffer_size; weights are split to fit both.
        binding_limit = binding_limit.min(device_limits.max_buffer_size);

        // A hardware GPU pays a few microseconds per dispatch (a barrier
        // between dependent ones), and the prologue's reduction is a few
        // hundred cycles of a workgroup beside its weight stream. A
        // CPU-backed device runs the prologue's partial sums as per-lane
        // loads and its tree as coroutine switches in every workgroup, so
        // on lavapipe decoding and prompts both slowed with it
        // (docs/perf/lavapipe.md, 2026-12-05): there the last workgroup of
        // the product before each norm runs it instead (ops::NormAfter),
        // and prompts keep the separate kernels. A barrier-free prologue
        // (each subgroup of 8 computing the canonical partials itself and
        // joining them by subgroupBroadcast, the same bits) did no better,
        // because all eight subgroups of every workgroup repeat the K
        // loads, which lavapipe gathers lane by lane (each gate/up dispatch
        // gained about what the separate norm dispatch costs).
        let norm_prologue = switch(
            opts.norm_prologue,
            "LAMINA_GPU_NORM_PROLOGUE",
            info.device_type != "cpu",
            &info,
        )?;
        // Only where workgroups are threads sharing memory: see
        // shaders/common/norm_epi_on.wgsl.
        let norm_epilogue = info.device_type == "cpu"
            && switch(opts.norm_epilogue, "LAMINA_GPU_NORM_EPILOGUE", true, &info)?;
        let lane_broadcast = device.features().contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size >= 8
            && std::env::var_os("LAMINA_GPU_NO_LANE_BROADCAST").is_none();
        // See shaders/attention_lanes.wgsl: a prompt's attention with its
        // tokens across the SIMD lanes, where loads are lane by lane.
        let attn_lanes = info.device_type == "cpu"
            && lane_broadcast
            && switch(None, "LAMINA_GPU_ATTN_LANES", true, &info)?;
        Ok(Gpu {
            features: device.features(),
            device,
            queue,
            info,
            limits: device_limits,
            binding_limit,
            escaped,
            matvec,
            lane_broadcast,
            norm_prologue,
            norm_epilogue,
            attn_lanes,
            dispatched: Default::default(),
            submitted: Default::default(),
            profile: std::env::var_os("LAMINA_GPU_PROFILE").map(|_| Mutex::new(HashMap::new())),
            pipelines: Mutex::new(HashMap::new()),
            binds: Default::default(),
            staging: Mutex::new(Vec::new()),
            failing: Default::default(),
        })
    }

    /// (dispatches, submissions) since the device was opened: the host-side
    /// cost of a step, which `lamina bench model` prints per token.
    pub fn counters(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.dispatched.load(Relaxed), self.submitted.load(Relaxed))
    }

    /// The host's share of the submissions so far: `lamina bench model`
    /// prints it per token.
    pub fn host_counters(&self) -> HostCounters {
        let c = lock(&self.binds);
        HostCounters {
            seconds: c.host_ns as f64 * 1e-9,
            bind_groups_made: c.made,
            bind_groups_reused: c.reused,
        }
    }

    /// With `LAMINA_GPU_PROFILE` set, every dispatch is submitted alone and
    /// waited for, and its wall time added to its kernel's entry: a profile
    /// of where a step's time goes (slower than normal running, since
    /// nothing overlaps). Returns (kernel, dispatches, seconds), slowest
    /// first, and clears the counts; `None` without the variable.
    pub fn take_profile(&self) -> Option<Vec<(String, u64, f64)>> {
        let mut map = lock(self.profile.as_ref()?);
        let mut v: Vec<_> = map.drain().map(|(k, (n, s))| (k, n, s)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        Some(v)
    }

    /// The mat-vec thread shape `LAMINA_GPU_MATVEC` forces, if set.
    pub(crate) fn matvec_override(&self) -> Option<crate::ops::MatvecShape> {
        self.matvec
    }

    /// Whether one-thread-per-row kernels may share a unit's activations
    /// through subgroupBroadcast: subgroups enabled, of at least 8
    /// invocations (`LAMINA_GPU_NO_LANE_BROADCAST` turns it off, to compare).
    pub fn lane_broadcast(&self) -> bool {
        self.lane_broadcast
    }

    /// Whether the forward pass folds each RMSNorm into the products that
    /// consume it and the residual adds into the products that feed them
    /// (`lamina_gpu::Fuse`), where those products run the mat-vec or
    /// small-N kernels: two dispatches fewer per block, the same bits.
    pub fn norm_prologue(&self) -> bool {
        self.norm_prologue
    }

    /// Whether a residual-add product may norm its result in its last
    /// workgroup (`lamina_gpu::NormAfter`): CPU-backed devices only.
    pub fn norm_epilogue(&self) -> bool {
        self.norm_epilogue
    }

    /// Whether a prompt's attention may run with one invocation per
    /// (token, head), the tokens across a subgroup's lanes
    /// (`shaders/attention_lanes.wgsl`): CPU-backed devices with the lane
    /// broadcast; `LAMINA_GPU_ATTN_LANES=0` turns it off, to compare.
    pub fn attn_lanes(&self) -> bool {
        self.attn_lanes
    }

    /// The adapter this device was opened on.
    pub fn adapter_info(&self) -> &AdapterInfo {
        &self.info
    }

    /// Makes the next `n` buffer allocations fail as out of memory, as a
    /// device whose memory ran out fails them: how the tests check what a
    /// failed allocation does to a running request (it fails alone, and
    /// the server answers 503 and goes on).
    pub fn fail_next_allocations(&self, n: usize) {
        self.failing.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether kernels may use f16 (`SHADER_F16` is enabled): f16 KV caches.
    pub fn has_f16(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F16)
    }

    /// Features enabled on the device (a subset of `SHADER_F16 | SUBGROUP`).
    pub fn features(&self) -> wgpu::Features {
        self.features
    }

    /// The device's limits (the adapter's own, as requested).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// Largest byte size one storage binding may have here: the device limit,
    /// or the smaller cap from [`GpuOptions::max_storage_buffer_binding_size`].
    pub fn binding_limit(&self) -> u64 {
        self.binding_limit
    }

    /// The underlying wgpu device, for callers that encode their own work.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The device's queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Runs `f` inside out-of-memory and validation error scopes and turns what
    /// they catch (and anything the fallback handler saw meanwhile) into a
    /// [`GpuError`] about `what`.
    pub(crate) fn scoped<T>(
        &self,
        what: &str,
        bytes: u64,
        f: impl FnOnce() -> T,
    ) -> Result<T, GpuError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let value = f();
        let internal = block_on(internal.pop());
        let validation = block_on(validation.pop());
        let oom = block_on(oom.pop());
        if let Some(e) = oom.or(validation).or(internal) {
            return Err(GpuError::from_wgpu(what, bytes, e));
        }
        self.check_escaped(what)?;
        Ok(value)
    }

    /// Reports errors that reached the fallback handler, and a lost device.
    pub(crate) fn check_escaped(&self, what: &str) -> Result<(), GpuError> {
        let mut escaped = lock(&self.escaped);
        if let Some(message) = escaped.lost.clone() {
            return Err(GpuError::DeviceLost { message });
        }
        if !escaped.errors.is_empty() {
            let message = escaped.errors.join("; ");
            escaped.errors.clear();
            return Err(GpuError::Validation {
                what: what.to_string(),
                message,
            });
        }
        Ok(())
    }

    /// Blocks until all submitted work has finished.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::DeviceLost {
                message: e.to_string(),
            })?;
        self.check_escaped("queued work")
    }
}
