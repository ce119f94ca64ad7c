// AMX-INT8 prefill kernels (backend/cpu/matmul_amx.cpp). Every CPU with AVX-512 runs them through a plain
// C++ emulation of the tile instructions written here from the Intel SDM (ldtilecfg, tileloadd, tilezero,
// tdpbssd, tilestored): that checks the panel packing, the tile shapes and strides, the row padding and the
// float epilogue against the VNNI panels (same floats, bit for bit) and the scalar reference. Only the
// instructions themselves need a CPU with AMX (HardwareMatchesEmulation: skipped elsewhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "quant/quant.h"
#include "test_data.h"

namespace xpert {
namespace {

using cpu::AmxTileConfig;

// ---- the emulated tile unit: per thread, as the hardware's --------------------------------------------

struct TileUnit {
  bool configured = false;
  AmxTileConfig config;
  uint8_t tiles[8][16][64] = {};
};
thread_local TileUnit t_unit;
std::atomic<int64_t> g_products{0};

bool valid_tile(int t) { return t >= 0 && t < 8 && t_unit.configured && t_unit.config.rows[t] > 0; }

void emu_load_config(const AmxTileConfig& c) {
  // ldtilecfg raises #GP for anything palette 1 cannot hold.
  EXPECT_EQ(c.palette, 1);
  EXPECT_EQ(c.start_row, 0);
  for (uint8_t r : c.reserved) EXPECT_EQ(r, 0);
  for (int t = 0; t < 16; ++t) {
    if (t >= 8) {
      EXPECT_EQ(c.rows[t], 0) << "tile " << t;
      EXPECT_EQ(c.colsb[t], 0) << "tile " << t;
      continue;
    }
    EXPECT_LE(c.rows[t], 16) << "tile " << t;
    EXPECT_LE(c.colsb[t], 64) << "tile " << t;
    EXPECT_EQ(c.rows[t] == 0, c.colsb[t] == 0) << "tile " << t;
  }
  t_unit = TileUnit{};
  t_unit.config = c;
  t_unit.configured = true;
}

void emu_load(int t, const void* base, size_t stride) {
  ASSERT_TRUE(valid_tile(t)) << "tileloadd to unconfigured tile " << t;
  std::memset(t_unit.tiles[t], 0, sizeof t_unit.tiles[t]);  // bytes past rows / colsb read as zero
  for (int r = 0; r < t_unit.config.rows[t]; ++r)
    std::memcpy(t_unit.tiles[t][r], static_cast<const uint8_t*>(base) + r * stride, t_unit.config.colsb[t]);
}

void emu_zero(int t) {
  ASSERT_TRUE(valid_tile(t)) << "tilezero of unconfigured tile " << t;
  std::memset(t_unit.tiles[t], 0, sizeof t_unit.tiles[t]);
}

// tdpbssd c, a, b: c[m][n] += sum over k of a[m][4k + i] * b[k][4n + i], int8 x int8, i < 4; M = c.rows,
// N = c.colsb / 4, K = a.colsb / 4. #UD unless a.rows == M, b.rows == K, b.colsb == c.colsb, distinct tiles.
void emu_dp_bssd(int c, int a, int b) {
  ASSERT_TRUE(valid_tile(c) && valid_tile(a) && valid_tile(b));
  ASSERT_TRUE(c != a && c != b && a != b);
  const AmxTileConfig& cfg = t_unit.config;
  ASSERT_EQ(cfg.colsb[a] % 4, 0);
  ASSERT_EQ(cfg.colsb[c] % 4, 0);
  ASSERT_EQ(cfg.rows[a], cfg.rows[c]) << "A rows must equal C rows";
  ASSERT_EQ(cfg.rows[b], cfg.colsb[a] / 4) << "B rows must be A's bytes per row / 4";
  ASSERT_EQ(cfg.colsb[b], cfg.colsb[c]) << "B bytes per row must equal C's";
  const int M = cfg.rows[c], N = cfg.colsb[c] / 4, K4 = cfg.colsb[a] / 4;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      int32_t acc;
      std::memcpy(&acc, &t_unit.tiles[c][m][4 * n], 4);
      uint32_t sum = (uint32_t)acc;  // wraps, as the hardware does
      for (int k = 0; k < K4; ++k)
        for (int i = 0; i < 4; ++i)
          sum += (uint32_t)((int)(int8_t)t_unit.tiles[a][m][4 * k + i] * (int)(int8_t)t_unit.tiles[b][k][4 * n + i]);
      std::memcpy(&t_unit.tiles[c][m][4 * n], &sum, 4);
    }
  g_products.fetch_add(1, std::memory_order_relaxed);
}

void emu_store(int t, void* base, size_t stride) {
  ASSERT_TRUE(valid_tile(t)) << "tilestored of unconfigured tile " << t;
  for (int r = 0; r < t_unit.config.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, t_unit.tiles[t][r], t_unit.config.colsb[t]);
}

void emu_release() { t_unit = TileUnit{}; }

const cpu::AmxEmulator kEmulator = {emu_load_config, emu_load, emu_zero, emu_dp_bssd, emu_store, emu_release};

// Restores the defaults whatever a test leaves behind.
class PanelGuard {
 public:
  PanelGuard() { cpu::set_amx_emulator(&kEmulator); }
  ~PanelGuard() {
    cpu::set_panel_choice(cpu::PanelChoice::automatic);
    cpu::set_amx_emulator(nullptr);
  }
};

// ---- data ----------------------------------------------------------------------------------------------

const DType kTypes[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q5_K};

struct Case {
  int64_t k, n, m;
};
// Expert and attention shapes of the MoE models (hidden 2048, expert ff 768), a partial last panel
// (n = 150), n = 128 + an odd multiple of 16, X rows from one tile (8: half empty, 16), past it (17) to
// a long prompt (512).
const Case kCases[] = {{2048, 768, 17}, {768, 2048, 16}, {2048, 176, 64}, {768, 176, 512}, {768, 150, 8},
                       {2048, 48, 512}};

struct Problem {
  DType type;
  Case c;
  std::vector<uint8_t> w;
  std::vector<float> x, ref, tol;

