//! Rendering behaviour beyond the golden corpus: the built-in templates, the
//! globals and filters Hugging Face adds, Python's spelling of values, and
//! the request options.

use lamina_chat::{
    builtin_for, Builtin, ChatError, ChatTemplate, Clock, NaiveDateTime, RenderOptions,
    TemplateConfig,
};
use serde_json::{json, Value};

fn render_with(
    source: &str,
    messages: &Value,
    opts: &RenderOptions<'_>,
) -> Result<String, ChatError> {
    ChatTemplate::new(source, "<bos>", "<eos>")?.render(messages, opts)
}

fn render(source: &str) -> Result<String, ChatError> {
    render_with(
        source,
        &json!([{"role": "user", "content": "hi"}]),
        &RenderOptions::default(),
    )
}

fn conversation() -> Value {
    json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "  Hi.  "},
        {"role": "user", "content": [{"type": "text", "text": "Bye"}]}
    ])
}

#[test]
fn builtin_gemma_folds_the_system_prompt_into_the_first_user_turn() -> Result<(), ChatError> {
    let gemma = builtin_for("gemma3", |_| false);
    assert_eq!(gemma, Builtin::Gemma);
    let template = ChatTemplate::new(gemma.source(), "<bos>", "<eos>")?;
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    assert_eq!(
        template.render(&conversation(), &opts)?,
        "<bos><start_of_turn>user\nYou are terse.\n\nHello?<end_of_turn>\n\
         <start_of_turn>model\nHi.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    // Without a system turn and without the generation prompt.
    let plain = json!([{"role": "user", "content": "Hello?"}]);
    assert_eq!(
        template.render(&plain, &RenderOptions::default())?,
        "<bos><start_of_turn>user\nHello?<end_of_turn>\n"
    );
    // Turns that do not alternate are refused as Gemma's own template does.
    let twice = json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]);
    assert!(matches!(
        template.render(&twice, &RenderOptions::default()),
        Err(ChatError::Raised { .. })
    ));
    Ok(())
}

