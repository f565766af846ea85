//! Which files of a repo a name means: `org/repo[:QUANT]` parsed, and the
//! `.gguf` for the quant picked from the repo's file list the way llama.cpp's
//! `-hf` picks it (the tag matched case-insensitively in the file name,
//! `mmproj` projectors left out, a split model taken as its whole set, and
//! without a tag Q4_K_M first, else the first `.gguf`).

use super::HubError;

/// The quant llama.cpp takes when the name has no tag.
const DEFAULT_QUANT: &str = "Q4_K_M";

/// `org/repo` and the optional `:QUANT` of a model name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    pub repo: String,
    pub tag: Option<String>,
}

impl RepoRef {
    /// Parses `org/repo` or `org/repo:QUANT`; anything else is an error
    /// naming the input.
    pub fn parse(name: &str) -> Result<Self, HubError> {
        let bad = || HubError::BadName(name.to_string());
        let (repo, tag) = match name.split_once(':') {
            Some((repo, tag)) if !tag.is_empty() && !tag.contains(['/', ':']) => {
                (repo, Some(tag.to_string()))
            }
            Some(_) => return Err(bad()),
            None => (name, None),
        };
        let (org, model) = repo.split_once('/').ok_or_else(bad)?;
        let part_ok = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !part_ok(org) || !part_ok(model) {
            return Err(bad());
        }
        Ok(Self {
            repo: repo.to_string(),
            tag,
        })
    }
}

/// `name-00001-of-00003.gguf` → (`name`, 1, 3); `None` for a whole file.
fn split_parts(file: &str) -> Option<(&str, u32, u32)> {
    let stem = file.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((prefix, no.parse().ok()?, count.parse().ok()?))
}

/// The files a model can start from: `.gguf`, no projector, a split model
/// by its first shard.
fn candidates(files: &[String]) -> Vec<&str> {
    files
        .iter()
        .map(String::as_str)
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .filter(|f| !f.to_ascii_lowercase().contains("mmproj"))
        .filter(|f| split_parts(f).is_none_or(|(_, no, _)| no == 1))
        .collect()
}

/// The quant a file name carries (`SmolLM2-135M.Q4_1.gguf` → `Q4_1`), for
/// the list of what a repo offers; the file name where none is recognised.
pub fn quant_of(file: &str) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    let stem = match split_parts(base) {
        Some((prefix, _, _)) => prefix,
        None => base.strip_suffix(".gguf").unwrap_or(base),
    };
    let is_quant = |t: &str| {
        let u = t.to_ascii_uppercase();
        let after = |p: &str| {
            u.strip_prefix(p)
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        };
        after("Q") || after("IQ") || after("TQ") || matches!(u.as_str(), "F16" | "BF16" | "F32")
    };
    stem.split(['-', '.'])
        .rev()
        .find(|t| is_quant(t))
        .map(str::to_ascii_uppercase)
        .unwrap_or_else(|| base.to_string())
}

/// Whether `tag` occurs in `file`, ignoring case; `exact` also wants it
/// bounded (so `Q4_K` prefers `x.Q4_K.gguf` over `x.Q4_K_M.gguf`).
fn matches(file: &str, tag: &str, exact: bool) -> bool {
    let f = file.to_ascii_uppercase();
    let t = tag.to_ascii_uppercase();
    f.match_indices(&t).any(|(i, _)| {
        let next = f[i + t.len()..].chars().next();
        !exact || next.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    })
}

