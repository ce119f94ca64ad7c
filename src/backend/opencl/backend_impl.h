// The whole-model OpenCL backend's class, shared by its source files (opencl_backend.cpp: memory, plain ops,
// MoE; fused_ops.cpp: the fused decode forms). Internal to backend/opencl.
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "backend/experts.h"
#include "backend/gated_delta_net.h"
#include "backend/opencl/cl_api.h"
#include "backend/opencl/command_buffer.h"
#include "backend/opencl/discovery.h"
#include "backend/opencl/kernels_attention.h"
#include "backend/opencl/kernels_attention_split.h"
#include "backend/opencl/kernels_fused.h"
#include "backend/opencl/kernels_gdn.h"
#include "backend/opencl/kernels_matmul.h"
#include "backend/opencl/kernels_ops.h"
#include "backend/opencl/opencl_backend.h"
#include "backend/opencl/program_cache.h"
#include "backend/opencl/switches.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "quant/dtype.h"

namespace xpert::opencl {

// Must match the kernel sources.
constexpr int kRedWg = 64;  // RED_WG, kernels_ops.h
constexpr int kRoundTeam = 8;             // ROUND_TEAM, kernels_ops.h
constexpr int kNormWg = 256, kNormJ = 8;  // NORM_WG, NORM_J, kernels_fused.h
constexpr int kMvRows = 4;  // MV_MR, kernels_matmul.h
constexpr int kTileN = 64, kTileM = 32;
// Work-items of an XMX prefill tile per row of it (XT_WG, kernels_prefill_xmx.h).
constexpr int64_t kXmxWgRows = 4;
// A MoE prefill tile of bm rows (kernels_prefill.h: _m64, _m32): its work-group (one dimension) and the
// output columns it covers (a gate/up tile: half as many features, each a gate and an up column). The XMX
// forms: kXmxWgRows * bm work-items over 128; the f32 tiles: 4 bm over 256.
struct TileShape {
  size_t wg, cols;
};
inline TileShape tile_shape(bool xmx, int64_t bm) {
  return {(size_t)(xmx ? kXmxWgRows * bm : 4 * bm), xmx ? (size_t)128 : (size_t)256};
}
// The dense prefill tile (gemm_t) of bm rows over 128 columns: its work-group, {kXmxWgRows * bm, 1} for the
// XMX forms, {16, 16} for the f32 tile (kPrefillDenseTileSource); the global size is groups(n, 128) x
// groups(m, bm) of it.
constexpr int64_t kDenseTileCols = 128;
inline std::array<size_t, 2> dense_tile_group(bool xmx, int64_t bm) {
  return xmx ? std::array<size_t, 2>{(size_t)(kXmxWgRows * bm), 1} : std::array<size_t, 2>{16, 16};
}
constexpr int kAttWg = 64, kAttMaxD = 512, kAttQb = 8;  // kernels_attention.h
// decode_attention splits the keys of a step this deep into chunks (where the CPU takes its tiled path), at
// most kAttMaxChunks of them.
constexpr int64_t kAttSplitKeys = cpu::kAttentionTiledMinKeys, kAttMaxChunks = 64;
constexpr int kGdnMaxDk = 512;              // kernels_gdn.h
constexpr int kGdnMaxWg = 1024;             // GDN_MAXWG, kernels_gdn.h: the recurrent kernel's group at most
constexpr int kGdnNr = 16;                  // GDN_NR, kernels_gdn.h: state rows a work-item of it holds
constexpr int kGdnChunk = 64;    // GDN_C, kernels_gdn.h: also the prep kernel's work-group at least
constexpr int kGdnPrepWg = 256;  // GDN_PREP_WG, kernels_gdn.h: the prep kernel's work-group at most
// The matmul programs' registers a work-item at most on NVIDIA's OpenCL (-cl-nv-maxrregcount;
// XPERT_OPENCL_OPTS nv_regs): on an H100, qwen3.5-35b-a3b tg128 185.4 / 187.5 -> 191.5 / 193.5 t/s,
// qwen3-30b-a3b 156.2 -> 158.3, pp512 +0.3 % (2026-12-05, perf-history/opencl.md).
constexpr int kNvRegs = 128;
// GDN_SR, GDN_SCAN_CB, GDN_SCAN_S (kernels_gdn.h): state rows a work-item of the chunk scan updates, its
// column block at most, its block of the state in local memory (floats) at most.
constexpr int kGdnSr = 8, kGdnScanCb = 32, kGdnScanS = 4096;
constexpr int64_t kGdnPrepTokens = 16;  // tokens a group of gdn_prep takes (one convolution state read each)
// A matmul with more activation rows than this takes the tiled kernel.
constexpr int64_t kGemvMaxRows = 8;
// An expert with at least this many rows in a MoE batch takes the tiled kernel, the others one batched gemv.
constexpr int64_t kMoeGemmMinRows = 16;

inline const char* weight_macro(DType t) {
  switch (t) {
    case DType::F32:
      return "WT_F32";
    case DType::F16:
      return "WT_F16";
    case DType::BF16:
      return "WT_BF16";
    case DType::Q8_0:
      return "WT_Q8_0";
    case DType::Q4_0:
      return "WT_Q4_0";
    case DType::Q5_0:
      return "WT_Q5_0";
    case DType::Q4_K:
      return "WT_Q4_K";
    case DType::Q5_K:
      return "WT_Q5_K";
    case DType::Q6_K:
      return "WT_Q6_K";
    default:
      return nullptr;
  }
}

// Elements per block of a weight type (a quantized row must hold whole blocks).
inline int64_t block_elems(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q5_0:
      return 32;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return 256;
    default:
      return 1;
  }
}

// src once per tile size (rows, name suffix): "#define ROWS_MACRO rows" and "#define SUFFIX_MACRO suffix"
// before each copy, #undef after, so each copy's kernels take the suffix in their names (kernels_prefill.h,
// kernels_prefill_xmx.h).
std::string per_tile_size(std::string_view src, const char* rows_macro, const char* suffix_macro,
                          std::initializer_list<std::pair<int, const char*>> sizes);

