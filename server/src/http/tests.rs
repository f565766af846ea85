//! The router driven in-process (`tower::ServiceExt::oneshot`, no socket):
//! error shapes and statuses for bad requests, the API key, the body limit,
//! and the small endpoints against llama-server's recorded answers. One
//! engine on SmolLM2 is shared by every test; none of these generate more
//! than a token or two.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt as _;
use lamina_chat::{ChatTemplate, RenderOptions};
use lamina_engine::{Engine, EngineConfig};
use serde_json::{json, Value};
use tower::ServiceExt as _;

use super::{app, AppState};

/// The server-wide max_tokens cap the shared engine runs with.
const CAP: usize = 256;
/// Context of one slot in the shared engine.
const SLOT: usize = 1024;

pub(super) fn model_path() -> PathBuf {
    let dir = std::env::var_os("LAMINA_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lamina/models")
        });
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let mut cfg = EngineConfig::new(model_path());
            cfg.n_parallel = 2;
            cfg.n_ctx = Some(2 * SLOT);
            cfg.max_tokens = CAP;
            let e = Engine::start(cfg).unwrap();
            e.wait_ready(Duration::from_secs(60)).unwrap();
            e
        })
        .clone()
}

fn router(key: Option<&str>, limit: usize) -> Router {
    app(Arc::new(AppState::new(
        engine(),
        key.map(str::to_owned),
        limit,
    )))
}

fn reference() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/reference/llama.cpp/server_reference.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

async fn send(app: Router, req: Request<Body>) -> (StatusCode, Value, Bytes) {
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, json, bytes)
}

fn post(uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(uri)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

async fn post_json(uri: &str, body: Value) -> (StatusCode, Value) {
    let (s, v, _) = send(router(None, 1 << 20), post(uri, body.to_string())).await;
    (s, v)
}

/// The OpenAI error object, with its status.
fn assert_error(status: StatusCode, v: &Value, want: StatusCode, kind: &str) {
    assert_eq!(status, want, "{v}");
    let e = &v["error"];
    assert_eq!(e["type"], kind, "{v}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test]
async fn health_models_and_unknown_routes() {
    let (s, v, _) = send(router(None, 1 << 20), get("/health")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["status"], "ok");

    let (s, v, _) = send(router(None, 1 << 20), get("/v1/models")).await;
    assert_eq!(s, StatusCode::OK);
    let m = &v["data"][0];
    assert_eq!(m["id"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(m["meta"]["n_ctx_train"], 8192);
    assert_eq!(m["meta"]["n_ctx_slot"], SLOT);
    assert!(m["meta"]["n_params"].as_u64().unwrap() > 100_000_000);
    assert!(m["meta"]["file_type"].is_u64());

    let (s, v, _) = send(router(None, 1 << 20), get("/v2/nothing")).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found_error");
    let (s, v, _) = send(router(None, 1 << 20), get("/v1/chat/completions")).await;
    assert_error(
        s,
        &v,
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
    );
}

#[tokio::test]
async fn api_key_guards_everything_but_health() {
    let key = Some("s3cret-key");
    let (s, v, _) = send(router(key, 1 << 20), get("/v1/models")).await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "authentication_error");
    let wrong = Request::get("/v1/models")
        .header("authorization", "Bearer s3cret-kex")
        .body(Body::empty())
        .unwrap();
    let (s, v, _) = send(router(key, 1 << 20), wrong).await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "authentication_error");
    let (s, v, _) = send(
        router(key, 1 << 20),
        post("/v1/chat/completions", chat(json!({})).to_string()),
    )
    .await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "authentication_error");
    let (s, v, _) = send(router(key, 1 << 20), get("/metrics")).await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "authentication_error");

    let right = Request::get("/v1/models")
        .header("authorization", "Bearer s3cret-key")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(router(key, 1 << 20), right).await.0, StatusCode::OK);
    let header = Request::get("/props")
        .header("x-api-key", "s3cret-key")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(router(key, 1 << 20), header).await.0, StatusCode::OK);
    assert_eq!(
        send(router(key, 1 << 20), get("/health")).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn oversize_body_is_413() {
    let big = chat(json!({"messages": [{"role": "user", "content": "x".repeat(4096)}]}));
    let (s, v, _) = send(
        router(None, 1024),
        post("/v1/chat/completions", big.to_string()),
    )
    .await;
    assert_error(
        s,
        &v,
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
    );
}

#[tokio::test]
async fn bodies_that_are_not_json_objects_are_400() {
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    for body in [
        "not json".to_owned(),
        r#"{"messages": [{"role": "user""#.to_owned(),
        "[1, 2]".to_owned(),
        deep,
        String::new(),
        // A lone surrogate is not a character.
        r#"{"messages": [{"role": "user", "content": "\ud800"}]}"#.to_owned(),
    ] {
        let (s, v, _) = send(
            router(None, 1 << 20),
            post("/v1/chat/completions", body.clone()),
        )
        .await;
        assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
    }
}

#[tokio::test]
async fn invalid_fields_are_400_naming_the_field() {
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"messages": null}), "messages", "required"),
        (json!({"messages": []}), "messages", "at least one"),
        (json!({"messages": "hi"}), "messages", "array"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
            "wizard",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
            "string",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
            "text",
        ),
        (json!({"max_tokens": 0}), "max_tokens", "between 1 and 256"),
        (json!({"max_tokens": -1}), "max_tokens", "between"),
        (
            json!({"max_tokens": 9223372036854775808u64}),
            "max_tokens",
            "between",
        ),
        (json!({"max_tokens": 1.5}), "max_tokens", "integer"),
        (json!({"max_tokens": "8"}), "max_tokens", "integer"),
        (json!({"max_tokens": 257}), "max_tokens", "256"),
        (
            json!({"max_completion_tokens": 0}),
            "max_completion_tokens",
            "between",
        ),
        (
            json!({"temperature": -0.5}),
            "temperature",
            "between 0 and 2",
        ),
        (json!({"temperature": 3}), "temperature", "between 0 and 2"),
        (json!({"temperature": "hot"}), "temperature", "number"),
        (json!({"top_p": 0}), "top_p", "greater than 0"),
        (json!({"top_p": 1.5}), "top_p", "between"),
        (json!({"top_k": -1}), "top_k", "between"),
        (json!({"min_p": 2}), "min_p", "between"),
        (
            json!({"presence_penalty": 5}),
            "presence_penalty",
            "between -2 and 2",
        ),
        (
            json!({"frequency_penalty": -3}),
            "frequency_penalty",
            "between",
        ),
        (
            json!({"repeat_penalty": 0}),
            "repeat_penalty",
            "greater than 0",
        ),
        (json!({"seed": -5}), "seed", "between"),
        (json!({"n": 0}), "n", "between 1 and 16"),
        (json!({"n": 17}), "n", "between 1 and 16"),
        (
            json!({"logprobs": true, "top_logprobs": 50}),
            "top_logprobs",
            "between 0 and 20",
        ),
        (
            json!({"top_logprobs": 2}),
            "top_logprobs",
            "requires logprobs",
        ),
        (
            json!({"stop": ["a", "b", "c", "d", "e"]}),
            "stop",
            "at most 4",
        ),
        (json!({"stop": 7}), "stop", "string"),
        (
            json!({"logit_bias": {"49152": 1}}),
            "logit_bias",
            "vocabulary size 49152",
        ),
        (json!({"logit_bias": {"": 1}}), "logit_bias", "token id"),
        (
            json!({"logit_bias": {"5": 1000}}),
            "logit_bias",
            "between -100 and 100",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema",
            "needs json_schema",
        ),
        (json!({"stream": "yes"}), "stream", "boolean"),
        (
            json!({"stream_options": {"include_usage": 1}}),
            "stream_options.include_usage",
            "boolean",
        ),
        (
            json!({"chat_template_kwargs": [1]}),
            "chat_template_kwargs",
            "object",
        ),
    ];
    for (extra, param, words) in cases {
        for stream in [false, true] {
            let mut body = chat(extra.clone());
            if extra.get("stream").is_none() {
                body["stream"] = json!(stream);
            }
            let (s, v) = post_json("/v1/chat/completions", body).await;
            // Streaming requests fail with a status too, never a 200 stream.
            assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
            assert_eq!(v["error"]["param"], param, "{extra}: {v}");
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.contains(words), "{extra}: {msg:?} lacks {words:?}");
        }
    }
}

