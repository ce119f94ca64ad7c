#!/usr/bin/env python3
"""Tiny random-weight llama / qwen2 / qwen3 GGUFs and llama.cpp's logits for them.

Each model has 2 layers, n_embd 64, 4 heads (2 KV heads) of 16, ff 128 and a 384-token SentencePiece-
style vocabulary, with weights in several formats (F32, F16, Q8_0, Q4_0, Q5_0). llama.cpp (PyPI
llama-cpp-python) evaluates a fixed 24-token sequence with logits for every position; xpert's test
feeds the same ids. usage: make_dense_fixtures.py [--out-dir tests/reference/fixtures]
"""
import argparse, json, pathlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
import llama_cpp

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENS = [1, 17, 42, 99, 5, 300, 7, 7, 128, 250, 64, 33, 301, 2, 150, 77, 12, 380, 200, 9, 55, 56, 57, 58]


def write_model(path, arch, seed):
    rng = np.random.default_rng(seed)
    E, H, KV, D, F, V, L = 64, 4, 2, 16, 128, 384, 2
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(L); w.add_context_length(256); w.add_embedding_length(E); w.add_feed_forward_length(F)
    w.add_head_count(H); w.add_head_count_kv(KV); w.add_rope_freq_base(10000.0 if arch == "llama" else 1e6)
    w.add_layer_norm_rms_eps(1e-6)
    if arch != "llama":
        w.add_key_length(D); w.add_value_length(D)
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581w{i}" for i in range(V - len(toks))]
    types = [2, 3, 3] + [6] * 256 + [1] * (V - 259)
    w.add_tokenizer_model("llama"); w.add_token_list(toks); w.add_token_types(types)
    w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(V - 259)])
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)

    def mat(rows, cols, qt, scale=0.08):
        a = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qt == Q.F32:
            return a, Q.F32
        if qt == Q.F16:
            return a.astype(np.float16), Q.F16
        return gguf.quants.quantize(a, qt), qt

    def add(name, arr_qt):
        arr, qt = arr_qt
        w.add_tensor(name, arr, raw_dtype=qt if qt not in (Q.F32, Q.F16) else None)

    def vec(n, base=1.0, scale=0.1):
        return (base + rng.standard_normal(n) * scale).astype(np.float32)

    add("token_embd.weight", mat(V, E, Q.Q8_0, 0.5))
    w.add_tensor("output_norm.weight", vec(E))
    add("output.weight", mat(V, E, Q.F16, 0.1))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", vec(E))
        add(p + "attn_q.weight", mat(H * D, E, Q.Q8_0))
        add(p + "attn_k.weight", mat(KV * D, E, Q.Q5_0))
        add(p + "attn_v.weight", mat(KV * D, E, Q.F32))
        add(p + "attn_output.weight", mat(E, H * D, Q.Q4_0))
        if arch == "qwen2":
            for t, n in (("q", H * D), ("k", KV * D), ("v", KV * D)):
                w.add_tensor(p + f"attn_{t}.bias", vec(n, 0.0, 0.05))
        if arch == "qwen3":
            w.add_tensor(p + "attn_q_norm.weight", vec(D))
            w.add_tensor(p + "attn_k_norm.weight", vec(D))
        w.add_tensor(p + "ffn_norm.weight", vec(E))
        add(p + "ffn_gate.weight", mat(F, E, Q.Q8_0))
        add(p + "ffn_up.weight", mat(F, E, Q.Q4_0))
        add(p + "ffn_down.weight", mat(E, F, Q.Q8_0))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(progress=False); w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=str(ROOT / "tests/reference/fixtures"))
    a = ap.parse_args()
    out_dir = pathlib.Path(a.out_dir)
    result = {"llama_cpp_python": llama_cpp.__version__, "tokens": TOKENS, "models": {}}
    for seed, arch in enumerate(["llama", "qwen2", "qwen3"]):
        path = out_dir / f"tiny_{arch}.gguf"
        write_model(path, arch, seed)
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_batch=64, n_threads=2, logits_all=True,
                              verbose=False, flash_attn=False)
        llm.eval(TOKENS)
        logits = np.array(llm.scores[: len(TOKENS)], dtype=np.float32)
        result["models"][arch] = {"file": path.name, "logits": [[round(float(x), 5) for x in row] for row in logits]}
        print(arch, path.stat().st_size, "bytes; argmax", logits.argmax(axis=1).tolist())
    (out_dir / "tiny_dense_logits.json").write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
