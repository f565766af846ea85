//! `lamina serve` as a black box: the binary on a real listener (port 0,
//! never a fixed one), driven over HTTP/1.1 as clients drive it. SmolLM2,
//! greedy, short max_tokens.
#![allow(clippy::unwrap_used)]

mod anthropic;
mod bench;
mod chat_page;
mod client;
#[path = "../common/mod.rs"]
mod common;
mod embeddings;
mod forced_xml;
mod gcp;
mod hardening;
mod mcp;
mod memory;
mod model_file;
mod native;
mod ollama;
mod openai;
mod reasoning;
mod rerank;
mod resume;
mod sleep;
mod structured;
mod templates;
mod tool_calls;
mod tools_builtin;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn model() -> String {
    common::model_path("SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_str()
        .unwrap()
        .to_owned()
}

/// A running `lamina serve`; killed when dropped.
struct Server {
    child: Child,
    port: u16,
    /// The API key the server was started with, for `/metrics`.
    key: Option<String>,
    /// Everything it logged so far.
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_with(&model(), args, env)
    }

    /// Serves the model file at `model`.
    fn start_with(model: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lamina"));
        cmd.args(["serve", "-m", model, "--port", "0"])
            .args(args)
            .env_remove("LAMINA_API_KEY")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let log = Arc::new(Mutex::new(String::new()));
        let log2 = log.clone();
        // Keep draining the log so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut l) = log2.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
                if let Some(at) = line.find("listening on http://") {
                    let addr = &line[at + "listening on http://".len()..];
                    let port = addr
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.trim().parse::<u16>().ok());
                    let _ = tx.send(port);
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!("lamina serve did not report a listening address");
            });
        let key = env
            .iter()
            .find(|(k, _)| *k == "LAMINA_API_KEY")
            .map(|(_, v)| format!("Bearer {v}"));
        Server {
            child,
            port,
            key,
            log,
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Still running (it did not die of a signal, for one).
    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn chat(&self, body: Value) -> client::Response {
        client::post(self.port, "/v1/chat/completions", &body)
    }

    /// `name`'s value in `/metrics` now.
    fn metric(&self, name: &str) -> (Option<f64>, String) {
        let auth: Vec<(&str, &str)> = self
            .key
            .iter()
            .map(|k| ("Authorization", k.as_str()))
            .collect();
        let text = client::request(self.port, "GET", "/metrics", None, &auth).body;
        let v = text.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.trim().parse::<f64>().ok())
        });
        (v, text)
    }

    /// Polls `/metrics` until `name` reaches `want` (or panics after 10 s).
    fn wait_metric(&self, name: &str, want: f64) {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let (v, text) = self.metric(name);
            if v == Some(want) {
                return;
            }
            assert!(
                Instant::now() < end,
                "{name} is {v:?}, expected {want}\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `<package>_client.py` (beside this file) against a server started
/// with `args` and the API key `test-key`: the official Python client of an
/// API, driven as its users drive it. The script prints one line per check
/// and exits non-zero if any failed.
fn python_client_checks(package: &str, args: &[&str]) {
    let probe = Command::new("python3")
        .args(["-c", &format!("import {package}")])
        .output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "python3 with the `{package}` package is needed: run scripts/install-deps.sh"
    );
    let server = Server::start(args, &[("LAMINA_API_KEY", "test-key")]);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/serve/{package}_client.py"));
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", server.port))
        .arg("test-key")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{package} client checks failed:\n{text}"
    );
}

/// A streamed request for a long story, read up to its first content
/// delta: the server is decoding it when this returns.
fn stream_story(
    port: u16,
    max_tokens: u32,
    headers: &[(&str, &str)],
) -> BufReader<std::net::TcpStream> {
    let mut body = user("Tell me a long story about a dragon.", max_tokens);
    body["stream"] = json!(true);
    let s = client::open(port, "POST", "/v1/chat/completions", Some(&body), headers);
    client::read_until(s, "\"content\":\"")
}

