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
