//! The chat page in a real browser: headless Chromium driven by selenium
//! (`chat_page.py` beside this file holds the checks) against a served
//! model with an API key, so the page's key prompt is exercised too.

use std::process::Command;

use super::Server;

#[test]
fn the_chat_page_streams_an_answer_in_chromium() {
    let probe = Command::new("python3")
        .args(["-c", "import selenium"])
        .output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "python3 with the `selenium` package is needed: run scripts/install-deps.sh"
    );
    for exe in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            std::path::Path::new(exe).exists(),
            "{exe} is needed (Debian packages chromium, chromium-driver): run scripts/install-deps.sh"
        );
    }
    let server = Server::start(
        &["-n", "24", "--temp", "0"],
        &[("LAMINA_API_KEY", "page-key")],
    );
    let base = format!("http://127.0.0.1:{}", server.port);

    // The page itself needs no key and carries its security headers.
    let page = super::client::get(server.port, "/");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("chat.js"));
    assert!(
        page.head
            .contains("content-security-policy: default-src 'none'; script-src 'self';")
            && !page.head.contains("unsafe-inline"),
        "{}",
        page.head
    );
    assert!(
        page.head.contains("x-content-type-options: nosniff"),
        "{}",
        page.head
    );

    let dir = std::env::temp_dir().join(format!("lamina-chat-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join("chat.png");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve/chat_page.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&base)
        .arg("page-key")
        .arg(&shot)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "chat page checks failed:\n{text}");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    println!("screenshot: {}", shot.display());
}
