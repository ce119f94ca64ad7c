"""The xpert binary end to end: output on stdout only, one clear error line for bad input, no crash."""
import json, os, pathlib, struct, subprocess

import pytest

from conftest import ROOT, XPERT

FIXTURE = json.loads((ROOT / "tests/reference/fixtures/default_greedy.json").read_text())


def case(name):
    return next(c for c in FIXTURE["cases"] if c["name"] == name)


def test_run_prints_what_llama_cpp_prints(xpert, model):
    """Identical text, or identical up to llama.cpp's first near-tie (see tests/unit/test_models.cpp)."""
    c = case("capital")
    r = xpert("run", "-m", model, "-p", c["prompt"], "-n", 16, "--temp", 0, "-t", 2)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    if out != c["greedy_text_16"] + "\n":
        assert c["first_near_tie"] < 16, (out, c["greedy_text_16"])
        assert out.startswith(c["greedy_text_until_tie"]), (out, c["greedy_text_until_tie"])


def test_info_lists_metadata_and_tensors(xpert, model):
    r = xpert("info", "-m", model)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "general.architecture" in out and "gemma3" in out
    assert "token_embd.weight" in out and "Q8_0" in out
    assert "memory: weights" in out


def test_bench_json(xpert, model):
    r = xpert("bench", "-m", model, "-p", 16, "-n", 4, "-r", 2, "-o", "json", "-t", 2)
    assert r.returncode == 0, r.stderr.decode()
    rows = json.loads(r.stdout)
    assert [(x["n_prompt"], x["n_gen"]) for x in rows] == [(16, 0), (0, 4)]
    assert all(x["avg_ts"] > 0 and len(x["samples_ts"]) == 2 for x in rows)
    # The bandwidth roofline (runtime/traffic.h): a prompt token moves less than a decoded one (the weights
    # are read once a pass), and the roofline is the bytes at the measured copy bandwidth.
    pp, tg = rows
    assert 0 < pp["bytes_per_token"] < tg["bytes_per_token"]
    assert all(x["copy_bandwidth"] > 0 for x in rows)
    assert all(abs(x["roofline_ts"] * x["bytes_per_token"] - x["copy_bandwidth"]) <= 1e-6 * x["copy_bandwidth"]
               for x in rows)


def test_bench_depth(xpert, model):
    # llama-bench's -d: each test after DEPTH tokens already in the context, named "pp16 @ d48".
    r = xpert("bench", "-m", model, "-p", 16, "-n", 4, "-r", 1, "-d", "0,48", "-o", "json", "-t", 2)
    assert r.returncode == 0, r.stderr.decode()
    rows = json.loads(r.stdout)
    assert [(x["n_depth"], x["n_prompt"], x["n_gen"]) for x in rows] == [(0, 16, 0), (0, 0, 4), (48, 16, 0), (48, 0, 4)]
    assert all(x["avg_ts"] > 0 for x in rows)
    hybrid = os.path.join(os.path.dirname(__file__), "..", "reference", "fixtures", "tiny_qwen35.gguf")
    r = xpert("bench", "-m", hybrid, "-p", 8, "-n", 4, "-r", 2, "-d", "40", "-t", 2)
    assert r.returncode == 0, r.stderr.decode()
    assert "pp8 @ d40" in r.stdout.decode() and "tg4 @ d40" in r.stdout.decode()
    assert "roofline: the bytes a test moves at the copy bandwidth of host" in r.stdout.decode()
    assert "  tg4 @ d40: " in r.stdout.decode()


def test_profile_writes_a_profile(xpert, tmp_path):
    # xpert profile on a tiny MoE fixture: a JSON profile with per-layer expert counts that add up.
    moe = os.path.join(os.path.dirname(__file__), "..", "reference", "fixtures", "tiny_qwen3moe.gguf")
    out = tmp_path / "profile.json"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe quick brown fox\n")
    r = xpert("profile", "-m", moe, "--prompts", prompts, "-n", 4, "-o", out, "-t", 2)
    assert r.returncode == 0, r.stderr.decode()
    p = json.loads(out.read_text())
    assert p["tokens"] > 0 and len(p["counts"]) == 2  # two MoE layers
    k = p["model"]["n_expert_used"]
    assert all(sum(layer) == p["tokens"] * k for layer in p["counts"])
    r = xpert("profile", "-m", moe, "--prompts", tmp_path / "missing.txt", "-o", out)
    assert r.returncode != 0 and b"missing.txt" in r.stderr


def test_bench_profile_out(xpert, model, tmp_path):
    # The routing of the benchmarked tokens as a profile (warm-up + timed runs, prompt and generated tokens);
    # refused for a dense model.
    moe = os.path.join(os.path.dirname(__file__), "..", "reference", "fixtures", "tiny_qwen3moe.gguf")
    out = tmp_path / "bench-profile.json"
    r = xpert("bench", "-m", moe, "-p", 16, "-n", 4, "-r", 1, "-t", 2, "--profile-out", out)
    assert r.returncode == 0, r.stderr.decode()
    p = json.loads(out.read_text())
    assert p["tokens"] == 2 * (16 + 4)
    k = p["model"]["n_expert_used"]
    assert all(sum(layer) == p["tokens"] * k for layer in p["counts"])
    r = xpert("bench", "-m", model, "-p", 8, "-n", 0, "-r", 1, "--profile-out", out)
    assert r.returncode != 0 and b"no routed experts" in r.stderr


