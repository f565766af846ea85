//! Every error a handler returns, and the one place that turns it into a
//! response: OpenAI's `{"error": {"message", "type", "param", "code"}}` with
//! the status that fits (400 the request is wrong, 401 no key, 404, 408 body too
//! slow, 413 too large, 422 the chat template passed one of its limits on
//! this conversation, 503 busy, loading or the model file changed under the
//! server (restart it), 500 only for faults of the
//! server, a handler's panic included).

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lamina_chat::ChatError;
use lamina_engine::EngineError;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type` (llama-server's names where OpenAI has none).
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// A prompt too long for a slot: `(n_prompt_tokens, n_ctx)`, sent as
    /// llama-server sends them.
    pub context: Option<(usize, usize)>,
}

impl ApiError {
    /// 400: a field is missing, of the wrong type, or out of bounds.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: Some(param.into()),
            code: Some("invalid_value"),
            context: None,
        }
    }

    /// 400 about the body as a whole.
    pub fn bad_body(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: Some("invalid_json"),
            context: None,
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            message: "invalid or missing API key (send it as `Authorization: Bearer KEY`)".into(),
            param: None,
            code: Some("invalid_api_key"),
            context: None,
        }
    }

    /// 403: a route this server was started without (llama-server answers
    /// its opt-in routes, /tools and /cors-proxy, this way).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            kind: "permission_error",
            message: message.into(),
            param: None,
            code: Some("forbidden"),
            context: None,
        }
    }

    /// 502: a server this one forwarded to failed or could not be reached.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: Some("bad_gateway"),
            context: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            message: message.into(),
            param: None,
            code: Some("not_found"),
            context: None,
        }
    }

    pub fn method_not_allowed() -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            kind: "invalid_request_error",
            message: "this route does not accept that method".into(),
            param: None,
            code: Some("method_not_allowed"),
            context: None,
        }
    }

    /// 501: a feature this server was started without (llama-server's
    /// `not_supported_error`).
    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_IMPLEMENTED,
            kind: "not_supported_error",
            message: message.into(),
            param: None,
            code: Some("not_supported"),
            context: None,
        }
    }

    /// 413: the body is past `--body-limit`.
    pub fn too_large() -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "invalid_request_error",
            message: "the request body is larger than the server's limit (--body-limit)".into(),
            param: None,
            code: Some("request_too_large"),
            context: None,
        }
    }

    /// 408: the client did not send its body in time.
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            kind: "invalid_request_error",
            message: format!(
                "the request body did not arrive within {} s (--read-timeout)",
                limit.as_secs_f64()
            ),
            param: None,
            code: Some("request_timeout"),
            context: None,
        }
    }

    /// 503: the caller may retry later.
    pub fn unavailable(message: impl Into<String>, code: &'static str) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "unavailable_error",
            message: message.into(),
            param: None,
            code: Some(code),
            context: None,
        }
    }

    /// 500: a fault of the server, never of the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: None,
            context: None,
        }
    }

    /// The JSON object, also sent as an SSE event when a stream fails late.
    pub fn body(&self) -> serde_json::Value {
        let mut v = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }});
        if let Some((n_prompt, n_ctx)) = self.context {
            v["error"]["n_prompt_tokens"] = json!(n_prompt);
            v["error"]["n_ctx"] = json!(n_ctx);
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let mut resp = (self.status, Json(self.body())).into_response();
        if retry {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Overloaded { .. } => {
                ApiError::unavailable(e.to_string(), "server_overloaded")
            }
            EngineError::NotReady(_) => ApiError::unavailable(e.to_string(), "model_loading"),
            // 503: this process cannot serve again, but a restarted one can.
            EngineError::FileChanged { .. } => {
                ApiError::unavailable(e.to_string(), "model_file_changed")
            }
            EngineError::ContextExceeded { n_prompt, n_ctx } => {
                let mut err = ApiError::invalid("messages", e.to_string());
                err.kind = "exceed_context_size_error";
                err.code = Some("context_length_exceeded");
                err.context = Some((n_prompt, n_ctx));
                err
            }
            // Only a prompt longer than the context is
            // `context_length_exceeded` (ContextExceeded above): an empty
            // prompt or a token outside the vocabulary is a plain 400.
            EngineError::Invalid { param, message } => ApiError::invalid(param, message),
            // Memory that ran out may be free again once other requests
            // finish: 503 with Retry-After, as for a full queue.
            EngineError::Model(_) if e.is_out_of_memory() => {
                ApiError::unavailable(e.to_string(), "out_of_memory")
            }
            // A constraint that failed while generating: what the request
            // asked for could not be kept (a grammar engine limit, or
            // logit_bias banning all the grammar allows).
            EngineError::Constraint(message) => {
                let mut err = ApiError::invalid("response_format", message);
                err.code = Some("constraint_failed");
                err
            }
            EngineError::Stopped
            | EngineError::Load(_)
            | EngineError::Model(_)
            | EngineError::Sampling(_) => ApiError::internal(e.to_string()),
        }
    }
}

impl From<ChatError> for ApiError {
    fn from(e: ChatError) -> Self {
        if e.is_limit() {
            // 422: retrying the same conversation cannot succeed (OpenAI's
            // SDKs do not retry a 4xx), and the message names the limit.
            let mut err = ApiError::invalid("messages", format!("chat template: {e}"));
            err.status = StatusCode::UNPROCESSABLE_ENTITY;
            err.code = Some("chat_template_limit");
            err
        } else if e.is_request_error() {
            ApiError::invalid("messages", format!("chat template: {e}"))
        } else {
            ApiError::internal(format!("chat template: {e}"))
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large()
        } else {
            ApiError::bad_body(format!("reading the request body: {}", r.body_text()))
        }
    }
}
