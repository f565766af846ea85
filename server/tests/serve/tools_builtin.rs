//! `--tools` and the `/tools` endpoint: each built-in tool through HTTP on
//! a real server, its errors, the `x-tool-cwd` header, streaming, and the
//! runtime checks that keep a header from becoming a command-line option.
//! Files live in a fresh directory under the system's temp dir per test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{client, model, Server};

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "lamina-tools-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn s(&self) -> String {
        self.0.to_str().unwrap().to_owned()
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tools_server() -> Server {
    Server::start(&["--tools", "all"], &[])
}

fn post(s: &Server, tool: &str, params: Value, headers: &[(&str, &str)]) -> client::Response {
    let body = json!({"tool": tool, "params": params});
    client::request(s.port, "POST", "/tools", Some(&body), headers)
}

/// A call that must succeed: 200 and no `error`.
fn ok(s: &Server, tool: &str, params: Value, headers: &[(&str, &str)]) -> Value {
    let r = post(s, tool, params, headers);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v.get("error").is_none(), "{v}");
    v
}

/// A tool that ran and failed: 200 with its `error` message.
fn tool_error(s: &Server, tool: &str, params: Value) -> String {
    let r = post(s, tool, params, &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {}", r.body))
        .to_owned()
}

fn text(v: &Value) -> &str {
    v["plain_text_response"].as_str().unwrap()
}

#[test]
fn tools_are_off_without_the_flag() {
    let s = Server::start(&[], &[]);
    let r = client::get(s.port, "/tools");
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "feature_disabled");
    let r = post(&s, "exec_shell_command", json!({"command": "echo hi"}), &[]);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["error"]["message"], "this feature is disabled");
}

#[test]
fn listing_names_the_enabled_tools_only() {
    let s = Server::start(&["--tools", "grep_search,read_file"], &[]);
    let r = client::get(s.port, "/tools");
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool"].as_str().unwrap())
        .collect();
    // llama-server's order, whatever the flag's.
    assert_eq!(names, ["read_file", "grep_search"]);
    let read = &v[0];
    assert_eq!(read["type"], "server");
    assert_eq!(read["permissions"]["write"], false);
    assert_eq!(read["uses_cwd"], true);
    assert_eq!(read["definition"]["function"]["name"], "read_file");
    assert_eq!(
        read["definition"]["function"]["parameters"]["required"],
        json!(["path"])
    );

    // A tool that was not enabled is unknown.
    let r = post(&s, "write_file", json!({"path": "x", "content": ""}), &[]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("unknown tool"), "{}", r.body);

    // A body without a tool, or not JSON, is the client's error.
    let r = client::post(s.port, "/tools", &json!({"params": {}}));
    assert_eq!(r.status, 400, "{}", r.body);
    let r = post(&s, "read_file", json!({}), &[]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("path"), "{}", r.body);
}

