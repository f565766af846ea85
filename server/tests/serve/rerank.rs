//! Reranking: llama-server's `/rerank` in its Jina and TEI shapes, checked
//! against llama-server's scores for the same file and against Lamina's
//! own `/embedding` of the same tokens.

use serde_json::{json, Value};

use super::{client, Server};

fn post(server: &Server, path: &str, body: Value) -> client::Response {
    client::post(server.port, path, &body)
}

/// llama-server's answers for the same file
/// (`tests/reference/llama.cpp/rerank_smollm2.json`).
fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/reference/llama.cpp/rerank_smollm2.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Scores by document index from a Jina-shaped answer.
fn by_index(results: &Value, label: &str, n: usize) -> Vec<f64> {
    let mut out = vec![f64::NAN; n];
    for r in results.as_array().unwrap() {
        out[r["index"].as_u64().unwrap() as usize] = r[label].as_f64().unwrap();
    }
    assert!(out.iter().all(|s| s.is_finite()), "{results}");
    out
}

/// How far a score may be from llama-server's: it rounds activations to 8
/// bits before each quantized product, Lamina keeps f32 (0.051 measured at
/// most, on these scores of -0.6 to -2.6).
const TOLERANCE: f64 = 0.1;

/// SmolLM2 has no ranking head: the score is the last token's first hidden
/// component, as llama-server's. The values are near llama-server's (which
/// rounds activations to 8 bits; Lamina keeps f32), the token usage equal,
/// and the results sorted best first.
#[test]
fn scores_match_llama_server_and_are_sorted() {
    let server = Server::start(&["--reranking"], &[]);
    let reference = reference();
    for case in [&reference, &reference["short"]] {
        let n = case["documents"].as_array().unwrap().len();
        let r = post(
            &server,
            "/rerank",
            json!({"query": case["query"], "documents": case["documents"]}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "list");
        assert_eq!(v["usage"]["prompt_tokens"], case["usage_prompt_tokens"]);
        assert_eq!(v["usage"]["total_tokens"], case["usage_prompt_tokens"]);
        let got: Vec<f64> = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["relevance_score"].as_f64().unwrap())
            .collect();
        assert!(got.windows(2).all(|w| w[0] >= w[1]), "not sorted: {v}");
        let scores = by_index(&v["results"], "relevance_score", n);
        for (i, want) in case["scores"].as_array().unwrap().iter().enumerate() {
            let want = want.as_f64().unwrap();
            assert!(
                (scores[i] - want).abs() < TOLERANCE,
                "document {i}: {} vs llama-server's {want}",
                scores[i]
            );
        }
    }
}

/// The score is the last row of the same forward pass `/embedding` runs:
/// `--pooling last` without normalization on the same tokens gives it as
/// the first component.
#[test]
fn the_score_is_the_last_tokens_first_hidden_component() {
    let server = Server::start(&["--reranking", "--embedding", "--pooling", "last"], &[]);
    let (query, doc) = ("Which city?", "Paris, capitale de la");
    let tokens = |text: &str| {
        let r = post(&server, "/tokenize", json!({"content": text}));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["tokens"].as_array().unwrap().clone()
    };
    // SmolLM2 adds no BOS or EOS: the prompt is the query, then the document.
    let mut ids = tokens(query);
    ids.extend(tokens(doc));
    let r = post(
        &server,
        "/embedding",
        json!({"content": ids, "embd_normalize": -1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let want = r.json()[0]["embedding"][0][0].as_f64().unwrap();
    let r = post(
        &server,
        "/v1/rerank",
        json!({"query": query, "documents": [doc]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    let got = v["results"][0]["relevance_score"].as_f64().unwrap();
    assert!((got - want).abs() < 1e-4, "{got} vs {want}");
}

/// `top_n`, TEI's shape (`texts`, `score`, `return_text`), the route
/// aliases, and `model`.
#[test]
fn shapes_top_n_and_routes() {
    let server = Server::start(&["--reranking", "-a", "ranker"], &[]);
    let docs = ["the cat sat", "a dog ran", "the cat sat"];
    for (top_n, want) in [(None, 3), (Some(2), 2), (Some(0), 0), (Some(99), 3)] {
        let mut body = json!({"query": "cat", "documents": docs});
        if let Some(n) = top_n {
            body["top_n"] = json!(n);
        }
        let r = post(&server, "/reranking", body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["model"], "ranker");
        assert_eq!(v["results"].as_array().unwrap().len(), want, "{v}");
    }
    let full = post(
        &server,
        "/rerank",
        json!({"query": "cat", "documents": docs, "model": "mine"}),
    )
    .json();
    assert_eq!(full["model"], "mine");
    let scores = by_index(&full["results"], "relevance_score", 3);
    // The same document scores the same, whatever its place.
    assert_eq!(scores[0], scores[2]);

    let r = post(
        &server,
        "/v1/reranking",
        json!({"query": "cat", "texts": docs, "return_text": true, "top_n": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let tei = r.json();
    let list = tei.as_array().expect("TEI answers a bare array");
    assert_eq!(list.len(), 2);
    for item in list {
        let i = item["index"].as_u64().unwrap() as usize;
        assert_eq!(item["text"], docs[i]);
        assert_eq!(item["score"].as_f64().unwrap(), scores[i]);
        assert!(item.get("relevance_score").is_none());
    }
    // Jina's shape never carries the text.
    let r = post(
        &server,
        "/rerank",
        json!({"query": "cat", "documents": docs, "return_text": true}),
    );
    assert!(r.json()["results"][0].get("text").is_none());
}

/// Invalid requests are 400s in the error shape; without `--reranking`
/// the route is a 501.
#[test]
fn refusals() {
    let server = Server::start(&["--reranking"], &[]);
    for body in [
        json!({"query": "q", "documents": []}),
        json!({"query": "q", "documents": null}),
        json!({"query": "q", "documents": 123}),
        json!({"query": "q", "documents": [1, 2, 3]}),
        json!({"query": "q", "documents": ["a", 2]}),
        json!({"query": "q"}),
        json!({"documents": ["a"]}),
        json!({"query": 5, "documents": ["a"]}),
        json!({"query": "q", "documents": ["a"], "top_n": -1}),
        json!({"query": "", "documents": [""]}),
    ] {
        let r = post(&server, "/rerank", body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    }
    drop(server);
    let plain = Server::start(&[], &[]);
    let r = post(&plain, "/rerank", json!({"query": "q", "documents": ["a"]}));
    assert_eq!(r.status, 501, "{}", r.body);
}
