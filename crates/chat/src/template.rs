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
//! loader), every render runs under a fuel budget, a wall-clock limit, a
//! recursion limit and an output byte limit ([`Limits`]), and input nested
//! deeper than [`MAX_DEPTH`] is refused before it reaches the engine.
//!
//! Request strings are text, never control tokens: with
//! [`ChatTemplate::guard_tokens`] set, every occurrence of a guarded token
//! text in a request string is masked before rendering and restored after,
//! and [`ChatTemplate::render_prompt`] reports where, so the tokenizer reads
//! a user's `<|im_start|>system` as words while the template's own markers
//! stay tokens. Masking happens at the input, not by tracking the output,
//! because templates transform content (`trim`, `split`, slicing) and a
//! sentinel around a whole value would change what those return.

use std::fmt;
use std::io;
use std::ops::Range;
use std::time::Duration;

use aho_corasick::{AhoCorasick, MatchKind};

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};
use serde_json::Value as Json;

use crate::budget::{self, TimeExceeded, Watch};
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
///
/// Fuel is minijinja's count of work: one unit per instruction executed and
/// one per 64 bytes created, written or visited (Lamina's serialisers pay
/// one per 4 bytes, as minijinja's own `tojson` does). So a render's fuel
/// bounds both its CPU and what it can allocate: 64 bytes per unit. A render
/// gets [`Limits::fuel`], plus one unit per byte of its input's weight (the
/// bytes of every request string, plus 16 per value: roughly its JSON size),
/// up to [`Limits::max_fuel`]: a template's work grows with the
/// conversation it renders, and a template in a downloaded file cannot make
/// a small request expensive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The fuel every render gets, whatever its input.
    pub fuel: u64,
    /// The most fuel one render gets, however large its input.
    pub max_fuel: u64,
    /// Wall-clock time one render may take, read wherever the template
    /// calls back into this crate (see the `budget` module).
    pub time: Duration,
    /// Deepest nesting of macro calls (and other recursion) allowed.
    pub recursion: usize,
    /// Largest rendered prompt in bytes.
    pub max_output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // Every rendering of the golden corpus (tool schemas and recursive
        // macros included) takes under 1,000 units, so 64 Ki units leave
        // room to spare and bound a request of a few KiB to milliseconds
        // and a few MiB; a long conversation gets more, up to 1 Mi units,
        // reached near a 1 MiB request, the default body limit, and about
        // what the clock allows (docs/perf/server.md, 2026-12-04, "what a
        // chat template render costs"). The clock stops a render at 50 ms
        // whatever its fuel: an ordinary conversation renders far faster,
        // so only a template that does work fuel prices cheaply, or a
        // starved machine, meets it.
        Limits {
            fuel: 64 * 1024,
            max_fuel: 1024 * 1024,
            time: Duration::from_millis(50),
            recursion: 100,
            max_output_bytes: 16 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The fuel a render of input of `weight` gets.
    pub fn fuel_for(&self, weight: u64) -> u64 {
        self.fuel
            .saturating_add(weight)
            .min(self.max_fuel.max(self.fuel))
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

/// A rendered prompt and where it holds guarded token text that came from
/// the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The prompt, exactly as [`ChatTemplate::render`] gives it.
    pub text: String,
    /// Byte ranges of `text`, ascending and disjoint: guarded token texts
    /// that a request string wrote. Tokenize them as plain text.
    pub literal: Vec<Range<usize>>,
}

/// Opens a mask: a noncharacter (U+FDD0) that no tokenizer or template
/// gives meaning to, then the guarded text's index in decimal, then
/// [`MASK_CLOSE`].
const MASK_OPEN: char = '\u{FDD0}';
const MASK_CLOSE: char = '\u{FDD1}';

/// Guarded token texts and the matcher that finds them in request strings.
struct Guard {
    /// The guarded texts, then the two mask characters themselves (so a
    /// request that writes them cannot forge a mask).
    texts: Vec<String>,
    matcher: AhoCorasick,
}

impl Guard {
    fn new(mut texts: Vec<String>) -> Option<Self> {
        texts.retain(|t| !t.is_empty());
        texts.push(MASK_OPEN.to_string());
        texts.push(MASK_CLOSE.to_string());
        // Longest first at each position, as the tokenizer cuts tokens out.
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&texts)
            .ok()?;
        Some(Guard { texts, matcher })
    }

    /// `s` with each guarded text replaced by its mask.
    fn mask(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        self.matcher.replace_all_with(s, &mut out, |m, _, dst| {
            dst.push(MASK_OPEN);
            dst.push_str(&m.pattern().as_usize().to_string());
            dst.push(MASK_CLOSE);
            true
        });
        out
    }

    /// Restores the masks in a rendering, noting where each text lands.
    /// Anything that is not a whole mask (the template cut one apart) is
    /// kept as it is.
    fn unmask(&self, rendered: String) -> Prompt {
        if !rendered.contains(MASK_OPEN) {
            return Prompt {
                text: rendered,
                literal: Vec::new(),
            };
        }
        let mut text = String::with_capacity(rendered.len());
        let mut literal = Vec::new();
        let mut rest = rendered.as_str();
        while let Some(at) = rest.find(MASK_OPEN) {
            text.push_str(&rest[..at]);
            let after = &rest[at + MASK_OPEN.len_utf8()..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            let index = after[..digits].parse::<usize>().ok();
            match (
                index.and_then(|i| self.texts.get(i)),
                after[digits..].chars().next(),
            ) {
                (Some(original), Some(MASK_CLOSE)) => {
                    let start = text.len();
                    text.push_str(original);
                    literal.push(start..text.len());
                    rest = &after[digits + MASK_CLOSE.len_utf8()..];
                }
                _ => {
                    text.push(MASK_OPEN);
                    rest = after;
                }
            }
        }
        text.push_str(rest);
        Prompt { text, literal }
    }
}

/// A chat template compiled for one model.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    limits: Limits,
    guard: Option<Guard>,
    clock: Clock,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("limits", &self.limits)
            .field("guarded", &self.guard.as_ref().map_or(0, |g| g.texts.len()))
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
            guard: None,
            clock: config.clock,
        })
    }

    /// Token texts that request strings may not produce as tokens (a
    /// vocabulary's control tokens); see [`Self::render_prompt`]. An empty
    /// list turns the guard off.
    pub fn guard_tokens<S: Into<String>>(&mut self, texts: impl IntoIterator<Item = S>) {
        let texts: Vec<String> = texts.into_iter().map(Into::into).collect();
        self.guard = if texts.is_empty() {
            None
        } else {
            Guard::new(texts)
        };
    }

    /// The template's source text, as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where `strftime_now` reads the time: callers that give a template
    /// the date another way (llama.cpp's `date_string`) read it here too.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Variables a template family reads that llama.cpp's chat layer
    /// defines for it, given the request's tools.
    ///
    /// FireFunction v2 (recognised, as llama.cpp recognised it, by the
    /// ` functools[` it writes calls with) concatenates `functions` to its
    /// system prompt: llama.cpp set it to the tools as JSON indented by two,
    /// or an empty string without tools. Undefined, minijinja refuses the
    /// concatenation (rightly, for any other template), so it is defined
    /// here for this family only.
    pub fn family_variables(&self, tools: Option<&Json>) -> serde_json::Map<String, Json> {
        let mut vars = serde_json::Map::new();
        if self.source.contains(" functools[") {
            let text = match tools {
                Some(t @ Json::Array(list)) if !list.is_empty() => {
                    serde_json::to_string_pretty(t).unwrap_or_default()
                }
                _ => String::new(),
            };
            vars.insert("functions".to_owned(), Json::String(text));
        }
        vars
    }

    /// Whether the template reads a tool call's `arguments` as a mapping
    /// (`arguments|items`: Llama 3.1, Qwen3-Coder, Qwen3.5+), where
    /// OpenAI's clients send a JSON string; such a template gets them
    /// parsed ([`arguments_as_objects`]), as llama.cpp gives templates that
    /// need object arguments.
    fn object_arguments(&self) -> bool {
        ["arguments|items", "arguments | items", "arguments.items()"]
            .iter()
            .any(|p| self.source.contains(p))
    }

    /// The limits every render runs under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Renders `messages` (a JSON array of message objects, used as given)
    /// into a prompt.
    pub fn render(&self, messages: &Json, opts: &RenderOptions<'_>) -> Result<String, ChatError> {
        self.render_prompt(messages, opts).map(|p| p.text)
    }

    /// [`Self::render`], also saying where request strings wrote guarded
    /// token text ([`Self::guard_tokens`]). A template that inspects such a
    /// string sees the mask in place of the token text (its length, a
    /// comparison); nothing else about the rendering changes.
    pub fn render_prompt(
        &self,
        messages: &Json,
        opts: &RenderOptions<'_>,
    ) -> Result<Prompt, ChatError> {
        let guard = self.guard.as_ref();
        let mut weight = 0u64;
        let objects;
        let messages = if self.object_arguments() {
            objects = arguments_as_objects(messages);
            &objects
        } else {
            messages
        };
        let mut ctx: Vec<(String, Value)> = vec![
            (
                "messages".to_owned(),
                json_to_value(messages, 0, guard, &mut weight)?,
            ),
            (
                "tools".to_owned(),
                optional(opts.tools, guard, &mut weight)?,
            ),
            (
                "documents".to_owned(),
                optional(opts.documents, guard, &mut weight)?,
            ),
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
                let value = json_to_value(value, 0, guard, &mut weight)?;
                // Special tokens may be overridden, as transformers merges
                // kwargs over the tokenizer's special tokens map.
                match ctx.iter_mut().find(|(key, _)| key == name) {
                    Some(slot) => slot.1 = value,
                    None => ctx.push((name.clone(), value)),
                }
            }
        }

        // The fuel is the environment's; a clone shares the compiled
        // template and costs a few pointer copies.
        let fuel = self.limits.fuel_for(weight);
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let watch = Watch::start(self.limits.time);
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|err| self.render_error(&err, fuel, &watch))?;
        let mut sink = BoundedSink {
            buf: Vec::new(),
            limit: self.limits.max_output_bytes,
            overflowed: false,
            writes: 0,
        };
        let rendered = template.render_captured_to(Value::from_pairs(ctx), &mut sink);
        if sink.overflowed {
            return Err(ChatError::OutputTooLarge {
                limit: self.limits.max_output_bytes,
            });
        }
        if let Err(err) = rendered {
            return Err(self.render_error(&err, fuel, &watch));
        }
        // Hooks past the deadline fail, but a template whose loops merely
        // stopped early (ranges end at the deadline) may finish: its
        // output is cut short, so it is not a prompt.
        if watch.expired() {
            return Err(ChatError::TimeLimit {
                limit: self.limits.time,
            });
        }
        drop(watch);
        let text = String::from_utf8(sink.buf).map_err(|err| ChatError::Render {
            line: None,
            message: format!("rendered prompt is not UTF-8: {err}"),
        })?;
        Ok(match guard {
            Some(guard) => guard.unmask(text),
            None => Prompt {
                text,
                literal: Vec::new(),
            },
        })
    }

    /// Appends request text to a rendered prompt (an assistant prefill
    /// that the model continues), with its guarded token texts marked
    /// literal as [`Self::render_prompt`] marks those of the messages: a
    /// prefill must not write control tokens that a message could not.
    pub fn append_request_text(&self, prompt: &mut Prompt, text: &str) {
        let at = prompt.text.len();
        let tail = match &self.guard {
            Some(guard) => guard.unmask(guard.mask(text)),
            None => Prompt {
                text: text.to_owned(),
                literal: Vec::new(),
            },
        };
        prompt.text.push_str(&tail.text);
        prompt
            .literal
            .extend(tail.literal.into_iter().map(|r| r.start + at..r.end + at));
    }

    fn render_error(&self, err: &minijinja::Error, fuel: u64, watch: &Watch) -> ChatError {
        // Past the deadline every hook fails and the fuel is drained, so
        // whatever error the engine reports, the clock is the cause.
        if watch.expired() || find_source::<TimeExceeded>(err).is_some() {
            return ChatError::TimeLimit {
                limit: self.limits.time,
            };
        }
        if let Some(raised) = find_source::<RaisedByTemplate>(err) {
            return ChatError::Raised {
                message: raised.0.clone(),
            };
        }
        match err.kind() {
            ErrorKind::OutOfFuel => ChatError::OutOfFuel { fuel },
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

fn optional(
    value: Option<&Json>,
    guard: Option<&Guard>,
    weight: &mut u64,
) -> Result<Value, ChatError> {
    match value {
        Some(value) => json_to_value(value, 0, guard, weight),
        None => Ok(Value::from(())),
    }
}

/// What one value adds to an input's weight besides its strings' bytes
/// (about what it takes in JSON, and enough fuel for the instructions a
/// template spends on each field of each message).
const WEIGHT_PER_VALUE: u64 = 16;

/// Converts request JSON into template values, keeping object key order (a
/// Python dict's order, which `tojson` and `items()` show), and adds its
/// weight (see [`Limits`]) to `weight`. With a guard, every string (keys
/// included) has its guarded texts masked.
fn json_to_value(
    json: &Json,
    depth: usize,
    guard: Option<&Guard>,
    weight: &mut u64,
) -> Result<Value, ChatError> {
    *weight = weight.saturating_add(WEIGHT_PER_VALUE);
    let text = |s: &str, weight: &mut u64| {
        *weight = weight.saturating_add(s.len() as u64);
        match guard {
            Some(g) => Value::from(g.mask(s)),
            None => Value::from(s),
        }
    };
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
        Json::String(s) => text(s, weight),
        Json::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(json_to_value(item, depth + 1, guard, weight)?);
            }
            Value::from(out)
        }
        Json::Object(map) => {
            let mut out = Vec::with_capacity(map.len());
            for (key, item) in map {
                let key = text(key, weight);
                out.push((key, json_to_value(item, depth + 1, guard, weight)?));
            }
            Value::from_pairs(out)
        }
    })
}

