//! Running a command with a deadline and an output cap, its output read as
//! it comes.
//!
//! The child leads its own process group, and the deadline kills the whole
//! group: `sh -c 'sleep 100 &'` leaves a grandchild holding the output pipe,
//! and killing only the shell would leave the read waiting for it. The
//! child is reaped only after the watchdog has stopped, so the group id it
//! signals cannot have been reused.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How often a cancellable command looks at its flag.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// What a command did.
#[derive(Debug, Clone)]
pub(crate) struct Exec {
    /// Its output (stdout and, when combined, stderr): the bytes, at most
    /// the cap.
    pub raw: Vec<u8>,
    /// Whether output past the cap was dropped.
    pub truncated: bool,
    /// -1 when it was killed by a signal or never started.
    pub exit_code: i32,
    pub timed_out: bool,
}

impl Exec {
    pub fn ok(&self) -> bool {
        self.exit_code == 0 && !self.timed_out
    }

    /// The output as text, then `\n[output truncated]` when it was cut.
    pub fn output(&self) -> String {
        let mut s = String::from_utf8_lossy(&self.raw).into_owned();
        if self.truncated {
            s.push_str("\n[output truncated]");
        }
        s
    }

    fn failed(msg: &str) -> Self {
        Exec {
            raw: msg.as_bytes().to_vec(),
            truncated: false,
            exit_code: -1,
            timed_out: false,
        }
    }
}

/// One command to run.
pub(crate) struct Spawn<'a> {
    pub args: &'a [String],
    pub cwd: Option<&'a str>,
    /// Written to its stdin, which is then closed (else stdin is empty).
    pub stdin: Option<&'a [u8]>,
    pub max_output: usize,
    pub timeout: Duration,
    /// stderr on the same pipe as stdout (else dropped): never for a
    /// file's bytes.
    pub combine_stderr: bool,
}

/// Runs `s`; `on_chunk` gets the output as it is read (whole UTF-8
/// characters) and stops the command by answering `false`.
pub(crate) fn run(s: &Spawn<'_>, on_chunk: Option<&mut dyn FnMut(&str) -> bool>) -> Exec {
    run_cancellable(s, on_chunk, None)
}

/// [`run`], also stopped (within [`CANCEL_POLL`]) once `cancel` is set:
/// a client that went away while the command prints nothing.
pub(crate) fn run_cancellable(
    s: &Spawn<'_>,
    mut on_chunk: Option<&mut dyn FnMut(&str) -> bool>,
    cancel: Option<Arc<AtomicBool>>,
) -> Exec {
    let Some((prog, rest)) = s.args.split_first() else {
        return Exec::failed("failed to spawn process");
    };
    let Ok((mut reader, writer)) = std::io::pipe() else {
        return Exec::failed("failed to spawn process");
    };
    let mut cmd = Command::new(prog);
    cmd.args(rest)
        .stdin(if s.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .process_group(0);
    if s.combine_stderr {
        let Ok(err_writer) = writer.try_clone() else {
            return Exec::failed("failed to spawn process");
        };
        cmd.stderr(err_writer);
    } else {
        cmd.stderr(Stdio::null());
    }
    cmd.stdout(writer);
    if let Some(cwd) = s.cwd.filter(|c| !c.is_empty()) {
        cmd.current_dir(cwd);
    }
    let spawned = cmd.spawn();
    // The command holds our copies of the pipe's write end: without
    // dropping it the read below never sees end-of-file.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("spawning {prog:?}: {e}");
            return Exec::failed("failed to spawn process");
        }
    };
    let pid = child.id() as libc::pid_t;

    // stdin from its own thread: a child that writes before it has read
    // everything would otherwise block on a full pipe while we block on its
    // stdin.
    let feeder = match (s.stdin, child.stdin.take()) {
        (Some(data), Some(mut pipe)) => {
            let data = data.to_vec();
            Some(std::thread::spawn(move || {
                let _ = pipe.write_all(&data);
            }))
        }
        _ => None,
    };

    let timed_out = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = {
        let timed_out = timed_out.clone();
        let timeout = s.timeout;
        let deadline = std::time::Instant::now() + timeout;
        std::thread::spawn(move || loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let wait = if cancel.is_some() {
                left.min(CANCEL_POLL)
            } else {
                left
            };
            match done_rx.recv_timeout(wait) {
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if left <= wait {
                        timed_out.store(true, Ordering::SeqCst);
                        kill_group(pid);
                        return;
                    }
                    if cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst)) {
                        kill_group(pid);
                        return;
                    }
                }
                _ => return,
            }
        })
    };

    let mut out: Vec<u8> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 8192];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // Past the cap the output is still read, else the child blocks on a
        // full pipe.
        if truncated {
            continue;
        }
        let take = n.min(s.max_output.saturating_sub(out.len()));
        out.extend_from_slice(&buf[..take]);
        truncated = take < n;
        if let Some(cb) = on_chunk.as_mut() {
            pending.extend_from_slice(&buf[..take]);
            let text = take_utf8(&mut pending);
            if !text.is_empty() && !cb(&text) {
                kill_group(pid);
                break;
            }
        }
    }
    if let Some(cb) = on_chunk.as_mut() {
        if !pending.is_empty() {
            cb(&String::from_utf8_lossy(&pending));
        }
    }
    drop(reader);

    // Wait for the exit without reaping, so the watchdog's deadline still
    // holds for a child that closed its output and went on running.
    wait_exited(pid);
    let _ = done_tx.send(());
    let _ = watchdog.join();
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let exit_code = child.wait().ok().and_then(|s| s.code()).unwrap_or(-1);

    Exec {
        raw: out,
        truncated,
        exit_code,
        timed_out: timed_out.load(Ordering::SeqCst),
    }
}

