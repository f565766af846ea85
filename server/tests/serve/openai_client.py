"""Lamina's server driven by the official `openai` Python client, as users
drive it. Run by `cargo test -p lamina --test serve` (openai.rs) against a
`lamina serve` it starts; usage: openai_client.py BASE_URL API_KEY.

Prints one line per check and exits non-zero if any failed.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request

from typing import Literal

import openai
import pydantic

import client_checks

BASE, KEY = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
MSG = [{"role": "user", "content": "What is the capital of France?"}]


def raw(path, body, headers=None, method="POST"):
    """(status, parsed JSON or text) of a request sent without the SDK."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    h.update(headers or {})
    req = urllib.request.Request(BASE + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def non_streaming():
    r = client.chat.completions.create(model="local", messages=MSG, temperature=0, max_tokens=8)
    assert r.object == "chat.completion", r
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content, r
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    return r.choices[0].message.content


def streaming_with_usage():
    whole = client.chat.completions.create(
        model="local", messages=MSG, temperature=0, max_tokens=8
    ).choices[0].message.content
    parts, usage, finish = [], None, None
    stream = client.chat.completions.create(
        model="local", messages=MSG, temperature=0, max_tokens=8,
        stream=True, stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(parts) == whole, (parts, whole)
    assert finish in ("stop", "length")
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def max_tokens_and_stop():
    r = client.chat.completions.create(model="local", messages=MSG, temperature=0, max_tokens=2)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2, r
    full = client.chat.completions.create(model="local", messages=MSG, temperature=0, max_tokens=10)
    text = full.choices[0].message.content
    word = text.split()[1] if len(text.split()) > 1 else text[-1]
    r = client.chat.completions.create(model="local", messages=MSG, temperature=0, max_tokens=10, stop=[word])
    assert r.choices[0].finish_reason == "stop", r
    assert word not in r.choices[0].message.content
    assert text.startswith(r.choices[0].message.content)


def seed_reproducibility():
    def once():
        return client.chat.completions.create(
            model="local", messages=MSG, temperature=1.0, seed=1234, max_tokens=12
        ).choices[0].message.content
    assert once() == once()


def logprobs():
    r = client.chat.completions.create(
        model="local", messages=MSG, temperature=0, max_tokens=3, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def completions_and_models():
    r = client.completions.create(model="local", prompt="The capital of France is", max_tokens=3, temperature=0)
    assert r.choices[0].text.startswith(" Paris"), r
    models = client.models.list()
    assert models.data[0].id.endswith(".gguf")


def tokenize_round_trip():
    s, v = raw("/tokenize", {"content": "Hello, world!"})
    assert s == 200, v
    s, v = raw("/detokenize", {"tokens": v["tokens"]})
    assert s == 200 and v["content"] == "Hello, world!", v


def bad_requests():
    s, v = raw("/v1/chat/completions", b'{"messages": [')
    assert s == 400 and v["error"]["type"] == "invalid_request_error", (s, v)
    try:
        client.chat.completions.create(model="local", messages=MSG, max_tokens="many")
        raise AssertionError("a string max_tokens was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "max_tokens", e.body
    try:
        client.chat.completions.create(model="local", messages=MSG, n=17)
        raise AssertionError("n=17 was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "n" and "between 1 and 16" in e.message, e.body
    # Unknown fields are ignored, as OpenAI ignores them.
    r = client.chat.completions.create(
        model="local", messages=MSG, max_tokens=1, extra_body={"not_a_field": {"x": 1}}
    )
    assert r.choices[0].message is not None
    s, v = raw("/v1/chat/completions", {"messages": MSG, "pad": "x" * (2 << 20)})
    assert s == 413, (s, v)
    bad = openai.OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass


def eight_concurrent_streams():
    results, errors = [None] * 8, []

    def run(i):
        try:
            out = []
            for chunk in client.chat.completions.create(
                model="local", messages=[{"role": "user", "content": f"Count to {i + 2}."}],
                temperature=0, max_tokens=6, stream=True,
            ):
                out.extend(c.delta.content or "" for c in chunk.choices)
            results[i] = "".join(out)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(r for r in results), results


def disconnect_mid_stream():
    stream = client.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=300, stream=True,
    )
    for chunk in stream:
        if any(c.delta.content for c in chunk.choices):
            break
    stream.close()
    deadline = time.time() + 10
    while True:
        s, text = raw("/metrics", b"", method="GET")
        active = [l for l in text.splitlines() if l.startswith("lamina_active_sequences ")]
        if active and float(active[0].split()[1]) == 0:
            break
        assert time.time() < deadline, text
        time.sleep(0.05)
    assert non_streaming()


# SmolLM2's own template has no tool format (llama.cpp's generic JSON one
# applies). Three turns that answered with a generic call make the greedy
# model write the same call again.
CALL = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
FEW_SHOT = [m for _ in range(3) for m in (
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": CALL},
)] + [{"role": "user", "content": "What is the weather in Paris?"}]


def tool_calls():
    r = client.chat.completions.create(
        model="local", messages=FEW_SHOT, tools=TOOLS, temperature=0, max_tokens=40)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", r
    assert c.message.content is None, r
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id, call
    assert call.function.name == "get_weather", call
    assert json.loads(call.function.arguments) == {"city": "Paris"}, call

    parts, calls, finish = [], [], None
    for chunk in client.chat.completions.create(
        model="local", messages=FEW_SHOT, tools=TOOLS, temperature=0, max_tokens=40, stream=True
    ):
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            calls.extend(ch.delta.tool_calls or [])
            finish = ch.finish_reason or finish
    assert "".join(parts) == "" and finish == "tool_calls", (parts, finish)
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id, calls
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}, calls

    r = client.chat.completions.create(
        model="local", messages=FEW_SHOT, tools=TOOLS, tool_choice="none",
        temperature=0, max_tokens=40)
    assert r.choices[0].message.content == CALL and not r.choices[0].message.tool_calls, r


def several_choices():
    """n > 1: every choice its own sampler stream, reproducible with a seed,
    the first what n = 1 gives; streamed, the choices interleave by index."""
    def ask(n, **kw):
        return client.chat.completions.create(
            model="local", messages=MSG, temperature=1.0, seed=99, max_tokens=10, n=n, **kw)
    r = ask(3)
    assert [c.index for c in r.choices] == [0, 1, 2], r
    texts = [c.message.content for c in r.choices]
    assert texts == [c.message.content for c in ask(3).choices], texts
    assert texts[0] == ask(1).choices[0].message.content, texts
    assert len(set(texts)) > 1, texts
    one = ask(1).usage
    assert r.usage.prompt_tokens == one.prompt_tokens, (r.usage, one)
    assert r.usage.completion_tokens > one.completion_tokens, (r.usage, one)

    parts, finishes = {}, {}
    for chunk in ask(3, stream=True):
        for ch in chunk.choices:
            parts.setdefault(ch.index, []).append(ch.delta.content or "")
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert sorted(parts) == [0, 1, 2] and sorted(finishes) == [0, 1, 2], (parts, finishes)
    assert ["".join(parts[i]) for i in range(3)] == texts, (parts, texts)

    c = client.completions.create(
        model="local", prompt="Once upon a time", max_tokens=6, temperature=1.0, seed=5, n=2)
    assert [x.index for x in c.choices] == [0, 1], c


def responses():
    """The Responses API: the same answer the chat route gives, streamed
    with OpenAI's events, calls as function_call items, stateless."""
    ask = dict(model="local", instructions="Answer briefly.",
               input="What is the capital of France?", max_output_tokens=8, temperature=0)
    r = client.responses.create(**ask)
    assert r.id.startswith("resp_"), r
    assert r.output[0].type == "message" and r.output[0].id.startswith("msg_"), r
    chat = client.chat.completions.create(
        model="local", temperature=0, max_tokens=8, messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}])
    assert r.output_text == chat.choices[0].message.content, (r.output_text, chat)
    assert r.usage.input_tokens == chat.usage.prompt_tokens, r.usage
    assert r.usage.output_tokens == chat.usage.completion_tokens, r.usage
    expected = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    assert r.status == expected, r

    types, text, final = [], "", None
    for ev in client.responses.create(stream=True, **ask):
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"], types
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.%s" % expected], types
    assert text == r.output_text == final.output_text, (text, final)

    flat = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    r = client.responses.create(
        model="local", input=FEW_SHOT, tools=flat, temperature=0, max_output_tokens=40)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    assert json.loads(calls[0].arguments) == {"city": "Paris"}, calls
    # The call and its output go back as items, as an agent sends them.
    follow = FEW_SHOT + [
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C"}]
    r = client.responses.create(model="local", input=follow, max_output_tokens=4, temperature=0)
    assert r.output, r

    try:
        client.responses.create(model="local", input="Hi", previous_response_id="resp_x")
        raise AssertionError("previous_response_id was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id", e.body


def embeddings():
    texts = ["The capital of France is Paris.", "I like turtles."]
    # The SDK asks for base64 unless told and decodes it itself.
    r = client.embeddings.create(model="local", input=texts)
    assert [d.index for d in r.data] == [0, 1], r
    vs = [d.embedding for d in r.data]
    for v in vs:
        assert len(v) == 576 and abs(sum(x * x for x in v) - 1) < 1e-4, len(v)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 4, r.usage
    f = client.embeddings.create(model="local", input=texts, encoding_format="float")
    assert [d.embedding for d in f.data] == vs, "base64 and float disagree"
    one = client.embeddings.create(model="local", input=texts[1]).data[0].embedding
    assert one == vs[1], "a prompt's vector depends on what else was sent"
    try:
        client.embeddings.create(model="local", input=[])
        raise AssertionError("an empty input was accepted")
    except openai.BadRequestError as e:
        assert "empty" in str(e), e


class Capital(pydantic.BaseModel):
    country: Literal["France", "Germany", "Italy"]
    capital: Literal["Paris", "Berlin", "Rome"]
    certain: bool


def structured_output():
    # The SDK's own structured-output path: a pydantic model sent as a
    # strict json_schema and the answer parsed back into it.
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model="local", messages=MSG, response_format=Capital, temperature=0, max_tokens=60)
    got = r.choices[0].message.parsed
    assert isinstance(got, Capital), r
    assert r.choices[0].finish_reason == "stop", r

    # A required call to a named tool, on a question the model would
    # answer in words.
    r = client.chat.completions.create(
        model="local", messages=MSG, tools=TOOLS, temperature=0, max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather", call
    assert isinstance(json.loads(call.function.arguments), dict), call

    try:
        client.chat.completions.create(
            model="local", messages=MSG, max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "hiccup"}}})
        raise AssertionError("an invalid schema was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400, e


CHECKS = [
    embeddings,
    non_streaming, streaming_with_usage, max_tokens_and_stop, seed_reproducibility,
    logprobs, completions_and_models, tokenize_round_trip, bad_requests,
    eight_concurrent_streams, disconnect_mid_stream, tool_calls, structured_output,
    several_choices, responses,
]

client_checks.run("openai", CHECKS)
