#!/usr/bin/env python3
"""Checks that llama.cpp (PyPI llama-cpp-python) loads what `xpert synth` writes and generates from it.

For each type, runs `xpert synth --preset PRESET --type TYPE`, loads the file with llama_cpp, evaluates a
short prompt, generates 8 tokens greedily and checks that every logit is finite. Exits non-zero on any
failure. (xpert's own numbers on such files are checked against llama.cpp by the tiny_qwen3moe fixture.)
usage: check_synth_llama_cpp.py [--xpert build/xpert] [--preset tiny-qwen3moe] [--types Q4_K_M,Q8_0,F16]
"""
import argparse, pathlib, subprocess, sys, tempfile

import numpy as np
import llama_cpp

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = [1, 300, 17, 42, 259, 3, 100, 7]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xpert", default=str(ROOT / "build/xpert"))
    ap.add_argument("--preset", default="tiny-qwen3moe")
    ap.add_argument("--types", default="Q4_K_M,Q8_0,F16")
    a = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for qt in a.types.split(","):
            path = pathlib.Path(tmp) / f"{a.preset}-{qt}.gguf"
            subprocess.run([a.xpert, "synth", "--preset", a.preset, "--type", qt, "-o", str(path)], check=True)
            try:
                llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=64, n_threads=2, logits_all=True,
                                      verbose=False, flash_attn=False)
            except Exception as e:  # noqa: BLE001 - any load failure is the finding
                print(f"FAIL {qt}: llama.cpp cannot load {path.name}: {e}")
                failures += 1
                continue
            llm.eval(PROMPT)
            gen = []
            for _ in range(8):
                tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                gen.append(tok)
                llm.eval([tok])
            if len(gen) != 8 or not np.all(np.isfinite(np.array(llm.scores[: llm.n_tokens]))):
                print(f"FAIL {qt}: generated {gen}, or some logit is not finite")
                failures += 1
                continue
            print(f"ok {qt}: {path.stat().st_size} bytes, llama.cpp generated {gen}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
