//! The one error type of the crate.
//!
//! Every failure while compiling or rendering a chat template becomes a
//! [`ChatError`]. The variants are coarse on purpose: the server maps them to
//! HTTP statuses ([`ChatError::is_request_error`]) and shows the message, so
//! each one carries the text a user needs (the line of a syntax error, the
//! message a template raised) and nothing from the host.

/// What went wrong while compiling or rendering a chat template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatError {
    /// The template does not compile: a fault of the model file (or of the
    /// template given on the command line), not of any request.
    #[error("invalid chat template{}: {message}", line_suffix(*line))]
    Syntax {
        /// 1-based line of the template where the parser stopped, if known.
        line: Option<usize>,
        /// The parser's message.
        message: String,
    },

    /// The template called `raise_exception(message)`: it refuses this
    /// conversation (a system turn it does not support, roles that do not
    /// alternate, ...).
    #[error("{message}")]
    Raised {
        /// Exactly the text the template passed to `raise_exception`.
        message: String,
    },

    /// Rendering used up its fuel budget: the template (or the conversation
    /// it was given) needs more work or memory than a prompt may take.
    #[error("chat template exceeded its work limit: ran out of fuel (budget {fuel} units, ~64 bytes or one instruction each)")]
    OutOfFuel {
        /// The budget that was exhausted.
        fuel: u64,
    },

    /// Rendering took longer than its wall-clock limit.
    #[error("chat template exceeded its time limit of {} ms", limit.as_millis())]
    TimeLimit {
        /// The limit.
        limit: std::time::Duration,
    },

    /// The rendered prompt grew past the byte limit.
    #[error("rendered prompt exceeds {limit} bytes")]
    OutputTooLarge {
        /// The limit in bytes.
        limit: usize,
    },

    /// The input cannot be handed to a template (nested too deeply, or a
    /// keyword argument that would replace one of the fixed variables).
    #[error("invalid template input: {0}")]
    InvalidInput(String),

    /// Any other failure while rendering: an undefined method, a type error,
    /// a recursion limit, a bad `strftime_now` format.
    #[error("chat template failed to render{}: {message}", line_suffix(*line))]
    Render {
        /// 1-based line of the template where rendering failed, if known.
        line: Option<usize>,
        /// minijinja's description of the failure.
        message: String,
    },
}

impl ChatError {
    /// True when the failure comes from what a request asked for (HTTP 400),
    /// false when the template itself is broken (HTTP 500).
    ///
    /// A template that compiled has already proven itself on well-formed
    /// input, so a render-time failure is attributed to the conversation.
    pub fn is_request_error(&self) -> bool {
        !matches!(self, ChatError::Syntax { .. })
    }

    /// True when the render passed one of its [`crate::Limits`] (fuel, time,
    /// output size), rather than failing on its own terms.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            ChatError::OutOfFuel { .. }
                | ChatError::TimeLimit { .. }
                | ChatError::OutputTooLarge { .. }
        )
    }
}

fn line_suffix(line: Option<usize>) -> String {
    match line {
        Some(line) => format!(" (line {line})"),
        None => String::new(),
    }
}

/// Marker attached as the source of the minijinja error that
/// `raise_exception` returns, so the message survives minijinja's wrapping
/// and can be told apart from the engine's own errors.
#[derive(Debug)]
pub(crate) struct RaisedByTemplate(pub(crate) String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

/// Finds a marker of type `T` anywhere in an error's source chain.
pub(crate) fn find_source<'e, T: std::error::Error + 'static>(
    err: &'e (dyn std::error::Error + 'static),
) -> Option<&'e T> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}
