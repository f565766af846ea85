//! Idle sleep (`--sleep-idle-seconds`): the model is released when nothing
//! has run for that long, `/props` says so, the routes that need no forward
//! pass answer as before, and the next generation loads it again and
//! answers as the model did before sleeping.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{client, Server};

fn sleeping(server: &Server) -> bool {
    let r = client::get(server.port, "/props");
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["is_sleeping"].as_bool().unwrap()
}

fn wait_for_sleep(server: &Server) {
    let end = Instant::now() + Duration::from_secs(15);
    while !sleeping(server) {
        assert!(Instant::now() < end, "never slept: {}", server.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn greedy(server: &Server) -> Value {
    let r = client::post(
        server.port,
        "/completion",
        &json!({"prompt": "The capital of France is", "n_predict": 6, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["content"].clone()
}

#[test]
fn the_model_sleeps_when_idle_and_wakes_for_a_request() {
    let server = Server::start(&["--sleep-idle-seconds", "1", "-np", "1"], &[]);
    let before = greedy(&server);
    wait_for_sleep(&server);
    assert!(server.log().contains("sleeping"), "{}", server.log());
    assert_eq!(client::get(server.port, "/health").status, 200);
    let models = client::get(server.port, "/v1/models");
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"].as_array().unwrap().len(), 1);
    // Tokenizing needs no forward pass, so it does not wake the model.
    let r = client::post(server.port, "/tokenize", &json!({"content": "Hello"}));
    assert_eq!(r.status, 200);
    assert!(sleeping(&server));

    // The same greedy answer from the reloaded model.
    assert_eq!(greedy(&server), before);
    assert!(server.log().contains("awake"), "{}", server.log());
    // And it sleeps again.
    wait_for_sleep(&server);
}

#[test]
fn without_the_flag_it_never_sleeps() {
    let server = Server::start(&["-np", "1"], &[]);
    greedy(&server);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!sleeping(&server));
}