MOE_FIXTURE = os.path.join(os.path.dirname(__file__), "..", "reference", "fixtures", "tiny_qwen3moe.gguf")


def test_bench_parallel(xpert):
    """llama-batched-bench's shape on the serving engine: a row per N with PP/TG/total speeds and latencies."""
    r = xpert("bench", "-m", MOE_FIXTURE, "--parallel", "1,3", "-p", 12, "-n", 5, "-o", "json", "-t", 2)
    assert r.returncode == 0, r.stderr.decode()
    rows = json.loads(r.stdout)
    assert [(x["pl"], x["pp"], x["tg"], x["n_kv"]) for x in rows] == [(1, 12, 5, 17), (3, 12, 5, 51)]
    for x in rows:
        assert x["routing"] == "model"
        assert x["speed_pp"] > 0 and x["speed_tg"] > 0 and x["speed"] > 0
        assert abs(x["t_pp"] + x["t_tg"] - x["t"]) < 1e-6 * max(1.0, x["t"])
        assert abs(x["speed_tg"] * x["t_tg"] - x["pl"] * x["tg"]) < 1e-6 * x["pl"] * x["tg"]
        assert 0 < x["ttft_p50"] <= x["ttft_p90"] and 0 < x["itl_p50"] <= x["itl_p90"]
    r = xpert("bench", "-m", MOE_FIXTURE, "--parallel", 2, "-p", 8, "-n", 3, "--routing", "uniform", "-t", 2)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "routing uniform" in out and "| S_TG t/s |" in out
    assert len([l for l in out.splitlines() if l.startswith("|    8 |    3 |   2 |")]) == 1, out


@pytest.mark.parametrize("args, message", [
    (["--parallel", "0"], b"--parallel"),
    (["--parallel", "2,x"], b"--parallel"),
    (["--parallel", "2", "--batch-tokens", "0"], b"--batch-tokens"),
    (["--batch-tokens", "64"], b"--batch-tokens applies to --parallel only"),
    (["--parallel", "2", "-d", "16"], b"-d is not supported"),
    (["--parallel", "2", "-p", "0"], b"-p must be at least 1"),
    (["--routing", "random"], b"--routing"),
    (["--routing", "uniform", "--routing-seed", "0"], b"--routing-seed"),
])
def test_bench_parallel_bad_values(xpert, args, message):
    r = xpert("bench", "-m", MOE_FIXTURE, *([] if "-p" in args else ["-p", 8]), "-n", 2, "-r", 1, *args)
    assert r.returncode != 0 and message in r.stderr, r.stderr.decode()
    assert b"Traceback" not in r.stderr and b"terminate" not in r.stderr


def test_bench_routing_uniform_needs_experts(xpert, model):
    r = xpert("bench", "-m", model, "-p", 8, "-n", 2, "-r", 1, "--routing", "uniform")
    assert r.returncode != 0 and b"--routing uniform" in r.stderr and b"no routed experts" in r.stderr


def test_tokenize_matches_llama_cpp(xpert, model):
    c = case("chinese")
    r = xpert("tokenize", "-m", model, "-p", c["prompt"])
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout) == c["prompt_ids"]


def gguf_bytes(kv=b"", n_tensors=0, n_kv=0, version=3):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kv


BAD_FILES = {
    "empty": b"",
    "bad_magic": b"GGUX" + bytes(20),
    "version_1": gguf_bytes(version=1),
    "truncated_header": b"GGUF\x03\x00",
    "huge_kv_count": gguf_bytes(n_kv=1 << 62),
    "huge_tensor_count": gguf_bytes(n_tensors=1 << 60),
    "huge_string": gguf_bytes(struct.pack("<Q", 1 << 60) + b"abc", n_kv=1),
    "random": bytes((i * 2654435761) % 251 for i in range(4096)),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["run", "info"])
def test_bad_files_give_one_error_line(xpert, tmp_path, name, command):
    f = tmp_path / f"{name}.gguf"
    f.write_bytes(BAD_FILES[name])
    args = ["-p", "hi", "-n", 1] if command == "run" else []
    r = xpert(command, "-m", f, *args)
    assert r.returncode == 1, (r.returncode, r.stderr)
    err = r.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xpert: error:"), err
    assert r.stdout == b""


