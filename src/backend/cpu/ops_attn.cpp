// Tiled attention with an online softmax (flash-style) and split-K decode, for rows that see many keys.
//
// A work item is one kv head and a block of query tokens: its rows are every (token, head) of that kv
// head's group, so each K / V tile is dequantized to f32 once and used by all of them (GQA shares the
// reads). Keys are walked in tiles of kAttnBlock on an absolute grid; per row a running max m, sum l and
// output o are rescaled when the max grows (no n_kv-long score row). Tiles are grouped in chunks of
// kAttnChunk keys: each chunk starts from an empty state and chunks are merged left to right. Prefill
// walks a row's chunks in one thread; decode (few items) hands the chunks to different threads and merges
// their partial (m, l, o) after — the same operations in the same order, so both give the same bits for
// a row, whatever the thread count or the rest of the batch (chunked prefill equals one-shot prefill).
//
// Precision: q is rounded to f16 as in the short path; the softmax weights are not (they are not
// normalized until the end). Scores and products in f32 over the exact dequantized cache values.
#include "backend/cpu/ops_attn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_f16.h"
#include "base/cpu_features.h"
#include "quant/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace xpert::cpu {

void attn_scores_scalar(const float* q, int64_t R, const float* k, int64_t J, int64_t D, float* s, int64_t lds) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < J; ++j) {
      float acc = 0.0f;
      for (int64_t c = 0; c < D; ++c) acc += q[r * D + c] * k[j * D + c];
      s[r * lds + j] = acc;
    }
}

void attn_pv_scalar(const float* p, int64_t ldp, int64_t R, const float* v, int64_t J, int64_t D, float* o) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < J; ++j) {
      const float w = p[r * ldp + j];
      for (int64_t c = 0; c < D; ++c) o[r * D + c] += w * v[j * D + c];
    }
}

void attn_rows_f32_scalar(DType type, const uint8_t* src, size_t stride, int64_t J, int64_t D, float* out) {
  for (int64_t j = 0; j < J; ++j) dequantize_row(type, src + j * stride, out + j * D, D);
}

const AttnTileKernels& attn_tile_kernels() {
  static const AttnTileKernels scalar{attn_scores_scalar, attn_pv_scalar, attn_rows_f32_scalar};
  static const AttnTileKernels avx2{attn_scores_avx2, attn_pv_avx2, attn_rows_f32_avx2};
  return best_isa() >= Isa::avx2 ? avx2 : scalar;
}

