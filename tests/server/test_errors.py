"""Bad requests get OpenAI's error shape with the right status, and the server keeps serving."""
import http.client
import json
import socket

import pytest
import requests

from conftest import CTX, start_server, stop_server

CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
OK_MSGS = [{"role": "user", "content": "hi"}]


def check_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    assert isinstance(e["type"], str)
    if param is not None:
        assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code, e
    return e


# (name, path, body (dict / raw str), status, param)
CASES = [
    ("not json", CHAT, "{nope", 400, None),
    ("truncated json", CHAT, '{"messages": [', 400, None),
    ("invalid utf-8", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
    ("body is an array", CHAT, "[1, 2]", 400, None),
    ("body is a string", CHAT, '"hello"', 400, None),
    ("empty body", CHAT, "", 400, None),
    ("too deep", CHAT, "[" * 5000 + "]" * 5000, 400, None),
    ("missing messages", CHAT, {"max_tokens": 2}, 400, "messages"),
    ("messages not array", CHAT, {"messages": "hi"}, 400, "messages"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("message not object", CHAT, {"messages": ["hi"]}, 400, "messages[0]"),
    ("missing role", CHAT, {"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("role not string", CHAT, {"messages": [{"role": 3, "content": "hi"}]}, 400, "messages[0].role"),
    ("missing content", CHAT, {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ("content number", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("image part", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages[0].content[0].type"),
    ("part without text", CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400,
     "messages[0].content[0].text"),
    ("template rejects order", CHAT, {"messages": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]},
     400, "messages"),
    ("model not string", CHAT, {"messages": OK_MSGS, "model": 5}, 400, "model"),
    ("max_tokens string", CHAT, {"messages": OK_MSGS, "max_tokens": "10"}, 400, "max_tokens"),
    ("max_tokens negative", CHAT, {"messages": OK_MSGS, "max_tokens": -1}, 400, "max_tokens"),
    ("max_tokens zero", CHAT, {"messages": OK_MSGS, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens fractional", CHAT, {"messages": OK_MSGS, "max_tokens": 2.5}, 400, "max_tokens"),
    ("max_completion_tokens bool", CHAT, {"messages": OK_MSGS, "max_completion_tokens": True}, 400, "max_completion_tokens"),
    ("temperature string", CHAT, {"messages": OK_MSGS, "temperature": "hot"}, 400, "temperature"),
    ("temperature too high", CHAT, {"messages": OK_MSGS, "temperature": 5}, 400, "temperature"),
    ("top_p out of range", CHAT, {"messages": OK_MSGS, "top_p": 1.5}, 400, "top_p"),
    ("top_k negative", CHAT, {"messages": OK_MSGS, "top_k": -3}, 400, "top_k"),
    ("min_p string", CHAT, {"messages": OK_MSGS, "min_p": "x"}, 400, "min_p"),
    ("presence_penalty range", CHAT, {"messages": OK_MSGS, "presence_penalty": 3}, 400, "presence_penalty"),
    ("frequency_penalty type", CHAT, {"messages": OK_MSGS, "frequency_penalty": [1]}, 400, "frequency_penalty"),
    ("seed string", CHAT, {"messages": OK_MSGS, "seed": "abc"}, 400, "seed"),
    ("stop number", CHAT, {"messages": OK_MSGS, "stop": 5}, 400, "stop"),
    ("stop list of numbers", CHAT, {"messages": OK_MSGS, "stop": [1, 2]}, 400, "stop"),
    ("too many stops", CHAT, {"messages": OK_MSGS, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("n too large", CHAT, {"messages": OK_MSGS, "n": 200}, 400, "n"),
    ("stream not bool", CHAT, {"messages": OK_MSGS, "stream": "yes"}, 400, "stream"),
    ("stream_options without stream", CHAT, {"messages": OK_MSGS, "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("logprobs not bool", CHAT, {"messages": OK_MSGS, "logprobs": 3}, 400, "logprobs"),
    ("top_logprobs without logprobs", CHAT, {"messages": OK_MSGS, "top_logprobs": 2}, 400, "top_logprobs"),
    ("top_logprobs too many", CHAT, {"messages": OK_MSGS, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    ("tools not array", CHAT, {"messages": OK_MSGS, "tools": "x"}, 400, "tools"),
    ("completions missing prompt", COMPL, {"max_tokens": 2}, 400, "prompt"),
    ("completions prompt number", COMPL, {"prompt": 5}, 400, "prompt"),
    ("completions empty prompt list", COMPL, {"prompt": []}, 400, "prompt"),
    ("completions mixed prompt list", COMPL, {"prompt": [1, "b"]}, 400, "prompt"),
    ("completions prompt list of numbers", COMPL, {"prompt": ["a", 5]}, 400, "prompt"),
    ("completions token out of range", COMPL, {"prompt": [1, 99999999]}, 400, "prompt"),
    ("completions negative token", COMPL, {"prompt": [1, -5]}, 400, "prompt"),
    ("completions logprobs bool", COMPL, {"prompt": "a", "logprobs": True}, 400, "logprobs"),
    ("completions logprobs too many", COMPL, {"prompt": "a", "logprobs": 9}, 400, "logprobs"),
    ("completions n zero", COMPL, {"prompt": "a", "n": 0}, 400, "n"),
    ("completions too many choices", COMPL, {"prompt": ["a", "b", "c"], "n": 50}, 400, "n"),
    ("completions suffix number", COMPL, {"prompt": "a", "suffix": 3}, 400, "suffix"),
    ("completions suffix without FIM tokens", COMPL, {"prompt": "a", "suffix": "b"}, 400, "suffix"),
    ("embeddings missing input", "/v1/embeddings", {"model": "x"}, 400, "input"),
    ("embeddings bad format", "/v1/embeddings", {"input": "a", "encoding_format": "int8"}, 400, "encoding_format"),
    ("embeddings token out of range", "/v1/embeddings", {"input": [[1, 99999999]]}, 400, "input"),
    ("embeddings dimensions", "/v1/embeddings", {"input": "a", "dimensions": 3}, 400, "dimensions"),
    ("tokenize without content", "/tokenize", {"text": "a"}, 400, "content"),
    ("detokenize strings", "/detokenize", {"tokens": ["a"]}, 400, "tokens"),
    ("infill input_extra", "/infill", {"input_prefix": "a", "input_extra": [{"text": "x"}]}, 400, "input_extra"),
]


@pytest.mark.parametrize("name,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, name, path, body, status, param):
    if isinstance(body, dict):
        r = requests.post(server.url + path, json=body, timeout=30)
    else:
        r = requests.post(server.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=30)
    check_error(r, status, param)


def test_other_model_name_served(server):
    """One model serves every name (clients hard-code theirs); the response reports the name asked for."""
    r = requests.post(server.url + CHAT, json={"model": "gpt-17", "messages": OK_MSGS, "max_tokens": 1}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "gpt-17"


def test_unknown_model_strict(strict_server):
    r = requests.post(strict_server.url + CHAT, json={"model": "gpt-17", "messages": OK_MSGS}, timeout=30)
    check_error(r, 404, "model", "model_not_found")
    check_error(requests.get(strict_server.url + "/v1/models/gpt-17", timeout=30), 404, "model", "model_not_found")


def test_unknown_model_openai_client(strict_server):
    import openai
    client = openai.OpenAI(base_url=strict_server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=OK_MSGS, max_tokens=1)
    assert e.value.body["code"] == "model_not_found"


def test_model_aliases_accepted(server):
    for name in ("gemma3-270m", "gemma3-270m.gguf"):
        r = requests.post(server.url + COMPL, json={"model": name, "prompt": "a", "max_tokens": 1}, timeout=30)
        assert r.status_code == 200, r.text


def test_prompt_too_long(server):
    r = requests.post(server.url + COMPL, json={"prompt": "hello " * (CTX + 50), "max_tokens": 2}, timeout=30)
    check_error(r, 400, "prompt", "context_length_exceeded")
    r = requests.post(server.url + CHAT, json={"messages": [{"role": "user", "content": "word " * (CTX + 50)}]}, timeout=30)
    check_error(r, 400, "messages", "context_length_exceeded")


def test_body_too_large(server):
    r = requests.post(server.url + COMPL, data=json.dumps({"prompt": "x" * 70000}),
                      headers={"Content-Type": "application/json"}, timeout=30)
    check_error(r, 413)


@pytest.mark.parametrize("method,path", [("GET", CHAT), ("GET", COMPL), ("POST", "/v1/models"), ("DELETE", CHAT),
                                         ("PUT", "/health"), ("POST", "/metrics")])
def test_wrong_method(server, method, path):
    r = requests.request(method, server.url + path, timeout=30)
    check_error(r, 405)
    assert r.headers["Allow"] in ("GET", "POST")


@pytest.mark.parametrize("path", ["/v1/nothing", "/v2/chat/completions", "/v1/chat/completions/extra", "/favicon.ico"])
def test_unknown_route(server, path):
    check_error(requests.get(server.url + path, timeout=30), 404)
    check_error(requests.post(server.url + path, json={}, timeout=30), 404)


def test_garbage_http(server):
    """Raw garbage on the socket does not hurt the server."""
    for payload in (b"\x00\x01\x02garbage\r\n\r\n", b"GET\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(payload)
            try:
                s.recv(4096)
            except (socket.timeout, ConnectionResetError):
                pass
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def test_client_closes_before_answer(server):
    """A request whose client disconnects right after sending it."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", COMPL, body=json.dumps({"prompt": "Hello", "max_tokens": 50, "stream": True}),
                 headers={"Content-Type": "application/json"})
    conn.close()
    r = requests.post(server.url + COMPL, json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200


def test_still_serving_after_errors(client, server):
    r = client.chat.completions.create(model=server.model_id, messages=OK_MSGS, max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


# --- a second server: API key and a tiny queue --------------------------------------------------------

@pytest.fixture(scope="module")
def keyed_server():
    s = start_server("--api-key", "sekrit", "--queue", "0", "-t", "1")
    yield s
    stop_server(s)


def test_api_key_missing(keyed_server):
    check_error(requests.post(keyed_server.url + CHAT, json={"messages": OK_MSGS}, timeout=30), 401, code="invalid_api_key")


def test_api_key_wrong(keyed_server):
    r = requests.post(keyed_server.url + CHAT, json={"messages": OK_MSGS}, headers={"Authorization": "Bearer nope"}, timeout=30)
    check_error(r, 401, code="invalid_api_key")


def test_api_key_right_and_public_health(keyed_server):
    import openai
    c = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="sekrit", max_retries=0)
    assert c.completions.create(model="gemma3-270m", prompt="a", max_tokens=1).usage.completion_tokens == 1
    assert requests.get(keyed_server.url + "/health", timeout=10).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="bad", max_retries=0).models.list()


def test_queue_full_503(keyed_server):
    """With --queue 0, requests past the 4 slots get 503 at once instead of waiting."""
    import concurrent.futures as cf
    h = {"Authorization": "Bearer sekrit"}
    body = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}
    with cf.ThreadPoolExecutor(12) as ex:
        codes = list(ex.map(lambda _: requests.post(keyed_server.url + COMPL, json=body, headers=h, timeout=120), range(12)))
    statuses = sorted(r.status_code for r in codes)
    assert statuses.count(200) >= 4 and 503 in statuses, statuses
    for r in codes:
        if r.status_code == 503:
            check_error(r, 503, code="server_overloaded")


def test_messages_x_api_key(keyed_server):
    anthropic = pytest.importorskip("anthropic")
    ok = anthropic.Anthropic(base_url=keyed_server.url, api_key="sekrit", max_retries=0)
    assert ok.messages.create(model="x", max_tokens=1, messages=[{"role": "user", "content": "hi"}]).usage.output_tokens == 1
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=keyed_server.url, api_key="bad", max_retries=0).messages.create(
            model="x", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "authentication_error"


# Fields of the wrong type inside nested objects of /v1/messages and /v1/responses (found by
# tests/fuzz/fuzz_http.cpp): each was a 500 ("type_error.302") and is a 400 naming the field.
MSG_OK = {"role": "user", "content": "hi"}
NESTED_TYPE_CASES = [
    ("/v1/messages", {"max_tokens": 2, "messages": [{"role": 5, "content": "x"}]}, "messages[0].role"),
    ("/v1/messages", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]},
     "messages[0].content[0].is_error"),
    ("/v1/messages", {"max_tokens": 2, "system": [{"type": 7, "text": "s"}], "messages": [MSG_OK]}, "system[0].type"),
    ("/v1/messages", {"max_tokens": 2, "messages": [MSG_OK], "tools": [{"name": "f"}],
                      "tool_choice": {"type": "auto", "disable_parallel_tool_use": 1}},
     "tool_choice.disable_parallel_tool_use"),
    ("/v1/messages/count_tokens", {"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    ("/v1/responses", {"input": [{"type": ["message"], "role": "user", "content": "x"}]}, "input[0].type"),
    ("/v1/responses", {"input": [{"type": "message", "role": False, "content": "x"}]}, "input[0].role"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]}, "input[0].content[0].type"),
    ("/v1/responses", {"input": "x", "tools": [{"type": {}, "name": "f"}]}, "tools[0].type"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": 3, "schema": {}}}},
     "text.format.name"),
]


@pytest.mark.parametrize("path,body,param", NESTED_TYPE_CASES, ids=[c[2] for c in NESTED_TYPE_CASES])
def test_nested_field_wrong_type(server, path, body, param):
    r = requests.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    if path.startswith("/v1/responses"):
        assert e["param"] == param, e
    else:  # Anthropic's shape has no param: the message names it
        assert e["type"] == "invalid_request_error" and param in e["message"], e
