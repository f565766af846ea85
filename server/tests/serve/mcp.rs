//! MCP servers behind `/tools` (`--mcp-servers-json`, `--mcp-servers-config`)
//! and the opt-in CORS proxy (`--ui-mcp-proxy`), on a real `lamina serve`.
//! The MCP server is lamina-mcp's Python fixture, run by `python3`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{client, model, Server};

fn fixture() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crates/mcp/tests/fixtures/mcp_server.py"
    )
    .to_owned()
}

fn config(servers: Value) -> String {
    json!({ "mcpServers": servers }).to_string()
}

fn call(server: &Server, tool: &str, params: Value) -> client::Response {
    client::post(
        server.port,
        "/tools",
        &json!({"tool": tool, "params": params}),
    )
}

#[test]
fn mcp_tools_are_listed_and_called_beside_a_server_that_fails_to_start() {
    let cfg = config(json!({
        "fx": {"command": "python3", "args": [fixture()]},
        "bad": {"command": "lamina-no-such-mcp-command"},
    }));
    // Beside a built-in tool: both sources are listed.
    let server = Server::start(&["--mcp-servers-json", &cfg, "--tools", "read_file"], &[]);

    let r = client::get(server.port, "/tools");
    assert_eq!(r.status, 200, "{}", r.body);
    let tools = r.json();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["tool"].as_str())
        .collect();
    assert!(
        names.contains(&"fx_echo") && names.contains(&"fx_add"),
        "{names:?}"
    );
    assert!(names.contains(&"read_file"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("bad_")), "{names:?}");
    let echo = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool"] == "fx_echo")
        .unwrap();
    assert_eq!(echo["type"], "mcp");
    assert_eq!(echo["definition"]["type"], "function");
    assert_eq!(echo["definition"]["function"]["name"], "fx_echo");
    assert_eq!(
        echo["definition"]["function"]["parameters"]["type"],
        "object"
    );
    assert_eq!(
        echo["definition"]["function"]["parameters"]["required"][0],
        "message"
    );

    let r = call(&server, "fx_echo", json!({"message": "hello world"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"plain_text_response": "echo: hello world"})
    );
    assert_eq!(
        call(&server, "fx_add", json!({"a": 3, "b": 5})).json()["plain_text_response"],
        "8"
    );

    // A tool's own failure is an answer, not a server error; the process
    // (and its state) survives it.
    let r = call(&server, "fx_fail_once", json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("transient error"),
        "{}",
        r.body
    );
    assert_eq!(
        call(&server, "fx_fail_once", json!({})).json(),
        json!({"plain_text_response": "ok"})
    );

    // Concurrent calls each get their own reply.
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let port = server.port;
            std::thread::spawn(move || {
                let r = client::post(
                    port,
                    "/tools",
                    &json!({"tool": "fx_echo", "params": {"message": i.to_string()}}),
                );
                (i, r.json())
            })
        })
        .collect();
    for c in calls {
        let (i, body) = c.join().unwrap();
        assert_eq!(body["plain_text_response"], format!("echo: {i}"));
    }

    // A crash is followed by a fresh process on the next call.
    assert_eq!(
        call(&server, "fx_crash", json!({})).json()["plain_text_response"],
        "crashing"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        call(&server, "fx_echo", json!({"message": "again"})).json()["plain_text_response"],
        "echo: again"
    );

    // The client's mistakes.
    assert_eq!(call(&server, "fx_nope", json!({})).status, 404);
    assert_eq!(call(&server, "bad_anything", json!({})).status, 404);
    let r = client::post(
        server.port,
        "/tools",
        &json!({"tool": "fx_echo", "params": [1]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let r = client::post(server.port, "/tools", &json!({"params": {}}));
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn a_config_file_works_and_a_slow_tool_times_out_per_its_limit() {
    let dir = std::env::temp_dir().join(format!("lamina-mcp-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mcp.json");
    std::fs::write(
        &file,
        config(json!({"slow": {"command": "python3", "args": [fixture()], "timeout_ms": 400}})),
    )
    .unwrap();
    let server = Server::start(&["--mcp-servers-config", file.to_str().unwrap()], &[]);
    let t0 = Instant::now();
    let r = call(&server, "slow_sleep", json!({"seconds": 5}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.json()["error"].as_str().unwrap().contains("timed out"),
        "{}",
        r.body
    );
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t0.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_config_stops_the_server_with_the_reason() {
    for args in [
        vec!["--mcp-servers-json", "not valid json"],
        vec![
            "--mcp-servers-json",
            r#"{"mcpServers": {"a": {"command": "x", "args": "y"}}}"#,
        ],
        vec!["--mcp-servers-config", "/nonexistent/lamina-mcp.json"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["serve", "-m", &model(), "--port", "0"])
            .args(&args)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(args[0]), "{args:?}: {err}");
    }
}

#[test]
fn tools_and_the_proxy_are_403_unless_enabled() {
    let server = Server::start(&[], &[]);
    assert_eq!(client::get(server.port, "/tools").status, 403);
    assert_eq!(call(&server, "x_y", json!({})).status, 403);
    let r = client::get(server.port, "/cors-proxy?url=http://127.0.0.1:1/");
    assert_eq!(r.status, 403, "{}", r.body);
}

#[test]
fn shutdown_ends_a_slow_tool_call_at_once() {
    let cfg = config(json!({"slow": {"command": "python3", "args": [fixture()]}}));
    let server = Server::start(&["--mcp-servers-json", &cfg], &[]);
    let port = server.port;
    let slow = std::thread::spawn(move || {
        let mut s = client::open(
            port,
            "POST",
            "/tools",
            Some(&json!({"tool": "slow_sleep", "params": {"seconds": 30}})),
            &[],
        );
        let mut raw = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut raw);
        raw
    });
    std::thread::sleep(Duration::from_millis(700));
    let mut server = server;
    let t0 = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    while server.alive() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "exit took {:?}\n{}",
        t0.elapsed(),
        server.log()
    );
    let raw = slow.join().unwrap();
    assert!(raw.is_empty() || raw.contains("cancelled"), "{raw}");
}

/// A one-shot HTTP server: answers `status` to the first request and sends
/// back its head (lower-cased).
fn capture(status: &'static str) -> (u16, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line.to_ascii_lowercase());
        }
        let body = if status.starts_with("204") {
            ""
        } else {
            "captured"
        };
        let mut s = s;
        let _ = write!(s, "HTTP/1.1 {status}\r\nContent-Length: {}\r\nSet-Cookie: t=1\r\nConnection: close\r\n\r\n{body}", body.len());
        let _ = tx.send(head);
    });
    (port, rx)
}

