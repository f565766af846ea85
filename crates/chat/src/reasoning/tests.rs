#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use serde_json::json;

use super::*;
use crate::{ChatTemplate, RenderOptions};

fn template(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/templates/templates")
        .join(format!("{name}.jinja"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The generation prompt of one user turn, with `enable_thinking` set or
/// left undefined.
fn render(name: &str, enable_thinking: Option<bool>) -> String {
    let t = ChatTemplate::new(&template(name), "<s>", "</s>").unwrap();
    let mut kwargs = serde_json::Map::new();
    if let Some(on) = enable_thinking {
        kwargs.insert("enable_thinking".into(), json!(on));
    }
    t.render(
        &json!([{"role": "user", "content": "What is today?"}]),
        &RenderOptions {
            add_generation_prompt: true,
            kwargs: Some(&kwargs),
            ..RenderOptions::default()
        },
    )
    .unwrap()
}

/// Every way of cutting `answer` into two chunks, and one character at a
/// time, gives what the whole answer gives.
fn same_when_streamed(tags: ThinkTags, opened: bool, answer: &str) -> (Option<String>, String) {
    let whole = split(tags, opened, answer);
    let join = |parts: Vec<Part>| {
        let (mut r, mut c) = (None::<String>, String::new());
        for p in parts {
            match p {
                Part::Reasoning(t) => r.get_or_insert_with(String::new).push_str(&t),
                Part::Content(t) => c.push_str(&t),
            }
        }
        (r, c)
    };
    let cuts: Vec<usize> = (0..=answer.len())
        .filter(|&i| answer.is_char_boundary(i))
        .collect();
    for &cut in &cuts {
        let mut s = ReasoningSplitter::new(tags, opened);
        let mut parts = s.push(&answer[..cut]);
        parts.extend(s.push(&answer[cut..]));
        parts.extend(s.finish());
        assert_eq!(join(parts), whole, "cut at {cut} of {answer:?}");
    }
    let mut s = ReasoningSplitter::new(tags, opened);
    let mut parts = Vec::new();
    for c in answer.chars() {
        let got = s.push(&c.to_string());
        // Nothing given out is empty, and no part repeats its kind.
        assert!(got
            .iter()
            .all(|p| !matches!(p, Part::Reasoning(t) | Part::Content(t) if t.is_empty())));
        parts.extend(got);
    }
    parts.extend(s.finish());
    assert_eq!(join(parts), whole, "char by char: {answer:?}");
    whole
}

#[test]
fn thinking_templates_are_told_by_their_tags() {
    for name in [
        "Qwen-Qwen3-0.6B",
        "Qwen-QwQ-32B",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        "HuggingFaceTB-SmolLM3-3B",
        "GLM-4.6",
        "Qwen3.5-4B",
    ] {
        assert_eq!(ThinkTags::detect(&template(name)), Some(THINK), "{name}");
    }
    assert_eq!(
        ThinkTags::detect(&template("CohereForAI-c4ai-command-r7b-12-2024-tool_use")),
        Some(COMMAND_R)
    );
    for name in [
        "HuggingFaceTB-SmolLM2-135M-Instruct",
        "meta-llama-Llama-3.1-8B-Instruct",
        "Qwen-Qwen2.5-7B-Instruct",
        "mistralai-Mistral-Nemo-Instruct-2407",
    ] {
        assert_eq!(ThinkTags::detect(&template(name)), None, "{name}");
    }
}

#[test]
fn enable_thinking_reaches_the_templates_and_says_where_the_answer_starts() {
    // Qwen3: thinking on leaves the block to the model; off writes an
    // empty, closed one.
    let on = render("Qwen-Qwen3-0.6B", Some(true));
    let off = render("Qwen-Qwen3-0.6B", Some(false));
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on:?}");
    assert!(off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert!(!THINK.opens_in(&on) && !THINK.opens_in(&off));

    // DeepSeek-R1 and QwQ open the block in the prompt; off closes it.
    for name in ["deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "Qwen-QwQ-32B"] {
        let on = render(name, Some(true));
        let off = render(name, Some(false));
        assert!(on.ends_with("<think>\n"), "{name}: {on:?}");
        assert!(off.ends_with("<think>\n</think>"), "{name}: {off:?}");
        assert!(THINK.opens_in(&on), "{name}");
        assert!(!THINK.opens_in(&off), "{name}");
    }

    // Command R7B writes its own pair when thinking is off.
    let off = render("CohereForAI-c4ai-command-r7b-12-2024-tool_use", Some(false));
    assert!(
        off.ends_with("<|START_THINKING|><|END_THINKING|>"),
        "{off:?}"
    );
}

#[test]
fn a_leading_block_is_reasoning_and_the_rest_content() {
    // As Qwen3-0.6B answers with thinking on.
    let answer = "<think>\nOkay, the user asks for the capital of France. That is Paris.\n</think>\n\nThe capital of France is Paris.";
    assert_eq!(
        same_when_streamed(THINK, false, answer),
        (
            Some("Okay, the user asks for the capital of France. That is Paris.".into()),
            "The capital of France is Paris.".into()
        )
    );
    // Qwen3 with thinking off: the empty block is in the prompt, the
    // answer is all content.
    assert_eq!(
        same_when_streamed(THINK, false, "The capital of France is Paris."),
        (None, "The capital of France is Paris.".into())
    );
    // An empty block the model wrote itself.
    assert_eq!(
        same_when_streamed(THINK, false, "<think>\n\n</think>\n\nParis."),
        (None, "Paris.".into())
    );
}

#[test]
fn a_prompt_that_opened_the_block_starts_the_answer_inside_it() {
    // DeepSeek-R1: the prompt ends `<think>\n`, the model goes on thinking.
    let answer = "Alright, 2 + 2 is 4.\n</think>\n\nThe answer is **4**.";
    assert_eq!(
        same_when_streamed(THINK, true, answer),
        (
            Some("Alright, 2 + 2 is 4.".into()),
            "The answer is **4**.".into()
        )
    );
    // Some models write the open tag again.
    assert_eq!(
        same_when_streamed(THINK, true, "<think>\nHmm.\n</think>Yes."),
        (Some("Hmm.".into()), "Yes.".into())
    );
}

#[test]
fn an_answer_cut_off_while_thinking_is_all_reasoning() {
    assert_eq!(
        same_when_streamed(THINK, false, "<think>\nLet me count: one, two, </thi"),
        (Some("Let me count: one, two, </thi".into()), String::new())
    );
    assert_eq!(
        same_when_streamed(THINK, true, "Still thinking \n\n"),
        (Some("Still thinking".into()), String::new())
    );
}

#[test]
fn only_a_block_at_the_start_is_reasoning() {
    // Text first: the tags are content, as written.
    let answer = "Use <think> tags like this: <think>x</think> done";
    assert_eq!(
        same_when_streamed(THINK, false, answer),
        (None, answer.into())
    );
    // After the block, a second one is content.
    assert_eq!(
        same_when_streamed(THINK, false, "<think>a</think>b<think>c</think>"),
        (Some("a".into()), "b<think>c</think>".into())
    );
    // Whitespace before the block is layout.
    assert_eq!(
        same_when_streamed(THINK, false, "\n <think>a</think>\nb"),
        (Some("a".into()), "b".into())
    );
}

#[test]
fn a_tag_cut_across_chunks_is_held_until_it_is_known() {
    let mut s = ReasoningSplitter::new(THINK, false);
    assert_eq!(s.push("<thi"), []);
    assert_eq!(s.push("nk>\nI"), [Part::Reasoning("I".into())]);
    assert_eq!(s.push(" think </th"), [Part::Reasoning(" think".into())]);
    assert_eq!(s.push("ink>\n\nHel"), [Part::Content("Hel".into())]);
    assert_eq!(s.push("lo"), [Part::Content("lo".into())]);
    assert_eq!(s.finish(), []);

    // `<t` that turns out to be text is given out as content once known.
    let mut s = ReasoningSplitter::new(THINK, false);
    assert_eq!(s.push("<t"), []);
    assert_eq!(s.push("able>"), [Part::Content("<table>".into())]);
}

#[test]
fn command_r7b_tags_and_multibyte_text() {
    let answer = "<|START_THINKING|>Das Wetter: 18 °C, 天気.<|END_THINKING|>Es ist warm. ☀";
    assert_eq!(
        same_when_streamed(COMMAND_R, false, answer),
        (
            Some("Das Wetter: 18 °C, 天気.".into()),
            "Es ist warm. ☀".into()
        )
    );
}

#[test]
fn formats_by_name() {
    assert_eq!(
        ReasoningFormat::from_name("deepseek"),
        Some(ReasoningFormat::Deepseek)
    );
    assert_eq!(
        ReasoningFormat::from_name("deepseek-legacy"),
        Some(ReasoningFormat::DeepseekLegacy)
    );
    assert_eq!(
        ReasoningFormat::from_name("none"),
        Some(ReasoningFormat::None)
    );
    assert_eq!(
        ReasoningFormat::from_name("auto"),
        Some(ReasoningFormat::Auto)
    );
    assert_eq!(ReasoningFormat::from_name("nothink"), None);
    assert!(!ReasoningFormat::None.extracts() && ReasoningFormat::Auto.extracts());
}
