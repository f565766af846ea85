//! SentencePiece BPE as llama.cpp runs it (`llm_tokenizer_spm_session`):
//! start from single UTF-8 characters, repeatedly merge the adjacent pair
//! whose concatenation is the highest-scoring vocabulary token (ties: the
//! leftmost pair), and emit each final piece as its token or, when a single
//! character is not in the vocabulary, as its `<0xNN>` byte tokens.
//!
//! The input is already space-escaped (`▁`) by the caller. A merged piece is
//! always a vocabulary token (a pair is only queued if its text is one), so
//! llama.cpp's `rev_merge` re-segmentation never fires and is not needed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

#[derive(Clone, Copy)]
struct Symbol {
    /// Byte range of the piece in the text.
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// Byte length of the merged text, to detect stale entries.
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the smaller left index.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Appends the ids of `text` (already `▁`-escaped) to `out`.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (start, ch) in text.char_indices() {
        let i = symbols.len();
        symbols.push(Symbol {
            start,
            len: ch.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }
    if symbols.is_empty() {
        return;
    }

    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>,
                   symbols: &[Symbol],
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        let Some(piece) = text.get(l.start..r.start + r.len) else {
            return;
        };
        if let Some(&id) = vocab.token_to_id.get(piece) {
            queue.push(Bigram {
                left,
                right,
                score: vocab.scores.get(id as usize).copied().unwrap_or(0.0),
                size: piece.len(),
            });
        }
    };

    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, Some(i - 1), Some(i));
    }

    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        // One side was merged away, or the left one grew since queuing.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        let prev = symbols[b.left].prev;
        let next = symbols[b.left].next;
        try_add(&mut queue, &symbols, prev, Some(b.left));
        try_add(&mut queue, &symbols, Some(b.left), next);
    }

    let mut cur = Some(0);
    while let Some(i) = cur {
        let s = symbols[i];
        cur = s.next;
        let Some(piece) = text.get(s.start..s.start + s.len) else {
            continue;
        };
        if let Some(&id) = vocab.token_to_id.get(piece) {
            out.push(id);
            continue;
        }
        for &b in piece.as_bytes() {
            match vocab.spm_byte_token(b) {
                Some(id) => out.push(id),
                // llama.cpp aborts here; a vocabulary without byte tokens
                // gets the unknown token instead (or nothing, lacking one).
                None => out.extend(vocab.specials.unk),
            }
        }
    }
}
