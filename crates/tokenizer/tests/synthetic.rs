//! Small hand-built vocabularies: the SentencePiece merge order, byte
//! fallback, the dummy prefix, special-token splitting, text-detected
//! end-of-generation tokens, byte-level BPE, WordPiece and its normalizer
//! keys, Gemma 4's raw-UTF-8 BPE, and every way the metadata can be
//! unusable.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::collections::HashMap;

use lamina_gguf::{Array, File, Model, Value, Writer};
use lamina_tokenizer::{Tokenizer, TokenizerError, VocabKind};

type Meta = HashMap<String, Value>;

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| (*s).to_owned()).collect()))
}

/// An SPM vocabulary: `<unk> <s> </s>`, the 256 byte tokens, then `pieces`
/// as (text, score, type).
fn spm(pieces: &[(&str, f32, i32)]) -> Meta {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0.0f32; 3];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    for &(t, s, ty) in pieces {
        tokens.push(t.to_owned());
        scores.push(s);
        types.push(ty);
    }
    Meta::from([
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::F32(scores)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
    ])
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    tok.token_id(text)
        .unwrap_or_else(|| panic!("{text:?} not in vocabulary"))
}

fn texts(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&i| tok.token_text(i).unwrap().to_owned())
        .collect()
}

#[test]
fn spm_merges_by_score_leftmost_first() {
    let a_first = spm(&[
        ("▁", -1.0, 1),
        ("a", -1.0, 1),
        ("b", -1.0, 1),
        ("▁a", -2.0, 1),
        ("ab", -3.0, 1),
    ]);
    let tok = Tokenizer::from_metadata(&a_first).unwrap();
    assert_eq!(tok.kind(), VocabKind::Spm);
    assert_eq!(texts(&tok, &tok.encode("ab", false, false)), ["▁a", "b"]);
    let b_first = spm(&[
        ("▁", -1.0, 1),
        ("a", -1.0, 1),
        ("b", -1.0, 1),
        ("▁a", -3.0, 1),
        ("ab", -2.0, 1),
    ]);
    let tok = Tokenizer::from_metadata(&b_first).unwrap();
    assert_eq!(texts(&tok, &tok.encode("ab", false, false)), ["▁", "ab"]);
    // Equal scores: the leftmost pair merges first.
    let tie = spm(&[("a", -1.0, 1), ("aa", -2.0, 1)]);
    let mut m = tie;
    m.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
    let tok = Tokenizer::from_metadata(&m).unwrap();
    assert_eq!(texts(&tok, &tok.encode("aaa", false, false)), ["aa", "a"]);
}

#[test]
fn spm_bos_prefix_and_byte_fallback() {
    let m = spm(&[
        ("▁", -1.0, 1),
        ("h", -1.0, 1),
        ("i", -1.0, 1),
        ("▁hi", -0.5, 1),
        ("hi", -0.6, 1),
    ]);
    let tok = Tokenizer::from_metadata(&m).unwrap();
    // llama defaults: BOS 1 added, dummy prefix on.
    assert_eq!(tok.bos(), Some(1));
    assert!(tok.add_bos());
    let ids = tok.encode("hi hé", true, false);
    assert_eq!(
        texts(&tok, &ids),
        ["<s>", "▁hi", "▁", "h", "<0xC3>", "<0xA9>"]
    );
    // The dummy prefix is removed from the first piece; when that is a
    // (hidden) BOS the next piece keeps its space, as in llama.cpp.
    assert_eq!(tok.decode(&ids[1..]), "hi hé");
    assert_eq!(tok.decode(&ids), " hi hé");
    assert_eq!(tok.decode_with(&ids, true), "<s> hi hé");
    assert_eq!(tok.token_to_piece(id(&tok, "<0xC3>")), [0xC3]);
    assert!(tok.token_to_piece(1).is_empty());
    assert_eq!(tok.token_to_piece_with(1, true), b"<s>");
    assert!(tok.is_eog(2) && !tok.is_eog(1));

    let mut off = m.clone();
    off.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
    off.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(false));
    let tok = Tokenizer::from_metadata(&off).unwrap();
    assert_eq!(texts(&tok, &tok.encode("hi", true, false)), ["hi"]);
}

