//! Structured output: the request fields that constrain an answer, read
//! into a [`Spec`] and compiled for the model's vocabulary before the
//! request reaches the engine.
//!
//! - OpenAI's `response_format`: `{"type": "json_object"}` (any object, or
//!   llama-server's `"schema"` beside it) and `{"type": "json_schema",
//!   "json_schema": {"schema": ...}}`; `strict` is accepted and changes
//!   nothing, since every schema is enforced.
//! - llama-server's own `json_schema` and `grammar` (GBNF, or llguidance's
//!   Lark when it starts with `%llguidance`, as llama.cpp tells them
//!   apart), on every completion route.
//! - Ollama's `format` (`"json"` or a schema) and a required tool call
//!   (`tools.rs`) arrive here as a [`Wanted`] too.
//!
//! Fail closed: a schema or grammar that does not parse, or that
//! llguidance refuses, is a 400 naming the field, never an unconstrained
//! answer. Compiling runs in the bounded prompt pool (the first request
//! with a constraint also builds the vocabulary's trie there), so it never
//! holds up the engine or the async runtime.

use std::sync::Arc;

use lamina_engine::{Constraint, ModelInfo};
use lamina_grammar::Spec;
use serde_json::Value;

use super::error::ApiError;
use super::params::{Body, Sampling};
use super::AppState;

/// A constraint a request asks for, and the field that asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub spec: Spec,
    pub param: &'static str,
}

/// The constraint from `response_format`, `json_schema` and `grammar`; at
/// most one of them may ask for one.
pub fn from_body(b: &Body) -> Result<Option<Wanted>, ApiError> {
    let mut found: Vec<Wanted> = Vec::new();
    if let Some(spec) = response_format(b.get("response_format"))? {
        found.push(Wanted {
            spec,
            param: "response_format",
        });
    }
    if let Some(schema) = b.get("json_schema") {
        found.push(Wanted {
            spec: Spec::JsonSchema(schema_of(schema, "json_schema")?),
            param: "json_schema",
        });
    }
    match b.get("grammar") {
        None => {}
        Some(Value::String(g)) if g.trim().is_empty() => {}
        Some(Value::String(g)) => found.push(Wanted {
            spec: grammar_spec(g),
            param: "grammar",
        }),
        Some(_) => return Err(ApiError::invalid("grammar", "grammar must be a string")),
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|w| w.param).collect();
        return Err(ApiError::invalid(
            found[1].param,
            format!(
                "only one of response_format, json_schema and grammar may constrain the output (got {})",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

/// llama.cpp's rule: a grammar that starts with `%llguidance` is Lark for
/// llguidance, anything else is GBNF.
pub fn grammar_spec(g: &str) -> Spec {
    if g.trim_start().starts_with("%llguidance") {
        Spec::Lark(g.to_owned())
    } else {
        Spec::Gbnf(g.to_owned())
    }
}

fn response_format(rf: Option<&Value>) -> Result<Option<Spec>, ApiError> {
    const P: &str = "response_format";
    let Some(rf) = rf else { return Ok(None) };
    let Value::Object(o) = rf else {
        return Err(ApiError::invalid(P, "response_format must be an object"));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => match o.get("schema") {
            None | Some(Value::Null) => Ok(Some(Spec::JsonObject)),
            Some(s) => Ok(Some(Spec::JsonSchema(schema_of(s, "response_format.schema")?))),
        },
        Some("json_schema") => {
            let Some(Value::Object(js)) = o.get("json_schema") else {
                return Err(ApiError::invalid(
                    "response_format.json_schema",
                    "response_format of type json_schema needs json_schema: {\"schema\": ...}",
                ));
            };
            match js.get("strict") {
                None | Some(Value::Null | Value::Bool(_)) => {}
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.strict",
                        "response_format.json_schema.strict must be a boolean",
                    ))
                }
            }
            // As llama-server: no schema is any JSON value.
            match js.get("schema") {
                None | Some(Value::Null) => Ok(Some(Spec::JsonSchema(Value::Bool(true)))),
                Some(s) => Ok(Some(Spec::JsonSchema(schema_of(
                    s,
                    "response_format.json_schema.schema",
                )?))),
            }
        }
        ty => Err(ApiError::invalid(
            P,
            format!(
                "response_format type {} is not supported (\"text\", \"json_object\" and \"json_schema\" are)",
                ty.map_or("(missing)".to_owned(), |t| format!("{t:?}"))
            ),
        )),
    }
}

/// A schema must be an object or a boolean; a string holding one (as some
/// clients send `json_schema`) is read.
fn schema_of(v: &Value, param: &'static str) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(parsed @ (Value::Object(_) | Value::Bool(_))) => Ok(parsed),
            _ => Err(ApiError::invalid(
                param,
                format!("{param} must be a JSON schema (an object)"),
            )),
        },
        _ => Err(ApiError::invalid(
            param,
            format!("{param} must be a JSON schema (an object)"),
        )),
    }
}

