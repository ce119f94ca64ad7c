// The whole-model OpenCL backend's prefill products (kernels_prefill.h): the register-tiled dense GEMM, and a
// MoE layer's batch routed and grouped on the device with one grouped GEMM for gate + up (SwiGLU fused) and
// one for down: per layer, router product, routing, grouping, the activations' rounding for down (x's is done
// by the FFN norm's launch), gate/up, down and the weighted combine (7 launches, none waiting for the host)
// instead of the host's routing and one product per expert and matrix (~100 launches on qwen3-30b-a3b at 512
// tokens, two round trips). Like a layer wholly on a CUDA GPU, the device's routing is not counted in the
// routing statistics (m.stats). XPERT_OPENCL_OPTS prefill=0: the earlier kernels and the host's routing (for
// comparison); moe_bm=32|64: rows per grouped tile (default 32).
//
// On a device with cl_intel_subgroup_matrix_multiply_accumulate the three GEMMs of a quantized weight type
// take the XMX forms once they pass their self-check (prefill_xmx.cpp).
#include "backend/opencl/backend_impl.h"
#include "backend/opencl/kernels_prefill.h"

namespace xpert::opencl {

void OpenclBackend::gemm_tiled(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx,
                               int64_t m, float* y, int64_t ldy) {
  check_row(t, k);
  const bool xmx = use_xmx(t);
  const size_t units = std::max<uint32_t>(info_.compute_units, 1), col_groups = groups(n, kDenseTileCols);
  const size_t tiles32 = col_groups * groups(m, 32);
  if (!q4k_rows_aligned(t, w)) return gemm_small(t, w, n, k, x, ldx, m, y, ldy);
  // The tiles as dense_plan fills the compute units, split along k where they are too few (the f32 tiles;
  // the XMX ones by the earlier rule, never split).
  const DensePlan plan = dense_plan(n, m, k, (int64_t)units, xmx ? 1 : ksplit_);
  if (plan.slices > 1) return gemm_split(t, w, n, k, x, ldx, m, y, ldy, plan);
  // Fewer 32-row tiles than a fifth of the compute units (XPERT_OPENCL_OPTS ksplit=1, an XMX device): the
  // earlier 64 x 32 tile's more work-groups finish first (the router: 208 us against 351, H200).
  if (tiles32 * 5 < units) return gemm_small(t, w, n, k, x, ldx, m, y, ldy);
  const int64_t bm = plan.bm;
  const auto [wg, wg1] = dense_tile_group(xmx, bm);
  const cl_kernel kernel =
      (xmx ? xmx_program(t) : matmul_program(t)).kernel(bm == 32 ? "gemm_t_m32" : "gemm_t_m64");
  // A kernel whose work-group this device cannot run with its registers (CL_KERNEL_WORK_GROUP_SIZE).
  if (kernel_max_group(kernel, (int64_t)(wg * wg1)) < (int64_t)(wg * wg1))
    return gemm_small(t, w, n, k, x, ldx, m, y, ldy);
  launch(kernel, {col_groups * wg, groups(m, bm) * wg1}, {wg, wg1}, w, (cl_ulong)row_bytes(t, k), x,
         (cl_int)ldx, (cl_int)k, (cl_int)n, y, (cl_int)ldy, (cl_int)m);
}

// plan.bm-row f32 tiles over plan.slices slices of k (gemm_tk_m32 / gemm_tk_m64), each into its plane of
// partial sums in scratch memory; each tile's last slice adds its planes in order into y (one launch; a
// launch of sum_planes did it before: 384 of 8 us in two passes of qwen3-30b-a3b at 512 rows, H100). With
// w2, the column groups after w's take w2's product into y2.
void OpenclBackend::gemm_split(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx,
                               int64_t m, float* y, int64_t ldy, DensePlan plan, const void* w2, float* y2) {
  const auto [wg, wg1] = dense_tile_group(false, plan.bm);
  const cl_kernel kernel = matmul_program(t).kernel(plan.bm == 32 ? "gemm_tk_m32" : "gemm_tk_m64");
  const size_t jobs = w2 ? 2 : 1, col_groups = groups(n, kDenseTileCols), row_groups = groups(m, plan.bm);
  if (kernel_max_group(kernel, (int64_t)(wg * wg1)) < (int64_t)(wg * wg1) ||
      (int64_t)(jobs * col_groups * row_groups) > kCounters) {  // a count per tile
    gemm_small(t, w, n, k, x, ldx, m, y, ldy);
    if (w2) gemm_small(t, w2, n, k, x, ldx, m, y2, ldy);
    return;
  }
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* planes = ar.take<float>(jobs * plan.slices * m * n);
  launch(kernel, {jobs * col_groups * wg, row_groups * wg1, (size_t)plan.slices}, {wg, wg1, 1}, w,
         (cl_ulong)row_bytes(t, k), x, (cl_int)ldx, (cl_int)k, (cl_int)plan.kc,
         (cl_ulong)row_bytes(t, plan.kc), (cl_int)n, planes, y, (cl_int)ldy, (cl_int)m, counters_,
         w2 ? w2 : w, y2 ? y2 : y, (cl_int)col_groups);
  ar.release(mark);
}

// Planned as one product of 2 n features (qwen3-30b-a3b's k and v at 512 rows: 64 tiles in 4 slices of 512,
// where each alone took 32 tiles in 8 slices of 256).
bool OpenclBackend::gemm_pair(DType t, const void* w, const void* w2, int64_t n, int64_t k, const float* x,
                              int64_t m, float* y, float* y2, int64_t ldy) {
  if (!prefill_tiles() || use_xmx(t) || !q4k_rows_aligned(t, w) || !q4k_rows_aligned(t, w2)) return false;
  check_row(t, k);
  const int64_t units = std::max<uint32_t>(info_.compute_units, 1);
  const DensePlan pair = dense_plan(2 * n, m, k, units, ksplit_);
  if (dense_plan(n, m, k, units, ksplit_).slices < 2 || pair.slices < 2) return false;
  gemm_split(t, w, n, k, x, k, m, y, ldy, pair, w2, y2);
  return true;
}

bool OpenclBackend::moe_prefill_fits(const MoeFfn& m, int64_t n) const {
  return prefill_tiles() && !m.split && m.uniform_seed == 0 && n >= kMoeGemmMinRows &&
         m.n_expert <= kGroupMaxExperts && m.gate.type == m.up.type && weight_macro(m.gate.type) &&
         weight_macro(m.down.type) && m.n_embd % block_elems(m.gate.type) == 0 &&
         m.n_ff % block_elems(m.down.type) == 0 && q4k_rows_aligned(m.gate.type, m.gate.data) &&
         q4k_rows_aligned(m.gate.type, m.up.data) && q4k_rows_aligned(m.down.type, m.down.data);
}

void OpenclBackend::moe_prefill(const MoeFfn& m, const float* x, int64_t n, const float* logits_d, float* out,
                                const Prerounded& xq_norm) {
  const int64_t X = m.n_expert, K = m.n_used, E = m.n_embd, F = m.n_ff, S = n * K;
  const int64_t bm = moe_bm_;
  // The XMX forms where the device has them (a first use self-checks them), else the f32 tiles.
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
  pre_ = xq_norm;  // the launches since wrote only their own outputs, not x
  const float* xq = rounded_activations(m.gate.type, x, n, E);
  float* h = ar.take<float>(S * F);
  const size_t gate_row = row_bytes(m.gate.type, E), down_row = row_bytes(m.down.type, F);
  const TileShape gs = tile_shape(gx, bm), ds = tile_shape(dx, bm);
  const cl_kernel gate_up = (gx ? xmx_program(m.gate.type) : matmul_program(m.gate.type))
                                .kernel(std::string("moe_gate_up_t") + sfx);
  launch(gate_up, {groups(F, gs.cols / 2) * gs.wg, (size_t)max_tiles}, {gs.wg, 1}, m.gate.data, m.up.data,
         (cl_ulong)gate_row, (cl_ulong)(gate_row * F), tiles_d, n_tiles_d, row_slot_d, (cl_int)K, xq,
         (cl_int)E, (cl_int)E, (cl_int)F, h);
  const float* hq = rounded_activations(m.down.type, h, S, F);
  float* yg = ar.take<float>(S * E);
  const cl_kernel down =
      (dx ? xmx_program(m.down.type) : matmul_program(m.down.type)).kernel(std::string("moe_down_t") + sfx);
  launch(down, {groups(E, ds.cols) * ds.wg, (size_t)max_tiles}, {ds.wg, 1}, m.down.data, (cl_ulong)down_row,
         (cl_ulong)(down_row * E), tiles_d, n_tiles_d, hq, (cl_int)F, (cl_int)E, yg);
  elementwise("moe_combine", n * E, yg, slot_row_d, weights_d, (cl_int)K, (cl_int)E, out, (cl_long)(n * E));
  ar.release(mark);
}

}  // namespace xpert::opencl
