//! Reading a request body field by field, so every error names the field
//! and the bound it broke (`max_tokens must be <= 4096`), and unknown
//! fields are ignored as OpenAI ignores them. Nothing here panics on what a
//! client sends: every value is type-checked and range-checked before it is
//! converted.

use lamina_engine::{Constraint, ModelInfo};
use lamina_sampling::SamplerConfig;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::structured::{self, Wanted};

/// At most this many stop strings (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// Bytes per stop string.
pub const MAX_STOP_BYTES: usize = 1024;
/// Alternatives per token in log-probs (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// Most choices (`n`) one request may ask for. Each choice is a sequence
/// of its own in a slot of its own, so a request past the server's slots
/// only queues its extra choices behind each other; the bound keeps one
/// request from filling the queue (`--max-queue`, 64 by default) that
/// every client shares.
pub const MAX_N: i64 = 16;

/// A request body: a JSON object.
pub struct Body(pub Map<String, Value>);

impl Body {
    pub fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
        // serde_json refuses nesting deeper than 128, so a hostile body cannot
        // overflow the stack.
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(m)) => Ok(Body(m)),
            Ok(_) => Err(ApiError::bad_body("the request body must be a JSON object")),
            Err(e) => Err(ApiError::bad_body(format!(
                "the request body is not valid JSON: {e}"
            ))),
        }
    }

    /// The field, with `null` read as absent (as OpenAI's SDKs send it).
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid(name, format!("{name} must be a boolean"))),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid(name, format!("{name} must be a string"))),
        }
    }

    /// A number within `[lo, hi]`.
    pub fn number(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let x = v
            .as_f64()
            .ok_or_else(|| ApiError::invalid(name, format!("{name} must be a number")))?;
        if !(x.is_finite() && (lo..=hi).contains(&x)) {
            return Err(ApiError::invalid(
                name,
                format!("{name} must be between {lo} and {hi} (got {x})"),
            ));
        }
        Ok(Some(x as f32))
    }

    /// A whole number within `[lo, hi]`; `1.0` counts, `1.5` does not.
    pub fn int(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let n = match v {
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(|f| f as i64)
            }),
            _ => None,
        };
        let too_big = v.as_u64().is_some_and(|u| u > hi as u64);
        match n {
            Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
            _ if too_big || n.is_some() => Err(ApiError::invalid(
                name,
                format!("{name} must be between {lo} and {hi} (got {v})"),
            )),
            _ => Err(ApiError::invalid(
                name,
                format!("{name} must be an integer"),
            )),
        }
    }
}

/// What a completion request asks for besides its prompt.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub sampler: SamplerConfig,
    /// `None`: as much as the context and the server cap allow.
    pub max_tokens: Option<usize>,
    /// Which field carried `max_tokens`, for error messages.
    pub max_tokens_param: &'static str,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
    /// Choices to generate (`n`), each with its own sampler stream.
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// What the output must be (`response_format`, `json_schema`,
    /// `grammar`, Ollama's `format`, a required tool call), as asked.
    pub wanted: Option<Wanted>,
    /// `wanted`, compiled (`structured::compile`) before the job is made.
    pub constraint: Option<Constraint>,
    /// `return_progress`: a stream reports the prompt's processing
    /// (`prompt_progress`) before the first token.
    pub return_progress: bool,
    /// `timings_per_token`: a stream's chunks carry the timings so far.
    pub timings_per_token: bool,
    /// `post_sampling_probs` (`/completion` only): the reported
    /// probabilities are the sampler chain's, not the model's.
    pub post_sampling_probs: bool,
    /// `ignore_eos`: the end-of-generation tokens are banned (their bans
    /// are in `sampler.logit_bias`).
    pub ignore_eos: bool,
    /// `verbose`: add llama-server's `__verbose` object (the native
    /// result, with the prompt as text) to the response; `None`: as the
    /// server's `--verbose` says.
    pub verbose: Option<bool>,
    /// `speculative.n_max` / `speculative.n_min` (`/completion` only):
    /// this request's draft lengths, each `None` for the server's.
    pub draft: lamina_engine::DraftLimits,
}

