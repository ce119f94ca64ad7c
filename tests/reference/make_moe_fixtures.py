#!/usr/bin/env python3
"""A tiny random-weight qwen3moe GGUF and llama.cpp's logits for it.

2 layers, n_embd 256, 2 heads (1 KV head) of 64, 8 experts of ff 32 with 3 used, a 384-token
SentencePiece-style vocabulary. Written with the PyPI `gguf` package (a writer that is not xpert's), with
weights in several formats: the experts' gate Q4_K and up Q5_K (random payload, scales chosen for
weights of std ~0.05: the `gguf` package cannot quantize K-quants), down Q5_0, the router F32,
attention F16 / F32, the embedding Q8_0 and the output Q6_K. Attention stays in float on purpose: with
quantized attention (int8 activations) at n_embd 256, a last-bit difference upstream flips an int8
rounding now and then, and the flip spreads to every later position through the KV cache (llama.cpp's
own batched and token-by-token logits differ by ~1 % from position 5 on); the dense fixtures cover the
quantized attention formats. llama.cpp (PyPI
llama-cpp-python) evaluates a fixed 24-token sequence with logits for every position; xpert's test
(tests/unit/test_moe_llama_cpp.cpp) feeds the same ids.
usage: make_moe_fixtures.py [--out-dir tests/reference/fixtures]
"""
import argparse, json, pathlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
import llama_cpp

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENS = [1, 17, 42, 99, 5, 300, 7, 7, 128, 250, 64, 33, 301, 2, 150, 77, 12, 380, 200, 9, 55, 56, 57, 58]
E, H, KV, D, F, X, K, V, L = 256, 2, 1, 64, 32, 8, 3, 384, 2


def f16_bytes(v):
    return np.frombuffer(np.float16(v).tobytes(), np.uint8)


def kquant_rows(rng, rows, k, qt):
    """Random but valid K-quant rows: random payload, fixed f16 super-block scales."""
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, size=(rows, k // bs, ts), dtype=np.uint8)
    if qt == Q.Q4_K:  # d, dmin first; value = d*sc*q - dmin*m, q in 0..15, sc and m in 0..63
        b[..., 0:2] = f16_bytes(2e-4); b[..., 2:4] = f16_bytes(1.5e-3)
    elif qt == Q.Q5_K:  # same header, q in 0..31
        b[..., 0:2] = f16_bytes(1e-4); b[..., 2:4] = f16_bytes(1.5e-3)
    elif qt == Q.Q6_K:  # d last; value = d*scale*(q-32), scale int8
        b[..., ts - 2:ts] = f16_bytes(4e-5)
    return b.reshape(rows, (k // bs) * ts)


def write_model(path, seed):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name("tiny-qwen3moe-fixture")
    w.add_block_count(L); w.add_context_length(256); w.add_embedding_length(E); w.add_feed_forward_length(F * K)
    w.add_expert_feed_forward_length(F); w.add_expert_count(X); w.add_expert_used_count(K)
    w.add_head_count(H); w.add_head_count_kv(KV); w.add_key_length(D); w.add_value_length(D)
    w.add_rope_freq_base(1e6); w.add_layer_norm_rms_eps(1e-6)
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581w{i}" for i in range(V - len(toks))]
    w.add_tokenizer_model("llama"); w.add_token_list(toks); w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (V - 259))
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(V - 259)])
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)

    def mat(shape, qt, scale=0.06):
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qt == Q.F32:
            return a, None
        if qt == Q.F16:
            return a.astype(np.float16), None
        return gguf.quants.quantize(a, qt), qt

    def add(name, arr_qt):
        arr, qt = arr_qt
        w.add_tensor(name, arr, raw_dtype=qt)

    def vec(n, base=1.0, scale=0.1):
        return (base + rng.standard_normal(n) * scale).astype(np.float32)

    add("token_embd.weight", mat((V, E), Q.Q8_0, 0.5))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", vec(E))
        add(p + "attn_q.weight", mat((H * D, E), Q.F16))
        add(p + "attn_k.weight", mat((KV * D, E), Q.F32))
        add(p + "attn_v.weight", mat((KV * D, E), Q.F16))
        add(p + "attn_output.weight", mat((E, H * D), Q.F16))
        w.add_tensor(p + "attn_q_norm.weight", vec(D))
        w.add_tensor(p + "attn_k_norm.weight", vec(D))
        w.add_tensor(p + "ffn_norm.weight", vec(E))
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((X, E)) * 0.1).astype(np.float32))
        # numpy shapes are ggml's reversed: [n_expert, rows, row bytes]
        w.add_tensor(p + "ffn_gate_exps.weight", kquant_rows(rng, X * F, E, Q.Q4_K).reshape(X, F, -1), raw_dtype=Q.Q4_K)
        w.add_tensor(p + "ffn_up_exps.weight", kquant_rows(rng, X * F, E, Q.Q5_K).reshape(X, F, -1), raw_dtype=Q.Q5_K)
        add(p + "ffn_down_exps.weight", mat((X, E, F), Q.Q5_0, 0.15))
    w.add_tensor("output_norm.weight", vec(E))
    w.add_tensor("output.weight", kquant_rows(rng, V, E, Q.Q6_K), raw_dtype=Q.Q6_K)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(progress=False); w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=str(ROOT / "tests/reference/fixtures"))
    a = ap.parse_args()
    out_dir = pathlib.Path(a.out_dir)
    path = out_dir / "tiny_qwen3moe.gguf"
    write_model(path, 11)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_batch=64, n_threads=2, logits_all=True,
                          verbose=False, flash_attn=False)
    llm.eval(TOKENS)
    logits = np.array(llm.scores[: len(TOKENS)], dtype=np.float32)
    result = {"llama_cpp_python": llama_cpp.__version__, "tokens": TOKENS, "file": path.name,
              "logits": [[round(float(x), 5) for x in row] for row in logits]}
    (out_dir / "tiny_qwen3moe_logits.json").write_text(json.dumps(result) + "\n")
    print(path.name, path.stat().st_size, "bytes; max |logit|", float(np.abs(logits).max()),
          "; argmax", logits.argmax(axis=1).tolist())


if __name__ == "__main__":
    main()
