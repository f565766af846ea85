use serde_json::json;

use super::*;

const FORMATS: [ToolFormat; 5] = [
    ToolFormat::QwenXml,
    ToolFormat::Hermes,
    ToolFormat::Llama3,
    ToolFormat::Mistral,
    ToolFormat::Generic,
];

fn call(name: &str, args: Value) -> Piece {
    call_id(name, args, None)
}

fn call_id(name: &str, args: Value, id: Option<&str>) -> Piece {
    let Value::Object(arguments) = args else {
        panic!("arguments must be an object")
    };
    Piece::Call(ToolCall {
        id: id.map(str::to_owned),
        name: name.into(),
        arguments,
    })
}

fn text(s: &str) -> Piece {
    Piece::Text(s.into())
}

/// Adjacent text pieces joined, so streamed and whole answers compare.
fn joined(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for p in pieces {
        match (out.last_mut(), p) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

/// The answer fed `step` bytes at a time (on character boundaries); every
/// piece is checked to come out no later than the text allows.
fn streamed(format: ToolFormat, answer: &str, step: usize) -> Vec<Piece> {
    streamed_by(ToolCallParser::new(format), answer, step)
}

fn streamed_by(mut p: ToolCallParser, answer: &str, step: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < answer.len() {
        let mut end = (at + step).min(answer.len());
        while !answer.is_char_boundary(end) {
            end += 1;
        }
        out.extend(p.push(&answer[at..end]));
        at = end;
    }
    out.extend(p.finish());
    joined(out)
}

/// The whole answer's pieces, checked to be what streaming it one byte,
/// three bytes and seven bytes at a time gives.
fn check(format: ToolFormat, answer: &str) -> Vec<Piece> {
    check_by(|| ToolCallParser::new(format), answer)
}

/// [`check`] with the parser `new` makes (one that knows the tools).
fn check_by(new: impl Fn() -> ToolCallParser, answer: &str) -> Vec<Piece> {
    let whole = joined(parse_with(new(), answer));
    for step in [1, 3, 7] {
        assert_eq!(
            streamed_by(new(), answer, step),
            whole,
            "streamed {step} bytes at a time: {answer:?}"
        );
    }
    whole
}

#[test]
fn formats_are_told_by_the_template() {
    let qwen = "{%- if tools %}<tools>{% endfor %}</tools> <tool_call>\\n{\"name\": <function-name>}</tool_call>";
    assert_eq!(ToolFormat::detect(qwen), ToolFormat::Hermes);
    let llama = "{{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}";
    assert_eq!(ToolFormat::detect(llama), ToolFormat::Llama3);
    assert_eq!(
        ToolFormat::detect("{{ '<|python_tag|>' + tool_call.name }}"),
        ToolFormat::Llama3
    );
    let mistral = "{%- if message.tool_calls %}[TOOL_CALLS][{% for c in message.tool_calls %}";
    assert_eq!(ToolFormat::detect(mistral), ToolFormat::Mistral);
    let chatml =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    assert_eq!(ToolFormat::detect(chatml), ToolFormat::Generic);
    assert_eq!(
        ToolFormat::Hermes.markers(),
        ["<tool_call>", "</tool_call>"]
    );
}

#[test]
fn hermes_calls_with_text_before_and_between() {
    let answer = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    assert_eq!(
        check(ToolFormat::Hermes, answer),
        [
            text("Let me check."),
            call("get_weather", json!({"city": "Paris", "days": [1, 2]})),
            call("get_time", json!({})),
        ]
    );
    // Arguments written as a JSON string, and the `<function=…>` variant.
    let answer = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call><function=g>{\"b\": \"x\"}</function>";
    assert_eq!(
        check(ToolFormat::Hermes, answer),
        [call("f", json!({"a": 1})), call("g", json!({"b": "x"}))]
    );
}

#[test]
fn argument_order_is_kept() {
    let answer = r#"<tool_call>{"name": "f", "arguments": {"z": 1, "a": 2, "m": 3}}</tool_call>"#;
    let pieces = check(ToolFormat::Hermes, answer);
    let [Piece::Call(c)] = pieces.as_slice() else {
        panic!("{pieces:?}")
    };
    assert_eq!(c.arguments_json(), r#"{"z":1,"a":2,"m":3}"#);
}

#[test]
fn a_call_without_its_closing_tag_at_the_end_is_still_a_call() {
    let answer = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n";
    assert_eq!(
        check(ToolFormat::Hermes, answer),
        [call("f", json!({"a": 1}))]
    );
}

#[test]
fn text_that_might_open_a_call_is_held_not_streamed() {
    let mut p = ToolCallParser::new(ToolFormat::Hermes);
    assert_eq!(p.push("Sure <tool"), [text("Sure")]);
    assert_eq!(p.push("_call>{\"name\": \"f\""), []);
    assert_eq!(p.push(", \"arguments\": {}}"), []);
    assert_eq!(p.push("</tool_call>"), [call("f", json!({}))]);
    assert_eq!(p.push(" Done."), [text(" Done.")]);
    assert_eq!(p.finish(), []);
    assert!(p.called());

    // A `<` that opens no call is sent once that is certain.
    let mut p = ToolCallParser::new(ToolFormat::Hermes);
    assert_eq!(p.push("a <"), [text("a")]);
    assert_eq!(p.push("b> c"), [text(" <b> c")]);
    assert_eq!(p.finish(), []);
}

#[test]
fn malformed_calls_come_back_as_their_text() {
    for answer in [
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }}</tool_call>",
        "<tool_call>not json</tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": \"not an object\"}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}",
        "<tool_call>{\"name\": \"f\"]]]",
        "<tool_call>",
        "<tool_c",
        "<function=no spaces allowed>{}</function>",
    ] {
        assert_eq!(
            check(ToolFormat::Hermes, answer),
            [text(answer)],
            "{answer}"
        );
    }
    // A good call after a broken one is still found.
    let answer = "<tool_call>oops <tool_call>{\"name\": \"f\"}</tool_call>";
    assert_eq!(
        check(ToolFormat::Hermes, answer),
        [text("<tool_call>oops"), call("f", json!({}))]
    );
}

#[test]
fn deep_nesting_and_stray_brackets_do_not_panic() {
    let deep = format!("<tool_call>{}", "[".repeat(100_000));
    assert_eq!(check(ToolFormat::Hermes, &deep), [text(&deep)]);
    let deep = format!(
        "<tool_call>{{\"name\": \"f\", \"arguments\": {}{}}}</tool_call>",
        "[".repeat(500),
        "]".repeat(500)
    );
    assert_eq!(check(ToolFormat::Hermes, &deep), [text(&deep)]);
    for answer in [
        "}}}]]]",
        "{\"name\": \"f\"}}}}",
        "[TOOL_CALLS]]]",
        "\u{fdd0}<tool_call>é{",
    ] {
        for f in FORMATS {
            let got = check(f, answer);
            let back: String = got
                .iter()
                .filter_map(|p| match p {
                    Piece::Text(t) => Some(t.as_str()),
                    Piece::Call(_) | Piece::Reasoning(_) => None,
                })
                .collect();
            assert!(got.len() <= 2, "{f:?} {answer}: {got:?}");
            assert!(
                answer.ends_with(back.trim_start()),
                "{f:?} {answer}: {got:?}"
            );
        }
    }
}

#[test]
fn llama3_json_answers_are_calls() {
    let answer = "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    assert_eq!(
        check(ToolFormat::Llama3, answer),
        [call("get_weather", json!({"city": "Paris"}))]
    );
    let answer =
        "  {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": true}}";
    assert_eq!(
        check(ToolFormat::Llama3, answer),
        [call("a", json!({})), call("b", json!({"x": true}))]
    );
    let answer = "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"rust\"}}";
    assert_eq!(
        check(ToolFormat::Llama3, answer),
        [call("search", json!({"q": "rust"}))]
    );
    let answer = "<|python_tag|>print(1 + 1)";
    assert_eq!(
        check(ToolFormat::Llama3, answer),
        [call("python", json!({"code": "print(1 + 1)"}))]
    );
}