// Whether a Q4_K matrix's rows at w keep 16-byte alignment (other types: always true), as the prefill tiles
// (pt_load) read Q4_K blocks 16 bytes at a time (the decode matvecs: check_mv_aligned).
inline bool q4k_rows_aligned(DType t, const void* w) {
  return t != DType::Q4_K || reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

// A kernel argument of local memory: n bytes for the launch (a `local` pointer parameter).
struct LocalBytes {
  size_t n;
};

// How a device's matmul programs are built, whatever the weight type.
struct MatmulBuild {
  int mv_wg = 32;  // MV_WG: work-items a matrix row in the matvecs
  int mv_r = 4;    // MV_R: matrix rows a work-group of the fused matvecs
  bool wide_loads = true;
  // Its MoE down kernel rounds the next layer's input (kFusedMatmulSource): divisions as the ops program's,
  // or NVIDIA's rounds differ from round_blocks' by an ulp.
  bool correctly_rounded_divide = true;
  // MV_SG: the matvecs' subgroups of this many work-items (cl_intel_required_subgroup_size; divides mv_wg),
  // a row summed by sub_group_reduce_add instead of a tree in local memory. 0: none.
  int sub_group = 0;
  // -cl-nv-maxrregcount (NVIDIA's cl_nv_compiler_options): registers a work-item at most. 0: the compiler's.
  int max_registers = 0;
  // PT_BUFS / PT_DBUFS: the grouped MoE / dense prefill tiles' steps in local memory, 1 or 2
  // (kernels_prefill.h).
  int tile_bufs = 1;
  int dense_bufs = 1;
};

// A weight type's matmul program's build options.
inline std::string matmul_options(DType t, const MatmulBuild& b) {
  return fmt::format("-D{} -DMV_WG={} -DMV_R={} -DPT_BUFS={} -DPT_DBUFS={}{}{}{}{}", weight_macro(t), b.mv_wg,
                     b.mv_r, b.tile_bufs, b.dense_bufs, b.wide_loads ? "" : " -DNO_WIDE_LOADS",
                     b.correctly_rounded_divide ? " -cl-fp32-correctly-rounded-divide-sqrt" : "",
                     b.sub_group ? fmt::format(" -DMV_SG={}", b.sub_group) : "",
                     b.max_registers ? fmt::format(" -cl-nv-maxrregcount={}", b.max_registers) : "");
}

// prefill_xmx.cpp: the XMX prefill program (kernels_prefill_xmx.h) of a weight type, exactly as the backend
// builds it: the whole source and the options (matmul_options plus the subgroup size, 8 or 16). The offline
// compile check (tests/unit/test_opencl_xmx.cpp) compiles this text.
ProgramText xmx_program_text(const std::string& matmul_options, int sub_group);
// program_texts.cpp: the other programs of the backend, as it builds them: the small and fused ops
// (kernels_ops.h, kernels_fused.h, the prefill's ops), attention, Gated DeltaNet, and a weight type's matmul
// program (kernels_matmul.h, the fused matvecs, the prefill tiles) for mv_wg work-items a row, mv_r rows.
ProgramText ops_program_text(bool correctly_rounded_divide);
// block_keep: attention_block's kept scores (ATT_BKEEP, att_block_keep); block_dims: its dims a query
// (ATT_BD, att_block_dims); wide_loads: the cache read in 4- to 16-byte words (att_wide_loads).
ProgramText attention_program_text(bool correctly_rounded_divide, int block_keep, int block_dims = kAttMaxD,
                                   bool wide_loads = true);
// attention_block keeps pass 1's scores of up to 512 keys for pass 2 (16 KiB more local memory, 44 in all)
// where the device has 48 KiB a work-group; elsewhere pass 2 computes them again.
inline int att_block_keep(uint64_t local_mem) { return local_mem >= 48 * 1024 ? 512 : 0; }
// attention_block's dims a query for heads of head_dim: 128, 256 or kAttMaxD (ATT_BD).
inline int att_block_dims(int64_t head_dim) {
  return head_dim <= 128 ? 128 : head_dim <= 256 ? 256 : kAttMaxD;
}
// Whether the attention kernels may read the f16 cache k / v in words of up to 16 bytes (kernels_attention.h
// ld_h8): both caches 16-byte aligned, and each head's row and each slot starting on a multiple of 8 halves.
inline bool att_wide_loads(const void* k, const void* v, int64_t head_dim, int64_t slot_halves = 0) {
  const auto at16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return at16(k) && at16(v) && head_dim % 8 == 0 && slot_halves % 8 == 0;
}
ProgramText gdn_program_text(bool correctly_rounded_divide);
ProgramText matmul_program_text(DType t, const MatmulBuild& b);
// Weight types the XMX kernels take (the quantized ones: whole 32-value chunks).
bool xmx_weight_type(DType t);

inline size_t groups(int64_t n, int64_t per) { return (size_t)((n + per - 1) / per); }

// The prefill tiles' buffers (kernels_prefill.h PT_BUFS: the grouped MoE tiles, PT_DBUFS: the dense ones) on
// a device of local_mem bytes of local memory a work-group: two where the _m64 form's fit (two_bytes:
// kTwoTileBufsBytes, kTwoDenseBufsBytes), else one; forced (XPERT_OPENCL_OPTS pt_bufs) 1 or 2 as asked, 0
// where two do not fit.
inline constexpr uint64_t kTwoTileBufsBytes = 2 * 16 * (256 + 64) * sizeof(float);
inline constexpr uint64_t kTwoDenseBufsBytes = 2 * 32 * (128 + 64) * sizeof(float);
inline int tile_bufs_for(uint64_t local_mem, int forced, uint64_t two_bytes = kTwoTileBufsBytes) {
  if (forced == 1) return 1;
  const bool two = local_mem >= two_bytes;
  if (forced == 2) return two ? 2 : 0;
  return two ? 2 : 1;
}

// gemm_tiled's launch for a product of n features by m rows, k deep, on `units` compute units (the f32
// tiles, not XMX): the tile's rows (bm, 32 or 64) and its split of k into slices of kc elements (a multiple
// of 256: whole blocks of every weight type; the last slice takes what is left). The plan fills the units
// and leaves no short last wave (an H100 holds three 32-row groups an SM or two 64-row ones): 64-row tiles
// where they make about two groups a unit (15/16 of it or more; qwen3's q: 256, where 512 of 32 rows were
// 1.3 waves); where they are fewer but the 32-row tiles still cover the units, 64-row tiles split along k
// into about two a unit (qwen3's o projection: 128 tiles of 64 rows in 2 slices, where 256 of 32 rows
// left a third of the H100 idle); where even the 32-row tiles are fewer than the units, 64-row tiles split
// into about two a unit where at most 16 slices get there and the rows fill them (qwen3's k and v: 32
// tiles in 8 slices of 256, where 64 of 32 rows took 4 slices), else 32-row tiles split into about two a
// unit (at most 16 slices; the router's 128 features). forced (XPERT_OPENCL_OPTS ksplit): 0 plans as above, 1
// never splits (64-row tiles only from two a unit), N > 1 splits 32-row tiles into N. One slice: no split.
struct DensePlan {
  int64_t bm = 32, slices = 1, kc = 0;
};
inline DensePlan dense_plan(int64_t n, int64_t m, int64_t k, int64_t units, int forced) {
  const int64_t cols = (int64_t)groups(n, kDenseTileCols), g32 = cols * (int64_t)groups(m, 32),
                g64 = cols * (int64_t)groups(m, 64), full = 2 * units, blocks = (int64_t)groups(k, 256);
  auto split = [&](int64_t bm, int64_t want) {
    want = std::min(want, blocks);
    if (want < 2) return DensePlan{bm};
    const int64_t kc = (blocks + want - 1) / want * 256;
    return DensePlan{bm, (k + kc - 1) / kc, kc};
  };
  if (forced == 1) return {g64 < full ? 32 : 64};
  if (forced > 1) return split(32, forced);
  if (16 * g64 >= 15 * full) return {64};
  if (g32 >= units) return split(64, full / g64);
  const bool rows64 = 8 * groups(m, 64) * 64 <= 9 * groups(m, 32) * 32;  // 64-row tiles waste few rows
  if (rows64 && 16 * g64 * std::min<int64_t>(16, blocks) >= 15 * full)
    return split(64, (full + g64 - 1) / g64);
  return split(32, std::min<int64_t>(16, (full + g32 - 1) / g32));
}

class OpenclBackend final : public Backend, public DecodeFusions, public PassGraphs {
 public:
  OpenclBackend(int index, DeltaRuleForm gdn_form)
      : index_(index), info_(device_info(index)), gdn_form_(gdn_form) {
    cl_device_svm_capabilities svm = 0;
    if (api().clGetDeviceInfo(info_.device, CL_DEVICE_SVM_CAPABILITIES, sizeof svm, &svm, nullptr) !=
            CL_SUCCESS ||
        !(svm & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER))
      fail(
          "opencl:{} ({}, {}) has no coarse-grained shared virtual memory (OpenCL 2.0 SVM), which the whole "
          "model "
          "on an OpenCL device needs; it can still run a MoE model's experts: --expert-device opencl:{}",
          index, info_.name, info_.device_version, index);
    cl_int err = CL_SUCCESS;
    const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)info_.platform, 0};
    ctx_ = Context(api().clCreateContext(props, 1, &info_.device, nullptr, nullptr, &err));
    if (err != CL_SUCCESS) throw_cl_error(err, "clCreateContext", __FILE__, __LINE__);
    const Switches sw = read_switches();
    host_weights_ = sw.host_weights && info_.reads_host_pointers();
    profile_ = sw.profile;
    stats_on_ = sw.stats;
    const cl_queue_properties qprops[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    queue_ = Queue(
        api().clCreateCommandQueueWithProperties(ctx_.get(), info_.device, profile_ ? qprops : nullptr, &err));
    if (err != CL_SUCCESS) throw_cl_error(err, "clCreateCommandQueueWithProperties", __FILE__, __LINE__);
    // Decode steps recorded as command buffers where offered (not while profiling: events time each kernel).
    if (sw.graphs && !profile_) {
      std::string why;
      cmdbuf_ = CommandBufferApi::load(info_, 0, &why);
      if (!cmdbuf_) log::debug("{}: decode steps enqueued kernel by kernel: {}", name(), why);
    }
    mv_wg_ = info_.matvec_width();
    // Switches for measuring kernel variants side by side (XPERT_OPENCL_OPTS, switches.h).
    if (sw.mv_wg) mv_wg_ = sw.mv_wg;
    // Matrix rows per work-group of the fused matvecs (MV_R): a GPU keeps 4 rows of 32 in a group.
    mv_r_ = sw.mv_r ? sw.mv_r : info_.is_cpu() ? 1 : 4;
    while (mv_r_ > 1 && (size_t)(mv_wg_ * mv_r_) > info_.max_work_group_size) mv_r_ /= 2;
    if (sw.subgroups) mv_sg_ = info_.matvec_sub_group(mv_wg_);
    wide_loads_ = sw.wide;
    // NVIDIA's OpenCL: the matmul programs capped at kNvRegs registers a work-item unless nv_regs says.
    if (sw.nv_regs > 0 && !info_.nv_compiler_options)
      fail("XPERT_OPENCL_OPTS: nv_regs={}: {} lacks cl_nv_compiler_options (NVIDIA's OpenCL only)",
           sw.nv_regs, info_.name);
    max_registers_ = sw.nv_regs >= 0 ? sw.nv_regs : info_.nv_compiler_options ? kNvRegs : 0;
    tile_bufs_ = tile_bufs_for(info_.local_mem_bytes, sw.pt_bufs);
    dense_bufs_ = tile_bufs_for(info_.local_mem_bytes, sw.pt_bufs, kTwoDenseBufsBytes);
    if (!tile_bufs_ || !dense_bufs_)
      fail(
          "XPERT_OPENCL_OPTS: pt_bufs=2: {} has {} KiB of local memory a work-group, two buffers of the "
          "prefill tiles need {} KiB",
          info_.name, info_.local_mem_bytes / 1024, kTwoDenseBufsBytes / 1024);
    arg_cache_ = sw.arg_cache;
    max_arg_sets_ = sw.arg_sets;
    tails_ = sw.tail;
    dummy_ = alloc(256);  // bound to optional pointer arguments that are absent
    counters_ = static_cast<cl_int*>(alloc(kCounters * sizeof(cl_int)));  // last_group's, kernels_fused.h
    zero(counters_, kCounters * sizeof(cl_int));
    fused_ = sw.fused;
    prefill_ = sw.prefill;
    moe_bm_ = sw.moe_bm;
    ksplit_ = sw.ksplit;
    if (sw.probe) probe_launches();
  }

  ~OpenclBackend() override {
    recording_.reset();  // a pass that never ended (its recorded kernels never run)
    if (profile_ && queue_) {
      api().clFinish(queue_.get());
      harvest_profile();
    }
    log_stats();
    drop_scratch();
    if (queue_) api().clFinish(queue_.get());
    graphs_.clear();
    for (auto& [bytes, p] : pool_) api().clSVMFree(ctx_.get(), p);  // the queue is idle: no XP_CL here
    if (dummy_) api().clSVMFree(ctx_.get(), dummy_);
    if (counters_) api().clSVMFree(ctx_.get(), counters_);
    if (preq_) api().clSVMFree(ctx_.get(), preq_);
    arg_sets_.clear();
    programs_.clear();
  }

  std::string name() const override { return fmt::format("opencl:{} ({})", index_, info_.name); }
  DeviceKind kind() const override { return DeviceKind::opencl; }
  bool reads_host_weights() const override { return host_weights_; }

  // opencl_backend.cpp: SVM, freed blocks of up to kPoolMaxBlock kept for reuse (up to pool_cap()).
  void* alloc(size_t bytes) override;
  void dealloc(void* p) override;
  void zero(void* p, size_t bytes) override {
    if (!bytes) return;
    pre_ = {};
    const cl_uchar z = 0;
    ++stats_.enqueues;
    XP_CL(clEnqueueSVMMemFill, q(), p, &z, 1, bytes, 0, nullptr, nullptr);
  }
  // Blocking: the source may be a temporary of the caller.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) stats_.blocking++, stats_.enqueues++, pre_ = {};
    if (bytes) XP_CL(clEnqueueSVMMemcpy, q(), CL_TRUE, dst, src, bytes, 0, nullptr, nullptr);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    XP_CL(clEnqueueSVMMemcpy, q(), CL_TRUE, dst, src, bytes, 0, nullptr, nullptr);
    stats_.read_to_host();
    if (profile_) harvest_profile();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) ++stats_.enqueues, pre_ = {};
    if (bytes && dst != src) XP_CL(clEnqueueSVMMemcpy, q(), CL_FALSE, dst, src, bytes, 0, nullptr, nullptr);
  }
  void synchronize() override {
    ++stats_.blocking;
    XP_CL(clFinish, q());
  }
  size_t free_memory() const override {
    const size_t used = allocated_ - pooled_bytes_;  // the pool is given back when an allocation needs it
    return info_.global_mem_bytes > used ? info_.global_mem_bytes - used : 0;
  }

  void matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) override {
    const int64_t k = w.ne[0], n = w.ne[1];
    if (m <= 0 || n <= 0) return;
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    x = rounded_activations(w.type, x, m, k);
    if (m == 1 && fused_)  // one row: the single-row kernel (gemv's row loop costs registers)
      gemv_rows(w.type, w.data, n, k, x, m, y, ldy ? ldy : n);
    else if (m <= kGemvMaxRows)
      gemv(w.type, w.data, n, k, x, k, m, y, ldy ? ldy : n, nullptr, 0, 0);
    else
      gemm(w.type, w.data, n, k, x, k, m, y, ldy ? ldy : n);
    ar.release(mark);
  }

  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override {
    if (rows <= 0) return;
    launch(ops("rmsnorm"), {(size_t)rows * kRedWg}, {kRedWg}, x, w, (cl_int)(w != nullptr), y, (cl_int)n,
           eps);
  }
  void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
            float freq_base, float freq_scale, RopeMode mode) override {
    if (n_tokens <= 0 || n_rot < 2) return;
    if (n_rot > head_dim || n_rot % 2)
      fail("{}: rope over {} of {} dims is not supported", name(), n_rot, head_dim);
    const float theta_scale = std::pow(freq_base, -2.0f / (float)n_rot);  // as the CPU computes it
    launch(ops("rope"), {(size_t)n_rot / 2, (size_t)n_tokens}, {}, x, pos, (cl_int)n_heads, (cl_int)head_dim,
           (cl_int)n_rot, theta_scale, freq_scale, (cl_int)(mode == RopeMode::neox));
  }
  void swiglu(const float* gate, const float* up, float* y, int64_t n) override {
    elementwise("swiglu", n, gate, up, y, (cl_long)n);
  }
  void geglu(const float* gate, const float* up, float* y, int64_t n) override {
    elementwise("geglu", n, gate, up, y, (cl_long)n);
  }
  void add(const float* a, const float* b, float* y, int64_t n) override {
    elementwise("add", n, a, b, y, (cl_long)n);
  }
  void scale(float* x, float s, int64_t n) override { elementwise("scale", n, x, s, (cl_long)n); }
  void add_bias(float* x, const float* bias, int64_t rows, int64_t n) override {
    elementwise("add_bias", rows * n, x, bias, (cl_int)n, (cl_long)(rows * n));
  }
  void mul_sigmoid(float* x, const float* gate, int64_t n) override {
    elementwise("mul_sigmoid", n, x, gate, (cl_long)n);
  }
  void add_sigmoid_scaled(float* y, const float* s, const float* g, int64_t rows, int64_t n) override {
    elementwise("add_sigmoid_scaled", rows * n, y, s, g, (cl_int)n, (cl_long)(rows * n));
  }
  void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) override {
    elementwise("deinterleave", rows * width, src, (cl_int)width, a, b, (cl_long)(rows * width));
  }
  void gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) override {
    if (rows.empty()) return;
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    int64_t* idx = ar.take<int64_t>((int64_t)rows.size());
    copy_from_host(idx, rows.data(), rows.size_bytes());
    const int64_t total = (int64_t)rows.size() * width;
    float* dst = x == y ? ar.take<float>(total) : y;  // in place would race: through a temporary
    elementwise("gather_rows", total, x, idx, (cl_int)width, dst, (cl_long)total);
    if (dst != y) copy(y, dst, total * sizeof(float));
    ar.release(mark);
  }
  void store_kv(const float* x, void* dst, int64_t n, DType type) override {
    check_kv_type(type);
    not_recordable();  // dst is the step's position
    elementwise("store_f16", n, x, dst, (cl_long)n);
  }

  void attention(const AttentionArgs& a) override {
    if (a.n_tokens <= 0) return;
    not_recordable();  // n_kv is the step's
    check_kv_type(a.k_type);
    check_kv_type(a.v_type);
    if (a.head_dim > kAttMaxD)
      fail("{}: attention with head_dim {} > {} is not supported", name(), a.head_dim, kAttMaxD);
    if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv)
      fail("{}: {} query heads do not share {} KV heads evenly", name(), a.n_head, a.n_head_kv);
    // Prefill: kAttQb tokens a work-group, each K / V row read once for them (heads of 128: 16 KiB of local
    // memory, 32 with the kept scores of att_block_keep; heads of 512: 28 and 44).
    if (a.n_tokens > 1 && prefill_ && info_.local_mem_bytes >= 32 * 1024) {
      launch(attention_kernel("attention_block", a.head_dim, a.k, a.v),
             {(size_t)a.n_head * kAttWg, groups(a.n_tokens, kAttQb)}, {kAttWg, 1}, a.q, a.k, a.v, a.out,
             a.pos, (cl_int)a.n_tokens, (cl_int)a.n_head, (cl_int)a.n_head_kv, (cl_int)a.head_dim,
             (cl_int)a.n_kv, a.kq_scale, (cl_int)a.sliding_window);
      return;
    }
    launch(attention_kernel("attention", a.head_dim, a.k, a.v),
           {(size_t)a.n_head * kAttWg, (size_t)a.n_tokens}, {kAttWg, 1}, a.q, a.k, a.v, a.out, a.pos,
           (cl_int)a.n_head, (cl_int)a.n_head_kv, (cl_int)a.head_dim, (cl_int)a.n_kv, a.kq_scale,
           (cl_int)a.sliding_window, nullptr, (cl_int)0, (cl_long)0, (cl_int)a.head_dim, nullptr, (cl_int)0,
           (cl_int)0, (cl_int)-1, nullptr, nullptr, (cl_int)0, nullptr, nullptr, nullptr, (cl_int)0, nullptr,
           (cl_int)0, (cl_int)0, 1.0f, 1.0f, (cl_int)0, 0.0f);
  }

  void moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out) override;
  void moe_small_batch(const MoeFfn& m, const float* x, int64_t n, const float* logits_d, float* out);
  // n tokens' top-k routed on the device (moe_route_slots) into scratch the caller releases.
  struct DeviceRouting {
    int32_t *row_slot, *slot_row, *tasks;
    float* weights;
  };
  DeviceRouting route_on_device(const MoeFfn& m, int64_t n, const float* logits_d);
  // Whether a prefill-sized batch of a layer runs wholly on the device: routed, grouped and multiplied there
  // (moe_prefill, prefill.cpp).
  bool moe_prefill_fits(const MoeFfn& m, int64_t n) const;

  // Fused forms (fused_ops.cpp); XPERT_OPENCL_OPTS=fused=0 turns them off (the plain ops, for comparison).
  void matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs) override;
  void prefill_matmuls(const float* x, int64_t m, int64_t k, std::span<const MatmulJob> jobs);
  Act moe_ffn_add_norm(const MoeFfn& m, const float* d, float* x, const float* w, float* cur, int64_t n,
                       const float* next_w, const PartialSum* d_parts);
  Act add_rmsnorm(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override;
  void qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm, const int32_t* pos,
                    int64_t n_tokens, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_rot,
                    float freq_base, float freq_scale, RopeMode mode, float eps) override;
  void qk_norm_rope_store_kv(float* q, float* k, const float* v, const QkPrep& p, int64_t n_tokens,
                             int64_t n_head, int64_t n_head_kv, int64_t head_dim, void* kc, DType k_type,
                             void* vc, DType v_type) override;
  Act add_rmsnorm_moe_ffn_add(const MoeFfn& m, const float* d, float* x, const float* w, float* cur, int64_t n,
                              const float* next_w, const PartialSum* d_parts) override;
  uint64_t enqueue_count() const { return stats_.enqueues; }  // commands so far (tests count a path's)
  DecodeFusions* decode_fusions() override { return fused_ ? this : nullptr; }
  // pass_graphs.cpp: decode steps recorded as command buffers (cl_khr_command_buffer), where offered.
  PassGraphs* pass_graphs() override { return cmdbuf_ ? this : nullptr; }
  bool begin_graph(const std::string& key) override;
  void end_graph() override;
  void abort_graph() override;
  uint64_t graph_replays() const { return stats_.replays; }  // decode steps run from a recording (tests)
  std::optional<Act> decode_attention(const DecodeAttention& d) override;
  std::optional<PartialSum> decode_attention_proj(const DecodeAttention&, const Weight&, float*) override {
    return std::nullopt;  // so no parts to sum either
  }
  void sum_parts(const PartialSum& p) override;
  // Form 1 (a step whose deepest sequence has kAttSplitKeys keys or more): the keys split into chunks
  // (attention_split, kernels_attention_split.h); form 0: attention, a group per query head.
  int decode_attention_form(int32_t max_pos) const override { return max_pos + 1 >= kAttSplitKeys ? 1 : 0; }
  // The chunks of form 1's grid for d (0: form 1 does not apply); *mode: out rounded for the projection as
  // head_round_mode says, -1 where a group's heads do not hold whole blocks.
  int64_t att_split_chunks(const DecodeAttention& d, int* mode) const;
  // Form 1's groups of up to kAttQb query heads a KV head.
  static int64_t att_head_groups(const DecodeAttention& d) {
    return (d.n_head / d.n_head_kv + kAttQb - 1) / kAttQb;
  }
  bool fuses_attention_gate() const override { return true; }
  void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                       float* conv_state, float* ssm_state, float* out) override;
  // gated_delta_net's two forms (opencl_backend.cpp).
  void gdn_recurrent(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                     float* ssm_state, float* out);
  void gdn_chunked(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                   float* ssm_state, float* out, int64_t prep_wg, int64_t r, int64_t cb);

  // prefill_xmx.cpp: whether t's prefill GEMMs run on the XMX kernels: the device offers
  // cl_intel_subgroup_matrix_multiply_accumulate, and at t's first use its program built and xmx_self_check
  // passed (otherwise a warning, once, and the f32 kernels).
  bool use_xmx(DType t);
  // The XMX and the f32 kernels (gemm_t, moe_gate_up_t, moe_down_t, both row tiles) on a random problem of
  // real shape, compared; false, with a warning saying why, when they differ or the XMX program fails.
  bool xmx_self_check(DType t);
  int xmx_sub_group() const;  // 8 or 16 (the matrix engine's width), 0: neither offered
  const DeviceInfo& facts() const { return info_; }  // what discovery found (tests)
  // How its matmul programs are built (MV_WG, MV_R, subgroups; tests).
  MatmulBuild matmul_build() const {
    return {.mv_wg = mv_wg_,
            .mv_r = mv_r_,
            .wide_loads = wide_loads_,
            .correctly_rounded_divide = info_.correctly_rounded_divide,
            .sub_group = mv_sg_,
            .max_registers = max_registers_,
            .tile_bufs = tile_bufs_,
            .dense_bufs = dense_bufs_};
  }
  // Tests: the XMX kernels on a device without the extension (PoCL), over an emulation of its builtins in
  // OpenCL C (prelude, put before the program's source; options added to its build options) at subgroups of
  // sub_group; forgets earlier XMX programs and self-checks.
  struct XmxEmulation {
    std::string prelude, options;
    int sub_group = 0;
  };
  void emulate_xmx(XmxEmulation e) {
    xmx_emulation_ = std::move(e);
    for (auto& [t, prog] : xmx_) std::erase(programs_, prog.get());
    xmx_.clear();
    xmx_ok_.clear();
  }

 private:
  // One program and its kernels, made on first use.
  struct Prog {
    Program program;
    std::map<std::string, Kernel> kernels;
    cl_kernel kernel(const std::string& n) {
      auto it = kernels.find(n);
      if (it != kernels.end()) return it->second.get();
      cl_int err = CL_SUCCESS;
      Kernel k(api().clCreateKernel(program.get(), n.c_str(), &err));
      if (err != CL_SUCCESS) throw_cl_error(err, "clCreateKernel", __FILE__, __LINE__);
      return kernels.emplace(n, std::move(k)).first->second.get();
    }
  };
  // The program in slot, built from text() (program_texts.cpp) on first use.
  template <typename Text>
  Prog& program(std::unique_ptr<Prog>& slot, Text&& text) {
    if (!slot) {
      auto p = std::make_unique<Prog>();
      const ProgramText t = text();
      p->program = build_program(ctx_.get(), info_, t.source, t.options);
      slot = std::move(p);
      programs_.push_back(slot.get());
    }
    return *slot;
  }
  cl_kernel ops(const char* kernel) {
    return program(ops_, [&] { return ops_program_text(info_.correctly_rounded_divide); }).kernel(kernel);
  }
  // The attention program built for heads of head_dim (att_block_dims sizes attention_block for them; the
  // decode kernel does not depend on it) and for caches k / v of slots slot_halves apart: read in words where
  // att_wide_loads allows and the switch wide is on. One program for each form a model uses.
  cl_kernel attention_kernel(const char* kernel, int64_t head_dim, const void* k, const void* v,
                             int64_t slot_halves = 0) {
    const int dims = att_block_dims(head_dim), slot = dims == 128 ? 0 : dims == 256 ? 1 : 2;
    const bool wide = wide_loads_ && att_wide_loads(k, v, head_dim, slot_halves);
    return program(attention_[slot][wide],
                   [&] {
                     return attention_program_text(info_.correctly_rounded_divide,
                                                   att_block_keep(info_.local_mem_bytes), dims, wide);
                   })
        .kernel(kernel);
  }
  cl_kernel gdn(const char* kernel) {
    return program(gdn_, [&] { return gdn_program_text(info_.correctly_rounded_divide); }).kernel(kernel);
  }
  // The largest work-group kernel k runs with on this device (its registers may allow fewer than the
  // device's maximum), at most cap.
  int64_t kernel_max_group(cl_kernel k, int64_t cap) const {
    size_t n = 0;
    XP_CL(clGetKernelWorkGroupInfo, k, info_.device, CL_KERNEL_WORK_GROUP_SIZE, sizeof n, &n, nullptr);
    return std::min<int64_t>({(int64_t)n, (int64_t)info_.max_work_group_size, cap});
  }
  Prog& matmul_program(DType t) {
    const char* macro = weight_macro(t);
    if (!macro)
      fail("{}: no matmul kernel for {} weights (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)", name(),
           dtype_name(t));
    return program(matmul_[t], [&] { return matmul_program_text(t, matmul_build()); });
  }
  std::string matmul_options(DType t) const { return opencl::matmul_options(t, matmul_build()); }
  // x (m rows of k) rounded as the CPU rounds activations for weights of type t (kernels_ops.h
  // round_activations), in scratch memory the caller releases; x itself for f32 weights.
  const float* rounded_activations(DType t, const float* x, int64_t m, int64_t k) {
    int64_t unit = 1;
    const int mode = round_mode(t, &unit);
    if (mode < 0) return x;
    check_row(t, k);
    if (pre_.x == x && pre_.rows == m && pre_.k == k && pre_.mode == mode) return pre_.q;
    float* xq = scratch().take<float>(m * k);
    if (mode <= 1) {  // a block per team of kRoundTeam work-items
      const int64_t blocks = m * (k / unit);
      launch(ops("round_blocks"), {groups(blocks, kRedWg / kRoundTeam) * kRedWg}, {kRedWg}, x,
             (cl_long)blocks, xq, (cl_int)mode);
    } else {
      launch(ops("round_activations"), {(size_t)k, (size_t)m}, {}, x, (cl_int)k, xq, (cl_int)mode);
    }
    return xq;
  }
  // How a decode kernel writing rows of n_head heads of head_dim rounds them for the projection of type t
  // that reads them next, in the same launch (round_mode; kernels_ops.h round_head_blocks): -1 where it
  // does not (no type given, tails off, or a rounding block and a head that do not divide one another).
  int head_round_mode(DType t, int64_t rows, int64_t n_head, int64_t head_dim) {
    int64_t unit = 1;
    if (!fused_ || !tails_ || t == DType::F32 || !weight_macro(t) || (n_head * head_dim) % block_elems(t))
      return -1;
    const int mode = round_mode(t, &unit);
    if (mode != 0 && mode != 1) return mode;
    const int64_t hpu = head_dim >= unit ? 1 : unit / head_dim;
    return (head_dim % unit && unit % head_dim) || n_head % hpu || rows * (n_head / hpu) > kCounters ? -1
                                                                                                     : mode;
  }
  void check_kv_type(DType t) {
    if (t != DType::F16)
      fail("{}: a {} KV cache is not supported on OpenCL devices yet (use an f16 KV cache)", name(),
           dtype_name(t));
  }
  void check_row(DType t, int64_t k) {
    if (k % block_elems(t)) fail("{}: a {} row of {} values is not whole blocks", name(), dtype_name(t), k);
  }

  // Kernel arguments: pointers are SVM pointers (null: the dummy), numbers go by value.
  void set_arg(cl_kernel k, cl_uint i, const void* p) {
    XP_CL(clSetKernelArgSVMPointer, k, i, p ? p : dummy_);
  }
  template <typename T>
  requires std::is_arithmetic_v<T>
  void set_arg(cl_kernel k, cl_uint i, T v) { XP_CL(clSetKernelArg, k, i, sizeof(T), &v); }
  void set_arg(cl_kernel k, cl_uint i, LocalBytes b) { XP_CL(clSetKernelArg, k, i, b.n, nullptr); }
  // The bytes a kernel argument is set from (an absent pointer: the dummy's address).
  void key_arg(std::string& key, const void* p) {
    p = p ? p : dummy_;
    key.append(reinterpret_cast<const char*>(&p), sizeof p);
  }
  template <typename T>
  requires std::is_arithmetic_v<T>
  void key_arg(std::string& key, T v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void key_arg(std::string& key, LocalBytes b) { key_arg(key, b.n); }
  // A kernel object of k's function whose arguments already hold these values, so a decode step that repeats
  // the last one's launches sets no argument (XPERT_OPENCL_OPTS arg_cache=0: off). Made when an argument set comes
  // a second time (making one costs ~80 ms on PoCL: a prefill of a new length would pay it at every launch);
  // null the first time (the caller then sets k's arguments). k's objects are dropped when they reach
  // max_arg_sets_ (a decode step's few hundred come back at once; XPERT_OPENCL_OPTS arg_sets, default 1024).
  struct ArgSets {
    std::unordered_map<std::string, Kernel> made;
    std::unordered_set<std::string> seen;  // once, not yet made
  };
  template <typename... A>
  cl_kernel with_args(cl_kernel k, const A&... args) {
    thread_local std::string key;
    key.clear();
    (key_arg(key, args), ...);
    ArgSets& sets = arg_sets_[k];
    if (auto it = sets.made.find(key); it != sets.made.end()) return it->second.get();
    if (sets.seen.size() >= max_arg_sets_) sets.seen.clear();
    if (sets.seen.insert(key).second) return nullptr;  // the first time
    sets.seen.erase(key);
    if (sets.made.size() >= max_arg_sets_) {
      if (profile_) {  // the pending events name these objects
        synchronize();
        harvest_profile();
      }
      for (auto& [unused, inst] : sets.made) labels_.erase(inst.get());
      sets.made.clear();  // enqueued commands keep what they use (OpenCL retains it)
    }
    Kernel inst = clone_kernel(k);
    cl_uint i = 0;
    (set_arg(inst.get(), i++, args), ...);
    return sets.made.emplace(key, std::move(inst)).first->second.get();
  }
  Kernel clone_kernel(cl_kernel k);  // diagnostics.cpp
  template <typename... A>
  void launch(cl_kernel k, std::initializer_list<size_t> global, std::initializer_list<size_t> local,
              const A&... args) {
    const auto t0 = stats_on_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    cl_kernel inst = arg_cache_ ? with_args(k, args...) : nullptr;
    if (inst) {
      k = inst;
    } else {
      cl_uint i = 0;
      (set_arg(k, i++, args), ...);
    }
    size_t g[3] = {1, 1, 1}, l[3] = {1, 1, 1};
    std::copy(global.begin(), global.end(), g);
    std::copy(local.begin(), local.end(), l);
    pre_ = {};  // any launch may write the rounded row's source
    if (!recording_ || !record(k, (cl_uint)global.size(), g, local.size() ? l : nullptr)) {
      ++stats_.enqueues;
      cl_event ev = nullptr;
      XP_CL(clEnqueueNDRangeKernel, q(), k, (cl_uint)global.size(), nullptr, g, local.size() ? l : nullptr, 0,
            nullptr, profile_ ? &ev : nullptr);
      if (ev) pending_.emplace_back(k, ev);
    }
    if (stats_on_)
      stats_.launch_us +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  template <typename... A>
  void elementwise(const char* kernel, int64_t n, const A&... args) {
    if (n > 0) launch(ops(kernel), {(size_t)n}, {}, args...);
  }
  bool qk_norm_rope_launch(float* q, float* k, const float* v, const QkPrep& p, int64_t n_tokens,
                           int64_t n_head, int64_t n_head_kv, int64_t head_dim, void* kc, void* vc);

  // y[r] (row stride ldy) = x[r] (stride ldx) . w^T for m rows. With tasks (int2: row, expert; m of them),
  // row `row` multiplies expert `expert` (weights at w + expert * expert_stride) instead.
  void gemv(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx, int64_t m, float* y,
            int64_t ldy, const int32_t* tasks, int64_t n_tasks, size_t expert_stride) {
    check_row(t, k);
    cl_kernel kr = matmul_program(t).kernel("gemv");
    const int64_t row_groups = tasks ? n_tasks : (int64_t)groups(m, kMvRows);
    if (row_groups == 0) return;
    launch(kr, {(size_t)n * mv_wg_, (size_t)row_groups}, {(size_t)mv_wg_, 1}, w, (cl_ulong)row_bytes(t, k),
           (cl_ulong)expert_stride, tasks, (cl_int)(tasks != nullptr), x, (cl_int)ldx, (cl_int)k, (cl_int)n,
           y, (cl_int)ldy, (cl_int)m);
  }
  // The GPU-width Q4_K and Q6_K matvecs (kernels_fused.h, MV_TEAMS) read 4 activations in one load, a Q4_K
  // block's first 16 bytes in one and a Q6_K block's quants 2 bytes at a time: activations 16-byte aligned,
  // Q4_K weights too and Q6_K weights 2-byte, as allocations are (a view must keep it).
  void check_mv_aligned(DType t, const void* w, const void* x) const {
    if (mv_wg_ != 32 || !wide_loads_ || (t != DType::Q4_K && t != DType::Q6_K)) return;
    const auto at = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
    if (!at(x, 16) || !at(w, t == DType::Q4_K ? 16 : 2))
      fail("{}: a {} matvec on misaligned data (weights at {}, activations at {})", name(), dtype_name(t), w,
           x);
  }
  // y[r] = x[r] . w^T for m rows (x: m rows of k), one work-group per (feature, row): gemv_multi with one matrix.
  void gemv_rows(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t m, float* y, int64_t ldy) {
    check_row(t, k);
    check_mv_aligned(t, w, x);
    launch(matmul_program(t).kernel("gemv_multi"), {groups(n, mv_r_) * mv_wg_, (size_t)(m * mv_r_)},
           {(size_t)mv_wg_, (size_t)mv_r_}, w, w, w, w, (cl_ulong)row_bytes(t, k), (cl_int)n, (cl_int)0,
           (cl_int)0, y, y, y, y, (cl_int)ldy, (cl_int)ldy, (cl_int)ldy, (cl_int)ldy, x, (cl_int)k, (cl_int)k,
           (cl_int)n);
  }
  // prefill.cpp: 128 features x 64 or 32 rows per work-group, register-tiled (kernels_prefill.h); a product
  // of too few tiles for the device split along k (gemm_split, dense_plan).
  void gemm_tiled(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx, int64_t m,
                  float* y, int64_t ldy);
  // w2 / y2: a second product of the same shape on the same rows in the same launch (null: none).
  void gemm_split(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx, int64_t m,
                  float* y, int64_t ldy, DensePlan plan, const void* w2 = nullptr, float* y2 = nullptr);
  // Two products of the same type and shape on the same rows (a layer's k and v) as one split launch, where
  // gemm would split each (false: not taken, nothing launched).
  bool gemm_pair(DType t, const void* w, const void* w2, int64_t n, int64_t k, const float* x, int64_t m,
                 float* y, float* y2, int64_t ldy);
  // The tiled product of m rows: gemm_tiled, or (XPERT_OPENCL_OPTS prefill=0, a device with less than 24 KiB
  // of local memory or 256 work-items a group) gemm_small, the earlier 64 x 32 tile (gemm_tiled takes it too
  // for products of too few tiles to fill the device that it does not split).
  void gemm(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx, int64_t m, float* y,
            int64_t ldy) {
    if (prefill_tiles()) return gemm_tiled(t, w, n, k, x, ldx, m, y, ldy);
    gemm_small(t, w, n, k, x, ldx, m, y, ldy);
  }
  // The prefill tiles are on and this device runs them: 24 KiB of local memory and 256 work-items a group.
  bool prefill_tiles() const {
    return prefill_ && info_.local_mem_bytes >= 24 * 1024 && info_.max_work_group_size >= 256;
  }
  Prog& xmx_program(DType t) {
    if (!xmx_[t]) {
      return program(xmx_[t], [&] {
        ProgramText p = xmx_program_text(matmul_options(t), xmx_sub_group());
        // The emulation's prelude (tests) right after kClCommonSource, which xmx_program_text puts first.
        p.source.insert(kClCommonSource.size(), xmx_emulation_.prelude);
        if (!xmx_emulation_.options.empty()) p.options += " " + xmx_emulation_.options;
        return p;
      });
    }
    return *xmx_[t];
  }
  std::map<DType, std::unique_ptr<Prog>> xmx_;
  std::map<DType, bool> xmx_ok_;
  XmxEmulation xmx_emulation_;
  void gemm_small(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx, int64_t m,
                  float* y, int64_t ldy) {
    check_row(t, k);
    launch(matmul_program(t).kernel("gemm"), {groups(n, kTileN) * 16, groups(m, kTileM) * 16}, {16, 16}, w,
           (cl_ulong)row_bytes(t, k), x, (cl_int)ldx, (cl_int)k, (cl_int)n, y, (cl_int)ldy, (cl_int)m);
  }

  // The queue, for any command but a recorded launch: a recording open then ends (stop_recording).
  cl_command_queue q() {
    not_recordable();
    return queue_.get();
  }
  // pass_graphs.cpp. A recorded step: its command buffer and the scratch offset its pass ended at (a replay
  // must end there too: the caller reads the outputs at the recorded addresses). spent: a recording run once
  // and not kept (kept alive until the graphs are cleared, after the queue drained).
  struct StepGraph {
    std::unique_ptr<CommandBuffer> buf, spent;
    size_t end_mark = 0;
    bool never = false;  // its pass issued a command that cannot be recorded: always op by op
  };
  static constexpr size_t kMaxGraphs = 64;
  // The launch into the open recording; false (recording ended, command buffers off) where the driver fails.
  bool record(cl_kernel k, cl_uint dims, const size_t* global, const size_t* local);
  std::unique_ptr<CommandBuffer> run_recording();  // ends the recording and runs it; null when it is empty
  void stop_recording();
  void not_recordable() {
    if (recording_) stop_recording();
  }
  void clear_graphs();
  std::optional<CommandBufferApi> cmdbuf_;
  std::map<std::string, StepGraph> graphs_;
  std::unique_ptr<CommandBuffer> recording_;
  std::string rec_key_;
  StepGraph* replay_ = nullptr;
  // Memory was freed: a recording may point at it (the pool hands it out again); every graph is dropped at
  // the next begin_graph.
  bool graphs_stale_ = false;
  // The activation rounding mode of kernels_ops.h's round_unit for weights of type t (-1: none), and the
  // unit it rounds by.
  static int round_mode(DType t, int64_t* unit = nullptr);
  // add_rmsnorm_round (kernels_fused.h) over rows of n: the register-resident form where the row fits.
  void add_rmsnorm_round(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
                         float* yq, int mode);
  void probe_launches();  // XPERT_OPENCL_OPTS probe: what an enqueue costs here, logged
  void probe_grid_sync();  // (part of probe) what a barrier across one launch's groups costs
  void probe_floors();     // (part of probe) what a dependent load, fence, barrier or atomic costs in a group
  void probe_code();       // (part of probe) what fetching a kernel's code costs a launch
  void log_stats();       // XPERT_OPENCL_OPTS stats: enqueues and blocking calls per step, logged at the end
  // XPERT_OPENCL_OPTS profile: every launch's device time, summed per kernel (and weight type) at each read to
  // the host, logged at the end.
  void harvest_profile();
  std::string kernel_label(cl_kernel k);
  bool profile_ = false;
  bool stats_on_ = false;  // XPERT_OPENCL_OPTS stats: log_stats prints the enqueue counts
  std::vector<std::pair<cl_kernel, cl_event>> pending_;
  std::map<cl_kernel, std::string> labels_;
  std::map<std::string, std::pair<uint64_t, double>> profile_ns_;  // label -> (launches, device ns)
  struct Idle {  // harvest_profile's gaps between kernels (device ns)
    double gap_ns = 0, late_ns = 0, across_reads_ns = 0, submit_lag_ns = 0;
    uint64_t gaps = 0, kernels = 0;
    cl_ulong last_end = 0;
  } idle_;

  // Commands issued (XPERT_OPENCL_OPTS stats): all of them, and those between the last two reads to the host
  // (a decode step's, from logits read to logits read). With it on, the host time spent in launch() too, and
  // the wall time from read to read.
  struct Stats {
    uint64_t enqueues = 0, blocking = 0, reads = 0, replays = 0;
    uint64_t at_read_enqueues = 0, at_read_blocking = 0, step_enqueues = 0, step_blocking = 0;
    double launch_us = 0, at_read_launch_us = 0, step_launch_us = 0, step_wall_us = 0;
    std::chrono::steady_clock::time_point last_read{};
    void read_to_host() {
      ++enqueues, ++blocking, ++reads;
      step_enqueues = enqueues - at_read_enqueues, step_blocking = blocking - at_read_blocking;
      at_read_enqueues = enqueues, at_read_blocking = blocking;
      step_launch_us = launch_us - at_read_launch_us, at_read_launch_us = launch_us;
      const auto now = std::chrono::steady_clock::now();
      step_wall_us = std::chrono::duration<double, std::micro>(now - last_read).count();
      last_read = now;
    }
  } stats_;
  bool fused_ = true;
  bool host_weights_ = false;  // reads_host_weights (XPERT_OPENCL_OPTS host_weights=0: off)
  bool prefill_ = true;  // XPERT_OPENCL_OPTS prefill=0: the earlier gemm and the host's MoE routing
  int moe_bm_ = 32;      // XPERT_OPENCL_OPTS moe_bm: rows per grouped tile of moe_prefill (32 or 64)
  int ksplit_ = 0;       // XPERT_OPENCL_OPTS ksplit: slices of k for gemm_tiled's narrow products (0: auto)
  bool wide_loads_ = true;
  bool arg_cache_ = true;
  // The MoE kernels' last work-groups round the gate/up rows and write the next norm (XPERT_OPENCL_OPTS tail=0:
  // two launches more per layer); each kernel resets the counters it used, so one array serves them all.
  bool tails_ = true;
  static constexpr int64_t kCounters = 4096;
  static constexpr int64_t kRouteMax = 4096;  // ROUTE_MAX, kernels_ops.h
  static constexpr int64_t kMoeMaxUsed = 16;  // MOE_MAX_USED, kernels_fused.h
  static constexpr int64_t kGroupMaxExperts = 1024;  // GROUP_MAX_EXPERTS, kernels_prefill.h
  cl_int* counters_ = nullptr;
  std::map<cl_kernel, ArgSets> arg_sets_;
  size_t max_arg_sets_ = 1024;

  int index_;
  DeviceInfo info_;
  Context ctx_;
  Queue queue_;
  DeltaRuleForm gdn_form_;
  int mv_wg_ = 32;
  int mv_r_ = 4;   // MV_R, kernels_fused.h
  int mv_sg_ = 0;  // MV_SG, kernels_matmul.h
  int max_registers_ = 0;  // the matmul programs' -cl-nv-maxrregcount (kNvRegs, XPERT_OPENCL_OPTS nv_regs)
  int tile_bufs_ = 1;      // the MoE prefill tiles' buffers (tile_bufs_for, XPERT_OPENCL_OPTS pt_bufs)
  int dense_bufs_ = 1;     // the dense prefill tiles' (the same, kTwoDenseBufsBytes)
  // A row set already rounded for a matmul (the MoE layer's last kernel rounds the next layer's input): x's
  // m rows of k rounded in mode `mode` are at q, until the next command (any launch or copy forgets it).
  struct Prerounded {
    const float* x = nullptr;
    float* q = nullptr;
    int64_t rows = 0, k = 0;
    int mode = -1;
  } pre_;
  DType preround_type_ = DType::F32;  // the weights of the last matmuls() (a layer's q/k/v): none rounded yet
  // xq_norm: x as the FFN norm rounded it (pre_ when the MoE op began), used where it is in the gate's mode.
  void moe_prefill(const MoeFfn& m, const float* x, int64_t n, const float* logits_d, float* out,
                   const Prerounded& xq_norm);
  // The block rounding (mode 0 or 1) that the last matmuls()'s weights take, for rows of n; -1 where they
  // take none or a block does not divide n. A norm writing those rows rounds them in the same launch.
  int preround_block_mode(int64_t n) const {
    int64_t unit = 1;
    const int mode = round_mode(preround_type_, &unit);
    return (mode == 0 || mode == 1) && n % unit == 0 ? mode : -1;
  }
  float* preq_ = nullptr;
  int64_t preq_cap_ = 0;
  float* preround_buffer(int64_t n) {
    if (n > preq_cap_) {
      dealloc(preq_);
      preq_ = static_cast<float*>(alloc(n * sizeof(float)));
      preq_cap_ = n;
    }
    return preq_;
  }
  void* dummy_ = nullptr;
  std::map<void*, size_t> sizes_;
  size_t allocated_ = 0;
  // Freed blocks kept for reuse (size -> block): a pass that follows a larger one gives back each scratch
  // spill of the larger one (hundreds in a prefill), and NVIDIA's OpenCL takes about a millisecond of host
  // time to free one.
  std::multimap<size_t, void*> pool_;
  size_t pooled_bytes_ = 0;
  static constexpr size_t kPoolMaxBlock = size_t(256) << 20;
  size_t pool_cap() const { return std::min<size_t>(size_t(1) << 30, info_.global_mem_bytes / 16); }
  void release_pool();
  std::unique_ptr<Prog> ops_, gdn_, probe_code_;
  std::unique_ptr<Prog> attention_[3][2];  // for heads of up to 128, 256, kAttMaxD dims, read narrow / wide
  std::map<DType, std::unique_ptr<Prog>> matmul_;
  std::vector<Prog*> programs_;
};

}  // namespace xpert::opencl