#[test]
fn special_tokens_are_split_out_first() {
    let m = spm(&[
        ("▁", -1.0, 1),
        ("a", -1.0, 1),
        ("▁a", -0.5, 1),
        ("<ctl>", 0.0, 3),
        ("<ud>", 0.0, 4),
        ("<ctl><ud>", 0.0, 3),
    ]);
    let tok = Tokenizer::from_metadata(&m).unwrap();
    // Parsing specials: the longest special wins, a dummy prefix follows it.
    assert_eq!(
        texts(&tok, &tok.encode("a<ctl><ud>a<ctl>", false, true)),
        ["▁a", "<ctl><ud>", "▁a", "<ctl>"]
    );
    // Not parsing: control text is plain text (bytes here), user-defined
    // tokens are still cut out.
    let ids = tok.encode("<ctl>a<ud>", false, false);
    let t = texts(&tok, &ids);
    assert_eq!(t.first().map(String::as_str), Some("▁"));
    assert!(!t.contains(&"<ctl>".to_owned()));
    assert_eq!(t.iter().filter(|x| *x == "<ud>").count(), 1);
    assert_eq!(tok.decode(&ids), "<ctl>a<ud>");
    // Control tokens vanish from decoded text unless asked for.
    let ids = tok.encode("a<ctl>", false, true);
    assert_eq!(tok.decode(&ids), "a");
    assert_eq!(tok.decode_with(&ids, true), "a<ctl>");
}

#[test]
fn phi3_special_tokens_swallow_following_whitespace() {
    let mut m = spm(&[
        ("▁", -1.0, 1),
        ("h", -1.0, 1),
        ("i", -1.0, 1),
        ("▁hi", -0.5, 1),
        ("hi", -0.6, 1),
        ("<|user|>", 0.0, 3),
    ]);
    let plain = Tokenizer::from_metadata(&m).unwrap();
    let with_space = texts(&plain, &plain.encode("<|user|> hi", false, true));
    assert_eq!(with_space, ["<|user|>", "▁", "▁hi"]);
    m.insert("general.name".into(), Value::String("Phi-3 mini".into()));
    let phi = Tokenizer::from_metadata(&m).unwrap();
    assert_eq!(
        texts(&phi, &phi.encode("<|user|> \n hi", false, true)),
        ["<|user|>", "▁hi"]
    );
    // BOS is exempt.
    assert_eq!(
        texts(&phi, &phi.encode("<s> hi", false, true)),
        ["<s>", "▁", "▁hi"]
    );
}

#[test]
fn end_of_generation_tokens_found_by_text() {
    let m = spm(&[
        ("<end_of_turn>", 0.0, 1),
        ("<|im_end|>", 0.0, 3),
        ("<unused7>", 0.0, 3),
    ]);
    let tok = Tokenizer::from_metadata(&m).unwrap();
    let eot = id(&tok, "<end_of_turn>");
    // Promoted to control with eot set to the first match.
    assert_eq!(tok.eot(), Some(eot));
    assert!(tok.is_control(eot));
    assert!(tok.is_eog(eot) && tok.is_eog(id(&tok, "<|im_end|>")) && tok.is_eog(2));
    assert!(!tok.is_eog(id(&tok, "<unused7>")));
    assert_eq!(tok.eog_ids().count(), 3);
}

/// A byte-level BPE vocabulary over the given merges; every token a merge
/// produces, and every byte of the test texts, is in the vocabulary.
fn bpe(pre: &str, extra: &[(&str, i32)], merges: &[&str]) -> Meta {
    let mut tokens: Vec<String> = Vec::new();
    let mut types = Vec::new();
    for c in "Hi,!'sthreĠ".chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    for &(t, ty) in extra {
        tokens.push(t.to_owned());
        types.push(ty);
    }
    Meta::from([
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.merges".into(), strings(merges)),
    ])
}

