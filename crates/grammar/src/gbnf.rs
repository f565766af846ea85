//! llama.cpp's GBNF, rewritten as the Lark-like syntax llguidance compiles.
//!
//! llguidance reads Lark, not GBNF, and llama.cpp only hands it grammars
//! that start with `%llguidance` (its own JSON-schema path writes them); a
//! `grammar` field written for llama-server is GBNF. The two differ in one
//! way that matters: GBNF works on characters with no lexer, while a Lark
//! grammar is lexemes (string literals, regexes, UPPERCASE terminals)
//! joined by rules. The translation is llguidance's own (its
//! `gbnf_to_lark.py`): a rule whose body is all literals, character
//! classes and such rules (never recursive, never `root`) becomes a
//! terminal, one regex matched greedily; every other rule stays a rule.
//! That keeps the grammar fast (one lexeme per string, not per character)
//! and gives the same language for the grammars people write (JSON, lists,
//! choices). Where a terminal rule is followed by text its own pattern
//! could continue with (`word ::= [a-z]+`, `root ::= word "s"`), greedy
//! matching never ends the terminal there, so such an output cannot
//! finish and runs to `max_tokens`; inlining the rule into `root` keeps
//! GBNF's meaning, since `root` never becomes a terminal.
//!
//! Supported: `name ::= ...` rules (`#` comments, newlines inside
//! parentheses and after `|`), `"literals"` and `[classes]` with `\n \r
//! \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH` escapes, `[^negated]` classes,
//! `.`, groups, `* + ?` and `{m}`, `{m,}`, `{m,n}`. Token references
//! (`<[id]>`, `<|token|>`), which newer llama.cpp reads, are refused with
//! a message, as is anything else the parser does not know.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::GrammarError;

/// Deepest nesting of groups and repetitions: the parser and the writer
/// recurse, and a request must not be able to overflow their stacks.
const MAX_DEPTH: usize = 64;
/// Repetition operators in a row on one item (`"a"*?`): more mean nothing
/// new and would deepen the recursion past what `MAX_DEPTH` bounds.
const MAX_REPEATS: usize = 4;

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Lit(String),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Any,
    Ref(String, usize),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Rep(Box<Node>, u32, Option<u32>),
}

