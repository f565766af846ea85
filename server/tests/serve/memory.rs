//! A KV cache larger than the machine: `lamina serve` refuses it at load
//! with one line naming the bytes needed and available, instead of an
//! abort in the allocator or the OOM killer later.

use std::io::Read as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lamina_gguf::{LoadMode, Model};
use lamina_model::{memory, Config};

use super::{common, model};

/// Runs `cmd` to its end, failing the test if it takes over `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_end(&mut stdout);
    }
    Output {
        status,
        stdout,
        stderr: reader.join().unwrap(),
    }
}

#[test]
fn slots_larger_than_memory_are_refused_with_the_bytes() {
    let path = model();
    let c = Config::from_gguf(&Model::open(&path, LoadMode::Mmap).unwrap()).unwrap();
    let train = c.context_length;
    // Slots of the training context each (the most a slot gets), as many
    // as it takes to need twice what this machine has free: at least 200.
    let free = memory::available().expect("MemAvailable").bytes;
    let needed = |np: usize| memory::kv_host_bytes(&c, np, c.n_layer, train).unwrap();
    let mut np = 200;
    while needed(np) <= free.saturating_mul(2) {
        np *= 2;
    }
    let want = needed(np);
    assert_eq!(
        want,
        (np * c.n_layer * 2 * train * c.kv_dim() * 2) as u64,
        "slots x layers x K,V x positions x kv_dim x f16 (the default cache type)"
    );
    let t0 = Instant::now();
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["serve", "-m", &path, "--port", "0", "--ngl", "0"])
            .args(["-np", &np.to_string(), "-c", &(np * train).to_string()])
            .env_remove(memory::SKIP_CHECK_ENV)
            .env("RUST_LOG", "info"),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}\n{err}", out.status);
    let line = err
        .lines()
        .find(|l| l.starts_with("lamina: "))
        .unwrap_or_else(|| panic!("no error line:\n{err}"));
    assert!(line.contains(&format!("needs {want} bytes")), "{line}");
    assert!(line.contains("-c/--ctx-size") && line.contains("-np/--parallel"));
    let available = common::available_bytes(line);
    assert!(available < want, "{line}");
    assert!(!err.contains("listening on"), "{err}");
    let said = err
        .lines()
        .filter(|l| l.contains(&format!("needs {want} bytes")));
    assert_eq!(said.count(), 1, "said once:\n{err}");
    assert!(t0.elapsed() < Duration::from_secs(60));
}
