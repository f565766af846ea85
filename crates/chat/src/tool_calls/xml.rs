//! The XML tool calls of Qwen3-Coder and Qwen3.5 and later
//! ([`ToolFormat::QwenXml`](super::ToolFormat::QwenXml)):
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! A value is not JSON: it is the text between the newline after
//! `<parameter=KEY>` and the newline before `</parameter>`, quotes, `<` and
//! newlines included, with nothing escaped. So the tool's schema says how
//! to read it, as llama.cpp reads it (`common_chat_params_init_qwen3_coder`
//! in `common/chat.cpp`): a parameter whose schema resolves to a string
//! keeps the raw text, any other is parsed as JSON and kept as the text
//! when it does not parse ([`Schemas`]).
//!
//! A value ends at the first `</parameter>` that the format's layout
//! follows (whitespace, then `<parameter=` or `</function>`). Any other
//! `</parameter>`, like any `</parameter` or `</function>` look-alike, is
//! part of the value, so a value may quote the format itself. The scan
//! ([`Scan`]) resumes where it stopped: a whole file written as a value is
//! looked at once, not once per token.

use serde_json::{Map, Value};

use super::formats::{is_name, is_name_prefix, MAX_NAME};

const TOOL_CALL_END: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// A call as written: the name and each value's raw text, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawCall {
    pub name: String,
    pub args: Vec<(String, String)>,
}

/// Where the scan is in the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before `<function=` (right after `<tool_call>`).
    Function,
    /// The function's name, up to `>`.
    Name,
    /// Between parameters: `<parameter=` or `</function>` next.
    Body,
    /// A parameter's name, up to `>`.
    Key,
    /// A value from `start`; no closing tag before `search`.
    Value { start: usize, search: usize },
    /// After `</function>`: `</tool_call>`, or another function inside
    /// the same `<tool_call>`.
    After,
}

/// What the scan knows so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The call has not ended yet.
    Open,
    /// The calls, and how many bytes of the text they took.
    Done(Vec<RawCall>, usize),
    /// Not a call of this format.
    Invalid,
}

/// A resumable scan of one call (or of the several functions one
/// `<tool_call>` holds), from its opener.
#[derive(Debug, Clone)]
pub struct Scan {
    /// Bytes read so far.
    pos: usize,
    phase: Phase,
    /// `<tool_call>` opened it (not a bare `<function=`): `</tool_call>`
    /// closes it and more functions may come before that.
    scoped: bool,
    calls: Vec<RawCall>,
}

