//! Where a tool's file and process operations happen: on this host, or as
//! commands inside an isolate (a running container through `<engine> exec`,
//! or a host over ssh), which must offer a POSIX `sh`, `cat`, `wc`,
//! `mkdir`, `dirname`, `find` and `timeout`.
//!
//! Paths given to an isolate travel as positional arguments of `sh -c`
//! (`"$1"`), never spliced into the script, and over ssh the whole command
//! is quoted as one word for the remote shell.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::process::{self, Exec, Spawn};
use crate::runtime::{self, Isolate};
use crate::RuntimeError;

/// Budget of one listing, git's and the walker's alike.
const LIST_TIMEOUT: Duration = Duration::from_secs(15);
/// Most bytes of `git ls-files` output read.
const LIST_MAX_OUTPUT: usize = 8 * 1024 * 1024;
/// Most entries a listing keeps, whatever the tree's size.
const LIST_MAX_ENTRIES: usize = 200_000;
/// Timeout of an isolate's helper commands (stat, cat, mkdir).
const ISOLATE_TIMEOUT: Duration = Duration::from_secs(15);
/// Most bytes read of one file (a range of a larger one is refused too).
pub(crate) const MAX_READ: usize = 64 * 1024 * 1024;

/// Directories a listing names but never walks into: they can be enormous.
pub(crate) const JUNK_DIRS: &[&str] = &[
    ".git",
    ".svn",
    ".hg",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    "dist",
    "build",
    "target",
    ".cache",
    ".idea",
    ".vscode",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Files,
    Dirs,
    All,
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// `/`-separated, relative to the listed directory.
    pub rel: String,
    pub is_dir: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub entries: Vec<Entry>,
    /// Set when the base is not a directory.
    pub err: Option<String>,
    /// Set when the walk could not see everything.
    pub truncated: bool,
}

/// Where one call's operations happen, with its working directory.
pub(crate) struct Target {
    isolate: Option<Isolate>,
    cwd: Option<String>,
    /// Set when the caller went away: [`Target::run`] stops its command.
    cancel: Option<Arc<AtomicBool>>,
}

impl Target {
    /// From a runtime spec (`None`: this host) and the `x-tool-cwd`.
    pub fn new(spec: Option<&str>, cwd: Option<&str>) -> Result<Self, RuntimeError> {
        Ok(Target {
            isolate: spec.map(runtime::attach).transpose()?,
            cwd: cwd.filter(|c| !c.is_empty()).map(str::to_owned),
            cancel: None,
        })
    }

    pub fn with_cancel(mut self, cancel: Option<Arc<AtomicBool>>) -> Self {
        self.cancel = cancel;
        self
    }

    pub fn is_isolate(&self) -> bool {
        self.isolate.is_some()
    }

    pub fn cwd(&self) -> Option<&str> {
        self.cwd.as_deref()
    }

    /// `path` made absolute: against the cwd (else the server's), `~`
    /// expanded, `.` and `..` dropped. In an isolate, only joined to the cwd.
    pub fn resolve(&self, path: &str) -> String {
        if self.isolate.is_some() {
            return match &self.cwd {
                Some(cwd) if !path.starts_with('/') => format!("{cwd}/{path}"),
                _ => path.to_owned(),
            };
        }
        let p = expand_home(path);
        let mut full = PathBuf::from(&p);
        if !full.is_absolute() {
            let base = match &self.cwd {
                Some(c) => PathBuf::from(expand_home(c)),
                None => match std::env::current_dir() {
                    Ok(d) => d,
                    Err(_) => return p,
                },
            };
            full = base.join(full);
        }
        normalize(&full).to_string_lossy().into_owned()
    }

    pub fn is_dir(&self, path: &str) -> bool {
        let p = self.resolve(path);
        match &self.isolate {
            None => Path::new(&p).is_dir(),
            Some(_) => self.shell_test("-d", &p),
        }
    }

