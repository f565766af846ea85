//! Reasoning ("thinking") read out of a model's answer, as llama-server
//! returns it.
//!
//! Models trained to think first (DeepSeek-R1, Qwen3, QwQ, SmolLM3, GLM …)
//! write `<think>…</think>` before their answer; Command R7B writes
//! `<|START_THINKING|>…<|END_THINKING|>`. [`ThinkTags::detect`] tells from a
//! chat template's source which pair its model writes, and whether it
//! writes one at all: a template is thinking-capable when its source holds
//! either tag of a pair. llama.cpp's current analyser finds the same
//! templates by rendering variants and diffing them; every template in its
//! test corpus (and in this repository's) that it finds capable names its
//! tags in the source, because a template that shows or suppresses
//! reasoning has to write them. A template that reads `enable_thinking` but
//! writes no tag is not capable here: there would be no way to tell the
//! reasoning from the answer.
//!
//! [`ReasoningSplitter`] takes the answer as it is generated and gives back
//! [`Part`]s: the text of a leading think block as reasoning, everything
//! after it as content. Only a block at the start of the answer is
//! reasoning (llama.cpp's rule: the block is optional and leads); when the
//! prompt itself ends inside an open block (DeepSeek-R1's and QwQ's
//! templates write `<think>\n` after the assistant header), the answer
//! starts as reasoning. An answer cut off inside the block is reasoning to
//! its end. Whitespace just inside the tags and between the block and the
//! answer is layout, not text, and is dropped, so `<think>\nHmm.\n</think>\n\nHi`
//! gives the reasoning `Hmm.` and the content `Hi`. Text that might be a
//! tag being written is held until it is known, never sent and then
//! retracted.

/// The tags that open and close a model's reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkTags {
    pub open: &'static str,
    pub close: &'static str,
}

/// DeepSeek-R1, Qwen3, QwQ, SmolLM3, GLM, MiniMax, Granite 3.3 …
pub const THINK: ThinkTags = ThinkTags {
    open: "<think>",
    close: "</think>",
};

/// Cohere's Command R7B.
pub const COMMAND_R: ThinkTags = ThinkTags {
    open: "<|START_THINKING|>",
    close: "<|END_THINKING|>",
};

impl ThinkTags {
    /// The tags a template's model writes its reasoning in, or `None` when
    /// the template is not thinking-capable (see the module docs).
    pub fn detect(template_source: &str) -> Option<ThinkTags> {
        [COMMAND_R, THINK]
            .into_iter()
            .find(|t| template_source.contains(t.open) || template_source.contains(t.close))
    }

    /// Whether a rendered prompt ends inside an open block, so that the
    /// answer starts as reasoning: the prompt, less trailing whitespace,
    /// ends with the open tag.
    pub fn opens_in(&self, prompt: &str) -> bool {
        prompt.trim_end().ends_with(self.open)
    }
}

/// How reasoning is returned (llama-server's `--reasoning-format` and a
/// request's `reasoning_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// Left in the content as the model wrote it.
    None,
    /// As [`ReasoningFormat::Deepseek`] (llama-server's default).
    #[default]
    Auto,
    /// Taken out of the content into `reasoning_content`, in stream deltas
    /// too.
    Deepseek,
    /// `reasoning_content` filled, and the block also left in the content;
    /// streams carry it in the content only.
    DeepseekLegacy,
}

impl ReasoningFormat {
    /// The format by llama-server's name for it.
    pub fn from_name(name: &str) -> Option<ReasoningFormat> {
        Some(match name {
            "none" => ReasoningFormat::None,
            "auto" => ReasoningFormat::Auto,
            "deepseek" => ReasoningFormat::Deepseek,
            "deepseek-legacy" => ReasoningFormat::DeepseekLegacy,
            _ => return None,
        })
    }

    /// The names [`Self::from_name`] takes, for error messages.
    pub const NAMES: &'static str = "none, auto, deepseek, deepseek-legacy";

    /// Whether reasoning is read out of the answer at all.
    pub fn extracts(self) -> bool {
        self != ReasoningFormat::None
    }
}

/// A part of the answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace so far: a block may still open.
    Start,
    /// Inside the block; `fresh` while nothing but whitespace came in it.
    Inside { fresh: bool },
    /// After the block (or there was none); `fresh` while nothing but
    /// whitespace followed the block.
    After { fresh: bool },
}

/// The answer, streamed into reasoning and content. See the module docs.
#[derive(Debug)]
pub struct ReasoningSplitter {
    tags: ThinkTags,
    state: State,
    /// Text received and not given out yet.
    held: String,
}

