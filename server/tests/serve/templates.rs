//! A hostile chat template, as a downloaded model file could carry
//! (given here with `--chat-template-file`): requests that trip it fail
//! with an error naming the limit, many at once cannot take the server's
//! memory, and everyone else is still served.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{client, user, Server};

/// Chooses by the first message: amplifications for three contents,
/// ChatML for anything else.
const TEMPLATE: &str = "\
{%- set first = messages[0].content -%}
{%- if first == 'indent' -%}
{%- set v = {'a': [[[[1, 2, 3, 4]]]] * 100} -%}{{ v | tojson(indent=' ' * 100000) }}
{%- elif first == 'serialise' -%}
{%- set l = ['x' * 10000] * 100000 -%}{{ l | tojson | length }}
{%- elif first == 'spin' -%}
{%- for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor -%}
{%- else -%}
{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}
<|im_start|>assistant\n
{%- endif -%}";

/// The server's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn hostile_templates_fail_their_requests_and_the_server_keeps_serving() {
    let path = std::env::temp_dir().join(format!("lamina-hostile-{}.jinja", std::process::id()));
    std::fs::write(&path, TEMPLATE).unwrap();
    let mut server = Server::start(
        &[
            "--chat-template-file",
            path.to_str().unwrap(),
            "-c",
            "512",
            "--parallel",
            "1",
            "--ngl",
            "0",
        ],
        &[],
    );
    let _ = std::fs::remove_file(&path);
    let normal = server.chat(user("Name a fruit.", 4));
    assert_eq!(normal.status, 200, "{}", normal.body);
    let before = peak_rss(&server);

    // Eight of each at once. Before the limits, one `indent` render built
    // ~1 GB and one `serialise` render 1 GB, eight of them on eight
    // threads; one `spin` took ~250 ms of CPU.
    let port = server.port;
    let t0 = Instant::now();
    let hostile: Vec<_> = (0..24)
        .map(|i| {
            let kind = ["indent", "serialise", "spin"][i % 3];
            let body = user(kind, 4);
            std::thread::spawn(move || (kind, client::post(port, "/v1/chat/completions", &body)))
        })
        .collect();
    // Meanwhile an ordinary request is answered.
    let r = server.chat(user("Name a colour.", 4));
    assert_eq!(r.status, 200, "{}", r.body);
    for h in hostile {
        let (kind, r) = h.join().unwrap();
        let message = r.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match kind {
            "indent" => {
                assert_eq!(r.status, 400, "{kind}: {}", r.body);
                assert!(message.contains("at most 64"), "{kind}: {message}");
            }
            _ => {
                assert_eq!(r.status, 422, "{kind}: {}", r.body);
                assert_eq!(r.json()["error"]["code"], "chat_template_limit");
                assert!(
                    message.contains("fuel") || message.contains("time limit"),
                    "{kind}: {message}"
                );
            }
        }
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let grew = peak_rss(&server).saturating_sub(before);
    assert!(grew < 256 << 20, "peak memory grew by {} MiB", grew >> 20);
    assert!(server.alive());
    assert_eq!(client::get(server.port, "/health").status, 200);
    let r = server.chat(json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.body);
}

/// `--chat-template NAME` picks a built-in format by llama.cpp's name, or
/// takes Jinja source inline; a name Lamina has no template for stops the
/// server at start with a line naming the ones it has.
#[test]
fn chat_template_takes_a_builtin_name_or_inline_jinja() {
    let messages = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let server = Server::start(&["--chat-template", "gemma", "--parallel", "1"], &[]);
    let r = client::post(server.port, "/apply-template", &messages);
    assert_eq!(r.status, 200, "{}", r.body);
    let prompt = r.json()["prompt"].as_str().unwrap().to_owned();
    assert!(prompt.contains("<start_of_turn>user\nHi"), "{prompt}");
    drop(server);

    let inline = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
    let server = Server::start(&["--chat-template", inline, "--parallel", "1"], &[]);
    let r = client::post(server.port, "/apply-template", &messages);
    assert_eq!(r.json()["prompt"], "[user] Hi\n", "{}", r.body);
    drop(server);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["serve", "-m", &super::model(), "--port", "0"])
        .args(["--chat-template", "vicuna"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("chatml, llama3, gemma, mistral, phi3, command-r"),
        "{err}"
    );
}

/// FireFunction v2 concatenates `functions` to its system prompt: defined
/// as llama.cpp's chat layer defined it (the tools as indented JSON, or
/// empty), the template renders with today's date, with and without tools;
/// another template that adds an undefined name still fails.
#[test]
fn firefunction_v2_renders_with_functions_defined() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/templates/fireworks-ai-llama-3-firefunction-v2.jinja"
    );
    let server = Server::start(&["--chat-template-file", path, "--parallel", "1"], &[]);
    // The server formats its local time, as llama.cpp does.
    let today = chrono::Local::now().format("%b %d %Y").to_string();
    let tool = json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    for tools in [None, Some(json!([])), Some(json!([tool]))] {
        let mut body = json!({"messages": [{"role": "user", "content": "What is today?"}]});
        if let Some(t) = &tools {
            body["tools"] = t.clone();
        }
        let r = client::post(server.port, "/apply-template", &body);
        assert_eq!(r.status, 200, "{tools:?}: {}", r.body);
        let prompt = r.json()["prompt"].as_str().unwrap().to_owned();
        assert!(prompt.contains(&format!("Today is {today}.")), "{prompt}");
        let spec = prompt
            .split("Available functions as JSON spec:\n")
            .nth(1)
            .and_then(|rest| rest.split("\nToday is").next())
            .unwrap();
        match &tools {
            Some(t) if !t.as_array().unwrap().is_empty() => {
                let parsed: serde_json::Value = serde_json::from_str(spec).unwrap();
                assert_eq!(&parsed, t);
                assert!(spec.contains("\n  {"), "indented by two: {spec}");
            }
            _ => assert_eq!(spec, "", "{prompt}"),
        }
    }
    drop(server);

    let other = "{{ 'x' + functions }}";
    let server = Server::start(&["--chat-template", other, "--parallel", "1"], &[]);
    let r = client::post(
        server.port,
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert!(r.status >= 400, "{}", r.body);
}
