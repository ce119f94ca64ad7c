#include "backend/backend.h"

#include <algorithm>
#include <charconv>
#include <vector>

#include "base/error.h"
#include "base/log.h"

namespace xpert {

DeviceId DeviceId::parse(const std::string& s) {
  const size_t colon = s.find(':');
  const std::string kind = s.substr(0, colon);
  DeviceId d;
  if (kind == "cpu") d.kind = DeviceKind::cpu;
  else if (kind == "cuda") d.kind = DeviceKind::cuda;
  else if (kind == "opencl") d.kind = DeviceKind::opencl;
  else fail("unknown device '{}' (expected cpu, cuda:N or opencl:N)", s);
  if (colon != std::string::npos) {
    const char* b = s.data() + colon + 1;
    const char* e = s.data() + s.size();
    auto [p, ec] = std::from_chars(b, e, d.index);
    if (ec != std::errc() || p != e || b == e || d.index < 0) fail("bad device index in '{}'", s);
    if (d.kind == DeviceKind::cpu && d.index != 0) fail("there is one CPU device: 'cpu' (got '{}')", s);
  }
  return d;
}

std::string DeviceId::str() const {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda:" + std::to_string(index);
    case DeviceKind::opencl: return "opencl:" + std::to_string(index);
  }
  return "?";
}

Backend::~Backend() = default;  // scratch_ is already gone (drop_scratch)

void Backend::matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs) {
  for (const MatmulJob& j : jobs) matmul(*j.w, x, m, j.y, j.ldy);
}

void Backend::matmul_act(const Weight& w, const Act& x, float* y, int64_t ldy) {
  matmul(w, x.x, x.rows, y, ldy);
}

void Backend::matmuls_act(const Act& x, std::span<const MatmulJob> jobs) { matmuls(x.x, x.rows, jobs); }

Act Backend::add_rmsnorm(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n,
                         float eps) {
  if (d) add(d, x, x, rows * n);
  rmsnorm(x, w, y, rows, n, eps);
  return Act::of(y, rows, n);
}

Act Backend::gated_delta_net_act(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                 float* conv_state, float* ssm_state, float* out) {
  gated_delta_net(s, p, in, conv_state, ssm_state, out);
  return Act::of(out, in.n_tokens, s.value_dim());
}

Act Backend::gated_delta_net_rows(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                  std::span<const GdnSlotState> states, float* out) {
  const int64_t CD = s.conv_dim(), VD = s.value_dim(), Hv = s.n_v_heads;
  if ((int64_t)states.size() != in.n_tokens)
    fail("gated_delta_net_rows: {} rows but {} states", in.n_tokens, states.size());
  for (int64_t r = 0; r < in.n_tokens; ++r) {
    const GdnLayerInputs row{.qkv = in.qkv + r * CD,
                             .z = in.z + r * VD,
                             .alpha = in.alpha + r * Hv,
                             .beta = in.beta + r * Hv,
                             .n_tokens = 1};
    gated_delta_net(s, p, row, states[r].conv, states[r].ssm, out + r * VD);
  }
  return Act::of(out, in.n_tokens, VD);
}

void Backend::qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm, const int32_t* pos,
                           int64_t n_tokens, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_rot,
                           float freq_base, float freq_scale, RopeMode mode, float eps) {
  if (q_norm) rmsnorm(q, q_norm, q, n_tokens * n_head, head_dim, eps);
  if (k_norm) rmsnorm(k, k_norm, k, n_tokens * n_head_kv, head_dim, eps);
  rope(q, pos, n_tokens, n_head, head_dim, n_rot, freq_base, freq_scale, mode);
  rope(k, pos, n_tokens, n_head_kv, head_dim, n_rot, freq_base, freq_scale, mode);
}

void Backend::qk_norm_rope_store_kv(float* q, float* k, const float* v, const QkPrep& p, int64_t n_tokens,
                                    int64_t n_head, int64_t n_head_kv, int64_t head_dim, void* kc,
                                    DType k_type, void* vc, DType v_type) {
  qk_norm_rope(q, k, p.q_norm, p.k_norm, p.pos, n_tokens, n_head, n_head_kv, head_dim, p.n_rot, p.freq_base,
               p.freq_scale, p.mode, p.eps);
  store_kv(k, kc, n_tokens * n_head_kv * head_dim, k_type);
  store_kv(v, vc, n_tokens * n_head_kv * head_dim, v_type);
}

