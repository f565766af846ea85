//! Vertex AI's custom-container prediction route, as llama-server offers
//! it when started with `AIP_MODE=PREDICTION`: `POST /predict` (or
//! `AIP_PREDICT_ROUTE`) takes `{"instances": [...]}`, each instance a
//! request body for another route named by its `@requestFormat` (a
//! camelCase name such as `chatCompletions` for `/v1/chat/completions`, or
//! the path itself), and answers `{"predictions": [...]}` with each route's
//! JSON answer in order. An instance that fails carries its error in its
//! place; the whole request is a 400 only when its shape is wrong.
//! `AIP_HEALTH_ROUTE` adds a `GET` alias of `/health`; `AIP_HTTP_PORT` (read
//! by the binary) is the port. See Google's "custom container requirements".

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, Method, Request};
use axum::response::{IntoResponse, Response};
use axum::Json;
use axum::Router;
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use tower::ServiceExt as _;

use super::error::ApiError;

/// Instances one request may carry (llama-server's bound).
const MAX_INSTANCES: usize = 128;

/// Most bytes of one instance's answer that are read back.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// The routes an instance may name, by path: every POST route that answers
/// JSON once (the streaming ones are asked not to stream).
pub(super) const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/chat/completions/input_tokens",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/embeddings",
    "/embedding",
    "/embeddings",
    "/completion",
    "/completions",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/v1/reranking",
];

/// Every other path Lamina serves: the Vertex AI routes may not take one
/// (the router would refuse the overlap at start).
const TAKEN: &[&str] = &[
    "/",
    "/chat.js",
    "/chat.css",
    "/health",
    "/v1/health",
    "/v1/models",
    "/models",
    "/chat/completions/input_tokens",
    "/responses",
    "/api/chat",
    "/api/generate",
    "/api/tags",
    "/api/show",
    "/api/ps",
    "/api/version",
    "/api/embed",
    "/api/embeddings",
    "/props",
    "/metrics",
    "/slots",
];

/// The Vertex AI setup, from the `AIP_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gcp {
    /// `AIP_PREDICT_ROUTE`, default `/predict`.
    pub predict_route: String,
    /// `AIP_HEALTH_ROUTE`: a GET alias of `/health`, when set.
    pub health_route: Option<String>,
}

impl Gcp {
    /// `Some` when `AIP_MODE` is `PREDICTION`; `var` reads a variable
    /// (empty counts as unset; routes get a leading `/`). A route that
    /// Lamina already serves, or that holds a pattern character, is an
    /// error, as llama-server refuses a clashing predict route.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        if var("AIP_MODE").as_deref() != Some("PREDICTION") {
            return Ok(None);
        }
        let route = |name| {
            var(name).filter(|v| !v.is_empty()).map(|v| {
                if v.starts_with('/') {
                    v
                } else {
                    format!("/{v}")
                }
            })
        };
        let g = Gcp {
            predict_route: route("AIP_PREDICT_ROUTE").unwrap_or_else(|| "/predict".into()),
            health_route: route("AIP_HEALTH_ROUTE"),
        };
        for (name, r) in [
            ("AIP_PREDICT_ROUTE", Some(&g.predict_route)),
            ("AIP_HEALTH_ROUTE", g.health_route.as_ref()),
        ] {
            let Some(r) = r else { continue };
            let clash = PATHS.contains(&r.as_str())
                || TAKEN.contains(&r.as_str())
                || r.starts_with("/slots/");
            if clash || r.contains(['{', '}', '*']) {
                return Err(format!(
                    "{name}={r} conflicts with a route Lamina serves (or is a pattern)"
                ));
            }
        }
        Ok(Some(g))
    }
}

/// `/v1/chat/completions` → `chatCompletions`, `/apply-template` →
/// `applyTemplate`, as llama-server derives the `@requestFormat` names.
fn format_name(path: &str) -> String {
    let s = path.strip_prefix("/v1").unwrap_or(path);
    let s = s.strip_prefix('/').unwrap_or(s);
    let mut out = String::new();
    let mut cap = false;
    for c in s.chars() {
        if matches!(c, '/' | '-' | '_') {
            cap = true;
        } else {
            out.extend(if cap {
                c.to_uppercase().collect::<Vec<_>>()
            } else {
                vec![c]
            });
            cap = false;
        }
    }
    out
}