#[test]
fn json_that_is_not_a_call_streams_as_text() {
    // The first key tells: this object is an answer, sent before it ends.
    let mut p = ToolCallParser::new(ToolFormat::Llama3);
    assert_eq!(p.push("{\"answ"), []);
    assert_eq!(p.push("er\": 4"), [text("{"), text("\"answer\": 4")]);
    assert_eq!(p.push("2}"), [text("2}")]);
    assert_eq!(p.finish(), []);
    // JSON after text is not a call.
    let answer = "The call is {\"name\": \"f\", \"parameters\": {}}";
    assert_eq!(check(ToolFormat::Llama3, answer), [text(answer)]);
    // A call cut off by the token limit is its text.
    let answer = "{\"name\": \"f\", \"parameters\": {\"a\": ";
    assert_eq!(check(ToolFormat::Llama3, answer), [text(answer)]);
    // Only `"type": "function"` is a function call.
    let answer = "{\"type\": \"other\", \"name\": \"f\", \"parameters\": {}}";
    assert_eq!(check(ToolFormat::Llama3, answer), [text(answer)]);
}

#[test]
fn mistral_calls_in_both_spellings() {
    let answer = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123XYZ\"}, {\"name\": \"get_time\", \"arguments\": {}}]";
    assert_eq!(
        check(ToolFormat::Mistral, answer),
        [
            call_id("get_weather", json!({"city": "Paris"}), Some("abc123XYZ")),
            call("get_time", json!({})),
        ]
    );
    let answer = "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]k9[ARGS]{}";
    assert_eq!(
        check(ToolFormat::Mistral, answer),
        [
            text("Checking."),
            call("get_weather", json!({"city": "Paris"})),
            call_id("get_time", json!({}), Some("k9")),
        ]
    );
    for bad in [
        "[TOOL_CALLS]",
        "[TOOL_CALLS][]",
        "[TOOL_CALLS]get weather[ARGS]{}",
        "[TOOL_CALLS]f[ARGS]",
        "[TOOL_CALLS]f[OOPS]{}",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}",
    ] {
        assert_eq!(check(ToolFormat::Mistral, bad), [text(bad)], "{bad}");
    }
}

