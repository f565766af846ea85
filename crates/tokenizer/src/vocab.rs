//! The vocabulary as llama.cpp's `llama_vocab::impl::load` builds it from
//! GGUF metadata: token texts, scores and attributes, the special ids with
//! llama.cpp's per-model defaults, the BOS/EOS flags, the end-of-generation
//! set and the list of special tokens that are split out of raw text.
//!
//! Invariants once built: every id in `specials`, `eog` and `special_cache`
//! is below `tokens.len()`, and `tokens`, `scores`, `attrs` have equal length.

use std::collections::{BTreeSet, HashMap};

use crate::error::TokenizerError;
use crate::meta::{self, Metadata};
use crate::pre::{self, PreSpec};
use crate::wpm::Normalizer;

/// Token attributes, llama.cpp's `llama_token_attr` bits.
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    /// Whitespace before the token in the input is swallowed with it.
    pub const LSTRIP: u16 = 1 << 7;
    /// Whitespace after the token in the input is swallowed with it.
    pub const RSTRIP: u16 = 1 << 8;
}

/// `tokenizer.ggml.token_type` values (gguf.md) mapped to attributes.
fn attr_from_type(t: i32) -> u16 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        // 0 (UNDEFINED) and anything else: no attribute, never rendered.
        _ => 0,
    }
}

/// Which algorithm turns text into ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `llama`: SentencePiece BPE by score with `<0xNN>` byte fallback.
    Spm,
    /// `gpt2`: byte-level BPE by merge rank after a regex pre-split;
    /// `gemma4`: BPE by merge rank on raw UTF-8 with `▁` for spaces.
    Bpe,
    /// `bert`: WordPiece, greedy longest match after BERT normalization.
    Wpm,
}

/// Special token ids; `None` where the file has none (LLAMA_TOKEN_NULL).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

