// Driver of the CPU matmul: quantize and pack X, choose the ISA's kernel once, split the output over threads.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "backend/cpu/matmul_gptq.h"
#include "backend/cpu/matmul_kernels.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "base/half.h"
#include "quant/blocks.h"
#include "quant/gptq.h"
#include "quant/quant.h"

namespace xpert::cpu {

namespace {

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// The aux plane the panel kernels read (matmul_kernels.h): entries per row, and for the Q8_0 family the
// weight levels' offset.
int64_t aux_entries(DType w, int64_t k) {
  switch (w) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: return k / 32;
    case DType::Q6_K: return k / 16;
    default: return 0;
  }
}
int32_t level_offset(DType w) { return w == DType::Q4_0 ? 8 : w == DType::Q5_0 ? 16 : 128; }

// aux_for: the weight type whose aux plane to add (DType::F32: none).
PackedLayout packed_layout(DType act, int64_t k, DType aux_for) {
  PackedLayout l;
  switch (act) {
    case DType::Q8_0:
      l.d_offset = (size_t)k;
      l.sum_offset = l.d_offset + 4 * (size_t)(k / quant::kQK);
      l.row_bytes = l.sum_offset + 4 * (size_t)(k / quant::kQK);
      break;
    case DType::Q8_K:
      l.d_offset = (size_t)k;
      l.sum_offset = l.d_offset + 4 * (size_t)(k / quant::kQKK);
      l.row_bytes = l.sum_offset + 2 * (size_t)(k / 16);
      break;
    default: l.row_bytes = 4 * (size_t)k; break;
  }
  if (const int64_t n_aux = aux_entries(aux_for, k)) {
    l.aux_offset = round_up(l.row_bytes, 4);
    l.row_bytes = l.aux_offset + 4 * (size_t)n_aux;
  }
  l.row_bytes = round_up(l.row_bytes, kPackAlign);
  return l;
}

// One X row into its packed planes. `scratch` holds the ggml-layout blocks in between.
void pack_row(DType act, DType aux_for, const float* x, int64_t k, const PackedLayout& l, uint8_t* out,
              std::vector<uint8_t>& scratch) {
  if (best_isa() == Isa::avx512) {
    if (act == DType::Q8_0) return pack_row_q8_0_avx512(x, k, l, level_offset(aux_for), out);
    if (act == DType::Q8_K) return pack_row_q8_k_avx512(x, k, l, out);
  }
  scratch.resize(std::max(row_bytes(act, k), (size_t)4 * k));
  quantize_row_activation(act, x, scratch.data(), k);
  switch (act) {
    case DType::Q8_0: {
      const auto* b = reinterpret_cast<const quant::BlockQ8_0*>(scratch.data());
      auto* d = reinterpret_cast<float*>(out + l.d_offset);
      auto* s = reinterpret_cast<int32_t*>(out + l.sum_offset);
      for (int64_t i = 0; i < k / quant::kQK; ++i) {
        std::memcpy(out + i * quant::kQK, b[i].qs, quant::kQK);
        d[i] = f16_to_f32(b[i].d);
        int sum = 0;
        for (int j = 0; j < quant::kQK; ++j) sum += b[i].qs[j];
        s[i] = -sum;
        if (l.aux_offset) reinterpret_cast<int32_t*>(out + l.aux_offset)[i] = -sum * level_offset(aux_for);
      }
      return;
    }
    case DType::Q8_K: {
      const auto* b = reinterpret_cast<const quant::BlockQ8_K*>(scratch.data());
      auto* d = reinterpret_cast<float*>(out + l.d_offset);
      auto* s = reinterpret_cast<int16_t*>(out + l.sum_offset);
      for (int64_t i = 0; i < k / quant::kQKK; ++i) {
        std::memcpy(out + i * quant::kQKK, b[i].qs, quant::kQKK);
        d[i] = b[i].d;
        std::memcpy(s + i * 16, b[i].bsums, sizeof b[i].bsums);
        if (!l.aux_offset) continue;  // Q6_K's (the only K-quant aux plane)
        auto* aux = reinterpret_cast<int32_t*>(out + l.aux_offset) + i * 16;
        for (int j = 0; j < 16; ++j) aux[j] = -32 * b[i].bsums[j];
      }
      return;
    }
    default:
      // F32 / F16 / BF16: keep f32 values rounded through the activation type (same products as ggml's).
      dequantize_row(act, scratch.data(), reinterpret_cast<float*>(out), k);
      return;
  }
}

TileKernel pick_kernel(const MatmulKernels& t, DType w) {
  switch (w) {
    case DType::F32: return t.f32;
    case DType::F16: return t.f16;
    case DType::BF16: return t.bf16;
    case DType::Q4_0: return t.q4_0;
    case DType::Q5_0: return t.q5_0;
    case DType::Q8_0: return t.q8_0;
    case DType::Q4_K: return t.q4_k;
    case DType::Q5_K: return t.q5_k;
    case DType::Q6_K: return t.q6_k;
    default: return nullptr;
  }
}

PanelKernel pick_panel_kernel(const PanelKernels& t, DType w) {
  switch (w) {
    case DType::Q4_0: return t.q4_0;
    case DType::Q5_0: return t.q5_0;
    case DType::Q8_0: return t.q8_0;
    case DType::Q4_K: return t.q4_k;
    case DType::Q5_K: return t.q5_k;
    case DType::Q6_K: return t.q6_k;
    default: return nullptr;
  }
}

const MatmulKernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::avx512: return matmul_kernels_avx512();
    case Isa::avx2: return matmul_kernels_avx2();
    case Isa::scalar: break;
  }
  return matmul_kernels_scalar();
}

