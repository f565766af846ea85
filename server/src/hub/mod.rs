//! Models by name: `lamina pull org/repo[:QUANT]` and `-hf` resolve a name
//! against the Hugging Face hub (`HF_ENDPOINT`, `HF_TOKEN`) and download
//! the `.gguf` into the hub's standard cache, shared with `huggingface_hub`
//! (see [`cache`]). A file already cached is used without a download; in
//! offline mode (`--offline`, `HF_HUB_OFFLINE=1`) only the cache is read.
//!
//! - [`resolve`]: the name parsed, the quant's file(s) picked from the list.
//! - [`cache`]: the cache's layout: blobs, snapshot links, refs.
//! - [`download`]: metadata, the resumable transfer, the sha256 check.

use std::path::PathBuf;
use std::time::Duration;

pub mod cache;
pub mod download;
pub mod resolve;

use cache::RepoCache;
use resolve::RepoRef;

/// The revision a name without one means.
const REVISION: &str = "main";

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0:?} is not a model name: expected org/repo or org/repo:QUANT")]
    BadName(String),
    #[error("{0:?} is not a plain file name in a repo")]
    BadPath(String),
    #[error("{repo} has no .gguf file for quant {tag:?}; it offers: {available}")]
    NoMatch {
        repo: String,
        tag: String,
        available: String,
    },
    #[error("{repo} holds no .gguf file")]
    NoGguf { repo: String },
    #[error("{repo} has no file {file:?}; its .gguf files: {available}")]
    NoFile {
        repo: String,
        file: String,
        available: String,
    },
    #[error("{url}: HTTP {status}: the repo is gated, private or missing; set HF_TOKEN to a token that may read it")]
    Unauthorized { url: String, status: u16 },
    #[error("{url}: HTTP {status}: the token in HF_TOKEN may not read this repo (gated: accept its terms on the hub)")]
    Forbidden { url: String, status: u16 },
    #[error("{url}: HTTP 404: no such repo or file")]
    NotFound { url: String },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    // The cause is in the message, not a `#[source]`: the binary prints an
    // error's chain, and ureq's text already holds the io error's.
    #[error("{url}: {error}")]
    Http { url: String, error: ureq::Error },
    #[error("{url}: the download broke off ({error}); pull again to resume it")]
    Transfer { url: String, error: std::io::Error },
    #[error("{url}: the answer has no {header} header")]
    MissingHeader { url: String, header: &'static str },
    #[error("{url}: {reason}")]
    BadResponse { url: String, reason: String },
    #[error("{file}: sha256 {actual} is not the hub's {expected}; the download was deleted")]
    Digest {
        file: String,
        expected: String,
        actual: String,
    },
    #[error("{file}: {got} bytes of {expected} arrived; pull again to resume")]
    Size {
        file: String,
        got: u64,
        expected: u64,
    },
    #[error("offline: {what} is not in the cache at {}", cache.display())]
    NotCached { what: String, cache: PathBuf },
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Where and how to reach the hub.
pub struct Hub {
    pub endpoint: String,
    pub token: Option<String>,
    pub cache: PathBuf,
    pub offline: bool,
    agent: ureq::Agent,
}

impl Hub {
    /// The settings `huggingface_hub` reads: `HF_ENDPOINT`, `HF_TOKEN` (else
    /// the token `hf auth login` saved), `HF_HUB_OFFLINE`, and the cache
    /// variables ([`cache::root`]).
    pub fn from_env(offline: bool, var: impl Fn(&str) -> Option<String>) -> Self {
        let truthy = |v: Option<String>| {
            v.is_some_and(|v| {
                matches!(v.to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true")
            })
        };
        let endpoint = var("HF_ENDPOINT")
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "https://huggingface.co".to_string());
        Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: var("HF_TOKEN")
                .filter(|t| !t.is_empty())
                .or_else(|| saved_token(&var)),
            offline: offline || truthy(var("HF_HUB_OFFLINE")),
            cache: cache::root(&var),
            agent: ureq::Agent::config_builder()
                // Redirects are read, not followed: the hub's 302 carries
                // the file's metadata, and the token stays with the hub.
                .max_redirects(0)
                .http_status_as_error(false)
                .timeout_connect(Some(Duration::from_secs(30)))
                .timeout_recv_response(Some(Duration::from_secs(60)))
                .user_agent(concat!("lamina/", env!("CARGO_PKG_VERSION")))
                .build()
                .into(),
        }
    }

    /// Sends `req`, with the token when it goes to the hub itself, and maps
    /// an error status to its error.
    fn send(
        &self,
        req: ureq::RequestBuilder<ureq::typestate::WithoutBody>,
        url: &str,
    ) -> Result<ureq::http::Response<ureq::Body>, HubError> {
        let req = match &self.token {
            Some(t) if url.starts_with(&self.endpoint) => {
                req.header("Authorization", format!("Bearer {t}"))
            }
            _ => req,
        };
        let r = req.call().map_err(|error| HubError::Http {
            url: url.to_string(),
            error,
        })?;
        let status = r.status().as_u16();
        let url = url.to_string();
        match status {
            200..=399 => Ok(r),
            401 => Err(HubError::Unauthorized { url, status }),
            403 => Err(HubError::Forbidden { url, status }),
            404 => Err(HubError::NotFound { url }),
            _ => Err(HubError::Status { url, status }),
        }
    }
}

