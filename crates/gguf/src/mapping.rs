//! A read-only file mapping that survives the file being truncated under it.
//!
//! When a mapped file shrinks (`cp new.gguf model.gguf` truncates it before
//! writing), every load from a page past the new end raises SIGBUS, and the
//! default action kills the process, with every request it was serving. The
//! forward pass reads the weights straight from the map, so a truncation can
//! land in the middle of a step, between any checks made around it.
//!
//! [`Map`] registers its address range with a process-wide SIGBUS handler.
//! When a fault's address lies inside a registered range, the handler
//! replaces that whole range, in place, with anonymous zero pages (`mmap`
//! with `MAP_FIXED` over the same addresses), marks the map as lost and
//! returns: the faulting load runs again and reads zeros, as does every later
//! load. Nothing computed from those zeros may be shown: [`Map::lost`] says
//! so, and the caller checks it after each use (`crate::watch`).
//!
//! Why this is sound enough:
//! - The handler does only async-signal-safe things: atomic loads and stores
//!   on a fixed static table (no lock, no allocation), the `mmap` syscall
//!   issued raw (not through a libc wrapper that might take a lock), and
//!   `sigaction`/`raise` for faults that are not ours. Runtimes such as the
//!   JVM handle SIGBUS on truncated mapped files the same way.
//! - SIGBUS from a fault is synchronous: the handler runs on the faulting
//!   thread, before the load completes. A `Map` is only dropped when nothing
//!   borrows its bytes, so no fault can be under way in a range while it is
//!   being unregistered; the table is a seqlock so the handler never acts on
//!   a half-written entry, and skips entries being written (which are never
//!   the live range that faulted).
//! - The bytes behind `&[u8]` turning into zeros is the same hazard every
//!   file map has (another process may change them at any time): `u8` has no
//!   invalid values, so the reader gets wrong numbers, never undefined
//!   values, and the numbers are discarded because `lost()` is set before
//!   the replacement pages are mapped.
//! - Concurrent faults in one range each map zeros over it; the second
//!   replaces zero pages with zero pages, which no reader can tell apart.
//!
//! Only 64-bit Linux has the handler; elsewhere a truncated map still kills
//! the process (change detection in `crate::watch` still works).

use std::fmt;
use std::fs;
use std::io;
use std::ops::Deref;

/// A read-only map of a whole file, registered with the SIGBUS handler.
pub struct Map {
    // Unregistered before the map is unmapped: fields drop in this order.
    region: Option<guard::Region>,
    map: memmap2::Mmap,
}

impl fmt::Debug for Map {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Map")
            .field("len", &self.map.len())
            .field("lost", &self.lost())
            .finish()
    }
}

impl Map {
    /// Maps the first `len` bytes of `file` (its size when it was opened).
    pub fn new(file: &fs::File, len: u64) -> io::Result<Self> {
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        // SAFETY: the map is read-only and private to this struct. A file
        // changed under it gives other bytes (the cost of any file map, and
        // what `crate::watch` detects); a file truncated under it would raise
        // SIGBUS, which the region registered below turns into zero pages.
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(file) }?;
        let region = if map.is_empty() {
            // Nothing to fault on (and no real address to register).
            None
        } else {
            Some(guard::Region::register(&map)?)
        };
        Ok(Self { region, map })
    }

    /// The fault handler replaced this map with zeros: its pages were cut off
    /// (the file was truncated), and whatever read them since is wrong.
    pub fn lost(&self) -> bool {
        self.region.as_ref().is_some_and(guard::Region::lost)
    }
}

impl Deref for Map {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod guard {
    use std::ffi::c_void;
    use std::io;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::{Mutex, OnceLock};

    /// Maps registered at once; opening more fails (with a hint to read
    /// the file instead). Split models have a few shards, not hundreds.
    const SLOTS: usize = 1024;

    struct Slot {
        /// Even while the entry is stable, odd while a writer changes it.
        seq: AtomicUsize,
        start: AtomicUsize,
        /// Page-rounded length; 0: the slot is free.
        len: AtomicUsize,
        lost: AtomicBool,
    }

    static TABLE: [Slot; SLOTS] = [const {
        Slot {
            seq: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            lost: AtomicBool::new(false),
        }
    }; SLOTS];
    /// Serialises writers; the handler never takes it.
    static WRITERS: Mutex<()> = Mutex::new(());
    /// The disposition before ours, to hand faults that are not ours to.
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();

    pub struct Region {
        slot: usize,
    }

    impl Region {
        pub fn register(map: &memmap2::Mmap) -> io::Result<Region> {
            install()?;
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
                .unwrap_or(4096)
                .max(1);
            let start = map.as_ptr() as usize;
            let len = map.len().div_ceil(page) * page;
            let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
            let Some(slot) = TABLE.iter().position(|s| s.len.load(SeqCst) == 0) else {
                return Err(io::Error::other(format!(
                    "more than {SLOTS} files are mapped at once; read them into memory instead"
                )));
            };
            let s = &TABLE[slot];
            s.seq.fetch_add(1, SeqCst);
            s.start.store(start, SeqCst);
            s.len.store(len, SeqCst);
            s.lost.store(false, SeqCst);
            s.seq.fetch_add(1, SeqCst);
            Ok(Region { slot })
        }

        pub fn lost(&self) -> bool {
            TABLE[self.slot].lost.load(SeqCst)
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
            let s = &TABLE[self.slot];
            s.seq.fetch_add(1, SeqCst);
            s.len.store(0, SeqCst);
            s.start.store(0, SeqCst);
            s.seq.fetch_add(1, SeqCst);
        }
    }