// Cache blocking: a thread walks X in chunks that stay in L2 and, inside, its weight rows in chunks that
// stay in L1, so each weight block is unpacked once per few X rows and each X row is reused across them.
constexpr int64_t kXChunkRows = 64;
constexpr int64_t kWChunkRows = 16;

// From this many X rows on, repacking the weights into panels (once per call) pays for itself.
constexpr int64_t kPanelMinRows = 8;

std::atomic<int> g_panel_choice{(int)PanelChoice::automatic};

struct Panel {
  PanelKernel kernel = nullptr;
  int64_t x_rows_align = 1;  // the packed X is padded to a multiple of this many rows
};

// The prefill kernel for m X rows: AMX tiles (16 X rows at a time: from kAmxMinRows rows on, fewer would
// leave most of a tile empty), the VNNI panels, or none (the tiles). Batch invariance needs no choice here:
// every quantized kernel gives a row the bits of decode (one float order per row: matmul_simd.inl).
std::atomic<bool> g_batch_invariant{false};

Panel pick_panel(DType w, int64_t m, Isa isa) {
  if (m < kPanelMinRows || isa != Isa::avx512) return {};
  PanelKernel amx = nullptr;
  switch ((PanelChoice)g_panel_choice.load(std::memory_order_relaxed)) {
    case PanelChoice::automatic:
      if ((w == DType::Q4_K || w == DType::Q6_K) && m <= kFewRowsMax) return {};  // the rows kernels
      if (m >= kAmxMinRows && w != DType::Q6_K && amx_enabled())
        amx = pick_panel_kernel(matmul_panel_kernels_amx(), w);
      break;
    case PanelChoice::amx:
      if (amx_enabled()) amx = pick_panel_kernel(matmul_panel_kernels_amx(), w);
      break;
    case PanelChoice::amx_emulated: amx = pick_panel_kernel(matmul_panel_kernels_amx_emulated(), w); break;
    case PanelChoice::vnni: break;
  }
  if (amx) return {amx, kAmxXRows};
  return {pick_panel_kernel(matmul_panel_kernels_avx512(), w), 1};
}

}  // namespace

// X rows per kernel call.
int64_t x_step(DType, Isa) { return kXChunkRows; }