/// A GBNF grammar to the Lark text llguidance compiles.
pub fn to_lark(src: &str) -> Result<String, GrammarError> {
    let rules = Parser { src, pos: 0 }.grammar()?;
    let index: HashMap<&str, usize> = rules
        .iter()
        .enumerate()
        .map(|(i, (name, _, _))| (name.as_str(), i))
        .collect();
    let root = *index.get("root").ok_or(GrammarError::Gbnf {
        message: "there is no root rule (the grammar starts at `root ::= ...`)".into(),
        at: 0,
    })?;
    for (name, body, at) in &rules {
        if let Some(missing) = first_undefined(body, &index) {
            return Err(GrammarError::Gbnf {
                message: format!("rule {name} refers to {missing}, which is not defined"),
                at: *at,
            });
        }
    }

    // A rule is a terminal when everything it reaches is: found by
    // iterating to a fixed point, so a cycle never qualifies.
    let mut terminal = vec![false; rules.len()];
    loop {
        let mut changed = false;
        for (i, (_, body, _)) in rules.iter().enumerate() {
            if i != root && !terminal[i] && is_terminal(body, &index, &terminal) {
                terminal[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }

    let names: Vec<String> = rules
        .iter()
        .enumerate()
        .map(|(i, (name, _, _))| {
            if i == root {
                "start".to_owned()
            } else if terminal[i] {
                format!("T{i}_{}", name.to_ascii_uppercase())
            } else {
                format!("r{i}_{}", name.to_ascii_lowercase())
            }
        })
        .collect();
    let mut out = String::new();
    for (i, (_, body, _)) in rules.iter().enumerate() {
        let _ = write!(out, "{}: ", names[i]);
        write_node(&mut out, body, &index, &names, true);
        out.push('\n');
    }
    Ok(out)
}

fn first_undefined<'a>(n: &'a Node, index: &HashMap<&str, usize>) -> Option<&'a str> {
    match n {
        Node::Ref(name, _) if !index.contains_key(name.as_str()) => Some(name),
        Node::Seq(v) | Node::Alt(v) => v.iter().find_map(|c| first_undefined(c, index)),
        Node::Rep(c, _, _) => first_undefined(c, index),
        _ => None,
    }
}

fn is_terminal(n: &Node, index: &HashMap<&str, usize>, terminal: &[bool]) -> bool {
    match n {
        Node::Lit(_) | Node::Class { .. } | Node::Any => true,
        Node::Ref(name, _) => index.get(name.as_str()).is_some_and(|&i| terminal[i]),
        Node::Seq(v) | Node::Alt(v) => v.iter().all(|c| is_terminal(c, index, terminal)),
        Node::Rep(c, _, _) => is_terminal(c, index, terminal),
    }
}

fn write_node(
    out: &mut String,
    n: &Node,
    index: &HashMap<&str, usize>,
    names: &[String],
    top: bool,
) {
    match n {
        Node::Lit(s) => write_literal(out, s),
        Node::Class { negated, ranges } => {
            out.push_str("/[");
            if *negated {
                out.push('^');
            }
            // Every character as a code point escape: nothing in the class
            // can then be read as regex syntax or end the `/.../`.
            for &(lo, hi) in ranges {
                let _ = write!(out, "\\x{{{:X}}}", lo as u32);
                if hi != lo {
                    let _ = write!(out, "-\\x{{{:X}}}", hi as u32);
                }
            }
            out.push_str("]/");
        }
        Node::Any => out.push_str("/(?s:.)/"),
        Node::Ref(name, _) => {
            let i = index.get(name.as_str()).copied().unwrap_or_default();
            out.push_str(&names[i]);
        }
        Node::Seq(v) if v.is_empty() => out.push_str("\"\""),
        Node::Seq(v) => {
            for (k, c) in v.iter().enumerate() {
                if k > 0 {
                    out.push(' ');
                }
                let group = matches!(c, Node::Alt(_)) || matches!(c, Node::Seq(s) if s.len() > 1);
                if group {
                    out.push('(');
                }
                write_node(out, c, index, names, false);
                if group {
                    out.push(')');
                }
            }
        }
        Node::Alt(v) => {
            for (k, c) in v.iter().enumerate() {
                if k > 0 {
                    out.push_str(" | ");
                }
                write_node(out, c, index, names, false);
            }
            let _ = top;
        }
        Node::Rep(c, min, max) => {
            let atomic = matches!(
                **c,
                Node::Lit(_) | Node::Class { .. } | Node::Any | Node::Ref(..)
            );
            if !atomic {
                out.push('(');
            }
            write_node(out, c, index, names, false);
            if !atomic {
                out.push(')');
            }
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => {
                    let _ = write!(out, "{{{m},}}");
                }
                (m, Some(n)) if m == n => {
                    let _ = write!(out, "{{{m}}}");
                }
                (m, Some(n)) => {
                    let _ = write!(out, "{{{m},{n}}}");
                }
            }
        }
    }
}