/// The path an instance's `@requestFormat` names: the first route with
/// that camelCase name, or a route's own path.
fn dispatch_path(format: &str) -> Option<&'static str> {
    PATHS
        .iter()
        .find(|p| format_name(p) == format)
        .or_else(|| PATHS.iter().find(|p| **p == format))
        .copied()
}

fn instance_error(message: impl Into<String>) -> Value {
    let e = ApiError::invalid("instances", message);
    e.body()
}

/// The predict route: every instance through `routes`, at once.
pub async fn predict(
    routes: Router,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let data: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_body(format!("the body is not JSON: {e}")))?;
    let Value::Object(data) = data else {
        return Err(ApiError::invalid("", "request body must be a JSON object"));
    };
    let Some(Value::Array(instances)) = data.get("instances") else {
        return Err(ApiError::invalid(
            "instances",
            "request body must include an array field named instances",
        ));
    };
    if instances.len() > MAX_INSTANCES {
        return Err(ApiError::invalid(
            "instances",
            format!("instances array exceeds maximum size of {MAX_INSTANCES}"),
        ));
    }
    let auth = headers.get(header::AUTHORIZATION).cloned();
    let key = headers.get("x-api-key").cloned();
    let answers = instances.iter().map(|instance| {
        let routes = routes.clone();
        let (auth, key) = (auth.clone(), key.clone());
        async move {
            let Value::Object(mut payload) = instance.clone() else {
                return instance_error("each instance must be a JSON object");
            };
            let Some(Value::String(format)) = payload.remove("@requestFormat") else {
                return instance_error("each instance must include a string @requestFormat");
            };
            let Some(path) = dispatch_path(&format) else {
                return instance_error(format!(
                    "no handler registered for @requestFormat: {format}"
                ));
            };
            if payload.contains_key("stream") {
                payload.insert("stream".into(), Value::Bool(false));
            }
            let mut req = Request::builder()
                .method(Method::POST)
                .uri(path)
                .header(header::CONTENT_TYPE, "application/json");
            if let Some(v) = auth {
                req = req.header(header::AUTHORIZATION, v);
            }
            if let Some(v) = key {
                req = req.header("x-api-key", v);
            }
            let bytes = serde_json::to_vec(&Value::Object(payload)).unwrap_or_default();
            let Ok(req) = req.body(Body::from(bytes)) else {
                return instance_error("the instance could not be dispatched");
            };
            match routes.oneshot(req).await {
                Ok(resp) => answer(resp).await,
                Err(never) => match never {},
            }
        }
    });
    let predictions = futures_util::future::join_all(answers).await;
    Ok(Json(json!({"predictions": predictions})).into_response())
}

/// A route's answer as JSON (its text when it is not JSON, null when empty).
async fn answer(resp: Response) -> Value {
    let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER);
    let Ok(collected) = body.collect().await else {
        return ApiError::internal("the answer could not be read").body();
    };
    let bytes = collected.to_bytes();
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_names_are_llama_servers() {
        assert_eq!(format_name("/v1/chat/completions"), "chatCompletions");
        assert_eq!(format_name("/apply-template"), "applyTemplate");
        assert_eq!(
            format_name("/v1/messages/count_tokens"),
            "messagesCountTokens"
        );
        assert_eq!(
            dispatch_path("chatCompletions"),
            Some("/v1/chat/completions")
        );
        assert_eq!(dispatch_path("/tokenize"), Some("/tokenize"));
        assert_eq!(dispatch_path("nothing"), None);
    }

    #[test]
    fn the_environment_turns_it_on() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(Gcp::from_env(env(&[])), Ok(None));
        assert_eq!(Gcp::from_env(env(&[("AIP_MODE", "TRAINING")])), Ok(None));
        assert!(Gcp::from_env(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_PREDICT_ROUTE", "/tokenize")
        ]))
        .is_err());
        assert!(Gcp::from_env(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_HEALTH_ROUTE", "/x/{id}")
        ]))
        .is_err());
        let g = Gcp::from_env(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_PREDICT_ROUTE", "v2/p"),
            ("AIP_HEALTH_ROUTE", ""),
        ]));
        assert_eq!(
            g,
            Ok(Some(Gcp {
                predict_route: "/v2/p".into(),
                health_route: None
            }))
        );
    }
}
