//! Tool calls read back out of a model's answer.
//!
//! A module of `lamina-chat` rather than a crate of its own: it is the
//! inverse of rendering `tools` into the prompt, the format is told by the
//! template's source ([`ToolFormat::detect`]) as llama.cpp tells it, and it
//! needs nothing this crate lacks (text and `serde_json`), so it builds and
//! tests without the engine or a GPU; a crate would add a boundary with one
//! user and nothing to hide behind it.
//!
//! [`ToolCallParser`] takes the answer as it is generated and gives back
//! [`Piece`]s in order: text that cannot be part of a call as soon as that
//! is certain, and each call once it is complete. Text that might be the
//! start of a call (part of a marker, a JSON object opening the answer) is
//! held back until it is known, never sent and then retracted. Whatever
//! does not parse as a call (malformed JSON, a marker with no call after
//! it, an answer cut off mid-call) comes back as the text it was: the
//! parser has no error path and never panics on what a model writes.
//!
//! Whitespace next to a call is the format's layout, not content: it is
//! dropped, so `Let me check.\n<tool_call>…` gives the text `Let me
//! check.` and then the call.

mod formats;
mod json;
#[cfg(test)]
mod tests;
mod xml;

use serde_json::{Map, Value};

use formats::{HeadScan, Opener, Outcome};
use json::{Extent, Scan};
use xml::Schemas;
pub use xml::{
    key_reads_back as xml_key_reads_back, name_reads_back as xml_name_reads_back,
    value_is_text as xml_value_is_text,
};

/// How a model writes a tool call, by the chat template it was trained
/// with. These are llama.cpp's classic handlers (`common/chat.cpp` before
/// its template analyser) and its Qwen3-Coder parser, which cover the
/// families of models that call tools in the files people serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Qwen3-Coder, and Qwen3.5 and later: `<tool_call>\n<function=NAME>\n
    /// <parameter=KEY>\nVALUE\n</parameter>\n…</function>\n</tool_call>`,
    /// the values raw text read by the tool's schema (see `xml.rs`); a bare
    /// `<function=NAME>…</function>` too, as Qwen3-Coder sometimes writes.
    QwenXml,
    /// Hermes 2 Pro, Qwen 2.5/3 and the many templates copied from them:
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one tag per
    /// call, text allowed before; also `<function=NAME>{…}</function>`.
    Hermes,
    /// Llama 3.1–3.3: the answer is `{"name": …, "parameters": {…}}`
    /// (optionally `"type": "function"` first, calls separated by `;`), or
    /// `<|python_tag|>` then such JSON, or code for the `python` tool.
    Llama3,
    /// Mistral Nemo and later: `[TOOL_CALLS][{"name": …, "arguments": {…},
    /// "id": …}]`, or `[TOOL_CALLS]NAME[ARGS]{…}` (with `[CALL_ID]ID`
    /// before `[ARGS]` on some models).
    Mistral,
    /// Any other template: llama.cpp's generic JSON, an answer that is
    /// `{"tool_call": {"name", "arguments"}}`, `{"tool_calls": […]}` or
    /// `{"response": "…"}`; a bare `{"name", "arguments"}` object is
    /// accepted too.
    Generic,
}

impl ToolFormat {
    /// The format a template's model writes, from marks only that format's
    /// templates carry (the ones llama.cpp looks for).
    pub fn detect(template_source: &str) -> ToolFormat {
        let has = |s: &str| template_source.contains(s);
        if has("<|start_header_id|>ipython<|end_header_id|>") || has("<|python_tag|>") {
            ToolFormat::Llama3
        } else if has("<tool_call>") && has("<function=") && has("<parameter=") {
            // Before Hermes, whose `<tool_call>` it shares, as llama.cpp checks.
            ToolFormat::QwenXml
        } else if has("<tool_call>") {
            ToolFormat::Hermes
        } else if has("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else {
            ToolFormat::Generic
        }
    }

    /// A short name for logs.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::QwenXml => "qwen-xml",
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Generic => "generic",
        }
    }

    /// Marker texts of this format that a vocabulary may hold as control
    /// tokens. Detokenizing hides control tokens, so whoever feeds the
    /// parser must feed these texts when their tokens are generated.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::QwenXml => &["<tool_call>", "</tool_call>"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            ToolFormat::Generic => &[],
        }
    }
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The id the model wrote (Mistral's formats carry one); the server
    /// makes one up when there is none.
    pub id: Option<String>,
    pub name: String,
    /// Always an object, in the order the model wrote it.
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// The arguments as OpenAI sends them: a JSON string.
    pub fn arguments_json(&self) -> String {
        Value::Object(self.arguments.clone()).to_string()
    }
}

