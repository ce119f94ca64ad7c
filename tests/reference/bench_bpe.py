#!/usr/bin/env python3
"""Tokenizer throughput: HF `tokenizers` and xpert on the same ~10 MB mixed corpus, one thread each.

The corpus is the BPE fixture's texts (English, CJK, code, emoji, whitespace runs...) shuffled and
repeated to --mb megabytes. HF runs `encode` line by line (no encode_batch, RAYON_NUM_THREADS=1);
xpert runs the gtest BpeReference.Throughput on the same file.

    python3 tests/reference/bench_bpe.py [--mb 10] [--tokenizer qwen35] [--tests build-bpe/tests/xpert_tests]
"""
import argparse, json, os, random, subprocess, tempfile, time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

ap = argparse.ArgumentParser()
ap.add_argument("--mb", type=float, default=10)
ap.add_argument("--tokenizer", default="qwen35")
ap.add_argument("--tests", default=os.path.join(ROOT, "build-bpe", "tests", "xpert_tests"))
a = ap.parse_args()

fx = json.load(open(os.path.join(HERE, "fixtures", "bpe_cases.json")))
entry = next(t for t in fx["tokenizers"] if t["name"] == a.tokenizer)
texts = [bytes.fromhex(c["text"]).decode() for c in entry["cases"] if "ids" in c]
rng = random.Random(0)
lines, size = [], 0
while size < a.mb * 1e6:
    t = rng.choice(texts).replace("\n", " ") + rng.choice(["", " ", " 2024", " x"]) + "\n"
    lines.append(t)
    size += len(t.encode())
corpus = "".join(lines)
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
    f.write(corpus)
    path = f.name

tok = Tokenizer.from_file(os.path.join(ROOT, entry["file"]))
mb = len(corpus.encode()) / 1e6
# The same units as the gtest: lines (split at "\n" only), and ~64 KB chunks of whole lines.
units = {"lines": [l + "\n" for l in corpus.split("\n")[:-1]], "64KB chunks": []}
chunk, chunk_bytes = "", 0
for l in units["lines"]:
    chunk += l
    chunk_bytes += len(l.encode())
    if chunk_bytes >= 65536:  # bytes, as the gtest counts, so both see the same chunks
        units["64KB chunks"].append(chunk)
        chunk, chunk_bytes = "", 0
units["64KB chunks"].append(chunk)
for name, parts in units.items():
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(tok.encode(p, add_special_tokens=False).ids) for p in parts)
    s, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"HF tokenizers [{a.tokenizer}] {name}: {mb:.1f} MB, {n} tokens in {s:.3f} s wall, {cpu:.3f} s CPU: "
          f"{mb / s:.1f} MB/s, {n / s / 1e6:.2f} M tokens/s")
env = dict(os.environ, XPERT_BPE_BENCH_CORPUS=path, XPERT_BPE_BENCH_TOKENIZER=a.tokenizer, XPERT_SOURCE_DIR=ROOT)
r = subprocess.run([a.tests, "--gtest_filter=BpeReference.Throughput"], env=env, capture_output=True, text=True)
print("\n".join(l for l in r.stdout.splitlines() if l.startswith("xpert bpe")) or r.stdout[-2000:])
os.unlink(path)