/// Which endpoint a body came to: each spells log-probs its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completion,
    /// llama-server's own `/completion`.
    Native,
}

/// A request's sampling: its fields over `defaults` (the server's
/// `--temp`, `--seed` …), each range-checked.
pub fn sampling(
    b: &Body,
    info: &ModelInfo,
    cap: usize,
    api: Api,
    defaults: &SamplerConfig,
) -> Result<Sampling, ApiError> {
    let n = b.int("n", 1, MAX_N)?.map_or(1, |n| n as usize);
    let wanted = structured::from_body(b)?;

    let d = defaults.clone();
    let mut s = SamplerConfig {
        temperature: b.number("temperature", 0.0, 2.0)?.unwrap_or(d.temperature),
        top_p: d.top_p,
        top_k: b
            .int("top_k", 0, i64::from(u32::MAX))?
            .map_or(d.top_k, |k| k as usize),
        min_p: b.number("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        repeat_penalty: d.repeat_penalty,
        repeat_last_n: b
            .int("repeat_last_n", -1, i64::from(i32::MAX))?
            .map_or(d.repeat_last_n, |n| n as i32),
        presence_penalty: b
            .number("presence_penalty", -2.0, 2.0)?
            .unwrap_or(d.presence_penalty),
        frequency_penalty: b
            .number("frequency_penalty", -2.0, 2.0)?
            .unwrap_or(d.frequency_penalty),
        seed: match b.int("seed", -1, i64::MAX)? {
            None => d.seed,
            // llama-server's spelling of "random".
            Some(-1) => None,
            Some(n) => Some(n as u64),
        },
        logit_bias: logit_bias(b, info)?,
    };
    let ignore_eos = b.bool("ignore_eos")?.unwrap_or(false);
    if ignore_eos {
        // As llama-server: every end-of-generation token is banned, so the
        // sequence runs to its limit, and the bans show in the settings.
        s.logit_bias
            .extend(info.tokenizer.eog_ids().map(|id| (id, f32::NEG_INFINITY)));
    }
    if let Some(p) = b.number("top_p", 0.0, 1.0)? {
        if p <= 0.0 {
            return Err(ApiError::invalid(
                "top_p",
                "top_p must be greater than 0 and at most 1",
            ));
        }
        s.top_p = p;
    }
    if let Some(p) = b.number("repeat_penalty", 0.0, 10.0)? {
        if p <= 0.0 {
            return Err(ApiError::invalid(
                "repeat_penalty",
                "repeat_penalty must be greater than 0 and at most 10",
            ));
        }
        s.repeat_penalty = p;
    }

    let cap_i = i64::try_from(cap).unwrap_or(i64::MAX);
    let mut max_tokens = None;
    let mut max_tokens_param = "max_tokens";
    let names: &[&'static str] = match api {
        Api::Chat => &["max_completion_tokens", "max_tokens", "n_predict"],
        Api::Completion => &["max_tokens", "n_predict"],
        Api::Native => &["n_predict", "max_tokens"],
    };
    for &name in names {
        if let Some(v) = b.get(name) {
            // llama-server's `n_predict: -1` means "no limit but the context".
            if name == "n_predict" && v.as_i64() == Some(-1) {
                continue;
            }
            let n = b.int(name, 1, cap_i)?.unwrap_or(1);
            max_tokens = Some(n as usize);
            max_tokens_param = name;
            break;
        }
    }

    let logprobs = match api {
        Api::Chat => {
            let on = b.bool("logprobs")?.unwrap_or(false);
            let top = b.int("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
            if top.is_some() && !on {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs requires logprobs to be true",
                ));
            }
            on.then(|| top.unwrap_or(0) as usize)
        }
        Api::Completion => b
            .int("logprobs", 0, MAX_TOP_LOGPROBS as i64)?
            .map(|n| n as usize),
        // llama-server: 0 (the default) reports none.
        Api::Native => b
            .int("n_probs", 0, MAX_TOP_LOGPROBS as i64)?
            .filter(|&n| n > 0)
            .map(|n| n as usize),
    };

    let include_usage = match b.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(v)) => *v,
            Some(_) => {
                return Err(ApiError::invalid(
                    "stream_options.include_usage",
                    "stream_options.include_usage must be a boolean",
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options must be an object",
            ))
        }
    };

    Ok(Sampling {
        sampler: s,
        max_tokens,
        max_tokens_param,
        stop: stop(b)?,
        logprobs,
        n,
        stream: b.bool("stream")?.unwrap_or(false),
        include_usage,
        wanted,
        constraint: None,
        verbose: b.bool("verbose")?,
        return_progress: b.bool("return_progress")?.unwrap_or(false),
        timings_per_token: b.bool("timings_per_token")?.unwrap_or(false),
        ignore_eos,
        post_sampling_probs: false,
        draft: lamina_engine::DraftLimits::default(),
    })
}