void set_panel_choice(PanelChoice choice) { g_panel_choice.store((int)choice); }
void set_batch_invariant(bool on) { g_batch_invariant.store(on); }
bool batch_invariant() { return g_batch_invariant.load(); }

namespace {
// W rows [j0, j1) against packed X rows [i0, i1), tile by tile (kXChunkRows x kWChunkRows): the loop of
// matmul and matmul_batch.
void tile_rows(TileKernel kernel, int64_t k, const uint8_t* w, size_t w_row_bytes, const uint8_t* packed,
               const PackedLayout& layout, int64_t j0, int64_t j1, int64_t i0, int64_t i1, float* y, int64_t ldy,
               int64_t x_step) {
  for (int64_t xc = i0; xc < i1; xc += x_step) {
    const int64_t nx = std::min(x_step, i1 - xc);
    for (int64_t wc = j0; wc < j1; wc += kWChunkRows) {
      const int64_t nw = std::min(kWChunkRows, j1 - wc);
      kernel(k, w + wc * w_row_bytes, w_row_bytes, nw, packed + xc * layout.row_bytes, layout, nx, y + xc * ldy + wc,
             ldy);
    }
  }
}
}  // namespace

void matmul(DType w_type, const void* w, int64_t n, int64_t k, const float* x, int64_t m, float* y,
            int64_t ldy, ThreadPool& pool) {
  XP_ASSERT(n >= 0 && m >= 0 && ldy >= n);
  if (n == 0 || m == 0) return;
  XP_ASSERT(k % dtype_info(w_type).block_size == 0);
  if (is_gptq(w_type)) return matmul_gptq(w_type, w, n, k, x, m, y, ldy, pool);
  const DType act = activation_type(w_type);
  const Isa isa = best_isa();
  const Panel pick = pick_panel(w_type, m, isa);
  const PanelKernel panel = pick.kernel;
  const PackedLayout layout = packed_layout(act, k, panel ? w_type : DType::F32);
  const TileKernel kernel = pick_kernel(kernels_for(isa), w_type);
  const int64_t step = x_step(w_type, isa);
  XP_ASSERT(kernel != nullptr);

  // Packed X lives in a per-caller buffer that only grows: no allocation per call at decode.
  thread_local std::vector<uint8_t> packed_storage;
  const size_t padded_rows = round_up((size_t)m, (size_t)pick.x_rows_align);
  packed_storage.resize(layout.row_bytes * padded_rows + kPackAlign);
  uint8_t* packed = reinterpret_cast<uint8_t*>(
      round_up(reinterpret_cast<uintptr_t>(packed_storage.data()), kPackAlign));
  // Rows a tile reads past m: zeros, not a previous call's bytes (whose scales could be NaN or denormal).
  std::memset(packed + (size_t)m * layout.row_bytes, 0, (padded_rows - (size_t)m) * layout.row_bytes);
  auto pack = [&](int64_t b, int64_t e) {
    thread_local std::vector<uint8_t> scratch;
    for (int64_t i = b; i < e; ++i) pack_row(act, w_type, x + i * k, k, layout, packed + i * layout.row_bytes, scratch);
  };
  if (m * k >= 16384) pool.parallel_for(m, pack, 1);
  else pack(0, m);

  const auto* w_bytes = static_cast<const uint8_t*>(w);
  const size_t w_row_bytes = row_bytes(w_type, k);
  if (panel) {
    // Panels of kPanelRows weight rows, handed out one at a time: a thread that the OS (or another
    // process on a shared machine) slows down takes fewer, instead of the others waiting for it.
    const int64_t n_panels = (n + kPanelRows - 1) / kPanelRows;
    std::atomic<int64_t> next{0};
    auto work = [&](int, int) {
      thread_local std::vector<uint8_t> scratch_storage;
      scratch_storage.resize(panel_scratch_bytes(k) + 64);
      uint8_t* scratch =
          reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(scratch_storage.data()), 64));
      for (int64_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < n_panels;) {
        const int64_t j = p * kPanelRows;
        panel(k, w_bytes + j * w_row_bytes, w_row_bytes, std::min(kPanelRows, n - j), packed, layout, m, y + j,
              ldy, scratch);
      }
    };
    if (pool.size() == 1 || n_panels == 1) work(0, 1);
    else pool.run(work);
    return;
  }
  auto compute = [&](int64_t j0, int64_t j1, int64_t i0, int64_t i1) {
    tile_rows(kernel, k, w_bytes, w_row_bytes, packed, layout, j0, j1, i0, i1, y, ldy, step);
  };
  // Split the weight rows over threads (each thread reads only its share of W: what decode needs); when
  // there are too few rows for that and many X rows, split X instead.
  const int nth = pool.size();
  if (nth == 1 || (n * m * k) < 65536) {
    compute(0, n, 0, m);
    return;
  }
  const bool split_m = n < 8 * nth && m >= 4 * nth;
  if (split_m) {
    pool.run([&](int ith, int nth_run) {
      const int64_t per = (int64_t)round_up((size_t)((m + nth_run - 1) / nth_run), 4);
      const int64_t b = std::min(m, ith * per), e = std::min(m, b + per);
      if (b < e) compute(0, n, b, e);
    });
    return;
  }
  // Weight rows in chunks handed out one at a time (about 1/8 of a thread's share, 16-128 KB of weights,
  // whole tiles of 8 rows). With fixed equal shares, a thread that loses part of its core (another
  // process, a busy hypervisor) made every op wait for it: decode ran at ~50 instead of ~68 t/s.
  const size_t share_bytes = w_row_bytes * (size_t)n / (size_t)nth;
  const size_t chunk_bytes = std::clamp<size_t>(share_bytes / 8, 16 << 10, 128 << 10);
  const int64_t chunk_rows = (int64_t)round_up(std::max<size_t>(1, chunk_bytes / w_row_bytes), 8);
  const int64_t n_chunks = (n + chunk_rows - 1) / chunk_rows;
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < n_chunks;)
      compute(c * chunk_rows, std::min(n, (c + 1) * chunk_rows), 0, m);
  });
}