#[tokio::test]
async fn prompt_and_max_tokens_beyond_the_context_give_both_numbers() {
    let long = "word ".repeat(1200);
    let (s, v) = post_json(
        "/v1/chat/completions",
        chat(json!({"messages": [{"role": "user", "content": long}]})),
    )
    .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "exceed_context_size_error");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["n_ctx"], SLOT);
    assert!(
        v["error"]["n_prompt_tokens"].as_u64().unwrap() > SLOT as u64,
        "{v}"
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&SLOT.to_string()) && msg.contains("tokens"),
        "{msg}"
    );

    let medium = "word ".repeat(900);
    let (s, v) = post_json(
        "/v1/completions",
        json!({"prompt": medium, "max_tokens": 200}),
    )
    .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
    assert_eq!(v["error"]["param"], "max_tokens");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("200") && msg.contains(&SLOT.to_string()),
        "{msg}"
    );
}

#[tokio::test]
async fn unknown_fields_and_any_model_name_are_accepted() {
    let (s, v) = post_json(
        "/v1/chat/completions",
        chat(json!({"model": "gpt-4o", "user": "abc", "some_future_field": {"x": 1}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 1);
    assert!(v["timings"]["prompt_n"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let (s, v) = post_json("/tokenize", json!({"content": "Hello world, héllo"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let ids = v["tokens"].clone();
    assert!(ids.as_array().unwrap().iter().all(Value::is_u64));
    let (s, v) = post_json("/detokenize", json!({"tokens": ids})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["content"], "Hello world, héllo");

    let (_, v) = post_json(
        "/tokenize",
        json!({"content": "Hello world", "with_pieces": true}),
    )
    .await;
    assert_eq!(
        v["tokens"],
        json!([{"id": 19556, "piece": "Hello"}, {"id": 905, "piece": " world"}])
    );

    let (s, v) = post_json("/detokenize", json!({"tokens": [1, 49152]})).await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
    let (s, v) = post_json("/tokenize", json!({"text": "x"})).await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
    assert_eq!(v["error"]["param"], "content");
}

#[tokio::test]
async fn apply_template_equals_the_template_and_llama_server() {
    let r = &reference()["models"]["smollm2"];
    let messages = r["apply_template"]["request"]["messages"].clone();
    let (s, v) = post_json("/apply-template", json!({"messages": messages})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["prompt"], r["apply_template"]["response"]["prompt"]);

    // And it is exactly the chat template crate's rendering.
    let source = r["props_chat_template"].as_str().unwrap();
    let t = ChatTemplate::new(source, "<|im_start|>", "<|im_end|>").unwrap();
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    assert_eq!(v["prompt"], t.render(&messages, &opts).unwrap());

    // Text parts are joined; add_generation_prompt can be turned off.
    let (_, v) = post_json(
        "/apply-template",
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
               "add_generation_prompt": false}),
    )
    .await;
    assert!(
        v["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>user\na\nb<|im_end|>\n"),
        "{v}"
    );
}

#[tokio::test]
async fn props_show_the_template_and_slots() {
    let r = &reference()["models"]["smollm2"];
    let (s, v, _) = send(router(None, 1 << 20), get("/props")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["chat_template"], r["props_chat_template"]);
    assert_eq!(v["total_slots"], 2);
    assert_eq!(v["default_generation_settings"]["n_ctx"], SLOT);
    assert!(v["placement"].as_str().unwrap().contains("layers"));
}

#[tokio::test]
async fn metrics_are_prometheus_text() {
    let _ = post_json("/v1/chat/completions", chat(json!({}))).await;
    let (s, _, body) = send(router(None, 1 << 20), get("/metrics")).await;
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8(body.to_vec()).unwrap();
    for name in [
        "lamina_requests_total",
        "lamina_prompt_tokens_total",
        "lamina_generated_tokens_total",
        "lamina_generated_tokens_per_second",
        "lamina_time_to_first_token_seconds_count",
        "lamina_queue_depth",
        "lamina_active_sequences",
        "lamina_kv_cache_usage_ratio",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    // llama-server's names too, each with its type and help, as its
    // dashboards read them.
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("llamacpp:{name} ")))
            .and_then(|v| v.parse::<f64>().ok())
    };
    for (name, kind) in [
        ("prompt_tokens_total", "counter"),
        ("prompt_tokens_cached_total", "counter"),
        ("tokens_predicted_total", "counter"),
        ("n_decode_total", "counter"),
        ("n_tokens_max", "counter"),
        ("requests_processing", "gauge"),
        ("n_busy_slots_per_decode", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# TYPE llamacpp:{name} {kind}\n")),
            "{name}: {text}"
        );
        assert!(text.contains(&format!("# HELP llamacpp:{name} ")), "{name}");
        assert!(value(name).is_some(), "{name}: {text}");
    }
    assert!(value("n_decode_total").unwrap() >= 1.0, "{text}");
    assert!(value("tokens_predicted_total").unwrap() >= 1.0, "{text}");
    assert!(value("n_busy_slots_per_decode").unwrap() >= 1.0, "{text}");
}

/// `serve` on a free loopback port with `read_timeout`; it stops when the
/// returned sender is dropped.
async fn listening(read_timeout: Duration) -> (u16, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let state = AppState::new(engine(), None, 1 << 20).with_read_timeout(read_timeout);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(super::serve(
        listener,
        app(Arc::new(state)),
        read_timeout,
        async move {
            let _ = stopped.await;
        },
    ));
    (port, stop)
}

/// Connects, writes `raw`, then reads until the server closes the
/// connection (or 20 s pass): what came back, and how long it took.
async fn until_closed(port: u16, raw: &'static [u8]) -> (String, Duration) {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let t0 = std::time::Instant::now();
        s.write_all(raw).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("still open after {:?} ({e}): {raw:?}", t0.elapsed()),
            }
        }
        (String::from_utf8_lossy(&got).into_owned(), t0.elapsed())
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn slow_clients_are_cut_off_at_the_read_timeout() {
    let t = Duration::from_millis(600);
    let (port, _stop) = listening(t).await;
    let within = |took: Duration| took >= t * 3 / 4 && took < t + Duration::from_secs(5);

    // Half a request line, then nothing (slowloris).
    let (got, took) = until_closed(port, b"GET /hea").await;
    assert!(within(took), "closed after {took:?}");
    assert!(!got.contains(" 200 "), "{got}");
    // Headers begun and never finished.
    let (_, took) = until_closed(port, b"GET /health HTTP/1.1\r\nHost: x\r\nAccept: */").await;
    assert!(within(took), "closed after {took:?}");
    // Connected, and not a byte sent.
    let (got, took) = until_closed(port, b"").await;
    assert!(within(took) && got.is_empty(), "{got:?} after {took:?}");
    // One request answered, then the keep-alive connection idles.
    let (got, took) = until_closed(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(within(took), "closed after {took:?}");
    // A body that stops short of its Content-Length: 408, then closed.
    let (got, took) = until_closed(
        port,
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"content\": ",
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("\"request_timeout\""), "{got}");
    assert!(within(took), "closed after {took:?}");

    // The server is unharmed.
    let (got, _) = until_closed(
        port,
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"content\":\"Hi\"}",
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.contains("\"tokens\""), "{got}");
}

#[tokio::test]
async fn a_panicking_handler_is_a_500_and_the_server_keeps_serving() {
    let (s, v, _) = send(router(None, 1 << 20), get("/test/panic")).await;
    assert_error(s, &v, StatusCode::INTERNAL_SERVER_ERROR, "server_error");
    assert!(!v.to_string().contains("on purpose"), "{v}");

    // Over a real connection: the panic is counted, and the next request on
    // the same server is answered.
    let (port, _stop) = listening(Duration::from_secs(10)).await;
    for _ in 0..2 {
        let (got, _) = until_closed(
            port,
            b"GET /test/panic HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 500"), "{got}");
        assert!(got.contains("\"server_error\""), "{got}");
    }
    let (got, _) = until_closed(
        port,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        got.contains("lamina_requests_total{status=\"500\"} 2"),
        "{got}"
    );
}

#[tokio::test]
async fn native_completion_refuses_bad_prompts_and_fields_with_400() {
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"n_predict": 1}), "prompt", "required"),
        (json!({"prompt": []}), "prompt", "must not be empty"),
        (json!({"prompt": 5}), "prompt", "must be a string"),
        (json!({"prompt": [1, 49152]}), "prompt", "vocabulary size"),
        (json!({"prompt": [1, -3]}), "prompt", "vocabulary size"),
        (
            json!({"prompt": [1, {"a": 1}]}),
            "prompt",
            "token ids and strings",
        ),
        (json!({"prompt": [true]}), "prompt[0]", "string"),
        (
            json!({"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}}),
            "prompt.multimodal_data",
            "multimodal",
        ),
        (
            json!({"prompt": {"text": "x"}}),
            "prompt.prompt_string",
            "string",
        ),
        (
            json!({"prompt": "Hi", "n_probs": 21}),
            "n_probs",
            "between 0 and 20",
        ),
        (
            json!({"prompt": "Hi", "post_sampling_probs": "yes"}),
            "post_sampling_probs",
            "must be a boolean",
        ),
        (
            json!({"prompt": "Hi", "n_predict": 0}),
            "n_predict",
            "between 1 and 256",
        ),
        (
            json!({"prompt": ["Hi", "Ho"], "stream": true}),
            "stream",
            "several prompts",
        ),
        (
            json!({"prompt": "Hi", "response_fields": "content"}),
            "response_fields",
            "array",
        ),
        (
            json!({"prompt": "Hi", "return_tokens": 1}),
            "return_tokens",
            "boolean",
        ),
        (
            json!({"prompt": "Hi", "speculative.n_max": -1}),
            "speculative.n_max",
            "between 0 and 1024",
        ),
        (
            json!({"prompt": "Hi", "speculative.n_min": "4"}),
            "speculative.n_min",
            "integer",
        ),
        (
            json!({"prompt": "Hi", "speculative.p_min": 2}),
            "speculative.p_min",
            "between 0 and 1",
        ),
    ];
    for (body, param, words) in cases {
        for uri in ["/completion", "/completions"] {
            let (s, v) = post_json(uri, body.clone()).await;
            assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
            assert_eq!(v["error"]["param"], param, "{body}: {v}");
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.contains(words), "{body}: {msg:?} lacks {words:?}");
        }
    }
}

