//! `/cors-proxy?url=TARGET` (`--ui-mcp-proxy`): forwards a GET or POST to a
//! remote MCP server for the web UI, which a browser's same-origin rules
//! would otherwise stop (llama-server's `server-cors-proxy.h`).
//!
//! Off unless the flag is given (then 403), since it makes the server fetch
//! URLs on a client's behalf; it sits behind the API key like every route.
//! Of the client's headers only those it names explicitly are forwarded:
//! `x-llama-server-proxy-header-NAME: value` goes out as `NAME: value`.
//! Nothing else the browser sent (its cookies, the key for this server)
//! reaches the target. Targets are `http://` only (no TLS client here);
//! one connection per request, no pool.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderName, Method, Request, Uri};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;

use super::{ApiError, AppState};

/// The prefix that marks a header as meant for the target.
const FORWARD_PREFIX: &str = "x-llama-server-proxy-header-";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the target may take to answer (llama-server's 10 minutes: a
/// tool call behind it may be slow).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(600);

/// Headers that describe one connection, not the message: never forwarded
/// in either direction (RFC 9110 §7.6.1), nor the framing this side sets.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

#[derive(Deserialize)]
pub struct Target {
    url: Option<String>,
}

/// GET and POST /cors-proxy
pub async fn proxy(
    State(st): State<Arc<AppState>>,
    method: Method,
    Query(target): Query<Target>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if !st.options.cors_proxy {
        return Err(ApiError::forbidden(
            "the CORS proxy is off (start the server with --ui-mcp-proxy)",
        ));
    }
    let url = target
        .url
        .ok_or_else(|| ApiError::invalid("url", "url is required: the target to forward to"))?;
    let target = parse_target(&url)?;
    let body = if method == Method::POST {
        body?
    } else {
        Bytes::new()
    };
    tracing::info!(%method, target = %url, "proxying");

    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect((target.host.as_str(), target.port)),
    )
    .await
    .map_err(|_| ApiError::bad_gateway(format!("connecting to {} timed out", target.authority)))?
    .map_err(|e| ApiError::bad_gateway(format!("cannot connect to {}: {e}", target.authority)))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ApiError::bad_gateway(format!("{}: {e}", target.authority)))?;
    // Drives the connection; it ends when the response body is read or dropped.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("proxied connection ended: {e}");
        }
    });

    let mut request = Request::builder()
        .method(method)
        .uri(target.path)
        .header(header::HOST, &target.authority);
    for (name, value) in forwarded(&headers) {
        request = request.header(name, value);
    }
    let request = request
        .body(Full::new(body))
        .map_err(|e| ApiError::invalid("url", format!("cannot build the request: {e}")))?;
    let response = tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| ApiError::bad_gateway(format!("{} did not answer in time", target.authority)))?
        .map_err(|e| ApiError::bad_gateway(format!("{}: {e}", target.authority)))?;

    let (parts, incoming) = response.into_parts();
    let mut out = Response::new(axum::body::Body::new(incoming));
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        let n = name.as_str();
        // CORS is this server's to answer; cookies are the target's and
        // must not be set on this server's origin.
        if HOP_BY_HOP.contains(&n) || n.starts_with("access-control-") || n == "set-cookie" {
            continue;
        }
        out.headers_mut().append(name.clone(), value.clone());
    }
    Ok(out.into_response())
}

struct ParsedTarget {
    host: String,
    port: u16,
    /// `host[:port]` for the Host header and messages.
    authority: String,
    path: String,
}

fn parse_target(url: &str) -> Result<ParsedTarget, ApiError> {
    let bad = |why: &str| ApiError::invalid("url", format!("{why}: {url}"));
    let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(bad("https targets are not supported (no TLS client)")),
        Some(other) => return Err(bad(&format!("unsupported scheme {other:?}"))),
        None => return Err(bad("the URL needs a scheme (http://)")),
    }
    let authority = uri.authority().ok_or_else(|| bad("the URL has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err(bad("the URL has no host"));
    }
    Ok(ParsedTarget {
        host: host.to_owned(),
        port: authority.port_u16().unwrap_or(80),
        authority: authority.as_str().to_owned(),
        path: uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
    })
}

/// The headers the client named for the target, without their prefix.
fn forwarded(headers: &HeaderMap) -> Vec<(HeaderName, axum::http::HeaderValue)> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            // Header names are lower-case once parsed.
            let rest = name.as_str().strip_prefix(FORWARD_PREFIX)?;
            if rest.is_empty() || HOP_BY_HOP.contains(&rest) {
                return None;
            }
            Some((HeaderName::from_bytes(rest.as_bytes()).ok()?, value.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = parse_target("http://127.0.0.1:8080/mcp?x=1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("127.0.0.1", 8080, "/mcp?x=1")
        );
        let t = parse_target("http://[::1]/").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 80));
        assert_eq!(parse_target("http://example.com").unwrap().path, "/");
        for bad in [
            "https://example.com",
            "ftp://h/",
            "//h/",
            "http://u:p@h/",
            "not a url",
        ] {
            assert!(parse_target(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn only_prefixed_headers_are_forwarded() {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer key".parse().unwrap());
        h.insert("cookie", "s=1".parse().unwrap());
        h.insert(
            "x-llama-server-proxy-header-accept",
            "application/json".parse().unwrap(),
        );
        h.insert("x-llama-server-proxy-header-host", "evil".parse().unwrap());
        h.insert("x-llama-server-proxy-header-", "x".parse().unwrap());
        let f = forwarded(&h);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0.as_str(), "accept");
    }
}