#[test]
fn unknown_tool_names_fail_the_start() {
    for args in [
        &["--tools", "read_file,rm_rf"][..],
        &["--tools", "all", "--tools-runtime", "fake:x"][..],
        &[
            "--tools",
            "all",
            "--tools-runtime",
            "ssh:-oProxyCommand=true",
        ][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["serve", "-m", &model(), "--port", "0"])
            .args(args)
            .env_remove("LAMINA_API_KEY")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("unknown tool") || err.contains("invalid ssh target"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn write_read_and_edit_files() {
    let s = tools_server();
    let dir = TempDir::new("files");
    let path = dir.path().join("sub/test.log").to_str().unwrap().to_owned();

    let w = ok(
        &s,
        "write_file",
        json!({"path": path, "content": "line1\nline2\nline3\n"}),
        &[],
    );
    assert_eq!(w["result"], "file written successfully");
    assert_eq!(w["bytes"], 18);
    let r = ok(&s, "read_file", json!({"path": path}), &[]);
    assert_eq!(text(&r), "line1\nline2\nline3\n");

    // A range, numbered.
    let r = ok(
        &s,
        "read_file",
        json!({"path": path, "start_line": 2, "end_line": 2, "append_loc": true}),
        &[],
    );
    assert_eq!(text(&r), "2\u{2192}line2\n");

    // The raw bytes, when the client asks.
    let r = ok(
        &s,
        "read_file",
        json!({"path": path}),
        &[("x-resp-type", "base64")],
    );
    assert_eq!(r["base64"], "bGluZTEKbGluZTIKbGluZTMK");
    assert_eq!(r["size_bytes"], 18);

    let e = ok(
        &s,
        "edit_file",
        json!({"path": path, "edits": [
            {"old_text": "line2", "new_text": "line2-edited"},
            {"old_text": "line3\n", "new_text": "line3\nline4\n"},
        ]}),
        &[],
    );
    assert_eq!(e["result"], "file edited successfully");
    assert_eq!(e["edits_applied"], 2);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "line1\nline2-edited\nline3\nline4\n"
    );

    // Typographic quotes and trailing blanks in the file still match.
    dir.write("q.txt", "keep  \nsay \u{201C}hi\u{201D}  \n");
    let q = dir.path().join("q.txt").to_str().unwrap().to_owned();
    ok(
        &s,
        "edit_file",
        json!({"path": q, "edits": [{"old_text": "say \"hi\"", "new_text": "say bye"}]}),
        &[],
    );
    assert_eq!(std::fs::read_to_string(&q).unwrap(), "keep  \nsay bye\n");

    // The failures the model is told about.
    dir.write("dup.txt", "dup\ndup\n");
    let dup = dir.path().join("dup.txt").to_str().unwrap().to_owned();
    let err = tool_error(
        &s,
        "edit_file",
        json!({"path": dup, "edits": [{"old_text": "dup", "new_text": "x"}]}),
    );
    assert!(err.contains("unique"), "{err}");
    let err = tool_error(
        &s,
        "edit_file",
        json!({"path": path, "edits": [
            {"old_text": "line1\nline2", "new_text": "a"},
            {"old_text": "line2", "new_text": "b"},
        ]}),
    );
    assert!(err.contains("overlap"), "{err}");
    let err = tool_error(
        &s,
        "edit_file",
        json!({"path": path, "edits": [{"old_text": "nowhere", "new_text": "x"}]}),
    );
    assert!(err.contains("could not find"), "{err}");
    let err = tool_error(&s, "edit_file", json!({"path": path, "edits": []}));
    assert!(err.contains("non-empty"), "{err}");
    let err = tool_error(
        &s,
        "edit_file",
        json!({"path": path, "edits": [{"old_text": "line1", "new_text": "line1"}]}),
    );
    assert!(err.contains("no changes"), "{err}");
    // The file is as the last good edit left it.
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "line1\nline2-edited\nline3\nline4\n"
    );

    let missing = dir.path().join("missing.txt").to_str().unwrap().to_owned();
    let err = tool_error(&s, "read_file", json!({"path": missing}));
    assert!(err.starts_with("cannot stat file"), "{err}");
    // A file past 16 KiB needs a range.
    dir.write("big.txt", &"x".repeat(100).repeat(200));
    let big = dir.path().join("big.txt").to_str().unwrap().to_owned();
    let err = tool_error(&s, "read_file", json!({"path": big}));
    assert!(err.contains("file too large"), "{err}");
    let err = tool_error(
        &s,
        "write_file",
        json!({"path": format!("{}/nodir", big), "content": "x"}),
    );
    assert!(err.starts_with("failed to write file"), "{err}");
}

#[test]
fn glob_search_types_depth_limit_and_junk() {
    let s = tools_server();
    let dir = TempDir::new("glob");
    dir.write("project-alpha/README.md", "alpha");
    dir.write("project-alpha/src/main.cpp", "int main() {}");
    dir.write("project-beta/notes.txt", "beta");
    dir.write("build/artifact.txt", "built");
    dir.write("a/b/deep.txt", "deep");

    let v = ok(
        &s,
        "file_glob_search",
        json!({"path": dir.s(), "type": "dir"}),
        &[],
    );
    let t = text(&v);
    assert!(
        t.contains("project-alpha/\n") && t.contains("project-alpha/src/\n"),
        "{t}"
    );
    assert!(!t.contains("README.md"), "{t}");
    assert_eq!(v["base"], dir.s());
    // A junk directory is listed but never walked.
    assert!(t.contains("build/\n"), "{t}");
    let v = ok(
        &s,
        "file_glob_search",
        json!({"path": dir.s(), "type": "all"}),
        &[],
    );
    let paths: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"project-alpha/src/main.cpp"), "{paths:?}");
    assert!(!paths.contains(&"build/artifact.txt"), "{paths:?}");

    let v = ok(
        &s,
        "file_glob_search",
        json!({"path": dir.s(), "max_depth": 2, "include": "*.txt"}),
        &[],
    );
    assert!(text(&v).contains("project-beta/notes.txt"), "{}", text(&v));
    assert!(!text(&v).contains("deep.txt"), "{}", text(&v));

    let v = ok(
        &s,
        "file_glob_search",
        json!({"path": dir.s(), "limit": 1}),
        &[],
    );
    assert_eq!(v["entries"].as_array().unwrap().len(), 1);
    assert!(text(&v).contains("Total matches: 4"), "{}", text(&v));
    assert!(text(&v).contains("results limit reached"), "{}", text(&v));

    let err = tool_error(
        &s,
        "file_glob_search",
        json!({"path": dir.s(), "type": "bogus"}),
    );
    assert!(err.contains("invalid type"), "{err}");
    let err = tool_error(&s, "file_glob_search", json!({"path": dir.s(), "limit": 0}));
    assert!(err.contains("invalid limit"), "{err}");
    let err = tool_error(
        &s,
        "file_glob_search",
        json!({"path": dir.path().join("nope").to_str().unwrap()}),
    );
    assert!(err.contains("not a directory"), "{err}");
}

