#!/usr/bin/env python3
"""Load test for a running `xpert serve`: N streaming chat clients at once, for N in --concurrency.

For each level it reports time to first token (TTFT: request sent -> first content chunk), inter-token
latency (ITL: gaps between content chunks of one stream), and aggregate generated tokens per second
(sum of completion_tokens / wall time of the level), as a markdown table.

    build/xpert serve -m models/default.gguf --parallel 4 &
    python3 bench/load.py --url http://127.0.0.1:8080 --concurrency 1 4 16 --max-tokens 64
"""
import argparse
import json
import statistics
import threading
import time

import requests

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List some uses of copper and why.",
    "Describe the water cycle to a child.",
]


def one_stream(url, headers, i, max_tokens, out):
    body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "max_tokens": max_tokens,
            "temperature": 0.8, "seed": i, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps, usage = [], None
    with requests.post(url + "/v1/chat/completions", json=body, headers=headers, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("usage"):
                usage = j["usage"]
            if j["choices"] and j["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    out[i] = (t0, stamps, usage)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_level(url, headers, n, max_tokens):
    out = [None] * n
    threads = [threading.Thread(target=one_stream, args=(url, headers, i, max_tokens, out)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [s[0] - t for t, s, _ in out if s]
    itl = [b - a for _, s, _ in out for a, b in zip(s, s[1:])]
    tokens = sum(u["completion_tokens"] for _, _, u in out if u)
    return {"n": n, "wall": wall, "tokens": tokens, "tps": tokens / wall, "ttft_p50": statistics.median(ttft),
            "ttft_p90": pct(ttft, 90), "itl_p50": statistics.median(itl) if itl else float("nan"), "itl_p90": pct(itl, 90),
            "per_stream_tps": statistics.mean(len(s) / (s[-1] - t) for t, s, _ in out if s)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    models = requests.get(a.url + "/v1/models", headers=headers, timeout=30).json()["data"][0]
    run_level(a.url, headers, 1, 4)  # warm-up
    print(f"model {models['id']}, {models.get('meta', {}).get('n_parallel', '?')} slots, max_tokens {a.max_tokens}\n")
    print("| clients | tokens | wall s | aggregate tok/s | per-stream tok/s | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.concurrency:
        r = run_level(a.url, headers, n, a.max_tokens)
        print(f"| {n} | {r['tokens']} | {r['wall']:.1f} | {r['tps']:.1f} | {r['per_stream_tps']:.1f} | {r['ttft_p50'] * 1e3:.0f} | "
              f"{r['ttft_p90'] * 1e3:.0f} | {r['itl_p50'] * 1e3:.1f} | {r['itl_p90'] * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
