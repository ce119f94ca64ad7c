#!/usr/bin/env python3
"""Tiny random-weight Hugging Face checkpoints made with transformers 5.x, and transformers' outputs.

Writes one checkpoint folder per variant under --out-dir (tests/reference/fixtures by default), each as
save_pretrained writes it (config.json, generation_config.json, *.safetensors) plus a tokenizer and two
reference files that xpert's tests read (tests/unit/test_hf_model.cpp):
  xpert_reference.json  prompt (32 ids), transformers' greedy continuation (32 ids, full recompute each
                        step) with the top-1 / top-2 margin of every step, a tokenization check, versions
  xpert_logits.f32      transformers' logits for every prompt position, [32][vocab] little-endian f32

Variants (vocabulary 384, hidden 64, head_dim 32, all computed in float32 on the CPU, eager attention):
  hf_qwen3           Qwen3ForCausalLM, 2 layers, tied embedding, F32
  hf_qwen3moe        Qwen3MoeForCausalLM, 2 layers, 8 experts of 32 (top 2), F32, sharded (index.json)
  hf_qwen3moe_bf16   the same weights saved in BF16; reference = transformers on the BF16 weights in f32
  hf_qwen35          Qwen3_5ForCausalLM (dense hybrid), layers [linear, linear, full], SwiGLU 64, tied
  hf_qwen35moe       Qwen3_5MoeForCausalLM, same layer pattern, 4 experts of 64 (top 2), shared expert
                     of 64; Gated DeltaNet with 2 key heads and 4 value heads of 32 (exercises the
                     value-head reorder), partial rotary 0.25 with mrope_section [2, 1, 1]
  hf_qwen35moe_bf16  the same weights saved in BF16; reference = transformers on the BF16 weights in f32
  hf_qwen35moe_gptq  hf_qwen35moe with its linear layers (experts, shared expert, attention, in_proj_qkv,
                     in_proj_z, out_proj) quantized round-to-nearest symmetric INT4, group 64, written as
                     GPTQ checkpoints store them (qweight int32 [K/8, N] low nibble first, scales f16
                     [K/64, N], qzeros all 7 = zero point 8 in the v1 "gptq" format, g_idx); reference =
                     transformers running the DEQUANTIZED weights
MoE variants also store router_min_gap: per prompt position, the smallest gap over the MoE layers between
the k-th and (k+1)-th router logit (near-ties, where rounding may pick another expert).
The tokenizer is tests/reference/fixtures/bpe_tiny_qwen2.json cut to its first 384 tokens (3 specials,
256 bytes, the 125 merges among them), with a ChatML chat template.

torch and transformers are on the GPU machine (the device tool), not needed in CI:
  python3 tests/reference/make_hf_fixtures.py --out-dir /tmp/hf   (then copy the folders into fixtures/)
"""
import argparse, copy, json, pathlib, shutil, sys, traceback

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/reference/fixtures"
V = 384
N_PROMPT, N_GREEDY = 32, 32
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TOKENIZE_TEXT = "Hello world, the answer is 42. <|im_start|>user\nthe end<|im_end|>"


def tiny_tokenizer():
    """bpe_tiny_qwen2.json cut to V tokens: every kept merge has both parts and its result below V."""
    tok = json.loads((FIXTURES / "bpe_tiny_qwen2.json").read_text())
    vocab = {t: i for t, i in tok["model"]["vocab"].items() if i < V}
    merges = []
    for m in tok["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append([a, b])
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = merges
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] < V]
    assert len(vocab) == V, len(vocab)
    return tok


def write_tokenizer(d, jinja_file):
    (d / "tokenizer.json").write_text(json.dumps(tiny_tokenizer(), ensure_ascii=False))
    cfg = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "model_max_length": 256, "tokenizer_class": "Qwen2Tokenizer"}
    if jinja_file:  # transformers 5 saves the template beside the config
        (d / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    else:
        cfg["chat_template"] = CHAT_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


COMMON = dict(vocab_size=V, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              max_position_embeddings=256, rms_norm_eps=1e-6, hidden_act="silu")
LAYERS35 = ["linear_attention", "linear_attention", "full_attention"]
SEEDS = {"qwen3": 100, "qwen3moe": 200, "qwen35": 300, "qwen35moe": 400}
GDN = dict(linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
           linear_num_value_heads=4)
ROPE35 = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
          "mrope_interleaved": True}


