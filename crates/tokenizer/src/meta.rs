//! Typed reads of GGUF metadata for the tokenizer. Every accessor names the
//! key in its error; absent keys are `None` so callers apply llama.cpp's
//! defaults themselves.

use std::collections::{BTreeMap, HashMap};

use lamina_gguf::{Array, Value};

use crate::error::TokenizerError;

/// Anything that answers metadata look-ups: a whole model, one file, or a
/// hand-built map in tests.
pub trait Metadata {
    fn get(&self, key: &str) -> Option<&Value>;
}

impl Metadata for lamina_gguf::Model {
    fn get(&self, key: &str) -> Option<&Value> {
        lamina_gguf::Model::get(self, key)
    }
}

impl Metadata for lamina_gguf::File {
    fn get(&self, key: &str) -> Option<&Value> {
        lamina_gguf::File::get(self, key)
    }
}

impl Metadata for HashMap<String, Value> {
    fn get(&self, key: &str) -> Option<&Value> {
        HashMap::get(self, key)
    }
}

impl Metadata for BTreeMap<String, Value> {
    fn get(&self, key: &str) -> Option<&Value> {
        BTreeMap::get(self, key)
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {}", a.element_type()),
        other => format!("a {}", other.value_type()),
    }
}

fn wrong(key: &'static str, expected: &'static str, v: &Value) -> TokenizerError {
    TokenizerError::WrongType {
        key,
        expected,
        found: describe(v),
    }
}

pub(crate) fn string<'m>(
    meta: &'m dyn Metadata,
    key: &'static str,
) -> Result<Option<&'m str>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| wrong(key, "a string", v)),
    }
}

pub(crate) fn flag(meta: &dyn Metadata, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong(key, "a bool", v)),
    }
}

/// An integer of any width (converters disagree on u32 vs i32 for ids).
pub(crate) fn int(meta: &dyn Metadata, key: &'static str) -> Result<Option<i128>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_int()
            .map(Some)
            .ok_or_else(|| wrong(key, "an integer", v)),
    }
}

fn array<'m>(
    meta: &'m dyn Metadata,
    key: &'static str,
    expected: &'static str,
) -> Result<Option<&'m Array>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .map(Some)
            .ok_or_else(|| wrong(key, expected, v)),
    }
}

pub(crate) fn strings<'m>(
    meta: &'m dyn Metadata,
    key: &'static str,
) -> Result<Option<&'m [String]>, TokenizerError> {
    const EXPECTED: &str = "an array of strings";
    let Some(a) = array(meta, key, EXPECTED)? else {
        return Ok(None);
    };
    match a.as_strings() {
        Some(s) => Ok(Some(s)),
        None => Err(TokenizerError::WrongType {
            key,
            expected: EXPECTED,
            found: format!("an array of {}", a.element_type()),
        }),
    }
}

/// Scores: llama.cpp accepts f32 or i32 arrays and nothing else.
pub(crate) fn scores(
    meta: &dyn Metadata,
    key: &'static str,
) -> Result<Option<Vec<f32>>, TokenizerError> {
    const EXPECTED: &str = "an array of f32 or i32";
    let Some(a) = array(meta, key, EXPECTED)? else {
        return Ok(None);
    };
    match a {
        Array::F32(v) => Ok(Some(v.clone())),
        // i32 scores are ranks; llama.cpp converts them to float the same way.
        Array::I32(v) => Ok(Some(v.iter().map(|&x| x as f32).collect())),
        other => Err(TokenizerError::WrongType {
            key,
            expected: EXPECTED,
            found: format!("an array of {}", other.element_type()),
        }),
    }
}

/// An array of integers of any width, each narrowed to i32 (token types).
pub(crate) fn ints(
    meta: &dyn Metadata,
    key: &'static str,
) -> Result<Option<Vec<i32>>, TokenizerError> {
    const EXPECTED: &str = "an array of integers";
    let Some(a) = array(meta, key, EXPECTED)? else {
        return Ok(None);
    };
    if let Array::I32(v) = a {
        return Ok(Some(v.clone()));
    }
    let mut out = Vec::with_capacity(a.len());
    for i in 0..a.len() {
        let x = a
            .get(i)
            .and_then(|v| v.as_int())
            .and_then(|x| i32::try_from(x).ok());
        match x {
            Some(x) => out.push(x),
            None => {
                return Err(TokenizerError::WrongType {
                    key,
                    expected: EXPECTED,
                    found: format!("an array of {} (entry {i} unusable)", a.element_type()),
                })
            }
        }
    }
    Ok(Some(out))
}
