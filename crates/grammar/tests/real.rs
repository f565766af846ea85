//! Constraints over the real SmolLM2 and Gemma 3 vocabularies, walked to
//! the end by picking tokens the masks allow (seeded, uniformly among the
//! allowed): whatever is picked, the text must be in the constraint's
//! language. No model runs here; the server's tests generate with one.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::OnceLock;

use lamina_chat::{parse_tool_calls as parse, Piece, ToolCallParser, ToolFormat};
use lamina_gguf::{LoadMode, Model};
use lamina_grammar::{call_grammar, Ahead, Constraint, GrammarError, Spec, ToolSpec, Vocab};
use lamina_tokenizer::Tokenizer;
use serde_json::{json, Value};

fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("LAMINA_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lamina/models")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

fn load(name: &str) -> (Tokenizer, Vocab) {
    let file = Model::open(model_path(name), LoadMode::Mmap).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let n = tok.vocab_size();
    let vocab = Vocab::new(&tok, n).unwrap();
    (tok, vocab)
}

fn smol() -> &'static (Tokenizer, Vocab) {
    static V: OnceLock<(Tokenizer, Vocab)> = OnceLock::new();
    V.get_or_init(|| load("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// xorshift64*: a seeded choice among the allowed tokens.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
}

/// Picks allowed tokens until only end-of-generation is allowed (or an
/// end token is picked); returns the text.
fn walk(tok: &Tokenizer, vocab: &Vocab, mut c: Constraint, seed: u64, limit: usize) -> String {
    let mut rng = Rng(seed | 1);
    let mut ids = Vec::new();
    for _ in 0..limit {
        let mask = c.mask().unwrap();
        if mask.finished() {
            return tok.decode(&ids);
        }
        let mut logits = vec![0.0f32; vocab.n_logits()];
        let kept = mask.apply(&mut logits);
        assert_eq!(kept, mask.count());
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        let id = allowed[rng.below(allowed.len())];
        assert!(mask.allows(id));
        if tok.is_eog(id) {
            return tok.decode(&ids);
        }
        ids.push(id);
        c.commit(id).unwrap();
    }
    panic!("no end within {limit} tokens: {:?}", tok.decode(&ids));
}

#[test]
fn a_schema_walk_always_gives_valid_json() {
    let (tok, vocab) = smol();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 4},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        },
        "required": ["name", "age", "ok"],
        "additionalProperties": false,
    });
    for seed in 1..=8 {
        let c = Constraint::compile(vocab, &Spec::JsonSchema(schema.clone())).unwrap();
        let text = walk(tok, vocab, c, seed, 400);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(
            v["name"].as_str().is_some_and(|s| s.chars().count() <= 4),
            "{text}"
        );
        assert!(
            v["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)),
            "{text}"
        );
        assert!(v["ok"].is_boolean(), "{text}");
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert!(
            keys.iter()
                .all(|k| ["name", "age", "ok", "tags"].contains(&k.as_str())),
            "{text}"
        );
        if let Some(tags) = v.get("tags") {
            assert!(
                tags.as_array()
                    .unwrap()
                    .iter()
                    .all(|t| t == "a" || t == "b"),
                "{text}"
            );
        }
    }
}

#[test]
fn a_gbnf_choice_gives_one_of_its_words() {
    let (tok, vocab) = smol();
    let mut seen = Vec::new();
    for seed in 1..=12 {
        let c =
            Constraint::compile(vocab, &Spec::Gbnf("root ::= \"yes\" | \"no\"".into())).unwrap();
        let text = walk(tok, vocab, c, seed, 20);
        assert!(text == "yes" || text == "no", "{text:?}");
        seen.push(text);
    }
    // Both words are reachable: the mask is not just one of them.
    assert!(
        seen.iter().any(|t| t == "yes") && seen.iter().any(|t| t == "no"),
        "{seen:?}"
    );
}

#[test]
fn gbnf_json_grammar_from_llama_cpp_compiles_and_holds() {
    let (tok, vocab) = smol();
    // llama.cpp's grammars/json.gbnf, its recursion and nullable `ws`.
    let src = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  ){0,6} "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,3})) ("." [0-9]{1,3})? ([eE] [-+]? [0-9] [0-9]{0,2})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;
    for seed in 1..=4 {
        let c = Constraint::compile(vocab, &Spec::Gbnf(src.into())).unwrap();
        let text = walk(tok, vocab, c, seed, 3000);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object(), "{text}");
    }
}

#[test]
fn json_mode_gives_an_object_and_ends() {
    let (tok, vocab) = smol();
    let c = Constraint::compile(vocab, &Spec::JsonObject).unwrap();
    let mut mask_c = c.clone();
    // At the start only an object may open (after optional whitespace).
    let first = mask_c.mask().unwrap();
    let brace = tok.encode("{", false, false);
    assert!(first.allows(brace[0]));
    let one = tok.encode("1", false, false);
    assert!(!first.allows(one[0]));
    assert!(
        !tok.eog_ids().any(|e| first.allows(e)),
        "EOS before any JSON"
    );
    // And once an object is closed, only an end token.
    let mut c = c;
    for id in tok.encode("{\"a\": [1, true]}", false, false) {
        c.mask().unwrap();
        c.commit(id).unwrap();
    }
    let last = c.mask().unwrap();
    assert!(last.finished());
    assert!(tok.eog_ids().any(|e| last.allows(e)));
}