fn stop(b: &Body) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match b.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_owned).ok_or_else(|| {
                    ApiError::invalid("stop", "stop must be a string or an array of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "stop must be a string or an array of strings",
            ))
        }
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "stop may hold at most {MAX_STOP} strings (got {})",
                list.len()
            ),
        ));
    }
    if let Some(s) = list.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "each stop string must be at most {MAX_STOP_BYTES} bytes (got {})",
                s.len()
            ),
        ));
    }
    Ok(list)
}

/// OpenAI's `{"token id": bias}` object, or llama-server's `[[id, bias]]`;
/// as in llama-server, a key (or first element) that is text rather than a
/// token id biases every token of that text, and a bias of `false` bans.
/// A key that is an integer outside the vocabulary is a 400, where
/// llama-server drops it silently: read as text it would bias the tokens of
/// its digits, which is never what a client sending an id meant.
fn logit_bias(b: &Body, info: &ModelInfo) -> Result<Vec<(u32, f32)>, ApiError> {
    let n_vocab = info.config.n_vocab;
    let entries: Vec<(String, &Value)> = match b.get("logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([Value::String(text), bias]) => Ok((text.clone(), bias)),
                Some([Value::Number(id), bias]) => match (id.as_i64(), id.as_u64()) {
                    (Some(n), _) => Ok((n.to_string(), bias)),
                    (_, Some(n)) => Ok((n.to_string(), bias)),
                    // A fraction, or an integer past 64 bits (read as a float).
                    _ => Err(ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias token id {id} must be an integer"),
                    )),
                },
                _ => Err(ApiError::invalid(
                    "logit_bias",
                    "logit_bias pairs must be [token_id or text, bias]",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "logit_bias",
                "logit_bias must be an object of token ids to numbers",
            ))
        }
    };
    let mut out = Vec::with_capacity(entries.len());
    for (key, v) in entries {
        let ids = match integer_key(&key) {
            Some(Some(id)) if id < n_vocab as u64 => vec![id as u32],
            Some(_) => {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!(
                        "logit_bias key {key:?} is not a token id of this model: ids run \
                         from 0 to {}, below the vocabulary size {n_vocab}",
                        n_vocab.saturating_sub(1)
                    ),
                ))
            }
            None => info.tokenizer.encode(&key, false, false),
        };
        if ids.is_empty() {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("logit_bias key {key:?} is neither a token id nor text with any token"),
            ));
        }
        let bias = match v {
            Value::Bool(false) => f32::NEG_INFINITY,
            _ => match v.as_f64() {
                Some(x) if (-100.0..=100.0).contains(&x) => x as f32,
                _ => {
                    return Err(ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias for {key:?} must be a number between -100 and 100"),
                    ))
                }
            },
        };
        out.extend(ids.into_iter().map(|id| (id, bias)));
    }
    Ok(out)
}

