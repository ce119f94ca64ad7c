// The whole-model OpenCL backend's prefill products (kernels_prefill.h): the register-tiled dense GEMM, and a
// MoE layer's batch routed and grouped on the device with one grouped GEMM for gate + up (SwiGLU fused) and
// one for down: per layer, router product, routing, grouping, two activation roundings, gate/up, down and the
// weighted combine (8 launches, none waiting for the host) instead of the host's routing and one product per
// expert and matrix (~100 launches on qwen3-30b-a3b at 512 tokens, two round trips). Like a layer wholly on a
// CUDA GPU, the device's routing is not counted in the routing statistics (m.stats). XPERT_OPENCL_OPTS
// prefill=0: the earlier kernels and the host's routing (for comparison); moe_bm=32|64: rows per grouped tile
// (default 32).
//
// On a device with cl_intel_subgroup_matrix_multiply_accumulate, the three GEMMs of a quantized weight type
// take the XMX forms (kernels_prefill_xmx.h: f16 inputs on Intel's matrix engines, f32 sums) once that
// type's self-check has matched them against the f32 kernels on the device.
#include <random>

#include "backend/opencl/backend_impl.h"
#include "backend/opencl/kernels_prefill.h"
#include "backend/opencl/kernels_prefill_xmx.h"
#include "quant/quant.h"

