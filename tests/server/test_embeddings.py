"""/v1/embeddings through the official openai client, and its numbers against a plain reference: with
last-token pooling the embedding is the normed hidden state the output head reads, so the model's
logits (from /v1/completions' logprobs) must be a positive multiple of the head's rows (dequantized here
with the gguf package) times the embedding."""
import math

import numpy as np
import pytest
import requests

from conftest import MODEL, start_server, stop_server


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def test_embeddings_openai_client(client, server):
    n_embd = requests.get(server.url + "/v1/models", timeout=10).json()["data"][0]["meta"]["n_embd"]
    texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Quarterly revenue grew by 4 percent."]
    r = client.embeddings.create(model="text-embedding-3-small", input=texts)  # the client asks for base64
    assert r.object == "list" and r.model == "text-embedding-3-small"
    assert [d.index for d in r.data] == [0, 1, 2]
    vs = [d.embedding for d in r.data]
    assert all(len(v) == n_embd for v in vs)
    assert all(abs(norm(v) - 1.0) < 1e-4 for v in vs)
    assert r.usage.prompt_tokens > 10 and r.usage.total_tokens == r.usage.prompt_tokens
    # A batch gives what one input at a time gives.
    one = client.embeddings.create(model="x", input=texts[1]).data[0].embedding
    assert np.allclose(one, vs[1], atol=1e-5)
    # Floats and base64 agree.
    f = requests.post(server.url + "/v1/embeddings", json={"input": texts[1], "encoding_format": "float"},
                      timeout=60).json()["data"][0]["embedding"]
    assert np.allclose(f, vs[1], atol=1e-6)


def test_embeddings_token_input(server):
    text = "The cat sat on the mat."
    ids = requests.post(server.url + "/tokenize", json={"content": text, "add_special": True}, timeout=10).json()["tokens"]
    a = requests.post(server.url + "/v1/embeddings", json={"input": text, "encoding_format": "float"}, timeout=60).json()
    b = requests.post(server.url + "/v1/embeddings", json={"input": [ids, ids[:3]], "encoding_format": "float"},
                      timeout=60).json()
    assert np.allclose(a["data"][0]["embedding"], b["data"][0]["embedding"], atol=1e-6)
    assert not np.allclose(b["data"][0]["embedding"], b["data"][1]["embedding"], atol=1e-3)
    assert b["usage"]["prompt_tokens"] == len(ids) + 3


@pytest.fixture(scope="module")
def last_pooling_server():
    # -b 8: the prompt goes through the embedding slot in several chunks. The order checked below has a
    # near-tie on this prompt (the check compares a float reference with the Q8_0-activation head): a prompt
    # with clear margins would be sturdier. (It once needed --no-batch-invariant; since the CPU kernels share
    # one float order per row, that flag changes no kernel.)
    s = start_server("--pooling", "last", "-b", "8")
    yield s
    stop_server(s)


def test_last_pooling_matches_output_head(last_pooling_server):
    import gguf
    s = last_pooling_server
    prompt = "The quick brown fox jumps over the lazy dog. The capital of France is"
    e = np.array(requests.post(s.url + "/v1/embeddings", json={"input": prompt, "encoding_format": "float"},
                               timeout=60).json()["data"][0]["embedding"])
    c = requests.post(s.url + "/v1/completions", timeout=60,
                      json={"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 5}).json()
    top = c["choices"][0]["logprobs"]["top_logprobs"][0]  # piece -> logprob, best first
    pieces, lps = list(top), np.array(list(top.values()))
    ids = [requests.post(s.url + "/tokenize", json={"content": p, "parse_special": False}, timeout=10).json()["tokens"]
           for p in pieces]
    keep = [i for i, t in enumerate(ids) if len(t) == 1]  # pieces that tokenize back to one id
    assert len(keep) >= 3
    # The tied output head (token_embd), dequantized row by row: a plain numpy reference.
    reader = gguf.GGUFReader(str(MODEL))
    head = next(t for t in reader.tensors if t.name == "output.weight") if any(
        t.name == "output.weight" for t in reader.tensors) else next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = np.array([ids[i][0] for i in keep])
    w = gguf.quants.dequantize(np.asarray(head.data[rows]), head.tensor_type).reshape(len(rows), -1)
    dots = w @ e
    lp = lps[keep]
    # The logits are a positive multiple of the dot products plus a constant (log-softmax's): fit both
    # and check every token to within what the server's quantized head product rounds (a wrong vector
    # misses by nats). Near-tied tokens make pairwise ratios meaningless, so no ratios.
    s, b = np.polyfit(dots, lp, 1)
    assert s > 0
    assert np.max(np.abs(s * dots + b - lp)) < 0.15, (dots, lp, s, b)
