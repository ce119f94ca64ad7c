"""reasoning_content, reasoning_format and chat_template_kwargs end to end: a tiny random-weight Qwen3
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
