//! The chat page at `/`: one HTML file, its script and its style sheet,
//! embedded in the binary (no build step, nothing fetched from elsewhere).
//!
//! The page and its assets load without the API key, so a browser can show
//! the key field; every call the script makes goes through the API and its
//! key check like any client's. The script is served at its own route so
//! the Content-Security-Policy can forbid inline script entirely: even if
//! model text reached the DOM as markup (the script only ever sets
//! `textContent`), nothing in it could run.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const HTML: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/chat.js");
const STYLE: &str = include_str!("page/chat.css");

/// Same-origin only: no inline script or style, no frames, no plugins, and
/// `connect-src 'self'` so the script can talk to this server alone.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The paths the auth layer lets through without a key.
pub const PUBLIC: [&str; 3] = ["/", "/chat.js", "/chat.css"];

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    asset(HTML, "text/html; charset=utf-8")
}

pub async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

pub async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}
