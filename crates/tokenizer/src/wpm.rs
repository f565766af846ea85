//! WordPiece for `bert` vocabularies, as llama.cpp runs it
//! (`llm_tokenizer_wpm_session`): a BERT-style normalizer splits the text
//! into words, then each word, prefixed with `▁`, is covered greedily by the
//! longest vocabulary tokens from the left. GGUF BERT vocabularies mark word
//! starts with `▁` and leave continuations bare (the converter rewrote HF's
//! `##` pieces), so the pieces are looked up as they stand.
//!
//! The normalizer follows llama.cpp, not HF's `BertNormalizer`, where they
//! differ: its "NFD" keeps only the first code point of each character's
//! canonical decomposition (a Hangul syllable becomes its leading jamo),
//! lowercasing is the one-code-point mapping, and the character classes are
//! Unicode general categories (punctuation `P`, control `Cc Cf Co`, marks
//! `M`), with only ASCII symbols split like punctuation.
//!
//! The Unicode data is 16.0's or later (`regex-syntax`, `unicode-normalization`,
//! std's lowercase), llama.cpp's 15.1's: compared code point by code point,
//! they differ only on about 140 code points first assigned in 16.0
//! (punctuation, marks, decompositions and case pairs of the new scripts);
//! whitespace and control are identical.

use std::sync::OnceLock;

use crate::vocab::Vocab;

/// The normalizer's switches (`tokenizer.ggml.normalizer.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Normalizer {
    pub lowercase: bool,
    pub strip_accents: bool,
}

/// Appends the ids of `text` to `out`. A word that cannot be covered by
/// vocabulary tokens becomes the unknown token (nothing, if the file has
/// none: llama.cpp would emit an invalid id there).
pub(crate) fn tokenize(vocab: &Vocab, norm: Normalizer, text: &str, out: &mut Vec<u32>) {
    let max_len = vocab.max_token_len;
    for word in preprocess(text, norm) {
        let word = format!("\u{2581}{word}");
        let n = word.len();
        let before = out.len();
        let mut i = 0;
        while i < n {
            // The longest token starting at byte `i`; `get` refuses ends that
            // split a character, which no token could match anyway.
            let found = (i + 1..=n.min(i + max_len))
                .rev()
                .find_map(|j| Some((j, *vocab.token_to_id.get(word.get(i..j)?)?)));
            match found {
                Some((j, id)) => {
                    out.push(id);
                    i = j;
                }
                None => {
                    // One uncovered position discards the whole word.
                    out.truncate(before);
                    break;
                }
            }
        }
        if out.len() == before {
            out.extend(vocab.specials.unk);
        }
    }
}

/// llama.cpp's `preprocess`: normalized words, each punctuation mark, ASCII
/// symbol and CJK ideograph a word of its own; whitespace separates words,
/// control characters, NUL and U+FFFD vanish.
pub(crate) fn preprocess(text: &str, norm: Normalizer) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        let c = if norm.strip_accents { first_nfd(c) } else { c };
        if c.is_whitespace() {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
            continue;
        }
        if c == '\0' || c == char::REPLACEMENT_CHARACTER || classes().control.contains(c) {
            continue;
        }
        if norm.strip_accents && classes().mark.contains(c) {
            continue;
        }
        let out = if norm.lowercase {
            simple_lowercase(c)
        } else {
            c
        };
        let ascii_symbol = (c as u32) < 0x7F && classes().symbol.contains(c);
        if classes().punctuation.contains(c) || ascii_symbol || is_chinese_char(c) {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
            words.push(out.to_string());
        } else {
            cur.push(out);
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// The first code point of `c`'s canonical decomposition (`c` itself when it
/// has none): llama.cpp's NFD table keeps only that one.
fn first_nfd(c: char) -> char {
    let mut first = None;
    unicode_normalization::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

/// UnicodeData's simple lowercase mapping. Rust's full mapping differs only
/// where it yields several code points (U+0130), and there the simple
/// mapping is its first.
fn simple_lowercase(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

/// BERT's CJK ranges, llama.cpp's copy (which has HF's 0x2B920 where the
/// extension really starts at 0x2B820).
fn is_chinese_char(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// A set of code points as sorted, disjoint inclusive ranges.
struct CharClass(Vec<(char, char)>);

impl CharClass {
    /// The class of a bracket expression or `\p{..}` in regex syntax. The
    /// patterns are constants of this file; one that did not parse to a
    /// class would leave the class empty (caught by the tests).
    fn parse(pattern: &str) -> Self {
        use regex_syntax::hir::{Class, HirKind};
        let ranges = match regex_syntax::Parser::new().parse(pattern) {
            Ok(hir) => match hir.kind() {
                HirKind::Class(Class::Unicode(c)) => {
                    c.ranges().iter().map(|r| (r.start(), r.end())).collect()
                }
                _ => Vec::new(),
            },
            Err(_) => Vec::new(),
        };
        Self(ranges)
    }

    fn contains(&self, c: char) -> bool {
        let i = self.0.partition_point(|&(_, end)| end < c);
        self.0.get(i).is_some_and(|&(start, _)| start <= c)
    }
}

struct Classes {
    punctuation: CharClass,
    symbol: CharClass,
    /// llama.cpp's CONTROL flag: `Cc Cf Co` (and `Cs`), not unassigned
    /// code points.
    control: CharClass,
    mark: CharClass,
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(|| Classes {
        punctuation: CharClass::parse(r"\p{P}"),
        symbol: CharClass::parse(r"\p{S}"),
        // Surrogates (`Cs`) cannot occur in a `str`.
        control: CharClass::parse(r"[\p{Cc}\p{Cf}\p{Co}]"),
        mark: CharClass::parse(r"\p{M}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BERT: Normalizer = Normalizer {
        lowercase: true,
        strip_accents: true,
    };

    #[test]
    fn classes_parse_and_answer() {
        let c = classes();
        for class in [&c.punctuation, &c.symbol, &c.control, &c.mark] {
            assert!(!class.0.is_empty());
        }
        assert!(c.punctuation.contains('!') && c.punctuation.contains('。'));
        assert!(!c.punctuation.contains('a'));
        assert!(c.symbol.contains('$') && c.symbol.contains('🦙'));
        assert!(c.control.contains('\u{200D}') && c.control.contains('\u{7}'));
        // Unassigned is not control for llama.cpp.
        assert!(!c.control.contains('\u{0378}'));
        assert!(c.mark.contains('\u{0301}') && c.mark.contains('\u{FE0F}'));
    }

    #[test]
    fn normalizes_as_llama_cpp() {
        assert_eq!(first_nfd('é'), 'e');
        assert_eq!(first_nfd('Ä'), 'A');
        // Hangul keeps only its leading jamo.
        assert_eq!(first_nfd('가'), '\u{1100}');
        assert_eq!(first_nfd('x'), 'x');
        assert_eq!(simple_lowercase('\u{130}'), 'i');
        assert_eq!(simple_lowercase('Σ'), 'σ');
        assert_eq!(
            preprocess("Hello, y'all! Äpfel 4½ 我想$x\u{200D}", BERT),
            ["hello", ",", "y", "'", "all", "!", "apfel", "4½", "我", "想", "$", "x"]
        );
        let keep = Normalizer {
            lowercase: false,
            strip_accents: false,
        };
        assert_eq!(preprocess(" Äpfel\tÉ ", keep), ["Äpfel", "É"]);
        assert!(preprocess(" \n\t ", BERT).is_empty());
    }
}
