//! Sets `lamina_avx512` where the compiler has the AVX-512 target features and
//! intrinsics stable (Rust 1.89), so the crate still builds on older compilers back
//! to its `rust-version`, with the AVX2 kernels only.

use std::process::Command;

/// The first Rust release with stable AVX-512 intrinsics.
const AVX512_MINOR: u32 = 89;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(lamina_avx512)");
    println!("cargo::rerun-if-env-changed=RUSTC");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|v| minor_version(&v));
    if minor.is_some_and(|m| m >= AVX512_MINOR) {
        println!("cargo::rustc-cfg=lamina_avx512");
    }
}

/// `rustc 1.95.0 (59807616e 2026-04-14)` → 95.
fn minor_version(version: &str) -> Option<u32> {
    let number = version.split_whitespace().nth(1)?;
    let mut parts = number.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
