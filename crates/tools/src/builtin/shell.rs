//! `exec_shell_command` and `get_info`.

use std::time::Duration;

use serde_json::{json, Value};

use super::Schema;
use crate::io::Target;
use crate::params::{int_or, required_str};
use crate::ToolError;

/// Most output bytes a command answers (and `max_output_size`'s cap).
const EXEC_MAX_OUTPUT: i64 = 16 * 1024;
/// Longest a command may run, in seconds (and `timeout`'s cap).
const EXEC_MAX_TIMEOUT: i64 = 60;
const EXEC_DEFAULT_TIMEOUT: i64 = 10;
const INFO_MAX_OUTPUT: usize = 4096;
const INFO_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) const EXEC_SCHEMA: Schema = (
    "Execute a shell command and return its output (stdout and stderr combined).",
    r#"{
        "command": {"type": "string", "description": "Shell command to execute"},
        "timeout": {"type": "integer", "description": "Timeout in seconds (default 10, max 60)"},
        "max_output_size": {"type": "integer", "description": "Maximum output size in bytes (default 16384)"}
    }"#,
    &["command"],
);

pub(super) const INFO_SCHEMA: Schema = (
    "Returns runtime info: the OS name/version and the current working directory",
    "{}",
    &[],
);

/// Runs `sh -c COMMAND` in the cwd. Streamed, the chunks are the output
/// and then `\n[exit code: N]`; else one `plain_text_response`.
pub(super) fn exec(
    params: &Value,
    io: &Target,
    on_chunk: Option<&mut dyn FnMut(&str) -> bool>,
) -> Result<Value, ToolError> {
    let command = required_str(params, "command")?;
    let timeout = int_or(params, "timeout", EXEC_DEFAULT_TIMEOUT).clamp(1, EXEC_MAX_TIMEOUT);
    let max_output = int_or(params, "max_output_size", EXEC_MAX_OUTPUT).clamp(0, EXEC_MAX_OUTPUT);
    let timeout = Duration::from_secs(timeout.unsigned_abs());
    let max_output = usize::try_from(max_output).unwrap_or(0);
    let args = ["sh".to_owned(), "-c".to_owned(), command.to_owned()];

    match on_chunk {
        Some(cb) => {
            let mut stopped = false;
            let mut forward = |chunk: &str| {
                let go = cb(chunk);
                stopped |= !go;
                go
            };
            let r = io.run(&args, max_output, timeout, Some(&mut forward));
            if !stopped {
                cb(&tail(r.exit_code, r.timed_out));
            }
            Ok(Value::Null)
        }
        None => {
            let r = io.run(&args, max_output, timeout, None);
            let mut text = r.output();
            text.push_str(&tail(r.exit_code, r.timed_out));
            Ok(json!({"plain_text_response": text}))
        }
    }
}

fn tail(exit_code: i32, timed_out: bool) -> String {
    let mut t = format!("\n[exit code: {exit_code}]");
    if timed_out {
        t.push_str(" [exit due to timed out]");
    }
    t
}

/// `uname -a` and the working directory.
pub(super) fn info(io: &Target) -> Result<Value, ToolError> {
    let r = io.run(
        &["uname".to_owned(), "-a".to_owned()],
        INFO_MAX_OUTPUT,
        INFO_TIMEOUT,
        None,
    );
    let os = if r.ok() {
        r.output().trim().to_owned()
    } else {
        "unknown".to_owned()
    };
    let cwd = match io.cwd() {
        Some(c) => c.to_owned(),
        None if !io.is_isolate() => std::env::current_dir()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".to_owned()),
        None => {
            let r = io.run(&["pwd".to_owned()], INFO_MAX_OUTPUT, INFO_TIMEOUT, None);
            if r.ok() {
                r.output().trim().to_owned()
            } else {
                "unknown".to_owned()
            }
        }
    };
    Ok(json!({"os": os, "cwd": cwd}))
}
