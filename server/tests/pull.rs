//! `lamina pull` and `-hf` against a loopback server in the hub's layout:
//! the revision API, a resolve URL that redirects (302, with the hub's
//! `X-Repo-Commit`/`X-Linked-Etag`/`X-Linked-Size`) to a blob URL that
//! honours `Range`. Nothing here reaches the internet.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const TOKEN: &str = "hf_secret";

/// The model's bytes and their sha256, read once for every test.
fn model() -> &'static (Vec<u8>, String) {
    static M: OnceLock<(Vec<u8>, String)> = OnceLock::new();
    M.get_or_init(|| {
        let bytes = std::fs::read(common::model_path(MODEL)).unwrap();
        let sha = format!("{:x}", Sha256::digest(&bytes));
        (bytes, sha)
    })
}

/// The shards of the split repo `org/split`, in a folder as some repos
/// keep them: small stand-ins, since only their bytes travel.
const SHARDS: [(&str, &[u8]); 2] = [
    ("Q8_0/s-Q8_0-00001-of-00002.gguf", b"first shard"),
    ("Q8_0/s-Q8_0-00002-of-00002.gguf", b"second shard"),
];

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A file the server holds, by repo and name: its bytes and digest.
fn file(repo: &str, name: &str) -> Option<(&'static [u8], String)> {
    if repo == "org/smol" && name == MODEL {
        let (bytes, sha) = model();
        return Some((bytes, sha.clone()));
    }
    SHARDS
        .iter()
        .find(|(n, _)| repo == "org/split" && *n == name)
        .map(|(_, b)| (*b, sha256(b)))
}

/// A blob by its digest.
fn blob(sha: &str) -> Option<&'static [u8]> {
    if model().1 == sha {
        return Some(&model().0);
    }
    SHARDS.iter().map(|(_, b)| *b).find(|b| sha256(b) == sha)
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    range: Option<String>,
}

#[derive(Default)]
struct Behaviour {
    /// Close the first blob download after this many bytes.
    cut_after: Option<usize>,
    /// Announce this digest instead of the real one.
    wrong_etag: Option<String>,
    /// 401 without `Authorization: Bearer {TOKEN}`.
    gated: bool,
}

struct Hub {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Hub {
    fn start(b: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let b = Arc::new(Mutex::new(b));
        let (s, u) = (seen.clone(), url.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (s, b, u) = (s.clone(), b.clone(), u.clone());
                std::thread::spawn(move || serve(conn, &s, &b, &u));
            }
        });
        Self { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn blob_gets(&self) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path.starts_with("/blob/"))
            .count()
    }
}

fn serve(mut conn: TcpStream, seen: &Mutex<Vec<Seen>>, b: &Mutex<Behaviour>, base: &str) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let (mut range, mut auth) = (None, None);
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "range" => range = Some(v.trim().to_string()),
                    "authorization" => auth = Some(v.trim().to_string()),
                    _ => {}
                }
            }
        }
        seen.lock().unwrap().push(Seen {
            method: method.clone(),
            path: path.clone(),
            range: range.clone(),
        });
        let mut b = b.lock().unwrap();
        let authorized = !b.gated || auth.as_deref() == Some(&format!("Bearer {TOKEN}"));
        let head = method == "HEAD";
        let reply =
            |conn: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]| {
                let mut out = format!("HTTP/1.1 {status}\r\n");
                for (k, v) in headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
                conn.write_all(out.as_bytes()).unwrap();
                if !head {
                    conn.write_all(body).unwrap();
                }
            };
        if !authorized && !path.starts_with("/blob/") {
            reply(&mut conn, "401 Unauthorized", &[], b"");
        } else if path.starts_with("/api/models/org/smol/revision/") {
            let json = format!(
                r#"{{"id":"org/smol","sha":"{COMMIT}","siblings":[{{"rfilename":".gitattributes"}},{{"rfilename":"{MODEL}"}},{{"rfilename":"mmproj-Q4_1.gguf"}}]}}"#
            );
            reply(&mut conn, "200 OK", &[], json.as_bytes());
        } else if path.starts_with("/api/models/org/split/revision/") {
            let names: Vec<String> = SHARDS
                .iter()
                .map(|(n, _)| format!(r#"{{"rfilename":"{n}"}}"#))
                .collect();
            let json = format!(
                r#"{{"id":"org/split","sha":"{COMMIT}","siblings":[{{"rfilename":"s-Q4_0.gguf"}},{}]}}"#,
                names.join(",")
            );
            reply(&mut conn, "200 OK", &[], json.as_bytes());
        } else if let Some((bytes, sha)) = resolve_target(&path) {
            let etag = b.wrong_etag.clone().unwrap_or_else(|| sha.clone());
            let headers = [
                // Another host, as the hub's CDN is: the metadata is read
                // from this answer, not followed.
                (
                    "Location",
                    format!("{}/blob/{sha}", base.replace("127.0.0.1", "localhost")),
                ),
                ("X-Repo-Commit", COMMIT.to_string()),
                ("X-Linked-Etag", format!("\"{etag}\"")),
                ("X-Linked-Size", bytes.len().to_string()),
                ("ETag", "\"not-the-file\"".to_string()),
            ];
            reply(&mut conn, "302 Found", &headers, b"");
        } else if let Some(bytes) = path.strip_prefix("/blob/").and_then(blob) {
            let sha = sha256(bytes);
            let start = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok())
                .unwrap_or(0)
                .min(bytes.len());
            let body = &bytes[start..];
            let mut headers = vec![
                ("ETag", format!("\"{sha}\"")),
                ("X-Repo-Commit", COMMIT.to_string()),
            ];
            let status = if range.is_some() {
                headers.push((
                    "Content-Range",
                    format!("bytes {start}-{}/{}", bytes.len() - 1, bytes.len()),
                ));
                "206 Partial Content"
            } else {
                "200 OK"
            };
            if let (Some(cut), false) = (b.cut_after.take(), head) {
                // Promise the whole body, send part, hang up.
                let out = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                conn.write_all(out.as_bytes()).unwrap();
                let _ = conn.write_all(&body[..cut.min(body.len())]);
                let _ = conn.shutdown(std::net::Shutdown::Both);
                return;
            }
            reply(&mut conn, status, &headers, body);
        } else {
            reply(&mut conn, "404 Not Found", &[], b"");
        }
    }
}