void matmul_batch(std::span<const MatmulJob> jobs, ThreadPool& pool) {
  // Native GPTQ jobs have their own driver (column chunks, not rows of blocks).
  if (std::any_of(jobs.begin(), jobs.end(), [](const MatmulJob& j) { return is_gptq(j.w_type); })) {
    std::vector<MatmulJob> gptq, rows;
    for (const MatmulJob& j : jobs) (is_gptq(j.w_type) ? gptq : rows).push_back(j);
    matmul_batch_gptq(gptq, pool);
    if (!rows.empty()) matmul_batch(rows, pool);
    return;
  }
  struct Prepared {
    TileKernel kernel;
    int64_t step;  // X rows per kernel call
    PackedLayout layout;
    const uint8_t* packed;
    size_t w_row_bytes;
    size_t bytes_before;  // weight bytes of the jobs before this one
  };
  std::vector<Prepared> prep(jobs.size());
  // Packed X of every distinct (x, m, k, activation type), in one per-caller buffer that only grows.
  struct Key {
    const float* x;
    int64_t m, k;
    DType act;
    size_t offset;
  };
  std::vector<Key> keys;
  size_t packed_bytes = 0;
  std::vector<size_t> offset(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    XP_ASSERT(j.n >= 0 && j.m >= 0 && j.ldy >= j.n && j.k % dtype_info(j.w_type).block_size == 0);
    const DType act = activation_type(j.w_type);
    prep[i].layout = packed_layout(act, j.k, DType::F32);
    prep[i].kernel = pick_kernel(kernels_for(best_isa()), j.w_type);
    prep[i].step = x_step(j.w_type, best_isa());
    XP_ASSERT(prep[i].kernel != nullptr);
    prep[i].w_row_bytes = row_bytes(j.w_type, j.k);
    prep[i].bytes_before = i == 0 ? 0 : prep[i - 1].bytes_before + prep[i - 1].w_row_bytes * (size_t)jobs[i - 1].n;
    auto same = [&](const Key& key) { return key.x == j.x && key.m == j.m && key.k == j.k && key.act == act; };
    auto it = std::find_if(keys.begin(), keys.end(), same);
    if (it == keys.end()) {
      keys.push_back({j.x, j.m, j.k, act, packed_bytes});
      packed_bytes += prep[i].layout.row_bytes * (size_t)j.m;
      it = keys.end() - 1;
    }
    offset[i] = it->offset;
  }
  if (jobs.empty()) return;
  const size_t total = prep.back().bytes_before + prep.back().w_row_bytes * (size_t)jobs.back().n;
  thread_local std::vector<uint8_t> storage;
  storage.resize(packed_bytes + kPackAlign);
  uint8_t* packed = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(storage.data()), kPackAlign));
  {
    thread_local std::vector<uint8_t> scratch;
    for (const Key& key : keys) {
      const PackedLayout l = packed_layout(key.act, key.k, DType::F32);
      for (int64_t r = 0; r < key.m; ++r)
        pack_row(key.act, DType::F32, key.x + r * key.k, key.k, l, packed + key.offset + r * l.row_bytes, scratch);
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) prep[i].packed = packed + offset[i];

  // Chunks of whole 4-row tiles, about a quarter of a thread's share of the bytes each, handed out one
  // at a time: a thread that loses part of its core (a busy host, a GPU driver thread) does fewer
  // chunks instead of holding every other thread at the join.
  struct Chunk {
    size_t job;
    int64_t r0, r1;
  };
  std::vector<Chunk> chunks;
  const size_t chunk_bytes = std::clamp<size_t>(total / (size_t)pool.size() / 4, 32 << 10, 256 << 10);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const int64_t rows = (int64_t)round_up(std::max<size_t>(1, chunk_bytes / prep[i].w_row_bytes), 8);
    for (int64_t r = 0; r < jobs[i].n; r += rows) chunks.push_back({i, r, std::min(jobs[i].n, r + rows)});
  }
  std::atomic<size_t> next{0};
  pool.run([&](int, int) {
    for (size_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks.size();) {
      const MatmulJob& j = jobs[chunks[c].job];
      const Prepared& p = prep[chunks[c].job];
      tile_rows(p.kernel, j.k, static_cast<const uint8_t*>(j.w), p.w_row_bytes, p.packed, p.layout, chunks[c].r0,
                chunks[c].r1, 0, j.m, j.y, j.ldy, p.step);
    }
  });
}