/// A `logit_bias` key read as an integer: `None` when it is text,
/// `Some(Some(n))` for a non-negative integer within `u64`, `Some(None)` for
/// a negative one or one past `u64` (no token's id either way).
///
/// "An integer" is what llama-server reads as one: it parses a key with
/// C's `strtol(key, &end, 10)` and takes it as an id when the whole key is
/// consumed, so leading whitespace and a sign are allowed and leading zeros
/// are decimal ("007" is token 7). Keeping its reading means a key means
/// the same token here as there. Its one oddity is left out: `strtol` reads
/// an empty key as 0, which here stays an empty text (a 400).
fn integer_key(key: &str) -> Option<Option<u64>> {
    // C's isspace in the "C" locale.
    let t = key.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    // Only digits remain, so the parse fails only past u64::MAX.
    Some(digits.parse::<u64>().ok().filter(|&n| !negative || n == 0))
}

/// Chat messages as the template receives them: roles checked, `content`
/// given as an array of text parts joined into one string (with newlines,
/// as llama-server joins them), every other field passed through.
pub fn messages(b: &Body) -> Result<Value, ApiError> {
    const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];
    let list = match b.get("messages") {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("messages", "messages must be an array")),
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must hold at least one message",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::invalid(
                format!("messages[{i}]"),
                format!("messages[{i}] must be an object"),
            ));
        };
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(
                format!("messages[{i}].role"),
                format!("messages[{i}].role must be a string"),
            )
        })?;
        if !ROLES.contains(&role) {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!(
                    "messages[{i}].role {role:?} is not one of {}",
                    ROLES.join(", ")
                ),
            ));
        }
        let param = || format!("messages[{i}].content");
        let content = match m.get("content") {
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    let ty = part.get("type").and_then(Value::as_str);
                    match (ty, part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => {
                            if !text.is_empty() {
                                text.push('\n');
                            }
                            text.push_str(t);
                        }
                        (Some("text"), None) => {
                            return Err(ApiError::invalid(param(), format!("messages[{i}].content[{j}].text must be a string")))
                        }
                        _ => {
                            return Err(ApiError::invalid(
                                param(),
                                format!("messages[{i}].content[{j}]: only parts of type \"text\" are supported"),
                            ))
                        }
                    }
                }
                Value::String(text)
            }
            // Assistant turns that only call tools have no content.
            None | Some(Value::Null) if role == "assistant" || role == "tool" => Value::Null,
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(
                    param(),
                    format!("messages[{i}].content is required"),
                ))
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    param(),
                    format!("messages[{i}].content must be a string or an array of text parts"),
                ))
            }
        };
        let mut msg = m.clone();
        msg.insert("content".into(), content);
        out.push(Value::Object(msg));
    }
    Ok(Value::Array(out))
}

/// `chat_template_kwargs`: an object whose entries become template variables.
pub fn template_kwargs(b: &Body) -> Result<Option<&Map<String, Value>>, ApiError> {
    match b.get("chat_template_kwargs") {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(ApiError::invalid(
            "chat_template_kwargs",
            "chat_template_kwargs must be an object",
        )),
    }
}

/// `tools`: passed to the template as given, when it is an array.
pub fn tools(b: &Body) -> Result<Option<&Value>, ApiError> {
    match b.get("tools") {
        None => Ok(None),
        Some(v @ Value::Array(_)) => Ok(Some(v)),
        Some(_) => Err(ApiError::invalid("tools", "tools must be an array")),
    }
}

/// How a chat prompt ends, as llama-server decides it from
/// `add_generation_prompt`, `continue_final_message` and a conversation
/// that ends with the assistant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Every message, then (or not) the header of an assistant turn.
    Render { add_generation_prompt: bool },
    /// Every message but the last, the header of an assistant turn, then
    /// the last message's text left open: the model continues it (a
    /// prefill).
    Continue(String),
}

