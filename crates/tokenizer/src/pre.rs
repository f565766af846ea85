//! Byte-level BPE for `gpt2` vocabularies: the table from
//! `tokenizer.ggml.pre` to llama.cpp's pre-tokenizer regexes and per-type
//! flags (`src/llama-vocab.cpp`, `llm_tokenizer_bpe` and `impl::load`), the
//! GPT-2 byte↔code-point map, and the `tokenizers` pipeline built from them.
//!
//! llama.cpp applies its regex list in order, each one splitting every piece
//! the previous ones produced and keeping matched and unmatched text alike;
//! that is a `Sequence` of `Split(Regex, Isolated)` pre-tokenizers. Its
//! hand-written GPT-2 and Llama-3 splitters implement the same regexes, so
//! the regexes themselves are used here. The regexes are llama.cpp's adapted
//! ones (case-insensitive groups spelled out), not the HF originals.

use std::collections::HashMap;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use crate::error::TokenizerError;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const UFAKZEKA: &str =
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const MINICPM5: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const PORO: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
/// CJK ideographs, the ranges DeepSeek's tokenizers split out.
const DEEPSEEK_CJK: &str = "[一-龥ࠀ-一가-퟿]+";
/// DeepSeek LLM's letters: llama.cpp's list of cased-letter ranges,
/// transcribed character for character.
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
/// DeepSeek LLM's ASCII and full-width punctuation.
const DEEPSEEK_LLM_PUNCT: &str = "\\s?[!-/:-~！-／：-～‘-‟\u{3000}-。]+";

/// How one `tokenizer.ggml.pre` value tokenizes, as llama.cpp's loader sets it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PreSpec {
    /// The llama.cpp name of the family (for messages).
    pub family: &'static str,
    pub regexes: &'static [&'static str],
    /// `clean_spaces`: decode drops the space before `?!.,` and some
    /// contractions (HF `clean_up_tokenization_spaces`).
    pub clean_spaces: bool,
    /// A whole pre-token that is itself in the vocabulary is emitted as is.
    pub ignore_merges: bool,
    /// The family's default for `add_bos` (the file's flag still wins).
    pub add_bos: bool,
    /// The family has no BOS token at all (chatglm).
    pub no_bos: bool,
    /// SentencePiece-style BPE (llama.cpp's GEMMA4 pre-type): spaces become
    /// `▁`, merges run on raw UTF-8 (no GPT-2 byte map) over runs of
    /// newlines and of other text, a newline run that is a token stays
    /// whole, and BOS is always added. `regexes` is unused then.
    pub spm_style: bool,
}

const fn spec(family: &'static str, regexes: &'static [&'static str]) -> PreSpec {
    PreSpec {
        family,
        regexes,
        clean_spaces: true,
        ignore_merges: false,
        add_bos: false,
        no_bos: false,
        spm_style: false,
    }
}

/// Pre-tokenizer names llama.cpp knows but whose splitting Lamina does not
/// reproduce yet (custom C++ splitters, or regexes not yet transcribed).
const KNOWN_UNSUPPORTED: &[&str] = &[
    "deepseek-v3",
    "spark2_5",
    "youtu",
    "jais-2",
    "sarvam-moe",
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "whitespace",
    "exaone-moe",
    "chameleon",
    "granite-embed-multi-97m",
    "tiny_aya",
    "cohere2moe",
    "superbpe",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "seed-coder",
    "hunyuan-dense",
    "hy_v4",
    "joyai-llm",
    "kimi-k2",
    "afmoe",
];

/// The spec for a `tokenizer.ggml.pre` value (`None`: the key is absent,
/// which llama.cpp treats as "default" with a loud warning).
pub(crate) fn lookup(pre: Option<&str>) -> Result<PreSpec, TokenizerError> {
    const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"];
    const STARCODER: &[&str] = &[r"\p{N}", GPT2];
    let Some(name) = pre else {
        tracing::warn!(
            "tokenizer.ggml.pre is missing: using the 'default' pre-tokenizer; \
             generation quality will be degraded (regenerate the model file)"
        );
        return Ok(spec("default", DEFAULT));
    };
    let s = match name {
        "default" => spec("default", DEFAULT),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreSpec {
            ignore_merges: true,
            add_bos: true,
            ..spec("llama3", &[LLAMA3])
        },
        "dbrx" | "smaug-bpe" => spec("llama3", &[LLAMA3]),
        "minicpm5" => PreSpec {
            ignore_merges: true,
            ..spec("minicpm5", &[r"\p{N}{1,3}", MINICPM5])
        },
        "deepseek-coder" => PreSpec {
            clean_spaces: false,
            ..spec(
                "deepseek-coder",
                &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"],
            )
        },
        "deepseek-llm" => PreSpec {
            clean_spaces: false,
            ..spec(
                "deepseek-llm",
                &[
                    "[\r\n]",
                    DEEPSEEK_LLM_LETTERS,
                    DEEPSEEK_LLM_PUNCT,
                    // `$` is the end of each piece the earlier regexes left,
                    // as in llama.cpp, which runs each regex piece by piece.
                    r"\s+$",
                    DEEPSEEK_CJK,
                    r"\p{N}+",
                ],
            )
        },
        // Also the pre-type llama.cpp forces for `tokenizer.ggml.model = gemma4`.
        "gemma4" | "granite-embed-multi-311m" => PreSpec {
            add_bos: true,
            spm_style: true,
            ..spec("gemma4", &[])
        },
        "falcon" => spec(
            "falcon",
            &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
        ),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "mpt" | "olmo" | "jais" => {
            spec("gpt2", &[GPT2])
        }
        "trillion" | "granite-docling" => PreSpec {
            clean_spaces: false,
            ..spec("gpt2", &[GPT2])
        },
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            spec("starcoder", STARCODER)
        }
        "smollm" | "command-r" => PreSpec {
            clean_spaces: false,
            ..spec("starcoder", STARCODER)
        },
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => PreSpec {
            clean_spaces: false,
            ..spec("qwen2", &[QWEN2])
        },
        "megrez" | "stablelm2" => spec("qwen2", &[QWEN2]),
        "grok-2" => PreSpec {
            clean_spaces: false,
            ..spec("grok-2", &[QWEN2])
        },
        "qwen35" => PreSpec {
            clean_spaces: false,
            ..spec("qwen35", &[QWEN35])
        },
        "poro-chat" => PreSpec {
            clean_spaces: false,
            ..spec("poro", &[PORO])
        },
        "bloom" | "gpt3-finnish" => spec("poro", &[PORO]),
        "viking" => PreSpec {
            clean_spaces: false,
            ..spec("viking", &[PORO, r"\p{N}"])
        },
        "glm4" | "chatglm-bpe" => PreSpec {
            no_bos: true,
            ..spec("chatglm4", &[LLAMA3])
        },
        "tekken" => PreSpec {
            clean_spaces: false,
            ignore_merges: true,
            add_bos: true,
            ..spec("tekken", &[TEKKEN])
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => PreSpec {
            clean_spaces: false,
            ..spec("gpt-4o", &[GPT4O])
        },
        "ufakzeka" => PreSpec {
            clean_spaces: false,
            ..spec("ufakzeka", &[UFAKZEKA])
        },
        "laguna" => PreSpec {
            clean_spaces: false,
            ..spec("laguna", &[r"[^\n]+|[\n]+", QWEN2])
        },
        other if KNOWN_UNSUPPORTED.contains(&other) => {
            return Err(TokenizerError::UnsupportedPre(other.to_owned()))
        }
        other => return Err(TokenizerError::UnknownPre(other.to_owned())),
    };
    Ok(s)
}

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes stand for themselves,
/// the other 68 bytes take code points from U+0100 upwards in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let cp = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every value here is below U+0144, a valid scalar value.
        *slot = char::from_u32(cp).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    table
}

