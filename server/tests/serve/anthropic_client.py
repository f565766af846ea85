"""Lamina's server driven by the official `anthropic` Python client, as
Claude-style clients drive it. Run by `cargo test -p lamina --test serve`
(anthropic.rs) against a `lamina serve` it starts; usage:
anthropic_client.py BASE_URL API_KEY.

Prints one line per check and exits non-zero if any failed.
"""

import sys

import anthropic

import client_checks

BASE, KEY = sys.argv[1], sys.argv[2]
# The server runs with --temp 0: this client has no temperature field.
client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
MSG = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]},
}]


def openai_chat(body):
    return client_checks.openai_chat(BASE, KEY, body)


def same_answer_as_the_openai_route():
    m = client.messages.create(model="local", max_tokens=12, messages=MSG)
    assert m.type == "message" and m.role == "assistant", m
    assert m.content[0].type == "text" and m.content[0].text, m
    assert m.stop_reason in ("end_turn", "max_tokens"), m
    assert m.id.startswith("msg_"), m
    o = openai_chat({"messages": MSG, "temperature": 0, "max_tokens": 12})
    assert m.content[0].text == o["choices"][0]["message"]["content"], (m, o)
    assert m.usage.input_tokens == o["usage"]["prompt_tokens"], (m.usage, o["usage"])
    assert m.usage.output_tokens == o["usage"]["completion_tokens"]


def system_and_turns_render_like_openai():
    turns = [{"role": "user", "content": "Hello"},
             {"role": "assistant", "content": [{"type": "text", "text": "Hi there!"}]},
             {"role": "user", "content": [{"type": "text", "text": "How "},
                                          {"type": "text", "text": "are you?"}]}]
    m = client.messages.create(model="local", max_tokens=8,
                               system="You are terse.", messages=turns)
    o = openai_chat({"temperature": 0, "max_tokens": 8, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"}]})
    assert m.usage.input_tokens == o["usage"]["prompt_tokens"], (m.usage, o["usage"])
    assert m.content[0].text == o["choices"][0]["message"]["content"]
    n = client.messages.count_tokens(model="local", system="You are terse.", messages=turns)
    assert n.input_tokens == m.usage.input_tokens, (n, m.usage)


def streaming():
    whole = client.messages.create(model="local", max_tokens=12, messages=MSG)
    kinds = []
    with client.messages.stream(model="local", max_tokens=12,
                                messages=MSG) as s:
        for ev in s:
            kinds.append(ev.type)
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text, (final, whole)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_start" in kinds and "content_block_stop" in kinds, kinds


def max_tokens_and_stop_sequences():
    m = client.messages.create(model="local", max_tokens=2, messages=MSG)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2, m
    full = client.messages.create(model="local", max_tokens=12, messages=MSG)
    words = full.content[0].text.split()
    word = words[1] if len(words) > 1 else words[0]
    m = client.messages.create(model="local", max_tokens=12, messages=MSG,
                               stop_sequences=[word])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word, m
    assert word not in m.content[0].text


def tools_and_results():
    m = client.messages.create(model="local", max_tokens=16, tools=TOOLS,
                               messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert m.content and m.content[0].type == "text", m
    m = client.messages.create(model="local", max_tokens=16, tools=TOOLS, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}]}])
    assert m.type == "message" and m.content[0].text, m


def tool_use_blocks():
    # The model's own template has no tool format: three turns that
    # answered with llama.cpp's generic JSON call make the greedy model
    # write it again, and it comes back as a tool_use block.
    call = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
    turns = [m for _ in range(3) for m in (
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": call},
    )] + [{"role": "user", "content": "What is the weather in Paris?"}]
    m = client.messages.create(model="local", max_tokens=40, tools=TOOLS, messages=turns)
    assert m.stop_reason == "tool_use", m
    (block,) = m.content
    assert block.type == "tool_use" and block.name == "get_weather", m
    assert block.input == {"city": "Paris"} and block.id.startswith("toolu_"), m
    with client.messages.stream(model="local", max_tokens=40, tools=TOOLS, messages=turns) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert "input_json" in kinds, kinds
    assert final.stop_reason == "tool_use", final
    assert [b.type for b in final.content] == ["tool_use"], final
    assert final.content[0].input == {"city": "Paris"}, final


def errors_in_anthropic_shape():
    try:
        client.messages.create(model="local", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
        raise AssertionError("an image was accepted")
    except anthropic.BadRequestError as e:
        assert e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "invalid_request_error", e.body
        assert "image input is not supported" in e.body["error"]["message"], e.body
    try:
        client.messages.create(model="local", max_tokens=0, messages=MSG)
        raise AssertionError("max_tokens 0 was accepted")
    except anthropic.BadRequestError as e:
        assert "max_tokens" in e.body["error"]["message"], e.body
    bad = anthropic.Anthropic(base_url=BASE, api_key="wrong", max_retries=0)
    try:
        bad.messages.create(model="local", max_tokens=8, messages=MSG)
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError:
        pass


CHECKS = [
    same_answer_as_the_openai_route, system_and_turns_render_like_openai, streaming,
    max_tokens_and_stop_sequences, tools_and_results, tool_use_blocks,
    errors_in_anthropic_shape,
]

client_checks.run("anthropic", CHECKS)