#[test]
fn generic_json_calls_and_responses() {
    let answer = "{\"tool_call\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}";
    assert_eq!(
        check(ToolFormat::Generic, answer),
        [call("f", json!({"a": 1}))]
    );
    let answer = "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"b\": 2}}]}";
    assert_eq!(
        check(ToolFormat::Generic, answer),
        [call("f", json!({})), call("g", json!({"b": 2}))]
    );
    let answer = "{\"response\": \"Hello there\"}";
    assert_eq!(check(ToolFormat::Generic, answer), [text("Hello there")]);
    let answer = "{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}";
    assert_eq!(
        check(ToolFormat::Generic, answer),
        [call("f", json!({"a": "b"}))]
    );
    // Plain text, and markers of other formats, are text.
    for answer in [
        "Hello!",
        "<tool_call>{\"name\": \"f\"}</tool_call>",
        "  spaced  \n",
    ] {
        assert_eq!(check(ToolFormat::Generic, answer), [text(answer)]);
    }
}

#[test]
fn plain_answers_pass_through_unchanged() {
    for f in FORMATS {
        for answer in [
            "",
            "Paris is the capital of France.\n",
            "a < b and [c]",
            " é ü 😀 ",
        ] {
            let got = check(f, answer);
            let want: Vec<Piece> = if answer.is_empty() {
                vec![]
            } else {
                vec![text(answer)]
            };
            assert_eq!(got, want, "{f:?} {answer:?}");
        }
    }
}

#[test]
fn a_long_call_is_scanned_in_linear_time() {
    // 1 MiB of arguments fed a few bytes at a time: re-scanning from the
    // start on every piece would take minutes.
    let big = "x".repeat(1 << 20);
    let answer = format!(
        "<tool_call>{{\"name\": \"write\", \"arguments\": {{\"text\": \"{big}\"}}}}</tool_call>"
    );
    let t0 = std::time::Instant::now();
    let pieces = streamed(ToolFormat::Hermes, &answer, 4);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(pieces, [call("write", json!({"text": big}))]);
}

