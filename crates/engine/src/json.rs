//! JSON mode: generation constrained to one JSON object.
//!
//! [`JsonState`] is an incremental validator (a pushdown automaton over
//! bytes) for RFC 8259 text whose root is an object. Before each sampling
//! step the scheduler asks which tokens keep the text a valid prefix
//! ([`JsonState::mask`]) and bans the rest; end-of-generation is allowed only
//! once the root object is closed, and nothing but it after. So the output
//! is valid JSON unless `max_tokens` cuts it short (`finish_reason:
//! "length"`, as OpenAI's JSON mode behaves).
//!
//! Whitespace runs are capped ([`MAX_WS`]) as llama.cpp's JSON grammar caps
//! them: a constrained model otherwise tends to emit newlines forever.

/// Longest run of whitespace accepted between tokens of the JSON text.
pub const MAX_WS: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// After `{`: a key or `}`.
    ObjFirst,
    /// After `,` in an object: a key.
    ObjKey,
    /// After a key: `:`.
    ObjColon,
    /// After `:`: a value.
    ObjValue,
    /// After a member: `,` or `}`.
    ObjNext,
    /// After `[`: a value or `]`.
    ArrFirst,
    /// After `,` in an array: a value.
    ArrValue,
    /// After an element: `,` or `]`.
    ArrNext,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// Between tokens.
    Between,
    /// Inside a string; `escape`: 0 none, 1 after `\`, 2..=5 hex digits of
    /// `\u` still due (+1); `utf8`: continuation bytes still due.
    Str {
        escape: u8,
        utf8: u8,
    },
    Num(Num),
    /// Inside `true`, `false` or `null`: the bytes still due.
    Lit(&'static [u8]),
}

/// Where a JSON text stands after the bytes fed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonState {
    stack: Vec<Frame>,
    lex: Lex,
    /// The root object has been closed.
    done: bool,
    started: bool,
    ws_run: usize,
}

impl Default for JsonState {
    fn default() -> Self {
        Self::new()
    }
}

impl JsonState {
    pub fn new() -> Self {
        Self {
            stack: Vec::new(),
            lex: Lex::Between,
            done: false,
            started: false,
            ws_run: 0,
        }
    }

    /// True once the root object is complete.
    pub fn is_complete(&self) -> bool {
        self.done
    }

