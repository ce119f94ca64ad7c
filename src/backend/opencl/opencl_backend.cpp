#include "backend/opencl/opencl_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/moe.h"
#include "backend/experts.h"
#include "backend/gated_delta_net.h"
#include "backend/opencl/cl_api.h"
#include "backend/opencl/discovery.h"
#include "backend/opencl/kernels_attention.h"
#include "backend/opencl/kernels_gdn.h"
#include "backend/opencl/kernels_matmul.h"
#include "backend/opencl/kernels_ops.h"
#include "backend/opencl/program_cache.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "quant/dtype.h"

namespace xpert {
namespace opencl {
namespace {

// Must match the kernel sources.
constexpr int kRedWg = 64;  // RED_WG, kernels_ops.h
constexpr int kMvRows = 4;  // MV_MR, kernels_matmul.h
constexpr int kTileN = 64, kTileM = 32;
constexpr int kAttWg = 64, kAttMaxD = 512;  // kernels_attention.h
constexpr int kGdnMaxDk = 512;              // kernels_gdn.h
constexpr int kGdnChunk = 64;               // GDN_C, kernels_gdn.h: also the prep kernel's work-group size
// A matmul with more activation rows than this takes the tiled kernel.
constexpr int64_t kGemvMaxRows = 8;
// An expert with at least this many rows in a MoE batch takes the tiled kernel, the others one batched gemv.
constexpr int64_t kMoeGemmMinRows = 16;

const char* weight_macro(DType t) {
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
int64_t block_elems(DType t) {
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

size_t groups(int64_t n, int64_t per) { return (size_t)((n + per - 1) / per); }

class OpenclBackend final : public Backend {
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
    queue_ = Queue(api().clCreateCommandQueueWithProperties(ctx_.get(), info_.device, nullptr, &err));
    if (err != CL_SUCCESS) throw_cl_error(err, "clCreateCommandQueueWithProperties", __FILE__, __LINE__);
    // A CPU runs a work-group as one thread: few work-items per feature; a GPU wants a wide group.
    mv_wg_ = info_.is_cpu() ? 4 : 32;
    dummy_ = alloc(256);  // bound to optional pointer arguments that are absent
  }

  ~OpenclBackend() override {
    drop_scratch();
    if (queue_) api().clFinish(queue_.get());
    if (dummy_) api().clSVMFree(ctx_.get(), dummy_);
    programs_.clear();
  }

  std::string name() const override { return fmt::format("opencl:{} ({})", index_, info_.name); }
  DeviceKind kind() const override { return DeviceKind::opencl; }

  void* alloc(size_t bytes) override {
    bytes = std::max<size_t>(bytes, 1);
    if (bytes > info_.max_alloc_bytes)
      fail(
          "{}: one allocation of {:.2f} GiB exceeds the device's limit of {:.2f} GiB "
          "(CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
          name(), bytes / double(1ull << 30), info_.max_alloc_bytes / double(1ull << 30));
    void* p = api().clSVMAlloc(ctx_.get(), CL_MEM_READ_WRITE, bytes, 0);
    if (!p)
      fail(
          "out of memory on {}: {:.2f} GiB asked, {:.2f} GiB in use of {:.2f} GiB (offload fewer layers: "
          "-ngl)",
          name(), bytes / double(1ull << 30), allocated_ / double(1ull << 30),
          info_.global_mem_bytes / double(1ull << 30));
    sizes_[p] = bytes;
    allocated_ += bytes;
    return p;
  }
  void dealloc(void* p) override {
    if (!p) return;
    synchronize();  // clSVMFree does not wait for the commands that use p
    api().clSVMFree(ctx_.get(), p);
    if (auto it = sizes_.find(p); it != sizes_.end()) {
      allocated_ -= it->second;
      sizes_.erase(it);
    }
  }
  void zero(void* p, size_t bytes) override {
    if (!bytes) return;
    const cl_uchar z = 0;
    XP_CL(clEnqueueSVMMemFill, q(), p, &z, 1, bytes, 0, nullptr, nullptr);
  }
  // Blocking: the source may be a temporary of the caller.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) XP_CL(clEnqueueSVMMemcpy, q(), CL_TRUE, dst, src, bytes, 0, nullptr, nullptr);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) XP_CL(clEnqueueSVMMemcpy, q(), CL_TRUE, dst, src, bytes, 0, nullptr, nullptr);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) XP_CL(clEnqueueSVMMemcpy, q(), CL_FALSE, dst, src, bytes, 0, nullptr, nullptr);
  }
  void synchronize() override { XP_CL(clFinish, q()); }
  size_t free_memory() const override {
    return info_.global_mem_bytes > allocated_ ? info_.global_mem_bytes - allocated_ : 0;
  }

  void matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) override {
    const int64_t k = w.ne[0], n = w.ne[1];
    if (m <= 0 || n <= 0) return;
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    x = rounded_activations(w.type, x, m, k);
    if (m <= kGemvMaxRows)
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
    elementwise("store_f16", n, x, dst, (cl_long)n);
  }

