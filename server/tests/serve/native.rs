//! llama-server's native `/completion` API and its command line, as
//! llama-server's own clients and tests use them: prompts as text, token
//! ids and a mix, `n_probs`, streaming, and the server-wide defaults a
//! request overrides.

use std::process::Command;

use serde_json::{json, Value};

use super::{client, model, Server};

fn complete(server: &Server, body: Value) -> Value {
    let r = client::post(server.port, "/completion", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

const PROMPT: &str = "The capital of France is";

#[test]
fn completion_takes_text_token_ids_and_a_mix_of_both() {
    let server = Server::start(&["-ngl", "0", "-np", "2"], &[]);
    let text = complete(
        &server,
        json!({"prompt": PROMPT, "n_predict": 4, "temperature": 0, "return_tokens": true}),
    );
    let content = text["content"].as_str().unwrap().to_owned();
    // llama-server's greedy continuation begins " Paris.\n".
    assert!(content.starts_with(" Paris"), "{text}");
    assert_eq!(text["stop"], true);
    assert_eq!(text["stop_type"], "limit");
    assert_eq!(text["truncated"], false);
    assert_eq!(text["tokens_predicted"], 4);
    assert_eq!(text["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(text["timings"]["predicted_n"], 4);
    assert_eq!(text["generation_settings"]["n_predict"], 4);
    assert_eq!(text["has_new_line"], content.contains('\n'));

    let ids = client::post(
        server.port,
        "/tokenize",
        &json!({"content": PROMPT, "add_special": true}),
    )
    .json()["tokens"]
        .clone();
    let n_prompt = ids.as_array().unwrap().len();
    assert_eq!(text["tokens_evaluated"], n_prompt);
    let by_ids = complete(
        &server,
        json!({"prompt": ids, "n_predict": 4, "temperature": 0}),
    );
    assert_eq!(by_ids["content"], content.as_str());
    assert_eq!(
        by_ids["tokens"],
        json!([]),
        "tokens only with return_tokens"
    );

    // Ids, then text tokenized in place (no BOS: it is not first).
    let mut mixed: Vec<Value> = ids.as_array().unwrap()[..n_prompt - 1].to_vec();
    mixed.push(json!(" is"));
    let m = complete(
        &server,
        json!({"prompt": mixed, "n_predict": 4, "temperature": 0}),
    );
    assert_eq!(m["tokens_evaluated"], n_prompt, "{m}");
    assert_eq!(m["content"], content.as_str());

    // An array without numbers is several prompts, answered in order.
    let both = complete(
        &server,
        json!({"prompt": [ids, {"prompt_string": PROMPT}], "n_predict": 4, "temperature": 0}),
    );
    let both = both.as_array().unwrap();
    assert_eq!(both.len(), 2);
    for (i, r) in both.iter().enumerate() {
        assert_eq!(r["index"], i);
        assert_eq!(r["content"], content.as_str());
    }

    let cut = complete(
        &server,
        json!({"prompt": PROMPT, "n_predict": 8, "temperature": 0, "stop": ["."]}),
    );
    assert_eq!(cut["content"], " Paris", "{cut}");
    assert_eq!(
        (&cut["stop_type"], &cut["stopping_word"]),
        (&json!("word"), &json!("."))
    );

    // `/completions` is the same API (llama-server's alias), not OpenAI's.
    let alias = client::post(
        server.port,
        "/completions",
        &json!({"prompt": PROMPT, "n_predict": 4, "temperature": 0}),
    )
    .json();
    assert_eq!(alias["content"], content.as_str());
    assert!(alias.get("choices").is_none(), "{alias}");
}

#[test]
fn n_probs_reports_the_chosen_token_and_its_alternatives() {
    let server = Server::start(&["-ngl", "0"], &[]);
    let v = complete(
        &server,
        json!({"prompt": PROMPT, "n_predict": 3, "temperature": 0, "n_probs": 5, "return_tokens": true}),
    );
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 3, "{v}");
    let mut text = String::new();
    for (p, id) in probs.iter().zip(v["tokens"].as_array().unwrap()) {
        assert_eq!(&p["id"], id);
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 5);
        // Greedy: the chosen token is the most likely one, with its log-prob.
        assert_eq!(top[0]["id"], p["id"]);
        assert_eq!(top[0]["logprob"], p["logprob"]);
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        assert!(lps[0] <= 0.0);
        let bytes: Vec<u8> = p["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            p["token"].as_str().unwrap()
        );
        text.push_str(p["token"].as_str().unwrap());
    }
    assert_eq!(text, v["content"].as_str().unwrap());
}

#[test]
fn streamed_completion_reassembles_to_the_same_text() {
    let server = Server::start(&["-ngl", "0"], &[]);
    let body = json!({"prompt": PROMPT, "n_predict": 6, "temperature": 0});
    let whole = complete(&server, body.clone());

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["n_probs"] = json!(2);
    let r = client::post(server.port, "/completion", &streamed);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.head.contains("content-type: text/event-stream"),
        "{}",
        r.head
    );
    let events: Vec<Value> = r
        .sse_data()
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect();
    let (last, pieces) = events.split_last().unwrap();
    let mut text = String::new();
    let mut n_tokens = 0;
    for e in pieces {
        assert_eq!(e["stop"], false, "{e}");
        let ids = e["tokens"].as_array().unwrap();
        assert!(!ids.is_empty(), "every piece carries its tokens: {e}");
        assert_eq!(
            e["completion_probabilities"].as_array().unwrap().len(),
            ids.len()
        );
        n_tokens += ids.len();
        text.push_str(e["content"].as_str().unwrap());
    }
    assert_eq!(text, whole["content"].as_str().unwrap());
    assert_eq!(n_tokens, 6);
    assert_eq!(last["stop"], true);
    assert_eq!(last["stop_type"], "limit");
    assert_eq!(last["timings"]["predicted_n"], 6);
    assert_eq!(last["generation_settings"]["stream"], true);
    assert!(
        !r.body.contains("[DONE]"),
        "the native stream has no [DONE]"
    );
}

#[test]
fn server_wide_defaults_apply_until_a_request_overrides_them() {
    let server = Server::start(
        &[
            "-ngl", "0", "-n", "5", "--temp", "0", "--seed", "7", "-a", "tiny", "--top-k", "20",
        ],
        &[],
    );
    let v = complete(&server, json!({"prompt": PROMPT}));
    assert_eq!(v["tokens_predicted"], 5, "-n is the default: {v}");
    let g = &v["generation_settings"];
    assert_eq!(
        (g["seed"].as_u64(), g["top_k"].as_u64()),
        (Some(7), Some(20))
    );
    assert_eq!(g["temperature"], 0.0);
    assert_eq!(v["model"], "tiny");
    // -n is a default, not a cap.
    let v = complete(
        &server,
        json!({"prompt": PROMPT, "n_predict": 9, "seed": 3}),
    );
    assert_eq!(v["tokens_predicted"], 9);
    assert_eq!(v["generation_settings"]["seed"], 3);
    let models = client::get(server.port, "/v1/models").json();
    assert_eq!(models["data"][0]["id"], "tiny");
    let chat = server.chat(json!({"messages": [{"role": "user", "content": "Hi"}]}));
    assert_eq!(chat.json()["usage"]["completion_tokens"], 5);
}

#[test]
fn an_unimplemented_llama_server_flag_fails_naming_it() {
    for (flag, name) in [
        (&["--kv-unified"][..], "--kv-unified"),
        (&["-nkvo"][..], "-nkvo"),
        (&["--lora", "adapter.gguf"][..], "--lora"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["serve", "-m", &model(), "--port", "0"])
            .args(flag)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(name) && err.contains("not implemented"),
            "{flag:?}: {err}"
        );
    }
}

