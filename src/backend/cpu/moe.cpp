#include "backend/cpu/moe.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/uniform_routing.h"
#include "base/error.h"

namespace xpert::cpu {

void route_top_k(const float* logits, int64_t n_tokens, const RouterParams& p, Routing& r) {
  const int64_t E = p.n_expert, k = p.k;
  XP_ASSERT(k >= 1 && k <= E);
  r.n_tokens = n_tokens;
  r.k = k;
  r.ids.resize(n_tokens * k);
  r.weights.resize(n_tokens * k);
  std::vector<float> probs(E), scores(p.uniform_seed ? E : 0);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < n_tokens; ++t) {
    // Softmax as ggml's: exp(x - max), summed in double, scaled by the float reciprocal.
    const float* l = logits + t * E;
    if (p.uniform_seed) {  // a speed-measurement mode: a uniformly random top k (uniform_routing.h)
      for (int64_t e = 0; e < E; ++e) scores[e] = uniform_route_score(l[e], (int)e, p.uniform_seed);
      l = scores.data();
    }
    const float mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += probs[e] = std::exp(l[e] - mx);
    const float inv = (float)(1.0 / sum);
    for (int64_t e = 0; e < E; ++e) probs[e] *= inv;

    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
    int32_t* ids = r.ids.data() + t * k;
    float* w = r.weights.data() + t * k;
    double wsum = 0;
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = order[j];
      w[j] = probs[order[j]];
      wsum += w[j];
    }
    if (p.norm_weights) {
      // llama.cpp clamps the sum to the smallest normal f16 so that it never divides by zero.
      const float s = std::max((float)wsum, 6.103515625e-5f);
      for (int64_t j = 0; j < k; ++j) w[j] /= s;
    }
    if (p.weights_scale != 0.0f && p.weights_scale != 1.0f)
      for (int64_t j = 0; j < k; ++j) w[j] *= p.weights_scale;
  }
}

namespace {

// The batched schedule when no expert of the batch has more rows than this; past it, splitting each
// expert's X rows (by_rows) reuses the weights better, and matmul takes its panel kernels.
constexpr int64_t kBatchedMaxRows = 7;

void mm(const Weight& w, const float* x, int64_t m, float* y, ThreadPool& pool) {
  matmul(w.type, w.data, w.ne[1], w.ne[0], x, m, y, w.ne[1], pool);
}

// Expert e on its grouped rows [r0, r0 + m): gather x, gate and up, SwiGLU, down into s.yg.
void run_expert(const MoeFfn& ffn, int64_t e, int64_t r0, int64_t m, const float* x,
                MoeScratch& s, ThreadPool& pool) {
  const int64_t D = ffn.n_embd, F = ffn.n_ff, k = ffn.n_used;
  float* xg = s.xg.data() + r0 * D;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t t = s.row_slot[r0 + i] / k;
    std::copy(x + t * D, x + (t + 1) * D, xg + i * D);
  }
  float* gate = s.gate.data() + r0 * F;
  float* up = s.up.data() + r0 * F;
  mm(expert_matrix(ffn.gate, e), xg, m, gate, pool);
  mm(expert_matrix(ffn.up, e), xg, m, up, pool);
  swiglu(gate, up, gate, m * F);
  mm(expert_matrix(ffn.down, e), gate, m, s.yg.data() + r0 * D, pool);
}

// Every expert's rows in two parallel regions (MoeSchedule::batched). An expert with one row reads x in
// place, so the experts of one decode token share one quantized copy of it.
void run_experts_batched(const MoeFfn& ffn, const std::vector<int32_t>& active,
                         const float* x, MoeScratch& s, ThreadPool& pool) {
  const int64_t D = ffn.n_embd, F = ffn.n_ff, k = ffn.n_used;
  std::vector<MatmulJob> jobs;
  auto job = [](const Weight& w, const float* xr, int64_t m, float* y) {
    return MatmulJob{.w_type = w.type, .w = w.data, .n = w.ne[1], .k = w.ne[0], .x = xr, .m = m, .y = y,
                          .ldy = w.ne[1]};
  };
  for (int32_t e : active) {
    const int64_t r0 = s.offsets[e], m = s.offsets[e + 1] - r0;
    const float* xr = x + (s.row_slot[r0] / k) * D;
    if (m > 1) {
      float* xg = s.xg.data() + r0 * D;
      for (int64_t i = 0; i < m; ++i) {
        const int64_t t = s.row_slot[r0 + i] / k;
        std::copy(x + t * D, x + (t + 1) * D, xg + i * D);
      }
      xr = xg;
    }
    jobs.push_back(job(expert_matrix(ffn.gate, e), xr, m, s.gate.data() + r0 * F));
    jobs.push_back(job(expert_matrix(ffn.up, e), xr, m, s.up.data() + r0 * F));
  }
  matmul_batch(jobs, pool);
  for (int32_t e : active) {  // these experts' rows only: the others may belong to another executor
    const int64_t r0 = s.offsets[e], m = s.offsets[e + 1] - r0;
    swiglu(s.gate.data() + r0 * F, s.up.data() + r0 * F, s.gate.data() + r0 * F, m * F);
  }
  jobs.clear();
  for (int32_t e : active) {
    const int64_t r0 = s.offsets[e], m = s.offsets[e + 1] - r0;
    jobs.push_back(job(expert_matrix(ffn.down, e), s.gate.data() + r0 * F, m, s.yg.data() + r0 * D));
  }
  matmul_batch(jobs, pool);
}

