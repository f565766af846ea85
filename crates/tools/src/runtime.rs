//! Tool runtimes: where the tools run instead of the server's host.
//!
//! - `docker-container:<id>`, `podman-container:<id>`: a running container,
//!   driven through `<engine> exec` (the `x-tool-runtime` header or
//!   `--tools-runtime`);
//! - `ssh:<target>`: a POSIX host over ssh, key-based auth and a host key
//!   trusted beforehand (remoting, not isolation: the tools can do what
//!   that account can);
//! - `docker:<image>`, `podman:<image>` (`--tools-runtime` only): a
//!   container started with the server, reused by every call, restarted if
//!   it dies, stopped (and, run with `--rm`, removed) when the server stops.
//!
//! A container id and an ssh target land on our command line, so one that
//! starts with `-` (or holds anything but a few safe characters) is refused:
//! `ssh -oProxyCommand=...` would run a command on this host, and
//! `docker exec --privileged` is not what was asked.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::RuntimeError;

const ENGINES: [&str; 2] = ["docker", "podman"];

/// How to run a command in an isolate.
#[derive(Debug, Clone)]
pub(crate) enum Isolate {
    Container { engine: &'static str, id: String },
    Ssh { target: String },
}

impl Isolate {
    /// The host-side argv that runs `inner` (a complete POSIX argv) there.
    pub fn argv(&self, inner: &[String], stdin: bool) -> Vec<String> {
        match self {
            Isolate::Container { engine, id } => {
                let mut v = vec![(*engine).to_owned(), "exec".to_owned()];
                if stdin {
                    v.push("-i".to_owned());
                }
                v.push(id.clone());
                v.extend_from_slice(inner);
                v
            }
            Isolate::Ssh { target } => {
                // No console: a prompt would hang the call.
                let mut v: Vec<String> = [
                    "ssh",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "PasswordAuthentication=no",
                    "-o",
                    "KbdInteractiveAuthentication=no",
                    "-o",
                    "StrictHostKeyChecking=yes",
                ]
                .map(str::to_owned)
                .to_vec();
                if !stdin {
                    v.push("-n".to_owned());
                }
                v.push(target.clone());
                // The remote shell parses the command line again: one
                // quoted word.
                v.push(shell_quote_join(inner));
                v
            }
        }
    }
}

/// `<engine>-container:<id>` (attach) or `<engine>:<image>` (spawn).
fn parse_container(spec: &str) -> Option<(&'static str, &str, bool)> {
    for engine in ENGINES {
        if let Some(rest) = spec.strip_prefix(engine) {
            if let Some(id) = rest.strip_prefix("-container:") {
                return Some((engine, id, true));
            }
            if let Some(image) = rest.strip_prefix(':') {
                return Some((engine, image, false));
            }
        }
    }
    None
}

/// A container id or name: starts with a letter or digit, then letters,
/// digits, `.`, `-`, `_`.
fn valid_container_id(id: &str) -> bool {
    id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// `[user@]host`: no leading `-`, letters, digits, `.`, `-`, `_`, `@`.
fn valid_ssh_target(t: &str) -> bool {
    !t.is_empty()
        && !t.starts_with('-')
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'))
}

/// An image reference: no leading `-`, and only what references hold.
fn valid_image(image: &str) -> bool {
    image
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && image
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | ':' | '@'))
}

/// The isolate a call's runtime spec names.
pub(crate) fn attach(spec: &str) -> Result<Isolate, RuntimeError> {
    if let Some((engine, arg, attach)) = parse_container(spec) {
        if !attach {
            return Err(RuntimeError::NotRunning(spec.to_owned()));
        }
        if !valid_container_id(arg) {
            return Err(RuntimeError::InvalidContainerId(arg.to_owned()));
        }
        return Ok(Isolate::Container {
            engine,
            id: arg.to_owned(),
        });
    }
    if let Some(target) = spec.strip_prefix("ssh:") {
        if !valid_ssh_target(target) {
            return Err(RuntimeError::InvalidSshTarget(target.to_owned()));
        }
        return Ok(Isolate::Ssh {
            target: target.to_owned(),
        });
    }
    Err(RuntimeError::Unknown(spec.to_owned()))
}

/// Quotes `argv` into one string a POSIX shell parses back into `argv`.
fn shell_quote_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `--tools-runtime`: a fixed target, or a container it owns.
#[derive(Debug)]
pub enum Runtime {
    /// An existing target, checked once at startup.
    Static(String),
    /// `<engine>:<image>`: started here, stopped on [`Runtime::stop`].
    Owned(Mutex<Owned>),
}