void Backend::moe_ffn_add(const MoeFfn& m, const Act& x, float* y) {
  const int64_t E = m.n_embd, n = x.rows;
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* t = ar.take<float>(n * E);
  moe_ffn_whole(m, x, t);
  add(t, y, y, n * E);
  ar.release(mark);
}

void Backend::moe_ffn_whole(const MoeFfn& m, const Act& x, float* out) {
  moe_ffn(m, x.x, x.rows, out);
  if (m.shared_up) add_shared_expert(m, x, out);
}

Act Backend::add_rmsnorm_moe_ffn_add(const MoeFfn& m, const float* d, float* x, const float* w, float* cur,
                                     int64_t n, const float* next_w, const PartialSum* d_parts) {
  if (d_parts) decode_fusions()->sum_parts(*d_parts);  // only a backend with DecodeFusions makes parts
  const Act c = add_rmsnorm(d, x, w, cur, n, m.n_embd, m.rms_eps);
  moe_ffn_add(m, c, x);
  return next_w ? rmsnorm_act(x, next_w, cur, n, m.n_embd, m.rms_eps) : Act{};
}

void Backend::add_shared_expert(const MoeFfn& m, const Act& x, float* out) {
  const int64_t E = m.n_embd, Fs = m.n_ff_shared, n = x.rows;
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* gate = ar.take<float>(n * Fs);
  float* up = ar.take<float>(n * Fs);
  float* sh_out = ar.take<float>(n * E);
  float* sh_g = ar.take<float>(n);
  Weight gate_vec = m.shared_gate_inp;  // [n_embd] as a 1-row matrix
  gate_vec.ne[0] = E;
  gate_vec.ne[1] = 1;
  const MatmulJob jobs[] = {{&m.shared_gate, gate}, {&m.shared_up, up}, {&gate_vec, sh_g}};
  matmuls(x, jobs);
  swiglu(gate, up, gate, n * Fs);
  matmul(m.shared_down, gate, n, sh_out);
  add_sigmoid_scaled(out, sh_out, sh_g, n, E);
  ar.release(mark);
}

Arena& Backend::scratch() {
  if (!scratch_) scratch_ = std::make_unique<Arena>(*this);
  return *scratch_;
}

void Backend::drop_scratch() { scratch_.reset(); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    b_ = o.b_;
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

void DeviceBuffer::release() {
  if (p_) b_->dealloc(p_);
  p_ = nullptr;
  n_ = 0;
}

namespace {
constexpr size_t kAlign = 256;  // what GPUs want for vector loads; also a cache line multiple on CPUs
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void* Arena::take_bytes(size_t bytes) {
  bytes = round_up(std::max<size_t>(bytes, 1));
  if (spill_.empty() && used_ + bytes <= buf_.size()) {
    void* p = static_cast<uint8_t*>(buf_.data()) + used_;
    used_ += bytes;
    peak_ = std::max(peak_, used_);
    return p;
  }
  // Out of room: a separate chunk for this pass (the main buffer keeps its addresses); reset() grows the
  // main buffer to the pass's peak so the next pass needs no spill.
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  spill_.emplace_back(b_, bytes);
  return spill_.back().data();
}

void Arena::reset() {
  if (!spill_.empty()) {
    spill_.clear();
    buf_ = DeviceBuffer();  // free first: a GPU may not hold both
    buf_ = DeviceBuffer(b_, round_up(peak_ + peak_ / 8));
    ++generation_;
    log::debug("{}: scratch grown to {:.1f} MiB", b_.name(), buf_.size() / 1048576.0);
  }
  used_ = 0;
}

void Backend::upload_weight(void* dst, const Weight& w) { copy_from_host(dst, w.data, w.n_bytes); }

void copy_between(Backend& from, const void* src, Backend& to, void* dst, size_t bytes) {
  if (&from == &to) return to.copy(dst, src, bytes);
  if (from.is_host()) return to.copy_from_host(dst, src, bytes);
  if (to.is_host()) return from.copy_to_host(dst, src, bytes);
  std::vector<uint8_t> staging(bytes);
  from.copy_to_host(staging.data(), src, bytes);
  to.copy_from_host(dst, staging.data(), bytes);
  to.synchronize();  // `staging` goes away
}

}  // namespace xpert
