//! The client against a real MCP server process: `tests/fixtures/mcp_server.py`
//! run by `python3`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lamina_mcp::{config, CallError, McpServers};
use serde_json::json;

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mcp_server.py")
        .to_string_lossy()
        .into_owned()
}

/// A config of the fixture under each name, with optional extra fields.
fn servers(entries: &[(&str, serde_json::Value)]) -> McpServers {
    let mut map = serde_json::Map::new();
    for (name, extra) in entries {
        let mut entry = json!({"command": "python3", "args": [fixture()]});
        if let (Some(entry), Some(extra)) = (entry.as_object_mut(), extra.as_object()) {
            entry.extend(extra.clone());
        }
        map.insert((*name).to_owned(), entry);
    }
    let text = json!({ "mcpServers": map }).to_string();
    McpServers::new(config::parse(&text).expect("fixture config parses"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_up_lists_each_servers_tools_under_its_name() {
    let mcp = servers(&[("one", json!({})), ("two", json!({}))]);
    mcp.warm_up().await;
    let names: Vec<String> = mcp.tools().iter().map(|t| t.qualified_name()).collect();
    for expected in ["one_echo", "one_add", "two_echo", "two_notify"] {
        assert!(
            names.contains(&expected.to_owned()),
            "{expected} missing from {names:?}"
        );
    }
    let echo = mcp.find("one_echo").expect("one_echo listed");
    assert_eq!(echo.input_schema["required"][0], "message");
    assert_eq!(echo.description, "Echo the message");
    mcp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_return_text_and_concurrent_calls_each_get_their_own_reply() {
    let mcp = servers(&[("s", json!({}))]);
    mcp.warm_up().await;
    let out = mcp
        .call("s_add", json!({"a": 3, "b": 5}))
        .await
        .expect("add answers");
    assert_eq!(out.text, "8");
    assert!(!out.is_error);
    let calls = (0..10).map(|i| mcp.call("s_echo", json!({ "message": format!("m{i}") })));
    let replies = futures_util::future::join_all(calls).await;
    for (i, reply) in replies.into_iter().enumerate() {
        assert_eq!(reply.expect("echo answers").text, format!("echo: m{i}"));
    }
    // A notification in the same write as the reply is skipped, not returned.
    let out = mcp
        .call("s_notify", json!({}))
        .await
        .expect("notify answers");
    assert_eq!(out.text, "after notification");
    assert!(matches!(
        mcp.call("s_nope", json!({})).await,
        Err(CallError::UnknownTool(_))
    ));
    mcp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rpc_error_keeps_the_process_and_a_crash_respawns_it() {
    let mcp = servers(&[("s", json!({}))]);
    mcp.warm_up().await;
    match mcp.call("s_fail_once", json!({})).await {
        Err(CallError::Rpc { code, message, .. }) => {
            assert_eq!(code, -32000);
            assert_eq!(message, "transient error");
        }
        other => panic!("expected the fixture's error, got {other:?}"),
    }
    // The same process answers the second call, so its state survived.
    assert_eq!(
        mcp.call("s_fail_once", json!({}))
            .await
            .expect("second call")
            .text,
        "ok"
    );
    assert_eq!(
        mcp.call("s_crash", json!({}))
            .await
            .expect("crash answers first")
            .text,
        "crashing"
    );
    // Give the exit a moment to be seen; the next call starts a new process.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        mcp.call("s_echo", json!({"message": "again"}))
            .await
            .expect("respawned")
            .text,
        "echo: again"
    );
    match mcp.call("s_fail_once", json!({})).await {
        Err(CallError::Rpc { .. }) => {}
        other => panic!("a new process fails once again, got {other:?}"),
    }
    mcp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_times_out_and_shutdown_ends_a_call_in_flight() {
    let mcp = servers(&[("slow", json!({"timeout_ms": 300}))]);
    mcp.warm_up().await;
    let started = Instant::now();
    match mcp.call("slow_sleep", json!({"seconds": 5})).await {
        Err(CallError::TimedOut { timeout, .. }) => assert_eq!(timeout, Duration::from_millis(300)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    let mcp = std::sync::Arc::new(servers(&[("slow", json!({}))]));
    mcp.warm_up().await;
    let call = tokio::spawn({
        let mcp = mcp.clone();
        async move { mcp.call("slow_sleep", json!({"seconds": 30})).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    mcp.shutdown().await;
    let result = call.await.expect("the call task ends");
    assert!(
        matches!(result, Err(CallError::Cancelled)),
        "got {result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(
        mcp.call("slow_sleep", json!({})).await,
        Err(CallError::Cancelled)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_command_lists_nothing_and_cools_down() {
    let text = r#"{"mcpServers": {"bad": {"command": "lamina-no-such-command-x"}}}"#;
    let mcp = McpServers::new(config::parse(text).expect("parses"));
    mcp.warm_up().await;
    assert!(mcp.tools().is_empty());
    assert!(matches!(
        mcp.call_tool("bad", "t", json!({})).await,
        Err(CallError::Spawn { .. })
    ));
    assert!(matches!(
        mcp.call_tool("bad", "t", json!({})).await,
        Err(CallError::CoolingDown { .. })
    ));
    assert!(matches!(
        mcp.call_tool("other", "t", json!({})).await,
        Err(CallError::UnknownServer(_))
    ));
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grandchild_holding_the_pipes_neither_hangs_nor_outlives_shutdown() {
    let dir = std::env::temp_dir().join(format!("lamina-mcp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pid_file = dir.join("grandchild.pid");
    let mcp = servers(&[(
        "gc",
        json!({"args": [fixture(), "--grandchild"], "env": {"MCP_GRANDCHILD_PID": pid_file.to_string_lossy()}}),
    )]);
    let started = Instant::now();
    mcp.warm_up().await;
    assert!(mcp.find("gc_echo").is_some());
    assert_eq!(
        mcp.call("gc_echo", json!({"message": "x"}))
            .await
            .expect("echo")
            .text,
        "echo: x"
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("the fixture wrote its grandchild's pid")
        .trim()
        .parse()
        .expect("a pid");
    mcp.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    // The grandchild was in the server's process group, so it is gone too
    // (kill(pid, 0) fails once it has exited and been reaped by init).
    let deadline = Instant::now() + Duration::from_secs(3);
    // SAFETY: signal 0 only checks that the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // SAFETY: as above.
    assert_ne!(
        unsafe { libc::kill(pid, 0) },
        0,
        "grandchild {pid} still runs"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
