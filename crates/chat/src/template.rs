//! A compiled chat template and its rendering.
//!
//! [`ChatTemplate::new`] builds the minijinja environment once per model (the
//! template is parsed and compiled there; a syntax error fails the load), and
//! [`ChatTemplate::render`] turns a conversation into a prompt for each
//! request. The variables handed to the template are exactly those Hugging
//! Face's `render_jinja_template` hands to Jinja2: `messages`, `tools`,
//! `documents`, `add_generation_prompt`, `bos_token`, `eos_token`, and each
//! `chat_template_kwargs` entry as a variable of its own.
//!
//! Invariants: the template never reads files (the environment has no
//! loader), every render runs under a fuel budget, a recursion limit and an
//! output byte limit, and input nested deeper than [`MAX_DEPTH`] is refused
//! before it reaches the engine.

use std::fmt;
use std::io;

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};
use serde_json::Value as Json;

use crate::environment::{build_environment, Clock};
use crate::error::{find_source, ChatError, RaisedByTemplate};
use crate::python::MAX_DEPTH;

/// The name the template is registered under; it has no extension, so
/// minijinja never turns on HTML auto-escaping for it.
const TEMPLATE_NAME: &str = "chat_template";

/// Variables that a template's fixed inputs own; a keyword argument may not
/// replace them (Python would reject the duplicate keyword too).
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// Bounds on one render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// minijinja fuel: roughly one unit per instruction executed and one per
    /// 64 bytes allocated or written.
    pub fuel: u64,
    /// Deepest nesting of macro calls (and other recursion) allowed.
    pub recursion: usize,
    /// Largest rendered prompt in bytes.
    pub max_output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // One unit of fuel is about one instruction or 64 bytes allocated.
        // Every rendering of the golden corpus (tool schemas through
        // recursive macros included) takes under 1,000; 5 million leaves
        // room for conversations thousands of times longer, yet stops a
        // runaway loop within a second and caps what a template can
        // allocate at a few hundred MiB.
        Limits {
            fuel: 5_000_000,
            recursion: 100,
            max_output_bytes: 16 * 1024 * 1024,
        }
    }
}

/// How a [`ChatTemplate`] is built beyond its source and special tokens.
#[derive(Debug, Clone, Default)]
pub struct TemplateConfig {
    /// Bounds applied to every render.
    pub limits: Limits,
    /// What `strftime_now` reads.
    pub clock: Clock,
}

/// What a request adds to the conversation.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// The request's tool definitions; `None` renders `tools` as none.
    pub tools: Option<&'a Json>,
    /// Documents for retrieval-augmented templates; `None` renders as none.
    pub documents: Option<&'a Json>,
    /// Whether to end with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs`: each entry becomes a variable (for example
    /// `enable_thinking`).
    pub kwargs: Option<&'a serde_json::Map<String, Json>>,
}

/// A chat template compiled for one model.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    limits: Limits,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("limits", &self.limits)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` with default limits and the system clock.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatError> {
        Self::with_config(source, bos_token, eos_token, TemplateConfig::default())
    }

    /// Compiles `source` with the given limits and clock.
    pub fn with_config(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        config: TemplateConfig,
    ) -> Result<Self, ChatError> {
        let mut env = build_environment(&config);
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(|err| ChatError::Syntax {
                line: err.line(),
                message: describe(&err),
            })?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            limits: config.limits,
        })
    }

    /// The template's source text, as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The limits every render runs under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Renders `messages` (a JSON array of message objects, used as given)
    /// into a prompt.
    pub fn render(&self, messages: &Json, opts: &RenderOptions<'_>) -> Result<String, ChatError> {
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".to_owned(), json_to_value(messages, 0)?),
            ("tools".to_owned(), optional(opts.tools)?),
            ("documents".to_owned(), optional(opts.documents)?),
            (
                "add_generation_prompt".to_owned(),
                Value::from(opts.add_generation_prompt),
            ),
            ("bos_token".to_owned(), Value::from(self.bos_token.as_str())),
            ("eos_token".to_owned(), Value::from(self.eos_token.as_str())),
        ];
        if let Some(kwargs) = opts.kwargs {
            for (name, value) in kwargs {
                if RESERVED.contains(&name.as_str()) {
                    return Err(ChatError::InvalidInput(format!(
                        "chat_template_kwargs may not set `{name}`"
                    )));
                }
                let value = json_to_value(value, 0)?;
                // Special tokens may be overridden, as transformers merges
                // kwargs over the tokenizer's special tokens map.
                match ctx.iter_mut().find(|(key, _)| key == name) {
                    Some(slot) => slot.1 = value,
                    None => ctx.push((name.clone(), value)),
                }
            }
        }

        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|err| self.render_error(&err))?;
        let mut sink = BoundedSink {
            buf: Vec::new(),
            limit: self.limits.max_output_bytes,
            overflowed: false,
        };
        let rendered = template.render_captured_to(Value::from_pairs(ctx), &mut sink);
        if sink.overflowed {
            return Err(ChatError::OutputTooLarge {
                limit: self.limits.max_output_bytes,
            });
        }
        rendered.map_err(|err| self.render_error(&err))?;
        String::from_utf8(sink.buf).map_err(|err| ChatError::Render {
            line: None,
            message: format!("rendered prompt is not UTF-8: {err}"),
        })
    }

    fn render_error(&self, err: &minijinja::Error) -> ChatError {
        if let Some(raised) = find_source::<RaisedByTemplate>(err) {
            return ChatError::Raised {
                message: raised.0.clone(),
            };
        }
        match err.kind() {
            ErrorKind::OutOfFuel => ChatError::OutOfFuel {
                fuel: self.limits.fuel,
            },
            _ => ChatError::Render {
                line: err.line(),
                message: describe(err),
            },
        }
    }
}

