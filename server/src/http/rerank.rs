//! Reranking: llama-server's `POST /rerank` (also `/reranking`,
//! `/v1/rerank`, `/v1/reranking`), started with `--reranking`.
//!
//! Two request shapes, as llama-server takes them: Jina's (`documents`,
//! answered `{"model", "object", "usage", "results": [{"index",
//! "relevance_score"}]}`) and TEI's (`texts`, answered with the bare array of
//! `{"index", "score"}`, with `"text"` when `return_text` is true). Results
//! are sorted by score, best first, and cut to `top_n`.
//!
//! Each document becomes one prompt with the query (the file's
//! `tokenizer.chat_template.rerank` when it has one, else query and document
//! with the BOS/EOS/SEP the vocabulary adds, as llama.cpp's
//! `format_prompt_rerank`), run once from an empty cache; the score is
//! `lamina_engine::rank::score` of its hidden rows. For a model without a
//! ranking head that is the last row's first component, as llama-server
//! answers: a number, not a judgement of relevance.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lamina_engine::{rank, ModelInfo};
use serde_json::{json, Value};

use super::error::ApiError;
use super::params::Body;
use super::AppState;

/// Documents one request may rank: each is a queued job.
const MAX_DOCUMENTS: usize = 2048;

/// `POST /rerank` and its aliases.
pub async fn rerank(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if !st.options.reranking {
        return Err(ApiError::not_implemented(
            "This server does not support reranking. Start it with `--reranking`",
        ));
    }
    let b = Body::parse(&body?)?;
    let info = st.ready()?;
    let tei = b.get("texts").is_some();
    let query = match b.get("query") {
        Some(Value::String(q)) => q.clone(),
        Some(_) => return Err(ApiError::invalid("query", "\"query\" must be a string")),
        None => return Err(ApiError::invalid("query", "\"query\" must be provided")),
    };
    let field = if b.get("documents").is_some() {
        "documents"
    } else {
        "texts"
    };
    let documents = documents(b.get(field), field)?;
    let top_n = b.int("top_n", 0, i64::MAX)?.map_or(documents.len(), |n| {
        usize::try_from(n).unwrap_or(usize::MAX)
    });
    let return_text = tei && b.bool("return_text")?.unwrap_or(false);

    let info2 = info.clone();
    let docs = documents.clone();
    let prompts = st
        .prepare
        .run(move || {
            Ok::<_, ApiError>(
                docs.iter()
                    .map(|d| prompt(&info2, &query, d))
                    .collect::<Vec<_>>(),
            )
        })
        .await?;
    let scores = scores(&st, &info, &prompts).await?;
    let tokens: usize = prompts.iter().map(Vec::len).sum();

    let label = if tei { "score" } else { "relevance_score" };
    let mut ranked: Vec<(usize, f32)> = scores.into_iter().enumerate().collect();
    // Stable, so equal scores keep the documents' order.
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(top_n);
    let results: Vec<Value> = ranked
        .into_iter()
        .map(|(index, score)| {
            let mut r = json!({"index": index, label: score});
            if return_text {
                r["text"] = Value::String(documents[index].clone());
            }
            r
        })
        .collect();
    if tei {
        return Ok(Json(Value::Array(results)).into_response());
    }
    let model = b
        .str("model")?
        .map_or_else(|| st.model_id(&info), str::to_owned);
    Ok(Json(json!({
        "model": model,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }))
    .into_response())
}

/// The documents: a non-empty array of strings, at most [`MAX_DOCUMENTS`].
fn documents(v: Option<&Value>, field: &str) -> Result<Vec<String>, ApiError> {
    let refuse = || {
        ApiError::invalid(
            field,
            format!("\"{field}\" must be a non-empty string array"),
        )
    };
    let Some(Value::Array(list)) = v else {
        return Err(refuse());
    };
    if list.is_empty() {
        return Err(refuse());
    }
    if list.len() > MAX_DOCUMENTS {
        return Err(ApiError::invalid(
            field,
            format!("at most {MAX_DOCUMENTS} documents in one request"),
        ));
    }
    list.iter()
        .map(|d| d.as_str().map(str::to_owned).ok_or_else(refuse))
        .collect()
}

/// One reranking prompt, as llama.cpp's `format_prompt_rerank` builds it.
fn prompt(info: &ModelInfo, query: &str, doc: &str) -> Vec<u32> {
    let tok = &info.tokenizer;
    if let Some(t) = &info.rerank_template {
        // The template's own text may hold control tokens; the query and
        // document are put in as they are, like llama.cpp does.
        let text = t.replace("{query}", query).replace("{document}", doc);
        return tok.encode(&text, false, true);
    }
    let eos = tok.eos().or_else(|| tok.sep());
    let mut out = Vec::new();
    if tok.add_bos() {
        out.extend(tok.bos());
    }
    out.extend(tok.encode(query, false, false));
    if tok.add_eos() {
        out.extend(eos);
    }
    if tok.add_sep() {
        out.extend(tok.sep());
    }
    out.extend(tok.encode(doc, false, false));
    if tok.add_eos() {
        out.extend(eos);
    }
    out
}

/// Every prompt's score, all queued before any is awaited.
async fn scores(
    st: &Arc<AppState>,
    info: &ModelInfo,
    prompts: &[Vec<u32>],
) -> Result<Vec<f32>, ApiError> {
    let pending = prompts
        .iter()
        .map(|p| st.engine.submit_hidden(p.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let rows =
        futures_util::future::try_join_all(pending.into_iter().map(super::embed::hidden)).await?;
    let e = info.config.n_embd;
    rows.iter()
        .map(|r| {
            rank::score(r, e, info.rank_head.as_ref())
                .ok_or_else(|| ApiError::internal("the engine answered no hidden states"))
        })
        .collect()
}
