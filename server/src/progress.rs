//! Load progress and memory figures for the commands that load a model.
//!
//! On a terminal, uploads to the GPU show an indicatif bar; elsewhere (logs,
//! CI, pipes) a plain line every quarter, so logs stay readable.

use std::io::IsTerminal as _;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

/// A `(done, total)` callback for weight uploads.
pub fn uploads(quiet: bool) -> impl Fn(u64, u64) {
    let terminal = !quiet && std::io::stderr().is_terminal();
    let bar: Mutex<Option<ProgressBar>> = Mutex::new(None);
    let last_quarter = Mutex::new(0u64);
    move |done: u64, total: u64| {
        if quiet || total == 0 {
            return;
        }
        if terminal {
            let mut guard = bar.lock().unwrap_or_else(|e| e.into_inner());
            let b = guard.get_or_insert_with(|| {
                let b = ProgressBar::new(total);
                if let Ok(style) = ProgressStyle::with_template(
                    "uploading to GPU {bar:40} {binary_bytes}/{binary_total_bytes} {eta}",
                ) {
                    b.set_style(style);
                }
                b
            });
            b.set_position(done);
            if done >= total {
                b.finish_and_clear();
            }
            return;
        }
        let quarter = done * 4 / total;
        let mut last = last_quarter.lock().unwrap_or_else(|e| e.into_inner());
        if quarter > *last {
            *last = quarter;
            eprintln!(
                "uploading to GPU: {}% ({} of {})",
                quarter * 25,
                lamina_model::plan::human_size(done),
                lamina_model::plan::human_size(total)
            );
        }
    }
}

/// Resident memory of this process from `/proc/self/status`, in bytes:
/// (peak resident `VmHWM`, anonymous `RssAnon`, file-backed `RssFile`).
/// `None` where the file does not exist (not Linux).
pub fn memory() -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmHWM:")?, field("RssAnon:")?, field("RssFile:")?))
}
