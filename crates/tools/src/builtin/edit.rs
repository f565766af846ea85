//! `edit_file`: exact text replacements, several per call.
//!
//! Every `old_text` is found in the original content (not in the result of
//! the edits before it), must occur once, and no two may overlap. When one
//! is not found exactly, both sides are compared with trailing whitespace
//! dropped and typographic quotes, dashes and spaces made ASCII (models
//! write those); then the edited lines come from the normalised text and
//! every other line stays byte for byte as it was.

use serde_json::{json, Value};

use super::{failure, Schema};
use crate::io::{Target, MAX_READ};
use crate::params::required_str;
use crate::ToolError;

pub(super) const SCHEMA: Schema = (
    "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and is matched against the original content, not incrementally. Merge nearby changes into one edit instead of overlapping edits. Use write_file to replace the whole file.",
    r#"{
        "path": {"type": "string", "description": "Path to the file to edit"},
        "edits": {
            "type": "array",
            "description": "One or more exact text replacements to apply",
            "items": {
                "type": "object",
                "properties": {
                    "old_text": {"type": "string", "description": "Exact text to find; must be unique in the file and must not overlap with other edits"},
                    "new_text": {"type": "string", "description": "Text to replace old_text with"}
                },
                "required": ["old_text", "new_text"]
            }
        }
    }"#,
    &["path", "edits"],
);

/// One edit, located.
struct Matched<'a> {
    index: usize,
    at: usize,
    len: usize,
    new_text: &'a str,
}

pub(super) fn edit(params: &Value, io: &Target) -> Result<Value, ToolError> {
    let path = required_str(params, "path")?;
    let Some(list) = params
        .get("edits")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
    else {
        return Ok(failure("\"edits\" must be a non-empty array"));
    };
    let mut edits: Vec<(&str, &str)> = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let old = e
            .get("old_text")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::param(&format!("edits[{i}].old_text"), "must be a string"))?;
        let new = e
            .get("new_text")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::param(&format!("edits[{i}].new_text"), "must be a string"))?;
        if old.is_empty() {
            return Ok(failure(format!("edits[{i}].old_text must not be empty")));
        }
        edits.push((old, new));
    }

    let Some(bytes) = io.read(path, MAX_READ) else {
        return Ok(failure(format!("failed to open file: {path}")));
    };
    let Ok(original) = String::from_utf8(bytes) else {
        return Ok(failure(format!("{path} is not UTF-8 text")));
    };
    let fuzzy_original = normalize(&original);

    let mut any_fuzzy = false;
    for (i, (old, _)) in edits.iter().enumerate() {
        if original.contains(old) {
            continue;
        }
        if !fuzzy_original.contains(&normalize(old)) {
            return Ok(failure(format!(
                "could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
            )));
        }
        any_fuzzy = true;
    }
    let base = if any_fuzzy {
        &fuzzy_original
    } else {
        &original
    };

    let mut matched = Vec::with_capacity(edits.len());
    for (i, (old, new)) in edits.iter().enumerate() {
        let fuzzy_old = normalize(old);
        // Counted on normalised text, so a copy that differs only in
        // whitespace still makes it ambiguous.
        let n = count(&fuzzy_original, &fuzzy_old);
        if n > 1 {
            return Ok(failure(format!(
                "found {n} occurrences of edits[{i}].old_text in {path}, it must be unique"
            )));
        }
        let needle: &str = if any_fuzzy { &fuzzy_old } else { old };
        let Some(at) = base.find(needle) else {
            return Ok(failure(format!(
                "could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
            )));
        };
        matched.push(Matched {
            index: i,
            at,
            len: needle.len(),
            new_text: new,
        });
    }
    matched.sort_by_key(|m| m.at);
    for w in matched.windows(2) {
        if w[0].at + w[0].len > w[1].at {
            return Ok(failure(format!(
                "edits[{}] and edits[{}] overlap in {path}; merge them into one edit or target disjoint regions",
                w[0].index, w[1].index
            )));
        }
    }

    let new_content = if any_fuzzy {
        replace_keeping_lines(&original, base, &matched)
    } else {
        replace(base, &matched, 0)
    };
    if new_content == original {
        return Ok(failure(
            "no changes made: the replacement(s) produced identical content",
        ));
    }
    if !io.write(path, new_content.as_bytes()) {
        return Ok(failure(format!("failed to write file: {path}")));
    }
    Ok(json!({"result": "file edited successfully", "path": path, "edits_applied": matched.len()}))
}