  void attention(const AttentionArgs& a) override {
    if (a.n_tokens <= 0) return;
    check_kv_type(a.k_type);
    check_kv_type(a.v_type);
    if (a.head_dim > kAttMaxD)
      fail("{}: attention with head_dim {} > {} is not supported", name(), a.head_dim, kAttMaxD);
    if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv)
      fail("{}: {} query heads do not share {} KV heads evenly", name(), a.n_head, a.n_head_kv);
    launch(program(attention_, kAttentionSource, "").kernel("attention"),
           {(size_t)a.n_head * kAttWg, (size_t)a.n_tokens}, {kAttWg, 1}, a.q, a.k, a.v, a.out, a.pos,
           (cl_int)a.n_head, (cl_int)a.n_head_kv, (cl_int)a.head_dim, (cl_int)a.n_kv, a.kq_scale,
           (cl_int)a.sliding_window);
  }

  void moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out) override;
  void moe_small_batch(const MoeFfn& m, const float* x, int64_t n, const float* logits_d, float* out);
  void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                       float* conv_state, float* ssm_state, float* out) override;

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
  Prog& program(std::unique_ptr<Prog>& slot, std::string_view source, const std::string& options) {
    if (!slot) {
      auto p = std::make_unique<Prog>();
      std::string src(kClCommonSource);
      src += source;
      p->program = build_program(ctx_.get(), info_, src, options);
      slot = std::move(p);
      programs_.push_back(slot.get());
    }
    return *slot;
  }
  // Activation scales divide by amax: correctly rounded, the rounding matches the CPU's bit for bit.
  cl_kernel ops(const char* kernel) {
    return program(ops_, kOpsSource,
                   info_.correctly_rounded_divide ? "-cl-fp32-correctly-rounded-divide-sqrt" : "")
        .kernel(kernel);
  }
  cl_kernel gdn(const char* kernel) { return program(gdn_, kGdnSource, "").kernel(kernel); }
  Prog& matmul_program(DType t) {
    const char* macro = weight_macro(t);
    if (!macro)
      fail("{}: no matmul kernel for {} weights (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)", name(),
           dtype_name(t));
    return program(matmul_[t], kMatmulSource, fmt::format("-D{} -DMV_WG={}", macro, mv_wg_));
  }
  // x (m rows of k) rounded as the CPU rounds activations for weights of type t (kernels_ops.h
  // round_activations), in scratch memory the caller releases; x itself for f32 weights.
  const float* rounded_activations(DType t, const float* x, int64_t m, int64_t k) {
    int mode = -1;
    int64_t block = 1;
    switch (t) {
      case DType::Q4_0:
      case DType::Q5_0:
      case DType::Q8_0:
        mode = 0, block = 32;
        break;
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q6_K:
        mode = 1, block = 256;
        break;
      case DType::F16:
        mode = 2;
        break;
      case DType::BF16:
        mode = 3;
        break;
      default:
        return x;
    }
    check_row(t, k);
    float* xq = scratch().take<float>(m * k);
    launch(ops("round_activations"), {(size_t)(k / block), (size_t)m}, {}, x, (cl_int)k, xq, (cl_int)mode);
    return xq;
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
  template <typename... A>
  void launch(cl_kernel k, std::initializer_list<size_t> global, std::initializer_list<size_t> local,
              const A&... args) {
    cl_uint i = 0;
    (set_arg(k, i++, args), ...);
    size_t g[3] = {1, 1, 1}, l[3] = {1, 1, 1};
    std::copy(global.begin(), global.end(), g);
    std::copy(local.begin(), local.end(), l);
    XP_CL(clEnqueueNDRangeKernel, q(), k, (cl_uint)global.size(), nullptr, g, local.size() ? l : nullptr, 0,
          nullptr, nullptr);
  }
  template <typename... A>
  void elementwise(const char* kernel, int64_t n, const A&... args) {
    if (n > 0) launch(ops(kernel), {(size_t)n}, {}, args...);
  }

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
  void gemm(DType t, const void* w, int64_t n, int64_t k, const float* x, int64_t ldx, int64_t m, float* y,
            int64_t ldy) {
    check_row(t, k);
    launch(matmul_program(t).kernel("gemm"), {groups(n, kTileN) * 16, groups(m, kTileM) * 16}, {16, 16}, w,
           (cl_ulong)row_bytes(t, k), x, (cl_int)ldx, (cl_int)k, (cl_int)n, y, (cl_int)ldy, (cl_int)m);
  }

  cl_command_queue q() const { return queue_.get(); }

  int index_;
  DeviceInfo info_;
  Context ctx_;
  Queue queue_;
  DeltaRuleForm gdn_form_;
  int mv_wg_ = 32;
  void* dummy_ = nullptr;
  std::map<void*, size_t> sizes_;
  size_t allocated_ = 0;
  std::unique_ptr<Prog> ops_, attention_, gdn_;
  std::map<DType, std::unique_ptr<Prog>> matmul_;
  std::vector<Prog*> programs_;
};