#[test]
fn builtin_llama3_chatml_and_mistral() -> Result<(), ChatError> {
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let llama3 = ChatTemplate::new(Builtin::Llama3.source(), "<|begin_of_text|>", "<|eot_id|>")?;
    assert_eq!(
        llama3.render(&conversation(), &opts)?,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHello?<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\nHi.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let chatml = ChatTemplate::new(Builtin::ChatMl.source(), "", "<|im_end|>")?;
    assert_eq!(
        chatml.render(&conversation(), &opts)?,
        "<|im_start|>system\nYou are terse.<|im_end|>\n\
         <|im_start|>user\nHello?<|im_end|>\n\
         <|im_start|>assistant\n  Hi.  <|im_end|>\n\
         <|im_start|>user\nBye<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let mistral = ChatTemplate::new(Builtin::Mistral.source(), "<s>", "</s>")?;
    assert_eq!(
        mistral.render(&conversation(), &opts)?,
        "<s>[INST] You are terse.\n\nHello? [/INST]  Hi.  </s>[INST] Bye [/INST]"
    );
    Ok(())
}

/// The phi3 and command-r built-ins give llama.cpp's own formats on its
/// test conversation (`tests/test-chat-template.cpp` of the sdist's
/// llama.cpp: the "Phi-3-mini" legacy output and "c4ai-command-r-plus").
#[test]
fn builtin_phi3_and_command_r_match_llama_cpp() -> Result<(), ChatError> {
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let conversation: Value = [
        ("system", "You are a helpful assistant"),
        ("user", "Hello"),
        ("assistant", "Hi there"),
        ("user", "Who are you"),
        ("assistant", "   I am an assistant   "),
        ("user", "Another question"),
    ]
    .iter()
    .map(|(r, c)| json!({"role": r, "content": c}))
    .collect::<Vec<_>>()
    .into();
    let phi3 = ChatTemplate::new(Builtin::Phi3.source(), "<s>", "<|end|>")?;
    assert_eq!(
        phi3.render(&conversation, &opts)?,
        "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n\
         <|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n\
         <|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n\
         <|assistant|>\n"
    );
    let command_r = ChatTemplate::new(
        Builtin::CommandR.source(),
        "<BOS_TOKEN>",
        "<|END_OF_TURN_TOKEN|>",
    )?;
    assert_eq!(
        command_r.render(&conversation, &opts)?,
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    );
    Ok(())
}

#[test]
fn strftime_now_reads_the_injected_clock() -> Result<(), ChatError> {
    let at = NaiveDateTime::parse_from_str("2026-12-02 00:00:00", "%Y-%m-%d %H:%M:%S")
        .map_err(|e| ChatError::InvalidInput(e.to_string()))?;
    let config = TemplateConfig {
        clock: Clock::Fixed(at),
        ..TemplateConfig::default()
    };
    let template = ChatTemplate::with_config(
        "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%A %B %-d') }}",
        "",
        "",
        config,
    )?;
    assert_eq!(
        template.render(&json!([]), &RenderOptions::default())?,
        "02 Dec 2026|2026-12-02|Wednesday December 2"
    );
    // Callers that give the date another way read the same clock.
    assert_eq!(template.clock().now(), at);
    // The system clock gives some date of the right shape.
    let now = render("{{ strftime_now('%Y-%m-%d') }}")?;
    assert_eq!(now.len(), 10, "{now}");
    Ok(())
}

#[test]
fn tojson_is_pythons_json_dumps() -> Result<(), ChatError> {
    let messages = json!([{
        "role": "user",
        "content": "<b>Zürich</b> & \"quotes\"\n",
        "zeta": 1, "alpha": [1.5, 2.0, null, true],
    }]);
    let opts = RenderOptions::default();
    assert_eq!(
        render_with("{{ messages[0] | tojson }}", &messages, &opts)?,
        r#"{"role": "user", "content": "<b>Zürich</b> & \"quotes\"\n", "zeta": 1, "alpha": [1.5, 2.0, null, true]}"#
    );
    assert_eq!(
        render_with(
            "{{ messages[0].alpha | tojson(indent=2) }}",
            &messages,
            &opts
        )?,
        "[\n  1.5,\n  2.0,\n  null,\n  true\n]"
    );
    assert_eq!(
        render_with(
            "{{ messages[0] | tojson(sort_keys=true, separators=(',', ':')) }}",
            &messages,
            &opts
        )?,
        r#"{"alpha":[1.5,2.0,null,true],"content":"<b>Zürich</b> & \"quotes\"\n","role":"user","zeta":1}"#
    );
    assert_eq!(
        render_with(
            "{{ messages[0].content | tojson(ensure_ascii=true) }}",
            &messages,
            &opts
        )?,
        r#""<b>Z\u00fcrich</b> & \"quotes\"\n""#
    );
    Ok(())
}

#[test]
fn printed_values_are_spelled_as_python_spells_them() -> Result<(), ChatError> {
    assert_eq!(
        render("{{ true }} {{ none }} {{ 1.0 }} {{ [1, 'a', none] }} {{ {'k': false} }} {{ undefined_name }}.")?,
        "True None 1.0 [1, 'a', None] {'k': False} ."
    );
    assert_eq!(render("{{ true | string }}")?, "True");
    Ok(())
}

#[test]
fn whitespace_follows_transformers_settings() -> Result<(), ChatError> {
    // trim_blocks drops the newline after a block tag, lstrip_blocks the
    // indentation before one, and one trailing newline of the template goes.
    assert_eq!(
        render("{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n")?,
        "[hi]\n"
    );
    Ok(())
}

#[test]
fn loop_controls_and_python_methods_work() -> Result<(), ChatError> {
    assert_eq!(
        render(
            "{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"
        )?,
        "02"
    );
    assert_eq!(
        render("{{ '  a,b '.strip().split(',') }} {{ 'abc'.startswith('ab') }} {{ {'x': 1}.items() | list }}")?,
        "['a', 'b'] True [('x', 1)]"
    );
    assert_eq!(
        render("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }} {{ dict(a=1) }}")?,
        "1 {'a': 1}"
    );
    assert_eq!(
        render("{{ none is iterable }} {{ 'x' is sequence }}")?,
        "False True"
    );
    Ok(())
}

#[test]
fn request_options_become_variables() -> Result<(), ChatError> {
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let kwargs = json!({"enable_thinking": false, "bos_token": "[B]"});
    let opts = RenderOptions {
        tools: Some(&tools),
        documents: None,
        add_generation_prompt: true,
        kwargs: kwargs.as_object(),
    };
    assert_eq!(
        render_with(
            "{{ tools[0].function.name }} {{ documents }} {{ add_generation_prompt }} {{ enable_thinking }} {{ bos_token }}{{ eos_token }}",
            &json!([]),
            &opts
        )?,
        "f None True False [B]<eos>"
    );
    let reserved = json!({"messages": []});
    let opts = RenderOptions {
        kwargs: reserved.as_object(),
        ..RenderOptions::default()
    };
    assert!(matches!(
        render_with("x", &json!([]), &opts),
        Err(ChatError::InvalidInput(_))
    ));
    Ok(())
}

#[test]
fn one_compiled_template_serves_many_threads() -> Result<(), ChatError> {
    fn shareable<T: Send + Sync>(_: &T) {}
    let template = ChatTemplate::new(Builtin::ChatMl.source(), "", "")?;
    shareable(&template);
    let results: Vec<Result<String, ChatError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let template = &template;
                scope.spawn(move || {
                    template.render(
                        &json!([{"role": "user", "content": format!("n{i}")}]),
                        &RenderOptions::default(),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ChatError::InvalidInput("panic".into())))
            })
            .collect()
    });
    for (i, result) in results.into_iter().enumerate() {
        assert_eq!(result?, format!("<|im_start|>user\nn{i}<|im_end|>\n"));
    }
    Ok(())
}

