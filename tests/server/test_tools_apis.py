"""Tool use through the Anthropic Messages API and the OpenAI Responses API, with the official clients, on
the default instruct model (Qwen2.5-Coder-1.5B-Instruct): a call, its result, the final answer; streamed
and not; forced calls. Greedy and few tokens, one slot."""
import json

import pytest

from conftest import DEFAULT_MODEL, start_server, stop_server

anthropic = pytest.importorskip("anthropic")
T0 = {"temperature": 0}

ASK = "What's the weather in Paris?"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TIME_SCHEMA = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
RESULT = json.dumps({"temperature_c": 21, "sky": "sunny"})


@pytest.fixture(scope="module")
def qwen():
    s = start_server(model=DEFAULT_MODEL, parallel=1, ctx=2048)
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def claude(qwen):
    return anthropic.Anthropic(base_url=qwen.url, api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def oai(qwen):
    import openai
    return openai.OpenAI(base_url=qwen.url + "/v1", api_key="none", max_retries=0, timeout=300)


A_TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city", "input_schema": SCHEMA},
           {"name": "get_time", "description": "Get the current time in a time zone", "input_schema": TIME_SCHEMA}]
R_TOOLS = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
           for t in A_TOOLS]


def test_messages_tool_use_round_trip(claude):
    msgs = [{"role": "user", "content": ASK}]
    m = claude.messages.create(model="x", max_tokens=64, tools=A_TOOLS, messages=msgs, extra_body=T0)
    assert m.stop_reason == "tool_use", m
    use = [b for b in m.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "get_weather" and use[0].input == {"city": "Paris"}
    assert use[0].id.startswith("toolu_")
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": RESULT}]}]
    # With tool_choice none the model answers from the result (this small model, offered the tools again,
    # tends to call once more).
    final = claude.messages.create(model="x", max_tokens=48, tools=A_TOOLS, messages=msgs, extra_body=T0,
                                   tool_choice={"type": "none"})
    assert final.stop_reason in ("end_turn", "max_tokens") and final.content[0].type == "text"
    assert "21" in final.content[0].text or "sunny" in final.content[0].text.lower()


def test_messages_tool_use_stream(claude):
    with claude.messages.stream(model="x", max_tokens=64, tools=A_TOOLS, extra_body=T0,
                                messages=[{"role": "user", "content": ASK}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    use = [b for b in final.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "get_weather" and use[0].input == {"city": "Paris"}


def test_messages_forced_tool(claude):
    m = claude.messages.create(model="x", max_tokens=64, tools=A_TOOLS, extra_body=T0,
                               tool_choice={"type": "tool", "name": "get_time"},
                               messages=[{"role": "user", "content": ASK}])
    use = [b for b in m.content if b.type == "tool_use"]
    assert use and use[0].name == "get_time" and isinstance(use[0].input.get("zone"), str)


def test_responses_function_call_round_trip(oai):
    r = oai.responses.create(model="x", input=ASK, tools=R_TOOLS, max_output_tokens=64, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    assert json.loads(calls[0].arguments) == {"city": "Paris"} and calls[0].call_id
    final = oai.responses.create(model="x", previous_response_id=r.id, tools=R_TOOLS, max_output_tokens=48,
                                 temperature=0, tool_choice="none",
                                 input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": RESULT}])
    assert "21" in final.output_text or "sunny" in final.output_text.lower()
    assert final.usage.input_tokens_details.cached_tokens > 0  # the first turn came from the state cache


def test_responses_function_call_stream(oai):
    events = list(oai.responses.create(model="x", input=ASK, tools=R_TOOLS, max_output_tokens=64, temperature=0,
                                       stream=True))
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(args) == json.loads(done.arguments) == {"city": "Paris"}
    out = events[-1].response.output
    assert [o.type for o in out] == ["function_call"] and out[0].name == "get_weather"


def test_responses_required_tool(oai):
    r = oai.responses.create(model="x", input="Hello!", tools=R_TOOLS, tool_choice="required",
                             max_output_tokens=64, temperature=0)
    assert any(o.type == "function_call" for o in r.output)