    pub fn is_file(&self, path: &str) -> bool {
        let p = self.resolve(path);
        match &self.isolate {
            None => Path::new(&p).is_file(),
            Some(_) => self.shell_test("-f", &p),
        }
    }

    pub fn file_size(&self, path: &str) -> Option<u64> {
        let p = self.resolve(path);
        match &self.isolate {
            None => std::fs::metadata(&p)
                .ok()
                .filter(|m| !m.is_dir())
                .map(|m| m.len()),
            Some(_) => {
                let r = self.exec(&sh_args("wc -c < \"$1\"", &[&p]), 64, true, None);
                r.ok().then(|| r.output().trim().parse().ok()).flatten()
            }
        }
    }

    /// The file's bytes, at most `max` of them (a longer file is an error).
    pub fn read(&self, path: &str, max: usize) -> Option<Vec<u8>> {
        let p = self.resolve(path);
        match &self.isolate {
            None => {
                use std::io::Read as _;
                let f = std::fs::File::open(&p).ok()?;
                let mut out = Vec::new();
                let cap = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
                f.take(cap).read_to_end(&mut out).ok()?;
                (out.len() <= max).then_some(out)
            }
            Some(_) => {
                let args = vec!["cat".to_owned(), "--".to_owned(), p];
                // stderr apart: it must not be spliced into the file's bytes.
                let r = self.exec(&args, max.saturating_add(1), false, None);
                (r.ok() && !r.truncated).then_some(r.raw)
            }
        }
    }

    /// Writes `content`, creating the parent directories.
    pub fn write(&self, path: &str, content: &[u8]) -> bool {
        let p = self.resolve(path);
        match &self.isolate {
            None => {
                let p = Path::new(&p);
                if let Some(parent) = p.parent() {
                    if std::fs::create_dir_all(parent).is_err() {
                        return false;
                    }
                }
                std::fs::write(p, content).is_ok()
            }
            Some(iso) => {
                // The content goes on stdin: no argv for the far side to parse.
                let inner = sh_args("mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\"", &[&p]);
                let args = iso.argv(&inner, true);
                process::run(
                    &Spawn {
                        args: &args,
                        cwd: None,
                        stdin: Some(content),
                        max_output: 4096,
                        timeout: ISOLATE_TIMEOUT,
                        combine_stderr: true,
                    },
                    None,
                )
                .ok()
            }
        }
    }

    /// The entries under `base` (resolved already), at most `max_depth`
    /// levels down (0: any). Files come from `git ls-files` where it works
    /// (so `.gitignore` applies), else from a walk that skips [`JUNK_DIRS`].
    pub fn list(&self, base: &str, max_depth: usize, kind: Kind) -> Listing {
        let mut out = Listing::default();
        if !self.is_dir(base) {
            out.err = Some("path does not exist or is not a directory".to_owned());
            return out;
        }
        if kind == Kind::Files {
            let git = match &self.isolate {
                None => self.run_local(
                    &[
                        "git".into(),
                        "-C".into(),
                        base.into(),
                        "ls-files".into(),
                        "--cached".into(),
                        "--others".into(),
                        "--exclude-standard".into(),
                    ],
                    LIST_MAX_OUTPUT,
                    LIST_TIMEOUT,
                    false,
                ),
                Some(_) => self.exec(
                    &sh_args(
                        "cd \"$1\" && git ls-files --cached --others --exclude-standard",
                        &[base],
                    ),
                    LIST_MAX_OUTPUT,
                    false,
                    Some(LIST_TIMEOUT),
                ),
            };
            if git.ok() && !git.truncated {
                for line in git.output().lines() {
                    let rel = line.replace('\\', "/");
                    if rel.is_empty() || (max_depth > 0 && depth(&rel) > max_depth) {
                        continue;
                    }
                    // Tracked but deleted files are still in the index.
                    if self.isolate.is_none() && !Path::new(base).join(&rel).is_file() {
                        continue;
                    }
                    out.entries.push(Entry { rel, is_dir: false });
                    if out.entries.len() >= LIST_MAX_ENTRIES {
                        out.truncated = true;
                        break;
                    }
                }
                return out;
            }
        }
        match &self.isolate {
            None => walk(Path::new(base), max_depth, kind, &mut out),
            Some(_) => {
                if kind != Kind::Files {
                    self.find(base, max_depth, true, &mut out);
                }
                if kind != Kind::Dirs {
                    self.find(base, max_depth, false, &mut out);
                }
            }
        }
        out
    }

