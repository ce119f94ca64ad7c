"""The state cache through the API (docs/ARCHITECTURE.md, "State cache"): with one slot, a conversation's
next turn evaluates only what follows the prompt and reply it already holds, also when other
conversations used the slot in between; usage.prompt_tokens_details.cached_tokens and /metrics say so.

On the default model (dense) the expected count is derived from the tokenization: the previous prompt's
ids (`xpert tokenize` of the prompt /apply-template renders, as the server tokenizes it) followed by the
reply tokens fed back (all but the last when it stopped at max_tokens), against the new prompt's ids.
On the tiny hybrid fixture prompts are token ids, and a conversation's next prompt adds ids to the
previous prompt (not the reply): it resumes from the checkpoint just before the previous prompt's end.
"""
import json
import os
import pathlib
import subprocess
import time

import pytest
import requests

from conftest import MODEL, XPERT, Server, free_port, stop_server

ROOT = pathlib.Path(__file__).resolve().parents[2]
HYBRID = ROOT / "tests" / "reference" / "fixtures" / "tiny_qwen35moe.gguf"


def launch(model, *args):
    if not XPERT.exists():
        pytest.fail(f"{XPERT} is missing: build first (make build), or set XPERT_BIN")
    if not pathlib.Path(model).exists():
        pytest.fail(f"{model} is missing: run scripts/setup.sh")
    port = free_port()
    log = open(os.environ.get("XPERT_SERVER_LOG", os.devnull), "a")
    proc = subprocess.Popen([str(XPERT), "serve", "-m", str(model), "--port", str(port), "-t", "2", *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"xpert serve exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return Server(proc, port, pathlib.Path(model).stem)
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail("xpert serve did not become healthy in 120 s")


@pytest.fixture(scope="module")
def dense():
    s = launch(MODEL, "--parallel", 1, "-c", 1024)
    yield s
    assert s.proc.poll() is None, "the server died during the tests"
    stop_server(s)


@pytest.fixture(scope="module")
def dense_small():
    s = launch(MODEL, "--parallel", 1, "-c", 192)
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def hybrid():
    s = launch(HYBRID, "--parallel", 1, "-c", 256, "--checkpoint-every", 16, "--cache-ram", 64)
    yield s
    assert s.proc.poll() is None, "the server died during the tests"
    stop_server(s)


@pytest.fixture(scope="module")
def hybrid_off():
    s = launch(HYBRID, "--parallel", 1, "-c", 256, "--cache-ram", 0)
    yield s
    stop_server(s)


def tokenize(server, messages):
    """[[id, piece], ...] of the prompt the server makes of `messages`."""
    text = requests.post(server.url + "/apply-template", json={"messages": messages}, timeout=30).json()["prompt"]
    out = subprocess.run([str(XPERT), "tokenize", "-m", str(MODEL), "-p", text, "--no-bos", "--pieces"],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def chat(server, messages, stream, max_tokens=8):
    """content, usage, finish_reason, reply pieces (one per generated token)."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 0}
    if not stream:
        r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        j = r.json()
        c = j["choices"][0]
        return c["message"]["content"], j["usage"], c["finish_reason"], [t["token"] for t in c["logprobs"]["content"]]
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300, stream=True)
    assert r.status_code == 200, r.text
    text, pieces, usage, finish = "", [], None, None
    for line in r.iter_lines():
        if not line.startswith(b"data: {"):
            continue
        j = json.loads(line[6:])
        if j.get("usage"):
            usage = j["usage"]
        for c in j["choices"]:
            text += c["delta"].get("content") or ""
            pieces += [t["token"] for t in ((c.get("logprobs") or {}).get("content") or [])]
            finish = c["finish_reason"] or finish
    return text, usage, finish, pieces


class Conversation:
    """A chat whose next turn knows how many of its prompt tokens the server should have cached."""

    def __init__(self, server, first):
        self.server, self.messages = server, [{"role": "user", "content": first}]
        self.held = None  # (prompt ids, reply pieces fed back): what the slot held after the last turn

    def expected_cached(self, ids):
        if self.held is None:
            return None
        prev, fed = self.held
        n, limit = 0, len(ids) - 1  # the last prompt token is always evaluated, for its logits
        while n < min(len(prev), limit) and prev[n][0] == ids[n][0]:
            n += 1
        if n == len(prev):
            for piece in fed:
                if n >= limit or ids[n][1] != piece:
                    break
                n += 1
        return n

    def turn(self, stream, next_user=None, max_tokens=8):
        ids = tokenize(self.server, self.messages)
        want = self.expected_cached(ids)
        before = self.server.metrics()
        text, usage, finish, pieces = chat(self.server, self.messages, stream, max_tokens)
        after = self.server.metrics()
        assert usage["prompt_tokens"] == len(ids)
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        if want is not None:
            assert cached == want, (self.messages, cached, want)
            assert want >= len(self.held[0]), "the whole previous prompt should be reused"
        evaluated = after["xpert_prompt_tokens_evaluated_total"] - before["xpert_prompt_tokens_evaluated_total"]
        assert evaluated == usage["prompt_tokens"] - cached
        assert after["xpert_prompt_tokens_cached_total"] - before["xpert_prompt_tokens_cached_total"] == cached
        n_fed = usage["completion_tokens"] - (1 if finish == "length" else 0)
        self.held = (ids, pieces[:n_fed])
        self.messages.append({"role": "assistant", "content": text})
        if next_user:
            self.messages.append({"role": "user", "content": next_user})
        return usage, finish


def test_five_turn_chat_evaluates_only_new_tokens(dense):
    users = ["Hi! Please answer briefly.", "What is the capital of France?", "And of Spain?", "Name a fruit.",
             "Thank you!"]
    conv = Conversation(dense, users[0])
    for i in range(5):
        usage, _ = conv.turn(stream=i % 2 == 1, next_user=users[i + 1] if i < 4 else None)
        if i > 0:
            assert 0 < usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]


def test_three_interleaved_conversations_each_resume(dense):
    convs = [Conversation(dense, f"Tell me about {topic}.") for topic in ("cats", "the sea", "mountains")]
    follow = ["Why?", "Say more.", "Give an example."]
    for turn in range(3):
        for k, c in enumerate(convs):
            usage, _ = c.turn(stream=(turn + k) % 2 == 1, next_user=follow[(turn + k) % 3], max_tokens=6)
            if turn > 0:
                assert usage["prompt_tokens_details"]["cached_tokens"] > usage["prompt_tokens"] // 2


def test_conversation_that_fills_the_context(dense_small):
    """The turn that reaches the context ends with "length", the next one is refused with a clear
    error, and the server keeps serving from the cache."""
    other = Conversation(dense_small, "Say hello.")
    other.turn(stream=False, next_user="Again, please.", max_tokens=4)
    conv = Conversation(dense_small, "Write a very long story about a dragon, with many details.")
    for _ in range(4):
        usage, finish = conv.turn(stream=False, max_tokens=1000)
        if finish == "length":
            break
        conv.messages.append({"role": "user", "content": "Continue the story, at length."})
    assert finish == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 192 + 1  # one more generated than fits
    conv.messages.append({"role": "user", "content": "Go on."})
    r = requests.post(dense_small.url + "/v1/chat/completions", timeout=60,
                      json={"messages": conv.messages, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    other.turn(stream=True, max_tokens=4)  # resumes from its own cached prompt and reply
    # The last prompt that fitted again: all of it but the last token comes from the cache.
    conv.messages = conv.messages[:-2]
    _, usage, _, _ = chat(dense_small, conv.messages, stream=False, max_tokens=2)
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


def complete(server, prompt, max_tokens=4, stream=False):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        r = requests.post(server.url + "/v1/completions", json=body, timeout=120, stream=True)
        usage = None
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
        return usage
    r = requests.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def ids(seed, n):
    return [1] + [3 + (k * 37 + seed * 101) % 370 for k in range(n - 1)]


def test_hybrid_identical_prompt_resumes_before_its_end(hybrid):
    p = ids(1, 40)
    complete(hybrid, p)
    for stream in (False, True):
        u = complete(hybrid, p, stream=stream)
        assert u["prompt_tokens_details"]["cached_tokens"] == len(p) - 1


def test_hybrid_interleaved_conversations_resume_from_their_checkpoints(hybrid):
    before = hybrid.metrics()
    prompts = [ids(10 + c, 20 + 5 * c) for c in range(3)]
    for turn in range(3):
        for c in range(3):
            u = complete(hybrid, prompts[c], max_tokens=3, stream=(turn + c) % 2 == 1)
            want = 0 if turn == 0 else len(prompts[c]) - 1 - 6
            assert u["prompt_tokens_details"]["cached_tokens"] == want, (turn, c)
            prompts[c] = prompts[c] + [200 + turn, 201 + c, 202, 203, 204, 205]
    m = hybrid.metrics()
    assert m["xpert_checkpoint_hits_total"] - before["xpert_checkpoint_hits_total"] == 6
    assert m["xpert_checkpoint_misses_total"] - before["xpert_checkpoint_misses_total"] == 3
    assert m["xpert_checkpoints_stored_total"] > before["xpert_checkpoints_stored_total"]
    assert m["xpert_cache_checkpoints"] > 0 and m["xpert_cache_tokens"] > 0
    assert 0 < m["xpert_cache_bytes"] <= m["xpert_cache_budget_bytes"] == 64 << 20
    assert m["xpert_prompt_tokens_total"] == m["xpert_prompt_tokens_cached_total"] + m["xpert_prompt_tokens_evaluated_total"]


def test_hybrid_cache_off(hybrid_off):
    p = ids(3, 30)
    complete(hybrid_off, p)
    q = ids(4, 30)
    complete(hybrid_off, q)
    assert complete(hybrid_off, p + [7, 8])["prompt_tokens_details"]["cached_tokens"] == 0
    m = hybrid_off.metrics()
    assert m["xpert_cache_bytes"] == 0 and m["xpert_cache_budget_bytes"] == 0
    assert m["xpert_checkpoint_hits_total"] == 0 and m["xpert_checkpoint_misses_total"] == 3
