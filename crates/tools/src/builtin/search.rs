//! `file_glob_search` and `grep_search`.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use super::files::lines;
use super::{failure, Schema};
use crate::glob::{path_match, MAX_PATTERN};
use crate::io::{Kind, Target};
use crate::params::{bool_or, int_or, required_str, str_or};
use crate::ToolError;

/// Most entries `file_glob_search` answers (and its `limit`'s cap).
const GLOB_MAX_RESULTS: i64 = 100;
/// Most matching lines `grep_search` answers.
const GREP_MAX_RESULTS: usize = 100;
/// Files past this size are not searched by `grep_search`.
const GREP_MAX_FILE: usize = 16 * 1024 * 1024;
/// Most context lines on each side of a match.
const GREP_MAX_CONTEXT: i64 = 100;
/// Largest compiled regex (the regex crate's own default is 10 MiB too; set
/// here so that it is a decision).
const REGEX_SIZE_LIMIT: usize = 10 * 1024 * 1024;

pub(super) const GLOB_SCHEMA: Schema = (
    "Recursively search for files matching a glob pattern under a directory. Automatically skips files ignored by .gitignore (when the directory is inside a git repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. A pattern containing '/' matches the full relative path; unless already anchored with \"**/\" or a leading '/', it is automatically prefixed with \"**/\". Use type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' in the output. Note: directory listings do not apply .gitignore filtering.",
    r#"{
        "path": {"type": "string", "description": "Base directory to search in"},
        "include": {"type": "string", "description": "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"},
        "exclude": {"type": "string", "description": "Glob pattern for files to exclude"},
        "type": {"type": "string", "description": "Entry type to return: \"file\" (default), \"dir\" or \"all\""},
        "max_depth": {"type": "integer", "description": "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = direct children only)"},
        "limit": {"type": "integer", "description": "Maximum number of results to return, capped at 100 (default 100)"}
    }"#,
    &["path"],
);

pub(super) const GREP_SCHEMA: Schema = (
    "Search for a pattern in files under a path. Returns matching lines with file paths (and, unless searching a single file, paths relative to the given directory). Automatically skips files ignored by .gitignore (when the directory is inside a git repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. include/exclude: a pattern with no '/' matches the basename at any depth; a pattern containing '/' matches the full relative path (auto-anchored with \"**/\" unless already anchored).",
    r#"{
        "path": {"type": "string", "description": "File or directory to search in"},
        "pattern": {"type": "string", "description": "Pattern to search for (regular expression unless literal is true)"},
        "include": {"type": "string", "description": "Glob pattern to filter files (default: **)"},
        "exclude": {"type": "string", "description": "Glob pattern to exclude files"},
        "return_line_numbers": {"type": "boolean", "description": "If true, include line numbers in results"},
        "literal": {"type": "boolean", "description": "Treat pattern as a literal string instead of a regular expression (default: false)"},
        "ignore_case": {"type": "boolean", "description": "Case-insensitive search (default: false)"},
        "context_lines": {"type": "integer", "description": "Number of lines of context to show before and after each match (default: 0)"}
    }"#,
    &["path", "pattern"],
);

/// `include` and `exclude`, or the tool's error for a pattern too long.
fn patterns(params: &Value) -> Result<(&str, &str), Value> {
    let include = str_or(params, "include", "**");
    let exclude = str_or(params, "exclude", "");
    for (name, p) in [("include", include), ("exclude", exclude)] {
        if p.chars().count() > MAX_PATTERN {
            return Err(failure(format!(
                "{name} pattern too long ({} characters, max {MAX_PATTERN})",
                p.chars().count()
            )));
        }
    }
    Ok((include, exclude))
}

fn selected(include: &str, exclude: &str, rel: &str) -> bool {
    path_match(include, rel) && (exclude.is_empty() || !path_match(exclude, rel))
}

