//! Python's spelling of values: `str()`, `repr()` and `json.dumps`.
//!
//! Hugging Face renders templates with Jinja2, so whatever a template prints
//! is spelled the way Python spells it: `True`, `None`, `{'a': 1}`, `1e-05`.
//! minijinja's own spelling (`true`, `none`, `{"a": 1}`) would change prompts,
//! so the environment's formatter, its `string` filter and its `tojson`
//! filter all go through this module.
//!
//! Invariants: every walk over a value is bounded by [`MAX_DEPTH`]; a template
//! can build a cyclic value (a namespace holding itself) and must get an
//! error, not a stack overflow. Every serialiser takes a byte limit and stops
//! once its output passes it (a value can hold one string a million times,
//! so its printed size is not bounded by its own).

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

use crate::budget::unaffordable;

/// Deepest nesting of lists and maps that is printed or serialised.
pub(crate) const MAX_DEPTH: usize = 128;

fn too_deep() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("value nested deeper than {MAX_DEPTH} levels"),
    )
}

/// Python's `str(value)`, with Jinja's `str(Undefined) == ""`; fails once
/// the text passes `limit` bytes.
pub(crate) fn py_str(value: &Value, limit: usize) -> Result<String, Error> {
    match value.kind() {
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_owned()),
        ValueKind::Undefined => Ok(String::new()),
        _ => {
            let mut out = String::new();
            write_repr(&mut out, value, 0, limit)?;
            within(&out, limit, "a printed value")?;
            Ok(out)
        }
    }
}

fn within(out: &str, limit: usize, what: &str) -> Result<(), Error> {
    if out.len() > limit {
        Err(unaffordable(what))
    } else {
        Ok(())
    }
}

