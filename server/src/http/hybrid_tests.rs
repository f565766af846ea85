//! A Qwen hybrid served (a synthetic `qwen35` file: `lamina synth --shape
//! qwen35-tiny`, Gated DeltaNet blocks with their per-sequence state): a
//! 20-turn conversation, each turn resending the whole history as agents
//! do, reuses its prefix on every turn (the cached count rises) from the
//! recurrent state's checkpoints, whose bytes stay within their bound the
//! whole time; and its answers are those of the same turns with nothing
//! reused (the slot erased before each turn).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use lamina_engine::{Engine, EngineConfig};
use serde_json::{json, Value};
use tower::ServiceExt as _;

use super::tests::model_path;
use super::{app, AppState};

/// Checkpoints each sequence may keep: a few of this model's states
/// (about 0.4 MiB each), so twenty turns evict the oldest.
const BUDGET: u64 = 2 << 20;
const TURNS: usize = 20;

fn hybrid_file() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lamina-hybrid-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("qwen35-tiny.gguf");
    crate::synth::run(crate::synth::SynthArgs {
        shape: "qwen35-tiny",
        ty: "Q8_0",
        vocab_from: Some(&model_path()),
        vocab: 0,
        output: &out,
        seed: 11,
        tensor_types: &[],
        vocab_only: false,
        llama3_rope: None,
        long_rope: false,
        yarn: None,
    })
    .unwrap();
    out
}

async fn post(e: &Engine, uri: &str, body: Value) -> (StatusCode, Value) {
    let req = Request::post(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app(Arc::new(AppState::new(e.clone(), None, 1 << 20)))
        .oneshot(req)
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One conversation of [`TURNS`] turns: each turn's answer and the prompt
/// tokens it found cached. With `erase`, the slot forgets everything
/// before each turn.
async fn converse(e: &Engine, erase: bool) -> Vec<(String, u64)> {
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    let mut out = Vec::new();
    for turn in 0..TURNS {
        if erase {
            let (s, v) = post(e, "/slots/0?action=erase", json!({})).await;
            assert_eq!(s, StatusCode::OK, "{v}");
        }
        messages.push(json!({"role": "user", "content": format!("Turn {turn}: and then?")}));
        let (s, v) = post(
            e,
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 6, "temperature": 0}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let answer = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        let held = e.metrics().checkpoint_bytes;
        assert!(held <= BUDGET, "turn {turn}: {held} checkpoint bytes");
        assert!(erase || turn == 0 || held > 0, "turn {turn}: no checkpoint");
        messages.push(json!({"role": "assistant", "content": answer}));
        out.push((answer, cached));
    }
    out
}

#[tokio::test]
async fn a_long_conversation_reuses_its_prefix_within_the_checkpoint_bound() {
    let mut cfg = EngineConfig::new(hybrid_file());
    cfg.n_parallel = 1;
    cfg.n_ctx = Some(4096);
    cfg.cache_ram = None;
    cfg.kv.checkpoint_bytes = BUDGET;
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(120)).unwrap();
    let reused = converse(&e, false).await;
    let fresh = converse(&e, true).await;
    for (turn, ((a, cached), (b, none))) in reused.iter().zip(&fresh).enumerate() {
        assert_eq!(a, b, "turn {turn}: reuse changed the answer");
        assert_eq!(*none, 0, "turn {turn}: the erased slot reused {none}");
        if turn > 0 {
            let before = reused[turn - 1].1;
            assert!(
                *cached > before,
                "turn {turn}: cached {cached} after {before}"
            );
        }
    }
}
