//! The XML call of Qwen3-Coder and Qwen3.5 ([`ToolFormat::QwenXml`]) as
//! Lark rules, laid out as those templates write a call in their prompt's
//! example and in earlier turns:
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
//! A tool's parameters come in its schema's `properties` order, each
//! required one always, each optional one at most once, and no other. A
//! value is typed as `lamina_chat` reads it back
//! ([`lamina_chat::xml_value_is_text`]): raw text where the schema is a
//! string (one of its literals where it lists them), else `%json` of the
//! parameter's schema.
//!
//! Raw text is one terminal together with the `</parameter>` that closes
//! it: text that never holds `</parameter>`, then the closing tag. As two
//! lexemes, a greedy text lexeme could run on past the tag and the parser
//! would never see the value end; as one, the lexeme can only end at the
//! first closing tag, which is where the reader ends the value too.
//!
//! [`ToolFormat::QwenXml`]: lamina_chat::ToolFormat::QwenXml

use std::fmt::Write as _;

use lamina_chat::{xml_key_reads_back, xml_name_reads_back, xml_value_is_text};
use serde_json::{Map, Value};

use super::{lark_string, schema_text, ToolSpec};
use crate::error::GrammarError;

/// Raw text that holds no `</parameter>`, and a value of it as written:
/// the newline after `<parameter=KEY>`, the text, the newline and the tag
/// that close it.
const TEXT_TERMINALS: &str = "XML_TEXT: /(?s:.*)/ & ~/(?s:.*)<\\/parameter>(?s:.*)/\n\
                              XML_VALUE: \"\\n\" XML_TEXT \"\\n</parameter>\"\n";

/// Longest `maxLength` written into a text value's terminal; past it the
/// bound is left out (the lexer's automaton grows with it).
const MAX_TEXT_BOUND: u64 = 4096;

/// The rules of one call (`call`) to one of `tools`; `marker` writes the
/// `<tool_call>` and `</tool_call>` markers.
pub(super) fn call_rules(
    tools: &[ToolSpec],
    marker: impl Fn(&str) -> String,
) -> Result<String, GrammarError> {
    let mut rules = String::new();
    let mut text_terminals = false;
    // Terminals of single values, after the rules.
    let mut terminals = String::new();
    let mut alternatives = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if !xml_name_reads_back(&t.name) {
            return Err(GrammarError::Tools(format!(
                "the tool name {:?} cannot be written in this model's XML tool calls \
                 (a letter, digit or _ first, then those and - . :)",
                t.name
            )));
        }
        let props = t
            .parameters
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let required: Vec<&str> = t
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // A required key the properties do not describe: its value is
        // read as text, so written as text.
        let mut params: Vec<(String, Value)> = props.into_iter().collect();
        for r in &required {
            if !params.iter().any(|(k, _)| k == r) {
                params.push(((*r).to_owned(), Value::Object(Map::new())));
            }
        }
        let name = format!("fn_{i}");
        let mut body = lark_string(&format!("<function={}>\n", t.name));
        for (j, (key, schema)) in params.iter().enumerate() {
            if !xml_key_reads_back(key) {
                return Err(GrammarError::Tools(format!(
                    "the parameter {key:?} of tool {:?} cannot be written in this model's XML tool calls \
                     (a name on one line, without < or > or space around it)",
                    t.name
                )));
            }
            let rule = format!("{name}_{j}");
            let (value, uses_text) = value_rule(&rule, schema, &t.parameters, &mut terminals)?;
            text_terminals |= uses_text;
            let _ = writeln!(
                rules,
                "{rule}: {} {value} \"\\n\"",
                lark_string(&format!("<parameter={key}>"))
            );
            body.push(' ');
            body.push_str(&rule);
            if !required.contains(&key.as_str()) {
                body.push('?');
            }
        }
        let _ = writeln!(rules, "{name}: {body} \"</function>\\n\"");
        alternatives.push(name);
    }
    rules.push_str(&terminals);
    if text_terminals {
        rules.push_str(TEXT_TERMINALS);
    }
    Ok(format!(
        "call: {} \"\\n\" ({}) {}\n{rules}",
        marker("<tool_call>"),
        alternatives.join(" | "),
        marker("</tool_call>"),
    ))
}

/// What follows `<parameter=KEY>` up to `</parameter>`, and whether it
/// uses the shared text terminals. A terminal of its own is added to
/// `terminals`, named after `rule`.
fn value_rule(
    rule: &str,
    schema: &Value,
    tool: &Value,
    terminals: &mut String,
) -> Result<(String, bool), GrammarError> {
    if !xml_value_is_text(schema) {
        let json = schema_text(with_defs(schema, tool));
        return Ok((format!("\"\\n\" %json {json} \"\\n</parameter>\""), false));
    }
    // Literals the schema lists, as raw text.
    let literals: Option<Vec<&str>> = match (schema.get("const"), schema.get("enum")) {
        (Some(c), _) => c.as_str().map(|c| vec![c]),
        (None, Some(Value::Array(e))) => e.iter().map(Value::as_str).collect(),
        _ => None,
    };
    if let Some(lits) = literals {
        let alts: Vec<String> = lits.iter().map(|l| lark_string(l)).collect();
        if alts.is_empty() {
            return Err(GrammarError::Tools(format!(
                "a parameter's schema lists no value: {schema}"
            )));
        }
        return Ok((
            format!("\"\\n\" ({}) \"\\n</parameter>\"", alts.join(" | ")),
            false,
        ));
    }
    let bound = |k: &str| schema.get(k).and_then(Value::as_u64);
    let (min, max) = (bound("minLength"), bound("maxLength"));
    if (min.is_none() && max.is_none()) || min.max(max).is_some_and(|n| n > MAX_TEXT_BOUND) {
        return Ok(("XML_VALUE".to_owned(), true));
    }
    let min = min.unwrap_or(0);
    if max.is_some_and(|m| m < min) {
        return Err(GrammarError::Tools(format!(
            "a parameter's schema has maxLength below minLength: {schema}"
        )));
    }
    let max = max.map_or(String::new(), |m| m.to_string());
    // Upper case: a terminal, one lexeme.
    let term = rule.to_uppercase();
    let _ = writeln!(
        terminals,
        "{term}: \"\\n\" (XML_TEXT & /(?s:.){{{min},{max}}}/) \"\\n</parameter>\""
    );
    Ok((term, true))
}

/// A parameter's schema with the tool's `$defs` (and `definitions`), so
/// references into them still resolve once it stands alone.
fn with_defs(schema: &Value, tool: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s {
        for k in ["$defs", "definitions"] {
            if let Some(d) = tool.get(k) {
                o.entry(k).or_insert_with(|| d.clone());
            }
        }
    }
    s
}