/// Python's `repr(value)`.
fn write_repr(out: &mut String, value: &Value, depth: usize, limit: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    within(out, limit, "a printed value")?;
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, "inf", "nan"),
        ValueKind::String => write_py_string_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Bytes => {
            out.push_str("b'");
            for &b in value.as_bytes().unwrap_or_default() {
                match b {
                    b'\\' | b'\'' => {
                        out.push('\\');
                        out.push(char::from(b));
                    }
                    b'\t' => out.push_str("\\t"),
                    b'\n' => out.push_str("\\n"),
                    b'\r' => out.push_str("\\r"),
                    0x20..=0x7e => out.push(char::from(b)),
                    _ => {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
            }
            out.push('\'');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let item = value.get_item(&key)?;
                write_repr(out, &key, depth + 1, limit)?;
                out.push_str(": ");
                write_repr(out, &item, depth + 1, limit)?;
            }
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            // Tuples come from `dict.items()`; Python prints them in parens.
            let (open, close) = if value.is_tuple() {
                ('(', ")")
            } else {
                ('[', "]")
            };
            out.push(open);
            let mut count = 0usize;
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item, depth + 1, limit)?;
                count += 1;
            }
            if value.is_tuple() && count == 1 {
                out.push(',');
            }
            out.push_str(close);
        }
        _ => {
            // Functions, namespaces and the like: minijinja's own spelling is
            // the best there is, as Python would print an address.
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// A number as Python prints it: integers in full, floats as `float.__repr__`.
fn write_number(out: &mut String, value: &Value, inf: &str, nan: &str) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) => write_float(out, f, inf, nan),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// `float.__repr__`: the shortest digits that round-trip, in fixed notation
/// when the decimal exponent is in [-4, 16), scientific otherwise.
pub(crate) fn write_float(out: &mut String, f: f64, inf: &str, nan: &str) {
    if f.is_nan() {
        out.push_str(nan);
        return;
    }
    if f.is_infinite() {
        if f < 0.0 {
            out.push('-');
        }
        out.push_str(inf);
        return;
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if f.is_sign_negative() {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        if exp >= 0 {
            let int_len = exp + 1;
            if n <= int_len {
                out.push_str(&digits);
                for _ in 0..(int_len - n) {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                let (a, b) = digits.split_at(int_len as usize);
                out.push_str(a);
                out.push('.');
                out.push_str(b);
            }
        } else {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        }
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let sign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exp.abs());
    }
}

/// Python's `repr(str)`: single quotes unless the text holds a single quote
/// and no double quote; escapes for backslash, the quote, `\t\n\r` and
/// characters Python does not consider printable.
fn write_py_string_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let code = u32::from(c);
                let _ = if code <= 0xff {
                    write!(out, "\\x{code:02x}")
                } else if code <= 0xffff {
                    write!(out, "\\u{code:04x}")
                } else {
                    write!(out, "\\U{code:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `str.isprintable` for one character, without Unicode tables: control and
/// format characters and separators other than the ASCII space are not.
fn is_printable(c: char) -> bool {
    !matches!(u32::from(c),
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f
        | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f
        | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000 | 0xd800..=0xdfff
        | 0xe000..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0xf0000..=0x10ffff)
}

/// The arguments of Python's `json.dumps` that Hugging Face's `tojson` passes.
#[derive(Debug, Clone)]
pub(crate) struct JsonStyle {
    pub(crate) ensure_ascii: bool,
    /// `Some(unit)`: pretty-print, one item per line, indented by `unit` per level.
    pub(crate) indent: Option<String>,
    pub(crate) item_separator: String,
    pub(crate) key_separator: String,
    pub(crate) sort_keys: bool,
}

impl JsonStyle {
    /// `json.dumps` defaults for the given indent: `", "` between items
    /// without indent, `","` with it (the newline carries the space).
    pub(crate) fn new(indent: Option<String>) -> JsonStyle {
        JsonStyle {
            ensure_ascii: false,
            item_separator: if indent.is_some() { "," } else { ", " }.to_owned(),
            key_separator: ": ".to_owned(),
            indent,
            sort_keys: false,
        }
    }
}

/// Python's `json.dumps(value, **style)`; fails once the text passes
/// `limit` bytes.
pub(crate) fn json_dumps(value: &Value, style: &JsonStyle, limit: usize) -> Result<String, Error> {
    let mut out = String::new();
    write_json(&mut out, value, style, 0, limit)?;
    within(&out, limit, "tojson's output")?;
    Ok(out)
}

fn newline_indent(out: &mut String, style: &JsonStyle, level: usize) {
    if let Some(unit) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(unit);
        }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
    limit: usize,
) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    within(out, limit, "tojson's output")?;
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value, "Infinity", "NaN"),
        ValueKind::String => write_json_string(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline_indent(out, style, depth + 1);
                write_json(out, item, style, depth + 1, limit)?;
            }
            newline_indent(out, style, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline_indent(out, style, depth + 1);
                write_json_string(out, key, style);
                out.push_str(&style.key_separator);
                write_json(out, item, style, depth + 1, limit)?;
            }
            newline_indent(out, style, depth);
            out.push('}');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// A dict key as `json.dumps` converts it: strings stay, numbers, booleans
/// and None become their JSON spelling.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key, "Infinity", "NaN");
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

/// A JSON string as Python writes it: only `"`, `\`, and control characters
/// are escaped (no HTML escaping); with `ensure_ascii`, non-ASCII as `\uXXXX`
/// (surrogate pairs above the BMP).
fn write_json_string(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(f: f64) -> String {
        let mut s = String::new();
        write_float(&mut s, f, "inf", "nan");
        s
    }

    #[test]
    fn floats_print_like_python_repr() {
        assert_eq!(float(18.0), "18.0");
        assert_eq!(float(0.1), "0.1");
        assert_eq!(float(-2.5), "-2.5");
        assert_eq!(float(1e-5), "1e-05");
        assert_eq!(float(0.0001), "0.0001");
        assert_eq!(float(1e16), "1e+16");
        assert_eq!(float(1234567890123456.0), "1234567890123456.0");
        assert_eq!(float(1.5e300), "1.5e+300");
        assert_eq!(float(f64::NEG_INFINITY), "-inf");
    }

    #[test]
    fn str_and_repr_of_containers() -> Result<(), Error> {
        let v = Value::from_pairs([
            ("a", Value::from(true)),
            ("b", Value::from(())),
            ("c", Value::from("it's")),
        ]);
        assert_eq!(
            py_str(&v, usize::MAX)?,
            "{'a': True, 'b': None, 'c': \"it's\"}"
        );
        let list = Value::from(vec![Value::from(1), Value::from("x\ny")]);
        assert_eq!(py_str(&list, usize::MAX)?, "[1, 'x\\ny']");
        Ok(())
    }

    #[test]
    fn json_matches_python_dumps() -> Result<(), Error> {
        let v = Value::from_pairs([
            ("name", Value::from("Zürich <b>&")),
            ("n", Value::from(vec![Value::from(1), Value::from(2.0)])),
            ("e", Value::from_pairs(Vec::<(String, Value)>::new())),
        ]);
        let style = JsonStyle::new(None);
        assert_eq!(
            json_dumps(&v, &style, usize::MAX)?,
            r#"{"name": "Zürich <b>&", "n": [1, 2.0], "e": {}}"#
        );
        let pretty = JsonStyle::new(Some("  ".to_owned()));
        assert_eq!(
            json_dumps(&v, &pretty, usize::MAX)?,
            "{\n  \"name\": \"Zürich <b>&\",\n  \"n\": [\n    1,\n    2.0\n  ],\n  \"e\": {}\n}"
        );
        let ascii = JsonStyle {
            ensure_ascii: true,
            ..JsonStyle::new(None)
        };
        assert_eq!(
            json_dumps(&Value::from("é😀"), &ascii, usize::MAX)?,
            r#""\u00e9\ud83d\ude00""#
        );
        Ok(())
    }
}