// Batches of fewer than kMoeGemmMinRows tokens of a layer wholly on the device route there
// (moe_small_batch). Larger ones and split layers route on the host (the router logits are n x n_expert
// floats), so the CPU's exact top-k and the routing statistics come for free; the rows are then grouped
// by expert as the CPU groups them. Experts
// with many rows (prefill) run the tiled kernel on their contiguous rows; the rest run in one batched gemv
// per matrix, each row with its own expert. Split layers (some experts on the host) run the host's share
// on the host's threads and add it.
void OpenclBackend::moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out) {
  const int64_t X = m.n_expert, K = m.n_used, E = m.n_embd, F = m.n_ff, S = n * K;
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* logits_d = ar.take<float>(n * X);
  matmul(m.router, x, n, logits_d, X);
  if (!m.split && n < kMoeGemmMinRows && m.uniform_seed == 0) {  // (uniform routing: the host's router)
    // Every expert has fewer rows than the tiled kernel takes, so the host's grouping would send each row
    // to the batched gemv on its own anyway: route on the device and skip the two round trips. Like a
    // layer wholly on a CUDA GPU, its routing is not counted (m.stats).
    moe_small_batch(m, x, n, logits_d, out);
    ar.release(mark);
    return;
  }
  thread_local std::vector<float> logits;
  logits.resize(n * X);
  copy_to_host(logits.data(), logits_d, logits.size() * sizeof(float));
  Routing r;
  cpu::route_top_k(logits.data(), n, m.router_params(), r);
  if (m.stats && m.layer >= 0) m.stats->add(m.layer, r.ids);

  const ExpertSplit* split = m.split;
  auto on_device = [&](int32_t e) { return !split || split->on_device[e]; };
  // Grouped rows: the device's slots, by expert, in slot order within an expert.
  std::vector<int32_t> offsets(X + 1, 0);
  for (int64_t s = 0; s < S; ++s)
    if (on_device(r.ids[s])) ++offsets[r.ids[s] + 1];
  for (int64_t e = 0; e < X; ++e) offsets[e + 1] += offsets[e];
  const int64_t G = offsets[X];
  std::vector<int32_t> row_slot(std::max<int64_t>(G, 1)), slot_row(S),
      fill(offsets.begin(), offsets.end() - 1);
  std::vector<float> weights(S);
  for (int64_t s = 0; s < S; ++s) {
    const int32_t e = r.ids[s];
    if (!on_device(e)) {
      slot_row[s] = -1;  // the host adds this slot
      continue;
    }
    const int32_t g = fill[e]++;
    row_slot[g] = (int32_t)s;
    slot_row[s] = g;
    weights[s] = r.weights[s];
  }
  std::vector<int32_t> tasks;  // (row, expert) of the rows of small experts
  for (int64_t e = 0; e < X; ++e) {
    const int32_t cnt = offsets[e + 1] - offsets[e];
    if (cnt > 0 && cnt < kMoeGemmMinRows && !split)
      for (int32_t g = offsets[e]; g < offsets[e + 1]; ++g) tasks.push_back(g), tasks.push_back((int32_t)e);
  }

  // The four tables in one upload (each blocking write drains the queue).
  thread_local std::vector<int32_t> tables;
  tables.clear();
  tables.insert(tables.end(), row_slot.begin(), row_slot.end());
  tables.insert(tables.end(), slot_row.begin(), slot_row.end());
  for (float w : weights) tables.push_back(std::bit_cast<int32_t>(w));
  tables.insert(tables.end(), tasks.begin(), tasks.end());
  int32_t* tables_d = ar.take<int32_t>((int64_t)tables.size());
  copy_from_host(tables_d, tables.data(), tables.size() * sizeof(int32_t));
  const int32_t* row_slot_d = tables_d;
  const int32_t* slot_row_d = row_slot_d + row_slot.size();
  const float* weights_d = reinterpret_cast<const float*>(slot_row_d + S);
  const int32_t* tasks_d = slot_row_d + 2 * S;

  const int64_t Gd = std::max<int64_t>(G, 1);
  float* xg = ar.take<float>(Gd * E);
  float* gate = ar.take<float>(Gd * F);
  float* up = ar.take<float>(Gd * F);
  float* yg = ar.take<float>(Gd * E);
  if (G > 0) {
    elementwise("moe_gather", G * E, x, row_slot_d, (cl_int)K, (cl_int)E, xg, (cl_long)(G * E));
    // One matrix of every expert: big experts tiled, small ones in one batched gemv.
    auto expert_matmul = [&](const Weight& w3, int w_index, const float* in, int64_t k_in, float* o,
                             int64_t n_o) {
      const size_t stride = row_bytes(w3.type, w3.ne[0]) * (size_t)w3.ne[1];
      const size_t mark_in = ar.mark();
      in = rounded_activations(w3.type, in, G, k_in);  // once for every expert of the matrix
      for (int64_t e = 0; e < X; ++e) {
        const int32_t g0 = offsets[e], cnt = offsets[e + 1] - offsets[e];
        if (cnt == 0 || (cnt < kMoeGemmMinRows && !split)) continue;
        const void* we = split ? (w_index == 0   ? split->gate[e]
                                  : w_index == 1 ? split->up[e]
                                                 : split->down[e])
                               : static_cast<const uint8_t*>(w3.data) + e * stride;
        const float* xe = in + (int64_t)g0 * k_in;
        float* ye = o + (int64_t)g0 * n_o;
        if (cnt <= kGemvMaxRows)
          gemv(w3.type, we, n_o, k_in, xe, k_in, cnt, ye, n_o, nullptr, 0, 0);
        else
          gemm(w3.type, we, n_o, k_in, xe, k_in, cnt, ye, n_o);
      }
      if (!tasks.empty())
        gemv(w3.type, w3.data, n_o, k_in, in, k_in, (int64_t)tasks.size() / 2, o, n_o, tasks_d,
             (int64_t)tasks.size() / 2, stride);
      ar.release(mark_in);
    };
    expert_matmul(m.gate, 0, xg, E, gate, F);
    expert_matmul(m.up, 1, xg, E, up, F);
    swiglu(gate, up, gate, G * F);
    expert_matmul(m.down, 2, gate, F, yg, E);
  }
  elementwise("moe_combine", n * E, yg, slot_row_d, weights_d, (cl_int)K, (cl_int)E, out, (cl_long)(n * E));

  if (split && G < S) {  // the host's experts, over the mmap, added in
    if (!host_pool_) fail("{}: a split MoE layer needs the host's threads", name());
    std::vector<bool> on_host(X);
    for (int64_t e = 0; e < X; ++e) on_host[e] = !split->on_device[e];
    thread_local std::vector<float> xh, yh;
    xh.resize(n * E);
    yh.resize(n * E);
    copy_to_host(xh.data(), x, xh.size() * sizeof(float));
    thread_local cpu::MoeScratch ms;
    cpu::moe_experts_partial(m.host_view(), xh.data(), n, r, on_host, yh.data(), false, ms, *host_pool_);
    float* yd = ar.take<float>(n * E);
    copy_from_host(yd, yh.data(), yh.size() * sizeof(float));
    add(out, yd, out, n * E);
  }
  ar.release(mark);
}