#[test]
fn the_cors_proxy_forwards_only_the_headers_it_is_told_to() {
    let server = Server::start(&["--ui-mcp-proxy", "--api-key", "k1"], &[]);
    let (target, head) = capture("200 OK");
    let r = client::request(
        server.port,
        "GET",
        &format!("/cors-proxy?url=http://127.0.0.1:{target}/capture"),
        None,
        &[
            ("Authorization", "Bearer k1"),
            ("Cookie", "session=secret"),
            ("X-Api-Key", "k1"),
            ("x-llama-server-proxy-header-accept", "application/json"),
            (
                "x-llama-server-proxy-header-authorization",
                "Bearer explicit",
            ),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, "captured");
    assert!(!r.head.contains("set-cookie"), "{}", r.head);
    let head = head.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(head.starts_with("get /capture "), "{head}");
    assert!(head.contains("accept: application/json"), "{head}");
    assert!(head.contains("authorization: bearer explicit"), "{head}");
    for leaked in [
        "cookie",
        "x-api-key",
        "bearer k1",
        "x-llama-server-proxy-header",
    ] {
        assert!(!head.contains(leaked), "{leaked} forwarded: {head}");
    }

    // A 204 comes back as a 204 with no body.
    let (target, _head) = capture("204 No Content");
    let r = client::request(
        server.port,
        "POST",
        &format!("/cors-proxy?url=http://127.0.0.1:{target}/"),
        Some(&json!({})),
        &[("Authorization", "Bearer k1")],
    );
    assert_eq!(r.status, 204, "{}", r.body);
    assert!(r.body.is_empty());

    // Without the key, and to a target it cannot serve.
    assert_eq!(
        client::get(server.port, "/cors-proxy?url=http://127.0.0.1:1/").status,
        401
    );
    let r = client::request(
        server.port,
        "GET",
        "/cors-proxy?url=https://example.com/",
        None,
        &[("Authorization", "Bearer k1")],
    );
    assert_eq!(r.status, 400, "{}", r.body);
}
