//! What each tool-call format looks like: how a call opens, what comes
//! between its opener and its JSON, what may close it, and how the JSON
//! becomes calls. The formats are llama.cpp's classic handlers (see
//! [`ToolFormat`]); nothing here decides what to hold or stream.

use serde_json::{Map, Value};

use super::{ToolCall, ToolFormat};

/// Longest function name or call id accepted between markers: anything
/// longer is not a call, and is not held back waiting for its end.
pub const MAX_NAME: usize = 256;

/// How a call opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opener {
    /// A literal marker.
    Marker(&'static str),
    /// A JSON object as the first thing in the answer (or right after a
    /// call): the Llama 3.x and generic formats.
    Json,
}

pub fn openers(format: ToolFormat) -> &'static [Opener] {
    match format {
        ToolFormat::Hermes | ToolFormat::QwenXml => {
            &[Opener::Marker("<tool_call>"), Opener::Marker("<function=")]
        }
        ToolFormat::Mistral => &[Opener::Marker("[TOOL_CALLS]")],
        ToolFormat::Llama3 => &[Opener::Marker("<|python_tag|>"), Opener::Json],
        ToolFormat::Generic => &[Opener::Json],
    }
}

/// The keys a bare JSON call may start with; an object that starts with
/// another key is an ordinary answer and is streamed as text.
pub fn first_keys(format: ToolFormat) -> &'static [&'static str] {
    match format {
        ToolFormat::Llama3 => &["type", "name"],
        _ => &["tool_call", "tool_calls", "response", "name"],
    }
}

/// What came between an opener and the call's JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    /// Where the JSON starts (bytes from the opener).
    pub json_at: usize,
    /// The function's name, when the format writes it outside the JSON
    /// (`<function=NAME>`, Mistral's `NAME[ARGS]`): the JSON is then the
    /// arguments alone.
    pub name: Option<String>,
    pub id: Option<String>,
    /// What closes the call after its JSON, if the format has a closer.
    pub close: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadScan {
    Ready(Head),
    /// Llama 3.x's `<|python_tag|>` followed by code, not JSON: the rest of
    /// the answer is the code.
    Code,
    /// Not enough text yet to tell.
    Partial,
    Invalid,
}

/// Reads the head of a call; `s` starts at the opener.
pub fn head(format: ToolFormat, opener: Opener, s: &str) -> HeadScan {
    let Opener::Marker(marker) = opener else {
        return HeadScan::Ready(Head::default());
    };
    let after = marker.len();
    let rest = &s[after..];
    match (format, marker) {
        (ToolFormat::Hermes, "<function=") => {
            let Some(name) = name_until(rest, ">") else {
                return partial_or_invalid(rest, ">");
            };
            let at = after + name.len() + 1;
            json_start(s, at, |json_at| Head {
                json_at,
                name: Some(name.to_owned()),
                id: None,
                close: Some("</function>"),
            })
        }
        (ToolFormat::Hermes, _) => json_start(s, after, |json_at| Head {
            json_at,
            close: Some("</tool_call>"),
            ..Head::default()
        }),
        (ToolFormat::Llama3, _) => match json_start(s, after, |json_at| Head {
            json_at,
            ..Head::default()
        }) {
            HeadScan::Invalid => HeadScan::Code,
            other => other,
        },
        (ToolFormat::Mistral, _) => mistral_head(s, after),
        // Read by `xml::Scan`, never through a head.
        (ToolFormat::Generic | ToolFormat::QwenXml, _) => HeadScan::Invalid,
    }
}

/// `[TOOL_CALLS]` then either a JSON array of calls (or one call object), or (Mistral's later
/// tokenizers) `NAME[ARGS]{…}` with an optional `[CALL_ID]ID` before `[ARGS]`.
fn mistral_head(s: &str, after: usize) -> HeadScan {
    let rest = &s[after..];
    let skipped = rest.len() - rest.trim_start().len();
    match rest.trim_start().as_bytes().first() {
        None => return HeadScan::Partial,
        Some(b'[' | b'{') => {
            return HeadScan::Ready(Head {
                json_at: after + skipped,
                ..Head::default()
            })
        }
        Some(_) => {}
    }
    let Some(name) = name_until(rest, "[") else {
        return partial_or_invalid(rest, "[");
    };
    let mut at = after + name.len();
    let mut id = None;
    if let Some(r) = s[at..].strip_prefix("[CALL_ID]") {
        let Some(v) = name_until(r, "[") else {
            return partial_or_invalid(r, "[");
        };
        id = Some(v.to_owned());
        at += "[CALL_ID]".len() + v.len();
    }
    let r = &s[at..];
    if !r.starts_with("[ARGS]") {
        let marks = ["[ARGS]", "[CALL_ID]"];
        let prefix = marks.iter().any(|m| m.starts_with(r));
        return if prefix && (id.is_none() || "[ARGS]".starts_with(r)) {
            HeadScan::Partial
        } else {
            HeadScan::Invalid
        };
    }
    json_start(s, at + "[ARGS]".len(), |json_at| Head {
        json_at,
        name: Some(name.trim().to_owned()),
        id,
        close: None,
    })
}