/// transformers' `AssistantTracker` extension adds `{% generation %}` …
/// `{% endgeneration %}`, which marks assistant text for training masks and
/// renders its body unchanged. minijinja has no such tag, so each becomes
/// `if true` / `endif`, keeping its whitespace-control markers and its
/// line breaks (error lines stay right).
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start + 2..];
        match parse_generation_tag(tag) {
            Some((open_ctrl, lead, keyword, trail, close_ctrl, len)) => {
                let replacement = if keyword == "generation" {
                    "if true"
                } else {
                    "endif"
                };
                out.push_str("{%");
                out.push_str(open_ctrl);
                out.push_str(lead);
                out.push_str(replacement);
                out.push_str(trail);
                out.push_str(close_ctrl);
                out.push_str("%}");
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = tag;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Parses `[-+]? ws (generation|endgeneration) ws [-+]? %}` at the start of
/// `tag` (the text after `{%`); returns its parts and its length.
fn parse_generation_tag(tag: &str) -> Option<(&str, &str, &str, &str, &str, usize)> {
    let ctrl_len = |s: &str| usize::from(s.starts_with('-') || s.starts_with('+'));
    let ws_len = |s: &str| s.len() - s.trim_start().len();
    let open_ctrl = &tag[..ctrl_len(tag)];
    let mut pos = open_ctrl.len();
    let lead = &tag[pos..pos + ws_len(&tag[pos..])];
    pos += lead.len();
    let keyword = ["endgeneration", "generation"]
        .into_iter()
        .find(|k| tag[pos..].starts_with(k))?;
    pos += keyword.len();
    let trail = &tag[pos..pos + ws_len(&tag[pos..])];
    if trail.is_empty() && !tag[pos..].starts_with(['-', '+', '%']) {
        return None; // a longer name, such as `generation_prompt`
    }
    pos += trail.len();
    let close_ctrl = &tag[pos..pos + ctrl_len(&tag[pos..])];
    pos += close_ctrl.len();
    tag[pos..]
        .starts_with("%}")
        .then_some((open_ctrl, lead, keyword, trail, close_ctrl, pos + 2))
}

/// The kind and detail of a minijinja error, without the template name.
fn describe(err: &minijinja::Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

fn optional(value: Option<&Json>) -> Result<Value, ChatError> {
    match value {
        Some(value) => json_to_value(value, 0),
        None => Ok(Value::from(())),
    }
}

/// Converts request JSON into template values, keeping object key order (a
/// Python dict's order, which `tojson` and `items()` show).
pub(crate) fn json_to_value(json: &Json, depth: usize) -> Result<Value, ChatError> {
    if depth > MAX_DEPTH {
        return Err(ChatError::InvalidInput(format!(
            "input nested deeper than {MAX_DEPTH} levels"
        )));
    }
    Ok(match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(json_to_value(item, depth + 1)?);
            }
            Value::from(out)
        }
        Json::Object(map) => {
            let mut out = Vec::with_capacity(map.len());
            for (key, item) in map {
                out.push((Value::from(key.as_str()), json_to_value(item, depth + 1)?));
            }
            Value::from_pairs(out)
        }
    })
}

/// Collects the rendered prompt and refuses writes past the limit, so a
/// template cannot fill memory with output.
struct BoundedSink {
    buf: Vec<u8>,
    limit: usize,
    /// Set when a write was refused; the engine only sees an I/O error.
    overflowed: bool,
}

impl io::Write for BoundedSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("rendered prompt exceeds the output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
