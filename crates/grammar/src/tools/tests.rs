//! Call grammars run over text a byte at a time (llguidance's one-byte
//! test vocabulary, so no model file): what they accept and refuse.

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::ApproximateTokEnv;
use llguidance::{Matcher, ParserFactory};
use serde_json::json;

use super::*;

/// Compiles `lark` over a vocabulary of single bytes.
fn matcher(lark: &str) -> Matcher {
    let env = ApproximateTokEnv::single_byte_env();
    let mut factory = ParserFactory::new_simple(&env).unwrap();
    factory.quiet();
    let parser = factory
        .create_parser(TopLevelGrammar::from_lark(lark.to_owned()))
        .unwrap_or_else(|e| panic!("{e}\n{lark}"));
    Matcher::new(Ok(parser))
}

/// Whether the grammar takes the whole of `text` and may end there.
fn accepts(lark: &str, text: &str) -> bool {
    let mut m = matcher(lark);
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    m.try_consume_tokens(&bytes).unwrap() == bytes.len() && m.is_accepting().unwrap()
}

fn tool(name: &str, parameters: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        parameters,
    }
}

fn xml(tools: &[ToolSpec], parallel: bool) -> String {
    call_grammar(ToolFormat::QwenXml, tools, parallel, None, |_| None).unwrap()
}

/// A call as the Qwen3.5 template writes one in an earlier turn.
fn call(name: &str, params: &[(&str, &str)]) -> String {
    let mut s = format!("<tool_call>\n<function={name}>\n");
    for (k, v) in params {
        s.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
    }
    s.push_str("</function>\n</tool_call>");
    s
}

fn weather() -> ToolSpec {
    tool(
        "get_weather",
        json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1},
            "metric": {"type": "boolean"},
            "unit": {"enum": ["c", "f"]},
            "at": {"type": "object", "properties": {"lat": {"type": "number"}},
                   "required": ["lat"], "additionalProperties": false},
            "tags": {"type": "array", "items": {"type": "string"}},
            "code": {"type": "string", "maxLength": 3},
        }, "required": ["city", "days"]}),
    )
}

#[test]
fn xml_calls_with_every_kind_of_value_are_accepted() {
    let g = xml(&[weather()], false);
    for params in [
        &[("city", "Paris"), ("days", "3")][..],
        &[
            ("city", "Paris"),
            ("days", "3"),
            ("metric", "true"),
            ("unit", "f"),
            ("at", "{\"lat\": 48.8}"),
            ("tags", "[\"a\", \"b\"]"),
            ("code", "FR"),
        ],
        // Raw text may hold `<`, newlines, JSON, tag look-alikes.
        &[("city", "a < b\n{\"json\": 1}\n</param"), ("days", "12")],
        &[("city", "<parameter=x>\n</function>"), ("days", "1")],
        &[("city", ""), ("days", "1"), ("code", "")],
    ] {
        let text = call("get_weather", params);
        assert!(accepts(&g, &text), "refused {text:?}\n{g}");
    }
}

#[test]
fn malformed_xml_calls_are_refused() {
    let g = xml(&[weather()], false);
    for params in [
        // A required parameter missing.
        &[("days", "3")][..],
        &[("city", "Paris")],
        // An unknown one.
        &[("city", "Paris"), ("days", "3"), ("wind", "5")],
        // Out of the schema's order.
        &[("days", "3"), ("city", "Paris")],
        // Twice.
        &[("city", "Paris"), ("city", "Rome"), ("days", "3")],
        // Not a number, not an integer, below the minimum.
        &[("city", "Paris"), ("days", "three")],
        &[("city", "Paris"), ("days", "1.5")],
        &[("city", "Paris"), ("days", "0")],
        // Not a boolean, not in the enum, an object missing its key.
        &[("city", "Paris"), ("days", "3"), ("metric", "yes")],
        &[("city", "Paris"), ("days", "3"), ("unit", "k")],
        &[("city", "Paris"), ("days", "3"), ("at", "{}")],
        // Longer than maxLength.
        &[("city", "Paris"), ("days", "3"), ("code", "FRAN")],
        // Text holding the closing tag.
        &[("city", "a</parameter>b"), ("days", "3")],
    ] {
        let text = call("get_weather", params);
        assert!(!accepts(&g, &text), "accepted {text:?}");
    }
    let good = call("get_weather", &[("city", "Paris"), ("days", "3")]);
    for bad in [
        good.replace("get_weather", "get_time"),
        good.replace("<tool_call>\n", "<tool_call>"),
        good.replace("\n</tool_call>", "</tool_call>"),
        good.replace("Paris\n</parameter>", "Paris</parameter>"),
        format!("Sure.\n{good}"),
        format!("{good}\n{good}"),
        good.replace("</tool_call>", ""),
    ] {
        assert!(!accepts(&g, &bad), "accepted {bad:?}");
    }
}