  // with_reference false: only the bitwise comparisons (the double-precision reference of the largest
  // shapes takes seconds).
  Problem(DType t, const Case& cs, bool with_reference = true) : type(t), c(cs) {
    // 37 distinct quantized rows repeated (quantizing K-quants is slow): 37 is prime to the 16-row panels,
    // so every panel holds another arrangement of them.
    const size_t rb = row_bytes(t, c.k);
    w.resize(rb * c.n);
    const std::vector<float> src = random_values((size_t)(37 * c.k), 100 + c.k + c.n);
    for (int64_t j = 0; j < c.n; ++j) {
      if (j < 37) quantize_row(t, src.data() + j * c.k, w.data() + j * rb, c.k);
      else std::memcpy(w.data() + j * rb, w.data() + (j % 37) * rb, rb);
    }
    x = random_values((size_t)(c.m * c.k), 7 + c.m);
    if (!with_reference) return;
    ref.resize((size_t)(c.m * c.n));
    cpu::matmul_reference(t, w.data(), c.n, c.k, x.data(), c.m, ref.data(), c.n);
    // Float rounding bound: 2e-5 * |w_j| |x_i| (>= 2e-5 * sum |w_l x_l|, the bound test_matmul uses).
    std::vector<float> wr((size_t)c.k);
    std::vector<double> wn((size_t)c.n), xn((size_t)c.m);
    for (int64_t j = 0; j < c.n; ++j) {
      dequantize_row(t, w.data() + j * rb, wr.data(), c.k);
      for (float v : wr) wn[j] += (double)v * v;
    }
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t l = 0; l < c.k; ++l) xn[i] += (double)x[i * c.k + l] * x[i * c.k + l] * 1.0201;
    tol.resize(ref.size());
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) tol[i * c.n + j] = (float)(2e-5 * std::sqrt(wn[j] * xn[i]) + 1e-6);
  }

  // y with ldy = n + 3 (padding checked untouched).
  std::vector<float> run(cpu::PanelChoice choice, ThreadPool& pool) const {
    cpu::set_panel_choice(choice);
    const int64_t ldy = c.n + 3;
    std::vector<float> y((size_t)(c.m * ldy), -12345.0f);
    cpu::matmul(type, w.data(), c.n, c.k, x.data(), c.m, y.data(), ldy, pool);
    std::vector<float> out((size_t)(c.m * c.n));
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = c.n; j < ldy; ++j) EXPECT_EQ(y[i * ldy + j], -12345.0f) << "padding written";
      std::memcpy(out.data() + i * c.n, y.data() + i * ldy, 4 * c.n);
    }
    return out;
  }

  std::string name() const {
    return std::string(dtype_name(type)) + " k=" + std::to_string(c.k) + " n=" + std::to_string(c.n) +
           " m=" + std::to_string(c.m);
  }
};