/// Non-overlapping occurrences.
fn count(hay: &str, needle: &str) -> usize {
    if needle.is_empty() {
        0
    } else {
        hay.matches(needle).count()
    }
}

/// `content` (which starts at `offset` of the text the matches index) with
/// the matches (ascending, disjoint) replaced.
fn replace(content: &str, matches: &[Matched<'_>], offset: usize) -> String {
    let mut out = String::with_capacity(content.len());
    let mut pos = 0;
    for m in matches {
        let at = m.at - offset;
        out.push_str(&content[pos..at]);
        out.push_str(m.new_text);
        pos = at + m.len;
    }
    out.push_str(&content[pos..]);
    out
}

/// Line spans (`[start, end)`, each with its `\n`).
fn spans(s: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for l in s.split_inclusive('\n') {
        out.push((start, start + l.len()));
        start += l.len();
    }
    out
}

/// Replaces in the normalised `base`, but copies every line no match
/// touches from `original` (normalising keeps the line count).
fn replace_keeping_lines(original: &str, base: &str, matches: &[Matched<'_>]) -> String {
    let orig_lines: Vec<&str> = original.split_inclusive('\n').collect();
    let base_spans = spans(base);
    let line_of = |pos: usize| base_spans.iter().position(|&(s, e)| pos >= s && pos < e);

    // Groups of matches over the same run of lines: (first, end, matches).
    let mut groups: Vec<(usize, usize, Vec<&Matched<'_>>)> = Vec::new();
    for m in matches {
        let first = line_of(m.at).unwrap_or(base_spans.len().saturating_sub(1));
        let last_pos = (m.at + m.len).saturating_sub(1).max(m.at);
        let last = line_of(last_pos).unwrap_or(base_spans.len().saturating_sub(1));
        match groups.last_mut() {
            Some(g) if first < g.1 => {
                g.1 = g.1.max(last + 1);
                g.2.push(m);
            }
            _ => groups.push((first, last + 1, vec![m])),
        }
    }

    let mut out = String::with_capacity(original.len());
    let mut next = 0;
    for (first, end, ms) in groups {
        for l in orig_lines.iter().take(first).skip(next) {
            out.push_str(l);
        }
        let (start, _) = base_spans[first];
        let (_, stop) = base_spans[end - 1];
        let owned: Vec<Matched<'_>> = ms
            .iter()
            .map(|m| Matched {
                index: m.index,
                at: m.at,
                len: m.len,
                new_text: m.new_text,
            })
            .collect();
        out.push_str(&replace(&base[start..stop], &owned, start));
        next = end;
    }
    for l in orig_lines.iter().skip(next) {
        out.push_str(l);
    }
    out
}

/// Each line with trailing blanks dropped and typographic quotes, dashes
/// and spaces made ASCII; the `\n`s stay where they were.
fn normalize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut first = true;
    for line in s.split('\n') {
        if !first {
            out.push('\n');
        }
        first = false;
        for c in line.trim_end_matches([' ', '\t', '\r']).chars() {
            out.push(match c {
                '\u{2018}'..='\u{201B}' => '\'',
                '\u{201C}'..='\u{201F}' => '"',
                '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
                '\u{00A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
                c => c,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzzy_edit_keeps_untouched_lines() {
        let original = "keep  \nsay \u{201C}hi\u{201D}\t\nend  \n";
        let base = normalize(original);
        let needle = "say \"hi\"";
        let at = base.find(needle).unwrap_or(0);
        let m = [Matched {
            index: 0,
            at,
            len: needle.len(),
            new_text: "say bye",
        }];
        assert_eq!(
            replace_keeping_lines(original, &base, &m),
            "keep  \nsay bye\nend  \n"
        );
    }

    #[test]
    fn normalize_keeps_line_count() {
        assert_eq!(normalize("a \u{2014} b  \n\u{00A0}x\r\n"), "a - b\n x\n");
    }
}
