// The device interface. A model's forward is written once against these ops; each backend (cpu/,
// cuda/, later opencl/) implements them on its own memory. Pointers passed to an op live in that
// backend's memory (host memory for the CPU, device memory for a GPU); weights are Weight views whose
// data is in that memory too (see Model::offload). Ops on a GPU are asynchronous on the backend's
// stream; copies to the host wait for them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/capabilities.h"
#include "backend/experts.h"
#include "backend/gated_delta_net.h"
#include "backend/act.h"
#include "backend/op_types.h"
#include "backend/tensor.h"

namespace xpert {

class ThreadPool;

enum class DeviceKind { cpu, cuda, opencl };

// "cpu", "cuda:0", "opencl:1"; `cuda` alone means cuda:0. Throws Error for anything else.
struct DeviceId {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  static DeviceId parse(const std::string& s);
  std::string str() const;
};

class Arena;

class Backend {
 public:
  virtual ~Backend();
  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)"
  virtual DeviceKind kind() const = 0;
  bool is_host() const { return kind() == DeviceKind::cpu; }

  // Memory. alloc throws Error when the device is out of memory; every copy is ordered after the ops
  // already issued; copy_to_host returns when the bytes are there.
  virtual void* alloc(size_t bytes) = 0;
  virtual void dealloc(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  // Host memory that results are copied into again and again (a decode step's logits), registered with
  // this device until unpin_host so that each copy into it is one DMA (CUDA: page-locked in place). False
  // where the device does not do it (the default) or the registration fails; the memory works either way.
  virtual bool pin_host(void* p, size_t bytes) { return false; }
  virtual void unpin_host(void* p) {}
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // within this device
  // Weight w (w.data in host memory) into dst, this device's allocation of w.n_bytes, in the layout this
  // device's kernels read (a GPU may lay a type out otherwise than the file: CUDA's Q6_K).
  virtual void upload_weight(void* dst, const Weight& w);
  // Whether this device's kernels read a weight where it lies in host memory (the file's mapping, a
  // repacked copy the model owns) when its data is 32-byte aligned: Model::offload then keeps the host
  // pointer instead of a copy. An OpenCL device on the host's own cores, or one with fine-grained system SVM
  // (an integrated GPU whose driver shares the process's address space).
  virtual bool reads_host_weights() const { return false; }
  virtual void synchronize() {}
  // Bytes free for new allocations (a GPU's free memory; the CPU says 0 = unknown).
  virtual size_t free_memory() const { return 0; }

  // y[m][w.ne[1]] (row stride ldy, 0: w.ne[1]) = x[m][w.ne[0]] . w^T
  virtual void matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy = 0) = 0;
  // Several products of the same x, as matmul each (a layer's q, k and v): one launch on a GPU at decode
  // sizes. No y may overlap x.
  struct MatmulJob {
    const Weight* w;
    float* y;
    int64_t ldy = 0;
  };
  virtual void matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs);
  // The same products of rows an op returned (Act: x.rows rows of x.x), reading the form of them that op
  // wrote where it wrote one (see Act). The default: the plain products of x.x.
  void matmul(const Weight& w, const Act& x, float* y, int64_t ldy = 0) { matmul_act(w, x, y, ldy); }
  void matmuls(const Act& x, std::span<const MatmulJob> jobs) { matmuls_act(x, jobs); }
  // y = x / rms(x) * w per row of n; w may be null; y may alias x.
  virtual void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) = 0;
  // x: rows of n_heads * head_dim per token at position pos[t] (pos in this backend's memory).
  virtual void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                    int64_t n_rot, float freq_base, float freq_scale, RopeMode mode) = 0;
  // Fused forms of the above, for backends that gain from one launch (the defaults call the plain ops):
  // x += d (when d is given), then y = rmsnorm(x) * w (the residual add before a norm), returning y for the
  // products that read it next (an Act; the default: y alone); and the per-head q/k norms (each only when
  // its weights are given) followed by RoPE of q and of k.
  virtual Act add_rmsnorm(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n,
                          float eps);
  // rmsnorm whose y the products read next: add_rmsnorm without d.
  Act rmsnorm_act(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
    return add_rmsnorm(nullptr, const_cast<float*>(x), w, y, rows, n, eps);  // without d, x is only read
  }
  virtual void qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm, const int32_t* pos,
                            int64_t n_tokens, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_rot,
                            float freq_base, float freq_scale, RopeMode mode, float eps);
  // qk_norm_rope of n_tokens' q and k (p.pos: their positions), then store_kv of their k and v rows
  // (n_head_kv * head_dim values each) at kc (k_type) and vc (v_type); a backend may do it in one launch.
  virtual void qk_norm_rope_store_kv(float* q, float* k, const float* v, const QkPrep& p, int64_t n_tokens,
                                     int64_t n_head, int64_t n_head_kv, int64_t head_dim, void* kc,
                                     DType k_type, void* vc, DType v_type);
  virtual void swiglu(const float* gate, const float* up, float* y, int64_t n) = 0;  // silu(gate) * up
  virtual void geglu(const float* gate, const float* up, float* y, int64_t n) = 0;   // gelu_tanh(gate) * up
  virtual void add(const float* a, const float* b, float* y, int64_t n) = 0;
  virtual void scale(float* x, float s, int64_t n) = 0;
  virtual void add_bias(float* x, const float* bias, int64_t rows, int64_t n) = 0;
  virtual void mul_sigmoid(float* x, const float* gate, int64_t n) = 0;  // x *= sigmoid(gate)
  // y[r] += s[r] * sigmoid(g[r]) for rows of n (g: one gate per row).
  virtual void add_sigmoid_scaled(float* y, const float* s, const float* g, int64_t rows, int64_t n) = 0;
  // src rows of 2*width -> a (first half of each row), b (second half).
  virtual void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) = 0;
  // y[i] = x[rows[i]] for rows of width; `rows` is a host array.
  virtual void gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) = 0;
  // f32 -> KV cache rows of `type` (F16, Q8_0, Q4_0; quant/quant.h's reference rounding): n values, a
  // multiple of 32 for the block types, to dst in this backend's memory.
  virtual void store_kv(const float* x, void* dst, int64_t n, DType type) = 0;
  virtual void attention(const AttentionArgs& a) = 0;

  // The routed-experts FFN of a MoE layer (router, top-k, experts, weighted sum): x [n][n_embd] -> out.
  virtual void moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out) = 0;
  // The layer's whole MoE FFN added to y (the residual): y += moe_ffn(x), plus sigmoid(x . g) * the shared
  // expert's SwiGLU FFN of x when the layer has one (Qwen3.5); x: x.rows rows as an op returned them (its
  // products read x's form). Default: moe_ffn into scratch, the shared expert added to it
  // (add_shared_expert), then y = that + y.
  virtual void moe_ffn_add(const MoeFfn& m, const Act& x, float* y);
  // A MoE layer's FFN half after its mixer: x += d; cur = rmsnorm(x) * w; x += the MoE FFN of cur (as
  // moe_ffn_add); then, with next_w (the next layer's input norm), cur = rmsnorm(x) * next_w, returned as
  // the next layer's products' Act (without next_w: an empty Act); norms with m.rms_eps. d_parts: d is
  // still the parts decode_attention_proj left (d == d_parts->out), added here. Default: sum_parts,
  // add_rmsnorm, moe_ffn_add, rmsnorm. A backend may fuse them (CUDA, one decode token: the parts summed
  // and the norm done inside the router's blocks, d added in the experts' down product, the next norm in
  // its last block; the same bits).
  virtual Act add_rmsnorm_moe_ffn_add(const MoeFfn& m, const float* d, float* x, const float* w, float* cur,
                                      int64_t n, const float* next_w, const PartialSum* d_parts = nullptr);
  // One sequence through a Gated DeltaNet mixer (gated_delta_net.h), states in this backend's memory.
  virtual void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                               float* conv_state, float* ssm_state, float* out) = 0;
  // The same, returning out for the output projection: an Act with the form of out the backend wrote
  // beside it (the default: gated_delta_net, out alone).
  virtual Act gated_delta_net_act(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                  float* conv_state, float* ssm_state, float* out);
  // in.n_tokens sequences of one decode token each (many streams): row r of in.* and out is sequence r's,
  // its states states[r]. The default: gated_delta_net row by row (a backend may take them all at once,
  // the same bits as row by row); returns out as an Act of all rows.
  virtual Act gated_delta_net_rows(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                   std::span<const GdnSlotState> states, float* out);

  // Optional capabilities (backend/capabilities.h), each offered by returning the interface (the default:
  // null, not offered). The model asks for a fused or recorded form by name where one is offered.
  virtual DecodeFusions* decode_fusions() { return nullptr; }
  virtual PassGraphs* pass_graphs() { return nullptr; }
  virtual SplitExperts* split_experts() { return nullptr; }

  // Scratch memory for forward passes on this backend (kept between passes).
  Arena& scratch();

  // The CPU threads of the pass (a GPU backend runs host-resident experts on them).
  void set_host_pool(ThreadPool* p) { host_pool_ = p; }
 protected:
  // matmul / matmuls of an Act (see above): a backend that makes Acts with a form reads it here.
  virtual void matmul_act(const Weight& w, const Act& x, float* y, int64_t ldy);
  virtual void matmuls_act(const Act& x, std::span<const MatmulJob> jobs);

  // out += sigmoid(x . g) * down(silu(x Wg^T) * (x Wu^T)) for the layer's shared expert, with this
  // backend's plain ops (x: [x.rows][n_embd]).
  void add_shared_expert(const MoeFfn& m, const Act& x, float* out);
  // out = the layer's whole MoE FFN of x: moe_ffn, plus the shared expert where the layer has one (what
  // moe_ffn_add adds to y).
  void moe_ffn_whole(const MoeFfn& m, const Act& x, float* out);

  ThreadPool* host_pool_ = nullptr;
  // Derived destructors call this first: the arena frees through the derived class's dealloc.
  void drop_scratch();

 private:
  std::unique_ptr<Arena> scratch_;
};

