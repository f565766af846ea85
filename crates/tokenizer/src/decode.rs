//! From ids back to bytes and text: per-token pieces (llama.cpp's
//! `token_to_piece`), whole-sequence decoding with the first-token space
//! strip and `clean_spaces` passes (`detokenize`), and a streaming
//! [`Detokenizer`] that only ever hands out complete UTF-8 characters.

use crate::vocab::{attr, VocabKind};
use crate::Tokenizer;

/// The piece of one token. `render_special`: whether control and unknown
/// tokens produce their text (llama.cpp's `special` argument).
pub(crate) fn piece(tok: &Tokenizer, id: u32, render_special: bool) -> Vec<u8> {
    let v = &tok.vocab;
    let Some(text) = v.tokens.get(id as usize) else {
        return Vec::new();
    };
    let a = v.attr(id);
    if !render_special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
        return Vec::new();
    }
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if a & attr::NORMAL != 0 {
        return match v.kind {
            VocabKind::Bpe if !v.escape_whitespaces => byte_level_decode(tok, text),
            // SentencePiece, SentencePiece-style BPE and WordPiece: `▁` is a
            // space (a WordPiece word start).
            _ => text.replace('\u{2581}', " ").into_bytes(),
        };
    }
    if a & attr::BYTE != 0 {
        // `<0xNN>`: llama.cpp reads the two hex digits at offset 3.
        return match text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(b) => vec![b],
            None => text.as_bytes().to_vec(),
        };
    }
    // UNUSED and UNDEFINED tokens render as nothing.
    Vec::new()
}

/// GPT-2 byte-level text back to bytes; a code point outside the map is
/// written as llama.cpp does (`[UNK_BYTE_0x…<token>]`).
fn byte_level_decode(tok: &Tokenizer, text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match tok.char_to_byte.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// llama.cpp's `detokenize` with `remove_special = false`.
pub(crate) fn detokenize(tok: &Tokenizer, ids: &[u32], render_special: bool) -> Vec<u8> {
    let mut out = Vec::new();
    // SentencePiece's dummy prefix: the first piece loses one leading space.
    let mut remove_space = tok.vocab.add_space_prefix;
    for &id in ids {
        let p = piece(tok, id, render_special);
        let skip = usize::from(remove_space && p.first() == Some(&b' '));
        out.extend_from_slice(&p[skip..]);
        remove_space = false;
    }
    if tok.vocab.clean_spaces {
        clean_spaces(&mut out);
    }
    out
}

/// The three in-place passes of llama.cpp's `clean_spaces`, transcribed
/// index for index (they read bytes the earlier writes may have moved).
fn clean_spaces(text: &mut Vec<u8>) {
    // " ?", " !", " .", " ," lose the space.
    let total1 = text.len();
    let mut total = usize::from(total1 > 0);
    for i in 1..total1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // " ' " loses both spaces.
    let total2 = total;
    total = usize::from(total2 > 0);
    let mut i = 1;
    while i < total2 {
        let x = text[i];
        if x == b'\'' && i + 1 < total2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // " 's", " 'm", " 're", " 've" lose the space.
    let total3 = total;
    total = usize::from(total3 > 0);
    for i in 1..total3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < total3 {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < total3 {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Turns a stream of token ids into text, one token at a time, never
/// splitting a UTF-8 character: bytes of an unfinished character wait for
/// the next token; bytes that can never start a valid character become
/// U+FFFD at once. Pieces are concatenated as llama.cpp's server streams
/// them (no first-token space strip, no `clean_spaces`).
#[derive(Clone, Debug, Default)]
pub struct Detokenizer {
    render_special: bool,
    pending: Vec<u8>,
}

impl Detokenizer {
    /// Control tokens render as nothing (llama.cpp's default).
    pub fn new() -> Self {
        Self::default()
    }

    /// `render_special`: control and unknown tokens render as their text.
    pub fn with_special(render_special: bool) -> Self {
        Self {
            render_special,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that is now complete (maybe empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let p = piece(tok, id, self.render_special);
        self.push_bytes(&p)
    }

    /// Adds raw bytes; returns the text that is now complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut pos = 0;
        while pos < self.pending.len() {
            match std::str::from_utf8(&self.pending[pos..]) {
                Ok(s) => {
                    out.push_str(s);
                    pos = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[pos..pos + valid]));
                    pos += valid;
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            pos += bad;
                        }
                        // An unfinished character at the end: keep it.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..pos);
        out
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is held back comes out, lossily.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_spaces_matches_llama_cpp() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("it ' s"), "it's");
        assert_eq!(clean("I 'm here, you 're there"), "I'm here, you're there");
        assert_eq!(clean("don 't"), "don 't");
        assert_eq!(clean(" ."), ".");
        assert_eq!(clean(""), "");
    }

    #[test]
    fn detokenizer_holds_partial_characters() {
        let mut d = Detokenizer::new();
        let rocket = "🚀".as_bytes();
        assert_eq!(d.push_bytes(b"go "), "go ");
        assert_eq!(d.push_bytes(&rocket[..1]), "");
        assert_eq!(d.push_bytes(&rocket[1..3]), "");
        assert_eq!(d.pending().len(), 3);
        assert_eq!(d.push_bytes(&rocket[3..]), "🚀");
        assert_eq!(d.push_bytes(&"東".as_bytes()[..2]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert!(d.pending().is_empty());
    }

    #[test]
    fn detokenizer_replaces_impossible_bytes_at_once() {
        let mut d = Detokenizer::new();
        assert_eq!(d.push_bytes(b"a\xFFb"), "a\u{FFFD}b");
        assert_eq!(d.push_bytes(b"\xE6\x9D"), "");
        // A new lead byte where a continuation belongs: the stale prefix is
        // invalid, the new character completes normally.
        assert_eq!(d.push_bytes("é".as_bytes()), "\u{FFFD}é");
    }
}