/// A part of the answer, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Call(ToolCall),
    /// Reasoning ([`crate::ReasoningSplitter`]), for whoever reads an
    /// answer for both; the tool-call parser never gives it.
    Reasoning(String),
}

/// Where the parser is in the text held back.
#[derive(Debug)]
enum Stage {
    /// Looking for a call's opener.
    Text,
    /// A call opens at the start of the held text; its head (what comes
    /// before the JSON) has not all arrived.
    Head(Opener),
    /// The call's JSON is arriving.
    Json {
        opener: Opener,
        head: formats::Head,
        scan: Extent,
        /// The first key of a bare JSON object was checked.
        key_checked: bool,
    },
    /// Llama 3.x's `<|python_tag|>` and code: the rest of the answer is
    /// the code, read once it ends.
    Code(Opener),
    /// An XML call ([`ToolFormat::QwenXml`]) is arriving.
    Xml(Opener, xml::Scan),
    /// The JSON was a call; what may close it is arriving.
    Tail {
        outcome: Outcome,
        close: Option<&'static str>,
        /// Where the JSON ended in the held text.
        after: usize,
    },
}

/// The answer, streamed into calls and text. See the module docs.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    /// The request's tools, for the formats whose values they type.
    tools: Schemas,
    /// Text received and not given out yet; a call being read starts at 0.
    held: String,
    stage: Stage,
    /// A JSON object here would open a call: nothing but whitespace has
    /// been given out since the start or the last call.
    json_opens: bool,
    /// Whitespace given out last, kept until it is known not to touch a
    /// call.
    space: String,
    called: bool,
    out: Vec<Piece>,
}

impl ToolCallParser {
    pub fn new(format: ToolFormat) -> Self {
        ToolCallParser {
            format,
            tools: Schemas::default(),
            held: String::new(),
            stage: Stage::Text,
            json_opens: true,
            space: String::new(),
            called: false,
            out: Vec::new(),
        }
    }

