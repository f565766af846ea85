//! The small endpoints, with llama-server's request and response shapes:
//! `/health`, `/v1/models`, `/props`, `/tokenize`, `/detokenize`,
//! `/apply-template` and `/metrics` (Prometheus text).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lamina_engine::Status;
use serde_json::{json, Value};

use super::error::ApiError;
use super::generate::token_ids;
use super::params::{self, Body};
use super::AppState;

/// 200 once the model is loaded; 503 while loading, if loading failed, and
/// once the model file changed under the server, so a load balancer holds
/// traffic back and an orchestrator restarts the process.
pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    match st.engine.status() {
        Status::Ready(_) => Json(json!({"status": "ok"})).into_response(),
        Status::Loading => ApiError::unavailable("Loading model", "model_loading").into_response(),
        Status::Failed(e) => {
            ApiError::unavailable(format!("the model failed to load: {e}"), "model_failed")
                .into_response()
        }
        Status::Broken(e) => ApiError::from(e).into_response(),
    }
}

pub async fn models(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let c = &info.config;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id(&info),
            "object": "model",
            "created": st.started_unix,
            "owned_by": "lamina",
            "aliases": st.options.aliases,
            "tags": st.options.tags,
            "meta": {
                "architecture": c.arch.name(),
                "n_vocab": c.n_vocab,
                "n_ctx_train": c.context_length,
                "n_ctx": info.n_ctx,
                "n_ctx_slot": info.n_ctx_slot,
                "n_embd": c.n_embd,
                "n_params": info.n_params,
                "size": info.size_bytes,
                "file_type": info.file_type,
            },
        }],
    }))
    .into_response())
}

pub async fn props(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let d = &st.options.sampler;
    let tok = &info.tokenizer;
    let text = |id: Option<u32>| {
        id.and_then(|i| tok.token_text(i))
            .unwrap_or_default()
            .to_owned()
    };
    Ok(Json(json!({
        "default_generation_settings": {
            "n_ctx": info.n_ctx_slot,
            "params": {
                // The length of a request that names none: -n, or (as
                // llama-server's -1) the room left in the slot.
                "n_predict": st.options.n_predict.map_or(-1, |n| n as i64),
                "max_tokens_cap": st.engine.max_tokens_cap(),
                // llama-server reports a random seed as 0xFFFFFFFF.
                "seed": d.seed.unwrap_or(0xFFFF_FFFF),
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty,
                "repeat_last_n": d.repeat_last_n,
            },
        },
        "total_slots": info.n_parallel,
        "n_ctx": info.n_ctx,
        "model_path": info.path.display().to_string(),
        "chat_template": info.template.source(),
        "chat_template_origin": format!("{:?}", info.template_origin),
        "bos_token": text(tok.bos()),
        "eos_token": text(tok.eos()),
        "placement": info.placement,
        "build_info": super::fingerprint(),
        "is_sleeping": st.engine.is_sleeping(),
    }))
    .into_response())
}

pub async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let b = Body::parse(&body?)?;
    let content = b
        .str("content")?
        .ok_or_else(|| ApiError::invalid("content", "content is required"))?
        .to_owned();
    // llama-server's defaults: no BOS, special tokens recognised.
    let add_special = b.bool("add_special")?.unwrap_or(false);
    let parse_special = b.bool("parse_special")?.unwrap_or(true);
    let with_pieces = b.bool("with_pieces")?.unwrap_or(false);
    let info2 = info.clone();
    let ids = st
        .prepare
        .run(move || Ok(info2.tokenizer.encode(&content, add_special, parse_special)))
        .await?;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let bytes = info.tokenizer.token_to_piece(id);
                let piece = match String::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(e) => json!(e.into_bytes()),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({"tokens": tokens})).into_response())
}

pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let b = Body::parse(&body?)?;
    let ids = match b.get("tokens") {
        None => Vec::new(),
        Some(Value::Array(a)) => token_ids(a, info.config.n_vocab, "tokens")?,
        Some(_) => {
            return Err(ApiError::invalid(
                "tokens",
                "tokens must be an array of token ids",
            ))
        }
    };
    Ok(Json(json!({"content": info.tokenizer.decode(&ids)})).into_response())
}

