#![allow(clippy::unwrap_used)]

use lamina_chat::{Piece, ToolCall};
use lamina_engine::{FinishReason, Timings};

use super::*;

fn body(v: Value) -> Body {
    let Value::Object(m) = v else { panic!() };
    Body(m)
}

#[test]
fn input_items_become_chat_messages() {
    let b = body(json!({
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in"},
                                         {"type": "input_text", "text": "Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
            {"type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "noon"}]},
            {"role": "user", "content": "Thanks"},
        ],
    }));
    let m = messages(&b).unwrap();
    assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(
        m[1],
        json!({"role": "user", "content": "Weather in\nParis?"})
    );
    // The reasoning item opens the assistant turn; the message and both
    // calls join it.
    assert_eq!(m[2]["reasoning_content"], "Call the tool.");
    assert_eq!(m[3]["role"], "assistant");
    assert_eq!(m[3]["content"], "Checking.");
    assert_eq!(m[3]["tool_calls"][0]["id"], "c1");
    assert_eq!(m[3]["tool_calls"][1]["function"]["name"], "get_time");
    assert_eq!(
        m[4],
        json!({"role": "tool", "tool_call_id": "c1", "content": "18 C"})
    );
    assert_eq!(m[5]["content"], "noon");
    assert_eq!(m[6], json!({"role": "user", "content": "Thanks"}));
    assert_eq!(m.as_array().unwrap().len(), 7);

    let one = messages(&body(json!({"input": "Hi"}))).unwrap();
    assert_eq!(one, json!([{"role": "user", "content": "Hi"}]));
}

#[test]
fn bad_input_is_a_400_that_names_the_item() {
    let cases = [
        (json!({}), "input"),
        (json!({"input": 5}), "input"),
        (
            json!({"input": [{"type": "web_search_call"}]}),
            "input[0].type",
        ),
        (json!({"input": [{"content": "x"}]}), "input[0]"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0]",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[0].call_id",
        ),
        (
            json!({"input": [{"role": "robot", "content": "x"}]}),
            "input[0].role",
        ),
    ];
    for (b, param) in cases {
        let e = messages(&body(b.clone())).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{b}");
        assert_eq!(e.param.as_deref(), Some(param), "{b}: {}", e.message);
    }
}

#[test]
fn flat_tools_become_chat_tools() {
    let b = body(json!({"tools": [{"type": "function", "name": "get_weather",
        "description": "d", "parameters": {"type": "object"}, "strict": null}]}));
    let t = tools(&b).unwrap().unwrap();
    assert_eq!(
        t,
        json!([{"type": "function", "function": {"name": "get_weather", "description": "d",
                                                "parameters": {"type": "object"}}}])
    );
    let e = tools(&body(json!({"tools": [{"type": "web_search"}]}))).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools[0].type"));
    assert!(tools(&body(json!({"tools": [{"type": "function"}]}))).is_err());
    let c = tool_choice(&body(
        json!({"tool_choice": {"type": "function", "name": "f"}}),
    ))
    .unwrap()
    .unwrap();
    assert_eq!(c, json!({"type": "function", "function": {"name": "f"}}));
}

#[test]
fn pieces_become_items_and_events_in_order() {
    let mut out = Output::new();
    out.piece(Piece::Reasoning("Think".into()));
    out.piece(Piece::Reasoning("ing.".into()));
    out.piece(Piece::Text("Let me ".into()));
    out.piece(Piece::Text("check.".into()));
    out.piece(Piece::Call(ToolCall {
        id: None,
        name: "get_weather".into(),
        arguments: serde_json::from_value(json!({"city": "Paris"})).unwrap(),
    }));
    out.close();
    let items = serde_json::to_value(&out.items).unwrap();
    assert_eq!(items[0]["type"], "reasoning");
    assert_eq!(items[0]["content"][0]["text"], "Thinking.");
    assert_eq!(items[1]["type"], "message");
    assert_eq!(items[1]["content"][0]["type"], "output_text");
    assert_eq!(items[1]["content"][0]["text"], "Let me check.");
    assert_eq!(items[2]["type"], "function_call");
    assert_eq!(items[2]["arguments"], "{\"city\":\"Paris\"}");
    assert!(items[2]["call_id"].as_str().unwrap().starts_with("call_"));
    assert!(items[1]["id"].as_str().unwrap().starts_with("msg_"));

    let events = out.take_events();
    let names: Vec<&str> = events.iter().map(StreamEvent::name).collect();
    assert_eq!(
        names,
        [
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]
    );
    // Sequence numbers count up from 0; the `type` field is the name.
    for (i, ev) in events.iter().enumerate() {
        let v = serde_json::to_value(ev).unwrap();
        assert_eq!(v["sequence_number"], i as u64);
        assert_eq!(v["type"], ev.name());
    }
}

#[test]
fn a_cut_answer_is_incomplete() {
    let head = Head {
        id: "resp_x".into(),
        created_at: 1,
        model: "m".into(),
        instructions: None,
        max_output_tokens: Some(8),
        temperature: 0.8,
        top_p: 0.95,
        tools: Vec::new(),
        tool_choice: json!("auto"),
        parallel_tool_calls: true,
    };
    let summary = |finish| Summary {
        finish,
        prompt_tokens: 10,
        completion_tokens: 8,
        timings: Timings::default(),
    };
    let r = serde_json::to_value(head.response(Vec::new(), Some(&summary(FinishReason::Length))))
        .unwrap();
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["usage"]["total_tokens"], 18);
    let r = serde_json::to_value(head.response(Vec::new(), Some(&summary(FinishReason::Stop))))
        .unwrap();
    assert_eq!(r["status"], "completed");
    assert_eq!(r["incomplete_details"], Value::Null);
}