#[test]
fn one_of_several_tools_and_parallel_calls() {
    let time = tool(
        "get_time",
        json!({"type": "object", "properties": {"zone": {"type": "string"}}}),
    );
    let tools = [weather(), time];
    let g = xml(&tools, false);
    let a = call("get_weather", &[("city", "Paris"), ("days", "3")]);
    let b = call("get_time", &[("zone", "CET")]);
    let empty = call("get_time", &[]);
    for text in [&a, &b, &empty] {
        assert!(accepts(&g, text), "refused {text:?}");
    }
    assert!(!accepts(&g, &format!("{a}\n{b}")));
    let g = xml(&tools, true);
    assert!(accepts(&g, &a));
    assert!(accepts(&g, &format!("{a}\n{b}\n{empty}")));
    assert!(!accepts(&g, &format!("{a}{b}")));
    // A named function: only that one.
    let g = xml(&tools[1..], false);
    assert!(accepts(&g, &b));
    assert!(!accepts(&g, &a));
}

#[test]
fn tools_without_properties_and_odd_schemas() {
    let g = xml(
        &[
            tool("ping", json!({"type": "object"})),
            tool("any", json!(true)),
        ],
        false,
    );
    assert!(accepts(&g, &call("ping", &[])));
    assert!(accepts(&g, &call("any", &[])));
    assert!(!accepts(&g, &call("ping", &[("x", "1")])));
    // A schema saying nothing of its type, a string-or-null, a $ref into
    // the tool's $defs inside an array, a required key with no schema.
    let g = xml(
        &[tool(
            "f",
            json!({"type": "object", "properties": {
                "free": {"description": "anything"},
                "maybe": {"type": ["string", "null"]},
                "pts": {"type": "array", "items": {"$ref": "#/$defs/pt"}},
            }, "required": ["free", "extra"],
            "$defs": {"pt": {"type": "integer"}}}),
        )],
        false,
    );
    let ok = call(
        "f",
        &[
            ("free", "{\"a\""),
            ("maybe", "null"),
            ("pts", "[1, 2]"),
            ("extra", "x"),
        ],
    );
    assert!(accepts(&g, &ok), "{g}");
    let bad = call("f", &[("free", "x"), ("pts", "[\"a\"]"), ("extra", "x")]);
    assert!(!accepts(&g, &bad));
}

#[test]
fn unwritable_names_are_refused() {
    for t in [
        tool("two words", json!({"type": "object"})),
        tool(
            "f",
            json!({"type": "object", "properties": {"a>b": {"type": "string"}}}),
        ),
        tool(
            "f",
            json!({"type": "object", "properties": {" pad": {"type": "string"}}}),
        ),
        tool(
            "f",
            json!({"type": "object", "properties": {"e": {"enum": []}}}),
        ),
    ] {
        let e = call_grammar(
            ToolFormat::QwenXml,
            std::slice::from_ref(&t),
            false,
            None,
            |_| None,
        );
        assert!(matches!(e, Err(GrammarError::Tools(_))), "{t:?}: {e:?}");
    }
}

#[test]
fn markers_in_the_vocabulary_are_written_as_its_tokens() {
    let g = call_grammar(ToolFormat::QwenXml, &[weather()], false, None, |m| {
        (m == "<tool_call>").then_some(7)
    })
    .unwrap();
    assert!(g.contains("call: <[7]> \"\\n\""), "{g}");
    assert!(g.contains("\"</tool_call>\""), "{g}");
}

#[test]
fn an_open_think_block_is_closed_first() {
    let a = call("get_weather", &[("city", "Paris"), ("days", "3")]);
    let g = call_grammar(
        ToolFormat::QwenXml,
        &[weather()],
        false,
        Some("</think>"),
        |_| None,
    )
    .unwrap();
    assert!(accepts(&g, &format!("\n</think>\n\n{a}")));
    assert!(accepts(&g, &format!("</think>\n\n{a}")));
    assert!(!accepts(&g, &a));
    assert!(!accepts(&g, &format!("Hmm.\n</think>\n\n{a}")));
    // The other formats too.
    let h = call_grammar(
        ToolFormat::Hermes,
        &[weather()],
        false,
        Some("</think>"),
        |_| None,
    )
    .unwrap();
    let hermes = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": 2}}\n</tool_call>";
    assert!(accepts(&h, &format!("\n</think>\n\n{hermes}")), "{h}");
    assert!(!accepts(&h, hermes));
}

#[test]
fn every_format_compiles_with_and_without_parallel_calls() {
    for format in [
        ToolFormat::QwenXml,
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Generic,
    ] {
        for parallel in [false, true] {
            let g = call_grammar(format, &[weather()], parallel, None, |_| None).unwrap();
            matcher(&g);
        }
    }
}