    /// Runs `args` in the cwd (in the isolate, under its `timeout`).
    pub fn run(
        &self,
        args: &[String],
        max_output: usize,
        timeout: Duration,
        on_chunk: Option<&mut dyn FnMut(&str) -> bool>,
    ) -> Exec {
        match &self.isolate {
            None => process::run_cancellable(
                &Spawn {
                    args,
                    cwd: self.cwd.as_deref(),
                    stdin: None,
                    max_output,
                    timeout,
                    combine_stderr: true,
                },
                on_chunk,
                self.cancel.clone(),
            ),
            Some(iso) => {
                // Killing our `exec`/ssh client does not kill what runs in
                // the isolate: its own `timeout` does, a little before ours.
                let mut inner = vec![
                    "timeout".to_owned(),
                    format!("{}s", timeout.as_secs().max(1)),
                ];
                inner.extend_from_slice(args);
                let inner = match &self.cwd {
                    // 127: what a shell answers for a command it cannot run.
                    Some(cwd) => {
                        let mut v = sh_args("cd \"$1\" || exit 127; shift; exec \"$@\"", &[cwd]);
                        v.extend(inner);
                        v
                    }
                    None => inner,
                };
                let args = iso.argv(&inner, true);
                process::run_cancellable(
                    &Spawn {
                        args: &args,
                        cwd: None,
                        stdin: Some(&[]),
                        max_output,
                        timeout: timeout + Duration::from_secs(5),
                        combine_stderr: true,
                    },
                    on_chunk,
                    self.cancel.clone(),
                )
            }
        }
    }

    fn run_local(
        &self,
        args: &[String],
        max_output: usize,
        timeout: Duration,
        stderr: bool,
    ) -> Exec {
        process::run(
            &Spawn {
                args,
                cwd: None,
                stdin: None,
                max_output,
                timeout,
                combine_stderr: stderr,
            },
            None,
        )
    }

    /// An isolate's helper command (no stdin).
    fn exec(
        &self,
        inner: &[String],
        max_output: usize,
        stderr: bool,
        timeout: Option<Duration>,
    ) -> Exec {
        let Some(iso) = &self.isolate else {
            return self.run_local(
                inner,
                max_output,
                timeout.unwrap_or(ISOLATE_TIMEOUT),
                stderr,
            );
        };
        let args = iso.argv(inner, false);
        self.run_local(
            &args,
            max_output,
            timeout.unwrap_or(ISOLATE_TIMEOUT),
            stderr,
        )
    }

    fn shell_test(&self, flag: &str, path: &str) -> bool {
        self.exec(
            &sh_args(&format!("[ {flag} \"$1\" ]"), &[path]),
            4096,
            true,
            None,
        )
        .ok()
    }