// Memory of one backend, owned: an allocation that frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& b, size_t bytes) : b_(&b), p_(bytes ? b.alloc(bytes) : nullptr), n_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept : b_(o.b_), p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }
  void* data() const { return p_; }
  size_t size() const { return n_; }
  Backend* backend() const { return b_; }

 private:
  void release();
  Backend* b_ = nullptr;
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Scratch memory of one forward pass on one backend: bump allocation from chunks that are kept between
// passes, so a pass with the same shapes gets the same addresses (what a captured CUDA graph needs).
class Arena {
 public:
  explicit Arena(Backend& b) : b_(b) {}
  template <class T>
  T* take(int64_t n) {
    return static_cast<T*>(take_bytes((size_t)n * sizeof(T)));
  }
  void* take_bytes(size_t bytes);
  size_t mark() const { return used_; }   // everything taken after a mark is given back by release()
  void release(size_t mark) { used_ = mark; }
  void reset();  // start of a pass; also at the end of one that spilled (Exec), so the growth is its cost
  Backend& backend() const { return b_; }
  uint64_t generation() const { return generation_; }  // changes whenever the main buffer moves
  bool spilled() const { return !spill_.empty(); }

 private:
  Backend& b_;
  uint64_t generation_ = 0;
  DeviceBuffer buf_;
  size_t used_ = 0, peak_ = 0;
  std::vector<DeviceBuffer> spill_;  // taken when buf_ ran out in this pass; merged into buf_ at reset
  std::vector<std::pair<size_t, size_t>> spill_used_;
};

// Copies bytes between two backends' memories (through the host when neither is the host).
void copy_between(Backend& from, const void* src, Backend& to, void* dst, size_t bytes);

}  // namespace xpert
