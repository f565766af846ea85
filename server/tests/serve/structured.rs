//! Structured output on a real model, over every route that takes it:
//! JSON schemas, llama.cpp's GBNF and JSON fields, Ollama's `format`, and
//! tool calls forced by `tool_choice`. SmolLM2 (135M) does not keep to a
//! schema or call tools on its own, so every shape checked here holds only
//! because decoding was constrained.

use serde_json::{json, Value};

use super::{client, content, user, Server};

fn start() -> Server {
    Server::start(&["--parallel", "2", "-c", "2048", "--temp", "0"], &[])
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "pets": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        },
        "required": ["name", "age", "pets"],
        "additionalProperties": false,
    })
}

/// The keys and types `person_schema` requires.
fn assert_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    assert!(
        o.keys()
            .all(|k| ["name", "age", "pets"].contains(&k.as_str())),
        "{text}"
    );
    assert!(
        v["name"].as_str().is_some_and(|n| n.chars().count() <= 20),
        "{text}"
    );
    assert!(
        v["age"].as_i64().is_some_and(|a| (0..=150).contains(&a)),
        "{text}"
    );
    let pets = v["pets"]
        .as_array()
        .unwrap_or_else(|| panic!("pets: {text}"));
    assert!(
        pets.len() <= 3 && pets.iter().all(Value::is_string),
        "{text}"
    );
}

#[test]
fn json_schema_on_chat_streamed_or_not_and_on_native_completion() {
    let server = start();
    let mut body = user("Tell me about a person called Ann who has a cat.", 150);
    body["response_format"] = json!({"type": "json_schema",
        "json_schema": {"name": "person", "strict": true, "schema": person_schema()}});
    let r = server.chat(body.clone());
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let text = content(&v);
    assert_person(&text);

    // Streamed, the deltas join to the same (greedy) text.
    body["stream"] = json!(true);
    let r = server.chat(body);
    assert_eq!(r.status, 200, "{}", r.body);
    let mut streamed = String::new();
    for d in r.sse_data() {
        if d == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&d).unwrap();
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(t);
        }
    }
    assert_eq!(streamed, text);

    // llama-server's own `json_schema` field, on the native /completion
    // and on OpenAI's legacy completions.
    let prompt = "A person, as JSON:";
    for path in ["/completion", "/v1/completions"] {
        let r = client::post(
            server.port,
            path,
            &json!({"prompt": prompt, "json_schema": person_schema(), "n_predict": 150, "max_tokens": 150}),
        );
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let v = r.json();
        let text = v["content"]
            .as_str()
            .or_else(|| v["choices"][0]["text"].as_str())
            .unwrap()
            .to_owned();
        assert_person(&text);
    }
}

#[test]
fn gbnf_grammars_and_their_limits() {
    let server = start();
    // The model would answer a question in words; the grammar leaves it two.
    for q in ["Is the sky blue?", "Is fire cold?", "Do fish fly?"] {
        let mut body = user(q, 10);
        body["grammar"] = json!("root ::= \"yes\" | \"no\"");
        let v = server.chat(body).json();
        let text = content(&v);
        assert!(text == "yes" || text == "no", "{q}: {text:?}");
        let r = client::post(
            server.port,
            "/completion",
            &json!({"prompt": q, "grammar": "root ::= (\"yes\" | \"no\") \".\"", "n_predict": 10}),
        );
        let v = r.json();
        let text = v["content"].as_str().unwrap();
        assert!(text == "yes." || text == "no.", "{q}: {text:?} {v}");
        assert_eq!(v["stop_type"], "eos", "{v}");
    }
    // A grammar that forbids ending for 500 letters: max_tokens ends it,
    // and what came is in the grammar's language so far.
    let r = client::post(
        server.port,
        "/completion",
        &json!({"prompt": "Spell:", "grammar": "root ::= [a-z]{500}", "n_predict": 12}),
    );
    let v = r.json();
    assert_eq!(v["stop_type"], "limit", "{v}");
    let text = v["content"].as_str().unwrap();
    assert!(
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_lowercase()),
        "{text:?}"
    );
    // A Lark grammar, as llama.cpp's llguidance build takes it.
    let mut body = user("Pick a number.", 10);
    body["grammar"] = json!("%llguidance {}\nstart: /[1-9]/ \"!\"");
    let text = content(&server.chat(body).json());
    assert!(
        text.len() == 2 && text.as_bytes()[0].is_ascii_digit() && text.ends_with('!'),
        "{text:?}"
    );
}

