//! Splitting special tokens out of raw text before the tokenizer proper runs
//! (llama.cpp's `tokenizer_st_partition`). Each special token, longest text
//! first, cuts every remaining raw fragment at each of its occurrences, left
//! to right. User-defined tokens are always cut out; control and unknown
//! tokens only when special-token parsing is on. Tokens marked LSTRIP /
//! RSTRIP also take the ASCII whitespace beside them.
//!
//! `literal` byte ranges are text that must stay text (a chat message's own
//! words): control and unknown tokens are not cut out where they overlap one,
//! so a user cannot type a role marker into the prompt.

use std::ops::Range;

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

pub(crate) fn partition(
    vocab: &Vocab,
    text: &str,
    parse_special: bool,
    literal: &[Range<usize>],
) -> Vec<Fragment> {
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
            let gated = a & (attr::CONTROL | attr::UNKNOWN) != 0;
            // `pos`: start of the text not yet emitted; `from`: where the
            // next search starts (past occurrences that stay literal).
            let mut pos = start;
            let mut from = start;
            while let Some(found) = text.get(from..end).and_then(|s| s.find(needle.as_str())) {
                let at = from + found;
                if gated && overlaps(literal, at, at + needle.len()) {
                    from = at + needle.chars().next().map_or(1, char::len_utf8);
                    continue;
                }
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
                from = pos;
            }
            if pos < end {
                out.push(Fragment::Text { start: pos, end });
            }
        }
        frags = out;
    }
    frags
}

/// Whether `start..end` meets any of `literal` (sorted, disjoint ranges).
fn overlaps(literal: &[Range<usize>], start: usize, end: usize) -> bool {
    let i = literal.partition_point(|r| r.end <= start);
    literal.get(i).is_some_and(|r| r.start < end)
}

/// C's `isspace` in the "C" locale, which llama.cpp's strip uses.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}
