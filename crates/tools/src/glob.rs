//! llama.cpp's glob (`common.cpp`'s `glob_match`): `*` any run of
//! characters but `/`, `**` any run including `/`, `?` one character but
//! `/`, `[...]` a class (`!` negates, `a-z` ranges). Matched by a memoised
//! recursion, so `*a*a*a*b` cannot take exponential time.

use std::path::Path;

/// Longest pattern accepted: the match table is pattern × path cells.
pub(crate) const MAX_PATTERN: usize = 1024;

/// A pattern with no `/` matches the base name at any depth; one with a
/// `/` matches the whole relative path, with `**/` put in front unless it
/// starts with `**/`, `/` or is `**`.
pub(crate) fn path_match(pattern: &str, rel: &str) -> bool {
    if !pattern.contains('/') {
        let base = Path::new(rel)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return glob_match(pattern, &base);
    }
    if pattern == "**" || pattern.starts_with("**/") || pattern.starts_with('/') {
        return glob_match(pattern, rel);
    }
    glob_match(&format!("**/{pattern}"), rel)
}

pub(crate) fn glob_match(pattern: &str, s: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = s.chars().collect();
    let mut memo = vec![None; (p.len() + 1) * (s.len() + 1)];
    Matcher {
        p: &p,
        s: &s,
        memo: &mut memo,
    }
    .at(0, 0)
}

struct Matcher<'a> {
    p: &'a [char],
    s: &'a [char],
    memo: &'a mut [Option<bool>],
}

impl Matcher<'_> {
    fn at(&mut self, pi: usize, si: usize) -> bool {
        let key = pi * (self.s.len() + 1) + si;
        if let Some(v) = self.memo[key] {
            return v;
        }
        let v = self.compute(pi, si);
        self.memo[key] = Some(v);
        v
    }

    fn compute(&mut self, pi: usize, si: usize) -> bool {
        let (p, s) = (self.p, self.s);
        let Some(&pc) = p.get(pi) else {
            return si == s.len();
        };
        let sc = s.get(si).copied();
        if pc == '*' && p.get(pi + 1) == Some(&'*') {
            return self.at(pi + 2, si) || (sc.is_some() && self.at(pi, si + 1));
        }
        if pc == '*' {
            return self.at(pi + 1, si) || (sc.is_some_and(|c| c != '/') && self.at(pi, si + 1));
        }
        if pc == '?' {
            return sc.is_some_and(|c| c != '/') && self.at(pi + 1, si + 1);
        }
        if pc == '[' {
            let mut end = pi + 1;
            if matches!(p.get(end), Some(']') | Some('-')) {
                end += 1;
            }
            while end < p.len() && p[end] != ']' {
                end += 1;
            }
            if end < p.len() {
                let Some(c) = sc else { return false };
                return class_match(c, &p[pi + 1..end]) && self.at(end + 1, si + 1);
            }
            // No closing bracket: a literal '['.
            return sc == Some('[') && self.at(pi + 1, si + 1);
        }
        sc == Some(pc) && self.at(pi + 1, si + 1)
    }
}

fn class_match(c: char, class: &[char]) -> bool {
    let mut i = 0;
    let negated = class.first() == Some(&'!');
    if negated {
        i = 1;
    }
    if matches!(class.get(i), Some(']') | Some('-')) {
        if class[i] == c {
            return !negated;
        }
        i += 1;
    }
    let mut matched = false;
    while i < class.len() {
        if i + 2 < class.len() && class[i + 1] == '-' && class[i + 2] != ']' {
            if (class[i]..=class[i + 2]).contains(&c) {
                matched = true;
                break;
            }
            i += 3;
        } else {
            if class[i] == c {
                matched = true;
                break;
            }
            i += 1;
        }
    }
    matched != negated
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_and_classes() {
        assert!(glob_match("*.cpp", "main.cpp"));
        assert!(!glob_match("*.cpp", "src/main.cpp"));
        assert!(glob_match("**/*.cpp", "src/a/main.cpp"));
        assert!(glob_match("**", "a/b"));
        assert!(glob_match("file?.[ch]", "file1.h"));
        assert!(!glob_match("file?.[!ch]", "file1.h"));
        assert!(glob_match("[a-c]x", "bx"));
        assert!(glob_match("a[", "a["));
    }

    #[test]
    fn path_patterns() {
        assert!(path_match("*.txt", "a/b/c.txt"));
        assert!(path_match("b/*.txt", "a/b/c.txt"));
        assert!(!path_match("b/*.txt", "a/bb/c.txt"));
        assert!(path_match("*proj*", "project-alpha"));
    }

    #[test]
    fn many_stars_stay_fast() {
        let t = std::time::Instant::now();
        let s = "a".repeat(200);
        assert!(!glob_match(&format!("{}b", "*a".repeat(40)), &s));
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }
}
