//! Embeddings: OpenAI's `POST /v1/embeddings` and llama-server's native
//! `POST /embedding` (and `/embeddings`), started with `--embedding`.
//!
//! A prompt runs once from an empty cache (`Engine::submit_hidden`); its
//! tokens' hidden states after the model's final norm are pooled as
//! `--pooling` says (the file's `pooling_type` by default, else none, as
//! llama-server) and divided by the `embd_normalize` norm (Euclidean by
//! default; pooling none is never normalized, as llama-server). The input
//! takes llama-server's shapes: a string, token ids, a mix of both in one
//! array, `{"prompt_string": …}`, `{"content": [{"type": "text", …}]}`, or
//! an array of those (no number at its top level) for several prompts,
//! answered in order. All prompts are queued before any is awaited.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lamina_engine::pooling::{self, Pooling};
use lamina_engine::{HiddenReply, ModelInfo};
use serde_json::{json, Value};

use super::error::ApiError;
use super::native;
use super::params::Body;
use super::AppState;

/// Prompts one request may embed: each is a queued job.
const MAX_INPUTS: usize = 2048;

/// The server's embedding setup, or the 501 llama-server gives without
/// `--embeddings`.
pub(super) fn enabled(st: &AppState, info: &ModelInfo) -> Result<Pooling, ApiError> {
    if !st.options.embedding {
        return Err(ApiError::not_implemented(
            "this server does not serve embeddings: start it with --embedding",
        ));
    }
    Ok(st.options.pooling.or(info.pooling).unwrap_or(Pooling::None))
}

