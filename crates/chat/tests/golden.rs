//! The golden corpus: real chat templates rendered on a set of conversations,
//! compared byte for byte with what Hugging Face transformers produced.
//!
//! The corpus lives in `tests/templates/` (a copy of the project's shared template corpus); its
//! README gives the exact renderer settings (Jinja2 environment, `tojson`,
//! the clock fixed at 2026-12-02 00:00:00 behind `strftime_now`).
//!
//! Run with: `cargo test -p lamina-chat --test golden -- --nocapture` to see
//! the first differing byte of any mismatch; set `LAMINA_TEMPLATE_CORPUS` to
//! a folder of the same layout to check another set.
//!
//! One known divergence lies outside this corpus: minijinja iterates `none`
//! as an empty sequence where Python raises `TypeError`, so a template that
//! loops over `tools` without checking it (Hermes-3's `tool_use` variant,
//! rendered without tools) gives a prompt here and an error in transformers.
//! The corpus renders that template only with tools, as transformers itself
//! selects it only then.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;

use lamina_chat::{ChatError, ChatTemplate, Clock, NaiveDateTime, RenderOptions, TemplateConfig};
use serde_json::Value;

/// The corpus, or another one of the same layout (a holdout set)
/// named by `LAMINA_TEMPLATE_CORPUS`.
fn corpus_dir() -> PathBuf {
    match std::env::var_os("LAMINA_TEMPLATE_CORPUS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/templates"),
    }
}

fn corpus_clock() -> Result<Clock, String> {
    NaiveDateTime::parse_from_str("2026-12-02 00:00:00", "%Y-%m-%d %H:%M:%S")
        .map(Clock::Fixed)
        .map_err(|e| e.to_string())
}

fn read(path: PathBuf) -> Result<String, String> {
    fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
}

fn field<'a>(entry: &'a Value, name: &str) -> Result<&'a str, String> {
    entry[name]
        .as_str()
        .ok_or_else(|| format!("manifest entry lacks `{name}`: {entry}"))
}

/// Renders one manifest entry; `Ok(None)` when it matched, `Ok(Some(why))`
/// when it did not.
fn check_entry(
    dir: &std::path::Path,
    entry: &Value,
    templates: &mut HashMap<String, Result<ChatTemplate, ChatError>>,
) -> Result<Option<String>, String> {
    let name = field(entry, "template")?;
    let case = field(entry, "case")?;
    let bos = field(entry, "bos_token")?;
    let eos = field(entry, "eos_token")?;
    let key = format!("{name}\u{0}{bos}\u{0}{eos}");
    if !templates.contains_key(&key) {
        let source = read(dir.join("templates").join(format!("{name}.jinja")))?;
        let config = TemplateConfig {
            clock: corpus_clock()?,
            ..TemplateConfig::default()
        };
        templates.insert(
            key.clone(),
            ChatTemplate::with_config(&source, bos, eos, config),
        );
    }
    let template = match templates.get(&key) {
        Some(Ok(t)) => t,
        Some(Err(e)) => return Ok(Some(format!("does not compile: {e}"))),
        None => return Err("template cache lost an entry".to_owned()),
    };

    let case_json: Value =
        serde_json::from_str(&read(dir.join("cases").join(format!("{case}.json")))?)
            .map_err(|e| format!("{case}: {e}"))?;
    let opts = RenderOptions {
        tools: case_json.get("tools"),
        documents: case_json.get("documents"),
        add_generation_prompt: case_json["add_generation_prompt"]
            .as_bool()
            .unwrap_or(false),
        kwargs: case_json.get("extra").and_then(Value::as_object),
    };
    let rendered = template.render(&case_json["messages"], &opts);
    let expected = read(dir.join(field(entry, "expected_file")?))?;

    Ok(match (field(entry, "kind")?, rendered) {
        ("ok", Ok(out)) if out == expected => None,
        ("ok", Ok(out)) => {
            let at = out
                .bytes()
                .zip(expected.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(out.len().min(expected.len()));
            let start = at.saturating_sub(40);
            Some(format!(
                "differs at byte {at} (got {} bytes, want {}):\n  got:  {:?}\n  want: {:?}",
                out.len(),
                expected.len(),
                out.get(start..(at + 60).min(out.len()))
                    .unwrap_or("<not a char boundary>"),
                expected
                    .get(start..(at + 60).min(expected.len()))
                    .unwrap_or("<not a char boundary>"),
            ))
        }
        ("ok", Err(e)) => Some(format!("failed: {e}")),
        (_, Ok(_)) => Some(format!("rendered, but HF fails with {expected:?}")),
        (_, Err(e)) => {
            let raised = entry["raised_by"].as_str() == Some("raise_exception");
            match e {
                ChatError::Raised { message } if raised && message == expected.trim_end() => None,
                _ if !raised => None,
                other => Some(format!("wrong error: {other:?}, want {expected:?}")),
            }
        }
    })
}

#[test]
fn every_manifest_entry_matches_transformers() -> Result<(), String> {
    let dir = corpus_dir();
    let manifest: Vec<Value> = serde_json::from_str(&read(dir.join("manifest.json"))?)
        .map_err(|e| format!("manifest.json: {e}"))?;
    let mut templates = HashMap::new();
    let mut failures = Vec::new();
    for entry in &manifest {
        if let Some(why) = check_entry(&dir, entry, &mut templates)? {
            failures.push(format!(
                "{}__{}: {why}",
                field(entry, "template")?,
                field(entry, "case")?
            ));
        }
    }
    let matched = manifest.len() - failures.len();
    println!("{matched} of {} renderings match", manifest.len());
    for failure in &failures {
        println!("MISMATCH {failure}");
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} renderings differ from transformers:\n{}",
            failures.len(),
            manifest.len(),
            failures.join("\n")
        ))
    }
}