/// The file a `/{org}/{repo}/resolve/{revision}/{name}` path names.
fn resolve_target(path: &str) -> Option<(&'static [u8], String)> {
    let mut parts = path.trim_start_matches('/').splitn(5, '/');
    let (org, repo, verb, _rev, name) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    (verb == "resolve")
        .then(|| file(&format!("{org}/{repo}"), name))
        .flatten()
}

fn temp_cache(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lamina-pull-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lamina(hub: &Hub, cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lamina"));
    c.args(args)
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HUB_CACHE", cache)
        .env_remove("HF_TOKEN")
        // Not a token a developer saved with `hf auth login`.
        .env("HF_TOKEN_PATH", cache.join("no-token"))
        .env_remove("HF_HUB_OFFLINE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn repo(cache: &Path) -> PathBuf {
    cache.join("models--org--smol")
}

/// The layout huggingface_hub writes, with the blob's digest checked.
fn assert_layout(cache: &Path) -> PathBuf {
    let sha = &model().1;
    let pointer = repo(cache).join("snapshots").join(COMMIT).join(MODEL);
    assert_eq!(
        std::fs::read_link(&pointer).unwrap(),
        PathBuf::from(format!("../../blobs/{sha}"))
    );
    let blob = repo(cache).join("blobs").join(sha);
    let got = format!("{:x}", Sha256::digest(std::fs::read(&blob).unwrap()));
    assert_eq!(&got, sha);
    assert_eq!(
        std::fs::read_to_string(repo(cache).join("refs/main")).unwrap(),
        COMMIT
    );
    pointer
}

fn no_complete_blob(cache: &Path) -> bool {
    std::fs::read_dir(repo(cache).join("blobs"))
        .map(|d| {
            d.flatten()
                .all(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        })
        .unwrap_or(true)
}

#[test]
fn pull_lays_out_the_cache_then_reuses_it_and_run_loads_it() {
    let hub = Hub::start(Behaviour::default());
    let cache = temp_cache("clean");
    let o = lamina(&hub, &cache, &["pull", "org/smol:q4_1"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let pointer = assert_layout(&cache);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        pointer.to_str().unwrap()
    );
    assert_eq!(hub.blob_gets(), 1);
    // Plain progress lines off a terminal: bytes, rate, time left.
    let err = stderr(&o);
    assert!(err.contains("downloading") && err.contains("/s"), "{err}");

    // Again, and through -hf with no tag (the only quant): no download.
    let o = lamina(&hub, &cache, &["pull", "org/smol"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = lamina(
        &hub,
        &cache,
        &["run", "-hf", "org/smol", "-p", "Hello", "-n", "2", "--json"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(hub.blob_gets(), 1, "{:?}", hub.seen());

    // A tag the repo lacks names what it has.
    let o = lamina(&hub, &cache, &["pull", "org/smol:Q8_0"], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("Q4_1"), "{}", stderr(&o));
    std::fs::remove_dir_all(&cache).unwrap();
}

/// `serve -hf` offline from the cache a pull filled: it reaches the point
/// of listening, so the name resolved to a file the server loaded.
#[test]
fn serve_takes_hf_from_the_cache() {
    let hub = Hub::start(Behaviour::default());
    let cache = temp_cache("serve");
    assert!(lamina(&hub, &cache, &["pull", "org/smol"], &[])
        .status
        .success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["serve", "-hf", "org/smol:Q4_1", "--offline", "--port", "0"])
        .env("HF_HUB_CACHE", &cache)
        .env("HF_ENDPOINT", "http://127.0.0.1:1")
        .env_remove("LAMINA_MODEL")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    for line in err.lines() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains("listening on http://") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(log.contains("listening on http://"), "{log}");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_cut_download_resumes_with_a_range_request() {
    let hub = Hub::start(Behaviour {
        cut_after: Some(10 << 20),
        ..Behaviour::default()
    });
    let cache = temp_cache("resume");
    let o = lamina(&hub, &cache, &["pull", "org/smol"], &[]);
    assert!(!o.status.success());
    assert!(no_complete_blob(&cache));
    let o = lamina(&hub, &cache, &["pull", "org/smol"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ranged: Vec<_> = hub.seen().into_iter().filter_map(|s| s.range).collect();
    assert_eq!(ranged.len(), 1, "{ranged:?}");
    assert!(ranged[0].starts_with("bytes="), "{ranged:?}");
    assert_ne!(ranged[0], "bytes=0-");
    assert_layout(&cache);
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_wrong_digest_leaves_nothing_complete() {
    let hub = Hub::start(Behaviour {
        wrong_etag: Some("ab".repeat(32)),
        ..Behaviour::default()
    });
    let cache = temp_cache("digest");
    let o = lamina(&hub, &cache, &["pull", "org/smol"], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("sha256"), "{}", stderr(&o));
    let blobs: Vec<_> = std::fs::read_dir(repo(&cache).join("blobs"))
        .unwrap()
        .flatten()
        .collect();
    assert!(blobs.is_empty(), "{blobs:?}");
    assert!(!repo(&cache)
        .join("snapshots")
        .join(COMMIT)
        .join(MODEL)
        .exists());
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_gated_repo_wants_the_token() {
    let hub = Hub::start(Behaviour {
        gated: true,
        ..Behaviour::default()
    });
    let cache = temp_cache("gated");
    let o = lamina(&hub, &cache, &["pull", "org/smol"], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("HF_TOKEN"), "{}", stderr(&o));
    let o = lamina(&hub, &cache, &["pull", "org/smol"], &[("HF_TOKEN", TOKEN)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_layout(&cache);
    // The token `hf auth login` saves serves as well.
    let saved = cache.join("token");
    std::fs::write(&saved, format!("{TOKEN}\n")).unwrap();
    let o = lamina(
        &hub,
        &cache,
        &["pull", "org/smol"],
        &[("HF_TOKEN_PATH", saved.to_str().unwrap())],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn offline_reads_the_cache_only() {
    let hub = Hub::start(Behaviour::default());
    let cache = temp_cache("offline");
    let o = lamina(&hub, &cache, &["pull", "--offline", "org/smol"], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("offline"), "{}", stderr(&o));
    assert!(lamina(&hub, &cache, &["pull", "org/smol"], &[])
        .status
        .success());
    let before = hub.seen().len();
    let o = lamina(
        &hub,
        &cache,
        &["pull", "org/smol:Q4_1"],
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(hub.seen().len(), before);
    std::fs::remove_dir_all(&cache).unwrap();
}

/// Two pulls at once take turns on the blob's lock: one download, both
/// succeed.
#[test]
fn concurrent_pulls_download_once() {
    let hub = Hub::start(Behaviour::default());
    let cache = temp_cache("concurrent");
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["pull", "org/smol"])
            .env("HF_ENDPOINT", &hub.url)
            .env("HF_HUB_CACHE", &cache)
            .env("HF_TOKEN_PATH", cache.join("no-token"))
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(hub.blob_gets(), 1, "{:?}", hub.seen());
    assert_layout(&cache);
    assert!(cache.join(".locks/models--org--smol").is_dir());
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_split_model_comes_as_its_whole_set() {
    let hub = Hub::start(Behaviour::default());
    let cache = temp_cache("split");
    let o = lamina(&hub, &cache, &["pull", "org/split:q8_0"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let snapshot = cache.join("models--org--split/snapshots").join(COMMIT);
    let printed: Vec<PathBuf> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(PathBuf::from)
        .collect();
    let expected: Vec<PathBuf> = SHARDS.iter().map(|(n, _)| snapshot.join(n)).collect();
    assert_eq!(printed, expected);
    for ((_, bytes), path) in SHARDS.iter().zip(&expected) {
        assert_eq!(std::fs::read(path).unwrap(), *bytes);
        // One folder deeper, one more `..`.
        assert_eq!(
            std::fs::read_link(path).unwrap(),
            PathBuf::from(format!("../../../blobs/{}", sha256(bytes)))
        );
    }
    std::fs::remove_dir_all(&cache).unwrap();
}

/// A file `huggingface_hub` downloaded is found without a download
/// (`scripts/install-deps.sh` installs the package).
#[test]
fn a_file_huggingface_hub_cached_is_used() {
    let hub = Hub::start(Behaviour::default());
    let cache = temp_cache("python");
    let py = Command::new("python3")
        .args([
            "-c",
            &format!(
                "from huggingface_hub import hf_hub_download as d; print(d('org/smol', '{MODEL}'))"
            ),
        ])
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HUB_CACHE", &cache)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .output()
        .expect("python3 (scripts/install-deps.sh installs huggingface_hub)");
    assert!(py.status.success(), "{}", stderr(&py));
    assert_layout(&cache);
    let gets = hub.blob_gets();
    let o = lamina(&hub, &cache, &["pull", "org/smol"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(hub.blob_gets(), gets);
    std::fs::remove_dir_all(&cache).unwrap();
}