pub async fn apply_template(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let info = st.ready()?;
    let b = Body::parse(&body?)?;
    let messages = params::messages(&b)?;
    let tools = params::tools(&b)?.cloned();
    // The prompt the chat route would render: `enable_thinking` as the
    // server and the request decide it.
    let kwargs = params::template_kwargs(&b)?;
    let asked = super::reasoning::effort_switch(b.get("reasoning_effort"))?;
    let thinking = super::reasoning::Thinking::decide(&st, &info, kwargs, asked, None)?;
    let kwargs = Some(thinking.kwargs(kwargs.cloned()));
    let (messages, ending) = params::ending(&b, messages)?;
    let prompt = st
        .prepare
        .run(move || {
            super::generate::render_ending(
                &info,
                &messages,
                tools.as_ref(),
                kwargs.as_ref(),
                &ending,
            )
            .map(|p| p.text)
        })
        .await?;
    Ok(Json(json!({"prompt": prompt})).into_response())
}

/// `GET /slots`: each slot as the last step left it, in llama-server's
/// shape (its `params` only with `--verbose` there, so not here either).
/// With `?fail_on_no_slot=1`, a 503 when every slot is busy, as
/// llama-server answers load balancers.
pub async fn slots(
    State(st): State<Arc<AppState>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Response, ApiError> {
    slots_enabled(&st)?;
    st.ready()?;
    let slots = st.engine.slots();
    let fail = q
        .get("fail_on_no_slot")
        .is_some_and(|v| v == "1" || v == "true");
    if fail && !slots.is_empty() && slots.iter().all(|s| s.is_processing) {
        return Err(ApiError::unavailable(
            "no slot available",
            "no_slot_available",
        ));
    }
    let out: Vec<Value> = slots
        .iter()
        .map(|s| {
            json!({
                "id": s.id,
                "id_task": -1,
                "n_ctx": s.n_ctx,
                "speculative": false,
                "is_processing": s.is_processing,
                "n_cached": s.n_cached,
                "next_token": [{
                    "has_next_token": s.is_processing,
                    "has_new_line": false,
                    // llama-server's "no budget": an idle slot has no task.
                    "n_remain": if s.is_processing { s.n_remain as i64 } else { -1 },
                    "n_decoded": s.n_decoded,
                }],
            })
        })
        .collect();
    Ok(Json(Value::Array(out)).into_response())
}

/// The 501 llama-server gives with `--no-slots`.
fn slots_enabled(st: &AppState) -> Result<(), ApiError> {
    if st.options.slots {
        Ok(())
    } else {
        Err(ApiError::not_implemented(
            "this server does not show its slots: start it without --no-slots",
        ))
    }
}

/// A slot file's name as llama-server accepts it: a plain file name in
/// the --slot-save-path directory, never a path out of it.
fn slot_file_name(name: &str) -> Result<&str, ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0', ':'])
        && !name.chars().any(char::is_control);
    if ok {
        Ok(name)
    } else {
        Err(ApiError::invalid(
            "filename",
            format!("{name:?} is not a plain file name"),
        ))
    }
}

/// `POST /slots/{id}?action=erase|save|restore`, once no request holds the
/// slot (as llama-server defers it). Erase forgets the slot's cached tokens
/// (`{id_slot, n_erased}`); save writes its tokens and KV cache to
/// `{"filename"}` in the --slot-save-path directory (`{id_slot, filename,
/// n_saved, n_written, timings}`), restore reads such a file back
/// (`{…, n_restored, n_read, …}`), so a later prompt with the same prefix
/// reuses it. Without --slot-save-path save and restore are a 501; a file
/// saved by another model or cache layout is a 400.
pub async fn slot_action(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    slots_enabled(&st)?;
    let action = q.get("action").map_or("", String::as_str);
    if !matches!(action, "erase" | "save" | "restore") {
        return Err(ApiError::invalid(
            "action",
            format!("action must be save, restore or erase (got {action:?})"),
        ));
    }
    let id: usize = id.parse().map_err(|_| {
        ApiError::invalid(
            "id_slot",
            format!("the slot id must be a number (got {id:?})"),
        )
    })?;
    let file = if action == "erase" {
        None
    } else {
        let Some(dir) = st.options.slot_save_path.clone() else {
            return Err(ApiError::not_implemented(format!(
                "slot action {action:?} needs the server started with --slot-save-path DIR"
            )));
        };
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid("body", format!("not JSON: {e}")))?;
        let name = v
            .get("filename")
            .and_then(|f| f.as_str())
            .ok_or_else(|| ApiError::invalid("filename", "a string \"filename\" is required"))?;
        Some((name.to_owned(), dir.join(slot_file_name(name)?)))
    };
    st.ready()?;
    let op = match (action, &file) {
        ("save", Some((_, p))) => lamina_engine::SlotOp::Save(p.clone()),
        ("restore", Some((_, p))) => lamina_engine::SlotOp::Restore(p.clone()),
        _ => lamina_engine::SlotOp::Erase,
    };
    let t0 = std::time::Instant::now();
    let n = st
        .engine
        .slot_action(id, op)?
        .await
        .map_err(|_| ApiError::internal("the engine stopped before the slot action"))??;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let bytes = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let body = match (action, file) {
        ("save", Some((name, p))) => json!({"id_slot": id, "filename": name, "n_saved": n,
            "n_written": bytes(&p), "timings": {"save_ms": ms}}),
        ("restore", Some((name, p))) => json!({"id_slot": id, "filename": name, "n_restored": n,
            "n_read": bytes(&p), "timings": {"restore_ms": ms}}),
        _ => json!({"id_slot": id, "n_erased": n}),
    };
    Ok(Json(body).into_response())
}