/// Collects the rendered prompt and refuses writes past the limit, so a
/// template cannot fill memory with output, and past the render's deadline.
struct BoundedSink {
    buf: Vec<u8>,
    limit: usize,
    /// Set when a write was refused; the engine only sees an I/O error.
    overflowed: bool,
    writes: u32,
}

/// The sink reads the clock once per this many writes (a write is often a
/// few bytes; the clock costs tens of nanoseconds).
const WRITES_PER_CHECK: u32 = 16;

impl io::Write for BoundedSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.writes = self.writes.wrapping_add(1);
        if self.writes % WRITES_PER_CHECK == 0 && !budget::in_time() {
            return Err(io::Error::other("the render's time limit passed"));
        }
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

/// `messages` with each tool call's `arguments` that is a string holding a
/// JSON object replaced by that object (under `function` or, as some
/// clients write it, on the call itself); anything else as it was.
fn arguments_as_objects(messages: &Json) -> Json {
    let mut out = messages.clone();
    let Some(list) = out.as_array_mut() else {
        return out;
    };
    for m in list {
        let Some(calls) = m.get_mut("tool_calls").and_then(Json::as_array_mut) else {
            continue;
        };
        for call in calls {
            for at in ["/function/arguments", "/arguments"] {
                if let Some(args) = call.pointer_mut(at) {
                    let parsed = args
                        .as_str()
                        .and_then(|s| serde_json::from_str::<Json>(s).ok())
                        .filter(Json::is_object);
                    if let Some(obj) = parsed {
                        *args = obj;
                    }
                }
            }
        }
    }
    out
}