#[test]
fn random_answers_never_panic_and_stream_as_they_parse_whole() {
    // Answers spliced from the pieces the formats are made of, so markers,
    // brackets and quotes meet in every order; a fixed xorshift seed keeps
    // the run reproducible.
    const PARTS: [&str; 31] = [
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "</function>",
        "<parameter=",
        "</parameter>",
        "f>\n",
        "a>\n",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "<|python_tag|>",
        "{",
        "}",
        "[",
        "]",
        "\"",
        "\\",
        "\"name\": \"f\"",
        ", \"arguments\": ",
        ": ",
        ";",
        " ",
        "\n",
        "é",
        "😀",
        "<",
        "x",
        "{\"name\": \"f\", \"parameters\": {\"a\": [1]}}",
        "[{\"name\": \"g\", \"arguments\": {}}]",
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut calls = [0; FORMATS.len()];
    for _ in 0..3000 {
        let n = (next() % 24) as usize;
        let answer: String = (0..n)
            .map(|_| PARTS[(next() % PARTS.len() as u64) as usize])
            .collect();
        for (i, f) in FORMATS.into_iter().enumerate() {
            let pieces = check(f, &answer);
            calls[i] += pieces
                .iter()
                .filter(|p| matches!(p, Piece::Call(_)))
                .count();
            // Without a call, the text is the answer itself (no part
            // spells the generic format's `response`, which rewrites it).
            if pieces.iter().all(|p| matches!(p, Piece::Text(_))) {
                let back: String = pieces
                    .iter()
                    .filter_map(|p| match p {
                        Piece::Text(t) => Some(t.as_str()),
                        Piece::Call(_) | Piece::Reasoning(_) => None,
                    })
                    .collect();
                assert_eq!(back, answer, "{f:?}");
            }
        }
    }
    // The mix does make calls of every format, not only text.
    assert!(calls.iter().all(|&n| n > 20), "{calls:?}");
}

/// The tools of the XML tests, as a request sends them.
fn xml_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "write_file", "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "mode": {"type": "integer"},
                "append": {"type": "boolean"},
                "meta": {"type": "object"},
                "lines": {"type": "array", "items": {"type": "number"}},
                "ratio": {"type": "number"},
                "note": {"type": ["string", "null"]},
                "kind": {"enum": ["a", "b"]},
            }}}},
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    ])
}

fn xml_check(answer: &str) -> Vec<Piece> {
    let tools = xml_tools();
    check_by(
        || ToolCallParser::new(ToolFormat::QwenXml).with_tools(&tools),
        answer,
    )
}

/// One call as the format lays it out.
fn xml_call(name: &str, params: &[(&str, &str)]) -> String {
    let mut s = format!("<tool_call>\n<function={name}>\n");
    for (k, v) in params {
        s.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
    }
    s.push_str("</function>\n</tool_call>");
    s
}

#[test]
fn qwen_xml_is_told_by_the_qwen3_coder_and_qwen35_templates() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/templates/templates");
    let format = |name: &str| {
        let source = std::fs::read_to_string(dir.join(name)).unwrap();
        ToolFormat::detect(&source)
    };
    assert_eq!(format("Qwen3-Coder.jinja"), ToolFormat::QwenXml);
    assert_eq!(format("Qwen3.5-4B.jinja"), ToolFormat::QwenXml);
    for hermes in [
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "Qwen-Qwen3-0.6B.jinja",
        "Qwen-QwQ-32B.jinja",
    ] {
        assert_eq!(format(hermes), ToolFormat::Hermes, "{hermes}");
    }
    assert_eq!(
        ToolFormat::QwenXml.markers(),
        ["<tool_call>", "</tool_call>"]
    );
}

#[test]
fn qwen_xml_values_are_read_by_the_tools_schema() {
    let answer = xml_call(
        "write_file",
        &[
            ("path", "src/main.rs"),
            ("mode", "420"),
            ("append", "false"),
            ("meta", "{\"owner\": \"me\", \"tags\": [1, 2]}"),
            ("lines", " [1, 2.5] "),
            ("ratio", "0.25"),
            ("note", "null"),
            ("kind", "b"),
            ("unknown", "42"),
        ],
    );
    assert_eq!(
        xml_check(&answer),
        [call(
            "write_file",
            json!({"path": "src/main.rs", "mode": 420, "append": false,
                   "meta": {"owner": "me", "tags": [1, 2]}, "lines": [1, 2.5],
                   "ratio": 0.25, "note": "null", "kind": "b", "unknown": "42"})
        )]
    );
    // A string stays the text as written: quotes, JSON and spaces are
    // not read, only the layout's one newline each side is dropped.
    let answer = xml_call(
        "write_file",
        &[("path", " \"quoted\" "), ("content", "\n{\"a\": 1}\n\n")],
    );
    assert_eq!(
        xml_check(&answer),
        [call(
            "write_file",
            json!({"path": " \"quoted\" ", "content": "\n{\"a\": 1}\n\n"})
        )]
    );
    // A value that is not the JSON its schema asks for is kept as text.
    let answer = xml_call("write_file", &[("mode", "0o644"), ("meta", "{broken")]);
    assert_eq!(
        xml_check(&answer),
        [call(
            "write_file",
            json!({"mode": "0o644", "meta": "{broken"})
        )]
    );
    // Without the request's tools, every value is its text.
    assert_eq!(
        joined(parse(
            ToolFormat::QwenXml,
            &xml_call("write_file", &[("mode", "420")])
        )),
        [call("write_file", json!({"mode": "420"}))]
    );
}

