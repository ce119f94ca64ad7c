// CudaBackend: the Backend of cuda_backend.h, one class over several files (internal to backend/cuda; the
// rest of xpert calls make_cuda_backend). This header declares it, with its data members and short inline
// members; its other members are defined in
//   cuda_backend.cpp    construction, device memory and copies, the plain ops (products, norms, RoPE,
//                       elementwise, prefill attention, gated delta net), the factory;
//   cuda_graphs.cpp     CUDA graphs of whole passes (PassGraphs): recording, replay, the graph cache,
//                       the replays' step times;
//   cuda_decode.cpp     the fused forms of a decode step (DecodeFusions): decode attention and its
//                       output projection;
//   cuda_moe.cpp        MoE layers: the entry points, routing, the experts' pointer tables, the unfused
//                       path;
//   cuda_moe_split.cpp  experts split between the GPU and the host (SplitExperts): host nodes, streamed
//                       copies of host experts, the host share.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/capabilities.h"
#include "backend/cpu/moe.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/host_transfer.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "backend/experts.h"
#include "backend/stream_share.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "quant/dtype.h"

namespace xpert::cuda_impl {

constexpr size_t align16(size_t bytes) { return (bytes + 15) & ~(size_t)15; }

// Batches of at least this many tokens stream a split layer's host experts to the GPU (see moe_split);
// measured on an H200 host (docs/PERF.md).
inline constexpr int64_t kDefaultStreamMinTokens = 64;
// A decode attention warp streams at least this many keys before another joins it (and a combine).
inline constexpr int32_t kDecodeMinKeys = 128;
// Up to this many keys a sequence, a decode step's attention is one block per KV head whose warps split
// the keys and combine them in the block (cuda::DecodeAttentionArgs::one_block): no combine launch.
inline constexpr int32_t kOneBlockMaxKeys = 512;
// Smaller batches copy part of the host experts they use and compute the rest on the host, at the same
// time: by default as many as balance the measured copy and host rates (backend/stream_share.h).

inline bool env_is_1(const char* name) {
  const char* e = std::getenv(name);
  return e && std::string(e) == "1";
}

class CudaBackend final : public Backend, public DecodeFusions, public PassGraphs, public SplitExperts {
 public:
  DecodeFusions* decode_fusions() override { return this; }
  PassGraphs* pass_graphs() override { return this; }
  SplitExperts* split_experts() override { return this; }

  // cuda_backend.cpp: construction, device and memory.
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  // cuda_moe_split.cpp
  void set_expert_streaming(int64_t min_tokens, double share) override;
  void on_experts_moved() override;

  // cuda_graphs.cpp
  bool begin_graph(const std::string& key) override;
  void end_graph() override;
  void abort_graph() override;

  std::string name() const override { return fmt::format("cuda:{} ({})", device_, info_.name); }
  DeviceKind kind() const override { return DeviceKind::cuda; }
  // The stream every op issues on. Between a begin_graph that found its recording and the end_graph that
  // replays it, the forward issues no ops (Exec::replaying): one that did would run outside the replay.
  cudaStream_t s() const {
    XP_ASSERT(!replay_pending_);
    return stream_->get();
  }

