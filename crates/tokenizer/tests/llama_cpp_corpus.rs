//! The tokenizer against llama.cpp's own tokenizer test corpus: the
//! vocabulary-only `ggml-vocab-*.gguf` files of llama.cpp's `models/`, each
//! with `.gguf.inp` (inputs separated by `__ggml_vocab_test__` lines) and
//! `.gguf.out` (one line of ids per input, from llama.cpp's
//! `common_tokenize(ctx, text, add_special = false, parse_special = false)`,
//! as its `test-tokenizer-0` checks them).
//!
//! The corpus comes from `scripts/fetch-vocabs.sh` (into `$LAMINA_VOCABS`,
//! default `~/.cache/lamina/vocabs`); without it these tests fail.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::path::{Path, PathBuf};

use lamina_gguf::{LoadMode, Model};
use lamina_tokenizer::{Tokenizer, TokenizerError};

/// llama.cpp's separator between inputs in a `.inp` file.
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn vocabs_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LAMINA_VOCABS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/lamina/vocabs")
}

/// Every `ggml-vocab-*.gguf` in the corpus, sorted by name.
fn corpus() -> Vec<PathBuf> {
    let dir = vocabs_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "the llama.cpp vocabulary corpus {} is unreadable ({e}): \
             run scripts/fetch-vocabs.sh (set LAMINA_VOCABS to its directory)",
            dir.display()
        )
    });
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("ggml-vocab-") && name.ends_with(".gguf")
        })
        .collect();
    files.sort();
    assert!(
        files.len() >= 19,
        "{} holds {} vocabularies, expected llama.cpp's 19: run scripts/fetch-vocabs.sh",
        dir.display(),
        files.len()
    );
    files
}

fn name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

fn sidecar(path: &Path, ext: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

fn load(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let model = Model::open(path, LoadMode::Mmap)
        .unwrap_or_else(|e| panic!("{}: not a readable GGUF: {e}", path.display()));
    Tokenizer::from_gguf(&model)
}

/// The inputs and expected ids of one file, parsed as `test-tokenizer-0`
/// does (the text after the last separator is not an input).
fn cases(path: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(sidecar(path, ".inp")).unwrap();
    let out = std::fs::read_to_string(sidecar(path, ".out")).unwrap();
    let mut inputs: Vec<&str> = inp.split(SEPARATOR).collect();
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let expected: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        expected.len(),
        "{}: .inp and .out disagree on the number of inputs",
        name(path)
    );
    inputs
        .into_iter()
        .map(str::to_owned)
        .zip(expected)
        .collect()
}

/// Shortens an id list for a failure message.
fn show(ids: &[u32]) -> String {
    if ids.len() <= 24 {
        format!("{ids:?}")
    } else {
        format!("{:?} … ({} ids)", &ids[..24], ids.len())
    }
}

#[test]
fn ids_equal_llama_cpps_for_every_corpus_vocabulary() {
    let mut failures = Vec::new();
    let mut files = 0;
    let mut inputs = 0;
    for path in corpus() {
        if !sidecar(&path, ".inp").exists() {
            continue;
        }
        files += 1;
        let tok = match load(&path) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{}: not loaded: {e}", name(&path)));
                continue;
            }
        };
        for (i, (text, want)) in cases(&path).into_iter().enumerate() {
            inputs += 1;
            let got = tok.encode(&text, false, false);
            if got != want {
                failures.push(format!(
                    "{} input {i} {text:?}\n  llama.cpp {}\n  lamina    {}",
                    name(&path),
                    show(&want),
                    show(&got)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {inputs} inputs over {files} vocabularies differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // llama.cpp 0.3.36's corpus: 15 vocabularies with inputs, among them
    // WordPiece (bert-bge), Gemma 4 and the deepseek-llm pre-tokenizer.
    assert!(files >= 15, "only {files} vocabularies had inputs");
}

/// The corpus files that come without inputs: each must load, or fail with
/// the typed error that says why.
#[test]
fn vocabularies_without_inputs_load_or_say_why() {
    let mut seen = 0;
    for path in corpus() {
        if sidecar(&path, ".inp").exists() {
            continue;
        }
        seen += 1;
        let n = name(&path);
        match (n.as_str(), load(&path)) {
            // Unigram (`t5`) vocabularies are not implemented: refused by
            // name, not misread as another model.
            ("ggml-vocab-nomic-bert-moe.gguf", Err(TokenizerError::UnsupportedModel(m))) => {
                assert_eq!(m, "t5");
            }
            ("ggml-vocab-nomic-bert-moe.gguf", other) => {
                panic!("{n}: expected the t5 model to be refused, got {other:?}")
            }
            // aquila and gpt-neox are `gpt2` files from before
            // `tokenizer.ggml.pre` (llama.cpp falls back to "default"),
            // baichuan is a `llama` SentencePiece vocabulary.
            (_, Ok(tok)) => {
                assert!(tok.vocab_size() > 0, "{n}: empty vocabulary");
                let ids = tok.encode("Hello world", false, false);
                assert!(!ids.is_empty(), "{n}: plain text gave no ids");
                assert_eq!(tok.decode(&ids).trim_start(), "Hello world", "{n}");
            }
            (_, Err(e)) => panic!("{n}: {e}"),
        }
    }
    // aquila, baichuan, gpt-neox, nomic-bert-moe.
    assert!(seen >= 4, "only {seen} vocabularies without inputs");
}

/// Strings that stress normalizers and splitters: every loadable corpus
/// vocabulary must turn them into ids inside the vocabulary, with and
/// without special tokens, and decode those ids again, without panicking.
#[test]
fn hostile_strings_give_ids_inside_the_vocabulary() {
    let long_word = "x".repeat(5000);
    let hostile = [
        "\u{0301}\u{0308}",
        "a\u{0}b\u{FFFD}c",
        "\u{200D}\u{FE0F}\u{202E}abc\u{202C}",
        "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
        "   \t\u{3000}\u{85}\u{A0} ",
        "가각갂 ㄱ ᄀ 𠀀 \u{10FFFF} \u{E000}",
        "İıẞß ǅ Σς",
        "[CLS] <bos> <|endoftext|> <0x41> ▁▁",
        &long_word,
    ];
    for path in corpus() {
        let Ok(tok) = load(&path) else { continue };
        let n = tok.vocab_size();
        for s in hostile {
            for (add, parse) in [(false, false), (true, true)] {
                let ids = tok.encode(s, add, parse);
                assert!(
                    ids.iter().all(|&id| (id as usize) < n),
                    "{}: {s:?} gave an id outside the vocabulary of {n}: {ids:?}",
                    name(&path)
                );
                let _ = tok.decode(&ids);
            }
        }
    }
}
