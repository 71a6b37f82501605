"""The engine driven by the official `openai` Python client.

Run by engine/tests/openai_client.rs against an engine it started:
    python openai_client.py BASE_URL MODEL
Exits non-zero (an AssertionError) on the first failed check.
"""
import json
import sys
import urllib.request

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


def unsupported_is_named():
    try:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_object"},
        )
    except openai.BadRequestError as e:
        assert e.body["param"] == "response_format", e.body
    else:
        raise AssertionError("response_format must be refused until it is enforced")


for check in (logprobs_top_is_greedy, n4_one_prefill, lambda: two_turn_tool_call(False),
              lambda: two_turn_tool_call(True), unsupported_is_named):
    check()
    print("ok", getattr(check, "__name__", "tool call"), flush=True)