/// What the text starts with, among some marks.
enum Lead {
    Is(&'static str),
    /// Empty, or cut off inside one of them: more text will tell.
    Prefix,
    No,
}

fn lead(s: &str, marks: &[&'static str]) -> Lead {
    if let Some(m) = marks.iter().find(|m| s.starts_with(**m)) {
        return Lead::Is(m);
    }
    if marks.iter().any(|m| m.starts_with(s)) {
        Lead::Prefix
    } else {
        Lead::No
    }
}

impl Scan {
    /// A scan of a call opened by `marker` (`<tool_call>` or `<function=`).
    pub fn new(marker: &str) -> Scan {
        let scoped = marker != FUNCTION;
        Scan {
            pos: marker.len(),
            phase: if scoped { Phase::Function } else { Phase::Name },
            scoped,
            calls: Vec::new(),
        }
    }

    /// Scans `s` (the call's text from its opener, as long as it has
    /// arrived) from where the last call stopped; `end` when no more text
    /// will come.
    pub fn advance(&mut self, s: &str, end: bool) -> Step {
        let open = if end { Step::Invalid } else { Step::Open };
        loop {
            let rest = &s[self.pos..];
            match self.phase {
                Phase::Function | Phase::Body | Phase::After => {
                    let t = rest.trim_start();
                    let at = self.pos + rest.len() - t.len();
                    let marks: &[&'static str] = match self.phase {
                        Phase::Function => &[FUNCTION],
                        Phase::Body => &[PARAMETER, FUNCTION_END],
                        _ if self.scoped => &[TOOL_CALL_END, FUNCTION],
                        _ => &[TOOL_CALL_END],
                    };
                    match (lead(t, marks), self.phase) {
                        (Lead::Is(TOOL_CALL_END), _) => {
                            let n = at + TOOL_CALL_END.len();
                            return Step::Done(std::mem::take(&mut self.calls), n);
                        }
                        (Lead::Is(m), _) => {
                            self.pos = at + m.len();
                            self.phase = match m {
                                FUNCTION => Phase::Name,
                                PARAMETER => Phase::Key,
                                _ => Phase::After,
                            };
                        }
                        // The call is whole; what follows is not its
                        // closer (or never came): it is the text after it,
                        // as llama.cpp forgives a missing `</tool_call>`.
                        (Lead::No, Phase::After) => {
                            return Step::Done(std::mem::take(&mut self.calls), self.pos)
                        }
                        // Cut off inside `</tool_call>`: that much of it
                        // is the call's.
                        (Lead::Prefix, Phase::After) if end => {
                            let closer = !t.is_empty() && TOOL_CALL_END.starts_with(t);
                            let n = if closer { at + t.len() } else { self.pos };
                            return Step::Done(std::mem::take(&mut self.calls), n);
                        }
                        (Lead::Prefix, _) => return open,
                        (Lead::No, _) => return Step::Invalid,
                    }
                }
                Phase::Name | Phase::Key => {
                    let name = self.phase == Phase::Name;
                    let ok = |n: &str| if name { is_name(n) } else { is_key(n) };
                    match rest.find('>') {
                        Some(i) => {
                            let n = rest[..i].trim();
                            if !ok(n) {
                                return Step::Invalid;
                            }
                            if name {
                                self.calls.push(RawCall {
                                    name: n.to_owned(),
                                    args: Vec::new(),
                                });
                                self.phase = Phase::Body;
                            } else if let Some(c) = self.calls.last_mut() {
                                c.args.push((n.to_owned(), String::new()));
                                let start = self.pos + i + 1;
                                self.phase = Phase::Value {
                                    start,
                                    search: start,
                                };
                            } else {
                                return Step::Invalid;
                            }
                            self.pos += i + 1;
                        }
                        None => {
                            let t = rest.trim();
                            let could = if name {
                                is_name_prefix(t)
                            } else {
                                is_key_prefix(t)
                            };
                            return if rest.len() > MAX_NAME || !could {
                                Step::Invalid
                            } else {
                                open
                            };
                        }
                    }
                }
                Phase::Value { start, search } => {
                    let Some(i) = find(&s.as_bytes()[search..], PARAMETER_END.as_bytes()) else {
                        // Keep the tail that may be a cut-off closing tag.
                        let keep = PARAMETER_END.len() - 1;
                        self.phase = Phase::Value {
                            start,
                            search: s.len().saturating_sub(keep).max(search),
                        };
                        return open;
                    };
                    let q = search + i;
                    let after = &s[q + PARAMETER_END.len()..];
                    match lead(after.trim_start(), &[PARAMETER, FUNCTION_END]) {
                        Lead::Is(_) => {
                            if let Some((_, v)) =
                                self.calls.last_mut().and_then(|c| c.args.last_mut())
                            {
                                *v = strip_layout(&s[start..q]).to_owned();
                            }
                            self.pos = q + PARAMETER_END.len();
                            self.phase = Phase::Body;
                        }
                        Lead::Prefix => {
                            self.phase = Phase::Value { start, search: q };
                            return open;
                        }
                        // A `</parameter>` inside the value.
                        Lead::No => {
                            self.phase = Phase::Value {
                                start,
                                search: q + 1,
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The value without the newline after `<parameter=KEY>` and the one
/// before `</parameter>` (the format's layout); all else is the value's.
fn strip_layout(raw: &str) -> &str {
    let v = raw.strip_prefix('\n').unwrap_or(raw);
    v.strip_suffix('\n').unwrap_or(v)
}

/// Whether a call to function `name` written in this format reads back
/// under that name (for whoever writes calls: the grammar that forces one).
pub fn name_reads_back(name: &str) -> bool {
    is_name(name)
}

/// Whether a parameter named `key` written in this format reads back under
/// that key: one the scan accepts, with no space around it to trim.
pub fn key_reads_back(key: &str) -> bool {
    is_key(key) && key.trim() == key
}

/// Whether a value of a parameter with this schema is read as raw text
/// (else as JSON), as `Schemas::value` reads it.
pub fn value_is_text(schema: &Value) -> bool {
    is_string(schema)
}

/// A parameter's name: a JSON object key, on one line, with no tag in it.
fn is_key(s: &str) -> bool {
    !s.is_empty() && is_key_prefix(s)
}

fn is_key_prefix(s: &str) -> bool {
    s.len() <= MAX_NAME && !s.contains(['<', '>', '\n'])
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The request's tools, by name: their parameters' schemas, which say
/// how each value is read.
#[derive(Debug, Clone, Default)]
pub struct Schemas {
    /// Each function's name and `parameters.properties`.
    tools: Vec<(String, Map<String, Value>)>,
}

impl Schemas {
    /// From a request's `tools`: OpenAI's `{"type": "function",
    /// "function": {"name", "parameters"}}` (what every route passes on),
    /// or the bare `{"name", "parameters"}`.
    pub fn new(tools: &Value) -> Schemas {
        let list = tools.as_array().map(Vec::as_slice).unwrap_or_default();
        let tools = list
            .iter()
            .filter_map(|t| {
                let f = t.get("function").unwrap_or(t);
                let name = f.get("name")?.as_str()?;
                let props = f
                    .pointer("/parameters/properties")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                Some((name.to_owned(), props))
            })
            .collect();
        Schemas { tools }
    }

    /// The value of parameter `key` of `function` written as `raw`: the
    /// raw text where the schema resolves to a string (or says nothing:
    /// an unknown tool or parameter), else its JSON, or the raw text when
    /// that does not parse.
    pub fn value(&self, function: &str, key: &str, raw: &str) -> Value {
        let schema = self
            .tools
            .iter()
            .find(|(n, _)| n == function)
            .and_then(|(_, props)| props.get(key));
        if schema.is_none_or(is_string) {
            return Value::String(raw.to_owned());
        }
        serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_owned()))
    }

    /// The call with its values read.
    pub fn call(&self, raw: RawCall) -> super::ToolCall {
        let mut arguments = Map::new();
        for (k, v) in raw.args {
            let value = self.value(&raw.name, &k, &v);
            arguments.insert(k, value);
        }
        super::ToolCall {
            id: None,
            name: raw.name,
            arguments,
        }
    }
}

/// Whether a schema takes the raw text: its `type` is (or includes)
/// `"string"`, its `const`/`enum` are strings, one of its `anyOf`/`oneOf`
/// is; or it says nothing of its type at all.
fn is_string(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => return t == "string",
        Some(Value::Array(ts)) => return ts.iter().any(|t| t == "string"),
        _ => {}
    }
    if let Some(c) = schema.get("const") {
        return c.is_string();
    }
    if let Some(Value::Array(e)) = schema.get("enum") {
        return e.iter().all(Value::is_string);
    }
    for k in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = schema.get(k) {
            return alts.iter().any(is_string);
        }
    }
    !(schema.get("properties").is_some() || schema.get("items").is_some())
}