namespace xpert::opencl {

// The tiles read Q4_K blocks 16 bytes at a time (kernels_prefill.h pt_load): rows 16-byte aligned.
namespace {
bool tile_aligned(DType t, const void* w) { return t != DType::Q4_K || reinterpret_cast<uintptr_t>(w) % 16 == 0; }
}  // namespace

const std::string& prefill_matmul_source() {
  static const std::string s = [] {
    std::string r(kFusedMatmulSource);
    r += kPrefillRawSource;
    r += "\n#define PT_RM 4\n#define PT_SUF _m64\n";
    r += kPrefillTileSource;
    r += "\n#undef PT_RM\n#undef PT_SUF\n#define PT_RM 2\n#define PT_SUF _m32\n";
    r += kPrefillTileSource;
    r += "\n#undef PT_RM\n#undef PT_SUF\n";
    return r;
  }();
  return s;
}

ProgramText xmx_program_text(const std::string& matmul_options, int sub_group) {
  static const std::string tiles = [] {
    std::string r;
    r += "\n#define XT_BM 64\n#define XT_SUF _m64\n";
    r += kPrefillXmxSource;
    r += "\n#undef XT_BM\n#undef XT_SUF\n#define XT_BM 32\n#define XT_SUF _m32\n";
    r += kPrefillXmxSource;
    r += "\n#undef XT_BM\n#undef XT_SUF\n";
    return r;
  }();
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
    const size_t wg = xmx ? kXmxWgRows * bm : 16, wg1 = xmx ? 1 : 16, per = wg;
    if (kernel == "gemm_t")
      launch(prog.kernel(kernel + (bm == 64 ? "_m64" : "_m32")), {groups(n, 128) * per, groups(m, bm) * wg1},
             {wg, wg1}, gate_d, (cl_ulong)rb, x_d, (cl_int)k, (cl_int)k, (cl_int)n, y, (cl_int)n, (cl_int)m);
    else if (kernel == "moe_gate_up_t")
      launch(prog.kernel(kernel + (bm == 64 ? "_m64" : "_m32")), {groups(n, 64) * per, groups(m, bm) * wg1},
             {wg, wg1}, gate_d, up_d, (cl_ulong)rb, (cl_ulong)(rb * n), tiles_d, n_tiles_d, row_slot_d,
             (cl_int)1, x_d, (cl_int)k, (cl_int)k, (cl_int)n, y);
    else
      launch(prog.kernel(kernel + (bm == 64 ? "_m64" : "_m32")), {groups(n, 128) * per, groups(m, bm) * wg1},
             {wg, wg1}, gate_d, (cl_ulong)rb, (cl_ulong)(rb * n), tiles_d, n_tiles_d, x_d, (cl_int)k,
             (cl_int)n, y);
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

const std::string& prefill_ops_source() {
  static const std::string s = std::string(kFusedOpsSource) + std::string(kPrefillOpsSource);
  return s;
}

void OpenclBackend::gemm_tiled(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx,
                               int64_t m, float* y, int64_t ldy) {
  check_row(t, k);
  // 64-row tiles, or 32-row ones where those leave fewer than two work-groups per compute unit (k / v
  // projections, the router: few features).
  const size_t units = std::max<uint32_t>(info_.compute_units, 1);
  const bool small = groups(n, 128) * groups(m, 64) < 2 * units;
  const int64_t bm = small ? 32 : 64;
  // Fewer 32-row tiles than a fifth of the compute units (the router's 128 features of 512 rows on the
  // H200's 132: 16): the earlier 64 x 32 tile's twice as many work-groups finish first (208 us against 351
  // there).
  if (groups(n, 128) * groups(m, 32) * 5 < units || !tile_aligned(t, w))
    return gemm_small(t, w, n, k, x, ldx, m, y, ldy);
  const char* kernel = small ? "gemm_t_m32" : "gemm_t_m64";
  if (use_xmx(t))  // one dimension of kXmxWgRows bm work-items a group
    launch(xmx_program(t).kernel(kernel), {groups(n, 128) * kXmxWgRows * bm, groups(m, bm)},
           {(size_t)(kXmxWgRows * bm), 1}, w, (cl_ulong)row_bytes(t, k), x, (cl_int)ldx, (cl_int)k, (cl_int)n,
           y, (cl_int)ldy, (cl_int)m);
  else
    launch(matmul_program(t).kernel(kernel), {groups(n, 128) * 16, groups(m, bm) * 16}, {16, 16}, w,
           (cl_ulong)row_bytes(t, k), x, (cl_int)ldx, (cl_int)k, (cl_int)n, y, (cl_int)ldy, (cl_int)m);
}

bool OpenclBackend::moe_prefill_fits(const MoeFfn& m, int64_t n) const {
  return prefill_ && !m.split && m.uniform_seed == 0 && n >= kMoeGemmMinRows &&
         m.n_expert <= kGroupMaxExperts && m.gate.type == m.up.type && weight_macro(m.gate.type) &&
         weight_macro(m.down.type) && m.n_embd % block_elems(m.gate.type) == 0 &&
         m.n_ff % block_elems(m.down.type) == 0 && tile_aligned(m.gate.type, m.gate.data) &&
         tile_aligned(m.gate.type, m.up.data) && tile_aligned(m.down.type, m.down.data) &&
         info_.local_mem_bytes >= 24 * 1024 &&
         info_.max_work_group_size >= 256;
}

void OpenclBackend::moe_prefill(const MoeFfn& m, const float* x, int64_t n, const float* logits_d,
                                float* out) {
  const int64_t X = m.n_expert, K = m.n_used, E = m.n_embd, F = m.n_ff, S = n * K;
  const int64_t bm = moe_bm_;
  // The XMX forms (first: a first use self-checks them): one dimension of kXmxWgRows bm work-items a group;
  // the f32 ones: 16 x 16.
  const bool gx = use_xmx(m.gate.type), dx = use_xmx(m.down.type);
  // Tiles: at most one partial tile per expert beside the full ones.
  const int64_t max_tiles = S / bm + std::min(X, S);
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const DeviceRouting rt = route_on_device(m, n, logits_d);
  int32_t *row_slot_d = rt.row_slot, *slot_row_d = rt.slot_row, *tasks_d = rt.tasks;
  float* weights_d = rt.weights;
  int32_t* tiles_d = ar.take<int32_t>(4 * max_tiles);
  int32_t* n_tiles_d = ar.take<int32_t>(1);
  const size_t wg = std::min<size_t>(256, info_.max_work_group_size);
  launch(ops("moe_group"), {wg}, {wg}, tasks_d, (cl_int)S, (cl_int)X, (cl_int)bm, row_slot_d, slot_row_d,
         tiles_d, n_tiles_d);
  const char* sfx = bm == 64 ? "_m64" : "_m32";
  const float* xq = rounded_activations(m.gate.type, x, n, E);
  float* h = ar.take<float>(S * F);
  const size_t gate_row = row_bytes(m.gate.type, E), down_row = row_bytes(m.down.type, F);
  const size_t gw = gx ? kXmxWgRows * bm : 16, gw1 = gx ? 1 : 16, dw = dx ? kXmxWgRows * bm : 16,
               dw1 = dx ? 1 : 16;
  const cl_kernel gate_up = (gx ? xmx_program(m.gate.type) : matmul_program(m.gate.type))
                                .kernel(std::string("moe_gate_up_t") + sfx);
  launch(gate_up, {groups(F, 64) * gw, (size_t)max_tiles * gw1}, {gw, gw1}, m.gate.data, m.up.data,
         (cl_ulong)gate_row, (cl_ulong)(gate_row * F), tiles_d, n_tiles_d, row_slot_d, (cl_int)K, xq,
         (cl_int)E, (cl_int)E, (cl_int)F, h);
  const float* hq = rounded_activations(m.down.type, h, S, F);
  float* yg = ar.take<float>(S * E);
  const cl_kernel down =
      (dx ? xmx_program(m.down.type) : matmul_program(m.down.type)).kernel(std::string("moe_down_t") + sfx);
  launch(down, {groups(E, 128) * dw, (size_t)max_tiles * dw1}, {dw, dw1}, m.down.data, (cl_ulong)down_row,
         (cl_ulong)(down_row * E), tiles_d, n_tiles_d, hq, (cl_int)F, (cl_int)E, yg);
  elementwise("moe_combine", n * E, yg, slot_row_d, weights_d, (cl_int)K, (cl_int)E, out, (cl_long)(n * E));
  ar.release(mark);
}

}  // namespace xpert::opencl
