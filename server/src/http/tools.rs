//! Tool calls in answers, for every chat route.
//!
//! A request that sends `tools` (and does not set `tool_choice` to none)
//! gets its answer read by `lamina_chat`'s [`ToolCallParser`], in the
//! format the model's template tells ([`ToolFormat::detect`]). [`Calls`]
//! feeds it the engine's events in order: the text, and the text of a
//! format's markers when the vocabulary holds them as control tokens
//! (Llama 3.x's `<|python_tag|>`, Mistral's `[TOOL_CALLS]`), which
//! detokenizing hides. Each route then writes the pieces in its own shape.
//!
//! `tool_choice` "required" (Anthropic's "any") or a named function forces
//! a call: [`forced`] gives the grammar of a call in the template's format
//! to the allowed tools (`lamina_grammar::call_grammar`), so the answer is
//! always one the parser reads back. "none" offers no tools at all: they
//! are left out of the prompt and the answer is not read for calls.

use lamina_chat::{Piece, ThinkTags, ToolCall, ToolCallParser, ToolFormat};
use lamina_engine::{FinishReason, ModelInfo};
use lamina_grammar::{call_grammar, Spec, ToolSpec};
use lamina_tokenizer::Tokenizer;
use serde_json::{json, Value};

use super::error::ApiError;
use super::structured::Wanted;

/// The parser of one answer and the marker tokens to feed it.
#[derive(Debug)]
pub struct Calls {
    parser: ToolCallParser,
    /// Control tokens that stand for a marker, with the marker's text.
    markers: Vec<(u32, &'static str)>,
}

impl Calls {
    /// A parser for an answer to a request with `tools`, when `parse`
    /// (its tool choice allows calls); `None` when there is nothing to
    /// parse, so the answer is sent as it comes.
    pub fn new(info: &ModelInfo, tools: Option<&Value>, parse: bool) -> Option<Calls> {
        let any = tools
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty());
        if !(any && parse) {
            return None;
        }
        let format = ToolFormat::detect(info.template.source());
        Some(Calls {
            parser: ToolCallParser::new(format).with_tools(tools?),
            markers: hidden_markers(&info.tokenizer, format.markers()),
        })
    }

    /// A generated token: a hidden marker's text goes to the parser. (Its
    /// own text event never comes: a control token has none.)
    pub fn token(&mut self, id: u32) -> Vec<Piece> {
        match self.markers.iter().find(|(t, _)| *t == id) {
            Some((_, m)) => self.parser.push(m),
            None => Vec::new(),
        }
    }

    pub fn text(&mut self, text: &str) -> Vec<Piece> {
        self.parser.push(text)
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        self.parser.finish()
    }
}

/// The markers that are one control token each in this vocabulary: text
/// that decoding hides, with the token that stands for it.
pub(super) fn hidden_markers(
    tok: &Tokenizer,
    markers: &[&'static str],
) -> Vec<(u32, &'static str)> {
    markers
        .iter()
        .filter_map(|&m| match tok.encode(m, false, true).as_slice() {
            [id] if tok.token_to_piece(*id).is_empty() => Some((*id, m)),
            _ => None,
        })
        .collect()
}

/// What a request's `tool_choice` asks of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// No tools: left out of the prompt, the answer not read for calls.
    None,
    /// Call or answer, as the model likes (the default).
    Auto,
    /// Call one of the tools (or several, with parallel calls).
    Required,
    /// Call this one.
    Named(String),
}

impl Choice {
    /// Whether tools are offered and the answer read for calls.
    pub fn offers_tools(&self) -> bool {
        *self != Choice::None
    }
}

/// OpenAI's `tool_choice`: `"none"`, `"auto"`, `"required"` or
/// `{"type": "function", "function": {"name": ...}}`.
pub fn openai_choice(v: Option<&Value>) -> Result<Choice, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Choice::Auto),
        Some(Value::String(s)) if s == "none" => Ok(Choice::None),
        Some(Value::String(s)) if s == "auto" => Ok(Choice::Auto),
        Some(Value::String(s)) if s == "required" => Ok(Choice::Required),
        Some(Value::Object(o))
            if o.get("type").and_then(Value::as_str) == Some("function")
                && o.get("function")
                    .and_then(|f| f.get("name"))
                    .is_some_and(Value::is_string) =>
        {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            Ok(Choice::Named(name.to_owned()))
        }
        Some(_) => Err(ApiError::invalid(
            "tool_choice",
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )),
    }
}

