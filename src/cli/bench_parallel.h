// `xpert bench --parallel N1,N2,...`: llama-batched-bench's workload on the serving Engine.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/kv_cache.h"

namespace xpert {
class Model;
}

namespace xpert::cli {

struct ParallelBenchOptions {
  std::vector<int> n_parallel;  // one test per value: that many sequences at once
  int64_t n_prompt = 128, n_gen = 128;
  int reps = 1;                  // timed runs per N, after one warm-up
  int64_t prefill_chunk = 512;   // -b: prompt tokens of one slot per step, at most
  int64_t batch_tokens = 0;      // tokens of one step, at most; 0: N * n_prompt (every prompt in one step)
  int threads = 0;
  KvTypes cache_types;
  std::string routing = "model";  // how the MoE layers route, for the table
  std::string output = "md";      // md or json
};

// For each N: N requests of n_prompt random tokens submitted at once to an Engine of N slots, each
// generating n_gen + 1 tokens (greedy, end-of-generation ignored): n_prompt prompt tokens and n_gen decode
// steps a sequence, llama-batched-bench's PP / TG. Prints a table (or JSON) with the prefill, generation and
// total t/s and the time to first token and between tokens (p50 / p90). Returns the exit code.
int run_parallel_bench(const Model& model, const ParallelBenchOptions& o);

}  // namespace xpert::cli