fn preflight(uri: &str, origin: &str) -> Request<Body> {
    Request::options(uri)
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "Authorization")
        .body(Body::empty())
        .unwrap()
}

fn router_with(options: super::Options, key: Option<&str>) -> Router {
    app(Arc::new(
        AppState::new(engine(), key.map(str::to_owned), 1 << 20).with_options(options),
    ))
}

#[tokio::test]
async fn cors_echoes_only_allowed_origins_and_answers_preflights_without_the_key() {
    let key = Some("k");
    let allow_origin = |r: &axum::response::Response| {
        r.headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    // The default: localhost origins only, and a preflight needs no key.
    let app = router_with(super::Options::default(), key);
    let r = app
        .clone()
        .oneshot(preflight("/completion", "http://localhost:5173"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(allow_origin(&r).as_deref(), Some("http://localhost:5173"));
    let h = r.headers();
    assert_eq!(
        h["access-control-allow-methods"],
        "GET, POST, DELETE, OPTIONS"
    );
    assert_eq!(h["access-control-allow-headers"], "*");
    assert_eq!(h["access-control-allow-credentials"], "true");
    let r = app
        .clone()
        .oneshot(preflight("/completion", "http://localhost.evil.com"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        allow_origin(&r),
        None,
        "an arbitrary origin is never echoed"
    );
    // A refused request still tells an allowed page why.
    let req = Request::get("/v1/models")
        .header("origin", "http://127.0.0.1:3000")
        .body(Body::empty())
        .unwrap();
    let r = app.clone().oneshot(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(allow_origin(&r).as_deref(), Some("http://127.0.0.1:3000"));

    // `*` is llama-server's default: any origin.
    let mut star = super::Options::default();
    star.cors.origins = "*".into();
    let r = router_with(star, None)
        .oneshot(preflight("/v1/chat/completions", "https://web.example"))
        .await
        .unwrap();
    assert_eq!(allow_origin(&r).as_deref(), Some("https://web.example"));
}

#[tokio::test]
async fn no_webui_leaves_the_chat_page_out_and_the_api_in() {
    let (s, _, _) = send(router_with(super::Options::default(), None), get("/")).await;
    assert_eq!(s, StatusCode::OK);
    let options = super::Options {
        web_ui: false,
        ..super::Options::default()
    };
    for path in ["/", "/chat.js", "/chat.css"] {
        let (s, v, _) = send(router_with(options.clone(), None), get(path)).await;
        assert_error(s, &v, StatusCode::NOT_FOUND, "not_found_error");
    }
    let (s, _, _) = send(router_with(options, None), get("/health")).await;
    assert_ne!(s, StatusCode::NOT_FOUND);
}

/// `-a a,b` and `--tags`: every alias and tag listed, sorted, the first
/// alias the model's name (llama-server keeps them in a `std::set`).
#[tokio::test]
async fn aliases_and_tags_are_listed_and_the_first_alias_names_the_model() {
    let options = super::Options {
        aliases: super::list(Some("tinyllama-2, fim,code,fim")),
        tags: super::list(Some("chat,fim,,small")),
        ..super::Options::default()
    };
    let (s, v, _) = send(router_with(options, None), get("/v1/models")).await;
    assert_eq!(s, StatusCode::OK);
    let m = &v["data"][0];
    assert_eq!(m["aliases"], json!(["code", "fim", "tinyllama-2"]), "{v}");
    assert_eq!(m["tags"], json!(["chat", "fim", "small"]), "{v}");
    assert_eq!(m["id"], "code");
    let (_, v, _) = send(router(None, 1 << 20), get("/v1/models")).await;
    assert_eq!(v["data"][0]["aliases"], json!([]));
    assert_eq!(v["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1.gguf");
}

/// `GET /slots` in llama-server's shape, one entry per slot; 501 with
/// `--no-slots`, and for the save, restore and erase actions Lamina lacks.
#[tokio::test]
async fn slots_are_shown_unless_turned_off() {
    let (s, v, _) = send(router(None, 1 << 20), get("/slots")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let slots = v.as_array().unwrap();
    assert_eq!(slots.len(), 2, "{v}");
    for (i, slot) in slots.iter().enumerate() {
        assert_eq!(slot["id"], i);
        assert_eq!(slot["n_ctx"], SLOT);
        assert!(slot["is_processing"].is_boolean());
        assert!(slot.get("params").is_none());
    }
    let options = super::Options {
        slots: false,
        ..super::Options::default()
    };
    let (s, v, _) = send(router_with(options.clone(), None), get("/slots")).await;
    assert_error(s, &v, StatusCode::NOT_IMPLEMENTED, "not_supported_error");
    let (s, v, _) = send(
        router_with(options, None),
        post("/slots/0?action=erase", ""),
    )
    .await;
    assert_error(s, &v, StatusCode::NOT_IMPLEMENTED, "not_supported_error");
}

/// With `--spec-type ngram-simple`, a `/completion` that copies from its
/// prompt reports llama-server's `timings.draft_n` and `draft_n_accepted`,
/// `/metrics` counts the same drafts, and the text is the text without
/// drafts (`speculative.n_max: 0`, whose timings carry no draft fields).
#[tokio::test]
async fn drafts_are_reported_in_timings_and_metrics() {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_parallel = 1;
    cfg.n_ctx = Some(256);
    cfg.spec = lamina_engine::Speculation {
        kind: lamina_engine::SpecType::NgramSimple,
        ngram_n: 3,
        ..lamina_engine::Speculation::default()
    };
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(60)).unwrap();
    let app = || app(Arc::new(AppState::new(e.clone(), None, 1 << 20)));
    let prompt = "one two three four five six seven eight nine ten\n\
                  one two three four five six seven eight nine ten\none two";
    let body = |n_max: u64| {
        json!({"prompt": prompt, "n_predict": 24, "temperature": 0,
               "speculative.n_max": n_max, "speculative.n_min": 1})
    };
    let (s, plain, _) = send(app(), post("/completion", body(0).to_string())).await;
    assert_eq!(s, StatusCode::OK, "{plain}");
    assert!(plain["timings"].get("draft_n").is_none(), "{plain}");
    let (_, v, _) = send(app(), post("/completion", body(8).to_string())).await;
    assert_eq!(v["content"], plain["content"], "{v}");
    let t = &v["timings"];
    let (n, accepted) = (
        t["draft_n"].as_u64().unwrap(),
        t["draft_n_accepted"].as_u64().unwrap(),
    );
    assert!(n > 0 && accepted > 0 && accepted <= n, "{t}");
    let (_, _, text) = send(app(), get("/metrics")).await;
    let text = String::from_utf8_lossy(&text);
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name}: {text}")) as u64
    };
    assert_eq!(value("llamacpp:spec_decode_num_draft_tokens_total "), n);
    assert_eq!(
        value("llamacpp:spec_decode_num_accepted_tokens_total "),
        accepted
    );
    assert_eq!(value("lamina_draft_accepted_tokens_total "), accepted);
}

/// `POST /slots/{id}?action=erase` empties the slot's cache: the next
/// request with the same prompt reuses nothing. Saving and restoring are
/// 501s that say so; a bad action or slot id is a 400. An engine of its
/// own, so the other tests' caches are left alone.
#[tokio::test]
async fn erasing_a_slot_forgets_its_cache() {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_parallel = 1;
    cfg.n_ctx = Some(256);
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(60)).unwrap();
    let app = || app(Arc::new(AppState::new(e.clone(), None, 1 << 20)));
    let body = json!({"prompt": "The capital of France is", "n_predict": 2, "temperature": 0});
    let cached = |v: &Value| v["timings"]["cache_n"].as_u64().unwrap();
    let (_, v, _) = send(app(), post("/completion", body.to_string())).await;
    let n_prompt = v["tokens_evaluated"].as_u64().unwrap();
    let (_, v, _) = send(app(), post("/completion", body.to_string())).await;
    assert_eq!(cached(&v), n_prompt - 1, "{v}");

    let (s, v, _) = send(app(), post("/slots/0?action=erase", "")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["id_slot"], 0);
    // The prompt and the first generated token, fed back before the second.
    assert_eq!(v["n_erased"].as_u64(), Some(n_prompt + 1), "{v}");
    let (_, v, _) = send(app(), get("/slots")).await;
    assert_eq!(v[0]["n_cached"], 0, "{v}");
    assert_eq!(
        v[0]["next_token"][0]["n_remain"], -1,
        "an idle slot has no budget: {v}"
    );
    let (_, v, _) = send(app(), post("/completion", body.to_string())).await;
    assert_eq!(cached(&v), 0, "{v}");

    for (uri, status) in [
        ("/slots/0?action=save", StatusCode::NOT_IMPLEMENTED),
        ("/slots/0?action=restore", StatusCode::NOT_IMPLEMENTED),
        ("/slots/0?action=wipe", StatusCode::BAD_REQUEST),
        ("/slots/0", StatusCode::BAD_REQUEST),
        ("/slots/x?action=erase", StatusCode::BAD_REQUEST),
        ("/slots/1?action=erase", StatusCode::BAD_REQUEST),
    ] {
        let (s, v, _) = send(app(), post(uri, "")).await;
        assert_eq!(s, status, "{uri}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
    }
}

#[tokio::test]
async fn metrics_can_be_turned_off_as_llama_server_has_them() {
    let options = super::Options {
        metrics: false,
        ..super::Options::default()
    };
    let (s, v, _) = send(router_with(options, None), get("/metrics")).await;
    assert_error(s, &v, StatusCode::NOT_IMPLEMENTED, "not_supported_error");
}

/// Tool-call markers are looked up in the real vocabulary: a text that is
/// one control token is found (SmolLM2 has ChatML's, not a tool format's),
/// text of ordinary tokens is not.
#[test]
fn hidden_markers_are_the_control_tokens_of_the_vocabulary() {
    let lamina_engine::Status::Ready(info) = engine().status() else {
        panic!("the engine is not ready")
    };
    let found = super::tools::hidden_markers(
        &info.tokenizer,
        &["<|im_end|>", "<tool_call>", "[TOOL_CALLS]", "Hello"],
    );
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1, "<|im_end|>");
}

/// The `data:` objects of an SSE body.
fn sse_objects(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// `return_progress` on a stream: reports from the cache (nothing new
/// processed) to the whole prompt, strictly rising, all before the first
/// text, in the chat, completions and native shapes; never unasked.
#[tokio::test]
async fn streams_report_prompt_progress_when_asked() {
    let check = |objects: &[Value]| {
        let mut reports = Vec::new();
        for (i, o) in objects.iter().enumerate() {
            if let Some(p) = o.get("prompt_progress") {
                reports.push((i, p.clone()));
            }
        }
        assert!(!reports.is_empty(), "{objects:?}");
        let first = &reports[0].1;
        assert_eq!(first["processed"], first["cache"], "{first}");
        let last = &reports.last().unwrap().1;
        assert_eq!(last["processed"], last["total"], "{last}");
        for w in reports.windows(2) {
            assert_eq!(w[0].1["total"], w[1].1["total"]);
            assert_eq!(w[0].1["cache"], w[1].1["cache"]);
            assert!(w[1].1["processed"].as_u64() > w[0].1["processed"].as_u64());
        }
        let first_text = objects.iter().position(|o| {
            let c = &o["choices"][0];
            let text = c["delta"]["content"].as_str().or(c["text"].as_str());
            text.is_some_and(|t| !t.is_empty())
                || o["content"].as_str().is_some_and(|t| !t.is_empty())
        });
        if let Some(t) = first_text {
            assert!(reports.last().unwrap().0 < t, "{objects:?}");
        }
    };
    let prompt = "Once upon a time ".repeat(20);
    for (route, body) in [
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": prompt}]})),
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 2, "temperature": 0}),
        ),
        (
            "/completion",
            json!({"prompt": prompt, "n_predict": 2, "temperature": 0}),
        ),
    ] {
        let mut asked = body.clone();
        asked["stream"] = json!(true);
        asked["return_progress"] = json!(true);
        let (s, _, bytes) = send(router(None, 1 << 20), post(route, asked.to_string())).await;
        assert_eq!(s, StatusCode::OK);
        check(&sse_objects(&bytes));

        let mut plain = body.clone();
        plain["stream"] = json!(true);
        let (_, _, bytes) = send(router(None, 1 << 20), post(route, plain.to_string())).await;
        let objects = sse_objects(&bytes);
        assert!(!objects.is_empty());
        assert!(
            objects.iter().all(|o| o.get("prompt_progress").is_none()),
            "{route}"
        );
    }
}

/// `verbose` (or the server's `--verbose`) adds the native result, whose
/// prompt is the rendered text, to a chat or completion response.
#[tokio::test]
async fn verbose_adds_the_native_result() {
    let (s, v) = post_json("/v1/chat/completions", chat(json!({"verbose": true}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let verbose = &v["__verbose"];
    assert_eq!(
        verbose["prompt"],
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "{v}"
    );
    assert_eq!(verbose["tokens_predicted"], v["usage"]["completion_tokens"]);
    assert_eq!(verbose["tokens_evaluated"], v["usage"]["prompt_tokens"]);
    assert_eq!(verbose["content"], v["choices"][0]["message"]["content"]);
    assert_eq!(verbose["tokens"].as_array().unwrap().len(), 1, "{v}");
    let (_, v) = post_json("/v1/chat/completions", chat(json!({"verbose": false}))).await;
    assert!(v.get("__verbose").is_none(), "{v}");
    let (_, v) = post_json("/v1/chat/completions", chat(json!({}))).await;
    assert!(v.get("__verbose").is_none(), "{v}");

    // --verbose turns it on for every request that does not say otherwise.
    let options = super::Options {
        verbose: true,
        ..super::Options::default()
    };
    let body = json!({"prompt": "Hi", "max_tokens": 1, "temperature": 0});
    let (_, v, _) = send(
        router_with(options.clone(), None),
        post("/v1/completions", body.to_string()),
    )
    .await;
    assert_eq!(v["__verbose"]["prompt"], "Hi", "{v}");
    let mut quiet = body.clone();
    quiet["verbose"] = json!(false);
    let (_, v, _) = send(
        router_with(options, None),
        post("/v1/completions", quiet.to_string()),
    )
    .await;
    assert!(v.get("__verbose").is_none(), "{v}");
    let (s, v) = post_json("/v1/chat/completions", chat(json!({"verbose": "yes"}))).await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
}

/// A conversation that ends with the assistant is a prefill the model
/// continues (llama-server's default, vLLM's `continue_final_message`);
/// the contradictory and ambiguous endings are 400s.
#[tokio::test]
async fn a_final_assistant_message_is_continued() {
    let turns = |last: Value| json!([{"role": "user", "content": "Best book?"}, {"role": "assistant", "content": last}]);
    let template = |body: Value| async move {
        let (s, v) = post_json("/apply-template", body).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v["prompt"].as_str().unwrap().to_owned()
    };
    let open = "<|im_start|>user\nBest book?<|im_end|>\n<|im_start|>assistant\n";
    let p = template(json!({"messages": turns(json!("Whill"))})).await;
    assert!(p.ends_with(&format!("{open}Whill")), "{p}");
    // Text parts of the continued message are joined by a blank line.
    let parts = json!([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]);
    let p = template(json!({"messages": turns(parts)})).await;
    assert!(p.ends_with(&format!("{open}Wh\n\nill")), "{p}");
    // The explicit spelling gives the same prompt.
    let p2 = template(json!({"messages": turns(json!("Whill")),
        "continue_final_message": true, "add_generation_prompt": false}))
    .await;
    assert!(p2.ends_with(&format!("{open}Whill")), "{p2}");
    // An explicit generation prompt closes the turn and opens a new one.
    let p =
        template(json!({"messages": turns(json!("Whill")), "add_generation_prompt": true})).await;
    assert!(
        p.ends_with("Whill<|im_end|>\n<|im_start|>assistant\n"),
        "{p}"
    );

    // The chat route generates from the continued prompt.
    let (s, v) = post_json(
        "/v1/chat/completions",
        chat(json!({"messages": turns(json!("Whill")), "verbose": true})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let prompt = v["__verbose"]["prompt"].as_str().unwrap();
    assert!(prompt.ends_with(&format!("{open}Whill")), "{prompt}");

    let two = json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                     {"role": "assistant", "content": "c"}]);
    for (body, param) in [
        (json!({"messages": two}), "messages"),
        (
            json!({"messages": turns(json!("W")), "continue_final_message": true,
                   "add_generation_prompt": true}),
            "continue_final_message",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a"}], "continue_final_message": true}),
            "continue_final_message",
        ),
        (
            json!({"messages": turns(json!("W")), "continue_final_message": 3}),
            "continue_final_message",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a"},
                {"role": "assistant", "content": null,
                 "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
            "continue_final_message",
        ),
    ] {
        for route in ["/apply-template", "/v1/chat/completions"] {
            let (s, v) = post_json(route, chat(body.clone())).await;
            assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
            assert_eq!(v["error"]["param"], param, "{route} {body}: {v}");
        }
    }
}

fn model_info() -> Arc<lamina_engine::ModelInfo> {
    let lamina_engine::Status::Ready(info) = engine().status() else {
        panic!("the shared engine is not ready");
    };
    info
}

/// `ignore_eos` bans every end-of-generation token: a sequence whose end
/// token is all but certain runs to its limit, and the bans are listed in
/// llama-server's `generation_settings.logit_bias` shape (a ban is null).
#[tokio::test]
async fn ignore_eos_bans_the_end_tokens() {
    let eog: Vec<u32> = model_info().tokenizer.eog_ids().collect();
    assert!(!eog.is_empty());
    let bias: serde_json::Map<String, Value> =
        eog.iter().map(|id| (id.to_string(), json!(100))).collect();
    let body = |ignore: bool| {
        json!({"prompt": "Hi", "n_predict": 3, "temperature": 0,
               "logit_bias": bias, "ignore_eos": ignore})
    };
    let (s, v) = post_json("/completion", body(false)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["stop_type"].as_str(), v["tokens_predicted"].as_u64()),
        (Some("eos"), Some(1)),
        "{v}"
    );
    assert_eq!(v["generation_settings"]["ignore_eos"], false);

    let (s, v) = post_json("/completion", body(true)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["stop_type"].as_str(), v["tokens_predicted"].as_u64()),
        (Some("limit"), Some(3)),
        "{v}"
    );
    let g = &v["generation_settings"];
    assert_eq!(g["ignore_eos"], true);
    for id in &eog {
        assert!(
            g["logit_bias"]
                .as_array()
                .unwrap()
                .contains(&json!({"bias": null, "token": id})),
            "{g}"
        );
        assert!(
            g["logit_bias"]
                .as_array()
                .unwrap()
                .contains(&json!({"bias": 100.0, "token": id})),
            "{g}"
        );
    }
    let (s, v) = post_json("/completion", json!({"prompt": "Hi", "ignore_eos": 1})).await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
}

/// A `logit_bias` key that is an integer outside the vocabulary is a 400
/// naming the key and the vocabulary size, on every route that takes
/// `logit_bias`, streamed or not (the error comes before the stream), in
/// the object form and llama-server's pair form: read as text, `"-1"`
/// would bias the tokens of its characters.
#[tokio::test]
async fn logit_bias_ids_outside_the_vocabulary_are_400_naming_the_key() {
    let n_vocab = model_info().config.n_vocab;
    let keys = [
        "-1".to_string(),
        n_vocab.to_string(),
        (1u64 << 32).to_string(),
        "18446744073709551616".to_string(),
        format!("00{n_vocab}"),
        "-007".to_string(),
        format!(" +{n_vocab}"),
    ];
    let routes = [
        ("/v1/chat/completions", chat(json!({}))),
        (
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 1, "temperature": 0}),
        ),
        (
            "/completion",
            json!({"prompt": "Hi", "n_predict": 1, "temperature": 0}),
        ),
    ];
    for (route, base) in &routes {
        for key in &keys {
            for bias in [json!({ key.as_str(): 5 }), json!([[key, 5]])] {
                for stream in [false, true] {
                    let mut body = base.clone();
                    body["logit_bias"] = bias.clone();
                    body["stream"] = json!(stream);
                    let (s, v) = post_json(route, body.clone()).await;
                    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
                    assert_eq!(v["error"]["param"], "logit_bias", "{route} {body}: {v}");
                    let msg = v["error"]["message"].as_str().unwrap();
                    assert!(
                        msg.contains(&format!("{key:?}"))
                            && msg.contains(&format!("vocabulary size {n_vocab}")),
                        "{route} {body}: {msg:?}"
                    );
                }
            }
        }
        // Ids given as JSON numbers in the pair form, 2^64 among them
        // (too large for json!, so sent as text).
        for id in [
            "-1",
            &n_vocab.to_string(),
            "4294967296",
            "18446744073709551616",
            "7.5",
        ] {
            let mut body = base.clone();
            body["logit_bias"] = json!("ID");
            let text = body.to_string().replace("\"ID\"", &format!("[[{id}, 5]]"));
            let (s, v, _) = send(router(None, 1 << 20), post(route, text.clone())).await;
            assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
            assert_eq!(v["error"]["param"], "logit_bias", "{route} {text}: {v}");
        }
    }
    // Ollama takes no logit_bias: its options refuse the name outright.
    let (s, v) = post_json(
        "/api/chat",
        json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
               "options": {"logit_bias": {"-1": 5}}}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

/// A `logit_bias` key inside the vocabulary is that token however
/// llama-server's `strtol` spells it ("007", "+7"), and a text key biases
/// the tokens of its text (llama-server's feature), in both forms.
#[tokio::test]
async fn logit_bias_ids_in_any_spelling_and_text_keys_bias_their_tokens() {
    let first = |bias: Value| async move {
        let (s, v) = post_json(
            "/completion",
            json!({"prompt": "Hi", "n_predict": 1, "temperature": 0,
                   "return_tokens": true, "logit_bias": bias}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v["tokens"][0].as_u64().unwrap()
    };
    let plain = first(json!({})).await;
    let id = if plain == 7 { 8 } else { 7 };
    for key in [
        id.to_string(),
        format!("00{id}"),
        format!("+{id}"),
        format!(" {id}"),
    ] {
        assert_eq!(first(json!({ key.as_str(): 100 })).await, id, "{key:?}");
        assert_eq!(first(json!([[key, 100]])).await, id, "{key:?}");
    }
    let hello = model_info().tokenizer.encode("Hello", false, false);
    assert!(!hello.is_empty());
    for bias in [json!({"Hello": 100}), json!([["Hello", 100]])] {
        let got = first(bias.clone()).await;
        assert!(
            hello.contains(&(got as u32)),
            "{bias}: {got} not in {hello:?}"
        );
    }
}

/// `/v1/chat/completions/input_tokens` counts the prompt the chat route
/// would run (a prefill and tools included), with llama-server's `object`,
/// and refuses what the chat route refuses.
#[tokio::test]
async fn chat_input_tokens_count_the_chat_prompt() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for body in [
        chat(json!({})),
        chat(
            json!({"messages": [{"role": "user", "content": "Best book?"},
                                  {"role": "assistant", "content": "Whill"}]}),
        ),
        chat(json!({"tools": tools})),
    ] {
        let (s, counted) = post_json("/v1/chat/completions/input_tokens", body.clone()).await;
        assert_eq!(s, StatusCode::OK, "{counted}");
        assert_eq!(counted["object"], "response.input_tokens");
        let (_, ran) = post_json("/v1/chat/completions", body.clone()).await;
        assert_eq!(
            counted["input_tokens"], ran["usage"]["prompt_tokens"],
            "{body}"
        );
        let (_, same) = post_json("/chat/completions/input_tokens", body).await;
        assert_eq!(same["input_tokens"], counted["input_tokens"]);
    }
    let (s, v) = post_json(
        "/v1/chat/completions/input_tokens",
        json!({"messages": "hi"}),
    )
    .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request_error");
}

/// `post_sampling_probs` reports the distribution each token was drawn
/// from, after the sampler chain, as llama-server's `prob`/`top_probs`:
/// with top-k 3 the kept tokens' probabilities sum to 1, the drawn token
/// is among them, and greedy decoding is certain.
#[tokio::test]
async fn post_sampling_probs_are_the_samplers_distribution() {
    let body = json!({"prompt": "Today I would finally become a", "n_predict": 4, "n_probs": 5,
                      "post_sampling_probs": true, "temperature": 1.0, "top_k": 3,
                      "top_p": 1.0, "min_p": 0.0, "seed": 7});
    let (s, v) = post_json("/completion", body.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["generation_settings"]["post_sampling_probs"], true);
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 4, "{v}");
    for tok in probs {
        assert!(
            tok.get("logprob").is_none() && tok.get("top_logprobs").is_none(),
            "{tok}"
        );
        let p = tok["prob"].as_f64().unwrap();
        assert!(p > 0.0 && p <= 1.0, "{tok}");
        let top = tok["top_probs"].as_array().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{tok}");
        let sum: f64 = top.iter().map(|t| t["prob"].as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-4, "{tok}");
        let drawn = top.iter().find(|t| t["id"] == tok["id"]).unwrap();
        assert!((drawn["prob"].as_f64().unwrap() - p).abs() < 1e-6, "{tok}");
    }
    // The same draws as without the report: only what is reported differs.
    let mut plain = body.clone();
    plain["post_sampling_probs"] = json!(false);
    let (_, w) = post_json("/completion", plain).await;
    assert_eq!(w["content"], v["content"]);
    assert!(
        w["completion_probabilities"][0].get("logprob").is_some(),
        "{w}"
    );

    let mut greedy = body;
    greedy["temperature"] = json!(0);
    let (_, v) = post_json("/completion", greedy).await;
    for tok in v["completion_probabilities"].as_array().unwrap() {
        assert_eq!(tok["prob"], 1.0, "{tok}");
        assert_eq!(
            tok["top_probs"],
            json!([{"id": tok["id"], "token": tok["token"],
                                              "bytes": tok["bytes"], "prob": 1.0}])
        );
    }
}

/// The generation rate counts decode steps, as llama-server does: the
/// first token comes from the prompt's last logits, so one token has no
/// rate and n tokens took n - 1 steps.
#[tokio::test]
async fn generation_timings_count_decode_steps() {
    let body = |n: u64| json!({"prompt": "I believe", "n_predict": n, "temperature": 0, "ignore_eos": true});
    let (_, v) = post_json("/completion", body(1)).await;
    let t = &v["timings"];
    assert_eq!(t["predicted_n"], 1, "{v}");
    assert_eq!(
        (
            t["predicted_per_second"].as_f64(),
            t["predicted_per_token_ms"].as_f64()
        ),
        (Some(0.0), Some(0.0)),
        "{t}"
    );
    let (_, v) = post_json("/completion", body(6)).await;
    let t = &v["timings"];
    assert_eq!(t["predicted_n"], 6, "{v}");
    let ms = t["predicted_ms"].as_f64().unwrap();
    assert!(
        (t["predicted_per_second"].as_f64().unwrap() - 5e3 / ms).abs() < 1e-6,
        "{t}"
    );
    assert!(
        (t["predicted_per_token_ms"].as_f64().unwrap() - ms / 5.0).abs() < 1e-9,
        "{t}"
    );
}

/// `timings_per_token` on a stream: every chunk with text carries the
/// timings so far (the role delta none), counting up to the final ones;
/// with `return_progress` the reports carry them too, the first with no
/// prompt work yet.
#[tokio::test]
async fn timings_per_token_ride_on_stream_chunks() {
    for (route, body) in [
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 4, "ignore_eos": true})),
        ),
        (
            "/completion",
            json!({"prompt": "Hi", "n_predict": 4, "temperature": 0, "ignore_eos": true}),
        ),
    ] {
        let mut body = body;
        body["stream"] = json!(true);
        body["timings_per_token"] = json!(true);
        body["return_progress"] = json!(true);
        let (s, _, bytes) = send(router(None, 1 << 20), post(route, body.to_string())).await;
        assert_eq!(s, StatusCode::OK);
        let objects = sse_objects(&bytes);
        let reports: Vec<&Value> = objects
            .iter()
            .filter(|o| o.get("prompt_progress").is_some())
            .collect();
        assert!(!reports.is_empty(), "{route}: {objects:?}");
        assert_eq!(reports[0]["timings"]["prompt_n"], 0, "{route}");
        assert_eq!(reports[0]["timings"]["prompt_ms"], 0.0, "{route}");
        let counts: Vec<u64> = objects
            .iter()
            .filter(|o| o.get("prompt_progress").is_none())
            .filter_map(|o| o.get("timings"))
            .map(|t| t["predicted_n"].as_u64().unwrap())
            .collect();
        assert!(counts.len() >= 4, "{route}: {objects:?}");
        assert!(
            counts.windows(2).all(|w| w[0] <= w[1]),
            "{route}: {counts:?}"
        );
        assert_eq!(counts.last(), Some(&4), "{route}: {counts:?}");
        if route == "/v1/chat/completions" {
            assert!(objects[0]["choices"][0]["delta"]["role"] == "assistant");
            assert!(objects[0].get("timings").is_none(), "{:?}", objects[0]);
        }
    }
}

