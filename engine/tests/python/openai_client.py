"""The engine driven by the official `openai` Python client.

Run by engine/tests/openai_client.rs against an engine it started:
    python openai_client.py BASE_URL MODEL
Exits non-zero (an AssertionError) on the first failed check.
"""
import json
import sys
import urllib.request

import jsonschema
import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused")


def metric(name):
    text = urllib.request.urlopen(BASE + "/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def logprobs_top_is_greedy():
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert content and len(content) == r.usage.completion_tokens
    for e in content:
        assert e.top_logprobs[0].token == e.token, e
        assert e.top_logprobs[0].logprob == e.logprob, e
    assert "".join(e.token for e in content) == r.choices[0].message.content
    streamed = []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=msgs, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3, stream=True
    ):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed.extend(chunk.choices[0].logprobs.content)
    assert [e.token for e in streamed] == [e.token for e in content]


def n4_one_prefill():
    before = metric("kvfabric_engine_prompt_tokens_computed_total")
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a fact about owls, please, in one line."}],
        temperature=1.0, seed=99, n=4, max_tokens=12,
    )
    computed = metric("kvfabric_engine_prompt_tokens_computed_total") - before
    assert len(r.choices) == 4 and [c.index for c in r.choices] == [0, 1, 2, 3]
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert computed == r.usage.prompt_tokens - cached, (computed, r.usage)
    again = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a fact about owls, please, in one line."}],
        temperature=1.0, seed=99, n=4, max_tokens=12,
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]


WEATHER = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current temperature in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


def two_turn_tool_call(stream):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(model=MODEL, messages=msgs, tools=WEATHER, tool_choice=choice, temperature=0, max_tokens=40)
    if stream:
        calls, finish = {}, None
        for chunk in client.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
        assert finish == "tool_calls", finish
        call = calls[0]
    else:
        r = client.chat.completions.create(**kw)
        assert r.choices[0].finish_reason == "tool_calls", r
        tc = r.choices[0].message.tool_calls[0]
        call = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
    assert call["name"] == "get_weather"
    json.loads(call["arguments"])
    msgs.append({"role": "assistant", "content": None, "tool_calls": [{
        "id": call["id"], "type": "function",
        "function": {"name": call["name"], "arguments": call["arguments"]},
    }]})
    msgs.append({"role": "tool", "tool_call_id": call["id"], "content": "18 degrees C, sunny"})
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=WEATHER, tool_choice="none",
                                       temperature=0, max_tokens=30)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", "none"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
}


def json_schema_validates_every_time():
    """20 of 20 sampled answers (temperature 1.0, 20 seeds) parse and validate."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    outputs = set()
    for seed in range(20):
        r = client.chat.completions.create(
            model=MODEL, messages=msgs, response_format=fmt, temperature=1.0, seed=seed, max_tokens=120
        )
        c = r.choices[0]
        assert c.finish_reason == "stop", (seed, c)
        jsonschema.validate(json.loads(c.message.content), PERSON)
        outputs.add(c.message.content)
    assert len(outputs) > 1, "different seeds sample different answers"
    # Streamed, n=3 (each sample its own matcher), with logprobs of the masked row.
    chunks = {}
    for chunk in client.chat.completions.create(
        model=MODEL, messages=msgs, response_format=fmt, temperature=1.0, seed=7, n=3,
        max_tokens=120, stream=True, logprobs=True, top_logprobs=2,
    ):
        for c in chunk.choices:
            chunks[c.index] = chunks.get(c.index, "") + (c.delta.content or "")
            for e in (c.logprobs.content if c.logprobs and c.logprobs.content else []):
                assert e.logprob > -9999, e  # the sampled token was allowed
    assert sorted(chunks) == [0, 1, 2]
    for text in chunks.values():
        jsonschema.validate(json.loads(text), PERSON)


def json_object_parses():
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object about Paris."}],
            response_format={"type": "json_object"}, temperature=1.0, seed=seed, max_tokens=200,
        )
        c = r.choices[0]
        assert c.finish_reason == "stop", c
        assert isinstance(json.loads(c.message.content), dict), c.message.content


BOOKING = [WEATHER[0], {
    "type": "function",
    "function": {
        "name": "book_table",
        "parameters": {
            "type": "object",
            "properties": {"people": {"type": "integer", "minimum": 1, "maximum": 12},
                           "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}},
            "required": ["people", "time"],
            "additionalProperties": False,
        },
    },
}]


def required_tool_call_arguments_validate():
    msgs = [{"role": "user", "content": "Book a table for four at eight tonight."}]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in BOOKING}
    for seed in range(5):
        r = client.chat.completions.create(
            model=MODEL, messages=msgs, tools=BOOKING, tool_choice="required",
            temperature=1.0, seed=seed, max_tokens=80,
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        tc = c.message.tool_calls[0]
        jsonschema.validate(json.loads(tc.function.arguments), schemas[tc.function.name])


def bad_schema_is_a_400():
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "frobnicate"}}}
    try:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], response_format=fmt
        )
    except openai.BadRequestError as e:
        assert e.body["param"] == "response_format.json_schema.schema", e.body
        assert "frobnicate" in e.body["message"], e.body
    else:
        raise AssertionError("a schema that does not compile must be a 400")


def unsupported_is_named():
    try:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], audio={"voice": "alloy"},
        )
    except openai.BadRequestError as e:
        assert e.body["param"] == "audio", e.body
    else:
        raise AssertionError("audio must be refused by name")


for check in (logprobs_top_is_greedy, n4_one_prefill, lambda: two_turn_tool_call(False),
              lambda: two_turn_tool_call(True), json_schema_validates_every_time, json_object_parses,
              required_tool_call_arguments_validate, bad_schema_is_a_400, unsupported_is_named):
    check()
    print("ok", getattr(check, "__name__", "tool call"), flush=True)