pub(crate) struct Vocab {
    pub kind: VocabKind,
    /// The `tokenizer.ggml.pre` value and its spec (BPE only).
    pub pre: Option<(String, PreSpec)>,
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u16>,
    pub token_to_id: HashMap<String, u32>,
    pub specials: SpecialTokens,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub clean_spaces: bool,
    /// WordPiece appends the separator token (`[SEP]`) after the text.
    pub add_sep: bool,
    /// Spaces are `▁` in the tokens (SentencePiece-style BPE): escaped
    /// before tokenizing, unescaped when decoding.
    pub escape_whitespaces: bool,
    /// WordPiece's normalizer switches.
    pub normalizer: Normalizer,
    /// The longest token text in bytes (bounds WordPiece's search).
    pub max_token_len: usize,
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the
    /// order in which llama.cpp splits them out of raw text.
    pub special_cache: Vec<u32>,
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_SEP: &str = "tokenizer.ggml.add_sep_token";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_SEP: &str = "tokenizer.ggml.seperator_token_id";
const KEY_LOWERCASE: &str = "tokenizer.ggml.normalizer.lowercase";
const KEY_STRIP_ACCENTS: &str = "tokenizer.ggml.normalizer.strip_accents";

/// Texts llama.cpp takes as an end-of-turn token when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts that end generation whatever the file says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Vocab {
    pub fn load(meta: &dyn Metadata) -> Result<Self, TokenizerError> {
        let model =
            meta::string(meta, KEY_MODEL)?.ok_or(TokenizerError::MissingKey { key: KEY_MODEL })?;
        let pre_name = meta::string(meta, KEY_PRE)?;

        let (kind, mut specials, pre) = match model {
            "llama" => (
                VocabKind::Spm,
                SpecialTokens {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    ..SpecialTokens::default()
                },
                None,
            ),
            "gpt2" => {
                let spec = pre::lookup(pre_name)?;
                let bos = if spec.no_bos { None } else { Some(11) };
                (
                    VocabKind::Bpe,
                    // llama.cpp's placeholders until the file's keys are read.
                    SpecialTokens {
                        bos,
                        eos: Some(11),
                        ..SpecialTokens::default()
                    },
                    Some((pre_name.unwrap_or("default").to_owned(), spec)),
                )
            }
            // llama.cpp's defaults; the file's keys usually override them.
            "bert" => (
                VocabKind::Wpm,
                SpecialTokens {
                    bos: Some(101),
                    unk: Some(100),
                    sep: Some(102),
                    pad: Some(0),
                    mask: Some(103),
                    ..SpecialTokens::default()
                },
                None,
            ),
            // BPE whatever `tokenizer.ggml.pre` says: llama.cpp forces the
            // `gemma4` pre-type and has no default special tokens here.
            "gemma4" => (
                VocabKind::Bpe,
                SpecialTokens::default(),
                Some(("gemma4".to_owned(), pre::lookup(Some("gemma4"))?)),
            ),
            "no_vocab" | "none" | "t5" | "rwkv" | "plamo2" | "hybriddna" | "whitespace" => {
                return Err(TokenizerError::UnsupportedModel(model.to_owned()))
            }
            other => return Err(TokenizerError::UnknownModel(other.to_owned())),
        };

        let (mut add_bos, mut add_space_prefix, clean_spaces) = match (&pre, kind) {
            (None, VocabKind::Wpm) => (true, false, true),
            (None, _) => (true, true, false),
            (Some((_, spec)), _) => (spec.add_bos, false, spec.clean_spaces),
        };
        let escape_whitespaces = pre.as_ref().is_some_and(|(_, spec)| spec.spm_style);
        let mut add_eos = false;
        if let Some(v) = meta::flag(meta, KEY_ADD_PREFIX)? {
            add_space_prefix = v;
        }

        let words = meta::strings(meta, KEY_TOKENS)?
            .ok_or(TokenizerError::MissingKey { key: KEY_TOKENS })?;
        let n = words.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        let scores = match meta::scores(meta, KEY_SCORES)? {
            Some(s) if s.len() < n => {
                return Err(TokenizerError::TooShort {
                    key: KEY_SCORES,
                    found: s.len(),
                    tokens: n,
                })
            }
            Some(mut s) => {
                s.truncate(n);
                s
            }
            None => vec![0.0; n],
        };
        let mut attrs = match meta::ints(meta, KEY_TYPES)? {
            Some(t) if t.len() < n => {
                return Err(TokenizerError::TooShort {
                    key: KEY_TYPES,
                    found: t.len(),
                    tokens: n,
                })
            }
            Some(t) => t[..n].iter().map(|&t| attr_from_type(t)).collect(),
            None => vec![attr::NORMAL; n],
        };

        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, w) in words.iter().enumerate() {
            let id = i as u32;
            let text = if w.is_empty() {
                tracing::warn!("{KEY_TOKENS}: empty token at index {i}");
                format!("[EMPTY_{i}]")
            } else {
                w.clone()
            };
            if let Some(&first) = token_to_id.get(&text) {
                return Err(TokenizerError::DuplicateToken {
                    text,
                    first,
                    second: id,
                });
            }
            token_to_id.insert(text.clone(), id);
            tokens.push(text);
        }

        read_special_ids(meta, &mut specials, n)?;