def build(kind, torch, tf):
    """(model, zero_centered_norms) with random weights of useful scale, float32, eager attention."""
    if kind == "qwen3":
        cfg = tf.Qwen3Config(**COMMON, intermediate_size=128, num_hidden_layers=2, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls, zc = tf.Qwen3ForCausalLM, False
    elif kind == "qwen3moe":
        cfg = tf.Qwen3MoeConfig(**COMMON, intermediate_size=128, num_hidden_layers=2, tie_word_embeddings=False,
                                moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                decoder_sparse_step=1, mlp_only_layers=[],
                                rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls, zc = tf.Qwen3MoeForCausalLM, False
    elif kind == "qwen35":
        cfg = tf.Qwen3_5TextConfig(**COMMON, **GDN, intermediate_size=64, num_hidden_layers=3, layer_types=LAYERS35,
                                   tie_word_embeddings=True, rope_parameters=dict(ROPE35))
        cls, zc = tf.Qwen3_5ForCausalLM, True
    elif kind == "qwen35moe":
        cfg = tf.Qwen3_5MoeTextConfig(**COMMON, **GDN, num_hidden_layers=3, layer_types=LAYERS35,
                                      tie_word_embeddings=False, moe_intermediate_size=64,
                                      shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                                      rope_parameters=dict(ROPE35))
        cls, zc = tf.Qwen3_5MoeForCausalLM, True
    else:
        raise ValueError(kind)
    model = cls(cfg).float().eval()
    g = torch.Generator().manual_seed(1000 + ["qwen3", "qwen3moe", "qwen35", "qwen35moe"].index(kind))
    E = cfg.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            def normal(std, mean=0.0):
                p.copy_(torch.randn(p.shape, generator=g) * std + mean)
            if name.endswith("embed_tokens.weight"):
                # Tied: the output is the embedding too; a large one makes every token predict itself.
                normal(0.25 if cfg.tie_word_embeddings else 1.0)
            elif name.endswith("lm_head.weight"):
                normal(2.0 / E ** 0.5)
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 4.0 + 0.1))
            elif name.endswith("dt_bias"):
                normal(0.5, 1.0)
            elif "conv1d" in name:
                normal(0.3)
            elif name.endswith("linear_attn.norm.weight"):
                normal(0.1, 1.0)
            elif name.endswith("norm.weight"):
                normal(0.1, 0.0 if zc else 1.0)  # Qwen3.5's RMSNorm multiplies by (1 + w)
            elif name.endswith("mlp.gate.weight"):
                normal(2.0 / E ** 0.5)  # router: distinct expert choices
            elif p.ndim >= 2:
                normal(1.0 / p.shape[-1] ** 0.5)
            else:
                raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
    return model


def load(cls, d, torch, dtype):
    """from_pretrained, refusing any missing or unexpected tensor (so the saved names are the real ones)."""
    m, info = cls.from_pretrained(str(d), dtype=dtype, attn_implementation="eager", experts_implementation="eager",
                                  output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"{d}: loading info {bad}")
    return m.float().eval()


