// The XMX prefill kernels (backend/opencl/kernels_prefill_xmx.h), which no CI machine can run: compiled by
// Intel's offline compiler (ocloc, Debian package intel-opencl-icd) from exactly the program text the backend
// builds (xmx_program_text with the options an Intel GPU gets), for DG2 (subgroups of 8) and PVC (16), each
// quantized weight type; the compiler's dumps must show dpas instructions in every kernel. On the machine's
// own OpenCL device (PoCL in CI: no cl_intel_subgroup_matrix_multiply_accumulate), the XMX path stays off
// and its self-check refuses; over an emulation of the builtins (from the spec's operand layouts) the
// kernels run there: the self-check passes at subgroups of 8 and 16 and refuses a wrong layout, and the
// backend's dense and MoE products match the CPU reference. Skips without ocloc, and without an OpenCL
// device for the device part.
#include <gtest/gtest.h>

#ifdef XPERT_HAVE_OPENCL
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/moe.h"
#include "backend/opencl/backend_impl.h"
#include "model/model.h"
#include "opencl_test_util.h"
#include "quant/quant.h"

namespace xpert {
namespace {

namespace fs = std::filesystem;

TEST(OpenCLXmxOfflineCompile, BuildsWithDpasForDg2AndPvc) {
  const std::string ocloc = cltest::find_ocloc();
  if (ocloc.empty())
    GTEST_SKIP()
        << "ocloc is not installed (Debian package intel-opencl-icd; scripts/setup.sh installs it): the "
           "XMX prefill kernels are not compile-checked";
  const fs::path dir = fs::temp_directory_path() / ("xpert_xmx_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Target {
    const char* device;
    int sub_group;
  };
  const char* kernels[] = {"gemm_t_m64",        "gemm_t_m32",     "moe_gate_up_t_m64",
                           "moe_gate_up_t_m32", "moe_down_t_m64", "moe_down_t_m32"};
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::Q8_0, DType::Q4_0, DType::Q5_0})
    for (const Target& target : {Target{"dg2-g10", 8}, Target{"pvc", 16}}) {
      SCOPED_TRACE(fmt::format("{} weights, -device {}", dtype_name(t), target.device));
      ASSERT_TRUE(opencl::xmx_weight_type(t));
      // The options an Intel GPU gets (matmul_program: 32 work-items a feature, 4 rows, wide loads, correctly
      // rounded division).
      const opencl::ProgramText p = opencl::xmx_program_text(opencl::matmul_options(t, {}), target.sub_group);
      const fs::path run = dir / fmt::format("{}_{}", dtype_name(t), target.device);
      fs::create_directories(run / "dump");
      std::ofstream(run / "xmx.cl", std::ios::binary) << p.source;
      // ocloc 22.43 (Debian 12) does not predefine the extension's macro when it compiles offline for these
      // devices, though the driver does on the device: the macro stands in for it (it only exposes the
      // builtins' declarations; the dpas check below shows they reach the matrix engine).
      const std::string cmd = fmt::format(
          "cd '{}' && IGC_ShaderDumpEnable=1 IGC_DumpToCustomDir='{}' '{}' compile -file xmx.cl -device {} "
          "-options '{} -Dcl_intel_subgroup_matrix_multiply_accumulate' > log.txt 2>&1",
          run.string(), (run / "dump").string(), ocloc, target.device, p.options);
      const int rc = std::system(cmd.c_str());
      ASSERT_EQ(rc, 0) << cmd << "\n" << cltest::read_text(run / "log.txt");
      // Every kernel's assembly (IGC's dumps: "//.kernel NAME" on the first line; a kernel compiled twice, as
      // IGC retries one with other settings, has two) holds dpas, the f16 x f16 -> f32 multiply-accumulate.
      for (const char* k : kernels) {
        int asm_files = 0, with_dpas = 0;
        for (const auto& e : fs::directory_iterator(run / "dump")) {
          if (e.path().extension() != ".asm") continue;
          const std::string text = cltest::read_text(e.path());
          if (text.substr(0, text.find('\n')) != std::string("//.kernel ") + k) continue;
          ++asm_files;
          if (text.find("dpas") != std::string::npos) ++with_dpas;
        }
        EXPECT_GT(asm_files, 0) << k << ": no assembly dumped under " << (run / "dump");
        EXPECT_EQ(with_dpas, asm_files) << k << ": no dpas instruction in its assembly";
      }
    }
  if (!HasFailure()) fs::remove_all(dir);
}