        if let Some(v) = meta::flag(meta, KEY_ADD_BOS)? {
            add_bos = v;
        }
        if let Some(v) = meta::flag(meta, KEY_ADD_EOS)? {
            add_eos = v;
        }
        // llama.cpp adds BOS to Gemma 4 prompts whatever the file says.
        if escape_whitespaces {
            add_bos = true;
        }
        let mut add_sep = meta::flag(meta, KEY_ADD_SEP)?.unwrap_or(false);
        if kind == VocabKind::Wpm {
            // llama.cpp's WordPiece ignores the flags: with special tokens
            // on it writes BOS ([CLS]) and the separator ([SEP]), whichever
            // of them exist.
            add_bos = specials.bos.is_some();
            add_eos = false;
            add_sep = specials.sep.is_some();
        } else {
            for (flag, id, flag_key, id_key) in [
                (add_bos, specials.bos, KEY_ADD_BOS, KEY_BOS),
                (add_eos, specials.eos, KEY_ADD_EOS, KEY_EOS),
                (add_sep, specials.sep, KEY_ADD_SEP, KEY_SEP),
            ] {
                if flag && id.is_none() {
                    return Err(TokenizerError::MissingSpecial { flag_key, id_key });
                }
            }
            // Only WordPiece writes the separator itself.
            add_sep = false;
        }
        // BERT's normalizer: lowercasing on unless the file says otherwise,
        // accent stripping following it unless set on its own.
        let lowercase = meta::flag(meta, KEY_LOWERCASE)?.unwrap_or(true);
        let normalizer = Normalizer {
            lowercase,
            strip_accents: meta::flag(meta, KEY_STRIP_ACCENTS)?.unwrap_or(lowercase),
        };
        let max_token_len = tokens.iter().map(String::len).max().unwrap_or(0);

        detect_by_text(&tokens, &mut attrs, &mut specials);
        let eog = build_eog(&tokens, &mut attrs, &specials);

        let mut special_cache: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        // llama.cpp sorts by length only (unstable); ties by id keep ours deterministic.
        special_cache.sort_by(|&a, &b| {
            tokens[b as usize]
                .len()
                .cmp(&tokens[a as usize].len())
                .then(a.cmp(&b))
        });

        apply_model_quirks(meta, &token_to_id, &mut attrs, &special_cache)?;

        Ok(Self {
            kind,
            pre,
            tokens,
            scores,
            attrs,
            token_to_id,
            specials,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            add_sep,
            escape_whitespaces,
            normalizer,
            max_token_len,
            eog,
            special_cache,
        })
    }

    pub fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// The token for byte `b` in an SPM vocabulary: `<0xNN>`, else the
    /// one-byte string (llama.cpp's `byte_to_token`).
    pub fn spm_byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        if let Some(&id) = self.token_to_id.get(&hex) {
            return Some(id);
        }
        if b.is_ascii() {
            return self.token_to_id.get(&(b as char).to_string()).copied();
        }
        None
    }
}

/// Per-model token attributes llama.cpp sets by name because files lack
/// them: Phi-3 swallows whitespace after its special tokens.
fn apply_model_quirks(
    meta: &dyn Metadata,
    token_to_id: &HashMap<String, u32>,
    attrs: &mut [u16],
    special_cache: &[u32],
) -> Result<(), TokenizerError> {
    let name = meta::string(meta, "general.name")?
        .unwrap_or_default()
        .to_ascii_lowercase();
    if !(name.contains("phi-3") || name.contains("phi3")) {
        return Ok(());
    }
    for &id in special_cache {
        attrs[id as usize] |= attr::RSTRIP;
    }
    let mut set = |text: &str, on: bool| {
        if let Some(&id) = token_to_id.get(text) {
            let a = &mut attrs[id as usize];
            *a = if on {
                *a | attr::RSTRIP
            } else {
                *a & !attr::RSTRIP
            };
        }
    };
    set("</s>", true);
    for t in ["<unk>", "<s>", "<|endoftext|>"] {
        set(t, false);
    }
    Ok(())
}

