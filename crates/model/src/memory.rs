//! Host memory for the KV cache, counted before it is allocated.
//!
//! A cache too big for the machine used to end in `memory allocation of …
//! bytes failed` and an abort, or, with Linux overcommit, in the OOM killer
//! once the pages were touched. So the caches' bytes are computed first with
//! checked arithmetic and compared with what the machine can give
//! (`MemAvailable`, and the cgroup v2 limit where one is set), and the
//! allocations themselves are fallible: a wrong estimate still ends in an
//! error, not an abort.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::error::ModelError;

/// Set (to anything but `0` or empty) to skip the comparison with the
/// machine's free memory: for swap, zram or memory the kernel will free but
/// does not count as available. The allocations stay fallible. An
/// environment variable rather than a flag, because `run`, `serve`, `bench`
/// and `score` all make caches and one switch covers them without another
/// option on each command.
pub const SKIP_CHECK_ENV: &str = "LAMINA_NO_MEMORY_CHECK";

/// Bytes kept free besides the mapped weights: each step's activations and
/// logits, rayon's and the HTTP side's threads, the allocator's slack.
pub const RUNTIME_RESERVE: u64 = 256 << 20;

/// Bytes of `count` caches of `n_ctx` positions over the first `n_layers`
/// layers held in host memory: keys and values, `kv_dim` values per row
/// each, in the config's cache types; a sliding-window layer keeps only its
/// ring's rows ([`crate::kv::layer_rows`]).
pub fn kv_host_bytes(
    c: &Config,
    count: usize,
    n_layers: usize,
    n_ctx: usize,
) -> Result<u64, ModelError> {
    let overflow = || ModelError::KvOverflow {
        count,
        n_ctx,
        n_layers,
    };
    let rows = (0..n_layers)
        .map(|il| crate::kv::layer_rows(c, il, n_ctx) as u64)
        .try_fold(0u64, |acc, r| acc.checked_add(r))
        .ok_or_else(overflow)?;
    let values = [count as u64, rows, c.kv_dim() as u64]
        .iter()
        .try_fold(1u64, |acc, &x| acc.checked_mul(x))
        .ok_or_else(overflow)?;
    // Both types' bytes of `values` elements, each no more than 4 per value.
    let kv = values
        .checked_mul(4)
        .map(|_| c.kv.k.bytes(values) + c.kv.v.bytes(values))
        .ok_or_else(overflow)?;
    // Each sequence's recurrent states and the budget of their checkpoints:
    // every recurrent layer's, the GPU layers' as the host's copy of them.
    let state = state_bytes(c, c.n_layer);
    (count as u64)
        .checked_mul(state)
        .and_then(|s| s.checked_add(kv))
        .ok_or_else(overflow)
}

/// Host bytes one sequence's recurrent state takes over the first
/// `n_layers` layers: the states, and the checkpoints' budget where there
/// are any (`kv/state.rs`); 0 for a model without recurrent layers.
pub fn state_bytes(c: &Config, n_layers: usize) -> u64 {
    let states: u64 = (0..n_layers).map(|il| c.state_len(il) as u64 * 4).sum();
    if states == 0 {
        0
    } else {
        states.saturating_add(c.kv.checkpoint_bytes)
    }
}

/// What the machine can give now, and where the figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Available {
    pub bytes: u64,
    pub source: &'static str,
}

