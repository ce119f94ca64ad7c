"""A real `xpert serve` on the small test model (Gemma 3 270M, models/gemma3-270m.gguf), started once per
session on a free port; tests that need an instruct model (tool calls) start their own on the default
model (Qwen2.5-Coder-1.5B-Instruct, models/default.gguf): start_server(model=DEFAULT_MODEL, ...).

XPERT_BIN overrides the binary (default build/xpert). The server runs with --parallel 4 and a small
queue so the capacity tests stay quick on two cores.
"""
import os
import pathlib
import socket
import subprocess
import time

import pytest
import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
XPERT = pathlib.Path(os.environ.get("XPERT_BIN", ROOT / "build" / "xpert"))
if not XPERT.is_absolute():
    XPERT = ROOT / XPERT
MODEL = ROOT / "models" / "gemma3-270m.gguf"
DEFAULT_MODEL = ROOT / "models" / "default.gguf"
PARALLEL = 4
CTX = 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc, port, model_id):
        self.proc, self.port, self.model_id = proc, port, model_id
        self.url = f"http://127.0.0.1:{port}"

    def metrics(self):
        out = {}
        for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def start_server(*extra, port=None, model=MODEL, parallel=PARALLEL, ctx=CTX):
    if not XPERT.exists():
        pytest.fail(f"{XPERT} is missing: build first (make build), or set XPERT_BIN")
    if not model.exists():
        pytest.fail(f"{model} is missing: run scripts/setup.sh")
    port = port or free_port()
    # XPERT_SERVER_LOG=path keeps the server's log (stderr); by default it is dropped.
    log = open(os.environ.get("XPERT_SERVER_LOG", os.devnull), "a")
    proc = subprocess.Popen([str(XPERT), "serve", "-m", str(model), "--port", str(port), "--parallel", str(parallel),
                             "-c", str(ctx), *map(str, extra)], stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"xpert serve exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return Server(proc, port, model.stem)
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail("xpert serve did not become healthy in 120 s")


def stop_server(server):
    server.proc.terminate()
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        pytest.fail("xpert serve did not stop on SIGTERM within 20 s")


@pytest.fixture(scope="session")
def server():
    s = start_server("--queue", "64", "--max-body", "65536")
    yield s
    assert s.proc.poll() is None, "the server died during the tests"
    stop_server(s)


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def strict_server():
    """--strict-model with --alias and a built-in template other than the model's."""
    s = start_server("--strict-model", "--alias", "my-model", "--chat-template", "chatml")
    yield s
    stop_server(s)