/// Reads the special-id keys over the defaults. Out-of-range ids are
/// disabled (defaults) or ignored (file values) with a warning, as llama.cpp.
fn read_special_ids(
    meta: &dyn Metadata,
    s: &mut SpecialTokens,
    n: usize,
) -> Result<(), TokenizerError> {
    for id in [&mut s.bos, &mut s.eos, &mut s.unk] {
        if id.is_some_and(|v| v as usize >= n) {
            *id = None;
        }
    }
    type Slot = fn(&mut SpecialTokens) -> &mut Option<u32>;
    // llama.cpp's order: the deprecated FIM keys come last and win.
    let keys: [(&'static str, Slot); 17] = [
        (KEY_BOS, |s| &mut s.bos),
        (KEY_EOS, |s| &mut s.eos),
        ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
        ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
        ("tokenizer.ggml.unknown_token_id", |s| &mut s.unk),
        (KEY_SEP, |s| &mut s.sep),
        ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
        ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
        ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
        ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
        ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
        ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
        ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
        ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
        ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
        ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
        ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
    ];
    for (key, slot) in keys {
        let Some(v) = meta::int(meta, key)? else {
            continue;
        };
        match u32::try_from(v) {
            Ok(id) if (id as usize) < n => *slot(s) = Some(id),
            _ => tracing::warn!("{key} = {v} is outside the vocabulary of {n}; ignored"),
        }
    }
    Ok(())
}

/// llama.cpp's text-based detection of EOT/EOM/FIM tokens the file does not
/// name, and of unused control tokens. Detected tokens become CONTROL.
/// llama.cpp walks a hash map, so which of several candidates wins is
/// unspecified there; here the lowest id wins.
fn detect_by_text(tokens: &[String], attrs: &mut [u16], s: &mut SpecialTokens) {
    for (i, text) in tokens.iter().enumerate() {
        let id = i as u32;
        let t = text.as_str();
        for (slot, texts) in [
            (&mut s.eot, EOT_TEXTS),
            (&mut s.eom, EOM_TEXTS),
            (&mut s.fim_pre, FIM_PRE_TEXTS),
            (&mut s.fim_suf, FIM_SUF_TEXTS),
            (&mut s.fim_mid, FIM_MID_TEXTS),
            (&mut s.fim_pad, FIM_PAD_TEXTS),
            (&mut s.fim_rep, FIM_REP_TEXTS),
            (&mut s.fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_none() && texts.contains(&t) {
                *slot = Some(id);
                force_control(attrs, id, t);
            }
        }
    }
    for (a, text) in attrs.iter_mut().zip(tokens) {
        if *a & attr::CONTROL != 0 && text.contains("unused") {
            *a |= attr::UNUSED;
        }
    }
}

fn force_control(attrs: &mut [u16], id: u32, text: &str) {
    let a = &mut attrs[id as usize];
    if *a & attr::CONTROL == 0 {
        tracing::warn!(
            "control-looking token {id} {text:?} was not control-type; treating it as control"
        );
        *a |= attr::CONTROL;
    }
}

/// The end-of-generation set: FIM pad/repo/sep, every token whose text is in
/// [`EOG_TEXTS`], and the eos/eot/eom ids, less llama.cpp's two workarounds.
fn build_eog(tokens: &[String], attrs: &mut [u16], s: &SpecialTokens) -> BTreeSet<u32> {
    let mut eog: BTreeSet<u32> = [s.fim_pad, s.fim_rep, s.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for (i, text) in tokens.iter().enumerate() {
        let t = text.as_str();
        if EOG_TEXTS.contains(&t) {
            eog.insert(i as u32);
            force_control(attrs, i as u32, t);
        }
        // gpt-oss: these structure tokens are always rendered.
        if matches!(
            t,
            "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
        ) {
            attrs[i] = attr::USER_DEFINED;
        }
    }
    eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());

    let text_of = |id: u32| tokens[id as usize].as_str();
    let has =
        |eog: &BTreeSet<u32>, want: &[&str]| eog.iter().any(|&id| want.contains(&text_of(id)));
    // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
    if let Some(end) = eog.iter().copied().find(|&id| text_of(id) == "<|end|>") {
        let harmony = has(&eog, &["<|return|>"]) && has(&eog, &["<|call|>", "<|calls|>"]);
        let solar = has(&eog, &["<|call|>", "<|calls|>"]) && has(&eog, &["<|flush|>"]);
        if harmony || solar {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    // gemma4 / paddleocr: "</s>" is ordinary text there.
    if has(&eog, &["<|tool_response>"]) {
        if let Some(s_id) = eog.iter().copied().find(|&id| text_of(id) == "</s>") {
            eog.remove(&s_id);
            attrs[s_id as usize] = attr::NORMAL;
        }
    }
    eog
}
