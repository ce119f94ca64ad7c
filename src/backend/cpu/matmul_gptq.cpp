// Driver of the native GPTQ products (matmul_gptq.h): pack X, split the columns over threads; and the
// scalar kernel.
#include "backend/cpu/matmul_gptq.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "base/cpu_features.h"
#include "base/error.h"
#include "base/half.h"
#include "quant/blocks.h"
#include "quant/gptq.h"
#include "quant/quant.h"

namespace xpert::cpu {

namespace {

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct Layout {
  size_t d_offset, sx_offset, row_bytes;
};
Layout layout(int64_t k, int64_t group) {
  Layout l;
  l.d_offset = (size_t)k;
  l.sx_offset = l.d_offset + 4 * (size_t)(k / quant::kQK);
  l.row_bytes = round_up(l.sx_offset + 4 * (size_t)(k / group), 64);
  return l;
}

// One X row: Q8_0 (the quantizer Q4_0 weights use), quants reordered even-odd per 8, scales as f32,
// and the per-group sums of the rounded values.
void pack_row(const float* x, int64_t k, int64_t group, const Layout& l, uint8_t* out) {
  thread_local std::vector<quant::BlockQ8_0> blocks;
  blocks.resize((size_t)(k / quant::kQK));
  quantize_row_activation(DType::Q8_0, x, blocks.data(), k);
  auto* d = reinterpret_cast<float*>(out + l.d_offset);
  auto* sx = reinterpret_cast<float*>(out + l.sx_offset);
  for (int64_t g = 0; g < k / group; ++g) sx[g] = 0;
  for (int64_t b = 0; b < k / quant::kQK; ++b) {
    const quant::BlockQ8_0& blk = blocks[(size_t)b];
    d[b] = f16_to_f32(blk.d);
    int sum = 0;
    for (int p = 0; p < 4; ++p)
      for (int r = 0; r < 4; ++r) {
        out[b * 32 + p * 8 + r] = (uint8_t)blk.qs[p * 8 + 2 * r];
        out[b * 32 + p * 8 + 4 + r] = (uint8_t)blk.qs[p * 8 + 2 * r + 1];
        sum += blk.qs[p * 8 + 2 * r] + blk.qs[p * 8 + 2 * r + 1];
      }
    sx[b * quant::kQK / group] += d[b] * (float)sum;
  }
}

void kernel_scalar(const GptqArgs& a, int64_t j0, int64_t j1, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const uint8_t* xr = a.x + (size_t)i * a.x_row_bytes;
    const auto* xq = reinterpret_cast<const int8_t*>(xr);
    const auto* d = reinterpret_cast<const float*>(xr + a.d_offset);
    const auto* sx = reinterpret_cast<const float*>(xr + a.sx_offset);
    for (int64_t j = j0; j < j1; ++j) {
      float acc = 0;
      for (int64_t g = 0; g < a.k / a.group; ++g) {
        float gacc = 0;
        for (int64_t b = g * a.group / 32; b < (g + 1) * a.group / 32; ++b) {
          int32_t isum = 0;
          for (int64_t p = 4 * b; p < 4 * b + 4; ++p) {
            uint32_t w;
            std::memcpy(&w, a.qweight + 4 * (p * a.n + j), 4);
            for (int r = 0; r < 4; ++r)
              isum += (int32_t)((w >> (8 * r)) & 0xF) * xq[8 * p + r] + (int32_t)((w >> (8 * r + 4)) & 0xF) * xq[8 * p + 4 + r];
          }
          gacc += d[b] * (float)isum;
        }
        uint16_t s;
        std::memcpy(&s, a.scales + 2 * (g * a.n + j), 2);
        const float zero = a.zeros ? (float)a.zeros[g * a.n + j] : 8.0f;
        acc += f16_to_f32(s) * (gacc - zero * sx[g]);
      }
      a.y[i * a.ldy + j] = acc;
    }
  }
}

GptqKernel kernel_for(Isa isa) {
  switch (isa) {
    case Isa::avx512: return gptq_kernel_avx512();
    case Isa::avx2: return gptq_kernel_avx2();
    case Isa::scalar: break;
  }
  return gptq_kernel_scalar();
}

// Columns per chunk handed to a thread: whole 64-column tiles (AVX-512 decode), about `bytes` of weights.
int64_t chunk_cols(int64_t k, int64_t n, size_t bytes) {
  const size_t col_bytes = (size_t)k / 2 + 1;
  return std::min<int64_t>(n, (int64_t)round_up(std::max<size_t>(1, bytes / col_bytes), 64));
}

}  // namespace