#[test]
fn qwen_xml_values_may_hold_tags_newlines_and_look_alikes() {
    let code = "fn main() {\n    if a < b && c > d {}\n    let s = \"</parameter\";\n    // </parameter>x\n    // </parameters>\n    // </function>\n    // <parameter=x>\n}\n";
    let answer = xml_call(
        "write_file",
        &[("path", "a<b>.rs"), ("content", code), ("note", "")],
    );
    assert_eq!(
        xml_check(&answer),
        [call(
            "write_file",
            json!({"path": "a<b>.rs", "content": code, "note": ""})
        )]
    );
    // A value quoting the closing tag before text is the value's; only
    // the closing tag the layout follows ends it.
    let content = "say </parameter> then\n</parameter>\nmore";
    let answer = xml_call("write_file", &[("content", content), ("mode", "1")]);
    assert_eq!(
        xml_check(&answer),
        [call("write_file", json!({"content": content, "mode": 1}))]
    );
}

#[test]
fn qwen_xml_several_calls_with_text_and_reasoning_before() {
    let answer = format!(
        "Let me look.\n\n{}\n{}",
        xml_call("get_weather", &[("city", "Paris"), ("days", "3")]),
        xml_call("get_weather", &[("city", "Zürich 😀")]),
    );
    assert_eq!(
        xml_check(&answer),
        [
            text("Let me look."),
            call("get_weather", json!({"city": "Paris", "days": 3})),
            call("get_weather", json!({"city": "Zürich 😀"})),
        ]
    );
    // Several functions in one `<tool_call>`, no parameters, a bare
    // `<function=…>` without `<tool_call>` (Qwen3-Coder drops it at
    // times), and text after a call.
    let answer = "<tool_call>\n<function=a>\n</function>\n<function=b>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>\n<function=c>\n<parameter=y>\nz\n</parameter>\n</function> Done.";
    assert_eq!(
        xml_check(answer),
        [
            call("a", json!({})),
            call("b", json!({"x": "1"})),
            call("c", json!({"y": "z"})),
            text(" Done."),
        ]
    );
    // The reasoning before the call is split off by the reasoning
    // splitter first; what reaches this parser is the rest.
    let mut r = crate::ReasoningSplitter::new(crate::THINK, false);
    let answer = format!(
        "<think>\nI should call <tool_call> here.\n</think>\n\n{}",
        xml_call("get_weather", &[("city", "Oslo")])
    );
    let mut p = ToolCallParser::new(ToolFormat::QwenXml).with_tools(&xml_tools());
    let mut pieces = Vec::new();
    for part in r.push(&answer).into_iter().chain(r.finish()) {
        match part {
            crate::Part::Reasoning(t) => pieces.push(Piece::Reasoning(t)),
            crate::Part::Content(c) => pieces.extend(p.push(&c)),
        }
    }
    pieces.extend(p.finish());
    let calls: Vec<&Piece> = pieces
        .iter()
        .filter(|p| matches!(p, Piece::Call(_)))
        .collect();
    assert_eq!(calls, [&call("get_weather", json!({"city": "Oslo"}))]);
    assert!(pieces
        .iter()
        .any(|p| matches!(p, Piece::Reasoning(r) if r.contains("<tool_call>"))));
}