/// A Lark string literal: JSON's escapes, which llguidance's Lark lexer
/// reads, for every character it does not take raw.
pub(crate) fn write_literal(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

type Rule = (String, Node, usize);

impl Parser<'_> {
    fn err<T>(&self, message: impl Into<String>) -> Result<T, GrammarError> {
        Err(GrammarError::Gbnf {
            message: message.into(),
            at: self.pos,
        })
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.src[self.pos..].starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Spaces, tabs and comments; newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn grammar(mut self) -> Result<Vec<Rule>, GrammarError> {
        let mut rules: Vec<Rule> = Vec::new();
        self.space(true);
        while self.peek().is_some() {
            let at = self.pos;
            let name = self.name()?;
            self.space(false);
            if !self.eat("::=") {
                return self.err(format!("expected ::= after the rule name {name}"));
            }
            self.space(true);
            let body = self.alternatives(false, 0)?;
            if rules.iter().any(|(n, _, _)| *n == name) {
                return Err(GrammarError::Gbnf {
                    message: format!("rule {name} is defined twice"),
                    at,
                });
            }
            rules.push((name, body, at));
            match self.peek() {
                None | Some('\n' | '\r') => self.space(true),
                Some(c) => return self.err(format!("unexpected {c:?}")),
            }
        }
        if rules.is_empty() {
            return self.err("the grammar is empty");
        }
        Ok(rules)
    }

    fn name(&mut self) -> Result<String, GrammarError> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            self.pos += 1;
        }
        if self.pos == start {
            return match self.peek() {
                Some(c) => self.err(format!("expected a rule name, found {c:?}")),
                None => self.err("expected a rule name, found the end"),
            };
        }
        Ok(self.src[start..self.pos].to_owned())
    }

    fn alternatives(&mut self, nested: bool, depth: usize) -> Result<Node, GrammarError> {
        let mut alts = vec![self.sequence(nested, depth)?];
        loop {
            self.space(nested);
            if !self.eat("|") {
                break;
            }
            self.space(true);
            alts.push(self.sequence(nested, depth)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().unwrap_or(Node::Seq(Vec::new()))
        } else {
            Node::Alt(alts)
        })
    }

    fn sequence(&mut self, nested: bool, depth: usize) -> Result<Node, GrammarError> {
        let mut items: Vec<Node> = Vec::new();
        loop {
            self.space(nested);
            let Some(c) = self.peek() else { break };
            let item = match c {
                '|' | ')' => break,
                '\n' | '\r' => break,
                '"' => {
                    self.pos += 1;
                    let mut s = String::new();
                    loop {
                        match self.peek() {
                            None => return self.err("unterminated string literal"),
                            Some('"') => {
                                self.pos += 1;
                                break;
                            }
                            Some(_) => s.push(self.char()?),
                        }
                    }
                    Node::Lit(s)
                }
                '[' => {
                    self.pos += 1;
                    let negated = self.eat("^");
                    let mut ranges = Vec::new();
                    loop {
                        match self.peek() {
                            None => return self.err("unterminated character class"),
                            Some(']') => {
                                self.pos += 1;
                                break;
                            }
                            Some(_) => {
                                let lo = self.char()?;
                                let hi = if self.peek() == Some('-')
                                    && self.src[self.pos + 1..]
                                        .chars()
                                        .next()
                                        .is_some_and(|c| c != ']')
                                {
                                    self.pos += 1;
                                    self.char()?
                                } else {
                                    lo
                                };
                                if hi < lo {
                                    return self
                                        .err(format!("the range {lo:?}-{hi:?} is reversed"));
                                }
                                ranges.push((lo, hi));
                            }
                        }
                    }
                    if ranges.is_empty() {
                        return self.err("a character class must hold at least one character");
                    }
                    Node::Class { negated, ranges }
                }
                '.' => {
                    self.pos += 1;
                    Node::Any
                }
                '(' => {
                    if depth >= MAX_DEPTH {
                        return self.err(format!("groups nest deeper than {MAX_DEPTH}"));
                    }
                    self.pos += 1;
                    self.space(true);
                    let inner = self.alternatives(true, depth + 1)?;
                    self.space(true);
                    if !self.eat(")") {
                        return self.err("expected )");
                    }
                    inner
                }
                '<' => {
                    return self.err(
                        "token references (<[id]>, <|token|>) are not supported in GBNF here; \
                         write the text, or send a Lark grammar starting with %llguidance",
                    )
                }
                c if c.is_ascii_alphanumeric() || c == '-' => {
                    let at = self.pos;
                    Node::Ref(self.name()?, at)
                }
                c => return self.err(format!("unexpected {c:?}")),
            };
            items.push(self.postfix(item)?);
        }
        Ok(if items.len() == 1 {
            items.pop().unwrap_or(Node::Seq(Vec::new()))
        } else {
            Node::Seq(items)
        })
    }

    fn postfix(&mut self, mut item: Node) -> Result<Node, GrammarError> {
        let mut wraps = 0;
        loop {
            let (min, max) = match self.peek() {
                Some('*') => (0, None),
                Some('+') => (1, None),
                Some('?') => (0, Some(1)),
                Some('{') => {
                    self.pos += 1;
                    self.space(true);
                    let min = self.int()?;
                    self.space(true);
                    let max = if self.eat(",") {
                        self.space(true);
                        if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            Some(self.int()?)
                        } else {
                            None
                        }
                    } else {
                        Some(min)
                    };
                    self.space(true);
                    if self.peek() != Some('}') {
                        return self.err("expected } to close the repetition");
                    }
                    if max.is_some_and(|m| m < min) {
                        return self.err(format!(
                            "the repetition's maximum {} is below its minimum {min}",
                            max.unwrap_or_default()
                        ));
                    }
                    (min, max)
                }
                _ => return Ok(item),
            };
            self.pos += 1;
            wraps += 1;
            if wraps > MAX_REPEATS {
                return self.err(format!(
                    "at most {MAX_REPEATS} repetition operators may follow one item"
                ));
            }
            item = Node::Rep(Box::new(item), min, max);
        }
    }

    fn int(&mut self) -> Result<u32, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.err("expected a number");
        }
        self.src[start..self.pos]
            .parse()
            .or_else(|_| self.err("the repetition count is too large"))
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char, GrammarError> {
        let Some(c) = self.bump() else {
            return self.err("unexpected end");
        };
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.bump() else {
            return self.err("unterminated escape");
        };
        let hex = |p: &mut Self, n: usize| -> Result<char, GrammarError> {
            let digits = p.src.get(p.pos..p.pos + n).unwrap_or_default();
            if digits.len() != n || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
                return p.err(format!("\\{e} needs {n} hex digits"));
            }
            p.pos += n;
            let v = u32::from_str_radix(digits, 16).unwrap_or(u32::MAX);
            char::from_u32(v).map_or_else(|| p.err(format!("\\{e}{digits} is not a character")), Ok)
        };
        match e {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            _ => self.err(format!("unknown escape \\{e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_and_regular_rules() {
        let lark = to_lark("root ::= \"yes\" | \"no\"").unwrap();
        assert_eq!(lark, "start: \"yes\" | \"no\"\n");
        let lark = to_lark(
            "# a list\nroot ::= item (\",\" item)*\nitem ::= [a-z]+ | num\nnum ::= [0-9]{1,3}\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: T1_ITEM (\",\" T1_ITEM)*\n\
             T1_ITEM: /[\\x{61}-\\x{7A}]/+ | T2_NUM\n\
             T2_NUM: /[\\x{30}-\\x{39}]/{1,3}\n"
        );
    }

    #[test]
    fn recursion_stays_a_rule_and_escapes_survive() {
        let lark = to_lark(
            "root ::= value\nvalue ::= \"[\" ( value (\",\" value)* )? \"]\" | [^\\x00-\\x1F\"\\\\] | \"\\u00e9\\n\"",
        )
        .unwrap();
        assert!(
            lark.contains("r1_value: \"[\" (r1_value (\",\" r1_value)*)? \"]\""),
            "{lark}"
        );
        assert!(lark.contains("/[^\\x{0}-\\x{1F}\\x{22}\\x{5C}]/"), "{lark}");
        assert!(lark.contains("\"é\\n\""), "{lark}");
    }

    #[test]
    fn empty_alternatives_newlines_and_any() {
        let lark = to_lark("root ::= ws .\nws ::= | \" \" |\n   \"\\t\"").unwrap();
        assert_eq!(
            lark,
            "start: T1_WS /(?s:.)/\nT1_WS: \"\" | \" \" | \"\\t\"\n"
        );
    }

    #[test]
    fn bad_grammars_are_named_errors() {
        for (src, want) in [
            ("", "empty"),
            ("item ::= \"a\"", "no root"),
            ("root ::= item", "not defined"),
            ("root \"a\"", "::="),
            ("root ::= \"a", "unterminated string"),
            ("root ::= [a-", "unterminated character class"),
            ("root ::= [z-a]", "reversed"),
            ("root ::= \"a\"{3,1}", "below its minimum"),
            ("root ::= (\"a\"", "expected )"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= <[12]>", "token references"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= \"a\" @", "unexpected '@'"),
        ] {
            let e = to_lark(src).unwrap_err().to_string();
            assert!(e.contains(want), "{src:?}: {e}");
        }
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(200), ")".repeat(200));
        assert!(to_lark(&deep)
            .unwrap_err()
            .to_string()
            .contains("nest deeper"));
        let reps = format!("root ::= \"a\"{}", "*".repeat(200));
        assert!(to_lark(&reps)
            .unwrap_err()
            .to_string()
            .contains("repetition operators"));
    }
}