    /// One `find` pass in the isolate; junk directories are named, never
    /// entered (`-mindepth`/`-maxdepth` work with busybox as with GNU).
    fn find(&self, base: &str, max_depth: usize, dirs: bool, out: &mut Listing) {
        let prune = JUNK_DIRS
            .iter()
            .map(|n| format!("-name {n}"))
            .collect::<Vec<_>>()
            .join(" -o ");
        let mut cmd = "cd \"$1\" && find . -mindepth 1".to_owned();
        if max_depth > 0 {
            cmd.push_str(&format!(" -maxdepth {max_depth}"));
        }
        cmd.push_str(&format!(" \\( {prune} \\) -prune"));
        cmd.push_str(if dirs {
            " -print -o -type d -print"
        } else {
            " -o -type f -print"
        });
        let r = self.exec(
            &sh_args(&cmd, &[base]),
            LIST_MAX_OUTPUT,
            false,
            Some(LIST_TIMEOUT),
        );
        out.truncated |= r.timed_out;
        out.truncated |= r.truncated;
        for line in r.output().lines() {
            let rel = line.strip_prefix("./").unwrap_or(line);
            if rel.is_empty() || line == "[output truncated]" {
                continue;
            }
            out.entries.push(Entry {
                rel: rel.to_owned(),
                is_dir: dirs,
            });
        }
    }
}

/// `sh -c SCRIPT _ ARGS...`: the arguments as `$1`...
fn sh_args(script: &str, args: &[&str]) -> Vec<String> {
    let mut v = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        script.to_owned(),
        "_".to_owned(),
    ];
    v.extend(args.iter().map(|a| (*a).to_owned()));
    v
}

/// `"a/b/c"` is 3 deep.
fn depth(rel: &str) -> usize {
    1 + rel.matches('/').count()
}

fn expand_home(path: &str) -> String {
    if path == "~" || path.starts_with("~/") {
        if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            return format!("{}{}", home.to_string_lossy(), &path[1..]);
        }
    }
    path.to_owned()
}

/// `.` dropped and `..` taken off lexically, as C++'s `lexically_normal`.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The local walk: depth first, each directory's entries in name order,
/// links to directories named but never followed (they can loop).
fn walk(base: &Path, max_depth: usize, kind: Kind, out: &mut Listing) {
    let deadline = Instant::now() + LIST_TIMEOUT;
    let mut stack: Vec<(PathBuf, String, usize)> = vec![(base.to_path_buf(), String::new(), 0)];
    while let Some((dir, rel_dir, depth)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            out.truncated = true;
            continue;
        };
        let mut names: Vec<std::fs::DirEntry> = read.filter_map(Result::ok).collect();
        names.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for e in names {
            if Instant::now() >= deadline || out.entries.len() >= LIST_MAX_ENTRIES {
                out.truncated = true;
                return;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let rel = if rel_dir.is_empty() {
                name.clone()
            } else {
                format!("{rel_dir}/{name}")
            };
            let is_link = e.file_type().map(|t| t.is_symlink()).unwrap_or(true);
            // Follows links, as the entry's type is what it points at.
            let Ok(meta) = std::fs::metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                if kind != Kind::Files {
                    out.entries.push(Entry {
                        rel: rel.clone(),
                        is_dir: true,
                    });
                }
                let junk = JUNK_DIRS.contains(&name.as_str());
                if !junk && !is_link && (max_depth == 0 || depth + 1 < max_depth) {
                    subdirs.push((e.path(), rel, depth + 1));
                }
            } else if meta.is_file() && kind != Kind::Dirs {
                out.entries.push(Entry { rel, is_dir: false });
            }
        }
        // Reversed, so the stack pops them in name order.
        stack.extend(subdirs.into_iter().rev());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_against_cwd() {
        let t = Target::new(None, Some("/srv/work")).unwrap_or_else(|_| unreachable!());
        assert_eq!(t.resolve("a/../b/./c.txt"), "/srv/work/b/c.txt");
        assert_eq!(t.resolve("/etc/hosts"), "/etc/hosts");
        assert_eq!(t.resolve(".."), "/srv");
    }

    #[test]
    fn isolate_paths_are_only_joined() {
        let t = Target::new(Some("docker-container:abc"), Some("/tmp"))
            .unwrap_or_else(|_| unreachable!());
        assert_eq!(t.resolve("x/../y"), "/tmp/x/../y");
        assert_eq!(t.resolve("/abs"), "/abs");
    }
}
