//! Reasoning read out of a real model's answer on every chat route.
//!
//! SmolLM2 was not trained to think, so the server runs a ChatML template
//! that does what DeepSeek-R1's and QwQ's do for a one-message
//! conversation: with `enable_thinking` it ends the prompt inside an open
//! `<think>` block (the model's answer starts as reasoning), without it it
//! writes the block closed. For the
//! split after a block the model writes itself, the conversation holds
//! three earlier turns in which the assistant thought, said a line and
//! called a tool; greedy decoding copies the pattern, so the model itself
//! writes `<think>…</think>`, text and a `<tool_call>`.

use serde_json::{json, Value};

use super::{client, Server};

/// ChatML with a think block opened by the generation prompt (as
/// DeepSeek-R1's template does) and Hermes tool calls; earlier assistant
/// turns show their `reasoning_content` in a block of their own.
const THINKING: &str = r#"{%- if tools %}<|im_start|>system
You can call these tools:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|im_start|>assistant
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{% if m.content %}{{ m.content }}
{% endif %}{% for c in m.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if messages | length == 1 %}{% if enable_thinking %}<think>
{% else %}<think>
</think>

{% endif %}{% endif %}{% endif %}"#;

fn start() -> Server {
    let path = std::env::temp_dir().join(format!("lamina-think-{}.jinja", std::process::id()));
    std::fs::write(&path, THINKING).unwrap();
    let server = Server::start(
        &[
            "--chat-template-file",
            path.to_str().unwrap(),
            "--parallel",
            "2",
            "-c",
            "2048",
            "--temp",
            "0",
        ],
        &[],
    );
    let _ = std::fs::remove_file(&path);
    server
}

/// The JSON payloads of an SSE or NDJSON body.
fn events(r: &client::Response) -> Vec<Value> {
    let lines: Vec<String> = if r.head.contains("text/event-stream") {
        r.sse_data()
    } else {
        r.body.lines().map(str::to_owned).collect()
    };
    lines
        .iter()
        .filter(|d| d.as_str() != "[DONE]" && !d.trim().is_empty())
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// A one-message request (its prompt opens the block while thinking is
/// on), with extra fields.
fn opened(extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[test]
fn an_answer_that_starts_inside_the_block_is_reasoning_in_every_format() {
    let server = start();

    // `none`: the answer as the model wrote it, all in the content.
    let raw = server
        .chat(opened(json!({"reasoning_format": "none"})))
        .json();
    let raw = raw["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!raw.trim().is_empty(), "{raw:?}");
    assert!(!raw.contains("</think>"), "{raw:?}");

    // The default (`auto`, as `deepseek`): the same text is reasoning,
    // and nothing is content.
    let v = server.chat(opened(json!({}))).json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], raw.trim(), "{v}");
    assert_eq!(m["content"], "", "{v}");

    // `deepseek-legacy`: reasoning_content filled, the content kept.
    let v = server
        .chat(opened(json!({"reasoning_format": "deepseek-legacy"})))
        .json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], raw.trim(), "{v}");
    assert_eq!(m["content"], raw.as_str(), "{v}");

    // Streamed: reasoning_content deltas that join to the same text, and
    // no content.
    let r = server.chat(opened(json!({"stream": true})));
    assert_eq!(r.status, 200, "{}", r.body);
    let chunks = events(&r);
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["delta"])
        .collect();
    let reasoning: String = deltas
        .iter()
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(reasoning, raw.trim(), "{}", r.body);
    assert!(
        deltas
            .iter()
            .filter(|d| d["reasoning_content"].is_string())
            .count()
            > 1,
        "the reasoning did not stream: {}",
        r.body
    );
    assert!(
        deltas
            .iter()
            .all(|d| d["content"].as_str().is_none_or(str::is_empty)),
        "{}",
        r.body
    );

    // enable_thinking false reaches the template: the block is closed in
    // the prompt and the answer is content.
    let v = server
        .chat(opened(
            json!({"chat_template_kwargs": {"enable_thinking": false}}),
        ))
        .json();
    let m = &v["choices"][0]["message"];
    assert!(m.get("reasoning_content").is_none(), "{v}");
    assert!(!m["content"].as_str().unwrap().trim().is_empty(), "{v}");

    // Bad values are 400s that name the field.
    let r = server.chat(opened(json!({"reasoning_format": "loud"})));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "reasoning_format");
    let r = server.chat(opened(
        json!({"chat_template_kwargs": {"enable_thinking": "yes"}}),
    ));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.json()["error"]["param"],
        "chat_template_kwargs.enable_thinking"
    );

    // Ollama's `think` and `message.thinking`, whole and streamed.
    let ollama = |think: bool, stream: bool| {
        client::post(
            server.port,
            "/api/chat",
            &json!({"model": "m", "stream": stream, "think": think,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "options": {"temperature": 0, "num_predict": 12}}),
        )
    };
    let r = ollama(true, false);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["message"]["thinking"], raw.trim(), "{}", r.body);
    assert_eq!(r.json()["message"]["content"], "", "{}", r.body);
    let lines = events(&ollama(true, true));
    let thinking: String = lines
        .iter()
        .filter_map(|l| l["message"]["thinking"].as_str())
        .collect();
    assert_eq!(thinking, raw.trim());
    let r = ollama(false, false);
    assert!(r.json()["message"].get("thinking").is_none(), "{}", r.body);
    assert!(!r.json()["message"]["content"]
        .as_str()
        .unwrap()
        .trim()
        .is_empty());
    let r = client::post(
        server.port,
        "/api/chat",
        &json!({"model": "m", "stream": false, "think": "sometimes",
                "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
}

/// Three turns in which the assistant thought, spoke and called the tool,
/// then the question again.
fn few_shot() -> Value {
    let call = json!({"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}});
    let mut m = Vec::new();
    for _ in 0..3 {
        m.push(json!({"role": "user", "content": "What is the weather in Paris?"}));
        m.push(
            json!({"role": "assistant", "reasoning_content": "The user wants the weather.",
                      "content": "Let me check.", "tool_calls": [call]}),
        );
    }
    m.push(json!({"role": "user", "content": "What is the weather in Paris?"}));
    Value::Array(m)
}

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }}])
}