/// Ollama's `format`: `"json"` (one JSON object), a JSON schema, or empty.
pub fn ollama_format(v: Option<&Value>) -> Result<Option<Wanted>, ApiError> {
    let spec = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(f)) if f.is_empty() => return Ok(None),
        Some(Value::String(f)) if f == "json" => Spec::JsonObject,
        Some(s @ Value::Object(_)) => Spec::JsonSchema(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "format",
                "format must be \"json\" or a JSON schema object",
            ))
        }
    };
    Ok(Some(Wanted {
        spec,
        param: "format",
    }))
}

/// Adds a second source of constraint (a required tool call) to what the
/// body asked for; two are refused.
pub fn add(s: &mut Sampling, w: Wanted) -> Result<(), ApiError> {
    if let Some(have) = &s.wanted {
        return Err(ApiError::invalid(
            w.param,
            format!(
                "{} cannot be combined with {}: both would constrain the output",
                w.param, have.param
            ),
        ));
    }
    s.wanted = Some(w);
    Ok(())
}

/// Compiles what `s` asks for (in the bounded pool) into `s.constraint`.
pub async fn compile(
    st: &AppState,
    info: &Arc<ModelInfo>,
    s: &mut Sampling,
) -> Result<(), ApiError> {
    let Some(w) = s.wanted.clone() else {
        return Ok(());
    };
    let info = info.clone();
    let c: Constraint = st
        .prepare
        .run(move || {
            let vocab = info
                .grammar_vocab()
                .map_err(|e| ApiError::internal(e.to_string()))?;
            Constraint::compile(vocab, &w.spec)
                .map_err(|e| ApiError::invalid(w.param, format!("{}: {e}", w.param)))
        })
        .await?;
    s.constraint = Some(c);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Body {
        match v {
            Value::Object(m) => Body(m),
            _ => unreachable!(),
        }
    }

    #[test]
    fn fields_become_specs() {
        let w = from_body(&body(json!({"response_format": {"type": "json_object"}})));
        assert_eq!(w.unwrap().unwrap().spec, Spec::JsonObject);
        let s = json!({"type": "object"});
        let w = from_body(&body(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": s}}}),
        ));
        assert_eq!(w.unwrap().unwrap().spec, Spec::JsonSchema(s.clone()));
        let w = from_body(&body(json!({"json_schema": s})))
            .unwrap()
            .unwrap();
        assert_eq!((w.spec, w.param), (Spec::JsonSchema(s), "json_schema"));
        let w = from_body(&body(json!({"grammar": "root ::= \"a\""})))
            .unwrap()
            .unwrap();
        assert!(matches!(w.spec, Spec::Gbnf(_)));
        let w = from_body(&body(json!({"grammar": "%llguidance {}\nstart: \"a\""})))
            .unwrap()
            .unwrap();
        assert!(matches!(w.spec, Spec::Lark(_)));
        assert_eq!(from_body(&body(json!({"grammar": ""}))).unwrap(), None);
        assert_eq!(
            from_body(&body(json!({"response_format": {"type": "text"}}))).unwrap(),
            None
        );
    }

    #[test]
    fn bad_fields_are_400s_naming_them() {
        for (v, param) in [
            (
                json!({"response_format": {"type": "sound"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_object", "schema": 123}}),
                "response_format.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (json!({"json_schema": [1]}), "json_schema"),
            (json!({"grammar": 5}), "grammar"),
            (
                json!({"grammar": "root ::= \"a\"", "json_schema": {}}),
                "grammar",
            ),
        ] {
            let e = from_body(&body(v.clone())).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{v}");
            assert_eq!(e.param.as_deref(), Some(param), "{v}");
        }
        assert!(ollama_format(Some(&json!("yaml"))).is_err());
        assert_eq!(
            ollama_format(Some(&json!("json"))).unwrap().unwrap().spec,
            Spec::JsonObject
        );
    }
}
