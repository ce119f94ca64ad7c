#!/usr/bin/env python3
"""Tiny random-weight qwen35 (dense hybrid) and qwen35moe GGUFs and llama.cpp's logits for them.

Both have 6 layers with full_attention_interval 3 (layers 2 and 5 full attention, the rest Gated
DeltaNet), n_embd 64; attention: 4 heads (2 KV) of 32 with partial rotary (n_rot 8, IMRoPE sections
[2, 1, 1, 0]), QK-norm and the sigmoid output gate; Gated DeltaNet: 2 key heads and 4 value heads of 16,
conv kernel 4. qwen35 has a SwiGLU FFN of 128; qwen35moe has 8 experts of 16 (top 2) and a sigmoid-gated
shared expert of 64. Matrices are F16 or F32 (no quantization: tiny quantized models are noisy);
vectors and the conv kernel are F32, as llama.cpp's converter writes them. llama.cpp (PyPI
llama-cpp-python) evaluates a fixed 24-token sequence with logits for every position; xpert's test
feeds the same ids. usage: make_qwen35_fixtures.py [--out-dir tests/reference/fixtures]
"""
import argparse, json, pathlib

import numpy as np
import gguf
import llama_cpp

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENS = [1, 17, 42, 99, 5, 300, 7, 7, 128, 250, 64, 33, 301, 2, 150, 77, 12, 380, 200, 9, 55, 56, 57, 58]

E, L, V, INTERVAL = 64, 6, 384, 3
H, KV, D, N_ROT, SECTIONS = 4, 2, 32, 8, [2, 1, 1, 0]
D_CONV, HK, HV, DK = 4, 2, 4, 16
D_INNER = HV * DK
KEY_DIM, VALUE_DIM = HK * DK, HV * DK
CONV_DIM = 2 * KEY_DIM + VALUE_DIM
F_DENSE, N_EXPERT, N_USED, F_EXP, F_SHEXP = 128, 8, 2, 16, 64


