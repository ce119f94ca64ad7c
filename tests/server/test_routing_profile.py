"""Routing counted while serving (issue #8, docs/ARCHITECTURE.md "Heterogeneous experts"): on a MoE model
/metrics reports the tokens whose expert routing was counted and how skewed it is, and --profile-out
writes the counts at shutdown as a routing profile (the file `--expert-profile` reads). The tiny MoE
fixture runs on the CPU here, where every layer's routing is counted.
"""
import json
import pathlib
import subprocess

import requests

from conftest import XPERT, stop_server
from test_state_cache import complete, ids, launch

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOE = ROOT / "tests" / "reference" / "fixtures" / "tiny_qwen3moe.gguf"


def test_routing_counted_and_written_at_shutdown(tmp_path):
    out = tmp_path / "served.xpert-profile.json"
    s = launch(MOE, "--parallel", 1, "-c", 128, "--cache-ram", 0, "--profile-out", out)
    try:
        assert s.metrics()["xpert_routed_tokens_total"] == 0
        prompt = ids(3, 24)
        usage = complete(s, prompt, max_tokens=6)
        m = s.metrics()
        routed = m["xpert_routed_tokens_total"]
        # Every forwarded token is routed once per layer: the prompt, then each generated token but the last
        # (the engine may also forward the last one to keep the slot's state whole).
        assert len(prompt) + usage["completion_tokens"] - 1 <= routed <= len(prompt) + usage["completion_tokens"]
        assert 0.25 <= m["xpert_routing_top_quarter_share"] <= 1.0
    finally:
        stop_server(s)
    assert s.proc.returncode == 0
    profile = json.loads(out.read_text())
    assert profile["format"] == "xpert-routing-profile"
    assert profile["tokens"] == routed
    k = profile["model"]["n_expert_used"]
    assert len(profile["counts"]) == profile["model"]["n_layer"]
    for layer in profile["counts"]:
        assert len(layer) == profile["model"]["n_expert"]
        assert sum(layer) == routed * k  # each token picks k experts in every layer


def test_profile_out_in_a_missing_folder_is_refused_at_start(tmp_path):
    r = subprocess.run([str(XPERT), "serve", "-m", str(MOE), "--port", "0", "--profile-out",
                        str(tmp_path / "nope" / "p.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "does not exist" in r.stderr, r.stderr