namespace {

// Denormals flushed to zero (FTZ + DAZ) while a thread runs tiled attention, restored after. The
// unnormalized weights go down to e^-87 and their products with V below FLT_MIN; on x86 every denormal
// operand costs ~100 cycles, and with the sharp scores of real (and synthetic) models most of a long
// row's weights are that small: decode at depth 8K ran 3x slower than with random test scores. The
// short path does not see them (its weights are rounded to f16, which flushes them to 0). A value
// under 1.2e-38 of the row's largest weight changes nothing; every run of this path flushes the same
// way, so its bits still depend only on the row.
struct FlushDenormals {
#if defined(__x86_64__) || defined(__i386__)
  unsigned saved = _mm_getcsr();
  FlushDenormals() { _mm_setcsr(saved | 0x8040); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

// One kv head's slice of cache rows as f32.
struct SliceReader {
  DType type;
  const uint8_t* base;
  size_t row, head;  // bytes per cache row, per head slice
  int64_t D;
  void read(int64_t j0, int64_t J, int64_t hk, float* out) const {
    attn_tile_kernels().rows_f32(type, base + j0 * row + hk * head, row, J, D, out);
  }
};

struct Ctx {
  const AttentionArgs& a;
  SliceReader k, v;
  int64_t group, tq, n_tblocks, min_keys;
};

// Softmax state of R rows: running max, sum, and unnormalized output (R x D).
struct State {
  std::vector<float> m, l, o;
  void reset(int64_t R, int64_t D) {
    m.assign(R, -INFINITY);
    l.assign(R, 0.0f);
    o.assign(R * D, 0.0f);
  }
};

// Rows of one item: row r = (token t0 + r / group, head hk * group + r % group); [lo, hi] its visible
// keys, empty (lo > hi) when the row is not this path's.
struct Rows {
  int64_t hk, t0, R;
  std::vector<int64_t> lo, hi;
  int64_t lo_min = INT64_MAX, hi_max = -1;
};

Rows item_rows(const Ctx& c, int64_t item) {
  const AttentionArgs& a = c.a;
  Rows rs;
  rs.hk = item / c.n_tblocks;
  rs.t0 = (item % c.n_tblocks) * c.tq;
  const int64_t t1 = std::min(a.n_tokens, rs.t0 + c.tq);
  rs.R = (t1 - rs.t0) * c.group;
  rs.lo.resize(rs.R);
  rs.hi.resize(rs.R);
  for (int64_t r = 0; r < rs.R; ++r) {
    const int32_t p = a.pos[rs.t0 + r / c.group];
    int64_t lo = a.sliding_window > 0 ? std::max<int64_t>(0, p - a.sliding_window + 1) : 0;
    int64_t hi = std::min<int64_t>(p, a.n_kv - 1);
    if (hi - lo + 1 < c.min_keys) lo = 1, hi = 0;
    rs.lo[r] = lo;
    rs.hi[r] = hi;
    if (lo <= hi) rs.lo_min = std::min(rs.lo_min, lo), rs.hi_max = std::max(rs.hi_max, hi);
  }
  return rs;
}

// The rows' q, rounded to f16 as the short path does.
void load_q(const Ctx& c, const Rows& rs, float* qh) {
  const int64_t D = c.a.head_dim;
  for (int64_t r = 0; r < rs.R; ++r) {
    const int64_t t = rs.t0 + r / c.group, h = rs.hk * c.group + r % c.group;
    const float* q = c.a.q + (t * c.a.n_head + h) * D;
    std::copy(q, q + D, qh + r * D);
  }
  f16_kernels().round_f16(qh, rs.R * D);
}

// Per-thread buffers.
struct Scratch {
  std::vector<float> qh, kt, vt, s;
  State part, run;
};

// One chunk of keys for every row of the item, from an empty state into st.
void run_chunk(const Ctx& c, const Rows& rs, int64_t chunk, const float* qh, Scratch& w, State& st) {
  const AttentionArgs& a = c.a;
  const int64_t D = a.head_dim, R = rs.R;
  const AttnTileKernels& tk = attn_tile_kernels();
  const F16Kernels& f16 = f16_kernels();
  st.reset(R, D);
  const int64_t c0 = std::max(chunk * kAttnChunk, rs.lo_min), c1 = std::min((chunk + 1) * kAttnChunk - 1, rs.hi_max);
  for (int64_t jb = c0 - c0 % kAttnBlock; jb <= c1; jb += kAttnBlock) {
    const int64_t j0 = std::max(jb, c0), j1 = std::min(jb + kAttnBlock - 1, c1), J = j1 - j0 + 1;
    c.k.read(j0, J, rs.hk, w.kt.data());
    c.v.read(j0, J, rs.hk, w.vt.data());
    float* S = w.s.data();
    tk.scores(qh, R, w.kt.data(), J, D, S, kAttnBlock);
    for (int64_t r = 0; r < R; ++r) {
      float* sr = S + r * kAttnBlock;
      const int64_t v0 = std::max(rs.lo[r], j0) - j0, v1 = std::min(rs.hi[r], j1) - j0;
      if (v0 > v1) {
        std::fill(sr, sr + J, 0.0f);
        continue;
      }
      float mb = -INFINITY;
      for (int64_t j = v0; j <= v1; ++j) mb = std::max(mb, sr[j] *= a.kq_scale);
      const float m_old = st.m[r], m_new = std::max(m_old, mb);
      if (m_old != -INFINITY && m_new > m_old) {
        const float alpha = std::exp(m_old - m_new);
        st.l[r] *= alpha;
        for (int64_t d = 0; d < D; ++d) st.o[r * D + d] *= alpha;
      }
      st.m[r] = m_new;
      st.l[r] += (float)f16.exp_sum(sr + v0, m_new, sr + v0, v1 - v0 + 1);
      std::fill(sr, sr + v0, 0.0f);
      std::fill(sr + v1 + 1, sr + J, 0.0f);
    }
    tk.pv(S, kAttnBlock, R, w.vt.data(), J, D, st.o.data());
  }
}

// run <- merge(run, part), row by row; a row's first partial is copied.
void merge(State& run, const State& part, int64_t R, int64_t D) {
  for (int64_t r = 0; r < R; ++r) {
    if (part.m[r] == -INFINITY) continue;
    float* o = run.o.data() + r * D;
    const float* po = part.o.data() + r * D;
    if (run.m[r] == -INFINITY) {
      run.m[r] = part.m[r];
      run.l[r] = part.l[r];
      std::copy(po, po + D, o);
      continue;
    }
    const float m = std::max(run.m[r], part.m[r]);
    const float ea = std::exp(run.m[r] - m), eb = std::exp(part.m[r] - m);
    run.m[r] = m;
    run.l[r] = run.l[r] * ea + part.l[r] * eb;
    for (int64_t d = 0; d < D; ++d) o[d] = o[d] * ea + po[d] * eb;
  }
}

void write_out(const Ctx& c, const Rows& rs, const State& run) {
  const int64_t D = c.a.head_dim;
  for (int64_t r = 0; r < rs.R; ++r) {
    if (rs.lo[r] > rs.hi[r]) continue;
    const int64_t t = rs.t0 + r / c.group, h = rs.hk * c.group + r % c.group;
    float* out = c.a.out + (t * c.a.n_head + h) * D;
    const float inv = 1.0f / run.l[r];
    for (int64_t d = 0; d < D; ++d) out[d] = run.o[r * D + d] * inv;
  }
}

void size_scratch(Scratch& w, int64_t rows, int64_t D) {
  w.qh.resize(rows * D);
  w.kt.resize(kAttnBlock * D);
  w.vt.resize(kAttnBlock * D);
  w.s.resize(rows * kAttnBlock);
}

}  // namespace

void attention_tiled(const AttentionArgs& a, ThreadPool& pool, int64_t min_keys) {
  const int64_t D = a.head_dim, group = a.n_head / a.n_head_kv;
  const int64_t kv_row = a.n_head_kv * D;
  // About 32 rows per item: enough to reuse each tile, small enough for the tiles to stay in L1/L2.
  const int64_t tq = std::max<int64_t>(1, 32 / group);
  const int64_t n_tblocks = (a.n_tokens + tq - 1) / tq;
  const Ctx c{a,
              {a.k_type, static_cast<const uint8_t*>(a.k), row_bytes(a.k_type, kv_row), row_bytes(a.k_type, D), D},
              {a.v_type, static_cast<const uint8_t*>(a.v), row_bytes(a.v_type, kv_row), row_bytes(a.v_type, D), D},
              group, tq, n_tblocks, min_keys};
  const int64_t n_items = a.n_head_kv * n_tblocks, rows_max = tq * group;
  const int64_t n_chunks = (a.n_kv + kAttnChunk - 1) / kAttnChunk;

  if (n_items >= 4 * (int64_t)pool.size() || n_chunks <= 1) {
    // Prefill: an item per task, its chunks in order.
    pool.parallel_for(n_items, [&](int64_t begin, int64_t end) {
      const FlushDenormals ftz;
      Scratch w;
      size_scratch(w, rows_max, D);
      for (int64_t item = begin; item < end; ++item) {
        const Rows rs = item_rows(c, item);
        if (rs.hi_max < 0) continue;
        load_q(c, rs, w.qh.data());
        w.run.reset(rs.R, D);
        for (int64_t ch = rs.lo_min / kAttnChunk; ch <= rs.hi_max / kAttnChunk; ++ch) {
          run_chunk(c, rs, ch, w.qh.data(), w, w.part);
          merge(w.run, w.part, rs.R, D);
        }
        write_out(c, rs, w.run);
      }
    });
    return;
  }
  // Split-K (decode, or few rows): every (item, chunk) a task writing its partial state, then the
  // partials of each item merged in chunk order.
  std::vector<Rows> items(n_items);
  for (int64_t i = 0; i < n_items; ++i) items[i] = item_rows(c, i);
  std::vector<State> parts(n_items * n_chunks);
  pool.parallel_for(n_items * n_chunks, [&](int64_t begin, int64_t end) {
    const FlushDenormals ftz;
    Scratch w;
    size_scratch(w, rows_max, D);
    int64_t q_item = -1;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t item = task / n_chunks, ch = task % n_chunks;
      const Rows& rs = items[item];
      if (rs.hi_max < 0 || ch < rs.lo_min / kAttnChunk || ch > rs.hi_max / kAttnChunk) continue;
      if (q_item != item) load_q(c, rs, w.qh.data()), q_item = item;
      run_chunk(c, rs, ch, w.qh.data(), w, parts[task]);
    }
  });
  // The merge is small (items x chunks x rows x D): here, rather than a second fork-join, which on
  // shared cores costs more than it saves.
  const FlushDenormals ftz;
  State run;
  for (int64_t item = 0; item < n_items; ++item) {
    const Rows& rs = items[item];
    if (rs.hi_max < 0) continue;
    run.reset(rs.R, D);
    for (int64_t ch = rs.lo_min / kAttnChunk; ch <= rs.hi_max / kAttnChunk; ++ch)
      merge(run, parts[item * n_chunks + ch], rs.R, D);
    write_out(c, rs, run);
  }
}

}  // namespace xpert::cpu
