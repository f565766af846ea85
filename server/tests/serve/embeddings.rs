//! Embeddings: OpenAI's `/v1/embeddings`, llama-server's `/embedding`
//! and Ollama's `/api/embed`, checked against llama-server's vectors for
//! the same file and against each other.

use serde_json::{json, Value};

use super::{client, Server};

fn post(server: &Server, path: &str, body: Value) -> client::Response {
    client::post(server.port, path, &body)
}

fn vector(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// llama-server's mean-pooled vectors for the same file
/// (`tests/reference/llama.cpp/embeddings_smollm2_mean.json`).
fn llama_server_reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/reference/llama.cpp/embeddings_smollm2_mean.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Lamina's mean-pooled embeddings point where llama-server's do. They
/// are not equal: llama.cpp rounds activations to 8 bits before each
/// quantized product, Lamina keeps f32 (cosine 0.9993–0.99985 measured on
/// these and longer inputs); a wrong norm, pooling or layer would be far
/// off, and the three inputs must not be confused with one another.
#[test]
fn mean_pooled_vectors_match_llama_server() {
    let server = Server::start(&["--embedding", "--pooling", "mean", "-np", "2"], &[]);
    let reference = llama_server_reference();
    let inputs = reference["inputs"].clone();
    let r = post(&server, "/v1/embeddings", json!({"input": inputs}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(
        v["usage"]["prompt_tokens"], reference["usage_prompt_tokens"],
        "{v}"
    );
    assert_eq!(v["usage"]["total_tokens"], reference["usage_prompt_tokens"]);
    let data = v["data"].as_array().unwrap();
    let want = reference["embeddings"].as_array().unwrap();
    assert_eq!(data.len(), want.len());
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["object"], "embedding");
        let got = vector(&d["embedding"]);
        assert_eq!(got.len(), 576);
        let norm: f64 = got.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
        for (j, other) in want.iter().enumerate() {
            let c = cosine(&got, &vector(other));
            if i == j {
                assert!(c > 0.999, "input {i}: cosine {c} with llama-server's");
            } else {
                assert!(c < 0.99, "input {i} is as close to input {j}'s vector: {c}");
            }
        }
    }
}

/// The input shapes llama-server takes, one answer each; repeated inputs
/// give the same bits; errors are 400s that say what was wrong.
#[test]
fn inputs_formats_and_errors() {
    let server = Server::start(
        &["--embedding", "--pooling", "last", "-np", "2", "-c", "1024"],
        &[],
    );
    let ids = client::post(server.port, "/tokenize", &json!({"content": "hello world"})).json()
        ["tokens"]
        .clone();
    let r = post(
        &server,
        "/v1/embeddings",
        json!({"input": [
            "hello world",
            ids,
            {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
            {"prompt_string": "hello world"},
            "hello world",
        ]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let data = r.json()["data"].as_array().unwrap().clone();
    assert_eq!(data.len(), 5);
    for d in &data[1..] {
        assert_eq!(
            d["embedding"], data[0]["embedding"],
            "every shape of the same text"
        );
    }
    // base64: the little-endian floats of the same vector.
    let r = post(
        &server,
        "/v1/embeddings",
        json!({"input": "hello world", "encoding_format": "base64"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let b64 = r.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_owned();
    let floats = decode_base64_f32(&b64);
    let want = vector(&data[0]["embedding"]);
    assert_eq!(floats.len(), want.len());
    // JSON carries each f32 as its shortest decimal: back in f32, the bits.
    assert!(floats.iter().zip(&want).all(|(a, b)| *a == *b as f32));

    // llama-server's native endpoint: a list of vectors per input.
    let r = post(&server, "/embedding", json!({"content": "hello world"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let native = r.json();
    assert_eq!(native[0]["index"], 0);
    assert_eq!(native[0]["embedding"][0], data[0]["embedding"]);
    // Unnormalized on request.
    let r = post(
        &server,
        "/embedding",
        json!({"content": "hello world", "embd_normalize": -1}),
    );
    let raw = vector(&r.json()[0]["embedding"][0]);
    let norm: f64 = raw.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!(norm > 2.0, "the raw hidden state has norm {norm}");

    for (body, says) in [
        (json!({"input": []}), "empty"),
        (json!({"input": "x ".repeat(2000)}), "too large"),
        (json!({"input": {"content": "text"}}), "content"),
        (
            json!({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}}),
            "multimodal",
        ),
        (
            json!({"input": "hi", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": ""}), "empty"),
        (json!({"model": "x"}), "input"),
    ] {
        let r = post(&server, "/v1/embeddings", body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body.contains(says), "{body}: {}", r.body);
    }
    let mut s = server;
    assert!(s.alive());
}

/// Pooling none gives every token's raw row on the native endpoint, and
/// cannot be answered in OpenAI's or Ollama's format; a server started
/// without --embedding answers 501, as llama-server.
#[test]
fn pooling_none_and_a_server_without_embeddings() {
    let server = Server::start(&["--embedding", "--pooling", "none", "-np", "1"], &[]);
    let n = client::post(
        server.port,
        "/tokenize",
        &json!({"content": "hello hello hello"}),
    )
    .json()["tokens"]
        .as_array()
        .unwrap()
        .len();
    let r = post(
        &server,
        "/embeddings",
        json!({"input": "hello hello hello"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let rows = r.json()[0]["embedding"].as_array().unwrap().clone();
    assert_eq!(rows.len(), n);
    for row in &rows {
        let norm: f64 = vector(row).iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() > 1e-3, "pooling none is not normalized");
    }
    for path in ["/v1/embeddings", "/api/embed"] {
        let r = post(&server, path, json!({"input": "hello"}));
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert!(r.body.contains("pooling"), "{path}: {}", r.body);
    }
    drop(server);

    let server = Server::start(&["-np", "1"], &[]);
    for path in ["/v1/embeddings", "/embedding", "/api/embed"] {
        let r = post(&server, path, json!({"input": "hello"}));
        assert_eq!(r.status, 501, "{path}: {}", r.body);
        assert!(r.body.contains("--embedding"), "{path}: {}", r.body);
    }
}

/// Ollama's `/api/embed` (normalized, one vector per input, truncating
/// unless told not to) and its older `/api/embeddings` (one raw vector).
#[test]
fn ollama_embed_endpoints() {
    let server = Server::start(
        &["--embedding", "--pooling", "mean", "-np", "1", "-c", "256"],
        &[],
    );
    let r = post(
        &server,
        "/api/embed",
        json!({"model": "m", "input": ["hi there", "bye"]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let e = v["embeddings"].as_array().unwrap();
    assert_eq!(e.len(), 2);
    let a = vector(&e[0]);
    assert!((a.iter().map(|x| x * x).sum::<f64>().sqrt() - 1.0).abs() < 1e-5);
    assert!(v["prompt_eval_count"].as_u64().unwrap() >= 3, "{v}");
    let same = post(&server, "/v1/embeddings", json!({"input": "hi there"})).json();
    assert_eq!(same["data"][0]["embedding"], e[0]);

    // Too long for a slot: cut by default, refused with truncate false.
    let long = "word ".repeat(600);
    let r = post(&server, "/api/embed", json!({"input": long}));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(
        &server,
        "/api/embed",
        json!({"input": long, "truncate": false}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("too large"), "{}", r.body);

    let r = post(
        &server,
        "/api/embeddings",
        json!({"model": "m", "prompt": "hi there"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let raw = vector(&r.json()["embedding"]);
    let norm: f64 = raw.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!(norm > 2.0, "the legacy endpoint is not normalized: {norm}");
    assert!(cosine(&raw, &a) > 0.999_999, "the same direction");
}

fn decode_base64_f32(s: &str) -> Vec<f32> {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut bytes = Vec::new();
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = ABC.iter().position(|&a| a == c).unwrap() as u32;
        bits = bits << 6 | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            bytes.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