// The experts `active` (most rows first) of a grouped batch on the pool, in the schedule asked for or the
// one that suits their rows.
void run_cpu_experts(const MoeFfn& ffn, const std::vector<int32_t>& active, const float* x, MoeScratch& s,
                     ThreadPool& pool, MoeSchedule schedule) {
  if (active.empty()) return;
  int64_t n_rows = 0, max_rows = 0;
  for (int32_t e : active) {
    const int64_t m = s.offsets[e + 1] - s.offsets[e];
    n_rows += m;
    max_rows = std::max(max_rows, m);
  }
  const int nth = pool.size();
  if (schedule == MoeSchedule::automatic) {
    // Whole experts per thread when there are enough of them and none dominates the batch.
    // Few rows per expert: one region for all of them.
    const bool balanced = (int64_t)active.size() >= 2 * nth && max_rows * nth <= n_rows;
    schedule = nth == 1 ? MoeSchedule::by_rows
               : balanced ? MoeSchedule::by_expert
               : max_rows <= kBatchedMaxRows ? MoeSchedule::batched
                          : MoeSchedule::by_rows;
  }
  if (schedule == MoeSchedule::batched) {
    run_experts_batched(ffn, active, x, s, pool);
  } else if (schedule == MoeSchedule::by_expert) {
    static ThreadPool serial(1);  // no workers: safe to share between threads
    std::atomic<size_t> next{0};
    pool.run([&](int, int) {
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < active.size();) {
        const int32_t e = active[i];
        run_expert(ffn, e, s.offsets[e], s.offsets[e + 1] - s.offsets[e], x, s, serial);
      }
    });
  } else {
    for (int32_t e : active) run_expert(ffn, e, s.offsets[e], s.offsets[e + 1] - s.offsets[e], x, s, pool);
  }
}

// The experts of routing r (only those with (*include)[e] when include is given), grouped by expert, and
// their weighted sum per token in slot order into out (see moe_experts_partial).
void run_experts(const MoeFfn& ffn, const float* x, int64_t n, const Routing& r,
                 const std::vector<bool>* include, float* out, bool accumulate, MoeScratch& s, ThreadPool& pool,
                 MoeSchedule schedule) {
  ExpertExecutor* exec = ffn.exec;
  const int64_t D = ffn.n_embd, F = ffn.n_ff, E = ffn.n_expert, k = ffn.n_used, n_slots = n * k;
  XP_ASSERT(r.n_tokens == n && r.k == k && (int64_t)r.ids.size() == n_slots);
  XP_ASSERT(!include || (int64_t)include->size() == E);
  auto included = [&](int32_t e) { return !include || (*include)[e]; };

  // Group the included (token, slot) rows by expert, tokens in order within an expert (a counting sort).
  s.offsets.assign(E + 1, 0);
  for (int64_t i = 0; i < n_slots; ++i)
    if (included(r.ids[i])) ++s.offsets[r.ids[i] + 1];
  for (int64_t e = 0; e < E; ++e) s.offsets[e + 1] += s.offsets[e];
  const int64_t n_rows = s.offsets[E];
  s.row_slot.resize(n_rows);
  s.slot_row.resize(n_slots);
  {
    std::vector<int32_t> fill(s.offsets.begin(), s.offsets.end() - 1);
    for (int64_t i = 0; i < n_slots; ++i) {
      if (!included(r.ids[i])) {
        s.slot_row[i] = -1;
        continue;
      }
      const int32_t row = fill[r.ids[i]]++;
      s.row_slot[row] = (int32_t)i;
      s.slot_row[i] = row;
    }
  }
  s.xg.resize(n_rows * D);
  s.gate.resize(n_rows * F);
  s.up.resize(n_rows * F);
  s.yg.resize(n_rows * D);

  std::vector<int32_t> active;  // experts with rows, most rows first
  for (int64_t e = 0; e < E; ++e)
    if (s.offsets[e + 1] > s.offsets[e]) active.push_back((int32_t)e);
  std::stable_sort(active.begin(), active.end(), [&](int32_t a, int32_t b) {
    return s.offsets[a + 1] - s.offsets[a] > s.offsets[b + 1] - s.offsets[b];
  });

  // The executor's experts: the first of `active` (most rows first) while they bring its rows nearest to its
  // share; the CPU computes the others meanwhile.
  std::vector<int32_t> on_exec, on_cpu;
  if (exec) {
    const double want = ffn.exec_share.of(n) * (double)n_rows;
    int64_t taken = 0;
    for (int32_t e : active) {
      const int64_t m = s.offsets[e + 1] - s.offsets[e];
      if ((double)taken + 0.5 * (double)m <= want) {
        on_exec.push_back(e);
        taken += m;
      } else {
        on_cpu.push_back(e);
      }
    }
  } else {
    on_cpu = std::move(active);
  }
  int64_t exec_rows = 0;
  if (!on_exec.empty()) {
    // The executor gets its experts' rows gathered into buffers of its own, in task order.
    std::vector<ExpertTask> tasks;
    for (int32_t e : on_exec) {
      const int64_t m = s.offsets[e + 1] - s.offsets[e];
      tasks.push_back({.expert = e, .row0 = (int32_t)exec_rows, .n_rows = (int32_t)m});
      exec_rows += m;
    }
    s.xe.resize(exec_rows * D);
    s.ye.resize(exec_rows * D);
    for (const ExpertTask& t : tasks)
      for (int64_t i = 0; i < t.n_rows; ++i) {
        const int64_t tok = s.row_slot[s.offsets[t.expert] + i] / k;
        std::copy(x + tok * D, x + (tok + 1) * D, s.xe.data() + (t.row0 + i) * D);
      }
    exec->start(ffn, tasks, s.xe.data(), exec_rows, s.ye.data());
    try {
      run_cpu_experts(ffn, on_cpu, x, s, pool, schedule);
    } catch (...) {
      try { exec->wait(); } catch (...) {}  // nothing may write the buffers once they are given up
      throw;
    }
    exec->wait();
    for (const ExpertTask& t : tasks)
      std::copy(s.ye.data() + t.row0 * D, s.ye.data() + (t.row0 + t.n_rows) * D,
                s.yg.data() + s.offsets[t.expert] * D);
  } else {
    run_cpu_experts(ffn, on_cpu, x, s, pool, schedule);
  }

  // Weighted sum in slot order, as llama.cpp adds its expert views: ((w0 y0 + w1 y1) + w2 y2) + ...
  auto combine = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* o = out + t * D;
      bool first = !accumulate;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = s.slot_row[t * k + j];
        if (row < 0) continue;
        const float w = r.weights[t * k + j];
        const float* y = s.yg.data() + (int64_t)row * D;
        if (first) {
          for (int64_t i = 0; i < D; ++i) o[i] = w * y[i];
          first = false;
        } else {
          for (int64_t i = 0; i < D; ++i) o[i] += w * y[i];
        }
      }
      if (first) std::fill(o, o + D, 0.0f);  // out= and no slot of this token is included
    }
  };
  if (n * k * D >= 65536) pool.parallel_for(n, combine, 1);
  else combine(0, n);
}

}  // namespace

