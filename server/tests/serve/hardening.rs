//! Clients that misbehave on the wire: `--read-timeout` cuts off a client
//! that stalls mid-request, and the server goes on answering the others.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::{client, Server};

/// Writes `raw` on a new connection, then reads until the server hangs up;
/// how long that took.
fn closed_after(port: u16, raw: &[u8]) -> Duration {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let t0 = Instant::now();
    s.write_all(raw).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return t0.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return t0.elapsed(),
            Err(e) => panic!("still open after {:?}: {e}", t0.elapsed()),
        }
    }
}

#[test]
fn a_client_that_stalls_mid_request_line_is_cut_off() {
    let server = Server::start(&["--read-timeout", "1"], &[]);
    let stalled: Vec<_> = (0..4)
        .map(|_| {
            let port = server.port;
            std::thread::spawn(move || closed_after(port, b"POST /v1/chat/compl"))
        })
        .collect();
    // Others are served while those connections hang.
    let r = client::get(server.port, "/health");
    assert_eq!(r.status, 200, "{}", r.body);
    for t in stalled {
        let took = t.join().unwrap();
        assert!(
            took >= Duration::from_millis(700) && took < Duration::from_secs(6),
            "closed after {took:?}"
        );
    }
    let r = client::get(server.port, "/v1/models");
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Reads a response's status line (up to the first CRLF).
fn status_line(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading the status: {e} (got {got:?})"),
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    text.lines().next().unwrap_or_default().to_owned()
}

fn post_head(len: usize, extra: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         {extra}Content-Length: {len}\r\n\r\n"
    )
    .into_bytes()
}

#[test]
fn an_oversize_body_is_refused_from_its_headers_and_the_client_reads_413() {
    let server = Server::start(&["--read-timeout", "20", "--api-key", "k"], &[]);
    let auth = "Authorization: Bearer k\r\n";

    // Declared too large: answered from the headers, before any body byte
    // (before this, the server waited for the body until the read timeout).
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    s.write_all(&post_head(64 << 20, auth)).unwrap();
    assert!(status_line(&mut s).starts_with("HTTP/1.1 413"));
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());

    // A client that sends its whole 4 MiB body anyway, refused for size and
    // for a wrong key: every write succeeds and it reads the status (before
    // this, the socket closed unread and the client saw a reset or EPIPE).
    let body = vec![b' '; 4 << 20];
    for (extra, want) in [(auth, "413"), ("Authorization: Bearer wrong\r\n", "401")] {
        let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&post_head(body.len(), extra)).unwrap();
        s.write_all(&body).unwrap();
        let line = status_line(&mut s);
        assert!(line.starts_with(&format!("HTTP/1.1 {want}")), "{line}");
    }
    let r = client::get(server.port, "/health");
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Sends `signal` (a `kill -s` name) to the server process.
fn signal(server: &Server, name: &str) {
    let pid = server.child.id().to_string();
    let ok = std::process::Command::new("kill")
        .args(["-s", name, &pid])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Waits for the server to exit; its status and how long that took.
fn exit_within(server: &mut Server, limit: Duration) -> (std::process::ExitStatus, Duration) {
    let t0 = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return (status, t0.elapsed());
        }
        assert!(t0.elapsed() < limit, "still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A request whose body never comes: it stays open (up to --read-timeout),
/// which graceful shutdown waits for.
fn hold_a_request(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&post_head(100, "")).unwrap();
    // Give the server time to start on it.
    std::thread::sleep(Duration::from_millis(300));
    s
}

#[test]
fn shutdown_gives_up_after_the_grace_and_a_second_signal_exits_at_once() {
    // Past --shutdown-grace, the process exits non-zero although a request
    // is still open (before this, it waited for the request however long).
    let mut server = Server::start(&["--read-timeout", "60", "--shutdown-grace", "1"], &[]);
    let _held = hold_a_request(server.port);
    signal(&server, "TERM");
    let (status, took) = exit_within(&mut server, Duration::from_secs(10));
    assert!(!status.success() && status.code().is_some(), "{status:?}");
    assert!(took >= Duration::from_millis(800), "{took:?}");

    // A second signal exits at once, long before the grace is over.
    let mut server = Server::start(&["--read-timeout", "60", "--shutdown-grace", "60"], &[]);
    let _held = hold_a_request(server.port);
    signal(&server, "TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the first signal waits"
    );
    signal(&server, "INT");
    let (status, _) = exit_within(&mut server, Duration::from_secs(5));
    assert_eq!(status.code(), Some(130), "{status:?}");
}

#[test]
fn streams_cut_by_the_shutdown_grace_get_a_final_error_event() {
    // A long stream outlives a 1 s grace: it must end with an error event,
    // not a dropped connection, and the exit status says requests were cut
    // (before this, the process exited under the open stream).
    let mut server = Server::start(&["--shutdown-grace", "1", "--parallel", "1"], &[]);
    let mut reader = super::stream_story(server.port, 2000, &[]);
    signal(&server, "TERM");
    let mut rest = String::new();
    // Reads to the end of the stream (the server closes the connection).
    let _ = reader.read_to_string(&mut rest);
    let (status, _) = exit_within(&mut server, Duration::from_secs(10));
    let data: Vec<&str> = rest
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{rest}");
    let last: serde_json::Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(last["error"]["code"], "server_shutting_down", "{rest}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--shutdown-grace"),
        "{last}"
    );
    // Content kept coming during the grace.
    assert!(data.len() > 3, "{rest}");
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(
        server.log().contains("ended 1 of them with an error"),
        "{}",
        server.log()
    );
}

/// `--host a,b` listens on every address, on one port, as llama-server
/// does (127.0.0.2 is loopback on Linux, so this needs no IPv6).
#[test]
fn several_host_addresses_are_all_served_on_one_port() {
    let server = Server::start(&["--host", "127.0.0.1,127.0.0.2", "-np", "1"], &[]);
    assert_eq!(client::get(server.port, "/health").status, 200);
    let mut s = TcpStream::connect(("127.0.0.2", server.port)).unwrap();
    write!(
        s,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.2\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(server.log().matches("listening on http://").count(), 2);
}