def write_model(path, arch, seed):
    rng = np.random.default_rng(seed)
    moe = arch == "qwen35moe"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    a = arch + "."
    w.add_uint32(a + "block_count", L)
    w.add_uint32(a + "context_length", 256)
    w.add_uint32(a + "embedding_length", E)
    w.add_uint32(a + "feed_forward_length", F_DENSE)
    w.add_uint32(a + "attention.head_count", H)
    w.add_uint32(a + "attention.head_count_kv", KV)
    w.add_uint32(a + "attention.key_length", D)
    w.add_uint32(a + "attention.value_length", D)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(a + "rope.freq_base", 1e7)
    w.add_uint32(a + "rope.dimension_count", N_ROT)
    w.add_array(a + "rope.dimension_sections", SECTIONS)
    w.add_uint32(a + "full_attention_interval", INTERVAL)
    w.add_uint32(a + "ssm.conv_kernel", D_CONV)
    w.add_uint32(a + "ssm.state_size", DK)
    w.add_uint32(a + "ssm.group_count", HK)
    w.add_uint32(a + "ssm.time_step_rank", HV)
    w.add_uint32(a + "ssm.inner_size", D_INNER)
    if moe:
        w.add_uint32(a + "expert_count", N_EXPERT)
        w.add_uint32(a + "expert_used_count", N_USED)
        w.add_uint32(a + "expert_feed_forward_length", F_EXP)
        w.add_uint32(a + "expert_shared_feed_forward_length", F_SHEXP)
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581w{i}" for i in range(V - len(toks))]
    types = [2, 3, 3] + [6] * 256 + [1] * (V - 259)
    w.add_tokenizer_model("llama"); w.add_token_list(toks); w.add_token_types(types)
    w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(V - 259)])
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)

    def mat(*shape, f16=True, scale=0.08):  # numpy shape = reversed ggml shape
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        return x.astype(np.float16) if f16 else x

    def vec(n, base=1.0, scale=0.1):
        return (base + rng.standard_normal(n) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(V, E, scale=0.5))
    w.add_tensor("output_norm.weight", vec(E))
    w.add_tensor("output.weight", mat(V, E, scale=0.3))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", vec(E))
        w.add_tensor(p + "post_attention_norm.weight", vec(E))
        if (i + 1) % INTERVAL != 0:  # Gated DeltaNet
            w.add_tensor(p + "attn_qkv.weight", mat(CONV_DIM, E, scale=0.15))
            w.add_tensor(p + "attn_gate.weight", mat(VALUE_DIM, E, f16=False))
            w.add_tensor(p + "ssm_conv1d.weight", mat(CONV_DIM, D_CONV, f16=False, scale=0.4))
            w.add_tensor(p + "ssm_dt.bias", vec(HV, 0.0, 0.5))
            w.add_tensor(p + "ssm_a", -rng.uniform(0.05, 2.0, HV).astype(np.float32))  # -exp(A_log)
            w.add_tensor(p + "ssm_beta.weight", mat(HV, E, f16=False, scale=0.2))
            w.add_tensor(p + "ssm_alpha.weight", mat(HV, E, f16=False, scale=0.2))
            w.add_tensor(p + "ssm_norm.weight", vec(DK))
            w.add_tensor(p + "ssm_out.weight", mat(E, VALUE_DIM))
        else:  # full attention; q and its gate interleaved per head
            w.add_tensor(p + "attn_q.weight", mat(2 * H * D, E))
            w.add_tensor(p + "attn_k.weight", mat(KV * D, E, f16=False))
            w.add_tensor(p + "attn_v.weight", mat(KV * D, E))
            w.add_tensor(p + "attn_output.weight", mat(E, H * D))
            w.add_tensor(p + "attn_q_norm.weight", vec(D))
            w.add_tensor(p + "attn_k_norm.weight", vec(D))
        if moe:
            w.add_tensor(p + "ffn_gate_inp.weight", mat(N_EXPERT, E, f16=False, scale=0.3))
            w.add_tensor(p + "ffn_gate_exps.weight", mat(N_EXPERT, F_EXP, E))
            w.add_tensor(p + "ffn_up_exps.weight", mat(N_EXPERT, F_EXP, E))
            w.add_tensor(p + "ffn_down_exps.weight", mat(N_EXPERT, E, F_EXP))
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", vec(E, 0.0, 0.2))
            w.add_tensor(p + "ffn_gate_shexp.weight", mat(F_SHEXP, E))
            w.add_tensor(p + "ffn_up_shexp.weight", mat(F_SHEXP, E))
            w.add_tensor(p + "ffn_down_shexp.weight", mat(E, F_SHEXP))
        else:
            w.add_tensor(p + "ffn_gate.weight", mat(F_DENSE, E))
            w.add_tensor(p + "ffn_up.weight", mat(F_DENSE, E))
            w.add_tensor(p + "ffn_down.weight", mat(E, F_DENSE))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(progress=False); w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=str(ROOT / "tests/reference/fixtures"))
    a = ap.parse_args()
    out_dir = pathlib.Path(a.out_dir)
    result = {"llama_cpp_python": llama_cpp.__version__, "tokens": TOKENS, "models": {}}
    for seed, arch in enumerate(["qwen35", "qwen35moe"]):
        path = out_dir / f"tiny_{arch}.gguf"
        write_model(path, arch, 100 + seed)
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_batch=64, n_threads=2, logits_all=True,
                              verbose=False, flash_attn=False)
        llm.eval(TOKENS)
        logits = np.array(llm.scores[: len(TOKENS)], dtype=np.float32)
        result["models"][arch] = {"file": path.name, "logits": [[round(float(x), 5) for x in row] for row in logits]}
        print(arch, path.stat().st_size, "bytes; argmax", logits.argmax(axis=1).tolist(),
              "max|logit|", float(np.abs(logits).max()))
    (out_dir / "tiny_qwen35_logits.json").write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