void expect_near_reference(const Problem& p, const std::vector<float>& y, const char* what) {
  if (p.ref.empty()) return;
  int bad = 0;
  for (size_t i = 0; i < y.size() && bad < 5; ++i)
    if (!(std::fabs(y[i] - p.ref[i]) <= p.tol[i])) {
      ++bad;
      ADD_FAILURE() << what << " " << p.name() << " at [" << i / p.c.n << "][" << i % p.c.n << "]: " << y[i]
                    << " vs reference " << p.ref[i] << " (tol " << p.tol[i] << ")";
    }
}

void expect_same_bits(const Problem& p, const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < a.size() && bad < 5; ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      ++bad;
      ADD_FAILURE() << what << " " << p.name() << " at [" << i / p.c.n << "][" << i % p.c.n << "]: " << a[i]
                    << " vs " << b[i];
    }
}

TEST(MatmulAmx, EmulatedTilesMatchVnniPanelsAndReference) {
  if (best_isa() != Isa::avx512)
    GTEST_SKIP() << "the AMX kernels' epilogue needs AVX-512 VNNI (not on this CPU, or capped by XPERT_ISA)";
  PanelGuard guard;
  ThreadPool pool1(1), pool3(3);
  for (DType t : kTypes)
    for (const Case& c : kCases) {
      const Problem p(t, c);
      const std::vector<float> vnni = p.run(cpu::PanelChoice::vnni, pool3);
      expect_near_reference(p, vnni, "vnni");
      for (ThreadPool* pool : {&pool1, &pool3}) {
        const int64_t before = g_products.load();
        const std::vector<float> emulated = p.run(cpu::PanelChoice::amx_emulated, *pool);
        EXPECT_GT(g_products.load(), before) << "the emulated AMX kernel did not run for " << p.name();
        expect_near_reference(p, emulated, "amx (emulated)");
        expect_same_bits(p, emulated, vnni, "amx (emulated) vs vnni");
      }
    }
}

// On CPUs with AMX (Sapphire Rapids and later, Linux >= 5.16): the tile instructions themselves.
TEST(MatmulAmx, HardwareMatchesEmulation) {
  if (!amx_enabled())
    GTEST_SKIP() << "no usable AMX-INT8 here (cpu: amx-tile " << cpu_features().amx_tile << ", amx-int8 "
                 << cpu_features().amx_int8 << "; kernel grant: " << amx_usable()
                 << "; XPERT_NO_AMX or XPERT_ISA may turn it off): run on Sapphire Rapids or later";
  PanelGuard guard;
  ThreadPool pool1(1), pool4(4);
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({2048, 2048, 512});
  cases.push_back({2048, 768, 512});
  cases.push_back({768, 2048, 300});
  for (DType t : kTypes)
    for (const Case& c : cases) {
      const Problem p(t, c, c.n * c.k * c.m < (int64_t)300e6);
      const std::vector<float> vnni = p.run(cpu::PanelChoice::vnni, pool4);
      const std::vector<float> emulated = p.run(cpu::PanelChoice::amx_emulated, pool4);
      for (ThreadPool* pool : {&pool1, &pool4}) {
        const std::vector<float> amx = p.run(cpu::PanelChoice::amx, *pool);
        expect_near_reference(p, amx, "amx");
        expect_same_bits(p, amx, emulated, "amx vs amx (emulated)");
        expect_same_bits(p, amx, vnni, "amx vs vnni");
        // The default dispatch: AMX from kAmxMinRows rows on.
        expect_same_bits(p, p.run(cpu::PanelChoice::automatic, *pool), vnni, "automatic vs vnni");
      }
    }
}

