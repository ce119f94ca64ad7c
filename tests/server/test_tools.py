"""Tool calls and the chat request's tool/reasoning fields, through the official `openai` client.

The round trips run on the default instruct model (Qwen2.5-Coder-1.5B-Instruct, its own template) in a
module-scoped server with one slot; greedy and few tokens, so they stay quick and deterministic. The
field checks run on the session's small Gemma server (its template has no tools: the fallbacks).
"""
import json
import sys

import pytest
import requests

from conftest import DEFAULT_MODEL, ROOT, start_server, stop_server

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
RESULT = json.dumps({"temperature_c": 21, "sky": "sunny"})


@pytest.fixture(scope="module")
def qwen():
    s = start_server(model=DEFAULT_MODEL, parallel=1, ctx=2048)
    yield s
    assert s.proc.poll() is None, "the server died during the tests"
    stop_server(s)


@pytest.fixture(scope="module")
def qclient(qwen):
    import openai
    return openai.OpenAI(base_url=qwen.url + "/v1", api_key="none", max_retries=0, timeout=300)


def ask(qclient, qwen, messages, **kw):
    return qclient.chat.completions.create(model=qwen.model_id, messages=messages, tools=TOOLS,
                                           **{"max_tokens": 48, "temperature": 0, **kw})


def streamed(qclient, qwen, messages, **kw):
    """The chunks of a streamed answer, merged as a client does: content, tool calls, finish reason."""
    content, calls, finish, call_pieces = "", {}, None, 0
    for ch in ask(qclient, qwen, messages, stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            if tc.id:
                assert not c["id"], "a call's id comes once"
                c["id"], c["name"] = tc.id, tc.function.name
            c["arguments"] += tc.function.arguments or ""
            call_pieces += 1
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def with_result(call_message, call_id):
    return ASK + [call_message, {"role": "tool", "tool_call_id": call_id, "content": RESULT}]


def test_tool_call_round_trip(qclient, qwen):
    r = ask(qclient, qwen, ASK)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    assert c.message.content is None and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The result goes back; with tool_choice "none" the model answers from it. Offered the tools again,
    # this small model answers with a copy of its call that starts with "{{": its own template's system
    # text shows the call format as {{"name": ...}} (test_prompt_is_the_templates_own shows xpert renders
    # that template exactly as jinja2 does; the "{{" is the model's, not ours).
    final = ask(qclient, qwen, with_result(c.message.model_dump(exclude_none=True), call.id), tool_choice="none")
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.tool_calls is None
    assert "21" in final.choices[0].message.content


def test_tool_call_round_trip_streaming(qclient, qwen):
    content, calls, finish = streamed(qclient, qwen, ASK)
    assert content == "" and finish == "tool_calls"  # the call's text never leaks as content
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    whole = ask(qclient, qwen, ASK).choices[0].message.tool_calls[0]
    assert calls[0]["arguments"] == whole.function.arguments
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0]["id"], "type": "function",
         "function": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}]}
    text, more_calls, finish = streamed(qclient, qwen, with_result(message, calls[0]["id"]), tool_choice="none")
    assert finish == "stop" and not more_calls and "21" in text


def test_prompt_is_the_templates_own(qwen):
    """The prompt after a tool result, with the tools still offered, is character for character what
    jinja2 renders from the model's own template (tokenizer.chat_template in the GGUF), set up as
    transformers' apply_chat_template (tests/reference/make_template_fixtures.py)."""
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("jinja2")
    sys.path.insert(0, str(ROOT / "tests" / "reference"))
    from make_template_fixtures import make_env, normalize, probe, render

    field = gguf.GGUFReader(str(DEFAULT_MODEL)).fields["tokenizer.chat_template"]
    tmpl = make_env().from_string(bytes(field.parts[field.data[0]]).decode())
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    for messages in (ASK, with_result(call, "call_1"), [*with_result(call, "call_1"),
                                                        {"role": "assistant", "content": "It is 21 C and sunny."},
                                                        {"role": "user", "content": "And the time in Tokyo?"}]):
        expected = render(tmpl, "", "<|im_end|>", normalize(messages, probe(tmpl, "", "<|im_end|>")), tools=TOOLS)
        r = requests.post(qwen.url + "/apply-template", json={"messages": messages, "tools": TOOLS}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["prompt"] == expected


def test_required_always_calls(qclient, qwen):
    # A greeting needs no tool; "required" makes it a call anyway, sampled or greedy.
    hi = [{"role": "user", "content": "Hi! How are you today?"}]
    for kw in ({"temperature": 0}, {"temperature": 1.0, "seed": 7}):
        r = ask(qclient, qwen, hi, tool_choice="required", **kw)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c.message
        assert c.message.tool_calls and all(t.function.name in ("get_weather", "get_time")
                                            for t in c.message.tool_calls)
        for t in c.message.tool_calls:
            assert isinstance(json.loads(t.function.arguments), dict)


FORECAST = {"type": "function", "function": {
    "name": "get_forecast", "description": "Forecast for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"}},
        "required": ["city", "days", "unit"], "additionalProperties": False}}}