#[test]
fn invalid_schemas_and_grammars_are_400_never_an_answer() {
    let server = start();
    let cases = [
        (json!({"grammar": "root ::= [a-"}), "grammar"),
        (json!({"grammar": "root ::= undefined"}), "grammar"),
        (json!({"grammar": "%llguidance {}\nstart: nope"}), "grammar"),
        (json!({"json_schema": {"type": "hiccup"}}), "json_schema"),
        (json!({"json_schema": false}), "json_schema"),
        (
            json!({"response_format": {"type": "json_object", "schema": {"type": 123}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}}}),
            "response_format",
        ),
        (
            json!({"grammar": "root ::= \"a\"", "json_schema": {}}),
            "grammar",
        ),
    ];
    for (extra, param) in cases {
        for stream in [false, true] {
            let mut body = user("Hi", 5);
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            body["stream"] = json!(stream);
            let r = server.chat(body);
            assert_eq!(r.status, 400, "{extra} stream={stream}: {}", r.body);
            let e = r.json();
            assert_eq!(e["error"]["param"], param, "{e}");
            assert!(!e["error"]["message"].as_str().unwrap().is_empty());
        }
    }
    let r = client::post(
        server.port,
        "/completion",
        &json!({"prompt": "Hi", "grammar": "root ::= (", "n_predict": 4}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let r = client::post(
        server.port,
        "/api/chat",
        &json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "format": {"type": "wat"}, "stream": false}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"].as_str().unwrap().contains("format"),
        "{}",
        r.body
    );
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                           "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "get_time", "description": "The time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
                           "required": ["zone"], "additionalProperties": false}}},
    ])
}

#[test]
fn tool_choice_required_or_named_forces_a_parsed_call() {
    let server = start();
    let ask = || {
        let mut b = user("What is the weather in Paris?", 80);
        b["tools"] = weather_tools();
        b
    };
    // Left to itself the small model answers in words.
    let free = server.chat(ask()).json();
    assert!(
        free["choices"][0]["message"]["tool_calls"].is_null(),
        "{free}"
    );

    let mut body = ask();
    body["tool_choice"] = json!("required");
    let v = server.chat(body).json();
    let calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let name = calls[0]["function"]["name"].as_str().unwrap();
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    match name {
        "get_weather" => assert!(args["city"].is_string(), "{args}"),
        "get_time" => assert!(
            ["UTC", "CET", "PST"].contains(&args["zone"].as_str().unwrap()),
            "{args}"
        ),
        other => panic!("called {other}"),
    }

    // A named function: that one, streamed as a tool-call delta too.
    for stream in [false, true] {
        let mut body = ask();
        body["tool_choice"] = json!({"type": "function", "function": {"name": "get_time"}});
        body["stream"] = json!(stream);
        let r = server.chat(body);
        assert_eq!(r.status, 200, "{}", r.body);
        let call = if stream {
            r.sse_data()
                .iter()
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str::<Value>(d).unwrap())
                .find_map(|c| {
                    c["choices"][0]["delta"]["tool_calls"][0]
                        .as_object()
                        .cloned()
                })
                .map(Value::Object)
                .unwrap_or_else(|| panic!("no tool-call delta: {}", r.body))
        } else {
            r.json()["choices"][0]["message"]["tool_calls"][0].clone()
        };
        assert_eq!(call["function"]["name"], "get_time", "{call}");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(
            ["UTC", "CET", "PST"].contains(&args["zone"].as_str().unwrap()),
            "{args}"
        );
    }

    // Anthropic's `any`.
    let r = client::post(
        server.port,
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 80, "messages": [{"role": "user", "content": "Weather in Rome?"}],
                "tools": [{"name": "get_weather", "input_schema": weather_tools()[0]["function"]["parameters"]}],
                "tool_choice": {"type": "any"}}),
    );
    let v = r.json();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let block = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .cloned();
    assert_eq!(block.unwrap_or_default()["name"], "get_weather", "{v}");

    // "none": nothing is read for calls (that the prompt then lists no
    // tools is checked in tool_calls.rs, whose template renders them).
    let mut none = ask();
    none["tool_choice"] = json!("none");
    let n = server.chat(none).json();
    assert!(n["choices"][0]["message"]["tool_calls"].is_null(), "{n}");

    // A named function that is not among the tools, or no tools at all.
    let mut bad = ask();
    bad["tool_choice"] = json!({"type": "function", "function": {"name": "launch"}});
    let r = server.chat(bad);
    assert_eq!(r.status, 400, "{}", r.body);
    let mut bare = user("Hi", 5);
    bare["tool_choice"] = json!("required");
    assert_eq!(server.chat(bare).status, 400);
}

#[test]
fn ollama_format_json_and_schema() {
    let server = start();
    // (The JSON-mode prompt is main.rs's, whose object closes in time.)
    for (format, ask) in [
        (
            json!("json"),
            "Describe a cat as JSON with a name and an age.",
        ),
        (person_schema(), "Describe Ann, 30, with a dog."),
    ] {
        let r = client::post(
            server.port,
            "/api/chat",
            &json!({"model": "m", "stream": false, "format": format,
                    "messages": [{"role": "user", "content": ask}],
                    "options": {"temperature": 0, "num_predict": 150}}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let text = v["message"]["content"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(parsed.is_object(), "{text}");
        if format.is_object() {
            assert_person(text);
        }
    }
    let r = client::post(
        server.port,
        "/api/generate",
        &json!({"model": "m", "stream": false, "format": person_schema(), "prompt": "Describe Bob.",
                "options": {"temperature": 0, "num_predict": 150}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_person(r.json()["response"].as_str().unwrap());
}