#[test]
fn qwen_xml_text_is_held_only_while_it_may_be_a_call() {
    let tools = xml_tools();
    let mut p = ToolCallParser::new(ToolFormat::QwenXml).with_tools(&tools);
    assert_eq!(p.push("Sure. <tool"), [text("Sure.")]);
    assert_eq!(
        p.push("_call>\n<function=get_weather>\n<parameter=city>\nPa"),
        []
    );
    assert_eq!(p.push("ris\n</parameter>\n</func"), []);
    assert_eq!(
        p.push("tion>\n</tool_call>"),
        [call("get_weather", json!({"city": "Paris"}))]
    );
    assert_eq!(p.finish(), []);
    // `#include <functional>` is no call, and is sent once that is sure.
    let mut p = ToolCallParser::new(ToolFormat::QwenXml);
    assert_eq!(p.push("#include <func"), [text("#include")]);
    assert_eq!(p.push("tional>\n"), [text(" <functional>")]);
    assert_eq!(p.finish(), [text("\n")]);
}

#[test]
fn qwen_xml_calls_cut_off_or_malformed_are_their_text() {
    let whole = xml_call("write_file", &[("path", "a.txt"), ("content", "x\ny")]);
    // Cut off anywhere before `</function>`, the call is text; after it,
    // a missing `</tool_call>` is forgiven.
    let end = whole.find("</function>").unwrap();
    for cut in 1..whole.len() {
        let answer = &whole[..cut];
        let got = xml_check(answer);
        if cut >= end + "</function>".len() {
            assert_eq!(
                got,
                [call(
                    "write_file",
                    json!({"path": "a.txt", "content": "x\ny"})
                )],
                "{answer:?}"
            );
        } else {
            assert_eq!(got, [text(answer)], "{answer:?}");
        }
    }
    for bad in [
        "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",
        "<tool_call>\nhello\n</tool_call>",
        "<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=a b\nc>\n1\n</parameter>\n</function>",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>x</function>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "<function=>\n</function>",
    ] {
        assert_eq!(xml_check(bad), [text(bad)], "{bad:?}");
    }
    // A good call after a broken one is still found.
    let answer = format!(
        "<tool_call> oops {}",
        xml_call("get_weather", &[("days", "2")])
    );
    assert_eq!(
        xml_check(&answer),
        [
            text("<tool_call> oops"),
            call("get_weather", json!({"days": 2}))
        ]
    );
}

#[test]
fn a_long_xml_value_is_scanned_in_linear_time() {
    let big = "x<\n".repeat(1 << 18);
    let answer = xml_call("write_file", &[("content", &big)]);
    let t0 = std::time::Instant::now();
    let tools = xml_tools();
    let p = ToolCallParser::new(ToolFormat::QwenXml).with_tools(&tools);
    let pieces = streamed_by(p, &answer, 4);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(pieces, [call("write_file", json!({"content": big}))]);
}

#[test]
fn random_xml_values_come_back_as_written() {
    // Values spliced from tags, look-alikes, JSON and newlines; each comes
    // back exactly, streamed or whole, unless it holds a `</parameter>`
    // that the format's own layout follows (which ends any value).
    const PARTS: [&str; 14] = [
        "<",
        ">",
        "</parameter",
        "</parameter>",
        "<parameter=",
        "</function>",
        "</tool_call>",
        "\n",
        " ",
        "{\"a\": [1]}",
        "\"",
        "é",
        "x",
        "😀",
    ];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let ends = |v: &str| {
        v.match_indices("</parameter>").any(|(i, m)| {
            let after = format!("{}\n", &v[i + m.len()..]);
            let t = after.trim_start();
            t.starts_with("<parameter=") || t.starts_with("</function>")
        })
    };
    let mut tried = 0;
    for _ in 0..1500 {
        let n = (next() % 12) as usize;
        let v: String = (0..n)
            .map(|_| PARTS[(next() % PARTS.len() as u64) as usize])
            .collect();
        if ends(&v) {
            continue;
        }
        tried += 1;
        let answer = format!(
            "ok {}",
            xml_call("write_file", &[("content", &v), ("mode", "7")])
        );
        assert_eq!(
            xml_check(&answer),
            [
                text("ok"),
                call("write_file", json!({"content": v, "mode": 7}))
            ],
            "{v:?}"
        );
    }
    assert!(tried > 1000, "{tried}");
}