def run_reference(model, torch, prompt):
    """All-position logits of the prompt, and greedy continuation with each step's top-1/top-2 margin."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float().numpy()
        ids, margins = list(prompt), []
        for _ in range(N_GREEDY):
            last = model(torch.tensor([ids])).logits[0, -1].float()
            top = torch.topk(last, 2)
            ids.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
    return logits, ids[len(prompt):], margins


def router_min_gaps(model, torch, prompt):
    """Per prompt position, the smallest gap over the MoE layers between the k-th and (k+1)-th router
    logit: where it is tiny, a rounding difference picks another expert (a near-tie, not a defect)."""
    k, gaps, hooks = model.config.num_experts_per_tok, [], []

    def hook(mod, inp, out):
        x = inp[0].reshape(-1, inp[0].shape[-1]).float()
        s = torch.sort(x @ mod.weight.float().T, dim=-1, descending=True).values
        gaps.append(s[:, k - 1] - s[:, k])
    for name, mod in model.named_modules():
        if name.endswith("mlp.gate"):
            hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        model(torch.tensor([prompt]))
    for h in hooks:
        h.remove()
    return [round(float(g), 6) for g in torch.stack(gaps).min(0).values]


def pick_prompt(model, torch, seed0):
    """The first of a few random prompts whose greedy path has no near-tie (smallest margin > 0.02)."""
    best = None
    for s in range(8):
        prompt = [int(x) for x in np.random.default_rng(seed0 + s).integers(3, V, N_PROMPT)]
        logits, greedy, margins = run_reference(model, torch, prompt)
        if best is None or min(margins) > min(best[3]):
            best = (prompt, logits, greedy, margins)
        if min(margins) > 0.02:
            break
    return best


def save_reference(d, prompt, logits, greedy, margins, extra):
    np.asarray(logits, dtype="<f4").tofile(d / "xpert_logits.f32")
    ref = {"prompt": prompt, "greedy": greedy, "greedy_margins": [round(m, 6) for m in margins],
           "logits_file": "xpert_logits.f32", "logits_shape": list(logits.shape)}
    ref.update(extra)
    (d / "xpert_reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"  {d.name}: max|logit| {float(np.abs(logits).max()):.3f}, greedy min margin {min(margins):.4f}, "
          f"greedy {greedy[:12]}...", flush=True)


def tokenization_check(d):
    from tokenizers import Tokenizer
    return {"tokenize": {"text": TOKENIZE_TEXT, "ids": Tokenizer.from_file(str(d / "tokenizer.json")).encode(
        TOKENIZE_TEXT).ids}}


# ---- GPTQ ----

GPTQ_GROUP = 64
GPTQ_MODULES = ("mlp.experts.", "mlp.shared_expert.", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                "self_attn.o_proj", "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj")


def gptq_quantize(w):
    """w [N, K] float32 -> (qweight int32 [K/8, N], scales f16 [K/g, N], qzeros int32 [K/g, N/8], g_idx int32 [K],
    dequantized float32 [N, K]). Round-to-nearest symmetric: scale = 2 amax / 15 per group, q = round(w / s) + 8."""
    N, K = w.shape
    G = K // GPTQ_GROUP
    wg = w.reshape(N, G, GPTQ_GROUP)
    amax = np.abs(wg).max(axis=2)
    scales = (np.maximum(amax, 1e-8) * 2.0 / 15.0).astype(np.float16)  # [N, G]
    s32 = scales.astype(np.float32)[:, :, None]
    q = np.clip(np.rint(wg / s32) + 8, 0, 15).astype(np.uint32)  # [N, G, g]
    deq = ((q.astype(np.float32) - 8.0) * s32).reshape(N, K)
    qk = q.reshape(N, K).T.reshape(K // 8, 8, N)  # [K/8, 8, N]: nibble j of word i is input 8 i + j
    words = np.zeros((K // 8, N), dtype=np.uint32)
    for j in range(8):
        words |= qk[:, j, :] << np.uint32(4 * j)
    qzeros = np.full((G, N // 8), 0x77777777, dtype=np.uint32)  # v1 format stores zero - 1 = 7
    g_idx = (np.arange(K) // GPTQ_GROUP).astype(np.int32)
    return words.view(np.int32), scales.T.copy(), qzeros.view(np.int32), g_idx, deq


def split_fused_experts(sd):
    """Per-expert tensors when a checkpoint stores experts fused (gate_up_proj [X, 2F, E], down_proj [X, E, F])."""
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            base = k.rsplit(".", 1)[0]
            for e in range(v.shape[0]):
                if k.endswith("gate_up_proj"):
                    F = v.shape[1] // 2
                    out[f"{base}.{e}.gate_proj.weight"] = v[e, :F].contiguous()
                    out[f"{base}.{e}.up_proj.weight"] = v[e, F:].contiguous()
                else:
                    out[f"{base}.{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    return out


def make_gptq(src_dir, d, model, torch):
    """d: src_dir's checkpoint with GPTQ_MODULES quantized; returns the model with dequantized weights."""
    from safetensors.torch import load_file, save_file
    sd = {}
    for f in sorted(src_dir.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    sd = split_fused_experts(sd)
    out, deq = {}, {}
    for k, v in sd.items():
        if k.endswith(".weight") and v.ndim == 2 and any(m in k for m in GPTQ_MODULES):
            qw, sc, qz, gi, dq = gptq_quantize(v.float().numpy())
            base = k[: -len(".weight")]
            out[base + ".qweight"] = torch.from_numpy(qw)
            out[base + ".scales"] = torch.from_numpy(sc)
            out[base + ".qzeros"] = torch.from_numpy(qz)
            out[base + ".g_idx"] = torch.from_numpy(gi)
            deq[k] = torch.from_numpy(dq)
        else:
            out[k] = v.contiguous()
    save_file(out, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": GPTQ_GROUP, "sym": True,
                                  "desc_act": False, "damp_percent": 0.01, "static_groups": False,
                                  "true_sequential": True, "checkpoint_format": "gptq"}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    if (src_dir / "generation_config.json").exists():
        shutil.copy(src_dir / "generation_config.json", d / "generation_config.json")
    # The reference runs the dequantized values: the float checkpoint with them, loaded by transformers.
    full = dict(sd)
    full.update(deq)
    tmp = d.parent / (d.name + "_deq_tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous().float() for k, v in full.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    shutil.copy(src_dir / "config.json", tmp / "config.json")
    deq_model = load(type(model), tmp, torch, torch.float32)
    shutil.rmtree(tmp)
    return deq_model, len(deq)


def make_bf16(model, db, prompt, torch, versions):
    """db: `model`'s weights saved in BF16; the reference runs those BF16 values in f32."""
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(str(db))
    write_tokenizer(db, jinja_file=model.config.model_type.startswith("qwen3_5"))
    b = load(type(model), db, torch, torch.bfloat16)
    logits, greedy, margins = run_reference(b, torch, prompt)
    save_reference(db, prompt, logits, greedy, margins, dict(versions, weights="BF16 (reference: these weights "
                   "in f32)", router_min_gap=router_min_gaps(b, torch, prompt), **tokenization_check(db)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=str(FIXTURES))
    ap.add_argument("--only", default="", help="comma-separated kinds (qwen3,qwen3moe,qwen35,qwen35moe)")
    a = ap.parse_args()
    out = pathlib.Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    import transformers as tf
    torch.set_num_threads(8)
    versions = {"transformers": tf.__version__, "torch": torch.__version__}
    print(versions, flush=True)
    kinds = a.only.split(",") if a.only else ["qwen3", "qwen3moe", "qwen35", "qwen35moe"]
    failed = []
    for kind in kinds:
        try:
            model = build(kind, torch, tf)
            d = out / f"hf_{kind}"
            shutil.rmtree(d, ignore_errors=True)
            shard = "300KB" if kind == "qwen3moe" else "50GB"
            model.save_pretrained(str(d), max_shard_size=shard)
            write_tokenizer(d, jinja_file=kind.startswith("qwen35"))
            # Reload what was saved: the reference is what the files hold.
            saved = load(type(model), d, torch, torch.float32)
            prompt, logits, greedy, margins = pick_prompt(saved, torch, SEEDS[kind])
            extra = dict(versions, weights="F32", **tokenization_check(d))
            if "moe" in kind:
                extra["router_min_gap"] = router_min_gaps(saved, torch, prompt)
            save_reference(d, prompt, logits, greedy, margins, extra)
            print(f"  files: {sorted(p.name for p in d.iterdir())}", flush=True)

            if kind == "qwen3moe":
                db = out / "hf_qwen3moe_bf16"
                shutil.rmtree(db, ignore_errors=True)
                make_bf16(saved, db, prompt, torch, versions)
            if kind == "qwen35moe":
                # The held-out check's bf16 divergences: the same weights in BF16, reference in f32.
                db = out / "hf_qwen35moe_bf16"
                shutil.rmtree(db, ignore_errors=True)
                make_bf16(saved, db, prompt, torch, versions)
                dq = out / "hf_qwen35moe_gptq"
                shutil.rmtree(dq, ignore_errors=True)
                dq.mkdir()
                deq_model, n_q = make_gptq(d, dq, saved, torch)
                write_tokenizer(dq, jinja_file=True)
                logits, greedy, margins = run_reference(deq_model, torch, prompt)
                save_reference(dq, prompt, logits, greedy, margins, dict(versions, weights=f"GPTQ INT4 g{GPTQ_GROUP} "
                               f"({n_q} layers; reference: the dequantized weights in f32)",
                               router_min_gap=router_min_gaps(deq_model, torch, prompt), **tokenization_check(dq)))
        except Exception:
            traceback.print_exc()
            failed.append(kind)
    for d in sorted(out.glob("hf_*")):
        size = sum(p.stat().st_size for p in d.iterdir())
        print(f"{d.name}: {size} bytes", flush=True)
    if failed:
        print("FAILED:", failed, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
