//! Stop strings over streamed text.
//!
//! Text that might still become a stop string is held back until the next
//! piece decides it, so a client never sees the beginning of a stop string
//! that then completes. The held text is always a suffix of what was pushed
//! and a prefix of some stop string; both are `str`, so nothing handed out
//! ever splits a UTF-8 character.

/// Finds stop strings in a stream of text pieces.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What one [`StopMatcher::push`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// Text that is safe to show now.
    pub text: String,
    /// A stop string completed; `text` ends right before it.
    pub stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored: they would match before any text.
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds `piece` and returns what can be shown.
    pub fn push(&mut self, piece: &str) -> Pushed {
        self.held.push_str(piece);
        if self.stops.is_empty() {
            return Pushed {
                text: std::mem::take(&mut self.held),
                stopped: false,
            };
        }
        // The earliest complete stop string wins, as in llama-server.
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return Pushed {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_suffix_len();
        let split = self.held.len() - keep;
        let held = self.held.split_off(split);
        Pushed {
            text: std::mem::replace(&mut self.held, held),
            stopped: false,
        }
    }

    /// Releases whatever is held: generation ended for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a
    /// stop string, measured on character boundaries.
    fn partial_suffix_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .filter(|&i| self.held.len() - i < longest)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .map_or(0, |i| self.held.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()));
        let mut out = Vec::new();
        for p in pieces {
            let r = m.push(p);
            out.push(r.text);
            if r.stopped {
                return (out, true, String::new());
            }
        }
        let rest = m.finish();
        (out, false, rest)
    }

    #[test]
    fn passes_text_through_without_stops() {
        let (out, stopped, rest) = run(&[], &["a", "b"]);
        assert_eq!(out, ["a", "b"]);
        assert!(!stopped);
        assert_eq!(rest, "");
    }

    #[test]
    fn holds_a_forming_stop_string_back() {
        let (out, stopped, _) = run(&["END"], &["hello E", "N", "D more"]);
        assert_eq!(out, ["hello ", "", ""]);
        assert!(stopped);
    }

    #[test]
    fn releases_a_false_start() {
        let (out, stopped, rest) = run(&["END"], &["E", "Nx", "y"]);
        assert_eq!(out, ["", "ENx", "y"]);
        assert!(!stopped);
        assert_eq!(rest, "");
    }

    #[test]
    fn finish_flushes_held_text() {
        let (out, stopped, rest) = run(&["END"], &["ab", "EN"]);
        assert_eq!(out, ["ab", ""]);
        assert!(!stopped);
        assert_eq!(rest, "EN");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (out, stopped, _) = run(&["cd", "b"], &["abcd"]);
        assert_eq!(out, ["a"]);
        assert!(stopped);
    }

    #[test]
    fn never_splits_multibyte_characters() {
        // "é" is two bytes; a stop starting with its second byte cannot exist
        // in valid UTF-8, so the held suffix is always whole characters.
        let (out, stopped, rest) = run(&["éx"], &["aé", "é", "y"]);
        assert_eq!(out, ["a", "é", "éy"]);
        assert!(!stopped);
        assert_eq!(rest, "");
        for s in out {
            assert!(std::str::from_utf8(s.as_bytes()).is_ok());
        }
    }

    #[test]
    fn stop_inside_one_piece_with_text_after() {
        let (out, stopped, _) = run(&["\n\n"], &["one\n", "\ntwo"]);
        assert_eq!(out, ["one", ""]);
        assert!(stopped);
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let (out, stopped, _) = run(&[""], &["abc"]);
        assert_eq!(out, ["abc"]);
        assert!(!stopped);
    }
}