impl ReasoningSplitter {
    /// A splitter for an answer to a prompt that `opened` a block or not
    /// ([`ThinkTags::opens_in`]).
    pub fn new(tags: ThinkTags, opened: bool) -> Self {
        ReasoningSplitter {
            tags,
            state: if opened {
                State::Inside { fresh: true }
            } else {
                State::Start
            },
            held: String::new(),
        }
    }

    /// Feeds the next text of the answer; returns what became certain.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.drive(false, &mut out);
        out
    }

    /// The answer ended: everything still held.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        self.drive(true, &mut out);
        out
    }

    fn drive(&mut self, end: bool, out: &mut Vec<Part>) {
        loop {
            match self.state {
                State::Start => {
                    let body = self.held.trim_start();
                    if let Some(rest) = body.strip_prefix(self.tags.open) {
                        self.held = rest.to_owned();
                        self.state = State::Inside { fresh: true };
                    } else if !end && self.tags.open.starts_with(body) {
                        // Whitespace, or the open tag being written.
                        return;
                    } else {
                        // No block: the answer is content, as written.
                        self.state = State::After { fresh: false };
                    }
                }
                State::Inside { fresh } => {
                    if fresh {
                        let lead = self.held.len() - self.held.trim_start().len();
                        self.held.drain(..lead);
                        if self.held.is_empty() {
                            return;
                        }
                        // A model may write the open tag the prompt
                        // already opened; it is not reasoning.
                        if let Some(rest) = self.held.strip_prefix(self.tags.open) {
                            self.held = rest.to_owned();
                            continue;
                        }
                        if !end && self.tags.open.starts_with(self.held.as_str()) {
                            return;
                        }
                        self.state = State::Inside { fresh: false };
                    }
                    if let Some(at) = self.held.find(self.tags.close) {
                        let reasoning = self.held[..at].trim_end().to_owned();
                        self.held.drain(..at + self.tags.close.len());
                        push(out, Part::Reasoning(reasoning));
                        self.state = State::After { fresh: true };
                        continue;
                    }
                    // Hold trailing whitespace (it may end the block) and
                    // whatever may be the close tag being written.
                    let keep = if end {
                        self.held.len() - self.held.trim_end().len()
                    } else {
                        held_back(&self.held, self.tags.close)
                    };
                    let n = self.held.len() - keep;
                    let reasoning: String = self.held.drain(..n).collect();
                    push(out, Part::Reasoning(reasoning));
                    if end {
                        self.held.clear();
                    }
                    return;
                }
                State::After { fresh } => {
                    if fresh {
                        let lead = self.held.len() - self.held.trim_start().len();
                        self.held.drain(..lead);
                        if self.held.is_empty() {
                            return;
                        }
                        self.state = State::After { fresh: false };
                    }
                    let content = std::mem::take(&mut self.held);
                    push(out, Part::Content(content));
                    return;
                }
            }
        }
    }
}

/// How many bytes at the end of `s` to hold back inside a block: any
/// proper prefix of `close` that `s` ends with (the tag being written),
/// and the whitespace before it (which the tag would make layout).
fn held_back(s: &str, close: &str) -> usize {
    let partial = (1..close.len())
        .rev()
        .find(|&k| close.is_char_boundary(k) && s.ends_with(&close[..k]))
        .unwrap_or(0);
    let before = &s[..s.len() - partial];
    partial + (before.len() - before.trim_end().len())
}

/// Appends a part, joining it to the last one of its kind and dropping
/// empty text.
fn push(out: &mut Vec<Part>, part: Part) {
    let text = match &part {
        Part::Reasoning(t) | Part::Content(t) => t,
    };
    if text.is_empty() {
        return;
    }
    match (out.last_mut(), part) {
        (Some(Part::Reasoning(a)), Part::Reasoning(b)) => a.push_str(&b),
        (Some(Part::Content(a)), Part::Content(b)) => a.push_str(&b),
        (_, part) => out.push(part),
    }
}

/// The reasoning and the content of a whole answer (what streaming it
/// gives, joined); the reasoning is `None` when the answer had no block.
pub fn split(tags: ThinkTags, opened: bool, text: &str) -> (Option<String>, String) {
    let mut s = ReasoningSplitter::new(tags, opened);
    let mut parts = s.push(text);
    parts.extend(s.finish());
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for p in parts {
        match p {
            Part::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
            Part::Content(t) => content.push_str(&t),
        }
    }
    (reasoning, content)
}

#[cfg(test)]
mod tests;
