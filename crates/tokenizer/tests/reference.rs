//! The tokenizer against llama.cpp's own outputs on the two real models:
//! token ids for every string in `tokenization.json`, decoded text for the
//! greedy runs in `greedy_generation.json`, and per-token bytes from
//! `llama-server`'s `completion_probabilities`.
//!
//! The models come from `scripts/fetch-models.sh` (into `$LAMINA_MODELS`,
//! default `~/.cache/lamina/models`); without them these tests fail.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::path::PathBuf;
use std::sync::OnceLock;

use lamina_gguf::{LoadMode, Model};
use lamina_tokenizer::{Detokenizer, Tokenizer};
use serde_json::Value as Json;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LAMINA_MODELS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/lamina/models")
}

fn load(file: &str) -> Tokenizer {
    let path = models_dir().join(file);
    assert!(
        path.exists(),
        "model {} is missing: run scripts/fetch-models.sh (set LAMINA_MODELS to its directory)",
        path.display()
    );
    let model = Model::open(&path, LoadMode::Mmap).unwrap();
    Tokenizer::from_gguf(&model).unwrap()
}

fn tokenizer(name: &str) -> &'static Tokenizer {
    static SMOL: OnceLock<Tokenizer> = OnceLock::new();
    static GEMMA: OnceLock<Tokenizer> = OnceLock::new();
    match name {
        "smollm2" => SMOL.get_or_init(|| load(SMOLLM2)),
        "gemma3" => GEMMA.get_or_init(|| load(GEMMA3)),
        other => panic!("no model called {other}"),
    }
}

fn reference(file: &str) -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/llama.cpp")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

/// (add_special, parse_special) for a `variant` of tokenization.json.
fn flags(variant: &str) -> (bool, bool) {
    match variant {
        "default_bos" => (true, true),
        "no_bos" => (false, true),
        "default_bos_no_parse_special" => (true, false),
        "no_bos_no_parse_special" => (false, false),
        other => panic!("unknown variant {other}"),
    }
}