// PoCL (CI's device) offers no cl_intel_subgroup_matrix_multiply_accumulate: the prefill GEMMs stay f32 (the
// OpenCL prefill tests check their results), and a forced self-check finds no XMX kernels and refuses.
TEST(OpenCLXmxSelection, F32WithoutTheExtension) {
  DEVICE_OR_SKIP();
  auto* b = dynamic_cast<opencl::OpenclBackend*>(&dev);
  ASSERT_NE(b, nullptr);
  if (b->facts().intel_subgroup_mma)
    GTEST_SKIP() << "this device offers the extension: see the prefill tests";
  EXPECT_FALSE(b->use_xmx(DType::Q4_K));
  EXPECT_FALSE(b->use_xmx(DType::Q6_K));
  EXPECT_FALSE(opencl::xmx_weight_type(DType::F32));
  EXPECT_FALSE(b->xmx_self_check(DType::Q4_K));
}

// The spec's operands (cl_intel_subgroup_matrix_multiply_accumulate, "Matrix Multiply Accumulate Functions")
// emulated in plain OpenCL C for a device without subgroups: a subgroup is XT_SG consecutive work-items of
// the one-dimensional group; each lane publishes its A operand in local memory (XT_EMU_SCRATCH, declared in
// each kernel) and reads the others' after a barrier. XMX_EMU_A(r, k) is element (row r, depth k) of A: the
// layout under test.
constexpr const char* kEmulationPrelude = R"CLC(
#define cl_intel_subgroup_matrix_multiply_accumulate 1
#define get_sub_group_local_id() ((int)get_local_id(0) % XT_SG)
#define get_sub_group_id() ((int)get_local_id(0) / XT_SG)
#define XT_EMU_SCRATCH local int emu_s[256 * 8];
float emu_half(int v, int hi) {
  const ushort u = (ushort)(hi ? ((uint)v >> 16) : ((uint)v & 0xFFFF));
  return vload_half(0, (private const half*)&u);
}
#if XT_SG == 8
typedef int8 emu_a_t;
#else
typedef short8 emu_a_t;
#endif
float8 emu_mad_k16(emu_a_t a, int8 b, float8 acc, local int* s) {
  const int lid = get_local_id(0), lane = lid % XT_SG, first = lid - lane;
  int av[8];
  vstore8(convert_int8(a), 0, av);
  for (int r = 0; r < 8; ++r) s[lid * 8 + r] = av[r];
  barrier(CLK_LOCAL_MEM_FENCE);
  float o[8];
  int bv[8];
  vstore8(acc, 0, o);
  vstore8(b, 0, bv);
  for (int r = 0; r < 8; ++r)
    for (int k = 0; k < 16; ++k) o[r] += XMX_EMU_A(r, k) * emu_half(bv[k / 2], k & 1);
  barrier(CLK_LOCAL_MEM_FENCE);
  return vload8(0, o);
}
#define intel_sub_group_f16_f16_matrix_mad_k16(a, b, c) emu_mad_k16((a), (b), (c), emu_s)
)CLC";

// A's layout as the spec gives it: at subgroups of 8, lane k / 2 holds depths k & ~1, k | 1 of row r in one
// 32-bit word (the lower depth in the low half); at 16, lane k holds depth k of row r.
constexpr const char* kSpecLayoutA =
    "-DXMX_EMU_A(r,k)=(XT_SG==8?emu_half(s[(first+(k)/2)*8+(r)],(k)&1):emu_half(s[(first+(k))*8+(r)],0))";