void moe_route(const MoeFfn& ffn, const float* x, int64_t n, Routing& r, MoeScratch& s,
               ThreadPool& pool) {
  s.logits.resize(n * ffn.n_expert);
  mm(ffn.router, x, n, s.logits.data(), pool);
  route_top_k(s.logits.data(), n, ffn.router_params(), r);
}

void moe_ffn(const MoeFfn& ffn, const float* x, int64_t n, float* out, MoeScratch& s, ThreadPool& pool,
             MoeSchedule schedule) {
  moe_route(ffn, x, n, s.routing, s, pool);
  if (ffn.stats && ffn.layer >= 0) ffn.stats->add(ffn.layer, s.routing.ids);
  run_experts(ffn, x, n, s.routing, nullptr, out, false, s, pool, schedule);
}

void moe_experts_partial(const MoeFfn& ffn, const float* x, int64_t n, const Routing& r,
                         const std::vector<bool>& include, float* out, bool accumulate, MoeScratch& s,
                         ThreadPool& pool, MoeSchedule schedule) {
  if (n == 0) return;
  // r may be s.routing (what moe_route filled): run_experts only reads it.
  run_experts(ffn, x, n, r, &include, out, accumulate, s, pool, schedule);
}

void moe_ffn_reference(const MoeFfn& ffn, const float* x, int64_t n, float* out) {
  const int64_t D = ffn.n_embd, F = ffn.n_ff, E = ffn.n_expert, k = ffn.n_used;
  std::vector<float> logits(n * E), gate(F), up(F), y(D);
  auto ref = [](const Weight& w, const float* xr, float* yr) {
    matmul_reference(w.type, w.data, w.ne[1], w.ne[0], xr, 1, yr, w.ne[1]);
  };
  for (int64_t t = 0; t < n; ++t) ref(ffn.router, x + t * D, logits.data() + t * E);
  Routing r;
  route_top_k(logits.data(), n, ffn.router_params(), r);
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = r.ids[t * k + j];
      ref(expert_matrix(ffn.gate, e), x + t * D, gate.data());
      ref(expert_matrix(ffn.up, e), x + t * D, up.data());
      for (int64_t i = 0; i < F; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
      ref(expert_matrix(ffn.down, e), gate.data(), y.data());
      for (int64_t i = 0; i < D; ++i) o[i] += r.weights[t * k + j] * y[i];
    }
  }
}

}  // namespace xpert::cpu
