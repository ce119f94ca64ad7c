// The OpenCL backend: discovery, the program cache, and the expert kernels against the CPU reference
// (cpu::matmul_reference: dequantized weights, activations rounded through int8 as the CPU path does,
// double accumulation) on random data of real shapes. Every OpenCL device of the machine is tested (CI:
// PoCL on the CPU), each with every kernel variant it can run. Without an OpenCL platform every test
// skips. Larger shapes: --gtest_also_run_disabled_tests --gtest_filter='OpenCL*Large*'.
#include <gtest/gtest.h>

#ifdef XPERT_HAVE_OPENCL
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/matmul.h"
#include "backend/opencl/discovery.h"
#include "backend/opencl/expert_device.h"
#include "backend/opencl/program_cache.h"
#include "base/error.h"
#include "backend/experts.h"
#include "base/half.h"
#include "quant/gptq.h"
#include "quant/quant.h"

namespace xpert::opencl {
namespace {

std::vector<DeviceInfo> devices_or_empty(std::string* why) {
  try {
    return list_devices();
  } catch (const Error& e) {
    *why = e.what();
    return {};
  }
}

#define DEVICES_OR_SKIP(var)                             \
  std::string why_;                                      \
  const std::vector<DeviceInfo> var = devices_or_empty(&why_); \
  if (var.empty()) GTEST_SKIP() << why_;

// The variants a device runs: portable everywhere, subgroup16 where the Intel extensions allow it.
std::vector<KernelVariant> variants(const DeviceInfo& d) {
  std::vector<KernelVariant> v{KernelVariant::portable};
  if (preferred_variant(d) == KernelVariant::subgroup16) v.push_back(KernelVariant::subgroup16);
  return v;
}

// A 3-D expert tensor [k, n, n_expert] of random quantized rows in page-aligned memory (as an mmap'ed
// file is): a pool of quantized random rows tiled in random order (quantizing every row would dominate).
struct RandomExperts {
  void* mem = nullptr;
  size_t bytes = 0;
  Weight w;
  RandomExperts(DType t, int64_t k, int64_t n, int64_t n_expert, std::mt19937& rng) {
    const size_t rb = row_bytes(t, k);
    if (is_gptq(t)) {
      // Native GPTQ (quant/gptq.h): random nibbles, scales about the size of the other types' values,
      // zero points 0..16.
      bytes = rb * n * n_expert;
      mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      XP_ASSERT(mem != MAP_FAILED);
      std::normal_distribution<float> scale(0.15f / std::sqrt((float)k), 0.03f / std::sqrt((float)k));
      const int64_t groups = k / gptq_group(t);
      for (int64_t e = 0; e < n_expert; ++e) {
        const gptq::NativeView v = gptq::native_view(t, static_cast<uint8_t*>(mem) + e * rb * n, k, n);
        auto* q = const_cast<uint8_t*>(v.qweight);
        for (int64_t i = 0; i < k / 2 * n; ++i) q[i] = (uint8_t)rng();
        for (int64_t i = 0; i < groups * n; ++i) {
          const uint16_t h = f32_to_f16(scale(rng));
          std::memcpy(const_cast<uint8_t*>(v.scales) + 2 * i, &h, 2);
          if (v.zeros) const_cast<uint8_t*>(v.zeros)[i] = (uint8_t)(rng() % 17);
        }
      }
      mprotect(mem, bytes, PROT_READ);
      w = Weight{.type = t, .data = mem, .ne = {k, n, n_expert}, .n_bytes = bytes};
      return;
    }
    constexpr int kPool = 64;
    std::vector<uint8_t> pool(rb * kPool);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt((float)k));
    std::vector<float> row(k);
    for (int r = 0; r < kPool; ++r) {
      for (float& v : row) v = normal(rng);
      quantize_row(t, row.data(), pool.data() + r * rb, k);
    }
    bytes = rb * n * n_expert;
    mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    XP_ASSERT(mem != MAP_FAILED);
    for (int64_t r = 0; r < n * n_expert; ++r)
      std::memcpy(static_cast<uint8_t*>(mem) + r * rb, pool.data() + rng() % kPool * rb, rb);
    mprotect(mem, bytes, PROT_READ);  // as a model file's mapping: the device must not need to write it
    w = Weight{.type = t, .data = mem, .ne = {k, n, n_expert}, .n_bytes = bytes};
  }
  ~RandomExperts() { munmap(mem, bytes); }
  RandomExperts(const RandomExperts&) = delete;
};

struct Layer {
  int64_t n_embd, n_ff, n_expert;
  RandomExperts gate, up, down;
  Layer(DType gate_up, DType dn, int64_t d, int64_t f, int64_t e, std::mt19937& rng)
      : n_embd(d), n_ff(f), n_expert(e), gate(gate_up, d, f, e, rng), up(gate_up, d, f, e, rng),
        down(dn, f, d, e, rng) {}
};

// One expert on one row, as moe_ffn_reference computes it.
void reference_expert(const Layer& L, int e, const float* x, float* y) {
  std::vector<float> g(L.n_ff), u(L.n_ff);
  auto mm = [](const Weight& w, const float* in, float* out) {
    cpu::matmul_reference(w.type, w.data, w.ne[1], w.ne[0], in, 1, out, w.ne[1]);
  };
  mm(expert_matrix(L.gate.w, e), x, g.data());
  mm(expert_matrix(L.up.w, e), x, u.data());
  for (int64_t i = 0; i < L.n_ff; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  mm(expert_matrix(L.down.w, e), g.data(), y);
}

// Runs the tasks on the device and checks every row against the reference. Returns the largest error
// relative to the largest reference magnitude.
double check_tasks(ExpertDevice& dev, const Layer& L, const std::vector<ExpertRows>& tasks, std::mt19937& rng) {
  int64_t n_rows = 0;
  for (const ExpertRows& t : tasks) n_rows = std::max<int64_t>(n_rows, t.row0 + t.n_rows);
  std::vector<float> x(n_rows * L.n_embd), y(x.size(), NAN), want(x.size());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  dev.submit(0, tasks, x.data(), n_rows, y.data()).wait();
  double max_ref = 0, max_err = 0;
  for (const ExpertRows& t : tasks)
    for (int32_t r = t.row0; r < t.row0 + t.n_rows; ++r) {
      reference_expert(L, t.expert, x.data() + r * L.n_embd, want.data() + r * L.n_embd);
      for (int64_t i = 0; i < L.n_embd; ++i) {
        max_ref = std::max(max_ref, (double)std::fabs(want[r * L.n_embd + i]));
        max_err = std::max(max_err, (double)std::fabs(y[r * L.n_embd + i] - want[r * L.n_embd + i]));
      }
    }
  EXPECT_GT(max_ref, 0.0);
  return max_err / max_ref;
}

// Tolerance relative to max |reference|: the integer dot products are exact, so what differs is float
// summation order (per 32-group sums added in float vs double) and the rare int8 rounding flip of an
// activation whose float value differs in the last bit (the hidden state comes from exp() on the device).
constexpr double kTolerance = 2e-3;

struct TypeCase {
  DType gate_up, down;
};
const TypeCase kTypes[] = {{DType::Q4_0, DType::Q4_0},         {DType::Q4_K, DType::Q4_K},
                           {DType::Q4_K, DType::Q6_K},         {DType::Q8_0, DType::Q8_0},
                           {DType::GPTQ4_G128, DType::GPTQ4_G128}, {DType::GPTQ4Z_G32, DType::GPTQ4Z_G64}};

// Decode-sized tasks (matrix-vector kernels) and prefill-sized ones (tiled kernels, two tile chunks and a
// tail) in one batch, overlapping nothing, several experts.
std::vector<ExpertRows> mixed_tasks() {
  return {{.expert = 2, .row0 = 0, .n_rows = 1}, {.expert = 0, .row0 = 1, .n_rows = 3},
          {.expert = 3, .row0 = 4, .n_rows = 6}, {.expert = 1, .row0 = 10, .n_rows = 21}};
}

TEST(OpenCLDiscovery, ListsDevicesWithWhatTheKernelsNeed) {
  DEVICES_OR_SKIP(devices);
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceInfo& d = devices[i];
    EXPECT_EQ(d.index, (int)i);
    EXPECT_FALSE(d.name.empty());
    EXPECT_FALSE(d.driver_version.empty());
    EXPECT_EQ(d.device_version.rfind("OpenCL ", 0), 0u) << d.device_version;
    EXPECT_GT(d.global_mem_bytes, 0u);
    EXPECT_GT(d.compute_units, 0u);
    EXPECT_GE(d.max_work_group_size, 64u);
    if (d.is_cpu()) {
      EXPECT_TRUE(d.shares_host_memory());
    }
  }
  EXPECT_THROW(device_info((int)devices.size()), Error);
}

TEST(OpenCLDiscovery, AdviceWhenThereIsNoGpu) {
  // Whatever this machine has, a list without a GPU gets advice and never suggests chmod.
  const std::string advice = no_gpu_advice({});
  EXPECT_NE(advice.find("no OpenCL GPU"), std::string::npos) << advice;
  EXPECT_EQ(advice.find("chmod"), std::string::npos);
}

TEST(OpenCLExperts, SmallShapesEveryTypeEveryVariant) {
  DEVICES_OR_SKIP(devices);
  std::mt19937 rng(7);
  for (const TypeCase& tc : kTypes) {
    Layer L(tc.gate_up, tc.down, 256, 512, 4, rng);
    for (const DeviceInfo& d : devices)
      for (KernelVariant v : variants(d)) {
        ExpertDevice dev(d.index, {.variant = v, .zero_copy = true, .tiled_min_rows = 8});
        dev.add_layer(0, L.gate.w, L.up.w, L.down.w);
        const double err = check_tasks(dev, L, mixed_tasks(), rng);
        EXPECT_LT(err, kTolerance) << d.name << " " << variant_name(v) << " " << dtype_name(tc.gate_up) << "/"
                                   << dtype_name(tc.down);
      }
  }
}

// qwen3-30b-a3b's experts: n_embd 2048, n_ff_exp 768.
TEST(OpenCLExperts, Qwen3MoeShapes) {
  DEVICES_OR_SKIP(devices);
  std::mt19937 rng(11);
  for (DType t : {DType::Q4_K, DType::Q4_0, DType::GPTQ4_G128}) {
    Layer L(t, t, 2048, 768, 3, rng);
    for (const DeviceInfo& d : devices)
      for (KernelVariant v : variants(d)) {
        ExpertDevice dev(d.index, {.variant = v, .zero_copy = true, .tiled_min_rows = 8});
        dev.add_layer(0, L.gate.w, L.up.w, L.down.w);
        const std::vector<ExpertRows> tasks = {{.expert = 1, .row0 = 0, .n_rows = 1},
                                               {.expert = 2, .row0 = 1, .n_rows = 9}};
        const double err = check_tasks(dev, L, tasks, rng);
        EXPECT_LT(err, kTolerance) << d.name << " " << variant_name(v) << " " << dtype_name(t);
      }
  }
}

TEST(OpenCLExperts, DISABLED_LargeQwen3MoeBatch) {
  DEVICES_OR_SKIP(devices);
  std::mt19937 rng(13);
  for (DType t : {DType::Q4_K, DType::Q4_0}) {
    Layer L(t, t == DType::Q4_K ? DType::Q6_K : t, 2048, 768, 8, rng);
    for (const DeviceInfo& d : devices)
      for (KernelVariant v : variants(d)) {
        ExpertDevice dev(d.index, {.variant = v, .zero_copy = true, .tiled_min_rows = 8});
        dev.add_layer(0, L.gate.w, L.up.w, L.down.w);
        std::vector<ExpertRows> tasks;
        int32_t row = 0;
        for (int32_t e = 0; e < 8; ++e) {
          tasks.push_back({.expert = e, .row0 = row, .n_rows = 1 + 9 * e});
          row += 1 + 9 * e;
        }
        const double err = check_tasks(dev, L, tasks, rng);
        EXPECT_LT(err, kTolerance) << d.name << " " << variant_name(v) << " " << dtype_name(t);
      }
  }
}

TEST(OpenCLExperts, CopiedWeightsAndExpertSubsets) {
  DEVICES_OR_SKIP(devices);
  std::mt19937 rng(3);
  Layer L(DType::Q4_K, DType::Q6_K, 256, 256, 5, rng);
  const DeviceInfo& d = devices.front();
  ExpertDevice in_place(d.index, {.variant = KernelVariant::portable, .zero_copy = true, .tiled_min_rows = 8});
  ExpertDevice copied(d.index, {.variant = KernelVariant::portable, .zero_copy = false, .tiled_min_rows = 8});
  const std::vector<int32_t> subset = {1, 4};
  in_place.add_layer(3, L.gate.w, L.up.w, L.down.w, subset);
  copied.add_layer(3, L.gate.w, L.up.w, L.down.w, subset);
  EXPECT_EQ(copied.device_bytes(), (L.gate.bytes + L.up.bytes + L.down.bytes) / 5 * 2);
  EXPECT_EQ(copied.host_view_bytes(), 0u);
  if (d.shares_host_memory()) {
    EXPECT_EQ(in_place.device_bytes(), 0u);
  }
  EXPECT_TRUE(copied.holds(3, 4));
  EXPECT_FALSE(copied.holds(3, 0));
  EXPECT_FALSE(copied.holds(0, 1));

  const std::vector<ExpertRows> tasks = {{.expert = 4, .row0 = 0, .n_rows = 2}, {.expert = 1, .row0 = 2, .n_rows = 12}};
  std::vector<float> x(14 * 256), y1(x.size()), y2(x.size());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  Pending p1 = in_place.submit(3, tasks, x.data(), 14, y1.data());
  Pending p2 = copied.submit(3, tasks, x.data(), 14, y2.data());  // two devices in flight at once
  p2.wait();
  p1.wait();
  EXPECT_TRUE(p1.ready());
  EXPECT_EQ(y1, y2);  // same kernels, same bytes: where the weights live changes nothing

  const ExpertRows absent{.expert = 0, .row0 = 0, .n_rows = 1};
  EXPECT_THROW(copied.submit(3, std::span(&absent, 1), x.data(), 1, y1.data()), Error);
  EXPECT_THROW(copied.submit(7, tasks, x.data(), 14, y1.data()), Error);
}

TEST(OpenCLExperts, RowsNotNamedByATaskAreLeftAlone) {
  DEVICES_OR_SKIP(devices);
  std::mt19937 rng(5);
  Layer L(DType::Q4_0, DType::Q4_0, 128, 64, 2, rng);
  ExpertDevice dev(devices.front().index);
  dev.add_layer(0, L.gate.w, L.up.w, L.down.w);
  std::vector<float> x(4 * 128, 0.5f), y(x.size(), 42.0f);
  const std::vector<ExpertRows> tasks = {{.expert = 1, .row0 = 1, .n_rows = 1}, {.expert = 0, .row0 = 3, .n_rows = 1}};
  dev.submit(0, tasks, x.data(), 4, y.data()).wait();
  for (int64_t i = 0; i < 128; ++i) {
    EXPECT_EQ(y[i], 42.0f);
    EXPECT_EQ(y[2 * 128 + i], 42.0f);
  }
  EXPECT_NE(y[128], 42.0f);
}

TEST(OpenCLExperts, RejectsWhatItCannotRun) {
  DEVICES_OR_SKIP(devices);
  std::mt19937 rng(1);
  Layer bad_type(DType::Q5_0, DType::Q5_0, 64, 64, 1, rng);
  ExpertDevice dev(devices.front().index);
  EXPECT_THROW(dev.add_layer(0, bad_type.gate.w, bad_type.up.w, bad_type.down.w), Error);
  Layer L(DType::Q4_0, DType::Q4_0, 64, 32, 2, rng);
  EXPECT_THROW(dev.add_layer(0, L.gate.w, L.down.w, L.up.w), Error);  // up and down swapped: shapes disagree
  const std::vector<int32_t> missing = {2};
  EXPECT_THROW(dev.add_layer(0, L.gate.w, L.up.w, L.down.w, missing), Error);
  EXPECT_THROW(ExpertDevice((int)devices.size()), Error);
}

TEST(OpenCLProgramCache, SecondStartCompilesNothing) {
  DEVICES_OR_SKIP(devices);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("xpert-opencl-cache-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const char* old = std::getenv("XPERT_OPENCL_CACHE_DIR");
  const std::string saved = old ? old : "";
  setenv("XPERT_OPENCL_CACHE_DIR", dir.c_str(), 1);
  std::mt19937 rng(2);
  Layer L(DType::Q4_0, DType::Q4_0, 64, 32, 1, rng);
  const ProgramCacheStats s0 = program_cache_stats();
  {
    ExpertDevice first(devices.front().index);
    first.add_layer(0, L.gate.w, L.up.w, L.down.w);
  }
  const ProgramCacheStats s1 = program_cache_stats();
  EXPECT_EQ(s1.source_builds - s0.source_builds, 1);
  EXPECT_EQ(s1.binary_writes - s0.binary_writes, 1);
  std::vector<float> x(64, 1.0f), y1(64), y2(64);
  {
    ExpertDevice second(devices.front().index);
    second.add_layer(0, L.gate.w, L.up.w, L.down.w);
    second.run(0, 0, x.data(), 1, y2.data());
  }
  const ProgramCacheStats s2 = program_cache_stats();
  EXPECT_EQ(s2.source_builds, s1.source_builds) << "the second start compiled";
  EXPECT_EQ(s2.binary_loads - s1.binary_loads, 1);
  reference_expert(L, 0, x.data(), y1.data());
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(y2[i], y1[i], 1e-3) << i;  // the cached binary computes
  if (old) setenv("XPERT_OPENCL_CACHE_DIR", saved.c_str(), 1);
  else unsetenv("XPERT_OPENCL_CACHE_DIR");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xpert::opencl

#else

TEST(OpenCL, NotBuiltIn) { GTEST_SKIP() << "built without the OpenCL backend (XPERT_OPENCL=OFF)"; }

#endif