#[test]
fn grep_search_matches_lines() {
    let s = tools_server();
    let dir = TempDir::new("grep");
    dir.write("src/a.rs", "fn main() {\n    let marker_x = 1;\n}\n");
    dir.write("src/b.txt", "Marker_X here\n");
    dir.write("node_modules/dep.rs", "marker_x\n");

    let v = ok(
        &s,
        "grep_search",
        json!({"path": dir.s(), "pattern": "marker_[x]", "include": "*.rs"}),
        &[],
    );
    let t = text(&v);
    assert!(t.contains("src/a.rs:    let marker_x = 1;"), "{t}");
    assert!(!t.contains("node_modules"), "{t}");
    assert!(t.contains("Total matches: 1"), "{t}");

    let v = ok(
        &s,
        "grep_search",
        json!({"path": dir.s(), "pattern": "marker_x", "ignore_case": true, "return_line_numbers": true}),
        &[],
    );
    assert!(
        text(&v).contains("src/b.txt:1:Marker_X here"),
        "{}",
        text(&v)
    );
    assert!(text(&v).contains("Total matches: 2"), "{}", text(&v));

    // One file, with context; the path shown is the one given.
    let file = dir.path().join("src/a.rs").to_str().unwrap().to_owned();
    let v = ok(
        &s,
        "grep_search",
        json!({"path": file, "pattern": "let", "context_lines": 1}),
        &[],
    );
    assert_eq!(
        text(&v),
        format!("{file}-1-fn main() {{\n{file}:2:    let marker_x = 1;\n{file}-3-}}\n--\n\n---\nTotal matches: 1\n")
    );

    let v = ok(
        &s,
        "grep_search",
        json!({"path": dir.s(), "pattern": "main(", "literal": true}),
        &[],
    );
    assert!(text(&v).contains("Total matches: 1"), "{}", text(&v));
    let err = tool_error(
        &s,
        "grep_search",
        json!({"path": dir.s(), "pattern": "main("}),
    );
    assert!(err.starts_with("invalid regex"), "{err}");
    let err = tool_error(
        &s,
        "grep_search",
        json!({"path": dir.path().join("nope").to_str().unwrap(), "pattern": "x"}),
    );
    assert!(err.starts_with("path does not exist"), "{err}");
}

#[test]
fn shell_commands_run_and_stream() {
    let s = tools_server();
    let dir = TempDir::new("shell");
    let cwd = dir.s();
    let h = [("x-tool-cwd", cwd.as_str())];

    let v = ok(
        &s,
        "exec_shell_command",
        json!({"command": "echo out; echo err >&2; exit 3"}),
        &[],
    );
    assert_eq!(text(&v), "out\nerr\n\n[exit code: 3]");

    // The cwd header: commands run there, relative paths resolve there,
    // and a model's own `cwd` parameter is not read.
    ok(
        &s,
        "exec_shell_command",
        json!({"command": "echo hello > marker.txt"}),
        &h,
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("marker.txt")).unwrap(),
        "hello\n"
    );
    let v = ok(
        &s,
        "read_file",
        json!({"path": "marker.txt", "cwd": "/definitely/not/here"}),
        &h,
    );
    assert_eq!(text(&v), "hello\n");
    ok(
        &s,
        "write_file",
        json!({"path": "sub/out.txt", "content": "written"}),
        &h,
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("sub/out.txt")).unwrap(),
        "written"
    );
    let v = ok(
        &s,
        "file_glob_search",
        json!({"path": ".", "include": "*.txt"}),
        &h,
    );
    assert!(text(&v).contains("marker.txt"), "{}", text(&v));
    let v = ok(&s, "get_info", json!({}), &h);
    assert_eq!(v["cwd"], cwd);
    assert!(!v["os"].as_str().unwrap().is_empty());

    // The deadline ends the command, and what it started, on time.
    let t = Instant::now();
    let v = ok(
        &s,
        "exec_shell_command",
        json!({"command": "echo a; sleep 30 & wait", "timeout": 1}),
        &[],
    );
    assert!(
        text(&v).ends_with("[exit due to timed out]"),
        "{}",
        text(&v)
    );
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());

    // Output past the cap is cut and marked.
    let v = ok(
        &s,
        "exec_shell_command",
        json!({"command": "yes | head -c 100000", "max_output_size": 6}),
        &[],
    );
    assert_eq!(text(&v), "y\ny\ny\n\n[output truncated]\n[exit code: 0]");

    // Streamed: chunks, then done.
    let body = json!({"tool": "exec_shell_command", "params": {"command": "echo hello; echo world"}, "stream": true});
    let r = client::request(s.port, "POST", "/tools", Some(&body), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.head.contains("content-type: text/event-stream"),
        "{}",
        r.head
    );
    let events: Vec<Value> = r
        .sse_data()
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let (last, chunks) = events.split_last().unwrap();
    assert_eq!(last, &json!({"done": true}));
    let joined: String = chunks
        .iter()
        .map(|e| e["chunk"].as_str().unwrap())
        .collect();
    assert_eq!(joined, "hello\nworld\n\n[exit code: 0]");

    // Only the shell streams.
    let body = json!({"tool": "read_file", "params": {"path": "x"}, "stream": true});
    let r = client::request(s.port, "POST", "/tools", Some(&body), &[]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("does not support stream"), "{}", r.body);
}

