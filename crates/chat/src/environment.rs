//! The minijinja environment that mirrors Hugging Face's Jinja2 setup.
//!
//! transformers renders with `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` plus the `loopcontrols` extension, a `tojson` filter
//! that is `json.dumps(ensure_ascii=False)`, and the globals
//! `raise_exception` and `strftime_now`. This module builds the same thing
//! in minijinja: the same whitespace rules, Python's spelling of printed
//! values, Python's string/dict/list methods (minijinja-contrib's pycompat),
//! and the sandbox bounds (fuel, recursion) from [`TemplateConfig`], with
//! every hook this crate adds reading the render's clock and paying for
//! what it serialises ([`crate::budget`]).
//!
//! There is no loader, so `include`, `import` and `extends` cannot reach any
//! file; they fail as a missing template.

use chrono::format::StrftimeItems;
use chrono::NaiveDateTime;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

use crate::budget;
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
    /// The time it reads now.
    pub fn now(self) -> NaiveDateTime {
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

    env.set_unknown_method_callback(method);
    env.set_formatter(|out, state, value| {
        budget::check_state(state)?;
        let text = match value.as_str() {
            Some(s) => return out.write_str(s).map_err(write_failure),
            None => serialise_str(state, value)?,
        };
        out.write_str(&text).map_err(write_failure)
    });

    env.add_filter("tojson", tojson);
    env.add_filter(
        "string",
        |state: &State, value: &Value| -> Result<Value, Error> {
            budget::check_state(state)?;
            Ok(Value::from(serialise_str(state, value)?))
        },
    );
    env.add_function("range", budget::range);
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
        move |state: &State, format: &str| -> Result<Value, Error> {
            budget::check_state(state)?;
            strftime(clock.now(), format)
        },
    );
    env
}

/// `py_str`, bounded by and paid for from the render's fuel.
fn serialise_str(state: &State, value: &Value) -> Result<String, Error> {
    let text = py_str(value, budget::serialised_allowance(state))?;
    budget::pay_serialised(state, text.len())?;
    Ok(text)
}

/// Widest field a `str.format` spec may ask for. Python pads to any width;
/// a template that asks for millions of spaces is a way to allocate, and no
/// prompt format pads a field past a line.
const MAX_FORMAT_WIDTH: usize = 1024;

/// Python's `str`, `dict` and `list` methods (minijinja-contrib's pycompat),
/// behind the clock, with the two that can build far more than they are
/// given bounded first: `str.format` (a field's width and precision) and
/// `str.join` (the joined items, paid for as they are appended).
fn method(state: &mut State, value: &Value, name: &str, args: &[Value]) -> Result<Value, Error> {
    budget::check_state(state)?;
    if let Some(s) = value.as_str() {
        match name {
            "format" => check_format_widths(s, args)?,
            "join" => return join(state, s, args),
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, name, args)
}

/// Refuses a `str.format` whose specs ask for a width or precision past
/// [`MAX_FORMAT_WIDTH`]: the numbers written in a spec (`{:>50}`,
/// `{:.3f}`), and, where a spec takes its width from an argument
/// (`{:>{}}`), every integer argument.
fn check_format_widths(format: &str, args: &[Value]) -> Result<(), Error> {
    let too_wide = |n: &str| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("str.format: a field width or precision of {n} is more than the {MAX_FORMAT_WIDTH} allowed"),
        )
    };
    let mut dynamic = false;
    let mut rest = format;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(after) = rest.strip_prefix('{') {
            rest = after; // `{{` is a literal brace
            continue;
        }
        // The field runs to its closing brace, past one level of nesting.
        let mut depth = 1usize;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(rest.len(), |(i, _)| i);
        let field = &rest[..end];
        rest = &rest[end..];
        let Some((_, spec)) = field.split_once(':') else {
            continue;
        };
        dynamic |= spec.contains('{');
        for digits in spec.split(|c: char| !c.is_ascii_digit()) {
            if !digits.is_empty() && !digits.parse::<usize>().is_ok_and(|n| n <= MAX_FORMAT_WIDTH) {
                return Err(too_wide(digits));
            }
        }
    }
    if dynamic {
        let mut numbers: Vec<Value> = Vec::new();
        for arg in args {
            match arg.kind() {
                ValueKind::Map => {
                    for key in arg.try_iter()? {
                        numbers.push(arg.get_item(&key)?);
                    }
                }
                _ => numbers.push(arg.clone()),
            }
        }
        for n in numbers.iter().filter_map(Value::as_i64) {
            if usize::try_from(n).is_ok_and(|n| n > MAX_FORMAT_WIDTH) {
                return Err(too_wide(&n.to_string()));
            }
        }
    }
    Ok(())
}