/// Prometheus text format, version 0.0.4.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    if !st.options.metrics {
        return ApiError::not_implemented(
            "this server does not serve metrics: start it without --no-metrics",
        )
        .into_response();
    }
    let m = st.engine.metrics();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP lamina_{name} {help}");
        let _ = writeln!(out, "# TYPE lamina_{name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "lamina_{name}{labels} {v}");
        }
    };
    let one = |v: f64| [(String::new(), v)];
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };

    let statuses: Vec<(String, f64)> = st
        .http
        .snapshot()
        .into_iter()
        .map(|(code, n)| (format!("{{status=\"{code}\"}}"), n as f64))
        .collect();
    metric(
        "requests_total",
        "counter",
        "HTTP requests answered, by status code.",
        &statuses,
    );
    metric(
        "sequences_started_total",
        "counter",
        "Requests that got a slot.",
        &one(m.started as f64),
    );
    metric(
        "sequences_finished_total",
        "counter",
        "Requests that ran to a finish reason.",
        &one(m.finished as f64),
    );
    metric(
        "sequences_dropped_total",
        "counter",
        "Requests abandoned by their client.",
        &one(m.dropped as f64),
    );
    metric(
        "sequences_rejected_total",
        "counter",
        "Requests refused because the queue was full.",
        &one(m.rejected as f64),
    );
    metric(
        "sequences_failed_total",
        "counter",
        "Requests ended by a model fault.",
        &one(m.failed as f64),
    );
    metric(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens processed.",
        &one(m.prompt_tokens as f64),
    );
    metric(
        "prompt_tokens_cached_total",
        "counter",
        "Prompt tokens reused from a slot's cache.",
        &one(m.cached_tokens as f64),
    );
    metric(
        "generated_tokens_total",
        "counter",
        "Tokens generated.",
        &one(m.generated_tokens as f64),
    );
    metric(
        "prompt_seconds_total",
        "counter",
        "Time spent processing prompts.",
        &one(m.prompt_seconds),
    );
    metric(
        "generation_seconds_total",
        "counter",
        "Time spent generating.",
        &one(m.predicted_seconds),
    );
    metric(
        "prompt_tokens_per_second",
        "gauge",
        "Average prompt throughput per request.",
        &one(rate(m.prompt_tokens, m.prompt_seconds)),
    );
    metric(
        "generated_tokens_per_second",
        "gauge",
        "Average generation throughput per request.",
        &one(rate(m.generated_tokens, m.predicted_seconds)),
    );
    metric(
        "time_to_first_token_seconds",
        "summary",
        "From arrival to the first generated token, queueing included.",
        &[
            ("_sum".into(), m.ttft_seconds_sum),
            ("_count".into(), m.ttft_count as f64),
        ],
    );
    metric(
        "paced_steps_total",
        "counter",
        "Steps whose prompt tokens were cut to --step-budget-ms so that the streams decoding beside them kept going.",
        &one(m.paced_steps as f64),
    );
    metric(
        "greedy_pick_steps_total",
        "counter",
        "Steps whose sequences all decoded greedily from the raw logits: the model returned each one's pick, which a GPU head reduces on the device instead of reading back the vocabulary.",
        &one(m.argmax_steps as f64),
    );
    metric(
        "top_k_steps_total",
        "counter",
        "Steps whose sequences each needed only their greedy pick or their top-k candidates (no bias, penalties, grammar or log-probabilities), which the model selected where the logits are: a GPU head reads back k pairs a sequence instead of the vocabulary.",
        &one(m.top_k_steps as f64),
    );
    metric(
        "draft_tokens_total",
        "counter",
        "Drafted tokens the model verified (speculative decoding, --spec-type).",
        &one(m.draft_tokens as f64),
    );
    metric(
        "draft_accepted_tokens_total",
        "counter",
        "Drafted tokens accepted: equal to the token sampled at their position.",
        &one(m.draft_accepted as f64),
    );
    metric(
        "prompt_cache_restores_total",
        "counter",
        "Prompts restored from the host prompt cache (--cache-ram) into a slot that had given them up.",
        &one(m.prompt_cache_restores as f64),
    );
    metric(
        "prompt_cache_restored_tokens_total",
        "counter",
        "Prompt tokens those restores held for their requests.",
        &one(m.prompt_cache_restored_tokens as f64),
    );
    let slots = st.engine.info().map_or(0, |i| i.n_parallel);
    let usage = if m.kv_capacity > 0 {
        m.kv_used as f64 / m.kv_capacity as f64
    } else {
        0.0
    };
    for (name, help, v) in [
        (
            "queue_depth",
            "Requests waiting for a slot.",
            m.queued as f64,
        ),
        (
            "active_sequences",
            "Requests holding a slot.",
            m.active as f64,
        ),
        ("slots", "Slots (--parallel).", slots as f64),
        (
            "kv_cache_tokens",
            "Positions held in the slots' KV caches.",
            m.kv_used as f64,
        ),
        (
            "kv_cache_capacity_tokens",
            "Positions the slots' KV caches can hold.",
            m.kv_capacity as f64,
        ),
        (
            "kv_cache_usage_ratio",
            "Share of KV cache positions in use.",
            usage,
        ),
        (
            "prompt_cache_entries",
            "Prompts held in the host prompt cache (--cache-ram).",
            m.prompt_cache_entries as f64,
        ),
        (
            "prompt_cache_bytes",
            "Host memory the prompt cache's entries take.",
            m.prompt_cache_bytes as f64,
        ),
        (
            "checkpoint_bytes",
            "Host memory the slots' recurrent-state checkpoints take (hybrid models; \
             --ctx-checkpoint-ram per slot).",
            m.checkpoint_bytes as f64,
        ),
    ] {
        metric(name, "gauge", help, &one(v));
    }
    llama_cpp_metrics(&mut out, &m);
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8".to_owned(),
            ),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                st.started_unix.to_string(),
            ),
        ],
        out,
    )
        .into_response()
}

