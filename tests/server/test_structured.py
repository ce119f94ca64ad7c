# Structured output against a real `xpert serve` on the small model (models/gemma3-270m.gguf, else
# models/default.gguf): response_format json_schema / json_object, grammar (GBNF), logit_bias, and the
# 400s naming each field. Every json_schema answer, over many seeds at temperature 1, validates.
import concurrent.futures
import json
import os
import pathlib
import socket
import subprocess
import time

import jsonschema
import pytest
import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
XPERT = pathlib.Path(os.environ.get("XPERT_BIN", ROOT / "build" / "xpert"))
if not XPERT.is_absolute():
    XPERT = ROOT / XPERT
SMALL = ROOT / "models" / "gemma3-270m.gguf"
MODEL = SMALL if SMALL.exists() else ROOT / "models" / "default.gguf"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "joined": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["name", "age", "role", "active", "joined"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def url():
    if not XPERT.exists():
        pytest.fail(f"{XPERT} is missing: build first, or set XPERT_BIN")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.environ.get("XPERT_SERVER_LOG", os.devnull), "a")
    proc = subprocess.Popen([str(XPERT), "serve", "-m", str(MODEL), "--port", str(port), "--parallel", "4",
                             "-c", "1024"], stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, "xpert serve exited"
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.time() < deadline, "xpert serve did not become healthy"
        time.sleep(0.1)
    yield base
    proc.terminate()
    proc.wait(timeout=20)


def chat(url, **body):
    body.setdefault("messages", [{"role": "user", "content": "Describe a user of our site as JSON."}])
    return requests.post(url + "/v1/chat/completions", json=body, timeout=300)


def complete(url, **body):
    return requests.post(url + "/v1/completions", json=body, timeout=300)


def test_json_schema_answers_validate_over_many_seeds(url):
    validator = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    rf = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # the server's 4 slots decode them together
        answers = list(pool.map(lambda seed: chat(url, response_format=rf, temperature=1.0, seed=seed,
                                                  max_tokens=200), range(8)))
    for r in answers:
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        assert choice["finish_reason"] == "stop", text
        value = json.loads(text)
        assert not [e.message for e in validator.iter_errors(value)], text


def test_json_schema_streamed_and_on_completions(url):
    rf = {"type": "json_schema", "json_schema": {"name": "pair", "schema": {
        "type": "array", "prefixItems": [{"type": "integer", "minimum": 1, "maximum": 9}, {"type": "boolean"}],
        "items": False, "minItems": 2}}}
    r = requests.post(url + "/v1/chat/completions", stream=True, timeout=300, json={
        "messages": [{"role": "user", "content": "A pair please."}], "response_format": rf, "stream": True,
        "temperature": 1.0, "seed": 3, "max_tokens": 40})
    assert r.status_code == 200
    text = ""
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            for c in json.loads(line[6:])["choices"]:
                text += c["delta"].get("content") or ""
    value = json.loads(text)
    assert isinstance(value, list) and 1 <= value[0] <= 9 and isinstance(value[1], bool), text
    r = complete(url, prompt="Numbers:", response_format=rf, temperature=1.0, seed=4, max_tokens=40)
    assert r.status_code == 200, r.text
    value = json.loads(r.json()["choices"][0]["text"])
    assert isinstance(value, list) and len(value) == 2


def test_json_object(url):
    r = complete(url, prompt='A JSON object: {"a": 1, "b": "x"}\nAnother one: ', temperature=0,
                 response_format={"type": "json_object"}, max_tokens=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["text"]
    assert text.startswith("{"), text
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_grammar_field(url, endpoint):
    g = 'root ::= ("yes" | "no") " " [0-9]{2}'
    seen = set()
    for seed in range(4):
        if endpoint == "chat":
            r = chat(url, grammar=g, temperature=1.0, seed=seed, max_tokens=20)
            text = r.json()["choices"][0]["message"]["content"]
        else:
            r = complete(url, prompt="Answer:", grammar=g, temperature=1.0, seed=seed, max_tokens=20)
            text = r.json()["choices"][0]["text"]
        assert r.status_code == 200
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        word, num = text.split(" ")
        assert word in ("yes", "no") and len(num) == 2 and num.isdigit(), text
        seen.add(text)
    assert len(seen) > 1


def test_logit_bias_bans_and_forces(url):
    body = dict(prompt="The capital of France is", temperature=0, max_tokens=4, logprobs=0)
    first = complete(url, **body).json()["choices"][0]["logprobs"]["tokens"][0]
    out = subprocess.run([str(XPERT), "tokenize", "-m", str(MODEL), "-p", first, "--no-bos"], capture_output=True,
                         timeout=60)
    ids = json.loads(out.stdout)
    assert len(ids) == 1, (first, ids)
    r = complete(url, **body, logit_bias={str(ids[0]): -100})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"]["tokens"][0] != first
    forced = complete(url, prompt="Hello", temperature=0.8, seed=1, max_tokens=3, logit_bias={str(ids[0]): 100},
                      logprobs=0).json()["choices"][0]["logprobs"]["tokens"]
    assert forced == [first] * 3


@pytest.mark.parametrize("body, param, words", [
    ({"grammar": "root ::= undefined_rule"}, "grammar", "never defined"),
    ({"grammar": 7}, "grammar", "string"),
    ({"response_format": {"type": "xml"}}, "response_format", "xml"),
    ({"response_format": "json"}, "response_format", "object"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}}}}, "response_format",
     "multipleOf"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(?=x)"}}}},
     "response_format", "pattern"),
    ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "grammar", "both"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "between -100 and 100"),
    ({"logit_bias": {"5": "x"}}, "logit_bias", "number"),
    ({"logit_bias": {"999999999": -100}}, "logit_bias", "out of range"),
    ({"logit_bias": [1, 2]}, "logit_bias", "pairs"),
])
def test_malformed_fields_are_400_naming_the_field(url, body, param, words):
    for send in (chat, complete):
        extra = {} if send is chat else {"prompt": "x"}
        r = send(url, **body, **extra, max_tokens=2)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and words in err["message"], err