    /// Feeds bytes; false (and a state to discard) when they cannot continue
    /// a JSON object.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.push(b))
    }

    /// Bans (sets to -inf) every token whose bytes would break the JSON
    /// text; `pieces[id]` are the token bytes, `is_eog(id)` says which end
    /// generation. Returns how many tokens stay allowed.
    pub fn mask(
        &self,
        logits: &mut [f32],
        pieces: &[Vec<u8>],
        is_eog: impl Fn(u32) -> bool,
    ) -> usize {
        let mut scratch = self.clone();
        let mut allowed = 0;
        for (id, logit) in logits.iter_mut().enumerate() {
            let ok = if is_eog(id as u32) {
                self.done
            } else {
                match pieces.get(id) {
                    Some(p) if !p.is_empty() && !self.done => {
                        scratch.clone_from(self);
                        scratch.push_bytes(p)
                    }
                    _ => false,
                }
            };
            if ok {
                allowed += 1;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        allowed
    }

    fn push(&mut self, b: u8) -> bool {
        match self.lex {
            Lex::Str { escape, utf8 } => return self.string_byte(b, escape, utf8),
            Lex::Lit(rest) => {
                return match rest.split_first() {
                    Some((&want, tail)) if want == b => {
                        self.lex = if tail.is_empty() {
                            self.value_done();
                            Lex::Between
                        } else {
                            Lex::Lit(tail)
                        };
                        true
                    }
                    _ => false,
                }
            }
            Lex::Num(n) => {
                if let Some(next) = number_step(n, b) {
                    self.lex = Lex::Num(next);
                    return true;
                }
                // The number ends here if it may; the byte then belongs to
                // what follows it.
                if !matches!(n, Num::Zero | Num::Int | Num::Frac | Num::Exp) {
                    return false;
                }
                self.lex = Lex::Between;
                self.value_done();
            }
            Lex::Between => {}
        }
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            self.ws_run += 1;
            return self.ws_run <= MAX_WS;
        }
        self.ws_run = 0;
        if self.done {
            return false;
        }
        let Some(&top) = self.stack.last() else {
            // The root must be an object.
            if b == b'{' && !self.started {
                self.started = true;
                self.stack.push(Frame::ObjFirst);
                return true;
            }
            return false;
        };
        match (top, b) {
            (Frame::ObjFirst | Frame::ObjKey, b'"') => {
                self.set_top(Frame::ObjColon);
                self.lex = Lex::Str { escape: 0, utf8: 0 };
                true
            }
            (Frame::ObjFirst | Frame::ObjNext, b'}') | (Frame::ArrFirst | Frame::ArrNext, b']') => {
                self.stack.pop();
                self.value_done();
                true
            }
            (Frame::ObjColon, b':') => {
                self.set_top(Frame::ObjValue);
                true
            }
            (Frame::ObjNext, b',') => {
                self.set_top(Frame::ObjKey);
                true
            }
            (Frame::ArrNext, b',') => {
                self.set_top(Frame::ArrValue);
                true
            }
            (Frame::ObjValue | Frame::ArrFirst | Frame::ArrValue, _) => self.value_start(b),
            _ => false,
        }
    }

    fn set_top(&mut self, f: Frame) {
        if let Some(top) = self.stack.last_mut() {
            *top = f;
        }
    }

    /// The first byte of a value in the current container.
    fn value_start(&mut self, b: u8) -> bool {
        let after = match self.stack.last() {
            Some(Frame::ObjValue) => Frame::ObjNext,
            _ => Frame::ArrNext,
        };
        // The container moves on once this value is complete; mark it now
        // so nested containers return to the right place.
        self.set_top(after);
        match b {
            b'{' => self.stack.push(Frame::ObjFirst),
            b'[' => self.stack.push(Frame::ArrFirst),
            b'"' => self.lex = Lex::Str { escape: 0, utf8: 0 },
            b'-' => self.lex = Lex::Num(Num::Minus),
            b'0' => self.lex = Lex::Num(Num::Zero),
            b'1'..=b'9' => self.lex = Lex::Num(Num::Int),
            b't' => self.lex = Lex::Lit(b"rue"),
            b'f' => self.lex = Lex::Lit(b"alse"),
            b'n' => self.lex = Lex::Lit(b"ull"),
            _ => return false,
        }
        true
    }

    /// A value (or key) has ended; closing the root finishes the text.
    fn value_done(&mut self) {
        if self.stack.is_empty() && self.started {
            self.done = true;
        }
    }

    fn string_byte(&mut self, b: u8, escape: u8, utf8: u8) -> bool {
        if utf8 > 0 {
            if !(0x80..=0xBF).contains(&b) {
                return false;
            }
            self.lex = Lex::Str {
                escape: 0,
                utf8: utf8 - 1,
            };
            return true;
        }
        match escape {
            0 => match b {
                b'"' => {
                    self.lex = Lex::Between;
                    // A key is followed by `:`, which the frame already
                    // expects; a value completes its container slot.
                    self.value_done();
                    true
                }
                b'\\' => {
                    self.lex = Lex::Str { escape: 1, utf8: 0 };
                    true
                }
                0x00..=0x1F => false,
                0x20..=0x7F => true,
                0xC2..=0xDF => self.utf8_lead(1),
                0xE0..=0xEF => self.utf8_lead(2),
                0xF0..=0xF4 => self.utf8_lead(3),
                _ => false,
            },
            1 => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                    self.lex = Lex::Str { escape: 0, utf8: 0 };
                    true
                }
                b'u' => {
                    self.lex = Lex::Str { escape: 5, utf8: 0 };
                    true
                }
                _ => false,
            },
            n => {
                if !b.is_ascii_hexdigit() {
                    return false;
                }
                let next = if n == 2 { 0 } else { n - 1 };
                self.lex = Lex::Str {
                    escape: next,
                    utf8: 0,
                };
                true
            }
        }
    }

    fn utf8_lead(&mut self, continuation: u8) -> bool {
        self.lex = Lex::Str {
            escape: 0,
            utf8: continuation,
        };
        true
    }
}