    /// The parser, knowing the request's `tools` (OpenAI's shape): the
    /// XML format reads each value by its parameter's schema. The other
    /// formats write JSON and need no schema.
    pub fn with_tools(mut self, tools: &Value) -> Self {
        self.tools = Schemas::new(tools);
        self
    }

    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// Feeds the next text of the answer; returns what became certain.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        self.drive(false);
        std::mem::take(&mut self.out)
    }

    /// The answer ended: everything still held, as calls or as text.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.drive(true);
        if !self.called && !self.space.is_empty() {
            let space = std::mem::take(&mut self.space);
            self.out.push(Piece::Text(space));
        }
        std::mem::take(&mut self.out)
    }

    /// Whether any call was given out.
    pub fn called(&self) -> bool {
        self.called
    }

    fn drive(&mut self, end: bool) {
        loop {
            match std::mem::replace(&mut self.stage, Stage::Text) {
                Stage::Text => match self.find_opener() {
                    Find::Opener(at, opener) => {
                        self.give_text(at);
                        self.stage = match (self.format, opener) {
                            (ToolFormat::QwenXml, Opener::Marker(m)) => {
                                Stage::Xml(opener, xml::Scan::new(m))
                            }
                            _ => Stage::Head(opener),
                        };
                    }
                    Find::Hold(at) if !end => {
                        self.give_text(at);
                        return;
                    }
                    Find::Hold(_) | Find::Nothing => {
                        self.give_text(self.held.len());
                        return;
                    }
                },
                Stage::Head(opener) => match formats::head(self.format, opener, &self.held) {
                    HeadScan::Ready(head) => {
                        self.stage = Stage::Json {
                            opener,
                            head,
                            scan: Extent::default(),
                            key_checked: opener != Opener::Json,
                        }
                    }
                    HeadScan::Code => self.stage = Stage::Code(opener),
                    HeadScan::Partial if !end => {
                        self.stage = Stage::Head(opener);
                        return;
                    }
                    HeadScan::Partial | HeadScan::Invalid => self.not_a_call(opener),
                },
                Stage::Code(opener) if end => {
                    let call = formats::code_call(&self.held[marker_len(opener)..]);
                    self.give_calls(vec![call], self.held.len());
                }
                Stage::Code(opener) => {
                    self.stage = Stage::Code(opener);
                    return;
                }
                Stage::Xml(opener, mut scan) => match scan.advance(&self.held, end) {
                    xml::Step::Done(raw, n) => {
                        let calls = raw.into_iter().map(|c| self.tools.call(c)).collect();
                        self.give_calls(calls, n);
                    }
                    xml::Step::Open => {
                        self.stage = Stage::Xml(opener, scan);
                        return;
                    }
                    xml::Step::Invalid => self.not_a_call(opener),
                },
                Stage::Json {
                    opener,
                    head,
                    mut scan,
                    mut key_checked,
                } => {
                    let json = &self.held[head.json_at..];
                    match scan.advance(json) {
                        Scan::End(n) => {
                            let value = serde_json::from_str::<Value>(&json[..n]).ok();
                            let after = head.json_at + n;
                            let close = head.close;
                            match value.and_then(|v| formats::build(self.format, opener, head, v)) {
                                Some(outcome) => {
                                    self.stage = Stage::Tail {
                                        outcome,
                                        close,
                                        after,
                                    }
                                }
                                None => self.not_a_call(opener),
                            }
                        }
                        Scan::Open if !end => {
                            if !key_checked {
                                match json::first_key(json) {
                                    None => {}
                                    Some(Some(k))
                                        if formats::first_keys(self.format)
                                            .contains(&k.as_str()) =>
                                    {
                                        key_checked = true;
                                    }
                                    Some(_) => {
                                        self.not_a_call(opener);
                                        continue;
                                    }
                                }
                            }
                            self.stage = Stage::Json {
                                opener,
                                head,
                                scan,
                                key_checked,
                            };
                            return;
                        }
                        Scan::Open | Scan::NotJson => self.not_a_call(opener),
                    }
                }
                Stage::Tail {
                    outcome,
                    close,
                    after,
                } => match formats::tail(self.format, close, &self.held[after..], end) {
                    Some(n) => match outcome {
                        Outcome::Calls(calls) => self.give_calls(calls, after + n),
                        Outcome::Text(text) => {
                            self.held.drain(..after + n);
                            self.text(&text);
                        }
                    },
                    None => {
                        self.stage = Stage::Tail {
                            outcome,
                            close,
                            after,
                        };
                        return;
                    }
                },
            }
        }
    }

    /// Where the next call may open in the held text.
    fn find_opener(&self) -> Find {
        let s = self.held.as_str();
        let mut first: Option<(usize, Opener)> = None;
        let mut hold = s.len();
        for &opener in formats::openers(self.format) {
            let at = match opener {
                Opener::Marker(m) => {
                    // A marker cut off at the end of the text so far.
                    if let Some(k) = (1..m.len()).rev().find(|&k| s.ends_with(&m[..k])) {
                        hold = hold.min(s.len() - k);
                    }
                    s.find(m)
                }
                Opener::Json if self.json_opens => {
                    let lead = s.len() - s.trim_start().len();
                    s[lead..].starts_with('{').then_some(lead)
                }
                Opener::Json => None,
            };
            if let Some(at) = at {
                if first.is_none_or(|(f, _)| at < f) {
                    first = Some((at, opener));
                }
            }
        }
        match first {
            Some((at, opener)) => Find::Opener(at, opener),
            None if hold < s.len() => Find::Hold(hold),
            None => Find::Nothing,
        }
    }

    /// Gives out the first `n` held bytes as text.
    fn give_text(&mut self, n: usize) {
        let text: String = self.held.drain(..n).collect();
        self.text(&text);
    }

    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.space.push_str(text);
        let body = self.space.trim_end();
        if body.is_empty() {
            return;
        }
        self.json_opens = false;
        let space = self.space.split_off(body.len());
        let body = std::mem::replace(&mut self.space, space);
        self.out.push(Piece::Text(body));
    }

    /// Gives out calls that took the first `n` held bytes.
    fn give_calls(&mut self, calls: Vec<ToolCall>, n: usize) {
        self.held.drain(..n);
        self.space.clear();
        self.called = true;
        self.json_opens = true;
        self.out.extend(calls.into_iter().map(Piece::Call));
    }

    /// The held text opened like a call but is not one: its opener is
    /// text, and the search goes on after it.
    fn not_a_call(&mut self, opener: Opener) {
        self.stage = Stage::Text;
        let n = match opener {
            Opener::Marker(m) => m.len(),
            Opener::Json => {
                // No JSON opens a call again until text or a call ends this one.
                self.json_opens = false;
                self.held.len() - self.held.trim_start().len() + 1
            }
        };
        self.give_text(n.min(self.held.len()));
        self.json_opens = false;
    }
}

fn marker_len(opener: Opener) -> usize {
    match opener {
        Opener::Marker(m) => m.len(),
        Opener::Json => 0,
    }
}

enum Find {
    /// A call opens here.
    Opener(usize, Opener),
    /// Text from here might open one once more arrives.
    Hold(usize),
    Nothing,
}

/// The pieces of a whole answer (what streaming it gives, joined).
pub fn parse(format: ToolFormat, text: &str) -> Vec<Piece> {
    parse_with(ToolCallParser::new(format), text)
}

/// The pieces of a whole answer, read by `parser`.
pub fn parse_with(mut parser: ToolCallParser, text: &str) -> Vec<Piece> {
    let mut pieces = parser.push(text);
    pieces.extend(parser.finish());
    pieces
}
