"""The API surface around chat: routes without /v1, model ids and aliases, n > 1, several prompts, echo,
prefill, chat-template flags, /props, /tokenize, /detokenize, /infill."""
import json

import pytest
import requests

MSG = [{"role": "user", "content": "Name three colors."}]


def test_routes_without_v1(server):
    assert requests.get(server.url + "/models", timeout=10).json()["data"][0]["id"] == server.model_id
    r = requests.post(server.url + "/chat/completions", json={"messages": MSG, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    r = requests.post(server.url + "/completions", json={"prompt": "a", "max_tokens": 1}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    assert requests.get(server.url + "/v1/health", timeout=10).json() == {"status": "ok"}
    r = requests.get(server.url + "/chat/completions", timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "POST"


def test_model_retrieve(client, server):
    m = client.models.retrieve(server.model_id)
    assert m.id == server.model_id and m.object == "model"
    # Not strict: any name is the one model.
    assert client.models.retrieve("gpt-4o").id == "gpt-4o"


def test_alias_and_strict(strict_server):
    import openai
    c = openai.OpenAI(base_url=strict_server.url + "/v1", api_key="none", max_retries=0)
    assert [m.id for m in c.models.list().data] == ["my-model"]
    for name in ("my-model", "gemma3-270m"):  # the alias, and the file stem it replaced
        r = c.completions.create(model=name, prompt="a", max_tokens=1)
        assert r.model == name
    assert c.models.retrieve("my-model").id == "my-model"


def test_chat_template_builtin_flag(strict_server):
    """--chat-template chatml replaces the model's own (Gemma) template."""
    msgs = [{"role": "user", "content": "hi"}]
    prompt = requests.post(strict_server.url + "/apply-template", json={"messages": msgs}, timeout=10).json()["prompt"]
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_file_flag(tmp_path):
    from conftest import start_server, stop_server
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                   "{% if add_generation_prompt %}[assistant] {% endif %}")
    s = start_server("--chat-template-file", str(tpl))
    try:
        msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
        r = requests.post(s.url + "/apply-template", json={"messages": msgs}, timeout=10)
        assert r.json()["prompt"] == "[system] S\n[user] hi\n[assistant] "
    finally:
        stop_server(s)


def test_prefill_continues_last_assistant(server):
    """A last assistant message is continued: the prompt ends with its text, not with an end of turn."""
    user = [{"role": "user", "content": "Count to five."}]
    base = requests.post(server.url + "/apply-template", json={"messages": user}, timeout=10).json()["prompt"]
    pre = requests.post(server.url + "/apply-template",
                        json={"messages": user + [{"role": "assistant", "content": "1, 2, 3,"}]}, timeout=10).json()
    assert pre["prompt"] == base + "1, 2, 3,"
    r = requests.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": user + [{"role": "assistant", "content": "1, 2, 3,"}], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200
    # The continuation is what a plain completion of the same prompt text gives.
    c = requests.post(server.url + "/v1/completions", timeout=60,
                      json={"prompt": pre["prompt"], "max_tokens": 4, "temperature": 0}).json()
    assert r.json()["choices"][0]["message"]["content"] == c["choices"][0]["text"]


def test_completions_several_prompts_n_echo(server):
    prompts = ["The capital of France is", "1, 2, 3,"]
    r = requests.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": prompts, "n": 2, "max_tokens": 4, "temperature": 0, "echo": True}).json()
    ch = r["choices"]
    assert [c["index"] for c in ch] == [0, 1, 2, 3]
    for i, c in enumerate(ch):
        assert c["text"].startswith(prompts[i // 2]) and len(c["text"]) > len(prompts[i // 2])
    assert r["usage"]["prompt_tokens"] == sum(  # once per prompt, not per choice
        len(requests.post(server.url + "/tokenize", json={"content": p, "add_special": True}, timeout=10).json()["tokens"])
        for p in prompts)
    assert r["usage"]["completion_tokens"] == 16


def test_completions_token_prompts_list(client, server):
    ids = requests.post(server.url + "/tokenize", json={"content": "The capital of France is", "add_special": True},
                        timeout=10).json()["tokens"]
    r = client.completions.create(model="x", prompt=[ids, ids], max_tokens=3, temperature=0)
    assert len(r.choices) == 2 and r.choices[0].text == r.choices[1].text


def test_chat_n_sampled(client, server):
    r = client.chat.completions.create(model=server.model_id, messages=MSG, max_tokens=16, temperature=1.0, seed=5, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1, texts  # each choice samples with its own seed
    again = client.chat.completions.create(model=server.model_id, messages=MSG, max_tokens=16, temperature=1.0, seed=5, n=3)
    assert [c.message.content for c in again.choices] == texts  # and a fixed seed reproduces them


def test_chat_n_stream(client, server):
    chunks = list(client.chat.completions.create(model=server.model_id, messages=MSG, max_tokens=6, temperature=0,
                                                 n=2, stream=True))
    texts, finish = {0: "", 1: ""}, {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert finish == {0: "length", 1: "length"}
    assert texts[0] and texts[1]  # (greedy choices batched together may differ at a near-tie of the tiny model)


def test_props(server):
    p = requests.get(server.url + "/props", timeout=10).json()
    assert p["total_slots"] == 4
    assert p["default_generation_settings"]["n_ctx"] == 1024
    assert "{%" in p["chat_template"] and p["model_path"].endswith(".gguf")
    assert p["modalities"] == {"vision": False, "audio": False}


def test_tokenize_detokenize(server):
    text = "Hello world, this is xpert."
    t = requests.post(server.url + "/tokenize", json={"content": text}, timeout=10).json()["tokens"]
    assert all(isinstance(i, int) for i in t) and len(t) > 3
    d = requests.post(server.url + "/detokenize", json={"tokens": t}, timeout=10).json()["content"]
    assert d == text
    p = requests.post(server.url + "/tokenize", json={"content": text, "with_pieces": True}, timeout=10).json()["tokens"]
    assert [x["id"] for x in p] == t and "".join(x["piece"] for x in p) == text
    bos = requests.post(server.url + "/tokenize", json={"content": text, "add_special": True}, timeout=10).json()["tokens"]
    assert bos[1:] == t and len(bos) == len(t) + 1  # Gemma adds BOS


def test_infill_needs_fim_tokens(server):
    """The small test model has no FIM tokens: a clear 400, not a prompt the model was not trained on."""
    r = requests.post(server.url + "/infill", json={"input_prefix": "def f(", "input_suffix": "):"}, timeout=10)
    assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]
    r = requests.post(server.url + "/infill", timeout=10, json={
        "input_prefix": "def f(", "input_suffix": "):", "input_extra": [{"filename": "a.py", "text": "x = 1\n"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_extra"


@pytest.fixture(scope="module")
def fim_server():
    """A code model with fill-in-the-middle tokens (Qwen2.5-Coder): the default model once it is that one."""
    import inspect

    import conftest
    from conftest import ROOT, start_server, stop_server
    for path in (ROOT / "models" / "default.gguf", ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"):
        if not path.exists():
            continue
        if "model" in inspect.signature(start_server).parameters:
            s = start_server(model=path)
        else:
            saved, conftest.MODEL = conftest.MODEL, path
            try:
                s = start_server()
            finally:
                conftest.MODEL = saved
        ids = requests.post(s.url + "/tokenize", json={"content": "<|fim_prefix|>"}, timeout=10).json()["tokens"]
        if len(ids) == 1:
            yield s
            stop_server(s)
            return
        stop_server(s)
    pytest.skip("no model with fill-in-the-middle tokens in models/")


def test_infill_and_suffix(fim_server):
    prefix, suffix = "def add(a, b):\n    return ", "\n\n\nprint(add(2, 3))\n"
    r = requests.post(fim_server.url + "/infill", timeout=120, json={
        "input_prefix": prefix, "input_suffix": suffix, "n_predict": 6, "temperature": 0}).json()
    assert "a + b" in r["content"], r
    assert r["tokens_predicted"] <= 6 and r["stop"] is True
    c = requests.post(fim_server.url + "/v1/completions", timeout=120, json={
        "prompt": prefix, "suffix": suffix, "max_tokens": 6, "temperature": 0}).json()
    assert c["choices"][0]["text"] == r["content"]


def test_infill_input_extra(fim_server):
    """Repository-level context: another file's definition reaches the completion (rendered with the model's
    <|repo_name|> / <|file_sep|> tokens)."""
    extra = [{"filename": "geometry/shapes.py",
              "text": "def zorblax_area(width, height):\n    return width * height\n"}]
    body = {"input_prefix": "from geometry.shapes import ", "input_suffix": "\n", "n_predict": 6, "temperature": 0}
    r = requests.post(fim_server.url + "/infill", timeout=120, json={**body, "input_extra": extra})
    assert r.status_code == 200, r.text
    assert r.json()["content"].startswith("zorblax_area"), r.json()
    bad = requests.post(fim_server.url + "/infill", timeout=120, json={**body, "input_extra": [{"filename": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_extra[0]"


def test_completions_echo_with_logprobs(server):
    """echo with logprobs: the prompt's tokens come first, as OpenAI returns them (the first with no
    logprob), each scored after the tokens before it, then the generated ones."""
    url = server.url + "/v1/completions"
    ids = requests.post(server.url + "/tokenize", json={"content": "The capital of France is"}, timeout=30).json()["tokens"]
    gen = requests.post(url, timeout=60, json={"prompt": ids, "logprobs": 2, "max_tokens": 1, "temperature": 0}).json()
    next_lp = gen["choices"][0]["logprobs"]
    r = requests.post(url, timeout=60, json={"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 1,
                                             "temperature": 0}).json()
    lp = r["choices"][0]["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == n + 1 and r["choices"][0]["text"] == "".join(lp["tokens"])
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v < 0 for v in lp["token_logprobs"][1:]) and all(len(t) == 2 for t in lp["top_logprobs"][1:])
    assert lp["tokens"][n:] == next_lp["tokens"]
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][n] == len("".join(lp["tokens"][:n]))
    # The prompt's last token scored as a prompt token equals its logprob when it was generated.
    t_next = requests.post(server.url + "/tokenize", timeout=30, json={"content": next_lp["tokens"][0]}).json()["tokens"]
    assert len(t_next) == 1
    more = requests.post(url, timeout=60, json={"prompt": ids + t_next, "echo": True, "logprobs": 1, "max_tokens": 1,
                                                "temperature": 0}).json()
    assert abs(more["choices"][0]["logprobs"]["token_logprobs"][n] - next_lp["token_logprobs"][0]) < 1e-3
    # Streamed: the echo chunk carries the prompt's logprobs.
    with requests.post(url, stream=True, timeout=60, json={"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1,
                                                           "temperature": 0, "stream": True}) as s:
        first = next(json.loads(l[6:]) for l in s.iter_lines(decode_unicode=True) if l.startswith("data: {"))
    assert first["choices"][0]["logprobs"]["tokens"] == lp["tokens"][:n]
