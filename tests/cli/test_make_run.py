"""README's first command, as a newcomer runs it: `make run` on the tree `make test` has built.

It must find everything installed, configure the release preset over the same build without rebuilding
anything (the ci preset builds what release builds, with warnings as errors), serve the default model,
answer a chat request, and stop cleanly on Ctrl-C (SIGINT to the terminal's process group).
"""
import os
import pathlib
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]

BUILD = ROOT / "build"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(not (BUILD / "CMakeCache.txt").exists(), reason="no build/ tree: `make test` builds it first")
def test_make_run_serves_the_default_model_and_stops_on_ctrl_c():
    port = free_port()
    proc = subprocess.Popen(["make", "--no-print-directory", "run", f"PORT={port}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, "make run exited early:\n" + "".join(lines[-40:])
            assert time.time() < deadline, "make run did not serve within 300 s:\n" + "".join(lines[-40:])
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        rebuilt = [l for l in lines if "Building" in l or "Linking" in l]
        assert not rebuilt, "make run rebuilt the tree make test built:\n" + "".join(rebuilt[:10])

        r = requests.post(url + "/v1/chat/completions", timeout=120,
                          json={"messages": [{"role": "user", "content": "What is the capital of France?"}],
                                "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["choices"][0]["message"]["content"], body
        assert body["usage"]["completion_tokens"] >= 1

        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal that runs make
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    log = "".join(lines)
    assert "stopping" in log, log[-2000:]
    assert not port_open(port), "the server still listens after make run stopped"
    for bad in ("xpert: error", "Segmentation", "Aborted", "terminate called"):
        assert bad not in log, log[-2000:]
