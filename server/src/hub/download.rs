//! One file from the hub into the cache: its metadata from a `HEAD` of the
//! resolve URL (redirects not followed, as `huggingface_hub` reads them: the
//! hub's 302 carries `X-Repo-Commit`, `X-Linked-Etag` and `X-Linked-Size`),
//! then the bytes from where it points into `blobs/{etag}.incomplete`,
//! resumed with a `Range` request when a partial file is there, checked
//! against the LFS sha256 and only then renamed to `blobs/{etag}`.

use std::fs::OpenOptions;
use std::io::{IsTerminal as _, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use super::cache::{safe_segment, RepoCache};
use super::{Hub, HubError};

/// What the resolve URL says about a file.
#[derive(Debug)]
pub struct Meta {
    pub etag: String,
    pub size: Option<u64>,
    /// Where the bytes are (the redirect's target, or the URL itself).
    pub location: String,
}

/// `W/"abc"` or `"abc"` → `abc`, as `huggingface_hub` normalises it.
fn normalize_etag(etag: &str) -> &str {
    etag.strip_prefix("W/").unwrap_or(etag).trim_matches('"')
}

/// An LFS etag is the file's sha256: 64 hex digits.
fn is_sha256(etag: &str) -> bool {
    etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit())
}

fn header(r: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `location` against `base` when the server sent a path.
fn absolute(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    if location.starts_with('/') {
        return format!("{}{location}", origin(base));
    }
    // A path relative to the URL's folder.
    let dir = base.rsplit_once('/').map_or(base, |(d, _)| d);
    format!("{dir}/{location}")
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let end = url
        .find("://")
        .and_then(|s| url[s + 3..].find('/').map(|i| s + 3 + i))
        .unwrap_or(url.len());
    &url[..end]
}

/// Redirects followed within the hub (a renamed repo) before giving up.
const MAX_REDIRECTS: usize = 5;

/// The file's metadata from a `HEAD` of its resolve URL. Redirects within
/// the hub are followed; one to another host (the CDN) is where the bytes
/// are, and its answer carries the metadata (as `huggingface_hub` reads it).
pub fn metadata(hub: &Hub, resolve_url: &str) -> Result<Meta, HubError> {
    let mut url = resolve_url.to_string();
    let mut hops = 0;
    let (r, status) = loop {
        let r = hub.send(
            hub.agent.head(&url).header("Accept-Encoding", "identity"),
            &url,
        )?;
        let status = r.status().as_u16();
        match header(&r, "Location").filter(|_| (300..400).contains(&status)) {
            Some(loc) if origin(&absolute(&url, &loc)) == origin(&url) => {
                hops += 1;
                if hops > MAX_REDIRECTS {
                    return Err(HubError::BadResponse {
                        url,
                        reason: format!("more than {MAX_REDIRECTS} redirects"),
                    });
                }
                url = absolute(&url, &loc);
            }
            _ => break (r, status),
        }
    };
    let url = url.as_str();
    let etag = header(&r, "X-Linked-Etag")
        .or_else(|| header(&r, "ETag"))
        .ok_or_else(|| HubError::MissingHeader {
            url: url.to_string(),
            header: "ETag",
        })?;
    let etag = normalize_etag(&etag).to_string();
    if !safe_segment(&etag) {
        return Err(HubError::BadResponse {
            url: url.to_string(),
            reason: format!("etag {etag:?} is not a plain name"),
        });
    }
    let size = header(&r, "X-Linked-Size")
        .or_else(|| header(&r, "Content-Length"))
        .and_then(|s| s.parse().ok());
    let location = match (status, header(&r, "Location")) {
        (300..=399, Some(loc)) => absolute(url, &loc),
        _ => url.to_string(),
    };
    Ok(Meta {
        etag,
        size,
        location,
    })
}

/// Downloads `meta`'s bytes into `blobs/{etag}`, resuming a partial file;
/// `name` labels the progress.
pub fn fetch_blob(hub: &Hub, cache: &RepoCache, meta: &Meta, name: &str) -> Result<(), HubError> {
    let blob = cache.blob(&meta.etag);
    let part = cache.incomplete(&meta.etag);
    let blobs = cache.dir().join("blobs");
    std::fs::create_dir_all(&blobs).map_err(|error| HubError::Io {
        path: blobs.clone(),
        error,
    })?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| HubError::Io { path, error }
    };
    let mut have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    if meta.size.is_some_and(|size| have > size) {
        std::fs::remove_file(&part).map_err(io(&part))?;
        have = 0;
    }
    let mut hasher = Sha256::new();
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(&part)
        .map_err(io(&part))?;
    if meta.size != Some(have) {
        let mut req = hub.agent.get(&meta.location);
        if have > 0 {
            req = req.header("Range", format!("bytes={have}-"));
        }
        let r = hub.send(req, &meta.location)?;
        if have > 0 && r.status().as_u16() != 206 {
            // The server sent the whole file again: start over.
            file.set_len(0).map_err(io(&part))?;
            have = 0;
        }
        let mut progress = Progress::new(name, have, meta.size);
        let mut body = r.into_body().into_reader();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = body.read(&mut buf).map_err(|error| HubError::Transfer {
                url: meta.location.clone(),
                error,
            })?;
            if n == 0 {
                break;
            }
            file.write_all(&buf[..n]).map_err(io(&part))?;
            progress.advance(n as u64);
        }
        progress.finish();
    }
    file.flush().map_err(io(&part))?;
    drop(file);
    let got = std::fs::metadata(&part).map_err(io(&part))?.len();
    if let Some(size) = meta.size.filter(|&s| s != got) {
        // A short file stays for the next pull to resume.
        return Err(HubError::Size {
            file: name.to_string(),
            got,
            expected: size,
        });
    }
    if is_sha256(&meta.etag) {
        let mut f = std::fs::File::open(&part).map_err(io(&part))?;
        std::io::copy(&mut f, &mut hasher).map_err(io(&part))?;
        let actual = format!("{:x}", hasher.finalize());
        if !actual.eq_ignore_ascii_case(&meta.etag) {
            std::fs::remove_file(&part).map_err(io(&part))?;
            return Err(HubError::Digest {
                file: name.to_string(),
                expected: meta.etag.clone(),
                actual,
            });
        }
    }
    std::fs::rename(&part, &blob).map_err(io(&blob))
}