fn number_step(n: Num, b: u8) -> Option<Num> {
    Some(match (n, b) {
        (Num::Minus, b'0') => Num::Zero,
        (Num::Minus, b'1'..=b'9') => Num::Int,
        (Num::Int, b'0'..=b'9') => Num::Int,
        (Num::Zero | Num::Int, b'.') => Num::Dot,
        (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
        (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::E,
        (Num::E, b'+' | b'-') => Num::ESign,
        (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Num::Exp,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(text: &str) -> Option<bool> {
        let mut s = JsonState::new();
        s.push_bytes(text.as_bytes()).then(|| s.is_complete())
    }

    #[test]
    fn accepts_objects_and_knows_when_they_end() {
        for text in [
            r#"{}"#,
            r#" {"a": 1}"#,
            r#"{"a": [1, -2.5e+3, 0, true, false, null, "x\"\\\u00e9"], "b": {"c": {}}}"#,
            "{\"é\": \"ünïcode ✓\"}",
            r#"{"a":[[],[{}]]}"#,
        ] {
            assert_eq!(complete(text), Some(true), "{text}");
        }
        assert_eq!(complete(r#"{"a": [1, 2"#), Some(false));
        assert_eq!(complete(r#"{"a": tr"#), Some(false));
    }

    #[test]
    fn rejects_what_is_not_a_json_object() {
        for text in [
            "[1]",
            "\"s\"",
            "{a: 1}",
            r#"{"a" 1}"#,
            r#"{"a": 01}"#,
            r#"{"a": 1.}"#,
            r#"{"a": 1,}"#,
            r#"{"a": tru }"#,
            r#"{"a": "\x"}"#,
            "{\"a\": \"\n\"}",
            r#"{} {}"#,
            r#"{"a": 1]"#,
            r#"{"a": -}"#,
        ] {
            assert_eq!(complete(text), None, "{text}");
        }
    }

    #[test]
    fn numbers_end_at_delimiters() {
        assert_eq!(complete(r#"{"a": 12}"#), Some(true));
        assert_eq!(complete(r#"{"a": 12 , "b": 0.5e2 }"#), Some(true));
        assert_eq!(complete(r#"{"a": [0,1]}"#), Some(true));
    }

    #[test]
    fn whitespace_runs_are_capped() {
        let mut s = JsonState::new();
        assert!(s.push_bytes(b"{"));
        assert!(s.push_bytes(&[b'\n'; MAX_WS]));
        assert!(!s.clone().push_bytes(b"\n"));
        assert!(s.push_bytes(b"}"));
        assert!(s.is_complete());
    }

    #[test]
    fn mask_allows_only_valid_continuations_and_eog_at_the_end() {
        let pieces: Vec<Vec<u8>> = ["{", "}", "\"", "a", " ", "x", ""]
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect();
        let eog = |id: u32| id == 6;
        let mut logits = vec![0.0; 7];
        let s = JsonState::new();
        assert_eq!(s.mask(&mut logits, &pieces, eog), 2); // `{` and ` `
        assert!(logits[0].is_finite() && logits[4].is_finite());
        assert!(logits[6].is_infinite());

        let mut done = JsonState::new();
        assert!(done.push_bytes(b"{}"));
        let mut logits = vec![0.0; 7];
        assert_eq!(done.mask(&mut logits, &pieces, eog), 1);
        assert!(logits[6].is_finite());
    }
}