/// `MemAvailable`, or less where this process's cgroup (or one above it)
/// has a `memory.max`. `None` where neither can be read (not Linux).
pub fn available() -> Option<Available> {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| parse_meminfo(&s))
        .map(|bytes| Available {
            bytes,
            source: "MemAvailable",
        });
    let cg = cgroup_available().map(|bytes| Available {
        bytes,
        source: "cgroup memory.max less memory.current",
    });
    match (mem, cg) {
        (Some(m), Some(c)) => Some(if c.bytes < m.bytes { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// `MemAvailable:` of `/proc/meminfo`, in bytes.
pub fn parse_meminfo(s: &str) -> Option<u64> {
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut it = line["MemAvailable:".len()..].split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        _ => None,
    }
}

/// The room a cgroup v2 leaves: `memory.max − memory.current`, plus its
/// inactive file pages (page cache the kernel reclaims before it would
/// kill, as the working-set figure of container runtimes counts it).
/// `None` for no limit (`max`) or unreadable files.
pub fn cgroup_room(max: &str, current: &str, stat: Option<&str>) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    let current: u64 = current.trim().parse().ok()?;
    let inactive = stat
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("inactive_file "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    Some(max.saturating_sub(current.saturating_sub(inactive)))
}

/// The tightest room over this process's cgroup and its ancestors.
fn cgroup_available() -> Option<u64> {
    let root = Path::new("/sys/fs/cgroup");
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    let mut dir: PathBuf = root.join(rel.trim_start_matches('/'));
    let mut best: Option<u64> = None;
    loop {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        if let (Some(max), Some(cur)) = (read("memory.max"), read("memory.current")) {
            if let Some(room) = cgroup_room(&max, &cur, read("memory.stat").as_deref()) {
                best = Some(best.map_or(room, |b| b.min(room)));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    best
}

fn skip_check() -> bool {
    std::env::var_os(SKIP_CHECK_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Refuses `needed` bytes of cache when the machine cannot give them and
/// still keep `reserve` bytes free. Passes where the free memory cannot be
/// read, or [`SKIP_CHECK_ENV`] is set.
pub fn check_host(needed: u64, reserve: u64) -> Result<(), ModelError> {
    if skip_check() {
        return Ok(());
    }
    match available() {
        Some(a) => check_against(needed, reserve, a),
        None => Ok(()),
    }
}

/// [`check_host`] against a given figure.
pub fn check_against(needed: u64, reserve: u64, a: Available) -> Result<(), ModelError> {
    if needed.saturating_add(reserve) <= a.bytes {
        return Ok(());
    }
    Err(ModelError::HostMemory {
        needed,
        available: a.bytes,
        reserve,
        measure: a.source,
    })
}

/// `n` copies of `zero` (a cache's f32, f16 or q8_0 elements), or an error
/// naming the bytes instead of an abort when the allocator refuses them.
pub fn try_filled<T: Clone>(n: usize, zero: T) -> Result<Vec<T>, ModelError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| ModelError::Alloc {
        bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    v.resize(n, zero);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config {
            arch: crate::Arch::Llama,
            n_layer: 30,
            n_embd: 576,
            n_head: 9,
            n_head_kv: 3,
            head_dim: 64,
            n_ff: 1536,
            n_vocab: 49152,
            context_length: 8192,
            rms_eps: 1e-5,
            rope_dim: 64,
            rope_base: 1e5,
            rope_neox: false,
            sliding_window: None,
            rope_base_swa: 1e5,
            rope_scale: 1.0,
            rope_factors: None,
            long_rope: None,
            rope_mscale: 1.0,
            embed_scale: None,
            qk_norm: false,
            post_norms: false,
            qkv_bias: false,
            activation: crate::Activation::SwiGlu,
            attn_scale: 0.125,
            kv: Default::default(),
            moe: None,
            recurrent: None,
            attn_gate: false,
            n_layer_nextn: 0,
        }
    }

    #[test]
    fn kv_bytes_are_slots_layers_k_and_v_positions_and_width() {
        let c = cfg();
        // SmolLM2-135M: 200 slots of 8192 positions, 30 layers, kv_dim 192.
        // In the default f16, two bytes a value.
        assert_eq!(
            kv_host_bytes(&c, 200, 30, 8192).unwrap(),
            200 * 30 * 2 * 8192 * 192 * 2
        );
        assert_eq!(kv_host_bytes(&c, 4, 0, 4096).unwrap(), 0);
        // f32 keys and q8_0 values: 4 bytes, then 34 per 32 values.
        let mixed = Config {
            kv: crate::KvTypes {
                k: crate::KvType::F32,
                v: crate::KvType::Q8_0,
                ..Default::default()
            },
            ..c
        };
        assert_eq!(
            kv_host_bytes(&mixed, 1, 30, 8192).unwrap(),
            30 * 8192 * (192 * 4 + 192 / 32 * 34)
        );
    }

    #[test]
    fn kv_bytes_overflow_is_an_error() {
        let c = cfg();
        let e = kv_host_bytes(&c, 1, 30, usize::MAX).unwrap_err();
        assert!(matches!(e, ModelError::KvOverflow { n_ctx, .. } if n_ctx == usize::MAX));
        assert!(kv_host_bytes(&c, usize::MAX / 2, 30, 8192).is_err());
        assert!(e.to_string().contains("-c/--ctx-size"), "{e}");
    }

    #[test]
    fn the_check_names_needed_and_available_bytes() {
        let a = Available {
            bytes: 1000,
            source: "MemAvailable",
        };
        assert!(check_against(900, 100, a).is_ok());
        let e = check_against(901, 100, a).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("901 bytes") && msg.contains("1000 bytes"),
            "{msg}"
        );
        assert!(msg.contains("-np/--parallel") && msg.contains(SKIP_CHECK_ENV));
        // A sum past u64 is refused, not wrapped.
        assert!(check_against(u64::MAX, 1, a).is_err());
    }

    #[test]
    fn meminfo_and_cgroup_files_parse() {
        let s = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(s), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        assert_eq!(cgroup_room("max\n", "100\n", None), None);
        assert_eq!(cgroup_room("1000\n", "400\n", None), Some(600));
        let stat = "anon 300\nfile 100\ninactive_file 50\n";
        assert_eq!(cgroup_room("1000", "400", Some(stat)), Some(650));
        assert_eq!(cgroup_room("1000", "4000", None), Some(0));
    }

    #[test]
    fn a_refused_allocation_is_an_error() {
        assert_eq!(try_filled(3, 0.0f32).unwrap(), [0.0; 3]);
        let e = try_filled(usize::MAX / 4, 0.0f32).unwrap_err();
        assert!(matches!(e, ModelError::Alloc { .. }), "{e}");
    }
}