/// The files to fetch for `tag` (or `hf_file`) from the repo's `files`: one
/// name, or every shard of a split model, first shard first.
pub fn select(
    repo: &str,
    files: &[String],
    tag: Option<&str>,
    hf_file: Option<&str>,
) -> Result<Vec<String>, HubError> {
    let first = if let Some(want) = hf_file {
        files
            .iter()
            .find(|f| f.as_str() == want)
            .ok_or_else(|| HubError::NoFile {
                repo: repo.to_string(),
                file: want.to_string(),
                available: candidates(files).join(", "),
            })?
            .as_str()
    } else {
        let cands = candidates(files);
        if cands.is_empty() {
            return Err(HubError::NoGguf {
                repo: repo.to_string(),
            });
        }
        let pick = |t: &str| {
            cands
                .iter()
                .find(|f| matches(f, t, true))
                .or_else(|| cands.iter().find(|f| matches(f, t, false)))
                .copied()
        };
        match tag {
            Some(t) => pick(t).ok_or_else(|| {
                let mut quants: Vec<String> = cands.iter().map(|f| quant_of(f)).collect();
                quants.dedup();
                HubError::NoMatch {
                    repo: repo.to_string(),
                    tag: t.to_string(),
                    available: quants.join(", "),
                }
            })?,
            None => pick(DEFAULT_QUANT).unwrap_or(cands[0]),
        }
    };
    let Some((prefix, _, count)) = split_parts(first) else {
        return Ok(vec![first.to_string()]);
    };
    let shards: Vec<String> = (1..=count)
        .map(|no| format!("{prefix}-{no:05}-of-{count:05}.gguf"))
        .collect();
    if let Some(missing) = shards.iter().find(|s| !files.contains(s)) {
        return Err(HubError::NoFile {
            repo: repo.to_string(),
            file: missing.clone(),
            available: candidates(files).join(", "),
        });
    }
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_names() {
        let r = RepoRef::parse("org/repo:q4_k_m").unwrap();
        assert_eq!(r.repo, "org/repo");
        assert_eq!(r.tag.as_deref(), Some("q4_k_m"));
        assert_eq!(RepoRef::parse("a/b").unwrap().tag, None);
        for bad in [
            "repo", "a/b/c", "a/b:", "/b", "a/", "../b", "a/b:x/y", "a b/c",
        ] {
            assert!(RepoRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn picks_the_tag_case_insensitively_without_projectors() {
        let files = names(&[
            "README.md",
            "mmproj-model-Q4_K_M.gguf",
            "model-Q4_K_M.gguf",
            "model-Q4_K_S.gguf",
            "model-Q8_0.gguf",
        ]);
        assert_eq!(
            select("o/r", &files, Some("q8_0"), None).unwrap(),
            ["model-Q8_0.gguf"]
        );
        assert_eq!(
            select("o/r", &files, None, None).unwrap(),
            ["model-Q4_K_M.gguf"]
        );
        // A bounded match beats a prefix of a longer quant.
        let files = names(&["m-Q4_K_M.gguf", "m-Q4_K.gguf"]);
        assert_eq!(
            select("o/r", &files, Some("Q4_K"), None).unwrap(),
            ["m-Q4_K.gguf"]
        );
    }

    #[test]
    fn without_q4_k_m_takes_the_first_gguf() {
        let files = names(&["a.Q4_1.gguf", "a.Q8_0.gguf"]);
        assert_eq!(select("o/r", &files, None, None).unwrap(), ["a.Q4_1.gguf"]);
    }

    #[test]
    fn a_split_model_is_its_whole_set() {
        let files = names(&[
            "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf",
            "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
            "m-Q8_0.gguf",
        ]);
        assert_eq!(
            select("o/r", &files, Some("Q4_K_M"), None).unwrap(),
            [
                "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf",
                "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf"
            ]
        );
        let missing = names(&["m-00001-of-00002.gguf"]);
        assert!(select("o/r", &missing, None, None).is_err());
    }

    #[test]
    fn no_match_lists_the_quants() {
        let files = names(&["a.Q4_1.gguf", "a-Q8_0.gguf", "mmproj-F16.gguf"]);
        let e = select("o/r", &files, Some("Q5_K_M"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Q4_1, Q8_0"), "{e}");
        assert!(!e.contains("F16"), "{e}");
        let e = select("o/r", &names(&["README.md"]), None, None).unwrap_err();
        assert!(matches!(e, HubError::NoGguf { .. }), "{e}");
    }

    #[test]
    fn hf_file_names_the_file() {
        let files = names(&["a.Q4_1.gguf", "a.Q8_0.gguf"]);
        assert_eq!(
            select("o/r", &files, None, Some("a.Q8_0.gguf")).unwrap(),
            ["a.Q8_0.gguf"]
        );
        assert!(select("o/r", &files, None, Some("b.gguf")).is_err());
    }
}
