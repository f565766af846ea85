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
//! `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`, llama.cpp's generic
//! `{"tool_call": {"name": ..., "arguments": {...}}}` for any other
//! template, and the XML of Qwen3-Coder and Qwen3.5 (`xml.rs`). A marker
//! the vocabulary holds as a control token is written as that token
//! (`<[id]>`), since its text would never decode from text.
//!
//! When the prompt leaves a think block open (Qwen3.5's and DeepSeek-R1's
//! templates end it with `<think>\n`), the answer closes the block first,
//! as llama.cpp's grammars for such templates do: what follows an open
//! block is reasoning, and a call written there would never be read as one.

use lamina_chat::ToolFormat;
use serde_json::{json, Value};

use crate::constraint::with_ws_cap;
use crate::error::GrammarError;

#[cfg(test)]
mod tests;
mod xml;

/// One tool the call may name.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The JSON schema of its arguments (`{"type": "object"}` when the tool
    /// gives none).
    pub parameters: Value,
}

/// The Lark grammar of a call (or, with `parallel`, one or more calls) to
/// one of `tools` in `format`. `close_think` is the tag that closes a
/// think block the prompt left open (`</think>`), which the answer then
/// writes first. `control_token(text)` gives the id of a marker the
/// vocabulary holds as a control token.
pub fn call_grammar(
    format: ToolFormat,
    tools: &[ToolSpec],
    parallel: bool,
    close_think: Option<&str>,
    control_token: impl Fn(&str) -> Option<u32>,
) -> Result<String, GrammarError> {
    if tools.is_empty() {
        return Err(GrammarError::Tools(
            "a tool call is required, but there is no tool to call".into(),
        ));
    }
    for t in tools {
        if !(t.parameters.is_object() || t.parameters.is_boolean()) {
            return Err(GrammarError::Tools(format!(
                "the parameters of tool {:?} must be a JSON schema object",
                t.name
            )));
        }
    }
    let marker = |m: &str| match control_token(m) {
        Some(id) => format!("<[{id}]>"),
        None => lark_string(m),
    };
    let start = match close_think {
        Some(close) => format!("start: \"\\n\"? {} \"\\n\\n\" calls\n", marker(close)),
        None => "start: calls\n".to_owned(),
    };
    // One or more calls, one a line, for the formats that write a call
    // per marker.
    let calls = if parallel {
        "calls: call (\"\\n\" call)*\n"
    } else {
        "calls: call\n"
    };
    let rules = match format {
        ToolFormat::QwenXml => format!("{calls}{}", xml::call_rules(tools, marker)?),
        ToolFormat::Hermes => format!(
            "{calls}call: {} \"\\n\" %json {} \"\\n\" {}\n",
            marker("<tool_call>"),
            schema_text(json_call(tools, "arguments")),
            marker("</tool_call>")
        ),
        ToolFormat::Llama3 => format!(
            "calls: %json {}\n",
            schema_text(json_call(tools, "parameters"))
        ),
        ToolFormat::Mistral => {
            let mut list =
                json!({"type": "array", "items": json_call(tools, "arguments"), "minItems": 1});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            format!(
                "calls: {} %json {}\n",
                marker("[TOOL_CALLS]"),
                schema_text(list)
            )
        }
        ToolFormat::Generic => {
            let call = json_call(tools, "arguments");
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
            format!("calls: %json {}\n", schema_text(wrapped))
        }
    };
    Ok(format!("{start}{rules}"))
}

/// The schema of one JSON call object to one of `tools`, its arguments
/// under `args_key`.
fn json_call(tools: &[ToolSpec], args_key: &str) -> Value {
    let mut calls: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": t.name},
                    args_key: t.parameters,
                },
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    if calls.len() == 1 {
        calls.pop().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    }
}

/// A schema as `%json` takes it, JSON whitespace capped.
fn schema_text(schema: Value) -> String {
    with_ws_cap(schema).to_string()
}

fn lark_string(s: &str) -> String {
    let mut out = String::new();
    crate::gbnf::write_literal(&mut out, s);
    out
}
