#!/usr/bin/env python3
"""A bounded soak of `xpert serve`: many clients for a fixed time, mixing streaming, non-streaming,
clients that disconnect mid-answer and slow clients that trickle their headers, while the server's RSS is
sampled. Passes when no request failed unexpectedly, no slot is left busy and RSS stayed flat (the last
third's peak within --rss-slack MiB of the first third's).

  python3 bench/soak.py [--bin build/xpert] [--model models/default.gguf] [--seconds 120] [--clients 16]
                        [--cache-ram 0]
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

import requests


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def metric(url, name):
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return float("nan")


PROMPTS = ["Write a haiku about the sea.", "List three prime numbers.", "Explain what a hash table is.",
           "Say hello in French.", "What is 17 * 23?"]


def client(url, port, stop, counts, lock, seed):
    rng = random.Random(seed)
    while not stop.is_set():
        kind = rng.choice(["stream", "plain", "disconnect", "slow"])
        body = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
                "max_tokens": rng.randint(4, 48), "temperature": 0.7, "seed": rng.randint(0, 1 << 30)}
        ok = True
        try:
            if kind == "plain":
                r = requests.post(url + "/v1/chat/completions", json=body, timeout=300)
                ok = r.status_code in (200, 503)
            elif kind == "stream":
                body["stream"] = True
                with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=300) as r:
                    lines = [l for l in r.iter_lines() if l.startswith(b"data: ")]
                    ok = r.status_code == 503 or (r.status_code == 200 and lines and lines[-1] == b"data: [DONE]")
            elif kind == "disconnect":
                body["stream"] = rng.random() < 0.5
                raw = json.dumps(body).encode()
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                              b"application/json\r\nContent-Length: %d\r\n\r\n" % len(raw) + raw)
                    time.sleep(rng.random() * 0.5)
            else:  # a client trickling its headers, then leaving
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\n")
                    for _ in range(3):
                        time.sleep(0.3)
                        s.sendall(b"X-Slow: 1\r\n")
        except (requests.RequestException, OSError):
            ok = kind in ("disconnect", "slow")
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
            if not ok:
                counts["errors"] = counts.get("errors", 0) + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/xpert")
    ap.add_argument("--model", default="models/default.gguf")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--cache-ram", default="0", help="the server's --cache-ram (0: off, so RSS shows leaks, not the "
                    "state cache filling)")
    ap.add_argument("--rss-slack", type=float, default=64, help="MiB the late RSS peak may exceed the early one")
    a = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([a.bin, "serve", "-m", a.model, "--port", str(port), "--parallel", str(a.parallel),
                             "-c", "2048", "--queue", "32", "--cache-ram", a.cache_ram], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        stop, lock, counts = threading.Event(), threading.Lock(), {}
        threads = [threading.Thread(target=client, args=(url, port, stop, counts, lock, i)) for i in range(a.clients)]
        for t in threads:
            t.start()
        samples, t0 = [], time.time()
        while time.time() - t0 < a.seconds:
            samples.append(rss_mib(proc.pid))
            time.sleep(1)
        stop.set()
        for t in threads:
            t.join()
        settle = time.time() + 30
        while metric(url, "xpert_busy_slots") > 0 and time.time() < settle:
            time.sleep(0.2)
        busy, generated = metric(url, "xpert_busy_slots"), metric(url, "xpert_generated_tokens_total")
        third = max(1, len(samples) // 3)
        early, late = max(samples[:third]), max(samples[-third:])
        alive = proc.poll() is None
        ok = alive and busy == 0 and counts.get("errors", 0) == 0 and late - early <= a.rss_slack
        print(json.dumps({"seconds": a.seconds, "clients": a.clients, "requests": counts, "busy_slots_after": busy,
                          "generated_tokens": generated, "rss_mib": {"start": round(samples[0], 1),
                          "early_peak": round(early, 1), "late_peak": round(late, 1), "max": round(max(samples), 1)},
                          "server_alive": alive, "pass": ok}, indent=1))
        return 0 if ok else 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
