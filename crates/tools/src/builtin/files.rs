//! `read_file` and `write_file`.

use serde_json::{json, Value};

use super::{failure, Schema};
use crate::io::{Target, MAX_READ};
use crate::params::{bool_or, int_or, required_str};
use crate::{CallContext, ToolError};

/// Most bytes of text `read_file` answers (a longer file needs a range).
const READ_MAX: usize = 16 * 1024;
/// Most bytes `read_file` answers as base64 (`x-resp-type: base64`).
const READ_MAX_BASE64: usize = 32 * 1024 * 1024;

pub(super) const READ_SCHEMA: Schema = (
    "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, each line is prefixed with its line number (e.g. \"1\u{2192}...\").",
    r#"{
        "path": {"type": "string", "description": "Path to the file"},
        "start_line": {"type": "integer", "description": "First line to read, 1-based (default: 1)"},
        "end_line": {"type": "integer", "description": "Last line to read, 1-based inclusive (default: end of file)"},
        "append_loc": {"type": "boolean", "description": "Prefix each line with its line number"}
    }"#,
    &["path"],
);

pub(super) const WRITE_SCHEMA: Schema = (
    "Write content to a file, creating it (including parent directories) if it does not exist. May use with edit_file for more complex edits.",
    r#"{
        "path": {"type": "string", "description": "Path of the file to write"},
        "content": {"type": "string", "description": "Content to write"}
    }"#,
    &["path", "content"],
);

pub(super) fn read(params: &Value, io: &Target, ctx: &CallContext) -> Result<Value, ToolError> {
    let path = required_str(params, "path")?;
    let start_line = int_or(params, "start_line", 1);
    // -1: to the end.
    let end_line = int_or(params, "end_line", -1);
    let append_loc = bool_or(params, "append_loc", false);

    let Some(size) = io.file_size(path) else {
        return Ok(failure(format!("cannot stat file: {path}")));
    };
    if ctx.base64 {
        if size > READ_MAX_BASE64 as u64 {
            return Ok(failure(format!(
                "file too large ({size} bytes, max {READ_MAX_BASE64})"
            )));
        }
        let Some(bytes) = io.read(path, READ_MAX_BASE64) else {
            return Ok(failure(format!("failed to open file: {path}")));
        };
        return Ok(json!({"base64": base64(&bytes), "size_bytes": bytes.len()}));
    }
    if size > READ_MAX as u64 && end_line == -1 {
        return Ok(failure(format!(
            "file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a portion."
        )));
    }
    let Some(bytes) = io.read(path, MAX_READ) else {
        return Ok(failure(format!("failed to open file: {path}")));
    };
    let content = String::from_utf8_lossy(&bytes);
    let mut result = String::new();
    for (i, line) in lines(&content).enumerate() {
        let lineno = i as i64 + 1;
        if lineno < start_line {
            continue;
        }
        if end_line != -1 && lineno > end_line {
            break;
        }
        let out = if append_loc {
            format!("{lineno}\u{2192}{line}\n")
        } else {
            format!("{line}\n")
        };
        if result.len() + out.len() > READ_MAX {
            result.push_str("[output truncated]");
            break;
        }
        result.push_str(&out);
    }
    Ok(json!({"plain_text_response": result}))
}

pub(super) fn write(params: &Value, io: &Target) -> Result<Value, ToolError> {
    let path = required_str(params, "path")?;
    let content = required_str(params, "content")?;
    if !io.write(path, content.as_bytes()) {
        return Ok(failure(format!("failed to write file: {path}")));
    }
    Ok(json!({"result": "file written successfully", "path": path, "bytes": content.len()}))
}

/// Lines as C++'s `getline` reads them: split at `\n`, which is dropped,
/// no empty line after a final `\n`, `\r` kept.
pub(super) fn lines(s: &str) -> impl Iterator<Item = &str> {
    s.split_inclusive('\n')
        .map(|l| l.strip_suffix('\n').unwrap_or(l))
}

/// Standard base64 with padding (RFC 4648 §4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foob"), "Zm9vYg==");
    }

    #[test]
    fn lines_as_getline() {
        assert_eq!(lines("a\nb\n").collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(lines("a\n\nb").collect::<Vec<_>>(), ["a", "", "b"]);
        assert_eq!(lines("a\r\n").collect::<Vec<_>>(), ["a\r"]);
    }
}
