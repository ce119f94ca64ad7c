#!/usr/bin/env python3
"""Records llama.cpp's behaviour on the default model as a fixture xpert is tested against.

For each prompt: the prompt's token ids, the top-5 logits of its last token, and the greedy
continuation (64 tokens, stopping early at an end-of-generation token). llama.cpp comes from the PyPI
package llama-cpp-python (CPU build; on these Xeon/EPYC machines build it with AMX off, see README).
usage: make_llama_fixtures.py [--model models/gemma3-270m.gguf] [--out tests/reference/fixtures/default_greedy.json]
"""
import argparse, json, pathlib, sys

import numpy as np
import llama_cpp

ROOT = pathlib.Path(__file__).resolve().parents[2]

LONG = " ".join(
    f"Paragraph {i}: the river town kept its ledgers in careful columns, and every autumn the clerks "
    f"counted barrels of apples, sacks of grain and {i * 7} crates of pears before the first frost."
    for i in range(1, 31)
) + " In summary, the most important lesson of these records is"

PROMPTS = [
    ("capital", "The capital of France is"),
    ("english", "Once upon a time, in a small village by the sea, there lived"),
    ("chinese", "中国的首都是北京。北京是一座历史悠久的城市，"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("numbers", "1, 2, 3, 5, 8, 13, 21,"),
    ("math", "Question: What is 12 times 12?\nAnswer:"),
    ("chat", "<start_of_turn>user\nWrite a haiku about the moon.<end_of_turn>\n<start_of_turn>model\n"),
    ("japanese", "日本で一番高い山は"),
    ("json", "{\"name\": \"Alice\", \"age\": 30, \"city\":"),
    ("long", LONG),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models/gemma3-270m.gguf"))
    ap.add_argument("--out", default=str(ROOT / "tests/reference/fixtures/default_greedy.json"))
    ap.add_argument("--n-gen", type=int, default=64)
    a = ap.parse_args()

    llm = llama_cpp.Llama(model_path=a.model, n_ctx=2048, n_batch=512, n_threads=2, logits_all=False,
                          verbose=False, flash_attn=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def last_logits():
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()
    cases = []
    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        logits = last_logits()
        top = np.argsort(-logits, kind="stable")[:5]
        gen, top2 = [], []
        for _ in range(a.n_gen):
            step = last_logits()
            best = np.argsort(-step, kind="stable")[:5]
            tok = int(best[0])
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                break
            gen.append(tok)
            # The best five and their gap to the chosen one: a divergence at a near-tie is rounding, not a bug.
            top2.append([[int(b), round(float(step[best[0]] - step[b]), 4)] for b in best[1:]])
            llm.eval([tok])
        text_out = llm.detokenize(gen).decode("utf-8", errors="replace")
        # Up to the first near-tie (an alternative within 0.5 logits) another engine may part from this text.
        ties = [i for i, alts in enumerate(top2) if min(g for _, g in alts) < 0.5] + [len(gen)]
        until_tie = llm.detokenize(gen[: ties[0]]).decode("utf-8", errors="replace")
        cases.append({"name": name, "prompt": text, "prompt_ids": ids, "top5_ids": [int(t) for t in top],
                      "top5_logits": [float(logits[t]) for t in top], "greedy_ids": gen, "greedy_alternatives": top2,
                      "greedy_text": text_out,
                      "greedy_text_16": llm.detokenize(gen[:16]).decode("utf-8", errors="replace"),
                      "first_near_tie": ties[0], "greedy_text_until_tie": until_tie})
        print(f"{name}: {len(ids)} prompt tokens, {len(gen)} generated: {text_out[:60]!r}", file=sys.stderr)
    out = {"model": pathlib.Path(a.model).name, "llama_cpp_python": llama_cpp.__version__, "n_ctx": 2048,
           "flash_attn": False, "cases": cases}
    pathlib.Path(a.out).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