/// `POST /v1/embeddings`.
pub async fn openai(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b = Body::parse(&body?)?;
    // llama-server answers `content` (not OpenAI's field) in its own format.
    if b.get("input").is_none() && b.get("content").is_some() {
        return native_body(&st, b).await;
    }
    let info = st.ready()?;
    let pooling = enabled(&st, &info)?;
    if pooling == Pooling::None {
        return Err(ApiError::invalid(
            "pooling",
            "pooling 'none' gives one vector per token, which OpenAI's format cannot carry: \
             start the server with --pooling mean, cls or last (or use /embedding)",
        ));
    }
    let base64 = match b.str("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format must be float or base64 (got {other:?})"),
            ))
        }
    };
    let input = b
        .get("input")
        .cloned()
        .ok_or_else(|| ApiError::invalid("input", "input is required"))?;
    let norm = norm(&b, &st)?;
    let (vectors, tokens) = embed_all(&st, &info, input, pooling, norm).await?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, mut rows)| {
            let v = rows.pop().unwrap_or_default();
            if base64 {
                json!({"object": "embedding", "index": index,
                       "embedding": base64_f32(&v), "encoding_format": "base64"})
            } else {
                json!({"object": "embedding", "index": index, "embedding": v})
            }
        })
        .collect();
    let model = b
        .str("model")?
        .map_or_else(|| st.model_id(&info), str::to_owned);
    Ok(Json(json!({
        "object": "list",
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// `POST /embedding` and `/embeddings`: llama-server's native answer, one
/// `{"index", "embedding"}` per prompt, `embedding` a list of vectors (one
/// per token for pooling none, else the pooled one).
pub async fn native(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b = Body::parse(&body?)?;
    native_body(&st, b).await
}

async fn native_body(st: &Arc<AppState>, b: Body) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let pooling = enabled(st, &info)?;
    let input = b
        .get("input")
        .or_else(|| b.get("content"))
        .cloned()
        .ok_or_else(|| ApiError::invalid("input", "\"input\" or \"content\" must be provided"))?;
    let norm = norm(&b, st)?;
    let (vectors, _) = embed_all(st, &info, input, pooling, norm).await?;
    let out: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, rows)| json!({"index": index, "embedding": rows}))
        .collect();
    Ok(Json(Value::Array(out)).into_response())
}

/// `embd_normalize`, else the server's.
fn norm(b: &Body, st: &AppState) -> Result<i32, ApiError> {
    Ok(b.int("embd_normalize", -1, 64)?
        .map_or(st.options.embd_normalize, |n| n as i32))
}

/// Tokenizes the input, runs every prompt, and pools and normalizes each:
/// per prompt its vectors, and the prompt tokens of them all.
pub(super) async fn embed_all(
    st: &Arc<AppState>,
    info: &Arc<ModelInfo>,
    input: Value,
    pooling: Pooling,
    norm: i32,
) -> Result<(Vec<Vec<Vec<f32>>>, usize), ApiError> {
    let info2 = info.clone();
    let prompts = st.prepare.run(move || prompts(&info2, &input)).await?;
    embed_prompts(st, info, prompts, pooling, norm).await
}

/// [`embed_all`] for prompts already tokenized.
pub(super) async fn embed_prompts(
    st: &Arc<AppState>,
    info: &ModelInfo,
    prompts: Vec<Vec<u32>>,
    pooling: Pooling,
    norm: i32,
) -> Result<(Vec<Vec<Vec<f32>>>, usize), ApiError> {
    let tokens = prompts.iter().map(Vec::len).sum();
    // Queued before any is awaited, so they run back to back; if one is
    // refused, dropping the other receivers cancels those still waiting.
    let pending = prompts
        .into_iter()
        .map(|p| st.engine.submit_hidden(p))
        .collect::<Result<Vec<_>, _>>()?;
    let rows = futures_util::future::try_join_all(pending.into_iter().map(hidden)).await?;
    let e = info.config.n_embd;
    let vectors = rows
        .into_iter()
        .map(|r| {
            let mut v = pooling::pool(&r, e, pooling);
            if pooling != Pooling::None {
                v.iter_mut().for_each(|x| pooling::normalize(x, norm));
            }
            v
        })
        .collect();
    Ok((vectors, tokens))
}

/// The hidden states the engine answers with.
pub(super) async fn hidden(rx: HiddenReply) -> Result<Vec<f32>, ApiError> {
    match rx.await {
        Ok(rows) => Ok(rows?),
        Err(_) => Err(ApiError::internal("the engine stopped before answering")),
    }
}

/// The prompts of an embedding input: one, or one per element of an array
/// with no number at its top level.
fn prompts(info: &ModelInfo, input: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let list = match input {
        Value::Array(a) if !a.iter().any(Value::is_number) => {
            if a.is_empty() {
                return Err(ApiError::invalid("input", "input must not be empty"));
            }
            if a.len() > MAX_INPUTS {
                return Err(ApiError::invalid(
                    "input",
                    format!("at most {MAX_INPUTS} inputs in one request"),
                ));
            }
            a.iter().collect()
        }
        one => vec![one],
    };
    list.into_iter()
        .enumerate()
        .map(|(i, p)| entry(info, p, &format!("input[{i}]")))
        .collect()
}

/// One prompt: as the native completion's prompt, or an OpenAI content
/// array of text parts (joined, as one string).
fn entry(info: &ModelInfo, p: &Value, param: &str) -> Result<Vec<u32>, ApiError> {
    let Some(content) = p.as_object().and_then(|o| o.get("content")) else {
        return native::subprompt(info, p, param);
    };
    let Value::Array(parts) = content else {
        return Err(ApiError::invalid(
            format!("{param}.content"),
            "content must be an array of {\"type\": \"text\", \"text\": …} parts",
        ));
    };
    let mut text = String::new();
    for (i, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(Value::as_str), part.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (Some("image_url" | "input_audio" | "input_video"), _) => {
                return Err(ApiError::invalid(
                    format!("{param}.content[{i}]"),
                    "this server has no multimodal model: only text parts can be embedded",
                ))
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("{param}.content[{i}]"),
                    "a content part must be {\"type\": \"text\", \"text\": \"…\"}",
                ))
            }
        }
    }
    Ok(info.tokenizer.encode(&text, true, true))
}

/// The little-endian bytes of `v` in standard base64 (OpenAI's
/// `encoding_format: base64`).
fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * k) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // 1.0f32 is 00 00 80 3F.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
        assert_eq!(base64_f32(&[]), "");
    }
}
