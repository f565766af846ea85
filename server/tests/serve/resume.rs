//! Resumable streams (`X-Conversation-Id`, `/v1/stream`), as llama-server's
//! web UI uses them: the generation outlives its client, a reader replays
//! it from any offset, Stop cancels and forgets it.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{client, Server};

const ID: &str = "conv-1::org/model:Q4_1";
const QS: &str = "conv_id=conv-1%3A%3Aorg%2Fmodel%3AQ4_1";

fn chat(max_tokens: u32) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Count from 1 to 50."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
    })
}

fn lookup(port: u16, ids: &[&str]) -> Value {
    let r = client::post(
        port,
        "/v1/streams/lookup",
        &json!({"conversation_ids": ids}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[test]
fn a_stream_outlives_its_client_and_replays_from_any_offset_until_stopped() {
    let server = Server::start(&["-ngl", "0"], &[]);
    let port = server.port;

    // The client hangs up after the first token; the generation goes on.
    let s = client::open(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&chat(40)),
        &[("X-Conversation-Id", ID)],
    );
    drop(client::read_until(s, "\"content\""));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let found = lookup(port, &["conv-1"]);
        assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
        assert_eq!(found[0]["conversation_id"], ID);
        if found[0]["is_done"] == true {
            assert!(found[0]["total_bytes"].as_u64().unwrap() > 0);
            break;
        }
        assert!(Instant::now() < deadline, "the generation never ended");
        std::thread::sleep(Duration::from_millis(100));
    }

    // The replay has every event, the chunks of all 40 tokens and [DONE].
    let all = client::get(port, &format!("/v1/stream?{QS}&from=0"));
    assert_eq!(all.status, 200, "{}", all.body);
    assert!(all.head.contains("text/event-stream"), "{}", all.head);
    let data = all.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let finish: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "length");
    // From an offset: the same bytes, less the first ones.
    let tail = client::get(port, &format!("/v1/stream?{QS}&from=10"));
    assert_eq!(tail.body, all.body[10..]);
    // Only ids the caller names are listed.
    assert_eq!(lookup(port, &["conv-2", "conv"]), json!([]));

    // Stop: 204, then the session is gone (and Stop stays 204).
    let stop = client::request(port, "DELETE", &format!("/v1/stream?{QS}"), None, &[]);
    assert_eq!(stop.status, 204);
    let gone = client::get(port, &format!("/v1/stream?{QS}&from=0"));
    assert_eq!(gone.status, 404, "{}", gone.body);
    let again = client::request(port, "DELETE", &format!("/v1/stream?{QS}"), None, &[]);
    assert_eq!(again.status, 204);

    // Bad requests are 400s that say what is wrong.
    let r = client::get(port, "/v1/stream");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("conv_id"), "{}", r.body);
    let long = "x".repeat(300);
    let r = client::request(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&chat(4)),
        &[("X-Conversation-Id", &long)],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let r = client::post(port, "/v1/streams/lookup", &json!({"conversation_ids": 7}));
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn stop_cancels_a_running_generation_and_frees_its_slot() {
    let server = Server::start(&["-ngl", "0", "-np", "1", "-c", "4096"], &[]);
    let port = server.port;
    let mut body = chat(3000);
    body["ignore_eos"] = json!(true);
    let s = client::open(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&body),
        &[("X-Conversation-Id", "long")],
    );
    drop(client::read_until(s, "\"content\""));
    let stop = client::request(port, "DELETE", "/v1/stream?conv_id=long", None, &[]);
    assert_eq!(stop.status, 204);
    // The slot goes idle having decoded far fewer than the 3000 tokens
    // asked for (and ignore_eos keeps the model from ending it).
    let deadline = Instant::now() + Duration::from_secs(60);
    let slot = loop {
        let slots = client::get(port, "/slots").json();
        if slots[0]["is_processing"] == false {
            break slots[0].clone();
        }
        assert!(Instant::now() < deadline, "the slot stayed busy: {slots}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let metrics = client::get(port, "/metrics").body;
    let predicted: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("llamacpp:tokens_predicted_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no tokens_predicted_total: {metrics}"));
    assert!(
        predicted < 3000.0,
        "{predicted} tokens for a stopped stream; {slot}"
    );
    assert_eq!(
        client::get(port, "/v1/stream?conv_id=long&from=0").status,
        404
    );
}