GptqKernel gptq_kernel_scalar() { return kernel_scalar; }

void matmul_batch_gptq(std::span<const MatmulJob> jobs, ThreadPool& pool) {
  if (jobs.empty()) return;
  // Packed X of every distinct (x, m, k, group), in one per-caller buffer that only grows.
  struct Key {
    const float* x;
    int64_t m, k, group;
    size_t offset;
  };
  std::vector<Key> keys;
  std::vector<size_t> offset(jobs.size());
  size_t total = 0, w_bytes = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    XP_ASSERT(is_gptq(j.w_type) && j.n >= 0 && j.m >= 0 && j.ldy >= j.n && j.k % gptq_group(j.w_type) == 0);
    const int64_t group = gptq_group(j.w_type);
    auto it = std::find_if(keys.begin(), keys.end(), [&](const Key& key) {
      return key.x == j.x && key.m == j.m && key.k == j.k && key.group == group;
    });
    if (it == keys.end()) {
      keys.push_back({j.x, j.m, j.k, group, total});
      total += layout(j.k, group).row_bytes * (size_t)j.m;
      it = keys.end() - 1;
    }
    offset[i] = it->offset;
    w_bytes += row_bytes(j.w_type, j.k) * (size_t)j.n;
  }
  thread_local std::vector<uint8_t> storage;
  storage.resize(total + 64);
  uint8_t* packed = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(storage.data()), 64));
  size_t rows = 0;
  for (const Key& key : keys) rows += (size_t)key.m;
  auto pack_key = [&](const Key& key) {
    const Layout l = layout(key.k, key.group);
    for (int64_t r = 0; r < key.m; ++r) pack_row(key.x + r * key.k, key.k, key.group, l, packed + key.offset + r * l.row_bytes);
  };
  if (keys.size() == 1 && rows >= 8 && pool.size() > 1) {
    const Key& key = keys[0];
    const Layout l = layout(key.k, key.group);
    pool.parallel_for(key.m, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) pack_row(key.x + r * key.k, key.k, key.group, l, packed + key.offset + r * l.row_bytes);
    });
  } else {
    for (const Key& key : keys) pack_key(key);
  }

  // Chunks of whole 64-column tiles, about a quarter of a thread's share of the bytes each, handed out one at
  // a time (as matmul_batch does for the row formats).
  struct Chunk {
    size_t job;
    int64_t j0, j1;
  };
  std::vector<Chunk> chunks;
  const size_t chunk_bytes = std::clamp<size_t>(w_bytes / (size_t)pool.size() / 4, 32 << 10, 256 << 10);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const int64_t cols = std::max<int64_t>(1, chunk_cols(jobs[i].k, jobs[i].n, chunk_bytes));
    for (int64_t c = 0; c < jobs[i].n; c += cols) chunks.push_back({i, c, std::min(jobs[i].n, c + cols)});
  }
  const GptqKernel kernel = kernel_for(best_isa());
  auto args = [&](size_t i) {
    const MatmulJob& j = jobs[i];
    const int64_t group = gptq_group(j.w_type);
    const Layout l = layout(j.k, group);
    const gptq::NativeView v = gptq::native_view(j.w_type, j.w, j.k, j.n);
    return GptqArgs{v.qweight, v.scales,       v.zeros,     j.n, j.k, group, packed + offset[i],
                    l.row_bytes, l.d_offset, l.sx_offset, j.y, j.ldy};
  };
  std::atomic<size_t> next{0};
  auto work = [&](int, int) {
    for (size_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks.size();) {
      const GptqArgs a = args(chunks[c].job);
      kernel(a, chunks[c].j0, chunks[c].j1, 0, jobs[chunks[c].job].m);
    }
  };
  if (pool.size() == 1 || chunks.size() == 1) work(0, 1);
  else pool.run(work);
}

void matmul_gptq(DType w_type, const void* w, int64_t n, int64_t k, const float* x, int64_t m, float* y,
                 int64_t ldy, ThreadPool& pool) {
  const MatmulJob job{.w_type = w_type, .w = w, .n = n, .k = k, .x = x, .m = m, .y = y, .ldy = ldy};
  matmul_batch_gptq(std::span<const MatmulJob>(&job, 1), pool);
}

}  // namespace xpert::cpu