void matmul_reference(DType w_type, const void* w, int64_t n, int64_t k, const float* x, int64_t m, float* y,
                      int64_t ldy) {
  XP_ASSERT(ldy >= n);
  const DType act = activation_type(w_type);
  std::vector<float> x_rounded((size_t)(m * k)), w_row((size_t)k);
  std::vector<uint8_t> x_quant(row_bytes(act, k));
  for (int64_t i = 0; i < m; ++i) {
    quantize_row_activation(act, x + i * k, x_quant.data(), k);
    dequantize_row(act, x_quant.data(), x_rounded.data() + i * k, k);
  }
  const size_t w_row_bytes = row_bytes(w_type, k);
  std::vector<float> w_all;
  if (is_gptq(w_type)) {
    w_all.resize((size_t)(n * k));
    gptq::dequantize_native(w_type, w, k, n, w_all.data());
  }
  for (int64_t j = 0; j < n; ++j) {
    if (is_gptq(w_type)) std::memcpy(w_row.data(), w_all.data() + j * k, (size_t)k * 4);
    else dequantize_row(w_type, static_cast<const uint8_t*>(w) + j * w_row_bytes, w_row.data(), k);
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0;
      const float* xr = x_rounded.data() + i * k;
      for (int64_t l = 0; l < k; ++l) sum += (double)w_row[l] * xr[l];
      y[i * ldy + j] = (float)sum;
    }
  }
}

}  // namespace xpert::cpu
