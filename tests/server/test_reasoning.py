"""reasoning_content, reasoning_format and chat_template_kwargs end to end, and reasoning in the Messages
(thinking blocks) and Responses (reasoning items) APIs: a tiny random-weight Qwen3
model given Qwen3.5's template (which opens a <think> span at the end of the prompt unless
enable_thinking is false), so everything the model generates is reasoning unless the request says
otherwise. Quick: a 170 KB model."""
import subprocess
import sys

import pytest
import requests

from conftest import ROOT, start_server, stop_server

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    model = tmp_path_factory.mktemp("think") / "tiny_qwen3_think.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template-file",
                    str(ROOT / "tests/reference/templates/Qwen3.5.jinja"),
                    str(ROOT / "tests/reference/fixtures/tiny_qwen3.gguf"), str(model)],
                   check=True, capture_output=True)
    s = start_server(model=model, parallel=1, ctx=256)
    yield s
    stop_server(s)


def chat(server, **kw):
    r = requests.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": MSGS, "max_tokens": 8, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def chat_stream(server, **kw):
    import json
    r = requests.post(server.url + "/v1/chat/completions", timeout=60, stream=True,
                      json={"messages": MSGS, "max_tokens": 8, "temperature": 0, "stream": True, **kw})
    content, reasoning = "", ""
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        for c in json.loads(line[6:])["choices"]:
            content += c["delta"].get("content") or ""
            reasoning += c["delta"].get("reasoning_content") or ""
    return content, reasoning


def test_think_span_is_reasoning_content(thinker):
    m = chat(thinker)
    assert m["reasoning_content"] and m["content"] == ""
    assert chat_stream(thinker) == ("", m["reasoning_content"])


def test_reasoning_format_none_keeps_it_in_content(thinker):
    split = chat(thinker)
    kept = chat(thinker, reasoning_format="none")
    assert "reasoning_content" not in kept
    assert kept["content"].strip() == split["reasoning_content"]
    assert chat_stream(thinker, reasoning_format="none")[0] == kept["content"]


def test_chat_template_kwargs_reach_the_template(thinker):
    # enable_thinking false: the template closes the span itself, so the answer is content.
    m = chat(thinker, chat_template_kwargs={"enable_thinking": False})
    assert m["content"] and "reasoning_content" not in m
    prompt = requests.post(thinker.url + "/apply-template", timeout=60,
                           json={"messages": MSGS, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert prompt["prompt"].endswith("<think>\n\n</think>\n\n")


# ---- Anthropic Messages: thinking ----

def sse_events(r):
    import json
    name = None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            yield name, json.loads(line[6:])


def test_messages_thinking_blocks(thinker):
    anthropic = pytest.importorskip("anthropic")
    claude = anthropic.Anthropic(base_url=thinker.url, api_key="none", max_retries=0, timeout=60)
    kw = dict(model="x", max_tokens=8, messages=MSGS, extra_body={"temperature": 0})
    m = claude.messages.create(thinking={"type": "enabled", "budget_tokens": 4}, **kw)
    # The template opened a <think> span: what the model wrote is a thinking block, not text.
    assert [b.type for b in m.content] == ["thinking"] and m.content[0].thinking
    assert m.content[0].thinking == chat(thinker)["reasoning_content"]
    with claude.messages.stream(thinking={"type": "enabled", "budget_tokens": 4}, **kw) as s:
        streamed = "".join(e.thinking for e in s if e.type == "thinking")
        final = s.get_final_message()
    assert streamed == m.content[0].thinking and final.content[0].thinking == streamed
    # Without thinking (Anthropic's default) the template closes the span: a text block.
    plain = claude.messages.create(**kw)
    assert [b.type for b in plain.content] == ["text"]
    assert plain.content[0].text == chat(thinker, chat_template_kwargs={"enable_thinking": False})["content"]
    # A thinking block handed back is the turn's reasoning, not its text.
    back = requests.post(thinker.url + "/v1/messages/count_tokens", timeout=60, json={"model": "x", "messages": [
        *MSGS, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                                 {"type": "text", "text": "ok"}]}, *MSGS]})
    assert back.status_code == 200, back.text


def test_messages_thinking_events(thinker):
    body = {"model": "x", "max_tokens": 6, "temperature": 0, "stream": True, "messages": MSGS,
            "thinking": {"type": "enabled", "budget_tokens": 2}}
    with requests.post(thinker.url + "/v1/messages", json=body, stream=True, timeout=60) as r:
        events = list(sse_events(r))
    start = [d for n, d in events if n == "content_block_start"]
    assert start[0]["content_block"]["type"] == "thinking"
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and deltas[-1] == "signature_delta"


@pytest.mark.parametrize("thinking,param", [
    ({"type": "enabled"}, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": 64}, "thinking.budget_tokens"),  # not below max_tokens
    ({"type": "sometimes"}, "thinking"),
])
def test_messages_bad_thinking(thinker, thinking, param):
    r = requests.post(thinker.url + "/v1/messages", timeout=60,
                      json={"model": "x", "max_tokens": 8, "messages": MSGS, "thinking": thinking})
    assert r.status_code == 400, r.text
    assert f"'{param}'" in r.json()["error"]["message"]  # Anthropic's error shape has no param


# ---- Responses: reasoning items ----

def test_responses_reasoning_items(thinker):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=thinker.url + "/v1", api_key="none", max_retries=0, timeout=60)
    kw = dict(model="x", input="hi", max_output_tokens=8, temperature=0)
    r = client.responses.create(reasoning={"effort": "high"}, **kw)
    assert [o.type for o in r.output] == ["reasoning", "message"] or [o.type for o in r.output] == ["reasoning"]
    text = r.output[0].content[0].text
    assert text and text == chat(thinker)["reasoning_content"] and r.output[0].summary == []
    assert r.reasoning.effort == "high" and r.usage.output_tokens_details.reasoning_tokens > 0
    deltas, done_items = "", []
    for e in client.responses.create(reasoning={"effort": "high"}, stream=True, **kw):
        if e.type == "response.reasoning_text.delta":
            deltas += e.delta
        elif e.type == "response.output_item.done":
            done_items.append(e.item)
    assert deltas == text and done_items[0].type == "reasoning" and done_items[0].content[0].text == text
    # effort "none": the template's thinking is off, so the answer is a message.
    off = client.responses.create(reasoning={"effort": "none"}, **kw)
    assert [o.type for o in off.output] == ["message"]
    assert off.output_text == chat(thinker, chat_template_kwargs={"enable_thinking": False})["content"]


# ---- constrained output from a thinking model ----

def test_grammar_constrains_only_the_answer(thinker):
    """The template opened a <think> span: response_format / grammar start after </think> (lazily), so
    the reasoning is what the model writes unconstrained; with thinking off they apply from the first
    token."""
    free = chat(thinker)["reasoning_content"]
    for kw in ({"grammar": 'root ::= "yes" | "no"'}, {"response_format": {"type": "json_object"}}):
        m = chat(thinker, **kw)
        assert m["reasoning_content"] == free and m["content"] == "", kw
    r = requests.post(thinker.url + "/v1/responses", timeout=60, json={
        "input": "hi", "max_output_tokens": 8, "temperature": 0, "text": {"format": {"type": "json_object"}}})
    assert r.json()["output"][0]["content"][0]["text"] == free
    off = chat(thinker, grammar='root ::= "yes" | "no"', chat_template_kwargs={"enable_thinking": False})
    assert off["content"] in ("yes", "no")
