"""OpenAI's Responses API (/v1/responses) through the official openai client."""
import json

import pytest
import requests

PROMPT = "Write the numbers from 1 to 10."


def chat_text(server, messages, max_tokens):
    r = requests.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": messages, "max_tokens": max_tokens, "temperature": 0}).json()
    return r["choices"][0]["message"]["content"]


def test_responses_create(client, server):
    r = client.responses.create(model="gpt-4.1", input=PROMPT, max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "gpt-4.1"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output_text == chat_text(server, [{"role": "user", "content": PROMPT}], 8)
    assert r.usage.output_tokens == 8 and r.usage.total_tokens == r.usage.input_tokens + 8
    # Kept: GET /v1/responses/{id} gives it back.
    assert client.responses.retrieve(r.id).output_text == r.output_text


def test_responses_instructions_and_items(client, server):
    items = [{"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}]
    r = client.responses.create(model="x", instructions="Be brief.", input=items, max_output_tokens=6, temperature=0)
    assert r.output_text == chat_text(server, [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": PROMPT}], 6)
    assert r.instructions == "Be brief."


def test_responses_previous_response_id(client, server):
    first = client.responses.create(model="x", input=PROMPT, max_output_tokens=6, temperature=0)
    second = client.responses.create(model="x", input="Now from 10 to 1.", previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0)
    assert second.previous_response_id == first.id
    # The same as sending the whole conversation through the chat API ...
    convo = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "Now from 10 to 1."}]
    assert second.output_text == chat_text(server, convo, 6)
    # ... and the first turn's prompt came from the state cache, not evaluated again.
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    with pytest.raises(Exception) as e:
        client.responses.create(model="x", input="hi", previous_response_id="resp_nope", max_output_tokens=2)
    assert getattr(e.value, "status_code", None) == 404


def test_responses_function_call_output_items(strict_server):
    """function_call and function_call_output items reach the template as a tool call and its result
    (on the ChatML server: Gemma's template has no tool role)."""
    import openai
    server = strict_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    items = [{"role": "user", "content": "What is the weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "22 C and sunny"}]
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    r = client.responses.create(model="my-model", input=items, tools=tools, max_output_tokens=4, temperature=0)
    convo = [{"role": "user", "content": "What is the weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"}]
    chat_tools = [{"type": "function", "function": {k: v for k, v in tools[0].items() if k != "type"}}]
    want = requests.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": convo, "tools": chat_tools, "max_tokens": 4, "temperature": 0}).json()
    assert r.output_text == want["choices"][0]["message"]["content"]
    assert r.tools[0].name == "get_weather"


def test_responses_stream(client, server):
    events = list(client.responses.create(model="x", input=PROMPT, max_output_tokens=8, temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == chat_text(server, [{"role": "user", "content": PROMPT}], 8)

def test_responses_stream_helper(client, server):
    """The client's stream helper, on an answer that ends by itself (a JSON schema closes it)."""
    fmt = {"format": {"type": "json_schema", "name": "num", "strict": True, "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}}}
    with client.responses.stream(model="x", input="A number as JSON.", max_output_tokens=40, temperature=0,
                                 text=fmt) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == deltas
    assert isinstance(json.loads(deltas)["n"], int)


def test_responses_json_schema(client, server):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    r = client.responses.create(model="x", input="Give me a number as JSON.", max_output_tokens=40, temperature=0,
                                text={"format": {"type": "json_schema", "name": "num", "schema": schema, "strict": True}})
    assert isinstance(json.loads(r.output_text)["n"], int)


@pytest.mark.parametrize("body,param", [
    ({"model": "x"}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "hi", "reasoning": {"budget": 5}}, "reasoning.budget"),
    ({"input": "hi", "reasoning": "high"}, "reasoning"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
])
def test_responses_bad_requests(server, body, param):
    r = requests.post(server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
