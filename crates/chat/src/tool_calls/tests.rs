use serde_json::json;

use super::*;

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
    let mut p = ToolCallParser::new(format);
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
    let whole = joined(parse(format, answer));
    for step in [1, 3, 7] {
        assert_eq!(
            streamed(format, answer, step),
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
        for f in [
            ToolFormat::Hermes,
            ToolFormat::Llama3,
            ToolFormat::Mistral,
            ToolFormat::Generic,
        ] {
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
    for f in [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Generic,
    ] {
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
    const PARTS: [&str; 26] = [
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "</function>",
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
    let mut calls = 0;
    for _ in 0..3000 {
        let n = (next() % 24) as usize;
        let answer: String = (0..n)
            .map(|_| PARTS[(next() % PARTS.len() as u64) as usize])
            .collect();
        for f in [
            ToolFormat::Hermes,
            ToolFormat::Llama3,
            ToolFormat::Mistral,
            ToolFormat::Generic,
        ] {
            let pieces = check(f, &answer);
            calls += pieces
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
    assert!(calls > 100, "{calls}");
}
