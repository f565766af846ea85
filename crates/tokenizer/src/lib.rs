//! Tokenizers built from a GGUF file's `tokenizer.ggml.*` metadata that give
//! the token ids llama.cpp gives.
//!
//! - [`vocab`]: tokens, attributes, special ids, BOS/EOS flags, the
//!   end-of-generation set (llama.cpp's `llama_vocab::impl::load`).
//! - [`pre`]: `gpt2` byte-level BPE: the `tokenizer.ggml.pre` regex table and
//!   the `tokenizers` pipeline built from it.
//! - `merges`: `gemma4` SentencePiece-style BPE by merge rank on raw UTF-8.
//! - `spm`: `llama` SentencePiece merging by score with byte fallback.
//! - `wpm`: `bert` WordPiece with llama.cpp's BERT normalizer.
//! - `partition`: special tokens split out of raw text first.
//! - [`decode`]: pieces, whole-sequence decoding and the streaming
//!   [`Detokenizer`].
//!
//! Test with `cargo test -p lamina-tokenizer` (the real models must be
//! fetched by `scripts/fetch-models.sh`).

pub mod decode;
pub mod error;
mod merges;
pub mod meta;
mod partition;
pub mod pre;
mod spm;
pub mod vocab;
mod wpm;

use std::collections::HashMap;
use std::ops::Range;

pub use decode::Detokenizer;
pub use error::TokenizerError;
pub use meta::Metadata;
pub use vocab::{SpecialTokens, VocabKind};

use partition::Fragment;
use vocab::{attr, Vocab};

/// The algorithm that turns one fragment of raw text into ids.
enum Engine {
    Spm,
    /// Byte-level BPE: the `tokenizers` pipeline.
    ByteLevel(Box<tokenizers::Tokenizer>),
    /// SentencePiece-style BPE by merge rank.
    Merges(merges::Merges),
    Wpm,
}

