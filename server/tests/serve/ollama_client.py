"""Lamina's server driven by the official `ollama` Python client, as apps
written for a local Ollama drive it. Run by `cargo test -p lamina --test
serve` (ollama.rs) against a `lamina serve` it starts; usage:
ollama_client.py BASE_URL API_KEY.

Prints one line per check and exits non-zero if any failed.
"""

import json
import sys
from typing import Literal

import ollama
import pydantic

import client_checks

BASE, KEY = sys.argv[1], sys.argv[2]
client = ollama.Client(host=BASE, headers={"Authorization": f"Bearer {KEY}"})
MSG = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 12}


def openai_chat(body):
    return client_checks.openai_chat(BASE, KEY, body)


def chat_answers_as_the_openai_route():
    r = client.chat(model="anything", messages=MSG, options=GREEDY)
    assert r.done and r.done_reason in ("stop", "length"), r
    assert r.message.role == "assistant" and r.message.content, r
    o = openai_chat({"messages": MSG, "temperature": 0, "max_tokens": 12})
    assert r.message.content == o["choices"][0]["message"]["content"], (r, o)
    assert r.prompt_eval_count == o["usage"]["prompt_tokens"], r
    assert r.eval_count == o["usage"]["completion_tokens"], r
    assert r.total_duration > 0 and r.eval_duration > 0, r


def streamed_chat_reassembles():
    whole = client.chat(model="m", messages=MSG, options=GREEDY).message.content
    parts, last = [], None
    for part in client.chat(model="m", messages=MSG, options=GREEDY, stream=True):
        parts.append(part.message.content or "")
        last = part
    assert "".join(parts) == whole, (parts, whole)
    assert last.done and last.eval_count > 0, last


def num_predict_and_stop():
    r = client.chat(model="m", messages=MSG, options={"temperature": 0, "num_predict": 2})
    assert r.done_reason == "length" and r.eval_count == 2, r
    text = client.chat(model="m", messages=MSG, options=GREEDY).message.content
    word = text.split()[1] if len(text.split()) > 1 else text.split()[0]
    r = client.chat(model="m", messages=MSG, options={**GREEDY, "stop": [word]})
    assert r.done_reason == "stop" and word not in r.message.content, r


def generate_and_its_context():
    r = client.generate(model="m", prompt="What is the capital of France?", options=GREEDY)
    chat = client.chat(model="m", messages=MSG, options=GREEDY)
    assert r.response == chat.message.content, (r, chat)
    # The prompt, then the answer's tokens (the end-of-generation token,
    # which eval_count counts, is not part of it).
    assert r.prompt_eval_count + r.eval_count - 1 <= len(r.context), r
    assert len(r.context) <= r.prompt_eval_count + r.eval_count, r
    raw = client.generate(model="m", prompt="The capital of France is", raw=True,
                          options=GREEDY)
    assert raw.response, raw
    parts = [p.response for p in client.generate(
        model="m", prompt="The capital of France is", raw=True, options=GREEDY, stream=True)]
    assert "".join(parts) == raw.response, (parts, raw)
    loaded = client.generate(model="m", prompt="")
    assert loaded.done and loaded.done_reason == "load", loaded


def json_format():
    r = client.chat(model="m", format="json", options={"temperature": 0, "num_predict": 400},
                    messages=[{"role": "user", "content": "Give a JSON object with a name."}])
    assert r.done_reason == "stop", r
    assert isinstance(json.loads(r.message.content), dict), r


def schema_format():
    # Ollama's structured outputs: a pydantic model's JSON schema as format.
    class Capital(pydantic.BaseModel):
        country: Literal["France", "Germany", "Italy"]
        capital: Literal["Paris", "Berlin", "Rome"]

    r = client.chat(model="m", format=Capital.model_json_schema(),
                    options={"temperature": 0, "num_predict": 60},
                    messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert r.done_reason == "stop", r
    Capital.model_validate_json(r.message.content)


def list_show_ps():
    models = client.list().models
    assert len(models) == 1 and models[0].details.format == "gguf", models
    assert models[0].details.family == "llama", models
    assert models[0].details.quantization_level == "Q4_1", models
    assert models[0].size > 0
    shown = client.show(models[0].model)
    assert "im_start" in shown.template, shown.template[:200]
    assert shown.modelinfo["general.architecture"] == "llama", shown.modelinfo
    assert "completion" in shown.capabilities
    running = client.ps().models
    assert running and running[0].context_length > 0, running


def tool_calls_come_back():
    # The model's own template has no tool format: three turns that
    # answered with llama.cpp's generic JSON call make the greedy model
    # write it again.
    call = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
    turns = [m for _ in range(3) for m in (
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": call},
    )] + [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    opts = {"temperature": 0, "num_predict": 40}
    r = client.chat(model="m", messages=turns, tools=tools, options=opts)
    (c,) = r.message.tool_calls
    assert c.function.name == "get_weather" and c.function.arguments == {"city": "Paris"}, r
    assert not r.message.content, r
    streamed = [tc for part in client.chat(model="m", messages=turns, tools=tools,
                                           options=opts, stream=True)
                for tc in (part.message.tool_calls or [])]
    assert len(streamed) == 1 and streamed[0].function.arguments == {"city": "Paris"}, streamed


def errors_as_ollama_sends_them():
    try:
        client.chat(model="m", messages=[{"role": "user", "content": "what is it?",
                                          "images": ["AAAA"]}])
        raise AssertionError("an image was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "image input is not supported" in e.error, e
    try:
        client.chat(model="m", messages=MSG, options={"temperature": 9})
        raise AssertionError("temperature 9 was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "temperature" in e.error, e
    bad = ollama.Client(host=BASE, headers={"Authorization": "Bearer wrong"})
    try:
        bad.list()
        raise AssertionError("a wrong key was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 401, e


def embed():
    r = client.embed(model="m", input=["The capital of France is Paris.", "I like turtles."])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576, r
    for v in r.embeddings:
        assert abs(sum(x * x for x in v) - 1) < 1e-4
    one = client.embed(model="m", input="I like turtles.")
    assert list(one.embeddings[0]) == list(r.embeddings[1])
    assert one.prompt_eval_count > 0, one
    old = client.embeddings(model="m", prompt="I like turtles.")
    norm = sum(x * x for x in old.embedding) ** 0.5
    assert norm > 1.5, norm
    cos = sum(a * b for a, b in zip(old.embedding, one.embeddings[0])) / norm
    assert cos > 0.99999, cos


CHECKS = [
    embed,
    chat_answers_as_the_openai_route, streamed_chat_reassembles, num_predict_and_stop,
    generate_and_its_context, json_format, schema_format, list_show_ps, tool_calls_come_back,
    errors_as_ollama_sends_them,
]

client_checks.run("ollama", CHECKS)
