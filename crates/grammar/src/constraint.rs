//! A compiled constraint and the masks it gives, one token at a time.
//!
//! [`Constraint::compile`] turns a [`Spec`] (a JSON schema, JSON mode, a
//! Lark or GBNF grammar) into an llguidance `Matcher` for one request and
//! computes its first mask at once: compiling is where a grammar's faults
//! show, and the request's handler, not the engine, should pay for that
//! and answer 400. After that the matcher only advances: [`Constraint::commit`]
//! takes each sampled token, [`Constraint::mask`] says which tokens may
//! come next. A mask depends only on the tokens committed so far, so
//! [`crate::Ahead`] computes it on a thread of its own while the model computes
//! the logits it will be applied to (see `ahead.rs`).

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use serde_json::{json, Value};

use crate::error::GrammarError;
use crate::gbnf;
use crate::vocab::Vocab;

/// Longest run of JSON whitespace allowed between tokens of a JSON value
/// (the cap Lamina's JSON mode always had, as llama.cpp's JSON grammars
/// cap it): a constrained small model otherwise tends to emit newlines
/// until `max_tokens`.
pub const MAX_JSON_WS: usize = 20;

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid against this schema (draft 2020-12 as llguidance
    /// supports it; `true` is any JSON value).
    JsonSchema(Value),
    /// llguidance's Lark-like grammar syntax.
    Lark(String),
    /// llama.cpp's GBNF, converted to Lark (`gbnf.rs`).
    Gbnf(String),
}

impl Spec {
    /// The grammar llguidance compiles for this spec.
    fn grammar(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            Spec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_ws_cap(json!({"type": "object"})))
            }
            Spec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema_value(schema)?),
            Spec::Lark(src) => {
                check_nesting(src)?;
                TopLevelGrammar::from_lark(src.clone())
            }
            Spec::Gbnf(src) => TopLevelGrammar::from_lark(gbnf::to_lark(src)?),
        })
    }
}

/// A schema as llguidance takes it: an object (`true` is `{}`; `false`
/// admits nothing and is refused here), with the whitespace cap added
/// unless the schema sets llguidance's own options.
fn schema_value(schema: &Value) -> Result<Value, GrammarError> {
    match schema {
        Value::Bool(true) => Ok(with_ws_cap(json!({}))),
        Value::Bool(false) => Err(GrammarError::Schema(
            "the schema is false: no value satisfies it".into(),
        )),
        Value::Object(_) => Ok(with_ws_cap(schema.clone())),
        other => Err(GrammarError::Schema(format!(
            "a schema must be an object or a boolean, not {}",
            kind(other)
        ))),
    }
}

pub(crate) fn with_ws_cap(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_pattern": format!(r"[\x20\x0A\x0D\x09]{{1,{MAX_JSON_WS}}}")}),
        );
    }
    schema
}

/// Deepest bracket nesting a Lark grammar may have. llguidance's Lark
/// parser recurses on groups, and a stack overflow aborts the process
/// (no panic to catch), so a request's grammar is measured first.
const MAX_LARK_NESTING: usize = 128;

/// Refuses grammars whose brackets nest past [`MAX_LARK_NESTING`]. Counted
/// over the whole text, strings and regexes included: that can only
/// over-count, and an honest grammar is nowhere near the limit.
fn check_nesting(src: &str) -> Result<(), GrammarError> {
    let mut depth = 0usize;
    for b in src.bytes() {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_LARK_NESTING {
                    return Err(GrammarError::Compile(format!(
                        "the grammar nests brackets deeper than {MAX_LARK_NESTING}"
                    )));
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The tokens allowed at one step.
#[derive(Clone)]
pub struct Mask {
    allowed: SimpleVob,
    /// Only end-of-generation tokens are allowed: the text is complete.
    finished: bool,
}

impl std::fmt::Debug for Mask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mask")
            .field("allowed", &self.allowed.num_set())
            .field("finished", &self.finished)
            .finish()
    }
}

impl Mask {
    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.allowed.len() && self.allowed.is_allowed(id)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.allowed.num_set()
    }

    /// Sets every banned token's logit to -inf; returns how many stay.
    /// Logits past the vocabulary the mask covers are banned too.
    pub fn apply(&self, logits: &mut [f32]) -> usize {
        let mut kept = 0;
        for (id, logit) in logits.iter_mut().enumerate() {
            if id < self.allowed.len() && self.allowed.get(id) {
                kept += 1;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        kept
    }

    /// The grammar is complete: nothing but end-of-generation may follow.
    pub fn finished(&self) -> bool {
        self.finished
    }
}

/// One request's constraint: where its output stands in the grammar.
pub struct Constraint {
    /// Boxed: llguidance's parser state is over a kilobyte inline, and a
    /// constraint travels inside every request's parameters.
    matcher: Box<Matcher>,
    /// The mask for the next token, when already computed.
    next: Option<Mask>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .field("next", &self.next)
            .finish()
    }
}

/// A copy decodes independently from the same point (llama-server's
/// several prompts in one request each get one).
impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint {
            matcher: Box::new(self.matcher.deep_clone()),
            next: self.next.clone(),
        }
    }
}

impl Constraint {
    /// Compiles `spec` for `vocab` and computes the first mask, so a grammar
    /// that cannot even start is refused here.
    pub fn compile(vocab: &Vocab, spec: &Spec) -> Result<Constraint, GrammarError> {
        let grammar = spec.grammar()?;
        // llguidance catches panics in its matcher, not in its compiler:
        // a grammar from a request must never take a thread down.
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            vocab.factory.create_parser(grammar)
        }))
        .map_err(|_| GrammarError::Compile("the grammar compiler failed on this input".into()))?
        .map_err(|e| GrammarError::Compile(e.to_string()))?;
        let mut matcher = Box::new(Matcher::new(Ok(parser)));
        for w in matcher.grammar_warnings() {
            tracing::debug!("grammar warning: {w}");
        }
        let mut c = Constraint {
            matcher,
            next: None,
        };
        let first = c.compute().map_err(|e| match e {
            GrammarError::Decode(m) => GrammarError::Compile(m),
            e => e,
        })?;
        c.next = Some(first);
        Ok(c)
    }

    /// Which tokens may come next.
    pub fn mask(&mut self) -> Result<Mask, GrammarError> {
        match self.next.take() {
            Some(m) => Ok(m),
            None => self.compute(),
        }
    }

    fn compute(&mut self) -> Result<Mask, GrammarError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Decode(e.to_string()))?;
        if allowed.is_zero() {
            return Err(GrammarError::Decode(
                "no token can continue the text".into(),
            ));
        }
        // Complete when every allowed token ends generation.
        let eos = self
            .matcher
            .tok_env()
            .map(|env| env.tok_trie().eos_tokens().to_vec())
            .map_err(|e| GrammarError::Decode(e.to_string()))?;
        let mut finished = true;
        allowed.iter_set_entries(|id| finished &= eos.contains(&(id as u32)));
        Ok(Mask { allowed, finished })
    }

    /// Advances past a sampled token (one the last mask allowed).
    pub fn commit(&mut self, id: u32) -> Result<(), GrammarError> {
        self.next = None;
        self.matcher
            .consume_token(id)
            .map_err(|e| GrammarError::Decode(e.to_string()))
    }

    /// Nothing but end-of-generation may follow what was committed.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