def test_truncated_real_model(xpert, model, tmp_path):
    data = model.read_bytes()
    for cut in (1000, len(data) // 2, len(data) - 7):
        f = tmp_path / "cut.gguf"
        f.write_bytes(data[:cut])
        r = xpert("info", "-m", f)
        assert r.returncode == 1 and r.stderr.decode().startswith("xpert: error:"), (cut, r.stderr)


def test_missing_file_and_directory(xpert, tmp_path):
    for p in (tmp_path / "nope.gguf", tmp_path):
        r = xpert("info", "-m", p)
        assert r.returncode == 1 and b"xpert: error:" in r.stderr


@pytest.mark.parametrize("args", [["run", "-p", "x"], ["run", "-m"], ["bench", "-m", "x", "-r", "0"],
                                  ["frobnicate"], ["run", "-m", "x", "-p", "y", "-n", "-3"]])
def test_bad_flags_exit_nonzero(xpert, args):
    r = xpert(*args)
    assert r.returncode > 0 and r.stderr, (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("share", ["1.5", "half", "-1"])
def test_bad_stream_share_is_one_error_line(xpert, model, share):
    r = xpert("run", "-m", model, "-p", "x", "-n", 1, "--stream-share", share)
    assert r.returncode == 1 and b"--stream-share" in r.stderr and b"expected auto" in r.stderr, r.stderr


def test_context_too_small_is_an_error(xpert, model):
    r = xpert("run", "-m", model, "-p", "word " * 50, "-n", 4, "-c", 16)
    assert r.returncode == 1 and b"context" in r.stderr


def test_context_above_trained_is_refused_before_loading(xpert, model):
    # The memory plan's first check: -c above the trained maximum fails naming it, before the plan or
    # any weight is read; -c 0 is the trained maximum.
    r = xpert("run", "-m", model, "-p", "hi", "-n", 1, "-c", 10000000)
    err = r.stderr.decode()
    assert r.returncode == 1 and r.stdout == b"", err
    assert "-c 10000000 is above the model's trained context of 32768 tokens" in err and "memory plan" not in err
    hybrid = os.path.join(os.path.dirname(__file__), "..", "reference", "fixtures", "tiny_qwen35.gguf")
    r = xpert("run", "-m", hybrid, "-p", "hi", "-n", 1, "-c", 0, "-t", 2)
    assert r.returncode == 0 and "memory plan: -c 256 (trained 256)" in r.stderr.decode(), r.stderr.decode()


def test_memory_plan_refuses_what_does_not_fit(xpert):
    # A state cache budget of 1 PiB cannot fit in RAM: refused with what to change, before generating.
    hybrid = os.path.join(os.path.dirname(__file__), "..", "reference", "fixtures", "tiny_qwen35.gguf")
    r = subprocess.run([str(XPERT), "chat", "-m", hybrid, "--cache-ram", str(1 << 30)], input=b"hello\n",
                       capture_output=True, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 1 and "xpert: error: host RAM:" in err and "--cache-ram" in err, err


def test_info_prints_the_memory_plan(xpert):
    hybrid = os.path.join(os.path.dirname(__file__), "..", "reference", "fixtures", "tiny_qwen35.gguf")
    r = xpert("info", "-m", hybrid, "-c", 128)
    out = r.stdout.decode()
    assert r.returncode == 0 and "memory plan: -c 128 (trained 256)" in out, out
    assert "KV cache 64.0 KiB" in out and "recurrent states" in out, out  # 2 attention layers of 6


def test_kv_cache_types_and_chunk_size(xpert):
    # --cache-type-k/-v (-ctk/-ctv): the memory plan counts the types' bytes (2 attention layers x 128
    # positions x (64 values as q8_0 = 68 B + as q4_0 = 36 B) = 26 KiB); a run with them and --chunk-size works.
    fixtures = os.path.join(os.path.dirname(__file__), "..", "reference", "fixtures")
    hybrid = os.path.join(fixtures, "tiny_qwen35.gguf")
    r = xpert("info", "-m", hybrid, "-c", 128, "-ctk", "q8_0", "--cache-type-v", "q4_0")
    out = r.stdout.decode()
    assert r.returncode == 0 and "KV q8_0/q4_0" in out and "KV cache 26.0 KiB" in out, out
    r = xpert("run", "-m", hybrid, "-p", "hello there", "-n", 4, "--temp", 0, "-t", 2, "-ctk", "q8_0", "-ctv", "q8_0",
              "--chunk-size", 3)
    assert r.returncode == 0 and "KV q8_0/q8_0" in r.stderr.decode(), r.stderr.decode()
    # Refusals: an unknown type, and a block type on heads of 16 (not whole blocks of 32).
    r = xpert("run", "-m", hybrid, "-p", "hi", "-n", 1, "-ctk", "q5_1")
    assert r.returncode == 1 and "unknown KV cache type 'q5_1' (known: f16, q8_0, q4_0)" in r.stderr.decode()
    r = xpert("run", "-m", os.path.join(fixtures, "tiny_llama.gguf"), "-p", "hi", "-n", 1, "-ctv", "q4_0")
    err = r.stderr.decode()
    assert r.returncode == 1 and "--cache-type-v q4_0 stores blocks of 32" in err and "head_dim is 16" in err, err