fn check_model_ids(model: &str) -> usize {
    let tok = tokenizer(model);
    let data = reference("tokenization.json");
    let mut failures = Vec::new();
    let mut checked = 0;
    for r in data["results"].as_array().unwrap() {
        if r["model"] != model {
            continue;
        }
        let s = r["string"].as_str().unwrap();
        let variant = r["variant"].as_str().unwrap();
        let (add, parse) = flags(variant);
        let want = ids(&r["ids"]);
        let got = tok.encode(s, add, parse);
        checked += 1;
        if got != want {
            failures.push(format!(
                "{variant} {s:?}\n  llama.cpp {want:?}\n  lamina    {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{model}: {} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    checked
}

#[test]
fn smollm2_ids_match_llama_cpp() {
    // Seven strings, each with and without BOS.
    assert_eq!(check_model_ids("smollm2"), 14);
}

#[test]
fn gemma3_ids_match_llama_cpp() {
    assert_eq!(check_model_ids("gemma3"), 14);
}

#[test]
fn metadata_as_llama_cpp_reads_it() {
    let smol = tokenizer("smollm2");
    assert_eq!(smol.vocab_size(), 49152);
    assert_eq!(smol.pre(), Some("smollm"));
    assert!(!smol.add_bos());
    assert_eq!((smol.bos(), smol.eos()), (Some(1), Some(2)));
    for id in [0, 2] {
        assert!(
            smol.is_eog(id),
            "{:?} should end generation",
            smol.token_text(id)
        );
    }
    assert!(!smol.is_eog(1));

    let gemma = tokenizer("gemma3");
    assert_eq!(gemma.vocab_size(), 262144);
    assert!(gemma.add_bos());
    assert_eq!((gemma.bos(), gemma.eos()), (Some(2), Some(1)));
    let eot = gemma.token_id("<end_of_turn>").unwrap();
    assert_eq!(gemma.eot(), Some(eot));
    assert!(gemma.is_eog(eot) && gemma.is_eog(1));
    assert!(!gemma.is_eog(2));
}

/// decode(encode(s)) == s wherever llama.cpp's would round trip (all the
/// reference strings: no normalisation, control tokens rendered back).
#[test]
fn decode_round_trips_reference_strings() {
    let data = reference("tokenization.json");
    for r in data["results"].as_array().unwrap() {
        let model = r["model"].as_str().unwrap();
        let variant = r["variant"].as_str().unwrap();
        if variant.starts_with("default_bos") {
            continue;
        }
        let tok = tokenizer(model);
        let s = r["string"].as_str().unwrap();
        let (_, parse) = flags(variant);
        let ids = tok.encode(s, false, parse);
        assert_eq!(tok.decode_with(&ids, true), s, "{model} {variant}");
        if !parse {
            assert_eq!(tok.decode(&ids), s, "{model} {variant}");
        }
    }
}

/// Streams ids through a [`Detokenizer`]; checks no chunk carries a broken
/// character and the whole equals `decode`. Returns how many tokens ended
/// inside a character.
fn stream(tok: &Tokenizer, ids: &[u32]) -> (String, usize) {
    let mut d = Detokenizer::new();
    let mut text = String::new();
    let mut splits = 0;
    for &id in ids {
        let chunk = d.push(tok, id);
        assert!(
            !chunk.contains('\u{FFFD}'),
            "chunk {chunk:?} holds a broken character"
        );
        if !d.pending().is_empty() {
            splits += 1;
        }
        text.push_str(&chunk);
    }
    text.push_str(&d.finish());
    (text, splits)
}

#[test]
fn streaming_never_emits_half_a_character() {
    let s = "naïve café 東京 🚀 code: fn main() { println!(\"hi\"); }";
    for model in ["smollm2", "gemma3"] {
        let tok = tokenizer(model);
        let ids = tok.encode(s, false, false);
        let (text, splits) = stream(tok, &ids);
        assert_eq!(text, s, "{model}");
        assert_eq!(text, tok.decode(&ids), "{model}");
        // SmolLM2 spells the CJK characters and the emoji in byte-level
        // pieces, so the hold-back path really ran; Gemma has whole tokens
        // for all of them.
        if model == "smollm2" {
            assert!(splits > 0, "{model}: no token ended inside a character");
        }
    }
    // Rare characters Gemma only has as `<0xNN>` byte fallback.
    let tok = tokenizer("gemma3");
    let rare = "𓀀 𒀱 𝔸𐍈";
    let ids = tok.encode(rare, false, false);
    let (text, splits) = stream(tok, &ids);
    assert_eq!(text, rare);
    assert!(splits > 0, "gemma3: {ids:?} has no byte fallback");
    // Emoji that are byte tokens one by one.
    let tok = tokenizer("gemma3");
    let bytes: Vec<u32> = "🦀東"
        .bytes()
        .map(|b| tok.token_id(&format!("<0x{b:02X}>")).unwrap())
        .collect();
    let (text, splits) = stream(tok, &bytes);
    assert_eq!(text, "🦀東");
    assert_eq!(splits, 5);
}

#[test]
fn greedy_generations_decode_to_llama_cpps_text() {
    let data = reference("greedy_generation.json");
    let mut n = 0;
    for r in data["runs"].as_array().unwrap() {
        let model = r["model"].as_str().unwrap();
        let tok = tokenizer(model);
        let prompt = r["prompt"].as_str().unwrap();
        assert_eq!(
            tok.encode(prompt, true, true),
            ids(&r["prompt_ids"]),
            "{model} {prompt:?}"
        );
        let gen = ids(&r["server_tokens"]);
        let (streamed, _) = stream(tok, &gen);
        assert_eq!(
            streamed,
            r["text_llama_completion"].as_str().unwrap(),
            "{model} {prompt:?}"
        );
        assert_eq!(
            streamed,
            r["server_content"].as_str().unwrap(),
            "{model} {prompt:?}"
        );
        assert_eq!(tok.decode(&gen), streamed, "{model} {prompt:?}");
        n += 1;
    }
    assert_eq!(n, 6);
}

#[test]
fn server_token_bytes_match_pieces() {
    let data = reference("server_reference.json");
    let mut n = 0;
    for (model, v) in data["models"].as_object().unwrap() {
        let tok = tokenizer(model);
        for c in v["completion"].as_array().unwrap() {
            let gen = ids(&c["tokens"]);
            let (text, _) = stream(tok, &gen);
            assert_eq!(text, c["content"].as_str().unwrap(), "{model}");
            for step in c["completion_probabilities"].as_array().unwrap() {
                for p in std::iter::once(step).chain(step["top_logprobs"].as_array().unwrap()) {
                    let id = u32::try_from(p["id"].as_u64().unwrap()).unwrap();
                    let want: Vec<u8> = p["bytes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
                        .collect();
                    assert_eq!(tok.token_to_piece(id), want, "{model} id {id}");
                    n += 1;
                }
            }
        }
    }
    assert!(n > 100);
}
