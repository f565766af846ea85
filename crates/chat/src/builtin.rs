//! Templates for GGUF files that carry no `tokenizer.chat_template`.
//!
//! As llama.cpp does, the format is guessed from the architecture name and
//! the special tokens the vocabulary holds; ChatML is the last resort. Each
//! template is a `.jinja` file under `templates/`, rendered by the same
//! environment as a file's own template.

/// A built-in chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// `<start_of_turn>user\n…<end_of_turn>\n` (Gemma 1–3).
    Gemma,
    /// `<|start_header_id|>user<|end_header_id|>\n\n…<|eot_id|>` (Llama 3.x).
    Llama3,
    /// `[INST] … [/INST]` (Mistral).
    Mistral,
    /// `<|im_start|>user\n…<|im_end|>\n`.
    ChatMl,
    /// `<|user|>\n…<|end|>\n` (Phi-3, Phi-3.5).
    Phi3,
    /// `<|START_OF_TURN_TOKEN|><|USER_TOKEN|>…<|END_OF_TURN_TOKEN|>` (Command-R).
    CommandR,
}

impl Builtin {
    pub const ALL: [Builtin; 6] = [
        Builtin::ChatMl,
        Builtin::Llama3,
        Builtin::Gemma,
        Builtin::Mistral,
        Builtin::Phi3,
        Builtin::CommandR,
    ];

    /// The format llama.cpp's `--chat-template NAME` names, for the names
    /// Lamina has a template of.
    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The Jinja source of this format.
    pub fn source(self) -> &'static str {
        match self {
            Builtin::Gemma => include_str!("../templates/gemma.jinja"),
            Builtin::Llama3 => include_str!("../templates/llama3.jinja"),
            Builtin::Mistral => include_str!("../templates/mistral.jinja"),
            Builtin::ChatMl => include_str!("../templates/chatml.jinja"),
            Builtin::Phi3 => include_str!("../templates/phi3.jinja"),
            Builtin::CommandR => include_str!("../templates/command-r.jinja"),
        }
    }

    /// A short name for logs and `/props`.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Gemma => "gemma",
            Builtin::Llama3 => "llama3",
            Builtin::Mistral => "mistral",
            Builtin::ChatMl => "chatml",
            Builtin::Phi3 => "phi3",
            Builtin::CommandR => "command-r",
        }
    }
}

/// Picks the built-in format for a file without a template, from its
/// `general.architecture` and a lookup of token texts in its vocabulary.
///
/// The turn markers decide when the vocabulary has them as tokens; the
/// architecture name decides for Gemma and Mistral files whose markers are
/// plain text; anything else gets ChatML.
pub fn builtin_for(arch: &str, has_token: impl Fn(&str) -> bool) -> Builtin {
    if arch.starts_with("gemma") || has_token("<start_of_turn>") {
        Builtin::Gemma
    } else if has_token("<|start_header_id|>") && has_token("<|eot_id|>") {
        Builtin::Llama3
    } else if has_token("<|im_start|>") {
        Builtin::ChatMl
    } else if arch == "phi3" || (has_token("<|assistant|>") && has_token("<|end|>")) {
        Builtin::Phi3
    } else if has_token("<|START_OF_TURN_TOKEN|>") && has_token("<|CHATBOT_TOKEN|>") {
        Builtin::CommandR
    } else if has_token("[INST]") || arch.starts_with("mistral") {
        Builtin::Mistral
    } else {
        Builtin::ChatMl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in Builtin::ALL {
            assert_eq!(Builtin::from_name(b.name()), Some(b));
        }
        assert_eq!(Builtin::from_name("vicuna"), None);
    }

    #[test]
    fn picks_by_architecture_then_vocabulary() {
        let none = |_: &str| false;
        assert_eq!(builtin_for("gemma3", none), Builtin::Gemma);
        assert_eq!(builtin_for("mistral3", none), Builtin::Mistral);
        assert_eq!(builtin_for("llama", none), Builtin::ChatMl);
        assert_eq!(
            builtin_for("llama", |t| t == "<|start_header_id|>" || t == "<|eot_id|>"),
            Builtin::Llama3
        );
        assert_eq!(
            builtin_for("qwen2", |t| t == "<|im_start|>"),
            Builtin::ChatMl
        );
        assert_eq!(builtin_for("llama", |t| t == "[INST]"), Builtin::Mistral);
        assert_eq!(builtin_for("phi3", none), Builtin::Phi3);
        assert_eq!(
            builtin_for("command-r", |t| t == "<|START_OF_TURN_TOKEN|>"
                || t == "<|CHATBOT_TOKEN|>"),
            Builtin::CommandR
        );
    }
}