// Without AMX (this CPU, XPERT_NO_AMX=1, XPERT_ISA below avx512) every choice falls back to the VNNI panels
// or the tiles: still the right product.
TEST(MatmulAmx, DispatchFallsBackWithoutAmx) {
  if (amx_enabled()) {
    EXPECT_TRUE(amx_usable());
    EXPECT_TRUE(cpu_features().amx_tile && cpu_features().amx_int8);
  }
  if (!cpu_features().amx_int8) {
    EXPECT_FALSE(amx_usable());
  }
  PanelGuard guard;
  ThreadPool pool(2);
  const Problem p(DType::Q4_K, {768, 80, 33});
  for (cpu::PanelChoice choice : {cpu::PanelChoice::automatic, cpu::PanelChoice::amx}) {
    const std::vector<float> y = p.run(choice, pool);
    expect_near_reference(p, y, "default dispatch");
    if (best_isa() == Isa::avx512) {
      expect_same_bits(p, y, p.run(cpu::PanelChoice::vnni, pool), "vs vnni");
    }
  }
}

// ---- batch invariance (issue #37) ----------------------------------------------------------------------
// Every quantized kernel takes one float order per output element (matmul_simd.inl), so a row's result has
// the same bits computed alone (the decode kernels), in the small-batch tiles, in a VNNI panel or in an AMX
// tile, whatever the other rows: checked on the kernels themselves, then through cpu::matmul with batch
// invariance on (what `xpert serve` runs), where the panels must be used.

cpu::TileKernel tile_kernel(DType t) {
  const cpu::MatmulKernels& k = cpu::matmul_kernels_avx512();
  switch (t) {
    case DType::Q4_0: return k.q4_0;
    case DType::Q5_0: return k.q5_0;
    case DType::Q8_0: return k.q8_0;
    case DType::Q4_K: return k.q4_k;
    case DType::Q5_K: return k.q5_k;
    default: return k.q6_k;
  }
}
cpu::PanelKernel panel_kernel(const cpu::PanelKernels& k, DType t) {
  switch (t) {
    case DType::Q4_0: return k.q4_0;
    case DType::Q5_0: return k.q5_0;
    case DType::Q8_0: return k.q8_0;
    case DType::Q4_K: return k.q4_k;
    case DType::Q5_K: return k.q5_k;
    default: return k.q6_k;
  }
}

// X rows packed as matmul.cpp does for the panels: Q8_0 planes with the weight offset's aux plane, or Q8_K
// planes with Q6_K's; rows past the packed ones are zeros (the AMX tiles read 16 at a time).
struct PackedRows {
  cpu::PackedLayout l;
  std::vector<uint8_t> storage;
  uint8_t* data = nullptr;
  PackedRows(DType t, const std::vector<float>& x, int64_t k, int64_t m) {
    const bool q8_0 = t == DType::Q4_0 || t == DType::Q5_0 || t == DType::Q8_0;
    const int64_t block = q8_0 ? 32 : 256;
    l.d_offset = (size_t)k;
    l.sum_offset = l.d_offset + 4 * (size_t)(k / block);
    l.row_bytes = l.sum_offset + (q8_0 ? 4 * (size_t)(k / 32) : 2 * (size_t)(k / 16));
    if (t != DType::Q4_K && t != DType::Q5_K) {
      l.aux_offset = (l.row_bytes + 3) / 4 * 4;
      l.row_bytes = l.aux_offset + 4 * (size_t)(k / (q8_0 ? 32 : 16));
    }
    l.row_bytes = (l.row_bytes + 63) / 64 * 64;
    storage.assign(l.row_bytes * (size_t)((m + 15) / 16 * 16) + 64, 0);
    data = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
    const int32_t level_offset = t == DType::Q4_0 ? 8 : t == DType::Q5_0 ? 16 : 128;
    for (int64_t i = 0; i < m; ++i) {
      if (q8_0) cpu::pack_row_q8_0_avx512(x.data() + i * k, k, l, level_offset, data + i * l.row_bytes);
      else cpu::pack_row_q8_k_avx512(x.data() + i * k, k, l, data + i * l.row_bytes);
    }
  }
  const uint8_t* row(int64_t i) const { return data + i * l.row_bytes; }
};

// y (m x n, stride n) rows against `alone` (each row computed by itself): bit for bit.
void expect_rows_match(const Problem& p, const std::vector<float>& alone, const std::vector<float>& y, int64_t m,
                       const std::string& what) {
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < p.c.n && bad < 5; ++j)
      if (std::memcmp(&y[i * p.c.n + j], &alone[i * p.c.n + j], 4) != 0) {
        ++bad;
        ADD_FAILURE() << what << " " << p.name() << " m=" << m << " at [" << i << "][" << j << "]: " << y[i * p.c.n + j]
                      << " vs alone " << alone[i * p.c.n + j];
      }
}