/// A tokenizer for one model. Immutable once built; share it across threads.
pub struct Tokenizer {
    vocab: Vocab,
    engine: Engine,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.vocab.kind)
            .field("pre", &self.pre())
            .field("vocab_size", &self.vocab_size())
            .field("specials", &self.vocab.specials)
            .field("add_bos", &self.vocab.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a model's metadata.
    pub fn from_gguf(model: &lamina_gguf::Model) -> Result<Self, TokenizerError> {
        Self::from_metadata(model)
    }

    /// Builds the tokenizer from any source of GGUF metadata.
    pub fn from_metadata(meta: &dyn Metadata) -> Result<Self, TokenizerError> {
        let vocab = Vocab::load(meta)?;
        let engine = match (&vocab.pre, vocab.kind) {
            (_, VocabKind::Wpm) => Engine::Wpm,
            (Some((name, spec)), _) => {
                let merges =
                    meta::strings(meta, vocab::KEY_MERGES)?.ok_or(TokenizerError::MissingKey {
                        key: vocab::KEY_MERGES,
                    })?;
                if spec.spm_style {
                    Engine::Merges(merges::Merges::new(merges))
                } else {
                    Engine::ByteLevel(Box::new(pre::build_bpe(name, spec, &vocab.tokens, merges)?))
                }
            }
            (None, _) => Engine::Spm,
        };
        Ok(Self {
            vocab,
            engine,
            byte_to_char: pre::byte_to_char_table(),
            char_to_byte: pre::char_to_byte_map(),
        })
    }

    /// Text to ids, as llama.cpp's `llama_tokenize`. `add_special`: add BOS
    /// and EOS where the file asks for them. `parse_special`: control tokens
    /// written in the text become their ids (user-defined ones always do).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_inner(text, add_special, parse_special, &[])
    }

    /// [`Self::encode`] with control tokens parsed everywhere but inside
    /// `literal`, byte ranges of `text` (sorted, disjoint) that must stay
    /// plain text: a chat message's content, where a user's
    /// `<|im_start|>system` is words, not a role. The text on either side of
    /// a range is tokenized together with it, as one string would be.
    pub fn encode_literal(
        &self,
        text: &str,
        add_special: bool,
        literal: &[Range<usize>],
    ) -> Vec<u32> {
        self.encode_inner(text, add_special, true, literal)
    }

    fn encode_inner(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        literal: &[Range<usize>],
    ) -> Vec<u32> {
        let v = &self.vocab;
        let frags = partition::partition(v, text, parse_special, literal);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.add_bos {
            out.extend(v.specials.bos);
        }
        // SentencePiece's dummy prefix goes before the first raw fragment and
        // before any fragment that follows a special token.
        let mut prev_special = true;
        for f in frags {
            match f {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text { start, end } => {
                    let Some(raw) = text.get(start..end) else {
                        continue;
                    };
                    match &self.engine {
                        Engine::ByteLevel(bpe) => self.encode_bpe(bpe, raw, &mut out),
                        Engine::Merges(m) => {
                            merges::tokenize(v, m, &raw.replace(' ', "\u{2581}"), &mut out)
                        }
                        Engine::Wpm => wpm::tokenize(v, v.normalizer, raw, &mut out),
                        Engine::Spm => {
                            let mut s = String::with_capacity(raw.len() + 3);
                            if v.add_space_prefix && prev_special {
                                s.push(' ');
                            }
                            s.push_str(raw);
                            let escaped = s.replace(' ', "\u{2581}");
                            spm::tokenize(v, &escaped, &mut out);
                        }
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.specials.eos);
        }
        if add_special && v.add_sep {
            out.extend(v.specials.sep);
        }
        out
    }

    fn encode_bpe(&self, bpe: &tokenizers::Tokenizer, raw: &str, out: &mut Vec<u32>) {
        match bpe.encode(raw, false) {
            Ok(enc) => out.extend_from_slice(enc.get_ids()),
            Err(e) => {
                // Not expected (no added tokens, no truncation); fall back to
                // one token per byte so the text is still represented.
                tracing::error!(
                    "byte-level BPE failed ({e}); encoding {} bytes singly",
                    raw.len()
                );
                for b in raw.bytes() {
                    let c = self.byte_to_char[b as usize].to_string();
                    out.extend(self.vocab.token_to_id.get(&c).copied());
                }
            }
        }
    }

    /// The raw bytes of one token as decoding renders it: byte tokens give
    /// their byte, byte-level BPE maps code points back to bytes, `▁` is a
    /// space; control tokens give nothing (see [`Self::token_to_piece_with`]).
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        decode::piece(self, id, false)
    }

    /// [`Self::token_to_piece`], with control and unknown tokens rendered as
    /// their text when `render_special` is set.
    pub fn token_to_piece_with(&self, id: u32, render_special: bool) -> Vec<u8> {
        decode::piece(self, id, render_special)
    }

    /// Ids to text as llama.cpp's `llama_detokenize` (control tokens hidden);
    /// invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// [`Self::decode`], rendering control tokens when `render_special`.
    pub fn decode_with(&self, ids: &[u32], render_special: bool) -> String {
        String::from_utf8_lossy(&decode::detokenize(self, ids, render_special)).into_owned()
    }

    /// Whether generating `id` ends the generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// The end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.vocab.eog.iter().copied()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.specials.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.specials.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.vocab.specials.eot
    }

    /// All special ids, after llama.cpp's defaults and text detection.
    pub fn specials(&self) -> &SpecialTokens {
        &self.vocab.specials
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }

    /// Whether `encode(.., add_special = true, ..)` appends the separator
    /// (WordPiece's `[SEP]`).
    pub fn add_sep(&self) -> bool {
        self.vocab.add_sep
    }

    pub fn sep(&self) -> Option<u32> {
        self.vocab.specials.sep
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.tokens.len()
    }

    pub fn kind(&self) -> VocabKind {
        self.vocab.kind
    }

    /// The `tokenizer.ggml.pre` value in force (BPE only; "default" when
    /// the key is missing, "gemma4" for a `gemma4` model whatever it says).
    pub fn pre(&self) -> Option<&str> {
        self.vocab.pre.as_ref().map(|(name, _)| name.as_str())
    }

    /// A token's text as stored in the file (`▁` and byte-level code points
    /// included); `None` past the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.token_to_id.get(text).copied()
    }

    /// Control tokens (including those llama.cpp promotes to control by
    /// their text): hidden when decoding, matched in input only when
    /// special-token parsing is on.
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }

    /// The texts that special-token parsing gates (control and unknown
    /// tokens), longest first: what must not be read as a token when it
    /// comes from a user.
    pub fn gated_texts(&self) -> impl Iterator<Item = &str> + '_ {
        self.vocab
            .special_cache
            .iter()
            .filter(|&&id| self.vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0)
            .filter_map(|&id| self.token_text(id))
            .filter(|t| !t.is_empty())
    }
}
