//! Where a JSON object or array ends in text that is still arriving.
//!
//! A tool call's arguments can be long (a whole file to write), and the
//! text comes a token at a time, so the scan resumes where it stopped
//! instead of starting over on every token: each byte is looked at once.
//! It only tracks brackets, strings and escapes; `serde_json` checks the
//! value once its end is found.

/// A resumable scan of one JSON object or array from its first byte.
#[derive(Debug, Clone, Default)]
pub struct Extent {
    /// Bytes of the value scanned so far.
    pos: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

/// What the scan knows so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// The value has not ended yet.
    Open,
    /// The value is the first this many bytes.
    End(usize),
    /// The text does not start with `{` or `[`, or closes more than it opened.
    NotJson,
}

impl Extent {
    /// Scans `s` (the value's text from its first byte, as long as it has
    /// arrived) from where the last call stopped.
    pub fn advance(&mut self, s: &str) -> Scan {
        let bytes = s.as_bytes();
        if self.pos == 0 && !matches!(bytes.first(), None | Some(b'{' | b'[')) {
            return Scan::NotJson;
        }
        while let Some(&b) = bytes.get(self.pos) {
            self.pos += 1;
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    let Some(d) = self.depth.checked_sub(1) else {
                        return Scan::NotJson;
                    };
                    self.depth = d;
                    if d == 0 {
                        return Scan::End(self.pos);
                    }
                }
                _ => {}
            }
        }
        Scan::Open
    }
}

/// The first key of the object `s` begins (at its `{`): `Some(Some(key))`,
/// `Some(None)` when the text already shows the object has no string key
/// first (`{}`, `{1`), `None` while the key has not fully arrived.
pub fn first_key(s: &str) -> Option<Option<String>> {
    let rest = s.strip_prefix('{')?.trim_start();
    match rest.as_bytes().first() {
        None => return None,
        Some(b'"') => {}
        Some(_) => return Some(None),
    }
    let mut escaped = false;
    for (i, b) in rest.bytes().enumerate().skip(1) {
        match (escaped, b) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => return Some(serde_json::from_str(&rest[..=i]).ok()),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_is_found_across_pieces_and_strings_do_not_count() {
        let text = r#"{"a": "}{]\"", "b": [1, {"c": 2}]} tail"#;
        let mut e = Extent::default();
        let mut found = None;
        for cut in 1..=text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            match e.advance(&text[..cut]) {
                Scan::Open => {}
                Scan::End(n) => {
                    found = Some(n);
                    break;
                }
                Scan::NotJson => panic!("rejected at {cut}"),
            }
        }
        assert_eq!(found, Some(text.len() - " tail".len()));
    }

    #[test]
    fn text_that_is_not_an_object_or_array_is_refused() {
        assert_eq!(Extent::default().advance("hello"), Scan::NotJson);
        assert_eq!(Extent::default().advance("}"), Scan::NotJson);
        assert_eq!(Extent::default().advance(""), Scan::Open);
        assert_eq!(Extent::default().advance("[1, 2"), Scan::Open);
        assert_eq!(Extent::default().advance("[1]]"), Scan::End(3));
    }

    #[test]
    fn the_first_key_is_read_once_it_is_whole() {
        assert_eq!(first_key(r#"{ "name": 1"#), Some(Some("name".into())));
        assert_eq!(first_key(r#"{"na"#), None);
        assert_eq!(first_key("{"), None);
        assert_eq!(first_key("{}"), Some(None));
        assert_eq!(first_key(r#"{"a\"b": 1"#), Some(Some("a\"b".into())));
    }
}