#[test]
fn a_tool_call_after_a_think_block_is_read_on_every_route() {
    let server = start();
    let body = |stream: bool| {
        json!({"messages": few_shot(), "tools": tools(), "temperature": 0,
               "max_tokens": 80, "stream": stream})
    };

    let v = server.chat(body(false)).json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "The user wants the weather.", "{v}");
    assert_eq!(m["content"], "Let me check.", "{v}");
    assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

    // Streamed: reasoning deltas, then content, then the call.
    let r = server.chat(body(true));
    let chunks = events(&r);
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["delta"])
        .collect();
    let kind = |d: &Value| {
        if d["reasoning_content"].is_string() {
            1
        } else if d["content"].is_string() {
            2
        } else if d.get("tool_calls").is_some() {
            3
        } else {
            0
        }
    };
    let kinds: Vec<i32> = deltas.iter().map(|d| kind(d)).filter(|&k| k > 0).collect();
    assert!(kinds.windows(2).all(|w| w[0] <= w[1]), "{}", r.body);
    assert_eq!(kinds.first(), Some(&1), "{}", r.body);
    assert_eq!(kinds.last(), Some(&3), "{}", r.body);
    let reasoning: String = deltas
        .iter()
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(reasoning, "The user wants the weather.");

    // Anthropic: a thinking block first, then text and tool_use.
    let mut messages = vec![];
    for i in 0..3 {
        messages.push(json!({"role": "user", "content": "What is the weather in Paris?"}));
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants the weather.", "signature": ""},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": format!("t{i}"), "name": "get_weather",
             "input": {"city": "Paris"}}]}));
    }
    messages.push(json!({"role": "user", "content": "What is the weather in Paris?"}));
    let anthropic = |stream: bool| {
        json!({"model": "m", "max_tokens": 80, "temperature": 0, "stream": stream,
               "messages": messages, "thinking": {"type": "enabled", "budget_tokens": 1024},
               "tools": [{"name": "get_weather",
                          "input_schema": {"type": "object",
                                           "properties": {"city": {"type": "string"}}}}]})
    };
    let r = client::post(server.port, "/v1/messages", &anthropic(false));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["content"][0]["type"], "thinking", "{v}");
    assert_eq!(v["content"][0]["thinking"], "The user wants the weather.");
    assert_eq!(v["content"][0]["signature"], "");
    assert_eq!(
        v["content"][1],
        json!({"type": "text", "text": "Let me check."})
    );
    assert_eq!(v["content"][2]["type"], "tool_use");
    assert_eq!(v["stop_reason"], "tool_use");

    let r = client::post(server.port, "/v1/messages", &anthropic(true));
    let evs = events(&r);
    let starts: Vec<&str> = evs
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .map(|e| e["content_block"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(starts, ["thinking", "text", "tool_use"], "{}", r.body);
    let thinking: String = evs
        .iter()
        .filter(|e| e["delta"]["type"] == "thinking_delta")
        .map(|e| e["delta"]["thinking"].as_str().unwrap())
        .collect();
    assert_eq!(thinking, "The user wants the weather.");
    let signature = evs
        .iter()
        .position(|e| e["delta"]["type"] == "signature_delta")
        .unwrap();
    let first_stop = evs
        .iter()
        .position(|e| e["type"] == "content_block_stop")
        .unwrap();
    assert!(signature < first_stop, "{}", r.body);
}
