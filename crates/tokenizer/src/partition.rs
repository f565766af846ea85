//! Splitting special tokens out of raw text before the tokenizer proper runs
//! (llama.cpp's `tokenizer_st_partition`). Each special token, longest text
//! first, cuts every remaining raw fragment at each of its occurrences, left
//! to right. User-defined tokens are always cut out; control and unknown
//! tokens only when special-token parsing is on. Tokens marked LSTRIP /
//! RSTRIP also take the ASCII whitespace beside them.

use crate::vocab::{attr, Vocab};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// A byte range of the input still to be tokenized.
    Text {
        start: usize,
        end: usize,
    },
    Token(u32),
}

pub(crate) fn partition(vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text {
        start: 0,
        end: text.len(),
    });
    for &id in &vocab.special_cache {
        if !parse_special && vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let Some(needle) = vocab.tokens.get(id as usize) else {
            continue;
        };
        // Fragments are substrings of `text`: a token absent from the whole
        // input cannot cut any of them (the cheap test for big vocabularies).
        if needle.is_empty() || !text.contains(needle.as_str()) {
            continue;
        }
        let mut out = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text { start, end } = f else {
                out.push(f);
                continue;
            };
            let a = vocab.attr(id);
            let mut pos = start;
            while let Some(found) = text.get(pos..end).and_then(|s| s.find(needle.as_str())) {
                let at = pos + found;
                let mut left_end = at;
                if a & attr::LSTRIP != 0 {
                    while left_end > pos && is_c_space(text.as_bytes()[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > pos {
                    out.push(Fragment::Text {
                        start: pos,
                        end: left_end,
                    });
                }
                out.push(Fragment::Token(id));
                pos = at + needle.len();
                if a & attr::RSTRIP != 0 {
                    while pos < end && is_c_space(text.as_bytes()[pos]) {
                        pos += 1;
                    }
                }
            }
            if pos < end {
                out.push(Fragment::Text { start: pos, end });
            }
        }
        frags = out;
    }
    frags
}

/// C's `isspace` in the "C" locale, which llama.cpp's strip uses.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}
