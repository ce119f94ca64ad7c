#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <map>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "base/error.h"
#include "model/gated_delta_net.h"
#include "model/model.h"
#include "model/moe.h"
#include "quant/dtype.h"

namespace xpert {
namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    const std::vector<cuda::DeviceInfo> devs = cuda::list_devices();
    if (devs.empty()) fail("no CUDA device: {}", cuda::no_device_reason());
    if (device < 0 || device >= (int)devs.size())
      fail("cuda:{} does not exist ({} CUDA device{})", device, devs.size(), devs.size() == 1 ? "" : "s");
    info_ = devs[device];
    XPERT_CUDA_CHECK(cudaSetDevice(device));
    stream_ = std::make_unique<cuda::Stream>();
    cuda::matmul_init();
  }
  ~CudaBackend() override {
    drop_scratch();
    expert_tables_.clear();
  }

  std::string name() const override { return fmt::format("cuda:{} ({})", device_, info_.name); }
  DeviceKind kind() const override { return DeviceKind::cuda; }
  cudaStream_t s() const { return stream_->get(); }

  void* alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so the device stays usable
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("out of memory on {}: {:.2f} GiB asked, {:.2f} GiB free of {:.2f} GiB (offload fewer layers: -ngl)",
           name(), bytes / double(1ull << 30), free_b / double(1ull << 30), total_b / double(1ull << 30));
    }
    return p;
  }
  void dealloc(void* p) override { cudaFree(p); }
  void zero(void* p, size_t bytes) override { XPERT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s())); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s()));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s()));
    synchronize();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src) XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s()));
  }
  void synchronize() override { XPERT_CUDA_CHECK(cudaStreamSynchronize(s())); }
  size_t free_memory() const override {
    size_t free_b = 0, total_b = 0;
    XPERT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
  }

  void matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) override {
    const int64_t k = w.ne[0], n = w.ne[1];
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    const size_t ws = cuda::matmul_workspace_bytes(w.type, m, k);
    void* work = ws ? ar.take_bytes(ws) : nullptr;
    cuda::matmul(w.type, w.data, n, k, x, m, y, ldy ? ldy : n, work, ws, s());
    ar.release(mark);
  }
  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override {
    cuda::rmsnorm(x, w, y, rows, n, eps, s());
  }
  void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
            float freq_base, float freq_scale, RopeMode mode) override {
    cuda::rope(x, pos, n_tokens, n_heads, head_dim, n_rot, freq_base, freq_scale, mode, s());
  }
  void swiglu(const float* gate, const float* up, float* y, int64_t n) override { cuda::swiglu(gate, up, y, n, s()); }
  void geglu(const float* gate, const float* up, float* y, int64_t n) override { cuda::geglu(gate, up, y, n, s()); }
  void add(const float* a, const float* b, float* y, int64_t n) override { cuda::add(a, b, y, n, s()); }
  void scale(float* x, float v, int64_t n) override { cuda::scale(x, v, n, s()); }
  void add_bias(float* x, const float* bias, int64_t rows, int64_t n) override { cuda::add_bias(x, bias, rows, n, s()); }
  void mul_sigmoid(float* x, const float* gate, int64_t n) override { cuda::mul_sigmoid(x, gate, n, s()); }
  void add_sigmoid_scaled(float* y, const float* v, const float* g, int64_t rows, int64_t n) override {
    cuda::add_sigmoid_scaled(y, v, g, rows, n, s());
  }
  void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) override {
    cuda::deinterleave(src, rows, width, a, b, s());
  }
  void gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) override {
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    int64_t* idx = ar.take<int64_t>((int64_t)rows.size());
    copy_from_host(idx, rows.data(), rows.size_bytes());
    if (x == y) {  // gather in place would race: go through a temporary
      float* tmp = ar.take<float>((int64_t)rows.size() * width);
      cuda::gather_rows(x, idx, (int64_t)rows.size(), width, tmp, s());
      copy(y, tmp, rows.size() * width * sizeof(float));
    } else {
      cuda::gather_rows(x, idx, (int64_t)rows.size(), width, y, s());
    }
    ar.release(mark);
  }
  void store_f16(const float* x, uint16_t* dst, int64_t n) override { cuda::store_f16(x, dst, n, s()); }
  void attention(const AttentionArgs& a) override {
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    const size_t ws = cuda::attention_workspace_bytes(a);
    cuda::attention(a, ws ? ar.take_bytes(ws) : nullptr, s());
    ar.release(mark);
  }

  void moe_ffn(const ModelConfig& c, const LayerWeights& lw, const float* x, int64_t n, float* out) override {
    const int64_t X = c.n_expert, k = c.n_expert_used;
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    float* logits = ar.take<float>(n * X);
    int32_t* ids = ar.take<int32_t>(n * k);
    float* weights = ar.take<float>(n * k);
    matmul(lw.ffn_gate_inp, x, n, logits, X);
    cuda::moe_route(logits, n, {.n_expert = X, .k = k, .norm_weights = c.expert_weights_norm,
                                .weights_scale = c.expert_weights_scale}, ids, weights, s());
    const ExpertTables& t = experts(c, lw);
    if (!t.fused) {
      moe_unfused(c, lw, x, n, ids, weights, out);
      ar.release(mark);
      return;
    }
    const cuda::MoeExperts& e = t.e;
    const size_t ws = cuda::moe_workspace_bytes(e, n, k);
    cuda::moe_experts(e, {.x = x, .n_tokens = n, .k = k, .ids = ids, .weights = weights, .out = out,
                          .accumulate = false, .path = cuda::MoePath::automatic},
                      ws ? ar.take_bytes(ws) : nullptr, ws, s());
    ar.release(mark);
  }

  void gated_delta_net(const GdnShape& gs, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                       float* ssm_state, float* out) override {
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    const size_t ws = cuda::gated_delta_net_workspace_bytes(gs, in.n_tokens);
    cuda::gated_delta_net(gs, p, in, conv_state, ssm_state, out, ws ? ar.take_bytes(ws) : nullptr, s());
    ar.release(mark);
  }

 private:
  // The device tables of a layer's expert pointers, made on first use (all experts resident).
  struct ExpertTables {
    DeviceBuffer tables;
    cuda::MoeExperts e;
    bool fused = true;  // the MoE kernels take these types and shapes
  };
  const ExpertTables& experts(const ModelConfig& c, const LayerWeights& lw) {
    auto it = expert_tables_.find(lw.ffn_gate_exps.data);
    if (it != expert_tables_.end()) return it->second;
    const int64_t X = c.n_expert;
    const std::vector<bool> all(X, true);
    auto table = [&](const Weight& w) {
      const size_t bytes = row_bytes(w.type, w.ne[0]) * (size_t)w.ne[1];
      return cuda::expert_table(w.data, bytes, all);
    };
    std::vector<const void*> host = table(lw.ffn_gate_exps);
    const std::vector<const void*> up = table(lw.ffn_up_exps), down = table(lw.ffn_down_exps);
    host.insert(host.end(), up.begin(), up.end());
    host.insert(host.end(), down.begin(), down.end());
    ExpertTables t;
    t.tables = DeviceBuffer(*this, host.size() * sizeof(void*));
    copy_from_host(t.tables.data(), host.data(), host.size() * sizeof(void*));
    synchronize();
    const void* const* base = static_cast<const void* const*>(t.tables.data());
    t.e = {.gate_type = lw.ffn_gate_exps.type, .up_type = lw.ffn_up_exps.type, .down_type = lw.ffn_down_exps.type,
           .n_embd = c.n_embd, .n_ff = c.n_ff_exp, .n_expert = X,
           .gate = base, .up = base + X, .down = base + 2 * X};
    try {
      cuda::check_moe_experts(t.e);
    } catch (const Error&) {
      t.fused = false;  // e.g. f16 experts: moe_unfused
    }
    return expert_tables_.emplace(lw.ffn_gate_exps.data, std::move(t)).first->second;
  }

  // Experts the fused kernels do not take: token by token, slot by slot, with the plain matmul (the
  // routing is read back to the host). Slow, but any weight type works; real checkpoints use the fused path.
  void moe_unfused(const ModelConfig& c, const LayerWeights& lw, const float* x, int64_t n, const int32_t* ids_d,
                   const float* weights_d, float* out) {
    const int64_t k = c.n_expert_used, E = c.n_embd, F = c.n_ff_exp;
    std::vector<int32_t> ids(n * k);
    std::vector<float> w(n * k);
    copy_to_host(ids.data(), ids_d, ids.size() * sizeof(int32_t));
    copy_to_host(w.data(), weights_d, w.size() * sizeof(float));
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    float* gate = ar.take<float>(F);
    float* up = ar.take<float>(F);
    float* y = ar.take<float>(E);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[t * k + j];
        matmul(expert_matrix(lw.ffn_gate_exps, e), x + t * E, 1, gate, 0);
        matmul(expert_matrix(lw.ffn_up_exps, e), x + t * E, 1, up, 0);
        cuda::swiglu(gate, up, gate, F, s());
        matmul(expert_matrix(lw.ffn_down_exps, e), gate, 1, y, 0);
        cuda::scale(y, w[t * k + j], E, s());
        if (j == 0) copy(out + t * E, y, E * sizeof(float));
        else cuda::add(out + t * E, y, out + t * E, E, s());
      }
    }
    ar.release(mark);
  }

  int device_;
  cuda::DeviceInfo info_;
  std::unique_ptr<cuda::Stream> stream_;
  std::map<const void*, ExpertTables> expert_tables_;
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend(int device) { return std::make_shared<CudaBackend>(device); }

}  // namespace xpert