/// The messages to render and how the prompt ends. A conversation that
/// ends with an assistant message is a prefill unless
/// `continue_final_message` says otherwise, as in llama-server (and
/// vLLM's `continue_final_message`); asking for both a generation prompt
/// and a continuation, continuing two assistant turns in a row, or
/// continuing tool calls are refused.
pub fn ending(b: &Body, messages: Value) -> Result<(Value, Ending), ApiError> {
    const PARAM: &str = "continue_final_message";
    let Value::Array(mut list) = messages else {
        return Err(ApiError::invalid("messages", "messages must be an array"));
    };
    let mut add_generation_prompt = b.bool("add_generation_prompt")?;
    let asked = match b.get(PARAM) {
        None | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(true),
        Some(Value::String(s)) if s == "content" => Some(true),
        Some(Value::String(s)) if s == "reasoning_content" => {
            return Err(ApiError::invalid(
                PARAM,
                "continue_final_message: continuing the reasoning is not supported; \
                 true or \"content\" continues the content",
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                PARAM,
                "continue_final_message must be a boolean or \"content\"",
            ))
        }
    };
    fn role(m: Option<&Value>) -> Option<&str> {
        m.and_then(|m| m.get("role")).and_then(Value::as_str)
    }
    let last_is_assistant = role(list.last()) == Some("assistant");
    let cont = match asked {
        Some(c) => c,
        // An explicit generation prompt after the assistant's message asks
        // for a new turn, not a prefill.
        None if last_is_assistant && add_generation_prompt != Some(true) => {
            if role(list.iter().rev().nth(1)) == Some("assistant") {
                return Err(ApiError::invalid(
                    "messages",
                    "the conversation may end with at most one assistant message \
                     (the prefill the model continues)",
                ));
            }
            add_generation_prompt = Some(false);
            true
        }
        None => false,
    };
    if !cont {
        return Ok((
            Value::Array(list),
            Ending::Render {
                add_generation_prompt: add_generation_prompt.unwrap_or(true),
            },
        ));
    }
    if add_generation_prompt == Some(true) {
        return Err(ApiError::invalid(
            PARAM,
            "add_generation_prompt and continue_final_message cannot both be true",
        ));
    }
    if !last_is_assistant {
        return Err(ApiError::invalid(
            PARAM,
            "continue_final_message continues an assistant message: the last message must be the assistant's",
        ));
    }
    let Some(Value::Object(last)) = list.pop() else {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    };
    if last
        .get("tool_calls")
        .is_some_and(|c| c.as_array().is_some_and(|a| !a.is_empty()))
    {
        return Err(ApiError::invalid(
            PARAM,
            "an assistant message with tool calls cannot be continued",
        ));
    }
    // The text as the client sent it: parts are joined with a blank line,
    // as llama-server renders a continued message (a message's parts reach
    // the template joined with one newline, see `messages`).
    let raw = b
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|a| a.last())
        .and_then(|m| m.get("content"));
    let text = match raw {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n\n"),
        _ => String::new(),
    };
    Ok((Value::Array(list), Ending::Continue(text)))
}

#[cfg(test)]
mod tests {
    use super::integer_key;

    #[test]
    fn logit_bias_keys_are_integers_as_strtol_reads_them() {
        for (key, want) in [
            ("7", Some(Some(7))),
            ("007", Some(Some(7))),
            ("+7", Some(Some(7))),
            (" \t7", Some(Some(7))),
            ("-0", Some(Some(0))),
            ("-1", Some(None)),
            ("18446744073709551615", Some(Some(u64::MAX))),
            ("18446744073709551616", Some(None)),
            ("-99999999999999999999999", Some(None)),
            ("", None),
            ("-", None),
            ("+-7", None),
            ("7 ", None),
            ("1e3", None),
            ("0x10", None),
            ("Hello", None),
            // Arabic-Indic seven: a digit to Unicode, not to strtol.
            ("\u{0667}", None),
        ] {
            assert_eq!(integer_key(key), want, "{key:?}");
        }
    }
}