// A decode-sized batch of a layer wholly on the device, routed by moe_route_slots: no host round trip.
void OpenclBackend::moe_small_batch(const MoeFfn& m, const float* x, int64_t n, const float* logits_d,
                                    float* out) {
  const int64_t X = m.n_expert, K = m.n_used, E = m.n_embd, F = m.n_ff, S = n * K;
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  int32_t* row_slot_d = ar.take<int32_t>(S);
  int32_t* slot_row_d = ar.take<int32_t>(S);
  float* weights_d = ar.take<float>(S);
  int32_t* tasks_d = ar.take<int32_t>(2 * S);
  const RouterParams rp = m.router_params();
  launch(ops("moe_route_slots"), {(size_t)n}, {}, logits_d, (cl_int)X, (cl_int)K, (cl_int)rp.norm_weights,
         rp.weights_scale, row_slot_d, slot_row_d, weights_d, tasks_d, (cl_int)n);
  float* xg = ar.take<float>(S * E);
  float* gate = ar.take<float>(S * F);
  float* up = ar.take<float>(S * F);
  float* yg = ar.take<float>(S * E);
  elementwise("moe_gather", S * E, x, row_slot_d, (cl_int)K, (cl_int)E, xg, (cl_long)(S * E));
  auto expert_matmul = [&](const Weight& w3, const float* in, int64_t k_in, float* o, int64_t n_o) {
    const size_t stride = row_bytes(w3.type, w3.ne[0]) * (size_t)w3.ne[1];
    const size_t mark_in = ar.mark();
    in = rounded_activations(w3.type, in, S, k_in);
    gemv(w3.type, w3.data, n_o, k_in, in, k_in, S, o, n_o, tasks_d, S, stride);
    ar.release(mark_in);
  };
  expert_matmul(m.gate, xg, E, gate, F);
  expert_matmul(m.up, xg, E, up, F);
  swiglu(gate, up, gate, S * F);
  expert_matmul(m.down, gate, F, yg, E);
  elementwise("moe_combine", n * E, yg, slot_row_d, weights_d, (cl_int)K, (cl_int)E, out, (cl_long)(n * E));
  ar.release(mark);
}

