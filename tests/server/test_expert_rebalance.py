"""Rebalancing experts while serving (issue #8, docs/ARCHITECTURE.md "Heterogeneous experts"):
`xpert serve --rebalance-experts N` moves experts between the GPU and the host every N forwarded tokens.
It needs a GPU layer that keeps experts on the host; elsewhere (the tiny MoE fixture on the CPU, or on a
GPU with every expert there) it is refused at start. /metrics always has the counters (0 when off). With
a GPU, a split synth model serves while it moves experts (skipped without one).
"""
import pathlib
import subprocess

import pytest
import requests

from conftest import XPERT, stop_server
from test_state_cache import complete, ids, launch

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOE = ROOT / "tests" / "reference" / "fixtures" / "tiny_qwen3moe.gguf"


def test_refused_without_split_layers():
    r = subprocess.run([str(XPERT), "serve", "-m", str(MOE), "--port", "0", "-t", "2", "--rebalance-experts", "64"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "--rebalance-experts" in r.stderr and "no GPU layer" in r.stderr, r.stderr


def test_counters_are_zero_when_off():
    s = launch(MOE, "--parallel", 1, "-c", 128, "--cache-ram", 0)
    try:
        complete(s, ids(5, 16), max_tokens=4)
        m = s.metrics()
        assert m["xpert_expert_moves_total"] == 0
        assert m["xpert_expert_rebalance_rounds_total"] == 0
        assert m["xpert_routed_tokens_total"] > 0
    finally:
        stop_server(s)


def has_gpu():
    r = subprocess.run([str(XPERT), "devices"], capture_output=True, text=True, timeout=60)
    return "cuda:0 " in r.stdout


@pytest.mark.skipif(not XPERT.exists() or not has_gpu(), reason="needs a CUDA GPU")
def test_moves_experts_while_serving_on_a_gpu(tmp_path):
    # tiny-qwen3moe: 2 layers of 8 experts, top-2; 2 of each layer's experts on the GPU, by index.
    model = tmp_path / "tiny-qwen3moe.gguf"
    subprocess.run([str(XPERT), "synth", "--preset", "tiny-qwen3moe", "--type", "Q4_K_M", "-o", str(model)],
                   check=True, capture_output=True, timeout=120)
    plain = launch(model, "--parallel", 1, "-c", 256, "--cache-ram", 0, "--expert-profile", "none")
    try:
        want = [requests.post(plain.url + "/v1/completions", timeout=120,
                              json={"prompt": ids(s, 24), "max_tokens": 16, "temperature": 0}).json()
                for s in range(4)]
    finally:
        stop_server(plain)
    s = launch(model, "--parallel", 1, "-c", 256, "--cache-ram", 0, "--expert-profile", "none",
               "--num-gpu-experts", 2, "--rebalance-experts", 16, "--stream-share", 0)
    try:
        got = [requests.post(s.url + "/v1/completions", timeout=120,
                             json={"prompt": ids(i, 24), "max_tokens": 16, "temperature": 0}).json()
               for i in range(4)]
        m = s.metrics()
        assert m["xpert_expert_rebalance_rounds_total"] >= 4
        # A random-weight model routes nearly flat, which the hysteresis leaves alone: moves are not
        # asserted here (the CUDA test CudaSplitExperts.MovingExpertsKeepsOutput forces them).
        assert m["xpert_expert_moves_total"] >= 0
        # k = 2: the split result is exact whichever experts are resident, as with every expert on the GPU
        # up to the host's kernels; the text may differ from the all-GPU run only at a near-tie, so only
        # the shape of the answers is compared.
        for a, b in zip(want, got):
            assert b["usage"]["completion_tokens"] > 0
            assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    finally:
        stop_server(s)
    assert s.proc.returncode == 0
