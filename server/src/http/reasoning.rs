//! Reasoning on every chat route, as llama-server does it.
//!
//! Before rendering, [`Thinking::decide`] settles what the template is
//! told: `enable_thinking` is true when the template is thinking-capable
//! (`lamina_chat::ThinkTags::detect`) and `--reasoning` is `auto` (the
//! default), true or false when `--reasoning on|off` says so, and a
//! request's `chat_template_kwargs.enable_thinking` (or the route's own
//! switch: Anthropic's `thinking`, Ollama's `think`, `reasoning_effort:
//! "none"`) overrides the server. `--reasoning-format` and a request's
//! `reasoning_format` say how the answer comes back.
//!
//! After rendering, [`Reader`] reads the answer: the reasoning split off
//! first (when the template is thinking-capable and the format extracts
//! it), then the rest read for tool calls (`tools.rs`), so a call after a
//! think block is found as it would be without one. Each route writes the
//! [`Piece`]s in its own shape: OpenAI's `reasoning_content`, Anthropic's
//! `thinking` blocks, Ollama's `thinking`, the Responses API's `reasoning`
//! items.

use lamina_chat::{Part, Piece, ReasoningFormat, ReasoningSplitter, ThinkTags};
use lamina_engine::ModelInfo;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::tools::{hidden_markers, Calls};
use super::AppState;

/// `--reasoning`: whether thinking-capable templates are asked to think.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningMode {
    On,
    Off,
    /// As the template can (llama-server's default).
    #[default]
    Auto,
}

impl ReasoningMode {
    pub fn from_name(name: &str) -> Option<ReasoningMode> {
        match name {
            "on" => Some(ReasoningMode::On),
            "off" => Some(ReasoningMode::Off),
            "auto" => Some(ReasoningMode::Auto),
            _ => None,
        }
    }
}

/// What one chat request decided about reasoning before its prompt is
/// rendered.
#[derive(Debug, Clone, Copy)]
pub struct Thinking {
    /// The tags the template's model writes, when it is thinking-capable.
    pub tags: Option<ThinkTags>,
    /// `enable_thinking` as the template sees it.
    pub enable: bool,
    pub format: ReasoningFormat,
}

impl Thinking {
    /// The request's reasoning: `kwargs` is its `chat_template_kwargs`,
    /// `asked` the route's own switch, `format` its `reasoning_format`.
    pub fn decide(
        st: &AppState,
        info: &ModelInfo,
        kwargs: Option<&Map<String, Value>>,
        asked: Option<bool>,
        format: Option<&Value>,
    ) -> Result<Thinking, ApiError> {
        let tags = ThinkTags::detect(info.template.source());
        let explicit = match kwargs.and_then(|k| k.get("enable_thinking")) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => {
                return Err(ApiError::invalid(
                    "chat_template_kwargs.enable_thinking",
                    "chat_template_kwargs.enable_thinking must be a boolean",
                ))
            }
        };
        let enable = explicit.or(asked).unwrap_or(match st.options.reasoning {
            ReasoningMode::On => true,
            ReasoningMode::Off => false,
            ReasoningMode::Auto => tags.is_some(),
        });
        let format = match format {
            None | Some(Value::Null) => st.options.reasoning_format,
            Some(Value::String(name)) => ReasoningFormat::from_name(name).ok_or_else(|| {
                ApiError::invalid(
                    "reasoning_format",
                    format!(
                        "reasoning_format must be one of {} (got {name:?})",
                        ReasoningFormat::NAMES
                    ),
                )
            })?,
            Some(_) => {
                return Err(ApiError::invalid(
                    "reasoning_format",
                    "reasoning_format must be a string",
                ))
            }
        };
        Ok(Thinking {
            tags,
            enable,
            format,
        })
    }

    /// The tags of the think block the rendered `prompt` leaves open, if
    /// it does: the answer starts inside it.
    pub fn left_open(&self, prompt: &str) -> Option<ThinkTags> {
        self.tags.filter(|t| t.opens_in(prompt))
    }

    /// The template's keyword arguments: the request's, with
    /// `enable_thinking` set unless it set it.
    pub fn kwargs(&self, kwargs: Option<Map<String, Value>>) -> Map<String, Value> {
        let mut kwargs = kwargs.unwrap_or_default();
        kwargs
            .entry("enable_thinking")
            .or_insert(Value::Bool(self.enable));
        kwargs
    }
}