    /// Installs the handler once per process.
    fn install() -> io::Result<()> {
        let done = INSTALLED.get_or_init(|| {
            // SAFETY: plain sigaction calls with valid, zero-initialised
            // structs; the handler has the signature SA_SIGINFO requires.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                    return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
                }
                let _ = PREVIOUS.set(old);
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut sa.sa_mask);
                if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
                }
            }
            Ok(())
        });
        done.map_err(|code| {
            io::Error::other(format!(
                "installing the SIGBUS handler that guards file maps: {}",
                io::Error::from_raw_os_error(code)
            ))
        })
    }

    /// The registered (start, len) holding `addr`, if any.
    fn find(addr: usize) -> Option<(&'static Slot, usize, usize)> {
        TABLE.iter().find_map(|s| {
            let seq = s.seq.load(SeqCst);
            if seq % 2 == 1 {
                return None;
            }
            let (start, len) = (s.start.load(SeqCst), s.len.load(SeqCst));
            let stable = s.seq.load(SeqCst) == seq;
            (stable && len != 0 && addr.wrapping_sub(start) < len).then_some((s, start, len))
        })
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo.
        let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
        // si_code > 0: raised by the kernel for a fault, so si_addr is the
        // faulting address (kill(2) and friends send codes <= 0).
        if code > 0 {
            if let Some((slot, start, len)) = find(addr) {
                // Before the pages change, so a reader that sees zeros and
                // then checks is sure to see the flag.
                slot.lost.store(true, SeqCst);
                // SAFETY: [start, start + len) is a live read-only map that
                // this process owns (registered and not yet unregistered);
                // MAP_FIXED replaces it atomically with zero pages of the
                // same protection, which memmap2's munmap later removes.
                // Every argument is a full register's width: the syscall
                // reads six longs.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_mmap,
                        start as libc::c_long,
                        len as libc::c_long,
                        libc::c_long::from(libc::PROT_READ),
                        libc::c_long::from(
                            libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        ),
                        -1 as libc::c_long,
                        0 as libc::c_long,
                    )
                };
                if r as usize == start {
                    return;
                }
            }
        }
        // SAFETY: hands the signal on, as if this handler were not there.
        unsafe { not_ours(sig, info, ctx) }
    }

    /// Passes a SIGBUS that is not a registered map's to the previous
    /// disposition: its handler (Rust's own stack-overflow reporter, for
    /// one), or the default action, restored and raised again (it stays
    /// blocked until this handler returns, then kills the process as an
    /// unhandled SIGBUS would have).
    ///
    /// # Safety
    /// Only from the SIGBUS handler, with the arguments it was given.
    unsafe fn not_ours(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let prev = PREVIOUS.get().copied();
        // SAFETY: see on_sigbus.
        let code = unsafe { (*info).si_code };
        match prev {
            // Ignored and sent by a process: ignore it still. (An ignored
            // fault cannot be ignored: returning would fault again forever,
            // so it takes the default action below, as the kernel would.)
            Some(p) if p.sa_sigaction == libc::SIG_IGN && code <= 0 => {}
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    // SAFETY: a SA_SIGINFO disposition holds this signature.
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                        unsafe { std::mem::transmute(p.sa_sigaction) };
                    f(sig, info, ctx);
                } else {
                    // SAFETY: a plain disposition holds this signature.
                    let f: extern "C" fn(libc::c_int) =
                        unsafe { std::mem::transmute(p.sa_sigaction) };
                    f(sig);
                }
            }
            _ => {
                // SAFETY: sigaction and raise are async-signal-safe.
                unsafe {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                    libc::raise(libc::SIGBUS);
                }
            }
        }
    }
}

/// No handler here: registration is a no-op and a map is never lost (a
/// truncation under it still raises SIGBUS, as before).
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod guard {
    use std::io;

    pub struct Region;

    impl Region {
        pub fn register(_map: &memmap2::Mmap) -> io::Result<Region> {
            Ok(Region)
        }

        pub fn lost(&self) -> bool {
            false
        }
    }
}

#[cfg(all(test, target_os = "linux", target_pointer_width = "64"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::process::ExitStatusExt as _;
    use std::process::Command;

    use super::Map;

    const CHILD: &str = "LAMINA_TEST_FOREIGN_SIGBUS";

    /// A SIGBUS on a map nobody registered is not swallowed: the process
    /// dies of it as it would without the handler. Runs in a child process
    /// (this test binary again), which is expected to die.
    #[test]
    fn a_fault_outside_registered_maps_still_kills() {
        if let Some(dir) = std::env::var_os(CHILD) {
            let dir = std::path::PathBuf::from(dir);
            let ours = dir.join("ours");
            std::fs::write(&ours, vec![1u8; 1 << 16]).unwrap();
            let f = std::fs::File::open(&ours).unwrap();
            // Installs the handler and registers this map.
            let _map = Map::new(&f, 1 << 16).unwrap();
            let theirs = dir.join("theirs");
            std::fs::write(&theirs, vec![1u8; 1 << 16]).unwrap();
            let g = std::fs::File::open(&theirs).unwrap();
            // SAFETY: the test truncates this file on purpose.
            let unregistered = unsafe { memmap2::Mmap::map(&g) }.unwrap();
            std::fs::File::create(&theirs).unwrap();
            let sum: u64 = std::hint::black_box(&unregistered[..])
                .iter()
                .map(|&b| u64::from(b))
                .sum();
            // Not reached: the load above raises SIGBUS.
            std::process::exit(i32::from(sum == 0) + 10);
        }
        let dir =
            std::env::temp_dir().join(format!("lamina-foreign-sigbus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "mapping::tests::a_fault_outside_registered_maps_still_kills",
            ])
            .args(["--test-threads", "1", "--nocapture"])
            .env(CHILD, &dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
