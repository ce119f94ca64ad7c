// Host side of the CUDA matmul: which activation form and which kernel a (type, m) pair gets.
#include <algorithm>

#include "backend/cuda/device.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_kernels.h"

namespace xpert::cuda {

namespace {
bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// A tensor-core product's X side (16-bit activations with their row scales).
detail::GemmArgs gemm_args(DType w_type, const Activations& a) {
  detail::GemmArgs g;
  g.k = a.k;
  g.row_bytes = row_bytes(w_type, a.k);
  g.x = a.data;
  g.x_scale = a.aux;
  g.m = a.m;
  if (a.m <= detail::kGemmSmallMaxRows) g.bm = detail::kGemmSmallBM;
  return g;
}
}  // namespace

void matmul_init() { detail::gemm_init(); }

bool matmul_supported(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void check_matmul_shape(DType w_type, int64_t k) {
  if (!matmul_supported(w_type))
    fail_cat("CUDA matmul: weight type ", dtype_name(w_type), " is not supported");
  // Float rows are read 16 bytes at a time; quant rows are whole blocks (and k % 32 == 0 for q8_1).
  const int64_t need = w_type == DType::F32 ? 4 : is_float(w_type) ? 8 : dtype_info(w_type).block_size;
  if (k <= 0 || k % need != 0)
    fail_cat("CUDA matmul: ", dtype_name(w_type), " rows of ", k, " elements (must be a multiple of ", need,
             ")");
}

ActFormat activation_format(DType w_type, int64_t m) {
  switch (w_type) {
    case DType::F32:
      return ActFormat::f32;
    case DType::F16:
      return ActFormat::f16;
    case DType::BF16:
      return ActFormat::bf16;
    default:
      return m <= kMatvecMaxRows ? ActFormat::q8_1 : ActFormat::f16;
  }
}

size_t activation_bytes(ActFormat f, int64_t m, int64_t k) {
  switch (f) {
    case ActFormat::q8_1:
      return Workspace::round((size_t)(m * k)) + Workspace::round((size_t)(m * (k / 32)) * 8);
    case ActFormat::f16:
    case ActFormat::bf16:
      return Workspace::round((size_t)(m * k) * 2) + Workspace::round((size_t)m * 4);
    case ActFormat::f32:
      return 0;
  }
  return 0;
}

Activations quantize_activations(ActFormat f, const float* x, int64_t ldx, int64_t m, int64_t k, void* out,
                                 cudaStream_t stream) {
  Activations a;
  a.format = f;
  a.m = m;
  a.k = k;
  Workspace ws(out, activation_bytes(f, m, k));
  switch (f) {
    case ActFormat::q8_1: {
      if (k % 32 != 0) fail_cat("CUDA matmul: q8_1 activations need k % 32 == 0, got ", k);
      auto* q = ws.take<int8_t>((size_t)(m * k));
      auto* ds = ws.take<float2>((size_t)(m * (k / 32)));
      detail::launch_quantize_q8_1(x, ldx, m, k, q, ds, stream);
      a.data = q;
      a.aux = reinterpret_cast<const float*>(ds);
      break;
    }
    case ActFormat::f16:
    case ActFormat::bf16: {
      if (k % 2 != 0) fail_cat("CUDA matmul: 16-bit activations need an even k, got ", k);
      void* d = ws.take_bytes((size_t)(m * k) * 2);
      auto* s = ws.take<float>((size_t)m);
      detail::launch_convert_16(f == ActFormat::bf16, x, ldx, m, k, d, s, nullptr, stream);
      a.data = d;
      a.aux = s;
      break;
    }
    case ActFormat::f32:
      if (ldx != k) fail_cat("CUDA matmul: f32 activations must be dense (ldx ", ldx, " != k ", k, ")");
      a.data = x;
      break;
  }
  return a;
}

void matmul_prepared(DType w_type, const void* w, int64_t n, const Activations& a, float* y, int64_t ldy,
                     cudaStream_t stream) {
  XPERT_CU_ASSERT(ldy >= n);
  check_matmul_shape(w_type, a.k);
  if (a.format != activation_format(w_type, a.m))
    fail_cat("CUDA matmul: activations prepared for another weight type or batch size");
  if (n == 0 || a.m == 0) return;
  // Tensor cores once X has more rows than the matrix-vector kernels take, except for F32 weights (no
  // f32 mma here: those are small, e.g. MoE routers) and float rows that are not whole 32-element groups.
  const bool tensor = a.m > kMatvecMaxRows && w_type != DType::F32 && a.k % 32 == 0;
  if (!tensor) {
    detail::launch_matvec(w_type, w, n, a, y, ldy, stream);
    return;
  }
  detail::GemmArgs g = gemm_args(w_type, a);
  g.w0 = w;
  g.n = n;
  g.y = y;
  g.ldy = ldy;
  detail::launch_gemm(w_type, false, g, stream);
}

namespace {
detail::MatvecOuts matvec_outs(const MatmulOut* outs, int count) {
  if (count < 1 || count > detail::MatvecOuts::kMax)
    fail_cat("CUDA matmul: ", count, " products in a group (1..", detail::MatvecOuts::kMax, ")");
  detail::MatvecOuts o;
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) {
    XPERT_CU_ASSERT(outs[i].ldy >= outs[i].n);
    rows += outs[i].n;
    o.w[o.count] = outs[i].w;
    o.end[o.count] = rows;
    o.y[o.count] = outs[i].y;
    o.ldy[o.count] = outs[i].ldy;
    ++o.count;
  }
  return o;
}
}  // namespace

void matmul_prepared_multi(DType w_type, const MatmulOut* outs, int count, const Activations& a,
                           cudaStream_t stream) {
  check_matmul_shape(w_type, a.k);
  if (a.format != activation_format(w_type, a.m))
    fail_cat("CUDA matmul: activations prepared for another weight type or batch size");
  const bool tensor = a.m > kMatvecMaxRows && w_type != DType::F32 && a.k % 32 == 0;
  for (int i0 = 0; i0 < count;) {
    if (tensor) {  // up to GemmArgs::kMaxOuts products in one grid
      detail::GemmArgs g = gemm_args(w_type, a);
      int32_t tiles = 0;
      for (; i0 < count && g.n_outs < detail::GemmArgs::kMaxOuts; ++i0) {
        XPERT_CU_ASSERT(outs[i0].ldy >= outs[i0].n);
        tiles += (int32_t)((outs[i0].n + detail::kGemmBN - 1) / detail::kGemmBN);
        g.outs[g.n_outs++] = {.w = outs[i0].w, .n = outs[i0].n, .y = outs[i0].y, .ldy = outs[i0].ldy,
                              .tile_end = tiles};
      }
      detail::launch_gemm(w_type, false, g, stream);
      continue;
    }
    const int c = std::min(count - i0, detail::MatvecOuts::kMax);
    detail::launch_matvec(w_type, matvec_outs(outs + i0, c), a, stream);
    i0 += c;
  }
}

bool matmul_pair_supported(DType t0, DType t1, const Activations& a) {
  return detail::matvec_pair_supported(t0, t1, a);
}

void matmul_prepared_pair(DType t0, const MatmulOut* outs0, int count0, DType t1, const MatmulOut* outs1,
                          int count1, const Activations& a, cudaStream_t stream) {
  check_matmul_shape(t0, a.k);
  check_matmul_shape(t1, a.k);
  if (a.format != activation_format(t0, a.m) || a.format != activation_format(t1, a.m))
    fail_cat("CUDA matmul: activations prepared for another weight type or batch size");
  detail::launch_matvec_pair(t0, matvec_outs(outs0, count0), t1, matvec_outs(outs1, count1), a, stream);
}

size_t matmul_workspace_bytes(DType w_type, int64_t m, int64_t k) {
  return activation_bytes(activation_format(w_type, m), m, k);
}

void matmul(DType w_type, const void* w, int64_t n, int64_t k, const float* x, int64_t m, float* y,
            int64_t ldy, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  check_matmul_shape(w_type, k);
  const ActFormat f = activation_format(w_type, m);
  if (workspace_bytes < activation_bytes(f, m, k))
    fail_cat("CUDA matmul: workspace of ", workspace_bytes, " bytes, needs ", activation_bytes(f, m, k));
  const Activations a = quantize_activations(f, x, k, m, k, workspace, stream);
  matmul_prepared(w_type, w, n, a, y, ldy, stream);
}

}  // namespace xpert::cuda