void OpenclBackend::gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                    float* conv_state, float* ssm_state, float* out) {
  const int64_t T = in.n_tokens, Hk = s.n_k_heads, Hv = s.n_v_heads, dk = s.head_k_dim, dv = s.head_v_dim;
  const int64_t CD = s.conv_dim();
  if (T <= 0) return;
  if (dk > kGdnMaxDk)
    fail("{}: Gated DeltaNet key heads of {} > {} are not supported", name(), dk, kGdnMaxDk);
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* conv = ar.take<float>(T * CD);
  float* g = ar.take<float>(T * Hv);
  float* beta = ar.take<float>(T * Hv);
  launch(gdn("conv1d_silu"), {(size_t)CD}, {}, in.qkv, (cl_int)T, (cl_int)CD, p.conv1d, (cl_int)s.d_conv,
         conv_state, conv);
  // q and k: the first 2 * key_dim channels of each row, normalized per head in place.
  launch(gdn("l2_norm"), {(size_t)(T * 2 * Hk) * kRedWg}, {kRedWg}, conv, (cl_int)dk, (cl_int)(2 * Hk),
         (cl_long)CD, s.eps);
  launch(gdn("gdn_gates"), {(size_t)(T * Hv)}, {}, in.alpha, in.beta, p.dt_bias, p.a, (cl_int)Hv, g, beta,
         (cl_long)(T * Hv));
  const float *q = conv, *k = conv + s.key_dim(), *v = conv + 2 * s.key_dim();
  DeltaRuleForm form = gdn_form_;
  if (form == DeltaRuleForm::automatic)
    form = T >= kChunkedMinTokens ? DeltaRuleForm::chunked : DeltaRuleForm::recurrent;
  if (info_.max_work_group_size < (size_t)kGdnChunk)
    form = DeltaRuleForm::recurrent;  // the prep kernel's group
  if (form == DeltaRuleForm::chunked) {
    // The workspace, per (chunk, value head) block: G, QK, u, w, q', QK u (kernels_gdn.h).
    const int64_t blocks = groups(T, kGdnChunk) * Hv, C = kGdnChunk;
    float* ws_g = ar.take<float>(blocks * C);
    float* ws_qk = ar.take<float>(blocks * C * C);
    float* ws_u = ar.take<float>(blocks * C * dv);
    float* ws_w = ar.take<float>(blocks * C * dk);
    float* ws_qp = ar.take<float>(blocks * C * dk);
    float* ws_qku = ar.take<float>(blocks * C * dv);
    launch(gdn("delta_chunk_prep"), {groups(T, kGdnChunk) * kGdnChunk, (size_t)Hv}, {(size_t)kGdnChunk, 1}, q,
           k, v, (cl_long)CD, (cl_long)CD, g, beta, (cl_int)T, (cl_int)Hk, (cl_int)Hv, (cl_int)dk, (cl_int)dv,
           ws_g, ws_qk, ws_u, ws_w, ws_qp, ws_qku);
    // Narrow column blocks: more work-groups for the few heads of a layer (the scan is serial over chunks).
    const size_t wg =
        (size_t)std::min<int64_t>({dv, info_.is_cpu() ? 16 : 32, (int64_t)info_.max_work_group_size});
    launch(gdn("delta_chunk_scan"), {groups(dv, (int64_t)wg) * wg, (size_t)Hv}, {wg, 1}, k, (cl_long)CD,
           ssm_state, out, (cl_int)T, (cl_int)Hk, (cl_int)Hv, (cl_int)dk, (cl_int)dv, ws_g, ws_u, ws_w, ws_qp,
           ws_qku);
  } else {
    const size_t wg = (size_t)std::min<int64_t>({dv, 256, (int64_t)info_.max_work_group_size});
    launch(gdn("delta_rule_recurrent"), {(size_t)Hv * wg}, {wg}, q, k, v, (cl_long)CD, (cl_long)CD, g, beta,
           ssm_state, out, (cl_int)T, (cl_int)Hk, (cl_int)Hv, (cl_int)dk, (cl_int)dv);
  }
  launch(gdn("gated_rmsnorm"), {(size_t)(T * Hv) * kRedWg}, {kRedWg}, out, p.norm, in.z, (cl_int)dv, s.eps);
  ar.release(mark);
}

}  // namespace
}  // namespace opencl

std::shared_ptr<Backend> make_opencl_backend(int opencl_index) {
  return std::make_shared<opencl::OpenclBackend>(opencl_index, DeltaRuleForm::automatic);
}
std::shared_ptr<Backend> make_opencl_backend(int opencl_index, DeltaRuleForm gdn_form) {
  return std::make_shared<opencl::OpenclBackend>(opencl_index, gdn_form);
}

}  // namespace xpert
