//! The minijinja environment that mirrors Hugging Face's Jinja2 setup.
//!
//! transformers renders with `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` plus the `loopcontrols` extension, a `tojson` filter
//! that is `json.dumps(ensure_ascii=False)`, and the globals
//! `raise_exception` and `strftime_now`. This module builds the same thing
//! in minijinja: the same whitespace rules, Python's spelling of printed
//! values, Python's string/dict/list methods (minijinja-contrib's pycompat),
//! and the sandbox bounds (fuel, recursion) from [`TemplateConfig`].
//!
//! There is no loader, so `include`, `import` and `extends` cannot reach any
//! file; they fail as a missing template.

use chrono::format::StrftimeItems;
use chrono::NaiveDateTime;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};

use crate::error::RaisedByTemplate;
use crate::python::{json_dumps, py_str, JsonStyle};
use crate::template::TemplateConfig;

/// Where `strftime_now` gets the time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Clock {
    /// The machine's local time, as Python's `datetime.now()`.
    #[default]
    Local,
    /// Always this instant (for reproducible prompts in tests).
    Fixed(NaiveDateTime),
}

impl Clock {
    fn now(self) -> NaiveDateTime {
        match self {
            Clock::Local => chrono::Local::now().naive_local(),
            Clock::Fixed(at) => at,
        }
    }
}

/// Builds the environment; the template itself is added by the caller.
pub(crate) fn build_environment(config: &TemplateConfig) -> Environment<'static> {
    let mut env = Environment::new();
    // Jinja2's whitespace rules as transformers sets them; one newline at the
    // very end of the template is dropped (keep_trailing_newline off).
    let mut syntax = SyntaxConfig::builder();
    syntax
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false);
    // Building only fails for custom delimiters, which are not set here.
    env.set_syntax(syntax.build().unwrap_or_default());
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_fuel(Some(config.limits.fuel));
    env.set_recursion_limit(config.limits.recursion);
    // `debug()` would print the whole context; nothing a prompt needs.
    env.remove_global("debug");

    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        let text = match value.as_str() {
            Some(s) => return out.write_str(s).map_err(write_failure),
            None => py_str(value)?,
        };
        out.write_str(&text).map_err(write_failure)
    });

    env.add_filter("tojson", tojson);
    env.add_filter("string", |value: &Value| -> Result<Value, Error> {
        Ok(Value::from(py_str(value)?))
    });
    // Jinja2's tests ask Python's questions: `None is iterable` is false
    // (minijinja iterates none as empty), and a string or dict `is sequence`.
    env.add_test("iterable", |value: &Value| match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
        ValueKind::Undefined => true,
        _ => value.try_iter().is_ok(),
    });
    env.add_test("sequence", |value: &Value| {
        matches!(
            value.kind(),
            ValueKind::String
                | ValueKind::Bytes
                | ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Iterable
        )
    });
    env.add_function("raise_exception", raise_exception);
    let clock = config.clock;
    env.add_function(
        "strftime_now",
        move |format: &str| -> Result<Value, Error> { strftime(clock.now(), format) },
    );
    env
}

fn write_failure(_: std::fmt::Error) -> Error {
    Error::new(ErrorKind::WriteFailure, "could not write output")
}

/// `raise_exception(message)`: fails the render with exactly `message`.
fn raise_exception(message: &Value) -> Result<Value, Error> {
    let message = py_str(message)?;
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedByTemplate(message)))
}

/// `strftime_now(format)`: the clock's time through `strftime`. A format
/// chrono does not know is an error, never a panic.
fn strftime(now: NaiveDateTime, format: &str) -> Result<Value, Error> {
    let items = StrftimeItems::new(format).parse().map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        )
    })?;
    let mut out = String::new();
    std::fmt::Write::write_fmt(
        &mut out,
        format_args!("{}", now.format_with_items(items.iter())),
    )
    .map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format {format:?} without a time zone"),
        )
    })?;
    Ok(Value::from(out))
}

/// Hugging Face's `tojson(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, arguments by position or keyword.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let arg = |i: usize| -> Result<Option<Value>, Error> {
        let name = NAMES[i];
        let keyword: Option<Value> = kwargs.get(name)?;
        match (args.get(i), keyword) {
            (Some(_), Some(_)) => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson got multiple values for argument '{name}'"),
            )),
            (Some(v), None) => Ok(Some(v.clone())),
            (None, v) => Ok(v),
        }
    };
    let ensure_ascii = arg(0)?.is_some_and(|v| v.is_true());
    let indent = match arg(1)? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(indent_unit(&v)?),
    };
    let mut style = JsonStyle::new(indent);
    style.ensure_ascii = ensure_ascii;
    if let Some(separators) = arg(2)?.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = separators.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                style.item_separator = item.as_str().unwrap_or_default().to_owned();
                style.key_separator = key.as_str().unwrap_or_default().to_owned();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ))
            }
        }
    }
    style.sort_keys = arg(3)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    // The returned string is charged against the fuel by the engine.
    Ok(Value::from(json_dumps(value, &style)?))
}

/// `indent=N` is N spaces per level; a string is used as the unit itself.
fn indent_unit(value: &Value) -> Result<String, Error> {
    match value.kind() {
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => {
            let n = value.as_i64().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer",
                )
            })?;
            // Python treats a negative indent as zero; a huge one would be a
            // cheap way to allocate, so it is capped.
            let n = usize::try_from(n.clamp(0, 64)).unwrap_or(0);
            Ok(" ".repeat(n))
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: indent must be an integer or a string",
        )),
    }
}