/// Templates see llama.cpp's `date_string` and `datetime` (today, as Llama
/// 3.x templates print it), which a request's `chat_template_kwargs` may
/// override. An engine of its own, for its template.
#[tokio::test]
async fn templates_see_todays_date_as_llama_cpp_gives_it() {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_ctx = Some(256);
    cfg.chat_template =
        Some("{{ date_string }}|{{ datetime }}|{{ messages[0].content }}".to_owned());
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(60)).unwrap();
    let app = || app(Arc::new(AppState::new(e.clone(), None, 1 << 20)));
    let today = || {
        let now = lamina_chat::Clock::Local.now();
        format!("{}|{}|", now.format("%d %b %Y"), now.format("%b %d %Y"))
    };
    let before = today();
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (s, v, _) = send(app(), post("/apply-template", body.to_string())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let prompt = v["prompt"].as_str().unwrap();
    assert!(
        prompt == format!("{before}hi") || prompt == format!("{}hi", today()),
        "{prompt}"
    );
    let body = json!({"messages": [{"role": "user", "content": "hi"}],
                      "chat_template_kwargs": {"date_string": "1 Jan 2000"}});
    let (_, v, _) = send(app(), post("/apply-template", body.to_string())).await;
    assert!(
        v["prompt"].as_str().unwrap().starts_with("1 Jan 2000|"),
        "{v}"
    );
}