/// The same counters under llama-server's names (`llamacpp:…`), so the
/// dashboards and alerts written for it read Lamina unchanged. Lamina has
/// no speculative decoding: its draft counters stay 0.
fn llama_cpp_metrics(out: &mut String, m: &lamina_engine::MetricsSnapshot) {
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let per_step = if m.steps > 0 {
        m.step_sequences as f64 / m.steps as f64
    } else {
        0.0
    };
    let rows: [(&str, &str, &str, f64); 15] = [
        (
            "prompt_tokens_total",
            "counter",
            "Number of prompt tokens processed.",
            m.prompt_tokens as f64,
        ),
        (
            "prompt_tokens_cached_total",
            "counter",
            "Number of prompt tokens reused from a slot's cache.",
            m.cached_tokens as f64,
        ),
        (
            "prompt_seconds_total",
            "counter",
            "Prompt process time",
            m.prompt_seconds,
        ),
        (
            "tokens_predicted_total",
            "counter",
            "Number of generation tokens processed.",
            m.generated_tokens as f64,
        ),
        (
            "tokens_predicted_seconds_total",
            "counter",
            "Predict process time",
            m.predicted_seconds,
        ),
        (
            "n_decode_total",
            "counter",
            "Total number of llama_decode() calls",
            m.steps as f64,
        ),
        (
            "n_tokens_max",
            "counter",
            "Largest observed n_tokens.",
            m.step_tokens_max as f64,
        ),
        (
            "spec_decode_num_draft_tokens_total",
            "counter",
            "Drafted tokens verified by the model (speculative decoding).",
            m.draft_tokens as f64,
        ),
        (
            "spec_decode_num_accepted_tokens_total",
            "counter",
            "Drafted tokens accepted: equal to what the model sampled there.",
            m.draft_accepted as f64,
        ),
        (
            "spec_decode_num_drafts_total",
            "counter",
            "Drafts verified (one per sequence and step that drafted).",
            m.drafts as f64,
        ),
        (
            "n_busy_slots_per_decode",
            "gauge",
            "Average number of busy slots per llama_decode() call",
            per_step,
        ),
        (
            "prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            rate(m.prompt_tokens, m.prompt_seconds),
        ),
        (
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            rate(m.generated_tokens, m.predicted_seconds),
        ),
        (
            "requests_processing",
            "gauge",
            "Number of requests processing.",
            m.active as f64,
        ),
        (
            "requests_deferred",
            "gauge",
            "Number of requests deferred.",
            m.queued as f64,
        ),
    ];
    for (name, kind, help, v) in rows {
        let _ = writeln!(out, "# HELP llamacpp:{name} {help}");
        let _ = writeln!(out, "# TYPE llamacpp:{name} {kind}");
        let _ = writeln!(out, "llamacpp:{name} {v}");
    }
}