#[test]
fn byte_level_bpe_by_merge_rank() {
    let merges = ["H i", "Ġ t", "h e", "Ġt he", "r e", "Ġthe re"];
    let m = bpe("gpt-2", &[("<|endoftext|>", 3)], &merges);
    let tok = Tokenizer::from_metadata(&m).unwrap();
    assert_eq!(tok.kind(), VocabKind::Bpe);
    assert_eq!(tok.pre(), Some("gpt-2"));
    let ids = tok.encode("Hi there!", true, true);
    assert_eq!(texts(&tok, &ids), ["Hi", "Ġthere", "!"]);
    assert_eq!(tok.decode(&ids), "Hi there!");
    assert_eq!(tok.token_to_piece(id(&tok, "Ġthere")), b" there");
    // gpt2 has no BOS by default; <|endoftext|> ends generation.
    assert!(!tok.add_bos());
    let eot = id(&tok, "<|endoftext|>");
    assert!(tok.is_eog(eot));
    assert_eq!(
        texts(&tok, &tok.encode("Hi<|endoftext|>", false, true)),
        ["Hi", "<|endoftext|>"]
    );
    // gpt-2 cleans spaces when decoding, as llama.cpp's clean_spaces.
    let spaced = [
        id(&tok, "Hi"),
        id(&tok, "Ġ"),
        id(&tok, ","),
        id(&tok, "Ġ"),
        id(&tok, "'"),
        id(&tok, "s"),
    ];
    assert_eq!(tok.decode(&spaced), "Hi,'s");
    // A missing merge leaves the pieces apart.
    let tok = Tokenizer::from_metadata(&bpe("gpt-2", &[], &["H i"])).unwrap();
    assert_eq!(
        texts(&tok, &tok.encode(" the", false, false)),
        ["Ġ", "t", "h", "e"]
    );
}

#[test]
fn smollm_splits_digits_and_ignores_no_merges() {
    let m = bpe("smollm", &[("1", 1), ("2", 1), ("12", 1)], &["H i"]);
    let tok = Tokenizer::from_metadata(&m).unwrap();
    // "12" is a token, but the \p{N} pre-split keeps digits apart.
    assert_eq!(
        texts(&tok, &tok.encode("Hi12", false, false)),
        ["Hi", "1", "2"]
    );
}

fn err(m: &Meta) -> String {
    Tokenizer::from_metadata(m).unwrap_err().to_string()
}

#[test]
fn unusable_metadata_is_an_error_naming_the_key() {
    let good = spm(&[]);

    let mut m = good.clone();
    m.remove("tokenizer.ggml.model");
    assert!(err(&m).contains("tokenizer.ggml.model"));

    let mut m = good.clone();
    m.insert("tokenizer.ggml.model".into(), Value::String("t5".into()));
    assert!(matches!(
        Tokenizer::from_metadata(&m),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    m.insert(
        "tokenizer.ggml.model".into(),
        Value::String("sentencepiece".into()),
    );
    assert!(matches!(
        Tokenizer::from_metadata(&m),
        Err(TokenizerError::UnknownModel(_))
    ));
    m.insert("tokenizer.ggml.model".into(), Value::U32(1));
    assert!(err(&m).contains("tokenizer.ggml.model"));

    let mut m = good.clone();
    m.remove("tokenizer.ggml.tokens");
    assert!(err(&m).contains("tokenizer.ggml.tokens is missing"));
    m.insert(
        "tokenizer.ggml.tokens".into(),
        Value::Array(Array::U32(vec![1, 2])),
    );
    assert!(
        err(&m).contains("tokenizer.ggml.tokens holds an array of UINT32"),
        "{}",
        err(&m)
    );
    m.insert("tokenizer.ggml.tokens".into(), strings(&[]));
    assert!(matches!(
        Tokenizer::from_metadata(&m),
        Err(TokenizerError::EmptyVocab)
    ));
    m.insert("tokenizer.ggml.tokens".into(), strings(&["a", "b", "a"]));
    m.remove("tokenizer.ggml.scores");
    m.remove("tokenizer.ggml.token_type");
    assert!(
        err(&m).contains("duplicate token \"a\" at ids 0 and 2"),
        "{}",
        err(&m)
    );

    let mut m = good.clone();
    m.insert(
        "tokenizer.ggml.scores".into(),
        Value::Array(Array::F32(vec![0.0; 3])),
    );
    assert!(
        err(&m).contains("tokenizer.ggml.scores has 3 entries"),
        "{}",
        err(&m)
    );
    m.insert("tokenizer.ggml.scores".into(), strings(&["x"]));
    assert!(err(&m).contains("tokenizer.ggml.scores"));

    let mut m = good.clone();
    m.insert(
        "tokenizer.ggml.token_type".into(),
        Value::Array(Array::I32(vec![1])),
    );
    assert!(
        err(&m).contains("tokenizer.ggml.token_type has 1 entries"),
        "{}",
        err(&m)
    );

    let mut m = good.clone();
    m.insert("tokenizer.ggml.add_bos_token".into(), Value::U8(1));
    assert!(err(&m).contains("tokenizer.ggml.add_bos_token"));
    let mut m = good.clone();
    m.insert(
        "tokenizer.ggml.bos_token_id".into(),
        Value::String("1".into()),
    );
    assert!(err(&m).contains("tokenizer.ggml.bos_token_id"));

    // A BPE file: unknown pre, missing merges, add_bos without a BOS id.
    let b = bpe("gpt-2", &[], &["H i"]);
    let mut m = b.clone();
    m.insert(
        "tokenizer.ggml.pre".into(),
        Value::String("no-such-pre".into()),
    );
    assert!(
        err(&m).contains("unknown pre-tokenizer type \"no-such-pre\""),
        "{}",
        err(&m)
    );
    let mut m = b.clone();
    m.remove("tokenizer.ggml.merges");
    assert!(err(&m).contains("tokenizer.ggml.merges is missing"));
    let mut m = b.clone();
    // gpt2's placeholder BOS (11) is past this vocabulary, so it is disabled.
    m.insert("tokenizer.ggml.tokens".into(), strings(&["H", "i", "Hi"]));
    m.remove("tokenizer.ggml.token_type");
    m.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(true));
    assert!(matches!(
        Tokenizer::from_metadata(&m),
        Err(TokenizerError::MissingSpecial {
            flag_key: "tokenizer.ggml.add_bos_token",
            ..
        })
    ));
}

#[test]
fn out_of_range_special_ids_are_ignored() {
    let mut m = spm(&[]);
    m.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(1_000_000));
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::I32(-1));
    let tok = Tokenizer::from_metadata(&m).unwrap();
    // The defaults stay.
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
}