def test_forced_arguments_follow_the_schema(qclient, qwen):
    # "required" over tools of different schemas, and a named function: the sampled arguments validate
    # against the called tool's parameters, whatever the seed (unconstrained, this model asks for 14 days
    # in kelvin, outside the schema).
    jsonschema = pytest.importorskip("jsonschema")
    tools = TOOLS + [FORECAST]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    hi = [{"role": "user", "content": "What will the weather be in Paris for the next 14 days, in kelvin?"}]
    for seed in range(3):
        for choice in ("required", {"type": "function", "function": {"name": "get_forecast"}}):
            r = qclient.chat.completions.create(model=qwen.model_id, messages=hi, tools=tools, tool_choice=choice,
                                                max_tokens=64, temperature=1.2, seed=seed, parallel_tool_calls=False)
            c = r.choices[0]
            assert c.finish_reason == "tool_calls", c.message
            for t in c.message.tool_calls:
                jsonschema.validate(json.loads(t.function.arguments), schemas[t.function.name])
            if choice != "required":
                assert [t.function.name for t in c.message.tool_calls] == ["get_forecast"]


def test_forced_call_with_an_inexpressible_schema_is_400(qwen):
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}}}
    r = requests.post(qwen.url + "/v1/chat/completions", timeout=60, json={
        "messages": ASK, "tools": [tool], "tool_choice": "required", "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[0].function.parameters"


def test_named_function_is_called(qclient, qwen):
    content, calls, finish = streamed(qclient, qwen, ASK, tool_choice={"type": "function",
                                                                        "function": {"name": "get_time"}})
    assert finish == "tool_calls" and content == ""
    assert [c["name"] for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0]["arguments"]), dict)


def test_tool_choice_none_answers_in_text(qclient, qwen):
    r = ask(qclient, qwen, ASK, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


# ---- the request's fields, on the small model's server ----

CHAT = "/v1/chat/completions"


def post(server, body):
    return requests.post(server.url + CHAT, json={"max_tokens": 1, **body}, timeout=60)


def error_param(r):
    assert r.status_code == 400, r.text
    return r.json()["error"]["param"]


def test_bad_tool_fields_name_the_field(server):
    msgs = [{"role": "user", "content": "hi"}]
    assert error_param(post(server, {"messages": msgs, "tools": [{"type": "function"}]})) == "tools[0].function"
    assert error_param(post(server, {"messages": msgs, "tools": [{"type": "function", "function": {}}]})) \
        == "tools[0].function.name"
    assert error_param(post(server, {"messages": msgs, "tools": TOOLS, "tool_choice": "always"})) == "tool_choice"
    assert error_param(post(server, {"messages": msgs, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}})) == "tool_choice"
    assert error_param(post(server, {"messages": msgs, "tool_choice": "required"})) == "tool_choice"
    assert error_param(post(server, {"messages": msgs, "parallel_tool_calls": "yes"})) == "parallel_tool_calls"
    assert error_param(post(server, {"messages": msgs, "reasoning_format": "maybe"})) == "reasoning_format"
    assert error_param(post(server, {"messages": msgs, "chat_template_kwargs": [1]})) == "chat_template_kwargs"
    bad_call = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                       "function": {"arguments": "{}"}}]}]
    assert error_param(post(server, {"messages": bad_call})) == "messages[1].tool_calls[0].function.name"


def test_unsupported_fields_are_400_not_ignored(server):
    msgs = [{"role": "user", "content": "hi"}]
    for field, value in (("functions", [{"name": "f"}]), ("audio", {"voice": "x"}), ("no_such_field", 1)):
        r = post(server, {"messages": msgs, field: value})
        assert error_param(r) == field and field in r.json()["error"]["message"]
    r = requests.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1, "no_such_field": 1},
                      timeout=60)
    assert error_param(r) == "no_such_field"
    # Fields that change nothing in the answer, and nulls, are accepted.
    assert post(server, {"messages": msgs, "user": "u1", "metadata": {"k": "v"}, "store": False,
                         "tool_choice": None}).status_code == 200


def test_template_fallbacks(server):
    # Gemma's template has no tools, no tool turns and no developer role: they are rendered anyway.
    msgs = [{"role": "developer", "content": "Be brief."}, *ASK,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": RESULT}]
    r = requests.post(server.url + "/apply-template", json={"messages": msgs, "tools": TOOLS}, timeout=60)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "Be brief." in prompt and "get_time" in prompt and '"tool_calls"' in prompt
    assert "temperature_c" in prompt and "Tool result" in prompt
    assert post(server, {"messages": msgs, "tools": TOOLS}).status_code == 200