  void* alloc(size_t bytes) override;
  void dealloc(void* p) override;
  void zero(void* p, size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void upload_weight(void* dst, const Weight& w) override;
  bool pin_host(void* p, size_t bytes) override;
  void unpin_host(void* p) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;
  size_t free_memory() const override;

  // cuda_backend.cpp: the plain ops, and the ops that write an Act's form (q8_1 at decode sizes) and read it.
  using Backend::matmul;
  using Backend::matmuls;
  void matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) override;
  void matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs) override;
  void matmul_act(const Weight& w, const Act& x, float* y, int64_t ldy) override;
  void matmuls_act(const Act& x, std::span<const MatmulJob> jobs) override;
  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override;
  Act add_rmsnorm(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n,
                  float eps) override;
  void qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm, const int32_t* pos,
                    int64_t n_tokens, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_rot,
                    float freq_base, float freq_scale, RopeMode mode, float eps) override;
  void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
            float freq_base, float freq_scale, RopeMode mode) override;
  void swiglu(const float* gate, const float* up, float* y, int64_t n) override;
  void geglu(const float* gate, const float* up, float* y, int64_t n) override;
  void add(const float* a, const float* b, float* y, int64_t n) override;
  void scale(float* x, float v, int64_t n) override;
  void add_bias(float* x, const float* bias, int64_t rows, int64_t n) override;
  void mul_sigmoid(float* x, const float* gate, int64_t n) override;
  void add_sigmoid_scaled(float* y, const float* v, const float* g, int64_t rows, int64_t n) override;
  void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) override;
  void gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) override;
  void store_kv(const float* x, void* dst, int64_t n, DType type) override;
  void attention(const AttentionArgs& a) override;

  // cuda_decode.cpp
  bool fuses_attention_gate() const override;
  int decode_attention_form(int32_t max_pos) const override;
  std::optional<Act> decode_attention(const DecodeAttention& d) override;
  std::optional<PartialSum> decode_attention_proj(const DecodeAttention& d, const Weight& wo,
                                                  float* proj) override;
  void sum_parts(const PartialSum& p) override;
  bool attend_decode(const DecodeAttention& d, const Weight* wo, float* proj, Act* out);

  // cuda_moe.cpp
  void moe_ffn(const MoeFfn& ffn, const float* x, int64_t n, float* out) override;
  void moe_ffn_add(const MoeFfn& ffn, const Act& x, float* y) override;
  bool whole_moe_here(const MoeFfn& ffn, int64_t n);
  Act add_rmsnorm_moe_ffn_add(const MoeFfn& ffn, const float* d, float* x, const float* w, float* cur,
                              int64_t n, const float* next_w, const PartialSum* d_parts) override;
  bool shared_slot(const MoeFfn& ffn, int64_t n);
  void moe(const MoeFfn& ffn, const Act& xa, float* out, bool accumulate, bool shared,
           const cuda::RouterNorm* nm = nullptr, const float* residual = nullptr,
           const cuda::MoeNormOut& norm_out = {});

  // cuda_backend.cpp
  void gated_delta_net(const GdnShape& gs, const GdnLayerParams& p, const GdnLayerInputs& in,
                       float* conv_state, float* ssm_state, float* out) override;
  Act gated_delta_net_act(const GdnShape& gs, const GdnLayerParams& p, const GdnLayerInputs& in,
                          float* conv_state, float* ssm_state, float* out) override;
  Act gated_delta_net_rows(const GdnShape& gs, const GdnLayerParams& p, const GdnLayerInputs& in,
                           std::span<const GdnSlotState> states, float* out) override;

 private:
  // An Act's form here: the q8_1 activations of a decode-sized output (prep_buf_, prep_act_), written by the
  // op that returns the Act (a norm, the decode attention, the gated delta net, the MoE router and the
  // next norm in its down product) and read by the products the forward hands the Act to. One at a time:
  // each prepare_slot makes the earlier Acts' forms stale (prep_serial_), and a product given a stale
  // one converts x itself.
  // cuda_backend.cpp
  const cuda::Activations* prepare_slot(int64_t rows, int64_t k);
  Act formed(const float* y, int64_t rows, int64_t k, const cuda::Activations* act) const {
    return {.x = y, .rows = rows, .k = k, .form = act, .serial = act ? prep_serial_ : 0};
  }
  // x's form, when it is still prep_buf_'s and products of k-long rows of a w_type weight read q8_1.
  const cuda::Activations* prepared(const Act& x, int64_t k, DType w_type) const {
    if (!x.form || x.form != &prep_act_ || x.serial != prep_serial_ || prep_act_.m != x.rows ||
        prep_act_.k != k)
      return nullptr;
    if (!cuda::matmul_supported(w_type) || cuda::activation_format(w_type, x.rows) != cuda::ActFormat::q8_1)
      return nullptr;
    return &prep_act_;
  }
  static bool overlaps(const float* y, size_t n, const float* x) { return x >= y && x < y + n; }

  // cuda_moe_split.cpp: experts split between this GPU and the host (see moe_split). A host node's call:
  struct SplitCall {
    CudaBackend* self;
    MoeFfn host;  // the layer with its host experts (host_view); stats: the pass that recorded the graph
    int64_t n;
    std::vector<bool> on_host;
  };
  void split_experts_out(const cuda::MoeExperts& e, const float* x, int64_t n, int64_t k, const int32_t* ids_d,
                         const float* weights_d, float* out);
  void moe_split(const MoeFfn& ffn, const cuda::MoeExperts& e, const float* x, int64_t n,
                 const int32_t* ids_d, const float* weights_d, float* out);
  static void CUDART_CB host_experts(void* p);
  ThreadPool& node_threads();
  SplitCall& split_call(const MoeFfn& ffn, int64_t n);
  cudaStream_t aux_stream();
  void check_host_error();
  void moe_streamed(const MoeFfn& ffn, const cuda::MoeExperts& e, const float* x, int64_t n,
                    const int32_t* ids_d, const float* weights_d, float* out, bool copy_all);
  void report_copy_times();

  // cuda_moe.cpp
  // The device tables of a layer's expert pointers, made on first use (all experts resident, or the
  // layer's split).
  struct ExpertTables {
    DeviceBuffer tables;
    cuda::MoeExperts e;
    bool fused = true;    // the MoE kernels take these types and shapes
    bool shared = false;  // entry n_expert of each table is the layer's shared expert
    std::string why_not;  // when not fused: what the kernels refused
  };
  const ExpertTables& experts(const MoeFfn& ffn);
  void moe_unfused(const MoeFfn& ffn, const Act& xa, const int32_t* ids_d, const float* weights_d, float* out);

  // cuda_graphs.cpp
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    size_t end_mark = 0;  // the scratch arena's mark at end_graph: a replay must end where the recording did
  };
  static constexpr size_t kMaxGraphs = 64;
  void clear_graphs();
  std::map<std::string, Graph> graphs_;
  std::string capture_key_;
  const Graph* pending_ = nullptr;  // the graph end_graph replays
  bool capturing_ = false, replay_pending_ = false, no_graphs_ = false;
  bool graph_pass_ = false;  // between begin_graph and end_graph: ops must be capturable

  // XPERT_STEP_TIMES=1: each replayed graph's time on the GPU (events around its launch, read when its
  // output reaches the host) against the host's time from one replay's launch to the next, reported when
  // the backend goes: what a decode step spends outside its kernels. Its members: cuda_graphs.cpp.
  struct StepTimes {
    const bool on = env_is_1("XPERT_STEP_TIMES");
    cuda::Event ev[2] = {cuda::Event(true), cuda::Event(true)};
    bool pending = false;
    int64_t n = 0;
    double gpu_ms = 0, gap_ms = 0, copy_ms = 0,
           prep_ms = 0,  // prep: from the output's copy to the next launch
        walk_ms = 0;     // the part of prep in which the model's ops are called and skipped
    std::chrono::steady_clock::time_point last{}, copied{}, walk_start{};
    static double ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    }
    void walk();
    void before(cudaStream_t s);
    void after(cudaStream_t s);
    void done(std::chrono::steady_clock::time_point copy_start);
    void report();
  } step_times_;

  int device_;
  const bool pin_logits_;  // XPERT_PIN_LOGITS, on unless 0 (pin_host)
  cuda::DeviceInfo info_;
  std::unique_ptr<cuda::Stream> stream_;
  std::map<const void*, ExpertTables> expert_tables_;

  // Split MoE layers (moe_split / moe_streamed).
  int64_t stream_min_tokens_ = kDefaultStreamMinTokens;
  StreamShare stream_share_;  // under share_mutex_: the host's shares report to it
  std::mutex share_mutex_;
  struct HostShare {  // moe_streamed's host share: its routing, experts and scratch
    Routing r;
    std::vector<bool> on_cpu;
    cpu::MoeScratch ms;
  };
  HostShare host_share_;
  cuda::Event copy_begin_{true}, copy_end_{true}, moe_end_{true};  // moe_streamed's copies and MoE, timed
  size_t copy_pending_ = 0;  // bytes whose copy times are not reported yet
  // The host nodes' threads: one fewer than the host's (see host_pool).
  std::unique_ptr<ThreadPool> node_pool_;
  cuda::PinnedBuffer split_in_, split_out_, stream_table_;
  cuda::PinnedRing up_ring_;  // copy_from_host's small copies
  cuda::Event fork_, join_;
  std::unique_ptr<cuda::Stream> aux_;
  std::map<std::pair<const ExpertSplit*, int64_t>, std::unique_ptr<SplitCall>> split_calls_;
  bool stale_graphs_ = false;  // a pinned buffer that recorded graphs copy from has moved
  std::mutex host_error_mutex_;
  std::string host_error_;
  cuda::HostPins pins_;
  DeviceBuffer stream_buf_;
  cuda::DeviceBuffer layout_stage_;  // a host expert matrix on its way into the device layout
  DeviceBuffer prep_buf_;
  cuda::Activations prep_act_;  // what prep_buf_ holds (prepare_slot)
  uint64_t prep_serial_ = 0;
  DeviceBuffer router_done_;  // moe_router's block counter
  DeviceBuffer norm_done_;    // the down product's block counter for the next norm (MoeNormOut)
  DeviceBuffer parts_buf_;    // decode_attention_proj's parts (PartialSum::parts)
};

}  // namespace xpert::cuda_impl