// A wrong layout (the halves of each word swapped): the self-check must refuse it.
constexpr const char* kSwappedLayoutA =
    "-DXMX_EMU_A(r,k)=(XT_SG==8?emu_half(s[(first+(k)/"
    "2)*8+(r)],((k)&1)^1):emu_half(s[(first+((k)^1))*8+(r)],0))";

// A fresh backend on device 0 (the shared one must keep the f32 kernels), emulating the builtins.
std::shared_ptr<Backend> emulating_backend(int sub_group, const char* layout) {
  std::shared_ptr<Backend> b = make_opencl_backend(0);
  auto* cl = dynamic_cast<opencl::OpenclBackend*>(b.get());
  if (!cl) return nullptr;
  cl->emulate_xmx({kEmulationPrelude, layout, sub_group});
  return b;
}

// The XMX kernels' tiling, operand packing and output mapping, and the self-check itself, on PoCL: with the
// spec's layouts the self-check (every kernel and row tile against the f32 kernels) passes at both subgroup
// sizes; with a wrong one it fails, so it does tell.
TEST(OpenCLXmxEmulated, SelfCheckPassesWithTheSpecLayoutAndRefusesAWrongOne) {
  DEVICE_OR_SKIP();
  if (dynamic_cast<opencl::OpenclBackend*>(&dev)->facts().intel_subgroup_mma)
    GTEST_SKIP() << "the device has the extension: the emulation would shadow its builtins";
  for (int sg : {8, 16}) {
    SCOPED_TRACE(fmt::format("subgroups of {}", sg));
    std::shared_ptr<Backend> good = emulating_backend(sg, kSpecLayoutA);
    auto* g = dynamic_cast<opencl::OpenclBackend*>(good.get());
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(g->xmx_self_check(DType::Q4_K));
    EXPECT_TRUE(g->xmx_self_check(DType::Q6_K));
    EXPECT_TRUE(g->use_xmx(DType::Q4_K));
    std::shared_ptr<Backend> bad = emulating_backend(sg, kSwappedLayoutA);
    auto* w = dynamic_cast<opencl::OpenclBackend*>(bad.get());
    ASSERT_NE(w, nullptr);
    EXPECT_FALSE(w->use_xmx(DType::Q4_K));
  }
}

