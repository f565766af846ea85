//! BPE by merge rank on raw UTF-8, for SentencePiece-style BPE vocabularies
//! (`gemma4`): llama.cpp's `llm_tokenizer_bpe_session` with `byte_encode`
//! off. The caller has already replaced spaces with `▁`. The text is split
//! into runs of newlines and runs of everything else (llama.cpp's regex
//! `[^\n]+|[\n]+`); each run starts as single characters, and the adjacent
//! pair with the lowest merge rank is merged until none is left (ties: the
//! leftmost). A run made only of newlines that is itself a token is emitted
//! whole (llama.cpp's Gemma 4 fix: merging newlines pairwise gives other
//! ids than the reference tokenizer). A final piece that is not a token is
//! emitted as its `<0xNN>` byte tokens, or dropped where those are missing.
//!
//! Unlike the `tokenizers` BPE model, a merge applies whether or not its
//! parts and result are tokens, as in llama.cpp: pieces are interned by text
//! so a rank is found without building strings.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::vocab::Vocab;

/// The merge table: every text that appears as a merge part, interned, and
/// the rank of each (left, right) pair.
pub(crate) struct Merges {
    parts: HashMap<String, u32>,
    ranks: HashMap<(u32, u32), u32>,
}

impl Merges {
    /// Parses `tokenizer.ggml.merges` as llama.cpp does: split at the first
    /// space after the first byte; an entry without one is ignored; the
    /// first rank of a repeated pair wins.
    pub fn new(merges: &[String]) -> Self {
        let mut parts: HashMap<String, u32> = HashMap::new();
        let mut ranks = HashMap::with_capacity(merges.len());
        let mut intern = |s: &str| -> u32 {
            let next = parts.len() as u32;
            *parts.entry(s.to_owned()).or_insert(next)
        };
        for (rank, m) in merges.iter().enumerate() {
            let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            // `pos` is an ASCII space, so both slices are on char boundaries.
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            let key = (intern(a), intern(b));
            ranks.entry(key).or_insert(rank as u32);
        }
        Self { parts, ranks }
    }

    fn rank(&self, left: &str, right: &str) -> Option<u32> {
        let l = *self.parts.get(left)?;
        let r = *self.parts.get(right)?;
        self.ranks.get(&(l, r)).copied()
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    left: usize,
    right: usize,
    rank: u32,
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
    /// Max-heap order: the lowest rank first, then the smaller left index.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Appends the ids of `text` (spaces already `▁`) to `out`.
pub(crate) fn tokenize(vocab: &Vocab, merges: &Merges, text: &str, out: &mut Vec<u32>) {
    let mut start = 0;
    while start < text.len() {
        let newline = text.as_bytes()[start] == b'\n';
        let len = text.as_bytes()[start..]
            .iter()
            .position(|&b| (b == b'\n') != newline)
            .unwrap_or(text.len() - start);
        let end = start + len;
        if let Some(run) = text.get(start..end) {
            let whole = if newline {
                vocab.token_to_id.get(run).copied()
            } else {
                None
            };
            match whole {
                Some(id) => out.push(id),
                None => word(vocab, merges, run, out),
            }
        }
        start = end;
    }
}

fn word(vocab: &Vocab, merges: &Merges, text: &str, out: &mut Vec<u32>) {
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
    let piece = |s: &Symbol| text.get(s.start..s.start + s.len);

    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>,
                   symbols: &[Symbol],
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (&symbols[left], &symbols[right]);
        let (Some(lt), Some(rt)) = (piece(l), piece(r)) else {
            return;
        };
        if let Some(rank) = merges.rank(lt, rt) {
            queue.push(Bigram {
                left,
                right,
                rank,
                size: l.len + r.len,
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, Some(i - 1), Some(i));
    }

    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        // One side was merged away, or a side grew since queuing.
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
        let Some(p) = piece(&s) else {
            continue;
        };
        if let Some(&id) = vocab.token_to_id.get(p) {
            out.push(id);
            continue;
        }
        for &b in p.as_bytes() {
            out.extend(vocab.token_to_id.get(&format!("<0x{b:02X}>")).copied());
        }
    }
}
