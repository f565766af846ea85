//! The built-in tools, llama-server's set (`server-tools.cpp`): minimal
//! file and shell tools only. Their answers are what llama-server answers,
//! key for key and line for line (`plain_text_response`, `Total matches:
//! N`, `file written successfully`), since the web UI and models read them.

mod edit;
mod files;
mod search;
mod shell;

use serde_json::{json, Value};

use crate::io::Target;
use crate::{CallContext, ToolEntry, ToolError};

/// One built-in tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    ReadFile,
    FileGlobSearch,
    GrepSearch,
    ExecShellCommand,
    WriteFile,
    EditFile,
    GetInfo,
}

impl Builtin {
    /// Every built-in, in llama-server's order.
    pub const ALL: [Builtin; 7] = [
        Builtin::ReadFile,
        Builtin::FileGlobSearch,
        Builtin::GrepSearch,
        Builtin::ExecShellCommand,
        Builtin::WriteFile,
        Builtin::EditFile,
        Builtin::GetInfo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "read_file",
            Builtin::FileGlobSearch => "file_glob_search",
            Builtin::GrepSearch => "grep_search",
            Builtin::ExecShellCommand => "exec_shell_command",
            Builtin::WriteFile => "write_file",
            Builtin::EditFile => "edit_file",
            Builtin::GetInfo => "get_info",
        }
    }

    pub fn named(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    fn display_name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "Read file",
            Builtin::FileGlobSearch => "File search",
            Builtin::GrepSearch => "Grep search",
            Builtin::ExecShellCommand => "Execute shell command",
            Builtin::WriteFile => "Write file",
            Builtin::EditFile => "Edit file",
            Builtin::GetInfo => "Get Runtime Info",
        }
    }

    /// Whether it can change files or run anything.
    fn writes(self) -> bool {
        matches!(
            self,
            Builtin::ExecShellCommand | Builtin::WriteFile | Builtin::EditFile
        )
    }

    pub(crate) fn streams(self) -> bool {
        self == Builtin::ExecShellCommand
    }

    /// Its description, parameters (a JSON object's text) and required
    /// parameters.
    fn schema(self) -> Schema {
        match self {
            Builtin::ReadFile => files::READ_SCHEMA,
            Builtin::WriteFile => files::WRITE_SCHEMA,
            Builtin::EditFile => edit::SCHEMA,
            Builtin::FileGlobSearch => search::GLOB_SCHEMA,
            Builtin::GrepSearch => search::GREP_SCHEMA,
            Builtin::ExecShellCommand => shell::EXEC_SCHEMA,
            Builtin::GetInfo => shell::INFO_SCHEMA,
        }
    }

    /// Its `GET /tools` entry.
    pub fn entry(self) -> ToolEntry {
        let (description, properties, required) = self.schema();
        let properties: Value = serde_json::from_str(properties).unwrap_or_else(|_| json!({}));
        let mut parameters = json!({"type": "object", "properties": properties});
        if !required.is_empty() {
            parameters["required"] = json!(required);
        }
        ToolEntry {
            name: self.name().to_owned(),
            display_name: self.display_name().to_owned(),
            kind: "server".to_owned(),
            write: self.writes(),
            uses_cwd: true,
            streams: self.streams(),
            definition: json!({
                "type": "function",
                "function": {
                    "name": self.name(),
                    "description": description,
                    "parameters": parameters,
                },
            }),
        }
    }

    /// The required parameters' presence and types, before anything runs.
    pub(crate) fn check_params(self, params: &Value) -> Result<(), ToolError> {
        let (_, _, required) = self.schema();
        if !params.is_object() && !params.is_null() {
            return Err(ToolError::param("params", "must be an object"));
        }
        for key in required {
            // `edits` is an array; the others are strings.
            if *key != "edits" {
                crate::params::required_str(params, key)?;
            } else if params.get(key).is_none() {
                return Err(ToolError::param(key, "is required"));
            }
        }
        Ok(())
    }

    pub(crate) fn invoke(
        self,
        params: &Value,
        io: &Target,
        ctx: &CallContext,
        on_chunk: Option<&mut dyn FnMut(&str) -> bool>,
    ) -> Result<Value, ToolError> {
        self.check_params(params)?;
        match self {
            Builtin::ReadFile => files::read(params, io, ctx),
            Builtin::WriteFile => files::write(params, io),
            Builtin::EditFile => edit::edit(params, io),
            Builtin::FileGlobSearch => search::glob(params, io),
            Builtin::GrepSearch => search::grep(params, io),
            Builtin::ExecShellCommand => shell::exec(params, io, on_chunk),
            Builtin::GetInfo => shell::info(io),
        }
    }
}

/// A tool's description, its parameters' JSON-schema properties (as JSON
/// text) and the required ones.
type Schema = (&'static str, &'static str, &'static [&'static str]);

/// A tool's failure, as the tool's answer (HTTP 200).
fn failure(message: impl Into<String>) -> Value {
    json!({"error": message.into()})
}
