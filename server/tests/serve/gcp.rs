//! Vertex AI's prediction route (`AIP_MODE=PREDICTION`): `/predict` runs
//! each instance through the route its `@requestFormat` names and answers
//! the routes' JSON in order.

use serde_json::json;

use super::{client, Server};

const KEY: &str = "vertex-key";

#[test]
fn predict_dispatches_each_instance_in_order() {
    let server = Server::start(
        &["-np", "2"],
        &[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_HTTP_PORT", "0"),
            ("AIP_HEALTH_ROUTE", "ping"),
            ("LAMINA_API_KEY", KEY),
        ],
    );
    let auth = format!("Bearer {KEY}");
    let headers = [("Authorization", auth.as_str())];
    let body = json!({"instances": [
        {"@requestFormat": "chatCompletions", "max_tokens": 4, "stream": true,
         "messages": [{"role": "user", "content": "Say hello"}]},
        {"@requestFormat": "/tokenize", "content": "Hello world"},
        {"@requestFormat": "tokenize", "content": "Hello world"},
        {"max_tokens": 4},
        {"@requestFormat": "noSuchRoute"},
        "not an object",
    ]});
    let r = client::request(server.port, "POST", "/predict", Some(&body), &headers);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let p = v["predictions"].as_array().unwrap();
    assert_eq!(p.len(), 6, "{v}");
    // Asked to stream, answered whole: the route has no stream to give.
    assert_eq!(p[0]["choices"][0]["message"]["role"], "assistant", "{v}");
    assert!(!p[0]["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    assert!(!p[1]["tokens"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(p[1], p[2], "a path and its camelCase name are one route");
    for bad in &p[3..] {
        assert!(bad["error"]["message"].is_string(), "{bad}");
    }
    assert!(p[4]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("noSuchRoute"));

    // The key guards /predict; the health alias is open, as /health.
    let r = client::post(server.port, "/predict", &body);
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(client::get(server.port, "/ping").status, 200);
    for bad in [json!({}), json!({"instances": 3}), json!([1])] {
        let r = client::request(server.port, "POST", "/predict", Some(&bad), &headers);
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
    let many = json!({"instances": vec![json!({"@requestFormat": "tokenize"}); 129]});
    let r = client::request(server.port, "POST", "/predict", Some(&many), &headers);
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn without_aip_mode_there_is_no_predict_route() {
    let server = Server::start(&[], &[("AIP_HTTP_PORT", "1")]);
    let r = client::post(server.port, "/predict", &json!({"instances": []}));
    assert_eq!(r.status, 404, "{}", r.body);
}