/// Bytes, rate and time left on stderr: a bar on a terminal, else a line
/// every few seconds.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    name: String,
    done: u64,
    total: Option<u64>,
    start: Instant,
    start_bytes: u64,
    last_line: Instant,
}

impl Progress {
    fn new(name: &str, done: u64, total: Option<u64>) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(total.unwrap_or(0));
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} {bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta}",
            ) {
                b.set_style(style);
            }
            b.set_message(name.to_string());
            b.set_position(done);
            b
        });
        if bar.is_none() {
            eprintln!("downloading {name}{}", resumed(done));
        }
        let now = Instant::now();
        Self {
            bar,
            name: name.to_string(),
            done,
            total,
            start: now,
            start_bytes: done,
            last_line: now,
        }
    }

    fn advance(&mut self, n: u64) {
        self.done += n;
        if let Some(b) = &self.bar {
            b.set_position(self.done);
        } else if self.last_line.elapsed() >= Duration::from_secs(5) {
            self.last_line = Instant::now();
            eprintln!("{}", self.line());
        }
    }

    fn line(&self) -> String {
        let human = lamina_model::plan::human_size;
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let rate = (self.done - self.start_bytes) as f64 / secs;
        let of = self
            .total
            .map(|t| format!(" of {}", human(t)))
            .unwrap_or_default();
        let left = match self.total {
            Some(t) if rate > 0.0 => {
                format!(", {:.0} s left", t.saturating_sub(self.done) as f64 / rate)
            }
            _ => String::new(),
        };
        format!(
            "{}: {}{of} at {}/s{left}",
            self.name,
            human(self.done),
            human(rate as u64)
        )
    }

    fn finish(&self) {
        match &self.bar {
            Some(b) => b.finish_and_clear(),
            None => eprintln!("{}", self.line()),
        }
    }
}

fn resumed(done: u64) -> String {
    if done == 0 {
        String::new()
    } else {
        format!(" (resuming at {})", lamina_model::plan::human_size(done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_and_locations() {
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert!(is_sha256(&"a".repeat(64)));
        assert!(!is_sha256("abc"));
        assert_eq!(
            absolute("http://h:1/o/r/resolve/x/f", "/blob/y"),
            "http://h:1/blob/y"
        );
        assert_eq!(absolute("http://h/a", "https://cdn/b"), "https://cdn/b");
    }
}