/// `separator.join(items)`, as pycompat spells it (items through
/// minijinja's `Display`), stopping once it outgrows what the remaining
/// fuel pays for: the separator and the items are repeated, so the result
/// is not bounded by anything that was paid for already.
fn join(state: &State, separator: &str, args: &[Value]) -> Result<Value, Error> {
    let (items,): (&Value,) = minijinja::value::from_args(args)?;
    let allowance = match state.fuel_levels() {
        // minijinja pays one unit of the 64 in a fuel per byte created.
        Some((_, remaining)) => usize::try_from(remaining.saturating_mul(64)).unwrap_or(usize::MAX),
        None => usize::MAX,
    };
    let mut out = String::new();
    for (i, item) in items.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        match item.as_str() {
            Some(s) => out.push_str(s),
            None => {
                use std::fmt::Write as _;
                let _ = write!(out, "{item}");
            }
        }
        if out.len() > allowance {
            return Err(budget::unaffordable("str.join's result"));
        }
    }
    Ok(Value::from(out))
}

fn write_failure(_: std::fmt::Error) -> Error {
    Error::new(ErrorKind::WriteFailure, "could not write output")
}

/// `raise_exception(message)`: fails the render with exactly `message`.
fn raise_exception(state: &State, message: &Value) -> Result<Value, Error> {
    budget::check_state(state)?;
    let message = serialise_str(state, message)?;
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
fn tojson(state: &State, value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    budget::check_state(state)?;
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
                style.item_separator = capped("separators", item.as_str().unwrap_or_default())?;
                style.key_separator = capped("separators", key.as_str().unwrap_or_default())?;
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
    // Bounded while it grows and paid for at the price of serialising; the
    // engine charges the returned string once more as a new value.
    let text = json_dumps(value, &style, budget::serialised_allowance(state))?;
    budget::pay_serialised(state, text.len())?;
    Ok(Value::from(text))
}

/// Longest indent unit or separator `tojson` takes. Each is repeated for
/// every item (the indent once per level too); real templates use two or
/// four spaces, a tab, `", "`.
const MAX_JSON_UNIT: usize = 64;

fn capped(name: &str, unit: &str) -> Result<String, Error> {
    if unit.len() > MAX_JSON_UNIT {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "tojson: {name} of {} bytes; at most {MAX_JSON_UNIT} are allowed",
                unit.len()
            ),
        ));
    }
    Ok(unit.to_owned())
}

/// `indent=N` is N spaces per level; a string is used as the unit itself.
fn indent_unit(value: &Value) -> Result<String, Error> {
    match value.kind() {
        ValueKind::String => capped("indent", value.as_str().unwrap_or_default()),
        ValueKind::Number => {
            let n = value.as_i64().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer",
                )
            })?;
            // Python treats a negative indent as zero; a huge one would be a
            // cheap way to allocate, so it is capped.
            let n = usize::try_from(n.clamp(0, MAX_JSON_UNIT as i64)).unwrap_or(0);
            Ok(" ".repeat(n))
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: indent must be an integer or a string",
        )),
    }
}