// The backend's own launches of the XMX forms (gemm_tiled's and moe_prefill's geometry and arguments) on
// shapes that are not whole tiles, against the CPU's reference: a dense Q4_K product (200 features: a
// partial second 128-feature tile; 100 rows: a partial 64-row tile; f16 inputs: within 2e-3), and a MoE
// layer (Q4_K gate / up, Q6_K down: 8 experts, top-3 of 200 tokens, several 32-row tiles an expert, partial
// ones).
TEST(OpenCLXmxEmulated, BackendProductsMatchTheReference) {
  DEVICE_OR_SKIP();
  if (dynamic_cast<opencl::OpenclBackend*>(&dev)->facts().intel_subgroup_mma)
    GTEST_SKIP() << "the device has the extension: the emulation would shadow its builtins";
  std::shared_ptr<Backend> b = emulating_backend(8, kSpecLayoutA);
  ASSERT_NE(b, nullptr);
  Backend& xd = *b;
  ASSERT_TRUE(dynamic_cast<opencl::OpenclBackend&>(xd).use_xmx(DType::Q4_K));
  std::mt19937 rng(5);
  {
    const int64_t k = 512, n = 200, m = 100, ldy = n + 8;
    const std::vector<uint8_t> wq = cltest::random_weights(DType::Q4_K, n, k, rng);
    const std::vector<float> x = cltest::random_vec(m * k, rng);
    std::vector<float> ref(m * n);
    cpu::matmul_reference(DType::Q4_K, wq.data(), n, k, x.data(), m, ref.data(), n);
    DeviceBuffer wbuf = cltest::upload(xd, wq), xbuf = cltest::upload(xd, x);
    DeviceBuffer ybuf = cltest::upload(xd, std::vector<float>(m * ldy, 7.0f));
    const Weight w{.type = DType::Q4_K, .data = wbuf.data(), .ne = {k, n, 1}, .n_bytes = wq.size()};
    xd.matmul(w, cltest::ptr<float>(xbuf), m, cltest::ptr<float>(ybuf), ldy);
    bool untouched = false;
    const std::vector<float> packed =
        cltest::first_columns(cltest::download<float>(xd, ybuf, m * ldy), m, n, ldy, 7.0f, &untouched);
    EXPECT_TRUE(untouched) << "a column past n was written";
    EXPECT_LT(cltest::rel_err(packed, ref), 2e-3f);
  }
  {
    ModelConfig c;
    const int64_t E = 512, F = 256, X = 8, n = 200;
    c.n_embd = E, c.n_expert = X, c.n_expert_used = 3, c.n_ff_exp = F;
    c.expert_weights_norm = true;
    std::vector<std::vector<uint8_t>> bytes(4);
    LayerWeights host;
    auto make = [&](DType t, int64_t k, int64_t rows, int64_t mats, std::vector<uint8_t>& bb, Weight& w) {
      const size_t rb = row_bytes(t, k);
      bb.resize(rb * rows * mats);
      const std::vector<float> f = cltest::random_vec(k * rows * mats, rng, 1.0f / std::sqrt((float)k));
      for (int64_t r = 0; r < rows * mats; ++r) quantize_row(t, f.data() + r * k, bb.data() + r * rb, k);
      w = {.type = t, .data = bb.data(), .ne = {k, rows, mats}, .n_bytes = bb.size()};
    };
    make(DType::F32, E, X, 1, bytes[0], host.ffn_gate_inp);
    make(DType::Q4_K, E, F, X, bytes[1], host.ffn_gate_exps);
    make(DType::Q4_K, E, F, X, bytes[2], host.ffn_up_exps);
    make(DType::Q6_K, F, E, X, bytes[3], host.ffn_down_exps);
    const std::vector<float> x = cltest::random_vec(n * E, rng);
    std::vector<float> ref(n * E);
    cpu::moe_ffn_reference(moe_ffn_args(c, host, 0, nullptr), x.data(), n, ref.data());
    LayerWeights lw = host;
    std::vector<DeviceBuffer> bufs;
    for (Weight* w : {&lw.ffn_gate_inp, &lw.ffn_gate_exps, &lw.ffn_up_exps, &lw.ffn_down_exps}) {
      bufs.emplace_back(xd, w->n_bytes);
      xd.copy_from_host(bufs.back().data(), w->data, w->n_bytes);
      w->data = bufs.back().data();
    }
    DeviceBuffer dx = cltest::upload(xd, x), dout = cltest::upload(xd, std::vector<float>(n * E, 7.0f));
    xd.moe_ffn(moe_ffn_args(c, lw, 0, nullptr), cltest::ptr<float>(dx), n, cltest::ptr<float>(dout));
    // The hidden state is rounded to int8 blocks before down (as the CPU rounds it): gate / up's f16 error
    // (~3e-4) moves a few percent of its values across a rounding step of 1/127 of their block's largest,
    // which the down product adds up to ~5e-3 here. A wrong tile, row or feature would be off by ~1.
    EXPECT_LT(cltest::rel_err(cltest::download<float>(xd, dout, n * E), ref), 1e-2f);
    EXPECT_TRUE(dynamic_cast<opencl::OpenclBackend&>(xd).use_xmx(DType::Q6_K))
        << "down ran on the f32 kernel";
  }
}

}  // namespace
}  // namespace xpert
#endif
