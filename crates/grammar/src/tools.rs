//! Tool calls forced by grammar: OpenAI's `tool_choice: "required"` or a
//! named function. The output must be a call, written in the format the
//! model's template tells (`lamina_chat::ToolFormat`, the one the server's
//! parser reads back), to one of the allowed tools, with arguments valid
//! against that tool's parameter schema. So even a model too small to
//! call tools on its own answers with a call the parser accepts.
//!
//! The layouts follow llama.cpp's tool-call grammars for the same formats:
//! Hermes `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
//! Llama 3.x `{"name": ..., "parameters": {...}}`, Mistral
//! `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`, and llama.cpp's
//! generic `{"tool_call": {"name": ..., "arguments": {...}}}` for any other
//! template. A marker the vocabulary holds as a control token is written
//! as that token (`<[id]>`), since its text would never decode from text.
//! The XML format of Qwen3-Coder and Qwen3.5 is not forced yet: asking is
//! an error, not a call in a format its parser would not read back.

use lamina_chat::ToolFormat;
use serde_json::{json, Value};

use crate::constraint::with_ws_cap;
use crate::error::GrammarError;

/// One tool the call may name.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The JSON schema of its arguments (`{"type": "object"}` when the tool
    /// gives none).
    pub parameters: Value,
}

/// The Lark grammar of a call (or, with `parallel`, one or more calls) to
/// one of `tools` in `format`. `control_token(text)` gives the id of a
/// marker the vocabulary holds as a control token.
pub fn call_grammar(
    format: ToolFormat,
    tools: &[ToolSpec],
    parallel: bool,
    control_token: impl Fn(&str) -> Option<u32>,
) -> Result<String, GrammarError> {
    if tools.is_empty() {
        return Err(GrammarError::Tools(
            "a tool call is required, but there is no tool to call".into(),
        ));
    }
    if format == ToolFormat::QwenXml {
        return Err(GrammarError::Tools(
            "a tool call cannot be forced yet in this model's XML tool-call format (Qwen3-Coder, Qwen3.5); use tool_choice \"auto\"".into(),
        ));
    }
    let args_key = match format {
        ToolFormat::Llama3 => "parameters",
        _ => "arguments",
    };
    let mut calls = Vec::with_capacity(tools.len());
    for t in tools {
        if !(t.parameters.is_object() || t.parameters.is_boolean()) {
            return Err(GrammarError::Tools(format!(
                "the parameters of tool {:?} must be a JSON schema object",
                t.name
            )));
        }
        calls.push(json!({
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                args_key: t.parameters,
            },
            "required": ["name", args_key],
            "additionalProperties": false,
        }));
    }
    let call = if calls.len() == 1 {
        calls.pop().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    };
    let marker = |m: &str| match control_token(m) {
        Some(id) => format!("<[{id}]>"),
        None => lark_string(m),
    };
    let schema = |s: Value| with_ws_cap(s).to_string();
    Ok(match format {
        ToolFormat::Hermes => {
            let one = format!(
                "call: {} \"\\n\" %json {} \"\\n\" {}\n",
                marker("<tool_call>"),
                schema(call),
                marker("</tool_call>")
            );
            let start = if parallel {
                "start: call (\"\\n\" call)*\n"
            } else {
                "start: call\n"
            };
            format!("{start}{one}")
        }
        ToolFormat::Llama3 => format!("start: %json {}\n", schema(call)),
        // Refused above.
        ToolFormat::QwenXml => String::new(),
        ToolFormat::Mistral => {
            let mut list = json!({"type": "array", "items": call, "minItems": 1});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            format!("start: {} %json {}\n", marker("[TOOL_CALLS]"), schema(list))
        }
        ToolFormat::Generic => {
            let wrapped = if parallel {
                json!({
                    "type": "object",
                    "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                    "required": ["tool_calls"],
                    "additionalProperties": false,
                })
            } else {
                json!({
                    "type": "object",
                    "properties": {"tool_call": call},
                    "required": ["tool_call"],
                    "additionalProperties": false,
                })
            };
            format!("start: %json {}\n", schema(wrapped))
        }
    })
}

fn lark_string(s: &str) -> String {
    let mut out = String::new();
    crate::gbnf::write_literal(&mut out, s);
    out
}
