//! A tiny HTTP/1.1 client over `std::net::TcpStream` for black-box tests:
//! one request per connection, chunked bodies decoded, SSE `data:` lines
//! split out, and a raw handle for clients that hang up mid-stream.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

pub struct Response {
    pub status: u16,
    /// Header lines, lower-cased.
    pub head: String,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// The `data:` payloads of an SSE body, in order (comments skipped).
    pub fn sse_data(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .flat_map(|event| event.lines())
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .map(str::to_owned)
            .collect()
    }
}

/// Connects and writes one request; the caller reads (or hangs up).
pub fn open(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).expect("write");
    s
}

pub fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Response {
    let mut s = open(port, method, path, body, headers);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    parse(&raw)
}

pub fn post(port: u16, path: &str, body: &Value) -> Response {
    request(port, "POST", path, Some(body), &[])
}

pub fn get(port: u16, path: &str) -> Response {
    request(port, "GET", path, None, &[])
}

fn parse(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let mut body = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Response {
        status,
        head,
        body: String::from_utf8(body).expect("UTF-8 body"),
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
}

/// Reads from a streaming response until `needle` has arrived.
pub fn read_until(s: TcpStream, needle: &str) -> BufReader<TcpStream> {
    let mut r = BufReader::new(s);
    let mut seen = String::new();
    let mut line = String::new();
    while !seen.contains(needle) {
        line.clear();
        let n = r.read_line(&mut line).expect("read");
        assert!(n > 0, "stream ended before {needle:?}: {seen}");
        seen.push_str(&line);
    }
    r
}