#[test]
fn runtime_headers_never_become_options() {
    let s = tools_server();
    let marker = TempDir::new("pwned");
    let touched = marker.path().join("pwned");
    let touch = format!("touch {}", touched.display());
    let cases = [
        ("fake:does-not-exist".to_owned(), "unknown tool runtime"),
        (format!("ssh:-oProxyCommand={touch}"), "invalid ssh target"),
        (
            "docker-container:--privileged".to_owned(),
            "invalid container id",
        ),
        (
            "podman-container:--privileged".to_owned(),
            "invalid container id",
        ),
        ("docker:busybox".to_owned(), "must name a running container"),
    ];
    for (runtime, want) in &cases {
        for stream in [false, true] {
            let body = json!({"tool": "exec_shell_command", "params": {"command": touch}, "stream": stream});
            let r = client::request(
                s.port,
                "POST",
                "/tools",
                Some(&body),
                &[("x-tool-runtime", runtime)],
            );
            assert_eq!(r.status, 500, "{runtime}: {}", r.body);
            assert!(r.body.contains(want), "{runtime}: {}", r.body);
        }
    }
    // Nothing ran: not on the host, not through ssh's ProxyCommand.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!touched.exists());
}

#[test]
fn a_client_that_hangs_up_stops_the_command() {
    use std::io::BufRead as _;
    let s = tools_server();
    let body = json!({
        "tool": "exec_shell_command",
        "params": {"command": "echo pid=$$; while true; do echo x; sleep 0.1; done", "timeout": 60},
        "stream": true,
    });
    let stream = client::open(s.port, "POST", "/tools", Some(&body), &[]);
    let mut r = std::io::BufReader::new(stream);
    let mut line = String::new();
    let pid = loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "stream ended");
        if let Some(at) = line.find("pid=") {
            let digits: String = line[at + 4..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            break digits.parse::<u32>().unwrap();
        }
    };
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    assert!(proc_dir.exists());
    drop(r);
    // The next chunk finds the client gone and the command's group is
    // killed, long before its 60 s.
    let end = Instant::now() + Duration::from_secs(10);
    while proc_dir.exists() {
        assert!(Instant::now() < end, "the command outlived its client");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The server goes on serving.
    let v = ok(
        &s,
        "exec_shell_command",
        json!({"command": "echo still"}),
        &[],
    );
    assert_eq!(text(&v), "still\n\n[exit code: 0]");
}

#[test]
fn a_client_that_hangs_up_stops_a_silent_command() {
    let s = tools_server();
    let dir = TempDir::new("silent");
    let pid_file = dir.path().join("pid");
    let command = format!("echo $$ > {}; sleep 30", pid_file.display());
    for stream in [true, false] {
        let _ = std::fs::remove_file(&pid_file);
        let body = json!({
            "tool": "exec_shell_command",
            "params": {"command": command, "timeout": 60},
            "stream": stream,
        });
        let conn = client::open(s.port, "POST", "/tools", Some(&body), &[]);
        let end = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            if let Some(p) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
            {
                break p;
            }
            assert!(Instant::now() < end, "the command did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        drop(conn);
        while proc_dir.exists() {
            assert!(
                Instant::now() < end,
                "stream={stream}: the command outlived its client"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
