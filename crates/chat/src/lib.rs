//! Chat templates: from a conversation to the prompt a model was trained on.
//!
//! A GGUF file stores its chat format as a Jinja template
//! (`tokenizer.chat_template`). [`ChatTemplate`] compiles it once per model
//! and renders it per request the way Hugging Face transformers does, byte
//! for byte: Jinja2's whitespace rules as transformers sets them, Python's
//! spelling of values and its string/dict methods, `tojson` as Python's
//! `json.dumps`, and the globals `raise_exception` and `strftime_now`.
//! Files without a template get one of the [`Builtin`] formats, chosen by
//! [`builtin_for`].
//!
//! Rendering is sandboxed: no file access, a fuel budget that grows with the
//! request up to a ceiling, a wall-clock limit, a recursion limit and an
//! output limit ([`Limits`]); every failure is a [`ChatError`].
//!
//! ```
//! use lamina_chat::{ChatTemplate, RenderOptions};
//! let template = ChatTemplate::new(
//!     "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}",
//!     "<s>",
//!     "</s>",
//! )?;
//! let messages = serde_json::json!([{"role": "user", "content": "Hi"}]);
//! let prompt = template.render(&messages, &RenderOptions::default())?;
//! assert_eq!(prompt, "<|user|>Hi");
//! # Ok::<(), lamina_chat::ChatError>(())
//! ```

mod budget;
mod builtin;
mod environment;
mod error;
mod python;
mod reasoning;
mod template;
mod tool_calls;

pub use builtin::{builtin_for, Builtin};
pub use chrono::NaiveDateTime;
pub use environment::Clock;
pub use error::ChatError;
pub use reasoning::{
    split as split_reasoning, Part, ReasoningFormat, ReasoningSplitter, ThinkTags, COMMAND_R, THINK,
};
pub use template::{ChatTemplate, Limits, Prompt, RenderOptions, TemplateConfig};
pub use tool_calls::{
    parse as parse_tool_calls, xml_key_reads_back, xml_name_reads_back, xml_value_is_text, Piece,
    ToolCall, ToolCallParser, ToolFormat,
};