#[test]
fn refused_grammars_and_schemas_are_errors() {
    let (_, vocab) = smol();
    let cases = [
        Spec::Gbnf("root ::= undefined-rule".into()),
        Spec::Lark("start: nope".into()),
        Spec::Lark("this is not a grammar".into()),
        Spec::JsonSchema(json!(false)),
        Spec::JsonSchema(json!(42)),
        Spec::JsonSchema(json!({"type": "no-such-type"})),
        Spec::JsonSchema(json!({"$ref": "#/$defs/missing"})),
        Spec::Lark(format!(
            "start: {}\"a\"{}",
            "(".repeat(500),
            ")".repeat(500)
        )),
    ];
    for spec in cases {
        match Constraint::compile(vocab, &spec) {
            Err(e) => assert!(!e.to_string().is_empty()),
            Ok(_) => panic!("{spec:?} compiled"),
        }
    }
    let e = Constraint::compile(vocab, &Spec::Gbnf("root ::= item".into())).unwrap_err();
    assert!(matches!(e, GrammarError::Gbnf { .. }), "{e:?}");
}

#[test]
fn masks_computed_ahead_equal_masks_computed_in_place() {
    let (tok, vocab) = smol();
    let schema =
        json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]});
    let c = Constraint::compile(vocab, &Spec::JsonSchema(schema)).unwrap();
    let mut here = c.clone();
    let mut ahead = Ahead::start(c).unwrap();
    for id in tok.encode("{\"x\": 12}", false, false) {
        let (a, b) = (here.mask().unwrap(), ahead.mask().unwrap());
        assert_eq!(a.count(), b.count());
        assert!(a.allows(id) && b.allows(id));
        here.commit(id).unwrap();
        ahead.commit(id).unwrap();
    }
    assert!(here.mask().unwrap().finished());
    assert!(ahead.mask().unwrap().finished());
}

#[test]
fn a_forced_tool_call_parses_back_as_that_call() {
    let (tok, vocab) = smol();
    let tools = vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}}, "required": ["city"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "get_time".into(),
            parameters: json!({"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"], "additionalProperties": false}),
        },
    ];
    for format in [
        ToolFormat::Generic,
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
    ] {
        let lark = call_grammar(format, &tools, false, None, |m| vocab.special_token(m)).unwrap();
        for seed in 1..=3 {
            let c = Constraint::compile(vocab, &Spec::Lark(lark.clone())).unwrap();
            let text = walk(tok, vocab, c, seed, 400);
            let pieces = parse(format, &text);
            let calls: Vec<_> = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Call(c) => Some(c),
                    Piece::Text(_) | Piece::Reasoning(_) => None,
                })
                .collect();
            assert_eq!(calls.len(), 1, "{format:?}: {text:?} gave {pieces:?}");
            let call = calls[0];
            match call.name.as_str() {
                "get_weather" => assert!(call.arguments["city"].is_string()),
                "get_time" => {
                    assert!(["utc", "cet"].contains(&call.arguments["zone"].as_str().unwrap()))
                }
                other => panic!("{format:?}: called {other}"),
            }
        }
    }
    // A named function: only that one.
    let only = &tools[1..];
    let lark = call_grammar(ToolFormat::Generic, only, false, None, |m| {
        vocab.special_token(m)
    })
    .unwrap();
    for seed in 1..=3 {
        let c = Constraint::compile(vocab, &Spec::Lark(lark.clone())).unwrap();
        let text = walk(tok, vocab, c, seed, 400);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["tool_call"]["name"], "get_time", "{text}");
    }
    assert!(call_grammar(ToolFormat::Generic, &[], false, None, |_| None).is_err());
}

#[test]
fn gemma_vocabulary_special_tokens_and_a_schema() {
    let (tok, vocab) = load("gemma-3-270m-q4_k_m.gguf");
    assert!(vocab.special_token("<end_of_turn>").is_some());
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"], "additionalProperties": false});
    let c = Constraint::compile(&vocab, &Spec::JsonSchema(schema)).unwrap();
    let text = walk(&tok, &vocab, c, 7, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(
        v["n"].as_i64().is_some_and(|n| (1..=9).contains(&n)),
        "{text}"
    );
}

#[test]
fn a_forced_xml_call_parses_back_typed_by_its_schema() {
    let (tok, vocab) = smol();
    let params = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 0, "maximum": 99},
        "metric": {"type": "boolean"},
        "unit": {"enum": ["c", "f"]},
    }, "required": ["city", "days"]});
    let tools = vec![ToolSpec {
        name: "get_weather".into(),
        parameters: params.clone(),
    }];
    let openai =
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": params}}]);
    for parallel in [false, true] {
        let lark = call_grammar(ToolFormat::QwenXml, &tools, parallel, None, |m| {
            vocab.special_token(m)
        })
        .unwrap();
        for seed in 1..=4 {
            let c = Constraint::compile(vocab, &Spec::Lark(lark.clone())).unwrap();
            let text = walk(tok, vocab, c, seed, 400);
            let mut parser = ToolCallParser::new(ToolFormat::QwenXml).with_tools(&openai);
            let mut pieces = parser.push(&text);
            pieces.extend(parser.finish());
            let calls: Vec<_> = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Call(c) => Some(c),
                    Piece::Text(_) | Piece::Reasoning(_) => None,
                })
                .collect();
            assert!(
                !calls.is_empty() && calls.len() == pieces.len(),
                "{text:?} gave {pieces:?}"
            );
            if !parallel {
                assert_eq!(calls.len(), 1, "{text:?}");
            }
            for call in calls {
                let a = &call.arguments;
                assert_eq!(call.name, "get_weather");
                assert!(
                    a["city"].as_str().is_some_and(|c| c.chars().count() <= 6),
                    "{text:?}"
                );
                assert!(
                    a["days"].as_i64().is_some_and(|d| (0..=99).contains(&d)),
                    "{text:?}"
                );
                assert!(a.get("metric").is_none_or(Value::is_boolean), "{text:?}");
                assert!(
                    a.get("unit").is_none_or(|u| u == "c" || u == "f"),
                    "{text:?}"
                );
            }
        }
    }
}