pub(super) fn glob(params: &Value, io: &Target) -> Result<Value, ToolError> {
    let path = required_str(params, "path")?;
    let base = io.resolve(path);
    let (include, exclude) = match patterns(params) {
        Ok(p) => p,
        Err(e) => return Ok(e),
    };
    let kind = match str_or(params, "type", "file") {
        "file" => Kind::Files,
        "dir" => Kind::Dirs,
        "all" => Kind::All,
        other => {
            return Ok(failure(format!(
                "invalid type: {other} (expected \"file\", \"dir\" or \"all\")"
            )))
        }
    };
    let max_depth = usize::try_from(int_or(params, "max_depth", 0).max(0)).unwrap_or(0);
    let limit = int_or(params, "limit", GLOB_MAX_RESULTS);
    if limit < 1 {
        return Ok(failure(format!(
            "invalid limit: {limit} (expected 1 or more)"
        )));
    }
    let limit = usize::try_from(limit.min(GLOB_MAX_RESULTS)).unwrap_or(1);

    let listing = io.list(&base, max_depth, kind);
    if let Some(err) = listing.err {
        return Ok(failure(format!("{err}: {path}")));
    }
    let matches: Vec<_> = listing
        .entries
        .iter()
        .filter(|e| selected(include, exclude, &e.rel))
        .collect();
    let total = matches.len();
    let shown = total.min(limit);

    let mut text = String::new();
    let mut entries = Vec::with_capacity(shown);
    for e in &matches[..shown] {
        let _ = writeln!(text, "{}{}", e.rel, if e.is_dir { "/" } else { "" });
        entries.push(json!({"path": e.rel, "type": if e.is_dir { "dir" } else { "file" }}));
    }
    let _ = write!(text, "\n---\nTotal matches: {total}\n");
    if total > shown {
        let _ = writeln!(
            text,
            "[{shown} results limit reached ({total} total matches). Refine the glob pattern to narrow the search.]"
        );
    }
    if listing.truncated {
        text.push_str("[results truncated: time budget or unreadable directory]\n");
    }
    // `base` is absolute, so a client can join the relative entries to it.
    Ok(json!({"plain_text_response": text, "entries": entries, "base": base}))
}

pub(super) fn grep(params: &Value, io: &Target) -> Result<Value, ToolError> {
    let path = required_str(params, "path")?;
    let pattern = required_str(params, "pattern")?;
    let (include, exclude) = match patterns(params) {
        Ok(p) => p,
        Err(e) => return Ok(e),
    };
    let show_numbers = bool_or(params, "return_line_numbers", false);
    let literal = bool_or(params, "literal", false);
    let ignore_case = bool_or(params, "ignore_case", false);
    let context =
        usize::try_from(int_or(params, "context_lines", 0).clamp(0, GREP_MAX_CONTEXT)).unwrap_or(0);

    let source = if literal {
        regex::escape(pattern)
    } else {
        pattern.to_owned()
    };
    let re = match regex::RegexBuilder::new(&source)
        .case_insensitive(ignore_case)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
    {
        Ok(re) => re,
        Err(e) => return Ok(failure(format!("invalid regex: {e}"))),
    };

    // (absolute path, path as shown)
    let mut files: Vec<(String, String)> = Vec::new();
    let abs = io.resolve(path);
    if io.is_file(&abs) {
        files.push((abs, path.to_owned()));
    } else if io.is_dir(&abs) {
        let listing = io.list(&abs, 0, Kind::Files);
        if let Some(err) = listing.err {
            return Ok(failure(format!("{err}: {path}")));
        }
        for e in listing.entries {
            if selected(include, exclude, &e.rel) {
                let full = Path::new(&abs).join(&e.rel).to_string_lossy().into_owned();
                files.push((full, e.rel));
            }
        }
    } else {
        return Ok(failure(format!("path does not exist: {path}")));
    }

    let mut text = String::new();
    let mut total = 0usize;
    let mut limit_reached = false;
    let numbered = show_numbers || context > 0;
    'files: for (full, shown) in &files {
        let Some(bytes) = io.read(full, GREP_MAX_FILE) else {
            continue;
        };
        let content = String::from_utf8_lossy(&bytes);
        let all: Vec<&str> = lines(&content).collect();
        for (i, line) in all.iter().enumerate() {
            if total >= GREP_MAX_RESULTS {
                limit_reached = true;
                break 'files;
            }
            if !re.is_match(line) {
                continue;
            }
            let from = i.saturating_sub(context);
            let to = (i + context).min(all.len() - 1);
            for (j, l) in all.iter().enumerate().take(to + 1).skip(from) {
                let sep = if j == i { ':' } else { '-' };
                text.push_str(shown);
                text.push(sep);
                if numbered {
                    let _ = write!(text, "{}{sep}", j + 1);
                }
                text.push_str(l);
                text.push('\n');
            }
            if context > 0 {
                text.push_str("--\n");
            }
            total += 1;
        }
    }
    let _ = write!(text, "\n---\nTotal matches: {total}\n");
    if limit_reached {
        let _ = writeln!(
            text,
            "[{GREP_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]"
        );
    }
    Ok(json!({"plain_text_response": text}))
}
