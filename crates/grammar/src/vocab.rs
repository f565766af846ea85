//! The model's vocabulary as llguidance sees it: every token's bytes in a
//! `TokTrie`, built once per model from Lamina's own tokenizer (so masks
//! are over the ids the model samples), and the `ParserFactory` that
//! compiles grammars against it.
//!
//! Control tokens (`<|im_end|>`, `<end_of_turn>`) decode to nothing, so
//! they cannot be reached by text; llguidance's convention gives them
//! their text behind a 0xFF byte, which no UTF-8 text contains, so a
//! grammar can name them (`<|im_end|>` in Lark) and no text rule ever
//! matches them. Every end-of-generation id counts as EOS: a grammar that
//! may end allows any of them.

use std::sync::Arc;

use lamina_tokenizer::Tokenizer;
use llguidance::api::ParserLimits;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::ParserFactory;

use crate::error::GrammarError;

/// A vocabulary ready to compile grammars for. Build it once per model
/// ([`Vocab::new`] walks every token) and share it.
pub struct Vocab {
    pub(crate) factory: ParserFactory,
    /// Logits per step: the model's output size, which may exceed the
    /// tokenizer's vocabulary (padded output matrices).
    n_logits: usize,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocab")
            .field("n_logits", &self.n_logits)
            .finish_non_exhaustive()
    }
}

/// llguidance's view of the tokenizer: the trie, and tokenization by it.
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only used by llguidance to force tokens, which is off here (see
    /// `tokenize_is_canonical`): the trie's greedy split is enough.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    /// Greedy splits are not what the model's tokenizer would produce, so
    /// llguidance must not force tokens from them.
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

impl Vocab {
    /// The vocabulary of `tok` for a model with `n_logits` outputs.
    pub fn new(tok: &Tokenizer, n_logits: usize) -> Result<Vocab, GrammarError> {
        let n = tok.vocab_size().max(n_logits);
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let piece = tok.token_to_piece(id);
            let special = tok.is_control(id) || piece.is_empty();
            let word = match tok.token_text(id) {
                Some(text) if special && !text.is_empty() => {
                    let mut w = Vec::with_capacity(text.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(text.as_bytes());
                    w
                }
                // Past the tokenizer (padding rows): no bytes, never allowed.
                _ if special => Vec::new(),
                _ => piece,
            };
            words.push(word);
        }
        let eog: Vec<TokenId> = tok.eog_ids().collect();
        let eos = tok.eos().or_else(|| eog.first().copied()).ok_or_else(|| {
            GrammarError::Vocab(
                "the vocabulary has no end-of-generation token, so no grammar could end".into(),
            )
        })?;
        let n32 =
            u32::try_from(n).map_err(|_| GrammarError::Vocab(format!("{n} tokens is too many")))?;
        let mut info = TokRxInfo::new(n32, eos);
        info.tok_bos = tok.bos();
        info.tok_end_of_turn = tok.eot();
        let mut eos_all = eog;
        if !eos_all.contains(&eos) {
            eos_all.push(eos);
        }
        // TokTrie::from asserts on its input; the sizes above make it hold,
        // and a panic here must not take the engine thread down with it.
        let trie =
            std::panic::catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(&eos_all))
                .map_err(|_| GrammarError::Vocab("building the token trie failed".into()))?;
        let env: TokEnv = Arc::new(Env { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocab(e.to_string()))?;
        // Warnings go to the log through `Constraint`, not to stderr.
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            // Errors name the grammar's fault without dumping its state
            // (and the tokens so far) into a client's error message.
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(Vocab { factory, n_logits })
    }

    /// Logits per step this vocabulary was built for.
    pub fn n_logits(&self) -> usize {
        self.n_logits
    }

    /// The id llguidance gives a special token's text (`<|im_end|>`).
    pub fn special_token(&self, text: &str) -> Option<u32> {
        self.factory.tok_env().tok_trie().get_special_token(text)
    }
}
