//! What one render may spend, beyond the fuel minijinja counts itself.
//!
//! minijinja charges fuel for every instruction and for the data its own
//! operators and filters create, checking sizes it can know before it
//! allocates. This module covers the rest:
//!
//! - Lamina's own filters serialise values (`tojson`, `string`, printing a
//!   list). Serialising can be far larger than the value (a list holding one
//!   string many times), so their output is bounded by what the remaining
//!   fuel pays for while it grows, and then paid for at minijinja's own
//!   price for serialised bytes ([`SERIALISED_BYTES_PER_FUEL`]).
//! - A wall-clock limit. minijinja cannot be interrupted, so the clock is
//!   read wherever a render calls back into this crate: every write of
//!   output, every printed value, every filter, function and method this
//!   crate defines or wraps, and every step of `range`. Past the limit
//!   those fail, `range` stops yielding, and the render ends with
//!   [`crate::ChatError::TimeLimit`]. Fuel still bounds the work between
//!   two such points.
//!
//! The deadline lives in a thread-local set for the length of a render: a
//! render runs start to end on the thread that asked for it, and the hooks
//! are shared by every render of a template, so they cannot own it.

use std::cell::Cell;
use std::fmt;
use std::time::{Duration, Instant};

use minijinja::value::Value;
use minijinja::{Error, ErrorKind, State};

/// Bytes of serialised output one fuel pays for. minijinja's own `tojson`
/// charges 16 of the 64 units in a fuel per byte, because walking a value
/// costs more than copying it; Lamina's serialisers charge the same.
pub(crate) const SERIALISED_BYTES_PER_FUEL: u64 = 4;

/// Reading the clock costs tens of nanoseconds (docs/perf/server.md,
/// 2026-12-04); `range` reads it once per this many items, so a loop pays
/// for it less than once per microsecond of work.
const RANGE_ITEMS_PER_CHECK: u32 = 64;

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    static EXPIRED: Cell<bool> = const { Cell::new(false) };
}

/// Marks a render's deadline for its length; restores the state before it
/// when dropped.
pub(crate) struct Watch {
    previous: Option<Instant>,
    previous_expired: bool,
}

impl Watch {
    pub(crate) fn start(limit: Duration) -> Watch {
        let deadline = Instant::now().checked_add(limit);
        Watch {
            previous: DEADLINE.with(|d| d.replace(deadline)),
            previous_expired: EXPIRED.with(|e| e.replace(false)),
        }
    }

    /// The deadline passed at one of the points that read the clock.
    pub(crate) fn expired(&self) -> bool {
        EXPIRED.with(Cell::get)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        DEADLINE.with(|d| d.set(self.previous));
        EXPIRED.with(|e| e.set(self.previous_expired));
    }
}

/// Source of the error that a hook returns past the deadline, so it can be
/// told apart from the template's own failures.
#[derive(Debug)]
pub(crate) struct TimeExceeded;

impl fmt::Display for TimeExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the render's time limit passed")
    }
}

impl std::error::Error for TimeExceeded {}

/// False once the current render's deadline has passed (and from then on).
pub(crate) fn in_time() -> bool {
    if EXPIRED.with(Cell::get) {
        return false;
    }
    let late = DEADLINE.with(Cell::get).is_some_and(|d| Instant::now() > d);
    if late {
        EXPIRED.with(|e| e.set(true));
    }
    !late
}

/// [`in_time`] as the error a hook returns.
pub(crate) fn check() -> Result<(), Error> {
    if in_time() {
        Ok(())
    } else {
        Err(
            Error::new(ErrorKind::InvalidOperation, "time limit exceeded")
                .with_source(TimeExceeded),
        )
    }
}

/// [`check`] for hooks that see the render's state: past the deadline the
/// fuel is used up as well, so the engine stops at its next instruction
/// even where the template would carry on after a failed call.
pub(crate) fn check_state(state: &State) -> Result<(), Error> {
    check().inspect_err(|_| {
        let _ = state.consume_fuel(u64::MAX);
    })
}

/// Most bytes of serialised output the remaining fuel pays for.
pub(crate) fn serialised_allowance(state: &State) -> usize {
    match state.fuel_levels() {
        Some((_, remaining)) => {
            usize::try_from(remaining.saturating_mul(SERIALISED_BYTES_PER_FUEL))
                .unwrap_or(usize::MAX)
        }
        None => usize::MAX,
    }
}

/// Pays for `bytes` of serialised output.
pub(crate) fn pay_serialised(state: &State, bytes: usize) -> Result<(), Error> {
    state.consume_fuel(bytes as u64 / SERIALISED_BYTES_PER_FUEL)
}

/// The error for output that the remaining fuel cannot pay for: the same
/// kind as minijinja's own, so it reads as the fuel limit it is.
pub(crate) fn unaffordable(what: &str) -> Error {
    Error::new(
        ErrorKind::OutOfFuel,
        format!("{what} is larger than the remaining fuel pays for"),
    )
}

/// `range`, as minijinja's, with the deadline read as it is iterated: the
/// loops that fuel alone lets run longest are loops over ranges.
pub(crate) fn range(
    state: &State,
    lower: isize,
    upper: Option<isize>,
    step: Option<isize>,
) -> Result<Value, Error> {
    check_state(state)?;
    let items = minijinja::functions::range(lower, upper, step)?;
    Ok(Value::make_object_iterable(items, |items| {
        match items.try_iter() {
            Ok(inner) => Box::new(Watched { inner, count: 0 }),
            Err(_) => Box::new(std::iter::empty()),
        }
    }))
}

/// An iterator that ends once the render's deadline has passed.
struct Watched<I> {
    inner: I,
    count: u32,
}

impl<I: Iterator<Item = Value>> Iterator for Watched<I> {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        self.count = self.count.wrapping_add(1);
        if self.count % RANGE_ITEMS_PER_CHECK == 0 && !in_time() {
            return None;
        }
        self.inner.next()
    }

    // `loop.length` and `| length` come from here, as for minijinja's range.
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}