fn user(text: &str, max_tokens: u32) -> Value {
    json!({
        "model": "SmolLM2",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn greedy_chat_equals_lamina_run_chat() {
    let prompt = "What is the capital of France?";
    let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["run", "-m", &model(), "-p", prompt, "--chat"])
        .args(["-n", "8", "--temp", "0", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();

    let server = Server::start(&[], &[]);
    let r = server.chat(user(prompt, 8));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(content(&v), run["text"].as_str().unwrap());
    assert_eq!(
        v["usage"]["prompt_tokens"],
        run["prompt_tokens"].as_array().unwrap().len()
    );
}

#[test]
fn chat_matches_llama_server_reference() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/reference/llama.cpp/server_reference.json");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let chat = &reference["models"]["smollm2"]["chat"];
    let server = Server::start(&[], &[]);
    let mut body = json!({"messages": chat["request"]["messages"], "temperature": 0, "max_tokens": 40, "seed": 1});
    body["model"] = json!("anything");
    let v = server.chat(body).json();
    let want = &chat["response"];
    assert_eq!(v["choices"][0]["message"], want["choices"][0]["message"]);
    assert_eq!(
        v["choices"][0]["finish_reason"],
        want["choices"][0]["finish_reason"]
    );
    assert_eq!(v["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"]);
    assert_eq!(
        v["usage"]["completion_tokens"],
        want["usage"]["completion_tokens"]
    );
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    for k in [
        "prompt_n",
        "prompt_per_second",
        "predicted_n",
        "predicted_per_second",
        "cache_n",
    ] {
        assert!(v["timings"][k].is_number(), "timings.{k} in {v}");
    }
}

#[test]
fn streamed_chunks_reassemble_to_the_same_text() {
    let server = Server::start(&[], &[]);
    let prompt = "Write one sentence about the sea.";
    let whole = content(&server.chat(user(prompt, 12)).json());

    let mut body = user(prompt, 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = server.chat(body);
    assert_eq!(r.status, 200);
    assert!(
        r.head.contains("content-type: text/event-stream"),
        "{}",
        r.head
    );
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, whole);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
}

#[test]
fn four_concurrent_clients_all_complete_with_their_solo_output() {
    let server = Server::start(&["--parallel", "4", "-c", "4096"], &[]);
    let prompts = [
        "Name a fruit.",
        "What is 3 times 3?",
        "Say hello in French.",
        "What color is the sky?",
    ];
    let solo: Vec<String> = prompts
        .iter()
        .map(|p| content(&server.chat(user(p, 8)).json()))
        .collect();
    let port = server.port;
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let body = user(p, 8);
            std::thread::spawn(move || client::post(port, "/v1/chat/completions", &body))
        })
        .collect();
    for (h, want) in handles.into_iter().zip(&solo) {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(&content(&r.json()), want);
    }
}

/// A long prompt sent while another client's answer streams is fed in
/// chunks that fit the step budget (the stream keeps going), and it gets
/// the answer it gets alone, in whole 512-token chunks.
#[test]
fn a_long_prompt_beside_a_stream_is_paced_and_answers_as_alone() {
    let server = Server::start(&["--parallel", "2", "-c", "4096"], &[]);
    let text: String = (0..60)
        .map(|i| format!("Line {i}: the river carries stones to the sea. "))
        .collect();
    let question = format!("{text}\nHow many lines were there?");
    let solo = server.chat(user(&question, 8));
    assert_eq!(solo.status, 200, "{}", solo.body);
    let solo = solo.json();
    assert!(solo["usage"]["prompt_tokens"].as_u64().unwrap() > 600);
    let (paced, _) = server.metric("lamina_paced_steps_total");
    assert_eq!(paced, Some(0.0), "nothing decoded beside the solo prompt");
    // Its slot forgets it: the story takes the other slot, and the same
    // question would otherwise find its whole prompt there and prefill
    // nothing beside the stream.
    let erased = client::post(server.port, "/slots/0?action=erase", &json!({}));
    assert_eq!(erased.status, 200, "{}", erased.body);

    let mut story = stream_story(server.port, 1000, &[]);
    let beside = server.chat(user(&question, 8));
    assert_eq!(beside.status, 200, "{}", beside.body);
    assert_eq!(content(&beside.json()), content(&solo));
    let (paced, text) = server.metric("lamina_paced_steps_total");
    assert!(paced.unwrap_or(0.0) >= 1.0, "{text}");
    // The story went on streaming meanwhile and still does.
    let mut line = String::new();
    story.read_line(&mut line).unwrap();
    assert!(!line.is_empty());
}

#[test]
fn a_client_that_hangs_up_mid_stream_frees_its_slot() {
    let server = Server::start(&["--parallel", "1"], &[]);
    let reader = stream_story(server.port, 200, &[]);
    drop(reader);
    server.wait_metric("lamina_sequences_dropped_total", 1.0);
    server.wait_metric("lamina_active_sequences", 0.0);
    // The next client is served normally, in the same (only) slot.
    let r = server.chat(user("Name a fruit.", 4));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
}

#[test]
fn full_queue_is_503_at_once_and_the_key_comes_from_the_environment() {
    let server = Server::start(
        &["--parallel", "1", "--max-queue", "0"],
        &[("LAMINA_API_KEY", "k-123")],
    );
    let auth = [("Authorization", "Bearer k-123")];
    let denied = client::get(server.port, "/v1/models");
    assert_eq!(denied.status, 401);
    assert_eq!(denied.json()["error"]["type"], "authentication_error");
    assert_eq!(client::get(server.port, "/health").status, 200);

    let busy = stream_story(server.port, 200, &auth);
    // The slot counts as held from admission, not from the end of the
    // first step: a client that has a token reads 1 at once.
    let (active, text) = server.metric("lamina_active_sequences");
    assert_eq!(active, Some(1.0), "{text}");
    let t = Instant::now();
    let r = client::request(
        server.port,
        "POST",
        "/v1/chat/completions",
        Some(&user("Hi", 2)),
        &auth,
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(t.elapsed() < Duration::from_secs(2), "refused at once");
    assert!(r.head.contains("retry-after:"), "{}", r.head);
    assert_eq!(r.json()["error"]["type"], "unavailable_error");
    drop(busy);
    server.wait_metric("lamina_active_sequences", 0.0);
    let r = client::request(
        server.port,
        "POST",
        "/v1/chat/completions",
        Some(&user("Hi", 2)),
        &auth,
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn completions_take_text_or_token_ids() {
    let server = Server::start(&[], &[]);
    let body = json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0});
    let v = client::post(server.port, "/v1/completions", &body).json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_owned();
    // llama-server's greedy continuation begins " Paris.\n".
    assert!(text.starts_with(" Paris"), "{text:?}");

    let ids = client::post(
        server.port,
        "/tokenize",
        &json!({"content": "The capital of France is", "add_special": true}),
    )
    .json();
    let body = json!({"prompt": ids["tokens"], "max_tokens": 3, "temperature": 0});
    let v = client::post(server.port, "/v1/completions", &body).json();
    assert_eq!(v["choices"][0]["text"], text.as_str());
    assert!(
        v["timings"]["cache_n"].as_u64().unwrap() > 0,
        "the prefix was reused: {v}"
    );
}

#[test]
fn json_mode_output_is_a_json_object() {
    let server = Server::start(&[], &[]);
    let mut body = user("Describe a cat as JSON with a name and an age.", 120);
    body["response_format"] = json!({"type": "json_object"});
    let v = server.chat(body).json();
    let text = content(&v);
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{text}");
    let parsed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(parsed.is_object(), "{text}");
}

/// `--ngl all` on the software GPU serves the same greedy text as the CPU,
/// and the log says where the layers went.
#[test]
fn offloaded_serve_answers_like_the_cpu() {
    let body = user("Name a colour.", 6);
    let cpu = Server::start(&["--ngl", "0", "-c", "256", "--parallel", "2"], &[]);
    let want = content(&cpu.chat(body.clone()).json());
    drop(cpu);
    let gpu = Server::start(&["--ngl", "all", "-c", "256", "--parallel", "2"], &[]);
    let r = gpu.chat(body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(content(&r.json()), want);
    let props = client::get(gpu.port, "/props").json();
    let placement = props.to_string();
    assert!(
        placement.contains("offloaded 31/31 layers to GPU"),
        "{placement}"
    );
}

/// Through the HTTP API, as llama-server's users spell it (`-cram`): a
/// conversation whose one slot another client took meanwhile resumes from
/// the host prompt cache, and /metrics counts the restore; with the cache
/// off (`--cache-ram 0`) its next turn reuses nothing but the template's
/// opening, and it answers the same either way.
#[test]
fn a_conversation_resumes_from_the_prompt_cache_over_http() {
    let turn = |server: &Server| {
        let first = json!({"role": "user", "content": "Name three rivers of France."});
        let a = server.chat(json!({"messages": [first], "temperature": 0, "max_tokens": 16}));
        assert_eq!(a.status, 200, "{}", a.body);
        let b = server.chat(user("Write a haiku about the sea.", 8));
        assert_eq!(b.status, 200, "{}", b.body);
        let next = json!({
            "messages": [
                first,
                {"role": "assistant", "content": content(&a.json())},
                {"role": "user", "content": "Which of them is the longest?"},
            ],
            "temperature": 0,
            "max_tokens": 16,
        });
        let r = server.chat(next);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
        let cached = v["timings"]["cache_n"].as_u64().unwrap();
        (content(&v), cached, prompt)
    };
    let on = Server::start(&["--parallel", "1", "-c", "1024", "-cram", "64"], &[]);
    let (text, cached, prompt) = turn(&on);
    // The first turn's prompt and reply came back: most of the prompt.
    assert!(cached * 2 > prompt, "{cached} of {prompt} reused");
    on.wait_metric("lamina_prompt_cache_restores_total", 1.0);
    let (entries, metrics) = on.metric("lamina_prompt_cache_entries");
    assert_eq!(entries, Some(1.0), "{metrics}");
    let off = Server::start(&["--parallel", "1", "-c", "1024", "--cache-ram", "0"], &[]);
    let (text_off, cached_off, _) = turn(&off);
    assert!(
        cached_off < cached / 2,
        "{cached_off} reused without the cache"
    );
    assert_eq!(text, text_off);
    off.wait_metric("lamina_prompt_cache_restores_total", 0.0);
}
