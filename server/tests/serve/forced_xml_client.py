"""Forced tool calls in the XML format of Qwen3-Coder and Qwen3.5, read by
the official `openai` and `anthropic` Python clients. Run by `cargo test -p
lamina --test serve` (forced_xml.rs) against a `lamina serve` of a model
with random weights and Qwen3.5's template; usage: forced_xml_client.py
BASE_URL API_KEY.

Such a model writes noise: only the grammar of a forced call makes it
write a call, and every argument must come back typed by its schema (an
integer an int, a boolean a bool, an object a dict). Every value is
bounded (maxLength, an enum, a range), or noise would fill it to the end.

Prints one line per check and exits non-zero if any failed.
"""

import json
import sys

import anthropic
import openai

import client_checks

BASE, KEY = sys.argv[1], sys.argv[2]
oa = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
an = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX = 400

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "metric": {"type": "boolean"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "at": {"type": "object", "properties": {"lat": {"type": "integer", "minimum": -90, "maximum": 90}},
               "required": ["lat"], "additionalProperties": False},
        "hours": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23}, "maxItems": 3},
    },
    "required": ["city", "days", "metric"],
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}, "hour24": {"type": "boolean"}},
    "required": ["zone", "hour24"],
}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone", "parameters": TIME}},
]
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER},
    {"name": "get_time", "description": "The time in a zone", "input_schema": TIME},
]


def typed(name, args):
    """The arguments are the schema's types, not strings."""
    assert isinstance(args, dict), args
    if name == "get_weather":
        assert set(args) <= set(WEATHER["properties"]) and {"city", "days", "metric"} <= set(args), args
        assert isinstance(args["city"], str) and len(args["city"]) <= 12, args
        assert type(args["days"]) is int and 1 <= args["days"] <= 14, args
        assert type(args["metric"]) is bool, args
        assert args.get("unit", "celsius") in ("celsius", "fahrenheit"), args
        if "at" in args:
            assert set(args["at"]) == {"lat"} and type(args["at"]["lat"]) is int, args
        if "hours" in args:
            assert all(type(h) is int for h in args["hours"]) and len(args["hours"]) <= 3, args
    elif name == "get_time":
        assert set(args) == {"zone", "hour24"}, args
        assert args["zone"] in ("UTC", "CET") and type(args["hour24"]) is bool, args
    else:
        raise AssertionError(f"called {name}")


def openai_whole(name=None, **kw):
    """One forced call through chat.completions.create: its name."""
    choice = {"type": "function", "function": {"name": name}} if name else "required"
    r = oa.chat.completions.create(model="local", messages=MSG, tools=OPENAI_TOOLS, tool_choice=choice,
                                   temperature=0, max_tokens=MAX, **kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", r
    assert not c.message.content, r
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id, call
    typed(call.function.name, json.loads(call.function.arguments))
    assert name is None or call.function.name == name, call
    return call


def openai_streamed(name=None, **kw):
    """The same request streamed: the calls' deltas joined by index."""
    choice = {"type": "function", "function": {"name": name}} if name else "required"
    calls, text, finish = {}, [], None
    for chunk in oa.chat.completions.create(model="local", messages=MSG, tools=OPENAI_TOOLS, tool_choice=choice,
                                            temperature=0, max_tokens=MAX, stream=True, **kw):
        for ch in chunk.choices:
            text.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"name": "", "arguments": ""})
                c["name"] += (d.function.name or "") if d.function else ""
                c["arguments"] += (d.function.arguments or "") if d.function else ""
    assert "".join(text) == "" and finish == "tool_calls", (text, finish)
    assert sorted(calls) == list(range(len(calls))) and calls, calls
    for c in calls.values():
        typed(c["name"], json.loads(c["arguments"]))
        assert name is None or c["name"] == name, c
    return calls


def openai_required():
    whole = openai_whole()
    streamed = openai_streamed()
    (only,) = streamed.values()
    assert only["name"] == whole.function.name, (only, whole)
    assert json.loads(only["arguments"]) == json.loads(whole.function.arguments), (only, whole)


def openai_named():
    for name in ("get_weather", "get_time"):
        openai_whole(name)
        (only,) = openai_streamed(name).values()


def openai_without_thinking():
    # Thinking off: the template closes the think block itself, and the
    # call starts the answer.
    kw = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    openai_whole(**kw)
    openai_streamed("get_time", **kw)


def openai_parallel():
    r = oa.chat.completions.create(model="local", messages=MSG, tools=OPENAI_TOOLS, tool_choice="required",
                                   parallel_tool_calls=True, temperature=0, max_tokens=MAX)
    c = r.choices[0]
    assert c.message.tool_calls, r
    for call in c.message.tool_calls:
        typed(call.function.name, json.loads(call.function.arguments))


def anthropic_blocks(m, name=None):
    """The tool_use blocks of a forced answer, each typed."""
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and all(b.type in ("tool_use", "thinking") for b in m.content), m
    for b in uses:
        assert b.id.startswith("toolu_"), b
        typed(b.name, b.input)
        assert name is None or b.name == name, b
    return uses


def anthropic_forced():
    for choice, name in (({"type": "any"}, None), ({"type": "tool", "name": "get_time"}, "get_time"),
                         ({"type": "tool", "name": "get_weather"}, "get_weather")):
        # One call: with parallel use allowed, noise may chain calls to
        # max_tokens.
        choice = dict(choice, disable_parallel_tool_use=True)
        m = an.messages.create(model="local", max_tokens=MAX, messages=MSG, tools=ANTHROPIC_TOOLS,
                               tool_choice=choice)
        (whole,) = anthropic_blocks(m, name)
        with an.messages.stream(model="local", max_tokens=MAX, messages=MSG, tools=ANTHROPIC_TOOLS,
                                tool_choice=choice) as s:
            final = s.get_final_message()
        (streamed,) = anthropic_blocks(final, name)
        assert (streamed.name, streamed.input) == (whole.name, whole.input), (streamed, whole)


CHECKS = [openai_required, openai_named, openai_without_thinking, openai_parallel, anthropic_forced]

client_checks.run("forced XML", CHECKS)
