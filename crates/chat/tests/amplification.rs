//! Templates that turn a small request into a lot of memory or CPU: each is
//! refused with an error naming the limit, within a few MiB of allocation
//! and a bounded time, and an ordinary conversation still renders.
//!
//! Memory is measured, not estimated: this test binary's global allocator
//! counts the bytes live on each thread and the most that were live at
//! once, and a render happens on the thread that asks for it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use lamina_chat::{ChatError, ChatTemplate, Limits, RenderOptions, TemplateConfig};
use serde_json::{json, Value};

/// [`System`], counting the bytes each thread holds.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // `try_with`: the allocator also runs while a thread's locals are torn
    // down, when they can no longer be read.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded to `System` unchanged; the counting
// touches only `Cell`s without destructors.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) };
        track(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What one render may hold beyond its input: "a few MiB".
const MEMORY_CAP: isize = 8 << 20;

/// A refused render ends within this, on a slow shared machine. The
/// render's own wall-clock limit is 50 ms; this leaves room for the
/// machine, not for the template.
const QUICK: Duration = Duration::from_millis(500);

struct Measured {
    result: Result<String, ChatError>,
    took: Duration,
    /// Most bytes live at once during the render, beyond those live before.
    peak: isize,
}

fn measure(source: &str, messages: &Value) -> Measured {
    let template = ChatTemplate::new(source, "<s>", "</s>").expect("the template compiles");
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let start = Instant::now();
    let result = template.render(messages, &RenderOptions::default());
    let took = start.elapsed();
    let peak = PEAK.with(Cell::get) - base;
    Measured { result, took, peak }
}

fn hi() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

/// `source` fails with a limit error, quickly and within [`MEMORY_CAP`].
fn assert_refused(source: &str) {
    let m = measure(source, &hi());
    assert!(
        matches!(
            m.result,
            Err(ChatError::OutOfFuel { .. }
                | ChatError::TimeLimit { .. }
                | ChatError::OutputTooLarge { .. }
                | ChatError::Render { .. })
        ),
        "{source}: {:?}",
        m.result.as_ref().map(String::len)
    );
    assert!(m.took < QUICK, "{source}: took {:?}", m.took);
    assert!(
        m.peak < MEMORY_CAP,
        "{source}: held {} MiB at once",
        m.peak >> 20
    );
}

#[test]
fn tojson_with_a_huge_string_indent_is_refused_without_the_allocation() {
    // The integer indent was capped; a string one was used as given, and a
    // 100,000-space unit on a nested value built a gigabyte.
    assert_refused(
        "{% set pad = ' ' * 100000 %}{% set v = {'a': [[[[1, 2, 3, 4]]]] * 100} %}\
         {{ v | tojson(indent=pad) }}",
    );
    let m = measure("{{ messages | tojson(indent=' ' * 65) }}", &hi());
    match m.result {
        Err(ChatError::Render { message, .. }) => {
            assert!(message.contains("64"), "names the limit: {message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn serialising_is_paid_for_before_it_grows() {
    // A list of 100,000 references to one string costs 3 MiB of slots but
    // serialises to 1 GiB: the output must be refused while it grows.
    assert_refused("{% set s = 'x' * 10000 %}{% set l = [s] * 100000 %}{{ l | tojson }}");
    assert_refused("{% set s = 'x' * 10000 %}{% set l = [s] * 100000 %}{{ l }}");
    assert_refused("{% set s = 'x' * 10000 %}{% set l = [s] * 100000 %}{{ l | string | length }}");
}

#[test]
fn repetition_and_concatenation_stay_within_a_few_mib() {
    assert_refused("{{ ('x' * 50000000) | length }}");
    // Repeating a list is lazy (its length costs nothing); making it a
    // real list is what allocates.
    assert_refused("{{ ([1, 2, 3, 4] * 10000000) | list | length }}");
    assert_refused(
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}\
         {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    );
    assert_refused(
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}\
         {% set ns.l = ns.l + ['x' * 1000] %}{% endfor %}{{ ns.l | length }}",
    );
}

#[test]
fn padding_filters_and_methods_are_capped() {
    assert_refused("{{ 'x' | indent(50000000, true) | length }}");
    assert_refused("{{ ('x\\n' * 1000) | indent(100000) | length }}");
    assert_refused("{{ '{:>50000000}'.format('x') | length }}");
    assert_refused("{{ '{:.50000000f}'.format(1.5) | length }}");
    assert_refused("{{ '{:>{}}'.format('x', 50000000) | length }}");
    assert_refused("{{ '%50000000s' | format('x') | length }}");
    assert_refused("{{ ('ab' * 1000) | replace('a', 'x' * 100000) | length }}");
    assert_refused("{{ (range(10000) | list) | join('x' * 100000) | length }}");
    assert_refused("{{ ','.join(['x' * 10000] * 100000) | length }}");
}

#[test]
fn loops_stop_within_the_time_limit() {
    for source in [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100000) %}\
         {% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}{{ ns.n }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
    ] {
        let m = measure(source, &hi());
        assert!(
            matches!(
                m.result,
                Err(ChatError::OutOfFuel { .. } | ChatError::TimeLimit { .. })
            ),
            "{source}: {:?}",
            m.result
        );
        // 5 M of fuel took ~250 ms here; a render now gets ~50 ms.
        assert!(
            m.took < Duration::from_millis(150),
            "{source}: took {:?}",
            m.took
        );
    }
}

#[test]
fn the_wall_clock_limit_stops_a_render_that_fuel_would_let_run() {
    let config = TemplateConfig {
        limits: Limits {
            fuel: u64::MAX / 1024,
            time: Duration::from_millis(20),
            ..Limits::default()
        },
        ..TemplateConfig::default()
    };
    let template = ChatTemplate::with_config(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "",
        "",
        config,
    )
    .expect("compiles");
    let start = Instant::now();
    let result = template.render(&hi(), &RenderOptions::default());
    let took = start.elapsed();
    assert_eq!(
        result,
        Err(ChatError::TimeLimit {
            limit: Duration::from_millis(20)
        })
    );
    assert!(took < Duration::from_millis(200), "took {took:?}");
    let text = result.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("20 ms"), "names the limit: {text}");
}

/// A long conversation with tools, rendered by a template that touches
/// every message several times: well within the limits, which grow with
/// the request.
#[test]
fn a_long_real_conversation_still_renders() {
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/templates/llama3.jinja"
    ))
    .expect("the built-in Llama 3 template");
    let mut messages = vec![json!({"role": "system", "content": "You are terse. ".repeat(50)})];
    for i in 0..400 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(
            json!({"role": role, "content": format!("message {i}: {}", "words ".repeat(150))}),
        );
    }
    let messages = Value::Array(messages);
    let m = measure(&source, &messages);
    let text = m.result.expect("renders");
    assert!(text.len() > 400 * 900, "{}", text.len());
    assert!(m.took < QUICK, "took {:?}", m.took);
}
