#!/usr/bin/env python3
"""llama-bench's method on llama.cpp through the PyPI package llama-cpp-python, for side-by-side runs with
`xpert bench` on the same file: random tokens, one warm-up run, then r timed runs from an empty context;
pp = n_prompt tokens evaluated in batches of -b, tg = n_gen tokens one at a time. Prints mean ± stddev
tokens/s as a markdown table (or JSON with -o json), and the 1-minute load average before and after.
usage: llama_cpp_bench.py -m FILE [-p 512] [-n 128] [-r 5] [-t THREADS] [-b 512] [-o md|json]
"""
import argparse, json, os, statistics, sys, time

import numpy as np
import llama_cpp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("-b", "--batch-size", type=int, default=512)
    ap.add_argument("-o", "--output", choices=["md", "json"], default="md")
    a = ap.parse_args()
    load_before = os.getloadavg()[0]
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=max(a.n_prompt, a.n_gen) + 16, n_batch=a.batch_size,
                          n_ubatch=a.batch_size, n_threads=a.threads, n_threads_batch=a.threads, verbose=False,
                          flash_attn=False, logits_all=False)
    n_vocab = llm.n_vocab()
    rng = np.random.default_rng(1234)

    def run_once(n_prompt, n_gen):
        llm.reset()
        prompt = rng.integers(0, n_vocab, n_prompt).tolist()
        t0 = time.perf_counter()
        if n_prompt:
            llm.eval(prompt)
        for _ in range(n_gen):
            llm.eval([int(rng.integers(0, n_vocab))])
        return (n_prompt + n_gen) / (time.perf_counter() - t0)

    results = []
    for name, n_prompt, n_gen in ((f"pp{a.n_prompt}", a.n_prompt, 0), (f"tg{a.n_gen}", 0, a.n_gen)):
        if n_prompt + n_gen == 0:
            continue
        run_once(n_prompt, n_gen)  # warm-up
        tps = [run_once(n_prompt, n_gen) for _ in range(a.repetitions)]
        sd = statistics.stdev(tps) if len(tps) > 1 else 0.0
        results.append({"test": name, "n_prompt": n_prompt, "n_gen": n_gen, "avg_ts": statistics.mean(tps),
                        "stddev_ts": sd, "samples_ts": tps})
    load_after = os.getloadavg()[0]
    size = os.path.getsize(a.model)
    if a.output == "json":
        print(json.dumps({"engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})", "model": a.model,
                          "model_size": size, "n_threads": a.threads, "loadavg_1m": [load_before, load_after],
                          "results": results}, indent=2))
    else:
        print("| engine | size | threads | test | t/s |")
        print("| ------ | ---: | ------: | ---: | --: |")
        for r in results:
            print(f"| llama.cpp {llama_cpp.__version__} | {size / 2**20:.2f} MiB | {a.threads} | {r['test']} | "
                  f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} |")
        print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after", file=sys.stderr)


if __name__ == "__main__":
    main()