#[derive(Debug)]
pub struct Owned {
    engine: &'static str,
    image: String,
    id: String,
    /// The `<engine> run -i ... sh` client: the container's shell reads
    /// its stdin, so it lives until that is closed.
    child: Option<Child>,
}

impl Runtime {
    /// Checks `spec`, and starts the container an `<engine>:<image>` names.
    pub fn start(spec: &str) -> Result<Runtime, RuntimeError> {
        if let Some((engine, image, false)) = parse_container(spec) {
            if image.is_empty() {
                return Err(RuntimeError::NoImage {
                    engine: engine.to_owned(),
                });
            }
            if !valid_image(image) {
                return Err(RuntimeError::InvalidImage(image.to_owned()));
            }
            let mut owned = Owned {
                engine,
                image: image.to_owned(),
                id: String::new(),
                child: None,
            };
            owned.spawn()?;
            return Ok(Runtime::Owned(Mutex::new(owned)));
        }
        attach(spec)?;
        Ok(Runtime::Static(spec.to_owned()))
    }

    /// The spec a call attaches with; an owned container that died is
    /// started again first.
    pub fn spec(&self) -> Result<String, RuntimeError> {
        match self {
            Runtime::Static(s) => Ok(s.clone()),
            Runtime::Owned(m) => {
                let mut o = m.lock().unwrap_or_else(|p| p.into_inner());
                let alive = o
                    .child
                    .as_mut()
                    .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
                if !alive {
                    tracing::warn!(
                        "{} tools runtime container {:?} died, starting another",
                        o.engine,
                        o.id
                    );
                    o.spawn()?;
                }
                Ok(format!("{}-container:{}", o.engine, o.id))
            }
        }
    }

    /// Stops an owned container: its shell sees end of input and exits,
    /// and `--rm` removes it.
    pub fn stop(&self) {
        if let Runtime::Owned(m) = self {
            let mut o = m.lock().unwrap_or_else(|p| p.into_inner());
            o.stop();
        }
    }
}

impl Owned {
    fn spawn(&mut self) -> Result<(), RuntimeError> {
        self.stop();
        static N: AtomicU64 = AtomicU64::new(0);
        let cidfile = std::env::temp_dir().join(format!(
            "lamina-tools-runtime-cid-{}-{}.tmp",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        // `run --cidfile` refuses a file that exists.
        let _ = std::fs::remove_file(&cidfile);
        let child = Command::new(self.engine)
            .args(["run", "--rm", "-i", "--cidfile"])
            .arg(&cidfile)
            .args([self.image.as_str(), "sh"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| RuntimeError::Spawn {
                engine: self.engine.to_owned(),
                image: self.image.clone(),
                source,
            })?;
        self.child = Some(child);
        let mut id = String::new();
        for _ in 0..100 {
            id = std::fs::read_to_string(&cidfile)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default();
            if !id.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(&cidfile);
        if id.is_empty() || !valid_container_id(&id) {
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            return Err(RuntimeError::StartTimeout {
                engine: self.engine.to_owned(),
                image: self.image.clone(),
            });
        }
        tracing::info!(
            "tools runtime: {} container {id} (image {})",
            self.engine,
            self.image
        );
        self.id = id;
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            drop(c.stdin.take());
            // Bounded: a wedged engine must not hold the server's exit.
            for _ in 0..100 {
                if !matches!(c.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_injection_is_refused() {
        assert!(matches!(
            attach("ssh:-oProxyCommand=touch /tmp/x"),
            Err(RuntimeError::InvalidSshTarget(_))
        ));
        assert!(matches!(
            attach("docker-container:--privileged"),
            Err(RuntimeError::InvalidContainerId(_))
        ));
        assert!(matches!(
            attach("podman-container:a b"),
            Err(RuntimeError::InvalidContainerId(_))
        ));
        assert!(matches!(
            attach("docker:busybox"),
            Err(RuntimeError::NotRunning(_))
        ));
        assert!(matches!(attach("fake:x"), Err(RuntimeError::Unknown(_))));
        assert!(matches!(
            Runtime::start("docker:--privileged"),
            Err(RuntimeError::InvalidImage(_))
        ));
    }

    #[test]
    fn ssh_command_is_one_quoted_word() {
        let iso = attach("ssh:user@host").unwrap_or_else(|_| unreachable!());
        let argv = iso.argv(&["sh".into(), "-c".into(), "echo 'hi'; x".into()], false);
        assert_eq!(argv[argv.len() - 2], "user@host");
        assert_eq!(argv[argv.len() - 1], r#"'sh' '-c' 'echo '\''hi'\''; x'"#);
        assert!(argv.contains(&"-n".to_owned()));
    }
}