/// `--slot-save-path`: a slot saved to a file and restored after another
/// prompt took it reuses the saved prompt (only the last token is
/// processed again) and gives the same answer, on the CPU and with every
/// layer on the GPU; bad names, other servers' files and a server without
/// the flag are refused.
#[test]
fn a_saved_slot_restores_its_prompt_cache() {
    let dir = std::env::temp_dir().join(format!("lamina-slots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let long = "The capital of France is Paris. The capital of Germany is Berlin. \
                The capital of Italy is";
    for ngl in ["0", "all"] {
        let server = Server::start(
            &[
                "-ngl",
                ngl,
                "-np",
                "1",
                "--slot-save-path",
                dir.to_str().unwrap(),
            ],
            &[],
        );
        let ask = |prompt: &str| {
            complete(
                &server,
                json!({"prompt": prompt, "n_predict": 6, "temperature": 0, "cache_prompt": true}),
            )
        };
        let first = ask(long);
        let n_prompt = first["tokens_evaluated"].as_u64().unwrap();
        let saved = client::post(
            server.port,
            "/slots/0?action=save",
            &json!({"filename": "a.bin"}),
        );
        assert_eq!(saved.status, 200, "{}", saved.body);
        let v = saved.json();
        assert!(v["n_saved"].as_u64().unwrap() >= n_prompt, "{v}");
        assert!(v["n_written"].as_u64().unwrap() > 1000, "{v}");
        // Another prompt takes the slot, then the saved one comes back.
        ask("Once upon a time");
        let restored = client::post(
            server.port,
            "/slots/0?action=restore",
            &json!({"filename": "a.bin"}),
        );
        assert_eq!(restored.status, 200, "{}", restored.body);
        assert_eq!(restored.json()["n_restored"], v["n_saved"]);
        let again = ask(long);
        assert_eq!(again["content"], first["content"], "-ngl {ngl}");
        assert_eq!(again["timings"]["prompt_n"], 1, "-ngl {ngl}: {again}");
        for bad in ["../a.bin", ".hidden", "a/b", ""] {
            let r = client::post(
                server.port,
                "/slots/0?action=save",
                &json!({"filename": bad}),
            );
            assert_eq!(r.status, 400, "{bad:?}: {}", r.body);
        }
        std::fs::write(dir.join("junk.bin"), b"not a slot").unwrap();
        let r = client::post(
            server.port,
            "/slots/0?action=restore",
            &json!({"filename": "junk.bin"}),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        let r = client::post(
            server.port,
            "/slots/0?action=restore",
            &json!({"filename": "none.bin"}),
        );
        assert_eq!(r.status, 400, "{}", r.body);
    }
    // A file saved by a server with another placement is refused.
    let server = Server::start(
        &[
            "-ngl",
            "0",
            "-np",
            "1",
            "-ctk",
            "f32",
            "-ctv",
            "f32",
            "--slot-save-path",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    let r = client::post(
        server.port,
        "/slots/0?action=restore",
        &json!({"filename": "a.bin"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("another model, cache type"), "{}", r.body);
    let plain = Server::start(&["-ngl", "0", "-np", "1"], &[]);
    let r = client::post(
        plain.port,
        "/slots/0?action=save",
        &json!({"filename": "a.bin"}),
    );
    assert_eq!(r.status, 501, "{}", r.body);
    std::fs::remove_dir_all(&dir).unwrap();
}