#[test]
fn from_a_written_gguf_file() {
    let mut w = Writer::new();
    let mut keys: Vec<_> = spm(&[("▁a", -1.0, 1)]).into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, v) in keys {
        w = w.kv(k, v);
    }
    let file = File::from_bytes(w.to_bytes()).unwrap();
    let model = Model::from_shards(vec![file]).unwrap();
    let tok = Tokenizer::from_gguf(&model).unwrap();
    assert_eq!(texts(&tok, &tok.encode("a", true, false)), ["<s>", "▁a"]);
}

#[test]
fn tokenizer_and_detokenizer_cross_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<lamina_tokenizer::Detokenizer>();
}

/// A `bert` vocabulary: `[PAD] [UNK] [CLS] [SEP]`, then `pieces` (NORMAL).
/// The special ids are the file's, not llama.cpp's BERT defaults (101…),
/// which fall outside so small a vocabulary.
fn bert(pieces: &[&str], with_unk: bool) -> Meta {
    let mut tokens: Vec<&str> = vec!["[PAD]", "[UNK]", "[CLS]", "[SEP]"];
    tokens.extend_from_slice(pieces);
    let mut types = vec![3; 4];
    types.resize(tokens.len(), 1);
    let mut m = Meta::from([
        ("tokenizer.ggml.model".into(), Value::String("bert".into())),
        ("tokenizer.ggml.tokens".into(), strings(&tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.seperator_token_id".into(), Value::U32(3)),
    ]);
    if with_unk {
        m.insert("tokenizer.ggml.unknown_token_id".into(), Value::U32(1));
    }
    m
}

#[test]
fn wordpiece_longest_match_normalized_with_unk_and_cls_sep() {
    let words = ["▁hello", "▁hel", "lo", "▁world", "▁!", "▁,", "x"];
    let tok = Tokenizer::from_metadata(&bert(&words, true)).unwrap();
    assert_eq!(tok.kind(), VocabKind::Wpm);
    let enc = |s: &str| texts(&tok, &tok.encode(s, false, false));
    // Lowercased, accents stripped, punctuation split off as its own word.
    assert_eq!(enc("Héllo, WORLD!"), ["▁hello", "▁,", "▁world", "▁!"]);
    // Longest piece first, continuations bare.
    assert_eq!(enc("hellolo"), ["▁hello", "lo"]);
    assert_eq!(enc("hellox"), ["▁hello", "x"]);
    // One uncoverable position discards the whole word.
    assert_eq!(enc("helloq world"), ["[UNK]", "▁world"]);
    assert!(enc(" \t\n").is_empty());

    assert!(tok.add_bos() && tok.add_sep() && !tok.add_eos());
    let ids = tok.encode("hello", true, false);
    assert_eq!(texts(&tok, &ids), ["[CLS]", "▁hello", "[SEP]"]);
    // llama.cpp keeps the first word's space and hides [CLS]/[SEP].
    assert_eq!(tok.decode(&ids), " hello");
    assert_eq!(
        tok.decode(&tok.encode("hello , world !", false, false)),
        " hello, world!"
    );

    // A file without an unknown token: the word vanishes, nothing panics.
    let tok = Tokenizer::from_metadata(&bert(&words, false)).unwrap();
    assert_eq!(tok.specials().unk, None);
    assert_eq!(
        texts(&tok, &tok.encode("q hello", false, false)),
        ["▁hello"]
    );
}

#[test]
fn wordpiece_normalizer_keys_are_read() {
    let mut m = bert(&["▁Héllo", "▁hello"], true);
    m.insert(
        "tokenizer.ggml.normalizer.lowercase".into(),
        Value::Bool(false),
    );
    let tok = Tokenizer::from_metadata(&m).unwrap();
    // Accent stripping follows lowercasing unless set on its own.
    assert_eq!(texts(&tok, &tok.encode("Héllo", false, false)), ["▁Héllo"]);
    m.insert(
        "tokenizer.ggml.normalizer.strip_accents".into(),
        Value::Bool(true),
    );
    let tok = Tokenizer::from_metadata(&m).unwrap();
    assert_eq!(texts(&tok, &tok.encode("Héllo", false, false)), ["[UNK]"]);
}

/// A `gemma4` vocabulary: `<pad> <eos> <bos> <unk>`, the 256 byte tokens,
/// then `pieces`, with `merges` in rank order.
fn gemma4(pieces: &[&str], merges: &[&str]) -> Meta {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3; 4];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    tokens.extend(pieces.iter().map(|s| (*s).to_owned()));
    types.resize(tokens.len(), 1);
    Meta::from([
        (
            "tokenizer.ggml.model".into(),
            Value::String("gemma4".into()),
        ),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.merges".into(), strings(merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
        // llama.cpp adds BOS to Gemma 4 prompts whatever this says.
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ])
}

#[test]
fn gemma4_merges_raw_utf8_by_rank_with_spaces_as_underscores() {
    let pieces = ["▁", "a", "b", "x", "y", "▁a", "▁ab", "\n", "\n\n"];
    let merges = ["▁ a", "a b", "▁a b", "x y", "\n \n"];
    let tok = Tokenizer::from_metadata(&gemma4(&pieces, &merges)).unwrap();
    assert_eq!((tok.kind(), tok.pre()), (VocabKind::Bpe, Some("gemma4")));
    let enc = |s: &str| texts(&tok, &tok.encode(s, false, false));
    // Rank 0 (▁ a) before rank 1 (a b), then ▁a b.
    assert_eq!(enc(" ab"), ["▁ab"]);
    // "xy" is merged though it is not a token, then falls back to bytes:
    // llama.cpp's order, where the tokenizers BPE model would give x, y.
    assert_eq!(enc("xy"), ["<0x78>", "<0x79>"]);
    // A character outside the vocabulary: its UTF-8 bytes.
    assert_eq!(enc("é"), ["<0xC3>", "<0xA9>"]);
    // Newline runs are split off; a run that is a token stays whole, one
    // that is not is merged pairwise from the left.
    assert_eq!(enc("a\n\nb"), ["a", "\n\n", "b"]);
    assert_eq!(enc("\n\n\n"), ["\n\n", "\n"]);

    assert!(tok.add_bos());
    let ids = tok.encode(" ab", true, false);
    assert_eq!(ids.first(), Some(&2));
    assert_eq!(tok.decode(&ids), " ab");
    assert_eq!(tok.decode(&tok.encode("xy é\n", false, false)), "xy é\n");
}

#[test]
fn gemma4_without_merges_is_an_error_naming_the_key() {
    let mut m = gemma4(&["a"], &[]);
    m.remove("tokenizer.ggml.merges");
    assert!(matches!(
        Tokenizer::from_metadata(&m),
        Err(TokenizerError::MissingKey { key }) if key == "tokenizer.ggml.merges"
    ));
}