/// The constraint that forces a call when `choice` requires one: the
/// grammar of a call (or, with `parallel`, of one or more) to the allowed
/// tools in the format the template tells, written as `Calls` reads it.
/// `open_think`: the prompt left this think block open, so the answer
/// closes it before the call (else the reasoning reader would take the
/// call for reasoning).
pub fn forced(
    info: &ModelInfo,
    tools: Option<&Value>,
    choice: &Choice,
    parallel: bool,
    open_think: Option<ThinkTags>,
) -> Result<Option<Wanted>, ApiError> {
    const P: &str = "tool_choice";
    let only = match choice {
        Choice::None | Choice::Auto => return Ok(None),
        Choice::Required => None,
        Choice::Named(n) => Some(n.as_str()),
    };
    let list = tools
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                P,
                "tool_choice requires a call, but the request has no tools",
            )
        })?;
    let mut specs = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let name = t
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("tools[{i}].function.name"),
                    format!("tools[{i}].function.name must be a string"),
                )
            })?;
        if only.is_some_and(|n| n != name) {
            continue;
        }
        let parameters = match t.pointer("/function/parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p) => p.clone(),
        };
        specs.push(ToolSpec {
            name: name.to_owned(),
            parameters,
        });
    }
    if let (Some(n), true) = (only, specs.is_empty()) {
        return Err(ApiError::invalid(
            P,
            format!("tool_choice names the function {n:?}, which is not among the tools"),
        ));
    }
    let format = ToolFormat::detect(info.template.source());
    let close = open_think.map(|t| t.close);
    let mut markers = hidden_markers(&info.tokenizer, format.markers());
    markers.extend(hidden_markers(&info.tokenizer, close.as_slice()));
    let control = |m: &str| markers.iter().find(|(_, t)| *t == m).map(|(id, _)| *id);
    let lark = call_grammar(format, &specs, parallel, close, control)
        .map_err(|e| ApiError::invalid(P, e.to_string()))?;
    Ok(Some(Wanted {
        spec: Spec::Lark(lark),
        param: P,
    }))
}

/// An id for a call the model wrote none for.
pub fn call_id(call: &ToolCall) -> String {
    call.id
        .clone()
        .unwrap_or_else(|| format!("call_{}", super::random_id()))
}

/// A call as OpenAI writes it in `message.tool_calls`.
pub fn openai_call(call: &ToolCall, id: String) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json()},
    })
}

/// OpenAI's `finish_reason` for an answer that called tools: the limit
/// still says `length` (llama-server's rule).
pub fn finish_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        FinishReason::Stop => "tool_calls",
    }
}

/// The text of the pieces, joined, and the calls (reasoning is neither).
pub fn split(pieces: &[Piece]) -> (String, Vec<&ToolCall>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => text.push_str(t),
            Piece::Call(c) => calls.push(c),
            Piece::Reasoning(_) => {}
        }
    }
    (text, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hidden_marker_token_reaches_the_parser_as_its_text() {
        // Mistral's `[TOOL_CALLS]` as a control token (id 5): its text
        // never comes as a text event, only its id.
        let mut c = Calls {
            parser: ToolCallParser::new(ToolFormat::Mistral),
            markers: vec![(5, "[TOOL_CALLS]")],
        };
        let mut pieces = c.text("Checking.");
        pieces.extend(c.token(7));
        pieces.extend(c.token(5));
        pieces.extend(c.text("get_weather[ARGS]{\"city\": "));
        pieces.extend(c.text("\"Paris\"}"));
        pieces.extend(c.finish());
        let (text, calls) = split(&pieces);
        assert_eq!(text, "Checking.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments_json(), r#"{"city":"Paris"}"#);
    }

    #[test]
    fn tool_choice_is_checked() {
        assert_eq!(openai_choice(None).unwrap(), Choice::Auto);
        assert_eq!(openai_choice(Some(&json!("none"))).unwrap(), Choice::None);
        assert_eq!(
            openai_choice(Some(&json!("required"))).unwrap(),
            Choice::Required
        );
        assert_eq!(
            openai_choice(Some(
                &json!({"type": "function", "function": {"name": "f"}})
            ))
            .unwrap(),
            Choice::Named("f".into())
        );
        let e = openai_choice(Some(&json!("sometimes"))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(openai_choice(Some(&json!({"type": "function"}))).is_err());
    }
}