/// `reasoning_effort` (OpenAI's field, the Responses API's
/// `reasoning.effort`): `"none"` turns thinking off, as in llama-server;
/// any other level is left to the template, which may read it.
pub fn effort_switch(effort: Option<&Value>) -> Result<Option<bool>, ApiError> {
    match effort {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) if e == "none" => Ok(Some(false)),
        Some(Value::String(_)) => Ok(None),
        Some(_) => Err(ApiError::invalid(
            "reasoning_effort",
            "reasoning_effort must be a string",
        )),
    }
}

/// The reader of one answer: reasoning first, then tool calls.
#[derive(Debug)]
pub struct Reader {
    split: Option<ReasoningSplitter>,
    /// `deepseek-legacy`: the answer goes on as content, tags and all, and
    /// the reasoning is kept here for the whole message.
    legacy: Option<String>,
    /// Think tags that are one control token each (detokenizing hides them).
    markers: Vec<(u32, &'static str)>,
    calls: Option<Calls>,
}

impl Reader {
    /// The reader of an answer to `prompt` (the rendered text), or `None`
    /// when there is nothing to read out of it.
    pub fn new(
        info: &ModelInfo,
        thinking: &Thinking,
        prompt: &str,
        calls: Option<Calls>,
    ) -> Option<Reader> {
        let tags = thinking.tags.filter(|_| thinking.format.extracts());
        if tags.is_none() && calls.is_none() {
            return None;
        }
        Some(Reader {
            split: tags.map(|t| ReasoningSplitter::new(t, t.opens_in(prompt))),
            legacy: (thinking.format == ReasoningFormat::DeepseekLegacy).then(String::new),
            markers: tags.map_or_else(Vec::new, |t| {
                hidden_markers(&info.tokenizer, &[t.open, t.close])
            }),
            calls,
        })
    }

    /// A reader that reads nothing out: the answer comes back as text
    /// pieces (for routes that always build their output from pieces).
    pub fn plain() -> Reader {
        Reader {
            split: None,
            legacy: None,
            markers: Vec::new(),
            calls: None,
        }
    }

    /// A generated token: a hidden tag or marker reaches the parsers as its
    /// text (its own text event never comes).
    pub fn token(&mut self, id: u32) -> Vec<Piece> {
        if let Some(&(_, tag)) = self.markers.iter().find(|(t, _)| *t == id) {
            return self.text(tag);
        }
        match &mut self.calls {
            Some(c) => c.token(id),
            None => Vec::new(),
        }
    }

    pub fn text(&mut self, text: &str) -> Vec<Piece> {
        match self.split.as_mut().map(|s| s.push(text)) {
            Some(parts) => self.parts(parts, text),
            None => self.content(text),
        }
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = match self.split.as_mut().map(ReasoningSplitter::finish) {
            Some(parts) => self.parts(parts, ""),
            None => Vec::new(),
        };
        if let Some(c) = &mut self.calls {
            out.extend(c.finish());
        }
        out
    }

    /// The reasoning of a `deepseek-legacy` answer, which its pieces carry
    /// inline; `None` for other formats.
    pub fn legacy_reasoning(&self) -> Option<&str> {
        self.legacy.as_deref().filter(|r| !r.is_empty())
    }

    /// The splitter's parts as pieces; `raw` is the text they came from,
    /// which a legacy answer keeps as its content.
    fn parts(&mut self, parts: Vec<Part>, raw: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        match &mut self.legacy {
            Some(kept) => {
                for p in parts {
                    if let Part::Reasoning(r) = p {
                        kept.push_str(&r);
                    }
                }
                out.extend(self.content(raw));
            }
            None => {
                for p in parts {
                    match p {
                        Part::Reasoning(r) => out.push(Piece::Reasoning(r)),
                        Part::Content(c) => out.extend(self.content(&c)),
                    }
                }
            }
        }
        out
    }

    fn content(&mut self, text: &str) -> Vec<Piece> {
        if text.is_empty() {
            return Vec::new();
        }
        match &mut self.calls {
            Some(c) => c.text(text),
            None => vec![Piece::Text(text.to_owned())],
        }
    }
}

/// The reasoning of a whole answer's pieces, joined; `None` when there was
/// none.
pub fn reasoning_of(pieces: &[Piece]) -> Option<String> {
    let mut out: Option<String> = None;
    for p in pieces {
        if let Piece::Reasoning(r) = p {
            out.get_or_insert_with(String::new).push_str(r);
        }
    }
    out
}