// k = 2048 and 768 (the MoE models' hidden and expert widths), n = 150: a partial last panel of 6 rows
// (and n % 8 = 6 rows past the 8-row decode kernels).
const Case kInvariantCases[] = {{2048, 150, 64}, {768, 150, 64}};
const int64_t kPanelHeights[] = {8, 9, 16, 33, 64};

TEST(MatmulAmx, QuantKernelsGiveEveryRowTheBitsOfDecode) {
  if (best_isa() != Isa::avx512) GTEST_SKIP() << "the panels need AVX-512 VNNI";
  PanelGuard guard;
  const size_t scratch_bytes = cpu::panel_scratch_bytes(2048);
  std::vector<uint8_t> scratch_storage(scratch_bytes + 64);
  uint8_t* scratch =
      scratch_storage.data() + (64 - reinterpret_cast<uintptr_t>(scratch_storage.data()) % 64) % 64;
  for (DType t : kTypes)
    for (const Case& c : kInvariantCases) {
      const Problem p(t, c, false);
      const int64_t k = c.k, n = c.n, rb = (int64_t)row_bytes(t, k);
      const PackedRows x(t, p.x, k, c.m);
      // Each row alone: the decode kernel (one X row).
      std::vector<float> alone((size_t)(c.m * n));
      for (int64_t i = 0; i < c.m; ++i)
        tile_kernel(t)(k, p.w.data(), rb, n, x.row(i), x.l, 1, alone.data() + i * n, n);
      // The small-batch tiles.
      for (int64_t m : {2, 3, 7}) {
        std::vector<float> y((size_t)(m * n));
        tile_kernel(t)(k, p.w.data(), rb, n, x.data, x.l, m, y.data(), n);
        expect_rows_match(p, alone, y, m, "tiles");
      }
      // The VNNI panels and the (emulated) AMX tiles, panel by panel, at every height.
      for (int amx = 0; amx < 2; ++amx) {
        const cpu::PanelKernel panel =
            panel_kernel(amx ? cpu::matmul_panel_kernels_amx_emulated() : cpu::matmul_panel_kernels_avx512(), t);
        for (int64_t m : kPanelHeights) {
          std::vector<float> y((size_t)(m * n), -1.0f);
          for (int64_t j = 0; j < n; j += cpu::kPanelRows)
            panel(k, p.w.data() + j * rb, rb, std::min<int64_t>(cpu::kPanelRows, n - j), x.data, x.l, m, y.data() + j,
                  n, scratch);
          expect_rows_match(p, alone, y, m, amx ? "amx (emulated) panel" : "vnni panel");
        }
      }
    }
}

TEST(MatmulAmx, BatchInvariantMatmulKeepsThePanels) {
  if (best_isa() != Isa::avx512) GTEST_SKIP() << "the panels need AVX-512 VNNI";
  PanelGuard guard;
  struct Reset {
    ~Reset() { cpu::set_batch_invariant(false); }
  } reset;
  cpu::set_batch_invariant(true);
  ThreadPool pool(3);
  for (DType t : kTypes)
    for (const Case& c : kInvariantCases) {
      const Problem p(t, c, false);
      std::vector<float> alone((size_t)(c.m * c.n));
      for (int64_t i = 0; i < c.m; ++i)
        cpu::matmul(t, p.w.data(), c.n, c.k, p.x.data() + i * c.k, 1, alone.data() + i * c.n, c.n, pool);
      for (cpu::PanelChoice choice : {cpu::PanelChoice::vnni, cpu::PanelChoice::amx_emulated}) {
        cpu::set_panel_choice(choice);
        for (int64_t m : kPanelHeights) {
          const int64_t before = g_products.load();
          std::vector<float> y((size_t)(m * c.n));
          cpu::matmul(t, p.w.data(), c.n, c.k, p.x.data(), m, y.data(), c.n, pool);
          expect_rows_match(p, alone, y, m, choice == cpu::PanelChoice::vnni ? "matmul vnni" : "matmul amx (emulated)");
          if (choice == cpu::PanelChoice::amx_emulated) {
            EXPECT_GT(g_products.load(), before) << "batch invariance turned the AMX tiles off for " << p.name();
          }
        }
      }
    }
}

}  // namespace
}  // namespace xpert