/// `s[at..]`, past whitespace, must start a JSON object.
fn json_start(s: &str, at: usize, head: impl FnOnce(usize) -> Head) -> HeadScan {
    let rest = &s[at..];
    let trimmed = rest.trim_start();
    match trimmed.as_bytes().first() {
        None => HeadScan::Partial,
        Some(b'{') => HeadScan::Ready(head(at + rest.len() - trimmed.len())),
        Some(_) => HeadScan::Invalid,
    }
}

/// The name before `end` in `s`, if `end` has arrived and the name is one.
fn name_until<'a>(s: &'a str, end: &str) -> Option<&'a str> {
    let name = &s[..s.find(end)?];
    is_name(name.trim()).then_some(name)
}

/// Partial while `s` could still become a name followed by `end`.
fn partial_or_invalid(s: &str, end: &str) -> HeadScan {
    // Trimmed as `name_until` trims: space before `end` is not yet wrong.
    if s.contains(end) || s.len() > MAX_NAME || !is_name_prefix(s.trim()) {
        HeadScan::Invalid
    } else {
        HeadScan::Partial
    }
}

pub fn is_name(s: &str) -> bool {
    !s.is_empty() && is_name_prefix(s)
}

/// A function name so far: a letter, digit or `_` first, then those and
/// `-`, `.`, `:` (namespaced names).
pub fn is_name_prefix(s: &str) -> bool {
    s.len() <= MAX_NAME
        && s.bytes()
            .next()
            .is_none_or(|b| b.is_ascii_alphanumeric() || b == b'_')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// How many bytes after a call's JSON belong to the call (its closer, a
/// separator), or `None` while that is not known yet. At the `end` of the
/// answer a missing closer is forgiven, as llama.cpp forgives it.
pub fn tail(format: ToolFormat, close: Option<&str>, s: &str, end: bool) -> Option<usize> {
    let trimmed = s.trim_start();
    let ws = s.len() - trimmed.len();
    if trimmed.is_empty() {
        let waits = close.is_some() || format == ToolFormat::Llama3;
        return (end || !waits).then_some(0);
    }
    match close {
        Some(c) if trimmed.starts_with(c) => Some(ws + c.len()),
        Some(c) if c.starts_with(trimmed) => end.then_some(0),
        Some(_) => Some(0),
        // Llama 3.2 separates calls with `;`.
        None if format == ToolFormat::Llama3 && trimmed.starts_with(';') => Some(ws + 1),
        None => Some(0),
    }
}

/// What a call's JSON turned out to hold.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Calls(Vec<ToolCall>),
    /// The generic format's `{"response": "…"}`: an answer, not a call.
    Text(String),
}

/// The calls in `value`, or `None` if it is not a call of this format.
pub fn build(format: ToolFormat, opener: Opener, head: Head, value: Value) -> Option<Outcome> {
    if let Some(name) = head.name {
        let Value::Object(arguments) = value else {
            return None;
        };
        return Some(Outcome::Calls(vec![ToolCall {
            id: head.id,
            name: name.trim().to_owned(),
            arguments,
        }]));
    }
    let calls = match (format, value) {
        (ToolFormat::Mistral, Value::Array(list)) if !list.is_empty() => list
            .iter()
            .map(|c| call(c, &["arguments"]))
            .collect::<Option<Vec<_>>>()?,
        (ToolFormat::Mistral, v @ Value::Object(_)) => vec![call(&v, &["arguments"])?],
        (ToolFormat::Hermes, v) => vec![call(&v, &["arguments", "parameters"])?],
        (ToolFormat::Llama3, v) => {
            if v.get("type").is_some_and(|t| t != "function") {
                return None;
            }
            vec![call(&v, &["parameters", "arguments"])?]
        }
        (ToolFormat::Generic, Value::Object(o)) if opener == Opener::Json => {
            if let Some(c) = o.get("tool_call") {
                vec![call(c, &["arguments"])?]
            } else if let Some(Value::Array(list)) = o.get("tool_calls") {
                list.iter()
                    .map(|c| call(c, &["arguments"]))
                    .collect::<Option<Vec<_>>>()?
            } else if let Some(r) = o.get("response") {
                return Some(Outcome::Text(match r {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                }));
            } else {
                vec![call(&Value::Object(o), &["arguments", "parameters"])?]
            }
        }
        _ => return None,
    };
    (!calls.is_empty()).then_some(Outcome::Calls(calls))
}

/// `{"name": …, "<args>": {…}, "id"?: …}`: the arguments are an object, a
/// string holding one (as some models write them), or absent (none).
fn call(v: &Value, args_keys: &[&str]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str().filter(|n| !n.trim().is_empty())?;
    let arguments = match args_keys.iter().find_map(|k| v.get(*k)) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(o)) => o,
            _ => return None,
        },
        Some(_) => return None,
    };
    let id = v
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    Some(ToolCall {
        id,
        name: name.to_owned(),
        arguments,
    })
}

/// Llama 3.x's code after `<|python_tag|>`: a call of its `python` tool,
/// as llama.cpp reads it.
pub fn code_call(code: &str) -> ToolCall {
    let mut arguments = Map::new();
    arguments.insert("code".into(), Value::String(code.trim().to_owned()));
    ToolCall {
        id: None,
        name: "python".into(),
        arguments,
    }
}
