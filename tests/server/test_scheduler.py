"""The engine's scheduler seen from the API: time to first token and between tokens in /metrics, and
--batch-tokens sharing a step's prompt tokens so that a long prompt does not hold back a short one."""
import threading
import time

import requests

from conftest import start_server, stop_server


def _summary(m, name):
    return m[name + '{quantile="0.5"}'], m[name + '{quantile="0.9"}'], m[name + "_count"], m[name + "_sum"]


def test_metrics_latency_quantiles(server):
    ttft_before = server.metrics()["xpert_time_to_first_token_seconds_count"]
    itl_before = server.metrics()["xpert_inter_token_latency_seconds_count"]
    r = requests.post(server.url + "/v1/completions", timeout=60,
                      json={"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    n = r.json()["usage"]["completion_tokens"]
    m = server.metrics()
    p50, p90, count, total = _summary(m, "xpert_time_to_first_token_seconds")
    assert count == ttft_before + 1
    assert 0 < p50 <= p90 and total > 0
    p50, p90, count, total = _summary(m, "xpert_inter_token_latency_seconds")
    assert count == itl_before + n - 1  # one gap between each two tokens of the request
    assert 0 < p50 <= p90 and total > 0
    text = requests.get(server.url + "/metrics", timeout=10).text
    assert "# TYPE xpert_time_to_first_token_seconds summary" in text
    assert "# TYPE xpert_inter_token_latency_seconds summary" in text


def _first_chunk_at(server, prompt, out, key):
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True}
    with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                out[key] = time.monotonic()
                break
        for _ in r.iter_lines():
            pass


def test_short_prompt_is_not_stalled_by_a_long_one():
    """Prompt chunks of 16, 24 tokens a step: the long prompt (~60 steps alone) is sent first, the short one
    right after; sharing the step, the short one's first token arrives first (with one prompt a step, as
    before --batch-tokens, it came only after the long prompt's)."""
    s = start_server("-b", "16", "--batch-tokens", "24", parallel=2)
    try:
        got = {}
        long_prompt = " ".join(f"word{i}" for i in range(200))
        t = threading.Thread(target=_first_chunk_at, args=(s, long_prompt, got, "long"))
        t.start()
        deadline = time.time() + 30
        while time.time() < deadline and s.metrics()["xpert_busy_slots"] < 1:
            time.sleep(0.01)
        _first_chunk_at(s, "Hello", got, "short")
        t.join()
        assert got["short"] < got["long"]
    finally:
        stop_server(s)


def test_batch_tokens_bad_value(server):
    import subprocess
    from conftest import XPERT, MODEL
    r = subprocess.run([str(XPERT), "serve", "-m", str(MODEL), "--batch-tokens", "0"], capture_output=True, timeout=60)
    assert r.returncode != 0 and b"--batch-tokens" in r.stderr