/// The token `hf auth login` saved: `$HF_TOKEN_PATH`, else `token` in
/// `$HF_HOME` (default `~/.cache/huggingface`).
fn saved_token(var: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let path = set("HF_TOKEN_PATH").or_else(|| {
        let home = set("HF_HOME").or_else(|| {
            set("XDG_CACHE_HOME")
                .or_else(|| set("HOME").map(|h| h.join(".cache")))
                .map(|c| c.join("huggingface"))
        })?;
        Some(home.join("token"))
    })?;
    let token = std::fs::read_to_string(path).ok()?;
    let token = token.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// What a pull produced.
#[derive(Debug)]
pub struct Pulled {
    /// The local files, first shard first: the first is what `-m` takes.
    pub paths: Vec<PathBuf>,
    /// Files that had to be downloaded (0 when all were cached).
    pub downloaded: usize,
}

/// The revision API's answer: the commit and the repo's file names.
#[derive(serde::Deserialize)]
struct RepoInfo {
    sha: String,
    siblings: Vec<Sibling>,
}

#[derive(serde::Deserialize)]
struct Sibling {
    rfilename: String,
}

/// Resolves `name` (`org/repo[:QUANT]`, or with `hf_file` one named file)
/// to local files, downloading what the cache lacks.
pub fn pull(hub: &Hub, name: &str, hf_file: Option<&str>) -> Result<Pulled, HubError> {
    let r = RepoRef::parse(name)?;
    let cache = RepoCache::new(&hub.cache, &r.repo);
    if hub.offline {
        let not_cached = || HubError::NotCached {
            what: name.to_string(),
            cache: hub.cache.clone(),
        };
        let commit = cache.read_ref(REVISION).ok_or_else(not_cached)?;
        let files = cache.snapshot_files(&commit);
        let picked = resolve::select(&r.repo, &files, r.tag.as_deref(), hf_file)
            .map_err(|_| not_cached())?;
        let paths = picked
            .iter()
            .map(|f| cache.pointer(&commit, f))
            .collect::<Result<Vec<_>, _>>()?;
        if paths.iter().any(|p| !p.exists()) {
            return Err(not_cached());
        }
        return Ok(Pulled {
            paths,
            downloaded: 0,
        });
    }
    let url = format!("{}/api/models/{}/revision/{REVISION}", hub.endpoint, r.repo);
    let body = hub
        .send(hub.agent.get(&url), &url)?
        .into_body()
        .read_to_string()
        .map_err(|error| HubError::Http {
            url: url.clone(),
            error,
        })?;
    let info: RepoInfo = serde_json::from_str(&body).map_err(|e| HubError::BadResponse {
        url: url.clone(),
        reason: format!("not the revision API's JSON: {e}"),
    })?;
    if !cache::safe_segment(&info.sha) {
        return Err(HubError::BadResponse {
            url,
            reason: format!("commit {:?} is not a plain name", info.sha),
        });
    }
    let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let picked = resolve::select(&r.repo, &files, r.tag.as_deref(), hf_file)?;
    let mut paths = Vec::new();
    let mut downloaded = 0;
    for file in &picked {
        let pointer = cache.pointer(&info.sha, file)?;
        // A snapshot link that reaches its blob is a complete file.
        if pointer.exists() {
            paths.push(pointer);
            continue;
        }
        let url = format!("{}/{}/resolve/{}/{}", hub.endpoint, r.repo, info.sha, file);
        let meta = download::metadata(hub, &url)?;
        if !cache.blob(&meta.etag).exists() {
            let _lock = cache.lock(&meta.etag)?;
            // Another pull may have finished it while this one waited.
            if !cache.blob(&meta.etag).exists() {
                download::fetch_blob(hub, &cache, &meta, file)?;
                downloaded += 1;
            }
        }
        paths.push(cache.link(&info.sha, file, &meta.etag)?);
    }
    cache.write_ref(REVISION, &info.sha)?;
    Ok(Pulled { paths, downloaded })
}
