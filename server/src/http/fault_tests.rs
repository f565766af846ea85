//! Faults of the model as clients see them. Memory that runs out on the
//! device during a request: that request is answered 503 with Retry-After
//! (the client's cue to try again), and the server goes on serving the
//! next one (the allocation is forced to fail on the software Vulkan
//! device the suite installs). A prompt the model cannot take for another
//! reason than its length is a plain 400, not `context_length_exceeded`.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt as _;
use lamina_engine::{Engine, EngineConfig};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::placement::Ngl;
use serde_json::{json, Value};
use tower::ServiceExt as _;

use super::tests::model_path;
use super::{app, AppState};

#[tokio::test]
async fn a_gpu_out_of_memory_is_a_503_and_the_server_goes_on() {
    let gpu = Arc::new(Gpu::new(GpuOptions::default()).unwrap());
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_parallel = 1;
    cfg.n_ctx = Some(256);
    cfg.ngl = Ngl::All;
    // No warm-up: the first request's step allocates its scratch buffers.
    cfg.warmup = false;
    cfg.gpu = Some(gpu.clone());
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(120)).unwrap();
    let ask = || async {
        let body = json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "temperature": 0,
        });
        let req = Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = app(Arc::new(AppState::new(e.clone(), None, 1 << 20)))
            .oneshot(req)
            .await
            .unwrap();
        let status = resp.status();
        let retry = resp.headers().get(header::RETRY_AFTER).cloned();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, retry, v)
    };
    gpu.fail_next_allocations(1);
    let (status, retry, v) = ask().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(retry.is_some(), "no Retry-After: {v}");
    assert_eq!(v["error"]["code"], "out_of_memory", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("out of GPU memory")),
        "{v}"
    );
    // The device has memory again: the same request goes through.
    let (status, _, v) = ask().await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
}

#[tokio::test]
async fn a_token_outside_the_vocabulary_is_not_a_context_error() {
    let mut cfg = EngineConfig::new(model_path());
    cfg.n_parallel = 1;
    cfg.n_ctx = Some(256);
    cfg.ngl = Ngl::Layers(0);
    let e = Engine::start(cfg).unwrap();
    e.wait_ready(Duration::from_secs(60)).unwrap();
    let body = json!({"prompt": [1, 2, 4_000_000], "n_predict": 1});
    let req = Request::post("/completion")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app(Arc::new(AppState::new(e, None, 1 << 20)))
        .oneshot(req)
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("4000000")),
        "{v}"
    );
    assert_ne!(v["error"]["code"], "context_length_exceeded", "{v}");
}