/// llama-server's telemetry on the Responses API's stream: with
/// `return_progress` the prompt's reports come as `response.in_progress`
/// events with `prompt_progress`, with `timings_per_token` the text deltas
/// carry timings, and the last event always does.
#[tokio::test]
async fn responses_streams_carry_llama_server_telemetry() {
    let body = json!({"input": "Once upon a time ".repeat(10), "max_output_tokens": 4,
                      "temperature": 0, "stream": true, "return_progress": true,
                      "timings_per_token": true});
    let (s, _, bytes) = send(
        router(None, 1 << 20),
        post("/v1/responses", body.to_string()),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let objects = sse_objects(&bytes);
    let reports: Vec<&Value> = objects
        .iter()
        .filter(|o| o.get("prompt_progress").is_some())
        .collect();
    assert!(!reports.is_empty(), "{objects:?}");
    for r in &reports {
        assert_eq!(r["type"], "response.in_progress", "{r}");
        assert!(r["prompt_progress"]["total"].as_u64() > Some(0), "{r}");
        assert!(
            r["prompt_progress"]["processed"].as_u64() >= r["prompt_progress"]["cache"].as_u64()
        );
    }
    let deltas: Vec<&Value> = objects
        .iter()
        .filter(|o| o["type"] == "response.output_text.delta")
        .collect();
    assert!(!deltas.is_empty(), "{objects:?}");
    assert!(
        deltas
            .iter()
            .all(|d| d["timings"]["predicted_n"].as_u64() > Some(0)),
        "{deltas:?}"
    );
    let last = objects.last().unwrap();
    assert!(last["type"] == "response.completed" || last["type"] == "response.incomplete");
    assert_eq!(
        last["timings"]["predicted_n"], last["response"]["usage"]["output_tokens"],
        "{last}"
    );

    // Not asked: no reports, no per-delta timings.
    let body = json!({"input": "Hi", "max_output_tokens": 2, "temperature": 0, "stream": true});
    let (_, _, bytes) = send(
        router(None, 1 << 20),
        post("/v1/responses", body.to_string()),
    )
    .await;
    let objects = sse_objects(&bytes);
    assert!(objects.iter().all(|o| o.get("prompt_progress").is_none()));
    assert!(objects
        .iter()
        .filter(|o| o["type"] == "response.output_text.delta")
        .all(|d| d.get("timings").is_none()));
}
