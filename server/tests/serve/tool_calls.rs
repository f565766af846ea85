//! Tool calls read out of a real model's answer on every chat route.
//!
//! SmolLM2 does not call tools on its own, so its answer is made certain
//! the way few-shot prompting makes it: the server runs a Hermes-style
//! template (given with `--chat-template-file`, as a Qwen file carries
//! one) and the conversation holds three earlier turns in which the
//! assistant answered the same question with the same call. Greedy
//! decoding copies the pattern, so the model itself writes `Let me
//! check.\n<tool_call>\n{…}\n</tool_call>` and the server has to read it.

use serde_json::{json, Value};

use super::{client, Server};

/// ChatML with Hermes tool calls, as Qwen 2.5's template writes them.
const HERMES: &str = r#"{%- if tools %}<|im_start|>system
You can call these tools:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% if m.content %}{{ m.content }}
{% endif %}{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

const QUESTION: &str = "What is the weather in Paris?";

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    }}])
}

/// Three turns in which the assistant answered with the call, then the
/// question again (OpenAI's message shape).
fn few_shot() -> Value {
    let call = json!({"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}});
    let mut m = Vec::new();
    for _ in 0..3 {
        m.push(json!({"role": "user", "content": QUESTION}));
        m.push(json!({"role": "assistant", "content": "Let me check.", "tool_calls": [call]}));
    }
    m.push(json!({"role": "user", "content": QUESTION}));
    Value::Array(m)
}

fn openai_body(stream: bool) -> Value {
    json!({"messages": few_shot(), "tools": tools(), "temperature": 0,
           "max_tokens": 60, "stream": stream})
}

fn start() -> Server {
    start_with("hermes", HERMES)
}

/// The server running the template `source`.
fn start_with(name: &str, source: &str) -> Server {
    let path = std::env::temp_dir().join(format!("lamina-{name}-{}.jinja", std::process::id()));
    std::fs::write(&path, source).unwrap();
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

#[test]
fn tool_calls_are_structured_on_every_chat_route() {
    let server = start();
    let port = server.port;

    // OpenAI, whole.
    let r = server.chat(openai_body(false));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], "Let me check.", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert!(calls[0]["id"].as_str().is_some_and(|id| !id.is_empty()));
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));

    // Without tools (or with tool_choice "none") the same answer is text.
    let mut body = openai_body(false);
    body.as_object_mut().unwrap().remove("tools");
    let plain = server.chat(body).json();
    let text = plain["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with("Let me check.\n<tool_call>"), "{plain}");
    assert!(plain["choices"][0]["message"].get("tool_calls").is_none());
    assert_eq!(plain["choices"][0]["finish_reason"], "stop");
    let mut body = openai_body(false);
    body["tool_choice"] = json!("none");
    let none = server.chat(body).json();
    assert!(none["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("<tool_call>"));
    // "none" offers no tools: the prompt is the one without them.
    assert_eq!(
        none["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"],
        "{none}"
    );
    assert!(
        none["usage"]["prompt_tokens"].as_u64() < v["usage"]["prompt_tokens"].as_u64(),
        "{none} {v}"
    );
    let mut body = openai_body(false);
    body["tool_choice"] = json!("sometimes");
    let bad = server.chat(body);
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["param"], "tool_choice");

    // OpenAI, streamed: the text before the call streams, nothing of the
    // call is ever sent as text, the call comes whole in one delta.
    let r = server.chat(openai_body(true));
    assert_eq!(r.status, 200, "{}", r.body);
    let chunks = events(&r);
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["delta"])
        .collect();
    let text: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(text, "Let me check.", "{}", r.body);
    assert!(
        deltas.iter().filter(|d| d["content"].is_string()).count() > 1,
        "the text did not stream: {}",
        r.body
    );
    let call_at = deltas
        .iter()
        .position(|d| d.get("tool_calls").is_some())
        .unwrap();
    let last_text = deltas
        .iter()
        .rposition(|d| d["content"].is_string())
        .unwrap();
    assert!(last_text < call_at, "{}", r.body);
    let streamed = &deltas[call_at]["tool_calls"];
    assert_eq!(streamed.as_array().unwrap().len(), 1);
    assert_eq!(streamed[0]["index"], 0);
    assert_eq!(streamed[0]["type"], "function");
    assert_eq!(streamed[0]["function"]["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(streamed[0]["function"]["arguments"].as_str().unwrap())
            .unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(
        deltas
            .iter()
            .filter(|d| d.get("tool_calls").is_some())
            .count(),
        1
    );
    let finish = chunks
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));

    // Anthropic: the same conversation with tool_use blocks.
    let mut messages = vec![];
    for i in 0..3 {
        messages.push(json!({"role": "user", "content": QUESTION}));
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": format!("t{i}"), "name": "get_weather",
             "input": {"city": "Paris"}}]}));
    }
    messages.push(json!({"role": "user", "content": QUESTION}));
    let body = json!({"model": "m", "max_tokens": 60, "messages": messages,
        "tools": [{"name": "get_weather", "description": "The weather in a city",
                   "input_schema": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}]});
    let r = client::post(port, "/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    assert_eq!(
        m["content"][0],
        json!({"type": "text", "text": "Let me check."})
    );
    let block = &m["content"][1];
    assert_eq!(block["type"], "tool_use", "{m}");
    assert_eq!(block["name"], "get_weather");
    assert_eq!(block["input"], json!({"city": "Paris"}));
    assert!(block["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(m["content"].as_array().unwrap().len(), 2);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = client::post(port, "/v1/messages", &streamed);
    assert_eq!(r.status, 200, "{}", r.body);
    let ev = events(&r);
    let starts: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .collect();
    assert_eq!(starts.len(), 2, "{}", r.body);
    assert_eq!(starts[0]["content_block"]["type"], "text");
    assert_eq!(starts[1]["index"], 1);
    assert_eq!(starts[1]["content_block"]["type"], "tool_use");
    assert_eq!(starts[1]["content_block"]["name"], "get_weather");
    let text: String = ev
        .iter()
        .filter(|e| e["delta"]["type"] == "text_delta")
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Let me check.");
    let input: String = ev
        .iter()
        .filter(|e| e["delta"]["type"] == "input_json_delta" && e["index"] == 1)
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap(),
        json!({"city": "Paris"})
    );
    let stops = ev
        .iter()
        .filter(|e| e["type"] == "content_block_stop")
        .count();
    assert_eq!(stops, 2, "{}", r.body);
    let delta = ev.iter().find(|e| e["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    let mut none = body.clone();
    none["tool_choice"] = json!({"type": "none"});
    let r = client::post(port, "/v1/messages", &none);
    assert!(r.json()["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("<tool_call>"));

    // Ollama: arguments as an object, streamed or not.
    let mut messages = vec![];
    for _ in 0..3 {
        messages.push(json!({"role": "user", "content": QUESTION}));
        messages.push(
            json!({"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
        );
    }
    messages.push(json!({"role": "user", "content": QUESTION}));
    let body = json!({"model": "m", "messages": messages, "tools": tools(), "stream": false,
                      "options": {"temperature": 0, "num_predict": 60}});
    let r = client::post(port, "/api/chat", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["message"]["content"], "Let me check.", "{v}");
    assert_eq!(
        v["message"]["tool_calls"],
        json!([{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}])
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = client::post(port, "/api/chat", &streamed);
    let lines = events(&r);
    let text: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(text, "Let me check.", "{}", r.body);
    let with_calls: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"].get("tool_calls").is_some())
        .collect();
    assert_eq!(with_calls.len(), 1, "{}", r.body);
    assert_eq!(
        with_calls[0]["message"]["tool_calls"][0]["function"]["arguments"],
        json!({"city": "Paris"})
    );
    assert_eq!(lines.last().unwrap()["done"], true);
}

/// ChatML with Qwen3-Coder's XML tool calls: the marks that tell the
/// format (`<tool_call>`, `<function=`, `<parameter=`) are in the system
/// prompt, as in Qwen3-Coder's and Qwen3.5's own templates, and the
/// earlier turns carry their calls in the answer's text.
const QWEN_XML: &str = r#"{%- if tools %}<|im_start|>system
You can call these tools:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
Call one like this:
<tool_call>
<function=NAME>
<parameter=KEY>
VALUE
</parameter>
</function>
</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// The answer of the XML few-shot turns: a string value with `<`, a
/// newline and JSON in it, and an integer one.
const XML_ANSWER: &str = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=note>\na < b\n{\"x\": 1}\n</parameter>\n</function>\n</tool_call>";

fn xml_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["city"]},
    }}])
}

fn xml_args() -> Value {
    json!({"city": "Paris", "days": 3, "note": "a < b\n{\"x\": 1}"})
}

/// Three turns answered with the XML call as text, then the question.
fn xml_few_shot() -> Vec<Value> {
    let mut m = Vec::new();
    for _ in 0..3 {
        m.push(json!({"role": "user", "content": QUESTION}));
        m.push(json!({"role": "assistant", "content": XML_ANSWER}));
    }
    m.push(json!({"role": "user", "content": QUESTION}));
    m
}

#[test]
fn xml_tool_calls_are_typed_by_schema_on_every_chat_route() {
    let server = start_with("qwen-xml", QWEN_XML);
    let port = server.port;
    let openai = |stream: bool| {
        json!({"messages": xml_few_shot(), "tools": xml_tools(), "temperature": 0,
               "max_tokens": 90, "stream": stream})
    };

    // OpenAI, whole: the string values raw, the integer one a number.
    let r = server.chat(openai(false));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], "Let me check.", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, xml_args());
    // Without tools the same answer is its text.
    let mut body = openai(false);
    body.as_object_mut().unwrap().remove("tools");
    let plain = server.chat(body).json();
    let text = plain["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with(XML_ANSWER), "{plain}");

    // OpenAI, streamed: the text streams before the call, none of the
    // call is sent as text, and the call comes whole in one delta.
    let r = server.chat(openai(true));
    assert_eq!(r.status, 200, "{}", r.body);
    let chunks = events(&r);
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["delta"])
        .collect();
    let text: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(text, "Let me check.", "{}", r.body);
    let with_calls: Vec<&&Value> = deltas
        .iter()
        .filter(|d| d.get("tool_calls").is_some())
        .collect();
    assert_eq!(with_calls.len(), 1, "{}", r.body);
    let streamed = &with_calls[0]["tool_calls"][0];
    assert_eq!(streamed["function"]["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(streamed["function"]["arguments"].as_str().unwrap()).unwrap(),
        xml_args()
    );
    let finish = chunks
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));

    // Anthropic: a tool_use block with the typed input, streamed or not.
    let body = json!({"model": "m", "max_tokens": 90, "messages": xml_few_shot(),
        "tools": [{"name": "get_weather", "description": "The weather in a city",
                   "input_schema": xml_tools()[0]["function"]["parameters"]}]});
    let r = client::post(port, "/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    assert_eq!(
        m["content"][0],
        json!({"type": "text", "text": "Let me check."})
    );
    assert_eq!(m["content"][1]["type"], "tool_use", "{m}");
    assert_eq!(m["content"][1]["name"], "get_weather");
    assert_eq!(m["content"][1]["input"], xml_args());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = client::post(port, "/v1/messages", &streamed);
    assert_eq!(r.status, 200, "{}", r.body);
    let ev = events(&r);
    let text: String = ev
        .iter()
        .filter(|e| e["delta"]["type"] == "text_delta")
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Let me check.", "{}", r.body);
    let input: String = ev
        .iter()
        .filter(|e| e["delta"]["type"] == "input_json_delta" && e["index"] == 1)
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&input).unwrap(), xml_args());
    let delta = ev.iter().find(|e| e["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");

    // Ollama: the arguments as an object, streamed or not.
    let body = json!({"model": "m", "messages": xml_few_shot(), "tools": xml_tools(),
                      "stream": false, "options": {"temperature": 0, "num_predict": 90}});
    let r = client::post(port, "/api/chat", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["message"]["content"], "Let me check.", "{v}");
    assert_eq!(
        v["message"]["tool_calls"],
        json!([{"function": {"name": "get_weather", "arguments": xml_args()}}])
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = client::post(port, "/api/chat", &streamed);
    let lines = events(&r);
    let text: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(text, "Let me check.", "{}", r.body);
    let with_calls: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"].get("tool_calls").is_some())
        .collect();
    assert_eq!(with_calls.len(), 1, "{}", r.body);
    assert_eq!(
        with_calls[0]["message"]["tool_calls"][0]["function"]["arguments"],
        xml_args()
    );

    // tool_choice "required": the grammar leaves out the text before the
    // call, and the model's free-text values still end where it ends them.
    let mut body = openai(false);
    body["tool_choice"] = json!("required");
    let r = server.chat(body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, xml_args());
}
