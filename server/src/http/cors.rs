//! CORS, as `--cors-origins` says, with llama-server's headers.
//!
//! A browser page may call the server only if the response names its
//! origin in `Access-Control-Allow-Origin`. llama-server's default (`*`
//! with credentials) echoes whatever `Origin` a request carries, so any
//! web page a user visits can drive a server on their machine; Lamina's
//! default is `localhost`: an origin is echoed only when its host is
//! localhost, 127.0.0.1 or `[::1]` (llama-server's own rule when it enables
//! tools), and never otherwise. `*` restores llama-server's default; a
//! comma-separated list echoes exactly those origins.
//!
//! A preflight (`OPTIONS`) is answered here, before the API key and the
//! routes (browsers send no credentials on it), with llama-server's
//! `Allow-Methods`, `Allow-Headers` and `Allow-Credentials`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// `--cors-origins`, `--cors-methods`, `--cors-headers` and credentials.
#[derive(Debug, Clone)]
pub struct Cors {
    pub origins: String,
    pub methods: String,
    pub headers: String,
    pub credentials: bool,
}

impl Default for Cors {
    fn default() -> Self {
        Cors {
            origins: "localhost".into(),
            methods: "GET, POST, DELETE, OPTIONS".into(),
            headers: "*".into(),
            credentials: true,
        }
    }
}

impl Cors {
    /// Whether a request from `origin` may read the response.
    pub fn allows(&self, origin: &str) -> bool {
        match self.origins.trim() {
            "*" => true,
            "localhost" => is_localhost(origin),
            list => list
                .split(',')
                .map(str::trim)
                .any(|o| !o.is_empty() && o.eq_ignore_ascii_case(origin)),
        }
    }
}

/// `http(s)://localhost`, `127.0.0.1` or `[::1]`, any port (or the bare
/// host). `http://localhost.evil.com` is not.
fn is_localhost(origin: &str) -> bool {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or(origin);
    let host = if let Some(v6) = rest.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, tail)) if tail.is_empty() || tail.starts_with(':') => {
                return h == "::1" && port_ok(tail)
            }
            _ => return false,
        }
    } else {
        rest
    };
    let (name, tail) = match host.find(':') {
        Some(i) => (&host[..i], &host[i..]),
        None => (host, ""),
    };
    (name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1") && port_ok(tail)
}

/// Empty, or `:` and digits (an origin has no path).
fn port_ok(tail: &str) -> bool {
    tail.is_empty()
        || tail
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

pub async fn layer(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let cors = &st.options.cors;
    let allowed = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .filter(|o| cors.allows(o))
        .and_then(|o| HeaderValue::from_str(o).ok());
    let mut resp = if req.method() == Method::OPTIONS {
        let mut r = StatusCode::OK.into_response();
        let h = r.headers_mut();
        let credentials = if cors.credentials { "true" } else { "false" };
        h.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static(credentials),
        );
        for (name, value) in [
            (header::ACCESS_CONTROL_ALLOW_METHODS, &cors.methods),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, &cors.headers),
        ] {
            if let Ok(v) = HeaderValue::from_str(value) {
                h.insert(name, v);
            }
        }
        r
    } else {
        next.run(req).await
    };
    if let Some(origin) = allowed {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        // The answer depends on the Origin header: caches must keep them apart.
        h.append(header::VARY, HeaderValue::from_static("origin"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::{is_localhost, Cors};

    #[test]
    fn localhost_origins_and_only_those() {
        for o in [
            "http://localhost",
            "http://localhost:8080",
            "https://127.0.0.1:3000",
            "http://[::1]",
            "http://[::1]:3000",
            "localhost",
        ] {
            assert!(is_localhost(o), "{o}");
        }
        for o in [
            "http://web.mydomain.fr",
            "http://localhost.evil.com",
            "http://notlocalhost",
            "http://127.0.0.1.evil.com",
            "http://[::1].evil.com",
            "http://localhost:80/path",
            "",
        ] {
            assert!(!is_localhost(o), "{o}");
        }
    }

    #[test]
    fn origins_list_star_and_default() {
        let c = Cors::default();
        assert!(!c.allows("http://evil.com"));
        let star = Cors {
            origins: "*".into(),
            ..Cors::default()
        };
        assert!(star.allows("http://evil.com"));
        let list = Cors {
            origins: "https://a.example, https://b.example".into(),
            ..Cors::default()
        };
        assert!(list.allows("https://b.example"));
        assert!(!list.allows("https://c.example"));
    }
}