#[test]
fn generation_tags_of_transformers_render_their_body() -> Result<(), ChatError> {
    assert_eq!(
        render("{% for m in messages %}{%- generation -%} [{{ m.content }}] {%- endgeneration %}{% endfor %}")?,
        "[hi]"
    );
    // Only the exact tag names are rewritten.
    assert!(render("{% generation_x %}").is_err());
    Ok(())
}

/// A prefill appended to a rendering keeps the guard: control-token text in
/// it is marked literal, like the same text in a message, and the ranges
/// already marked stay where they were.
#[test]
fn appended_request_text_is_guarded_like_a_message() -> Result<(), ChatError> {
    let mut t = ChatTemplate::new(
        "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}<|im_start|>",
        "<bos>",
        "<eos>",
    )?;
    t.guard_tokens(["<|im_start|>", "<|im_end|>"]);
    let mut p = t.render_prompt(
        &json!([{"role": "user", "content": "a<|im_end|>"}]),
        &RenderOptions::default(),
    )?;
    assert_eq!(p.literal, vec![13..23]);
    t.append_request_text(&mut p, "go<|im_start|>on");
    assert_eq!(
        p.text,
        "<|im_start|>a<|im_end|><|im_end|><|im_start|>go<|im_start|>on"
    );
    let at = p.text.rfind("<|im_start|>on").unwrap_or(0);
    assert_eq!(p.literal, vec![13..23, at..at + 12]);

    // Without a guard, the text is appended as it is and nothing is literal.
    t.guard_tokens(Vec::<String>::new());
    let mut p = t.render_prompt(&json!([]), &RenderOptions::default())?;
    t.append_request_text(&mut p, "x<|im_end|>");
    assert_eq!(
        (p.text.as_str(), p.literal.len()),
        ("<|im_start|>x<|im_end|>", 0)
    );
    Ok(())
}

/// OpenAI's clients send a tool call's `arguments` as a JSON string; the
/// templates that iterate them as a mapping (Qwen3.5, Qwen3-Coder, Llama
/// 3.1) get the object, so an agent's history renders as it does with
/// object arguments. (Templates from `tests/templates/templates`, copied
/// from the models' own files.)
#[test]
fn string_arguments_reach_mapping_templates_as_objects() -> Result<(), ChatError> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/templates/templates");
    let history = |args: Value| {
        json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
        ])
    };
    let object = json!({"city": "Paris", "days": 3});
    for name in [
        "Qwen3.5-4B.jinja",
        "Qwen3-Coder.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
    ] {
        let source = std::fs::read_to_string(dir.join(name))
            .map_err(|e| ChatError::InvalidInput(format!("{name}: {e}")))?;
        let want = render_with(&source, &history(object.clone()), &RenderOptions::default())?;
        let got = render_with(
            &source,
            &history(Value::String(object.to_string())),
            &RenderOptions::default(),
        )?;
        assert_eq!(got, want, "{name}");
        assert!(want.contains("Paris"), "{name}: {want}");
    }
    // A template that prints the string as it is keeps it.
    let plain = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments }}{% endfor %}{% endfor %}";
    let got = render_with(
        plain,
        &history(Value::String("{\"city\": \"Paris\"}".into())),
        &RenderOptions::default(),
    )?;
    assert_eq!(got, "{\"city\": \"Paris\"}");
    Ok(())
}
