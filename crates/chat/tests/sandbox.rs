//! Hostile and broken templates: each ends in a [`ChatError`], quickly, and
//! never in a panic, a hang or a read of the file system.

use std::time::{Duration, Instant};

use lamina_chat::{ChatError, ChatTemplate, Limits, RenderOptions, TemplateConfig};
use serde_json::json;

/// Generous for a slow CI machine; a runaway loop without fuel would take
/// minutes to hours.
const QUICK: Duration = Duration::from_secs(5);

fn render(source: &str) -> Result<String, ChatError> {
    let template = ChatTemplate::new(source, "<s>", "</s>")?;
    template.render(
        &json!([{"role": "user", "content": "hi"}]),
        &RenderOptions::default(),
    )
}

fn timed(source: &str) -> (Result<String, ChatError>, Duration) {
    let start = Instant::now();
    let result = render(source);
    (result, start.elapsed())
}

#[test]
fn nested_huge_loops_run_out_of_fuel_quickly() {
    let (result, took) = timed(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    );
    assert!(
        matches!(result, Err(ChatError::OutOfFuel { .. })),
        "{result:?}"
    );
    assert!(took < QUICK, "took {took:?}");
}

#[test]
fn loop_without_output_runs_out_of_fuel_quickly() {
    let (result, took) = timed(
        "{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100000) %}\
         {% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}{{ ns.n }}",
    );
    assert!(
        matches!(result, Err(ChatError::OutOfFuel { .. })),
        "{result:?}"
    );
    assert!(took < QUICK, "took {took:?}");
}

#[test]
fn range_of_a_billion_is_refused_quickly() {
    let (result, took) = timed("{% for i in range(10**9) %}x{% endfor %}");
    assert!(result.is_err(), "{result:?}");
    assert!(took < QUICK, "took {took:?}");
}

#[test]
fn doubling_a_string_is_stopped_before_memory_runs_out() {
    let (result, took) = timed(
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}\
         {% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
    );
    assert!(
        matches!(result, Err(ChatError::OutOfFuel { .. })),
        "{result:?}"
    );
    assert!(took < QUICK, "took {took:?}");
}

#[test]
fn unbounded_recursion_is_an_error() {
    let (result, took) = timed("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    assert!(
        matches!(result, Err(ChatError::Render { .. })),
        "{result:?}"
    );
    assert!(took < QUICK, "took {took:?}");
}

#[test]
fn output_is_capped() -> Result<(), ChatError> {
    let config = TemplateConfig {
        limits: Limits {
            max_output_bytes: 1000,
            ..Limits::default()
        },
        ..TemplateConfig::default()
    };
    let template =
        ChatTemplate::with_config("{% for i in range(2000) %}xx{% endfor %}", "", "", config)?;
    let result = template.render(&json!([]), &RenderOptions::default());
    assert_eq!(result, Err(ChatError::OutputTooLarge { limit: 1000 }));
    Ok(())
}

#[test]
fn a_namespace_holding_itself_cannot_overflow_the_stack() {
    let result = render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns | tojson }}");
    assert!(result.is_err(), "{result:?}");
}

#[test]
fn templates_cannot_read_files() {
    for source in [
        "{% include '/etc/passwd' %}",
        "{% import 'Cargo.toml' as c %}",
        "{% extends 'src/lib.rs' %}",
    ] {
        let result = render(source);
        assert!(
            matches!(result, Err(ChatError::Render { .. })),
            "{source}: {result:?}"
        );
    }
}

#[test]
fn syntax_error_names_the_line() {
    let err = ChatTemplate::new(
        "{% for m in messages %}\n{{ m.content }}\n{% if %}\n{% endfor %}",
        "",
        "",
    )
    .err();
    match err {
        Some(ChatError::Syntax { line, ref message }) => {
            assert_eq!(line, Some(3), "{message}");
            let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
            assert!(text.contains("line 3"), "{text}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn unclosed_block_is_a_syntax_error() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m }}", "", "").err();
    assert!(matches!(err, Some(ChatError::Syntax { .. })), "{err:?}");
}

#[test]
fn raise_exception_carries_the_message() {
    let result = render("{% if messages[0].role == 'user' %}{{ raise_exception('No users allowed, only ' ~ 'bots') }}{% endif %}");
    assert_eq!(
        result,
        Err(ChatError::Raised {
            message: "No users allowed, only bots".to_owned()
        })
    );
    // Raised inside a macro and a loop, the message is still exactly the text.
    let result = render(
        "{% macro check(m) %}{% if m.role != 'system' %}{{ raise_exception('System first') }}{% endif %}{% endmacro %}\
         {% for m in messages %}{{ check(m) }}{% endfor %}",
    );
    assert_eq!(
        result,
        Err(ChatError::Raised {
            message: "System first".to_owned()
        })
    );
    if let Err(err) = &result {
        assert_eq!(err.to_string(), "System first");
        assert!(err.is_request_error());
    }
}

#[test]
fn undefined_methods_and_type_errors_are_render_errors() {
    for source in [
        "{{ messages.nonexistent_method() }}",
        "{{ messages[0].content + 1 }}",
        "{{ undefined_thing.attr }}",
        "{{ strftime_now('%Q') }}",
    ] {
        let result = render(source);
        assert!(
            matches!(result, Err(ChatError::Render { .. })),
            "{source}: {result:?}"
        );
    }
}

#[test]
fn deeply_nested_input_is_refused() {
    let mut value = json!("leaf");
    for _ in 0..1000 {
        value = json!([value]);
    }
    let result = ChatTemplate::new("{{ messages | tojson }}", "", "")
        .and_then(|t| t.render(&value, &RenderOptions::default()));
    assert!(
        matches!(result, Err(ChatError::InvalidInput(_))),
        "{result:?}"
    );
}
