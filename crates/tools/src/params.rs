//! Reading a call's parameters as llama-server does: a required one that is
//! missing or of the wrong type fails the call (400); an optional one of the
//! wrong type is its default.

use serde_json::Value;

use crate::ToolError;

pub(crate) fn required_str<'a>(params: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    match params.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ToolError::param(key, "must be a string")),
        None => Err(ToolError::param(key, "is required")),
    }
}

pub(crate) fn str_or<'a>(params: &'a Value, key: &str, default: &'a str) -> &'a str {
    params.get(key).and_then(Value::as_str).unwrap_or(default)
}

pub(crate) fn bool_or(params: &Value, key: &str, default: bool) -> bool {
    params.get(key).and_then(Value::as_bool).unwrap_or(default)
}

pub(crate) fn int_or(params: &Value, key: &str, default: i64) -> i64 {
    params.get(key).and_then(Value::as_i64).unwrap_or(default)
}