/// The longest prefix of `pending` that is whole UTF-8 characters, taken
/// out as text (invalid bytes as U+FFFD); an unfinished character stays.
fn take_utf8(pending: &mut Vec<u8>) -> String {
    let cut = match std::str::from_utf8(pending) {
        Ok(_) => pending.len(),
        // An error with no length: the input ends mid-character.
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => pending.len(),
    };
    let text = String::from_utf8_lossy(&pending[..cut]).into_owned();
    pending.drain(..cut);
    text
}

/// Blocks until `pid` has exited, leaving it to be reaped (a zombie keeps
/// its process group id from being reused).
fn wait_exited(pid: libc::pid_t) {
    loop {
        // SAFETY: siginfo_t is plain data; waitid only writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to that struct; WNOWAIT leaves the child
        // unreaped, so `pid` stays ours.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// SIGKILL to `pid`'s process group (the child and what it started).
fn kill_group(pid: libc::pid_t) {
    // SAFETY: kill has no memory effects; the group is the child's own,
    // which is not reaped yet (see the module docs).
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(cmd: &str, timeout: Duration, max_output: usize) -> Exec {
        let args = vec!["sh".to_owned(), "-c".to_owned(), cmd.to_owned()];
        run(
            &Spawn {
                args: &args,
                cwd: None,
                stdin: None,
                max_output,
                timeout,
                combine_stderr: true,
            },
            None,
        )
    }

    #[test]
    fn output_and_exit_code() {
        let r = sh(
            "echo out; echo err >&2; exit 3",
            Duration::from_secs(10),
            1024,
        );
        assert_eq!(r.output(), "out\nerr\n");
        assert_eq!(r.exit_code, 3);
        assert!(!r.timed_out);
    }

    #[test]
    fn deadline_kills_grandchildren_holding_the_pipe() {
        let t = std::time::Instant::now();
        let r = sh(
            "sleep 30 & echo started; wait",
            Duration::from_millis(500),
            1024,
        );
        assert!(r.timed_out);
        assert!(r.output().starts_with("started"));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn output_is_capped_and_marked() {
        let r = sh("yes | head -c 100000", Duration::from_secs(10), 10);
        assert_eq!(r.output(), "y\ny\ny\ny\ny\n\n[output truncated]");
        assert_eq!(r.exit_code, 0);
    }

    #[test]
    fn chunks_keep_characters_whole() {
        let mut p = vec![b'a', 0xC3];
        assert_eq!(take_utf8(&mut p), "a");
        p.push(0xA9);
        assert_eq!(take_utf8(&mut p), "é");
        assert!(p.is_empty());
    }

    #[test]
    fn missing_program_is_a_failed_spawn() {
        let args = vec!["/nonexistent/program".to_owned()];
        let r = run(
            &Spawn {
                args: &args,
                cwd: None,
                stdin: None,
                max_output: 100,
                timeout: Duration::from_secs(1),
                combine_stderr: true,
            },
            None,
        );
        assert_eq!(r.exit_code, -1);
        assert_eq!(r.output(), "failed to spawn process");
    }
}