/// The inverse of [`byte_to_char_table`].
pub(crate) fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// The `tokenizers` pipeline: `Sequence[Split(regex, Isolated)…,
/// ByteLevel(add_prefix_space=false, use_regex=false)]` and a BPE model over
/// the file's vocabulary and merges. No normalizer: llama.cpp applies none.
pub(crate) fn build_bpe(
    pre_name: &str,
    spec: &PreSpec,
    tokens: &[String],
    merges: &[String],
) -> Result<Tokenizer, TokenizerError> {
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut pairs = Vec::with_capacity(merges.len());
    let mut dropped = 0usize;
    for m in merges {
        // llama.cpp splits at the first space after the first byte, so a
        // left part may itself start with a space.
        let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
            dropped += 1;
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        // The tokenizers crate refuses merges whose parts or result are not
        // in the vocabulary; llama.cpp never produces a token from those
        // either, so leaving them out keeps ranks in the same order.
        let whole = format!("{a}{b}");
        if vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&whole) {
            pairs.push((a.to_owned(), b.to_owned()));
        } else {
            dropped += 1;
        }
    }
    if dropped > 0 {
        tracing::warn!("tokenizer.ggml.merges: {dropped} entries unusable and ignored");
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Bpe(e.to_string()))?;

    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for re in spec.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Regex {
            pre: pre_name.to_owned(),
            message: e.to_string(),
        })?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());

    let mut tk = Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2s() {
        let t = byte_to_char_table();
        assert_eq!(t[b'A' as usize], 'A');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0xAD], 'Ń');
        let inv = char_to_byte_map();
        assert_eq!(inv.len(), 256);
        for (b, c) in t.iter().enumerate() {
            assert_eq!(inv[c] as usize, b);
        }
    }

    #[test]
    fn every_supported_regex_compiles() {
        let names = [
            "default",
            "llama3",
            "dbrx",
            "minicpm5",
            "deepseek-coder",
            "deepseek-llm",
            "falcon",
            "gpt-2",
            "trillion",
            "starcoder",
            "smollm",
            "qwen2",
            "megrez",
            "grok-2",
            "qwen35",
            "poro-chat",
            "viking",
            "glm4",
            "tekken",
            "gpt-4o",
            "ufakzeka",
            "laguna",
        ];
        for n in names {
            let s = lookup(Some(n)).unwrap();
            for re in s.regexes {
                fancy_regex_compiles(re);
            }
        }
    }

    fn fancy_regex_compiles(re: &str) {
        Split::new(
            SplitPattern::Regex(re.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap_or_else(|e| panic!("{re}: {e}"));
    }

    #[test]
    fn unknown_and_unsupported_pre_are_errors() {
        assert!(matches!(
            lookup(Some("no-such-pre")),
            Err(TokenizerError::UnknownPre(n)) if n == "no-such-pre"
        ));
        assert!(matches!(
            lookup(Some("kimi-k2")),
            Err(TokenizerError::UnsupportedPre(_))
        ));
        // llama.cpp spells GPT-2's pre-tokenizer "gpt-2"; "gpt2" is unknown there too.
        assert!(lookup(Some("gpt2")).is_err());
        assert_eq!(lookup(None).unwrap().family, "default");
    }
}
