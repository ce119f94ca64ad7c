// The XMX forms of the prefill GEMMs (kernels_prefill_xmx.h): on a device with
// cl_intel_subgroup_matrix_multiply_accumulate, the three GEMMs of a quantized weight type take them (f16
// inputs on Intel's matrix engines, f32 sums) once that type's self-check has matched them against the f32
// kernels on the device; the program text, which the offline compile check (test_opencl_xmx.cpp) builds too.
#include <random>

#include "backend/opencl/backend_impl.h"
#include "backend/opencl/kernels_prefill.h"
#include "backend/opencl/kernels_prefill_xmx.h"
#include "quant/quant.h"

namespace xpert::opencl {

ProgramText xmx_program_text(const std::string& matmul_options, int sub_group) {
  static const std::string tiles =
      per_tile_size(kPrefillXmxSource, "XT_BM", "XT_SUF", {{64, "_m64"}, {32, "_m32"}});
  ProgramText p;
  p.source =
      std::string(kClCommonSource) + std::string(kMatmulSource) + std::string(kPrefillRawSource) + tiles;
  p.options = fmt::format("{} -DXT_SG={}", matmul_options, sub_group);
  return p;
}

bool xmx_weight_type(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

int OpenclBackend::xmx_sub_group() const {
  if (xmx_emulation_.sub_group) return xmx_emulation_.sub_group;
  // DG2's DPAS runs 8 wide; Xe-HPC's and Xe2's only 16 wide (their devices offer no subgroups of 8).
  return info_.has_sub_group_size(8) ? 8 : info_.has_sub_group_size(16) ? 16 : 0;
}

bool OpenclBackend::use_xmx(DType t) {
  if (!(info_.intel_subgroup_mma || xmx_emulation_.sub_group) || !xmx_weight_type(t)) return false;
  auto it = xmx_ok_.find(t);
  if (it == xmx_ok_.end()) it = xmx_ok_.emplace(t, xmx_self_check(t)).first;
  return it->second;
}

bool OpenclBackend::xmx_self_check(DType t) {
  const int sg = xmx_sub_group();
  if (!sg) {
    log::warn(
        "{}: the XMX prefill kernels need subgroups of 8 or 16, which the device does not offer; {} "
        "prefill products stay on the f32 kernels",
        name(), dtype_name(t));
    return false;
  }
  // A layer's shape in small: 64 rows, 256 features, k = 2048 (8 K-quant blocks a row); one expert of 256
  // gate / up / down features, a tile of 64 grouped rows (both row tiles run).
  const int64_t m = 64, n = 256, k = 2048;
  std::mt19937 rng(1234 + (int)t);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random = [&](int64_t count, float scale) {
    std::vector<float> v(count);
    for (float& f : v) f = scale * nd(rng);
    return v;
  };
  const size_t rb = row_bytes(t, k);
  auto quantized = [&] {
    const std::vector<float> wf = random(n * k, 0.05f);
    std::vector<uint8_t> q(rb * n);
    for (int64_t r = 0; r < n; ++r) quantize_row(t, wf.data() + r * k, q.data() + r * rb, k);
    return q;
  };
  const std::vector<uint8_t> w_gate = quantized(), w_up = quantized();
  const std::vector<float> x = random(m * k, 1.0f);
  const std::vector<int32_t> tiles = {0, 0, (int32_t)m, 0}, n_tiles = {1};
  std::vector<int32_t> row_slot(m);
  for (int64_t g = 0; g < m; ++g) row_slot[g] = (int32_t)g;

  std::vector<void*> owned;
  auto upload = [&](const void* src, size_t bytes) {
    void* d = alloc(bytes);
    owned.push_back(d);
    copy_from_host(d, src, bytes);
    return d;
  };
  auto output = [&](size_t count) {
    void* d = alloc(count * sizeof(float));
    owned.push_back(d);
    zero(d, count * sizeof(float));
    return static_cast<float*>(d);
  };
  const void* gate_d = upload(w_gate.data(), w_gate.size());
  const void* up_d = upload(w_up.data(), w_up.size());
  const float* x_d = static_cast<const float*>(upload(x.data(), x.size() * sizeof(float)));
  const int32_t* tiles_d = static_cast<const int32_t*>(upload(tiles.data(), tiles.size() * sizeof(int32_t)));
  const int32_t* n_tiles_d = static_cast<const int32_t*>(upload(n_tiles.data(), sizeof(int32_t)));
  const int32_t* row_slot_d = static_cast<const int32_t*>(upload(row_slot.data(), m * sizeof(int32_t)));

  // One kernel's result, by the f32 (xmx = false) or the XMX program: y of m x n.
  auto run = [&](Prog& prog, bool xmx, const std::string& kernel, int64_t bm) {
    float* y = output(m * n);
    const TileShape ts = tile_shape(xmx, bm);
    const cl_kernel kern = prog.kernel(kernel + (bm == 64 ? "_m64" : "_m32"));
    if (kernel == "gemm_t") {
      const auto [wg, wg1] = dense_tile_group(xmx, bm);  // as gemm_tiled launches it
      launch(kern, {groups(n, kDenseTileCols) * wg, groups(m, bm) * wg1}, {wg, wg1}, gate_d, (cl_ulong)rb,
             x_d, (cl_int)k, (cl_int)k, (cl_int)n, y, (cl_int)n, (cl_int)m);
    } else if (kernel == "moe_gate_up_t") {
      launch(kern, {groups(n, ts.cols / 2) * ts.wg, groups(m, bm)}, {ts.wg, 1}, gate_d, up_d, (cl_ulong)rb,
             (cl_ulong)(rb * n), tiles_d, n_tiles_d, row_slot_d, (cl_int)1, x_d, (cl_int)k, (cl_int)k,
             (cl_int)n, y);
    } else {
      launch(kern, {groups(n, ts.cols) * ts.wg, groups(m, bm)}, {ts.wg, 1}, gate_d, (cl_ulong)rb,
             (cl_ulong)(rb * n), tiles_d, n_tiles_d, x_d, (cl_int)k, (cl_int)n, y);
    }
    std::vector<float> h(m * n);
    copy_to_host(h.data(), y, h.size() * sizeof(float));
    return h;
  };
  std::string why;
  double worst = 0;
  try {
    Prog& xmx = xmx_program(t);
    Prog& f32 = matmul_program(t);
    for (const char* kernel : {"gemm_t", "moe_gate_up_t", "moe_down_t"})
      for (int64_t bm : {64, 32}) {
        if (!why.empty()) break;
        // The tile list's one tile is bm rows: the moe kernels of the 32-row tile see rows 0..31.
        const std::vector<int32_t> tile = {0, 0, (int32_t)bm, 0};
        copy_from_host(const_cast<int32_t*>(tiles_d), tile.data(), tile.size() * sizeof(int32_t));
        const std::vector<float> ref = run(f32, false, kernel, bm), got = run(xmx, true, kernel, bm);
        // f16 inputs (11-bit significands) over k = 2048 terms: the largest difference stays near 1e-4 of
        // the largest output; a wrong operand layout is off by the outputs' own size.
        double max_ref = 0, max_diff = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          max_ref = std::max(max_ref, (double)std::fabs(ref[i]));
          const double d = std::fabs((double)ref[i] - got[i]);
          max_diff = std::isfinite(got[i]) ? std::max(max_diff, d) : INFINITY;
        }
        const double rel = max_ref > 0 ? max_diff / max_ref : INFINITY;
        worst = std::max(worst, rel);
        if (!(rel <= 2e-3)) {
          why = fmt::format("{}_m{} differs from the f32 kernel by {:.3g} of the largest output (bound 2e-3)",
                            kernel, bm, rel);
        }
      }
  } catch (const Error& e) {
    why = fmt::format("the XMX program failed: {}", e.what());
  }
  synchronize();
  for (void* p : owned) dealloc(p);
  if (!why.empty()) {
    log::warn("{}: XMX prefill kernels not used for {} weights ({}); the f32 kernels run instead", name(),
              dtype_name(t), why);
    return false;
  }
  log::info(
      "{}: XMX prefill kernels in use for {} weights (subgroups of {}; self-check: {:.2g} of the largest "
      "output at most)",
      name(), dtype_name(t), sg, worst);
  return true;
}

}  // namespace xpert::opencl
