// Model placement: which layers run on a GPU (llama.cpp's -ngl: the last N), with their weights copied
// once into its memory.
#include <algorithm>
#include <map>

#include "backend/backend.h"
#include "base/error.h"
#include "base/log.h"
#include "model/model.h"
#include "backend/experts.h"

namespace xpert {

Model::Model(std::unique_ptr<gguf::GGUFFile> file) : file_(std::move(file)) {}
Model::~Model() = default;

void for_each_weight(LayerWeights& l, const std::function<void(const char*, Weight&)>& fn) {
#define XP_W(f) \
  if (l.f) fn(#f, l.f);
  XP_W(attn_norm) XP_W(wq) XP_W(wk) XP_W(wv) XP_W(wo) XP_W(bq) XP_W(bk) XP_W(bv) XP_W(q_norm) XP_W(k_norm)
  XP_W(attn_post_norm) XP_W(ffn_norm) XP_W(ffn_gate) XP_W(ffn_up) XP_W(ffn_down) XP_W(ffn_post_norm)
  XP_W(ffn_gate_inp) XP_W(ffn_gate_exps) XP_W(ffn_up_exps) XP_W(ffn_down_exps)
  XP_W(ffn_gate_inp_shexp) XP_W(ffn_gate_shexp) XP_W(ffn_up_shexp) XP_W(ffn_down_shexp)
  XP_W(ssm_qkv) XP_W(ssm_gate) XP_W(ssm_conv1d) XP_W(ssm_dt) XP_W(ssm_a) XP_W(ssm_beta) XP_W(ssm_alpha)
  XP_W(ssm_norm) XP_W(ssm_out)
#undef XP_W
}

void Model::attach_expert_executor(std::shared_ptr<ExpertExecutor> exec, const ExecutorShare& share) {
  for (int64_t il = 0; il < config_.n_layer; ++il) {
    LayerWeights* l = nullptr;
    if (!layer_device(il)) l = &w_.layers[il];
    else if (dev_layers_[il].split) l = &dev_layers_[il];  // a GPU layer whose other experts are on the host
    if (!l || !(l->ffn_gate_exps || l->split)) continue;
    l->expert_exec = exec.get();
    l->expert_share = share;
  }
  expert_exec_ = std::move(exec);
}

std::vector<Backend*> Model::layer_devices() const {
  std::vector<Backend*> d(config_.n_layer);
  for (int64_t il = 0; il < config_.n_layer; ++il) d[il] = layer_device(il);
  return d;
}

size_t Model::offload(std::shared_ptr<Backend> dev, int64_t n_layers,
                      const std::vector<std::vector<bool>>* gpu_experts) {
  if (n_offloaded_) fail("the model is already placed ({} layers on {})", n_offloaded_, dev_->name());
  if (!dev || n_layers <= 0) return 0;
  const ModelConfig& c = config_;
  const int64_t n = std::min(n_layers, c.n_layer);
  size_t total = 0, in_place = 0;
  auto upload = [&](Weight& w) {
    if (!w || !w.n_bytes) return;
    if (dev->reads_host_weights() && reinterpret_cast<uintptr_t>(w.data) % 32 == 0) {
      in_place += w.n_bytes;  // the device reads it where it is
      return;
    }
    DeviceBuffer buf(*dev, w.n_bytes);
    dev->upload_weight(buf.data(), w);
    w.data = buf.data();
    total += w.n_bytes;
    dev_mem_.push_back(std::move(buf));
  };
  dev_layers_.resize(c.n_layer);
  try {
    splits_.resize(c.n_layer);
    for (int64_t il = c.n_layer - n; il < c.n_layer; ++il) {
      LayerWeights& l = dev_layers_[il];
      l = w_.layers[il];
      const std::vector<bool>* mask = gpu_experts && il < (int64_t)gpu_experts->size() ? &(*gpu_experts)[il] : nullptr;
      const bool split = l.ffn_gate_exps && mask && !mask->empty() &&
                         std::find(mask->begin(), mask->end(), false) != mask->end();
      if (split) {
        if ((int64_t)mask->size() != c.n_expert)
          fail("expert placement of layer {} names {} experts, the model has {}", il, mask->size(), c.n_expert);
        // Only the chosen experts travel, each as its own allocation; the rest stay in the mmap.
        auto sp = std::make_unique<ExpertSplit>();
        sp->on_device = *mask;
        sp->host_gate = w_.layers[il].ffn_gate_exps;
        sp->host_up = w_.layers[il].ffn_up_exps;
        sp->host_down = w_.layers[il].ffn_down_exps;
        sp->gate.assign(c.n_expert, nullptr);
        sp->up.assign(c.n_expert, nullptr);
        sp->down.assign(c.n_expert, nullptr);
        for (int64_t e = 0; e < c.n_expert; ++e) {
          if (!(*mask)[e]) continue;
          Weight g = expert_matrix(l.ffn_gate_exps, e), u = expert_matrix(l.ffn_up_exps, e),
                 d = expert_matrix(l.ffn_down_exps, e);
          upload(g), upload(u), upload(d);
          sp->gate[e] = g.data, sp->up[e] = u.data, sp->down[e] = d.data;
        }
        l.ffn_gate_exps.data = l.ffn_up_exps.data = l.ffn_down_exps.data = nullptr;
        l.split = sp.get();
        splits_[il] = std::move(sp);
      }
      for_each_weight(l, [&](const char*, Weight& w) { upload(w); });
    }
    {
      dev_io_.tok_embd = w_.tok_embd;  // the embedding lookup stays on the host
      dev_io_.output_norm = w_.output_norm;
      dev_io_.output = w_.output ? w_.output : w_.tok_embd;
      upload(dev_io_.output_norm);
      upload(dev_io_.output);
    }
    dev->synchronize();
  } catch (...) {
    dev_mem_.clear();
    dev_layers_.clear();
    splits_.clear();
    throw;
  }
  dev_ = std::move(dev);
  n_offloaded_ = n;
  log::info("offloaded {} of {} layers and the output to {}: {:.2f} GiB{}", n, c.n_layer, dev_->name(),
            total / double(1ull << 30),
            in_place ? fmt::format(" copied, {:.2f} GiB read in place from host memory",
                                   in_place / double(1ull << 30))
                     : "");
  return total;
}

bool Model::splits_experts() const {
  return std::any_of(splits_.begin(), splits_.end(), [](const auto& s) { return s != nullptr; });
}

size_t Model::move_experts(std::span<const ExpertMove> moves) {
  if (moves.empty()) return 0;
  const ModelConfig& c = config_;
  // Check the whole list first, on copies of the masks, so a bad list changes nothing.
  std::map<int64_t, std::vector<bool>> masks;
  for (const ExpertMove& m : moves) {
    if (m.layer < 0 || m.layer >= c.n_layer || !expert_split(m.layer))
      fail("expert move: layer {} is not a split MoE layer on the GPU", m.layer);
    if (m.evict < 0 || m.evict >= c.n_expert || m.admit < 0 || m.admit >= c.n_expert)
      fail("expert move in layer {}: evict {} / admit {} is out of range [0, {})", m.layer, m.evict, m.admit,
           c.n_expert);
    auto [it, fresh] = masks.try_emplace(m.layer, splits_[m.layer]->on_device);
    std::vector<bool>& on = it->second;
    if (!on[m.evict] || on[m.admit])
      fail("expert move in layer {}: expert {} must be on the GPU and expert {} on the host", m.layer, m.evict,
           m.admit);
    on[m.evict] = false;
    on[m.admit] = true;
  }
  dev_->synchronize();  // nothing in flight may still read the buffers that are overwritten
  size_t bytes = 0;
  for (const ExpertMove& m : moves) {
    ExpertSplit& sp = *splits_[m.layer];
    const LayerWeights& hw = w_.layers[m.layer];
    const Weight* host[3] = {&hw.ffn_gate_exps, &hw.ffn_up_exps, &hw.ffn_down_exps};
    std::vector<const void*>* dev[3] = {&sp.gate, &sp.up, &sp.down};
    // The device buffers are ours (dev_mem_); ExpertSplit shows them const to the backends.
    auto fill = [&](int32_t from) {
      for (int i = 0; i < 3; ++i) {
        const Weight src = expert_matrix(*host[i], from);
        dev_->upload_weight(const_cast<void*>((*dev[i])[m.evict]), src);
      }
      dev_->synchronize();
    };
    try {
      fill(m.admit);
    } catch (...) {
      // The evicted expert is still marked resident: put its own weights back if the device lets us.
      try {
        fill(m.evict);
      } catch (...) {
      }
      if (SplitExperts* se = dev_->split_experts()) se->on_experts_moved();
      throw;
    }
    for (int i = 0; i < 3; ++i) {
      bytes += expert_matrix(*host[i], m.admit).n_bytes;
      (*dev[i])[m.admit] = (*dev[i])[m.evict];
      (*dev[i])[m.evict] = nullptr;
    }
    sp.on_device[m.evict] = false;
    sp.on_device[m.admit] = true;
  }
  if (SplitExperts* se = dev_->split_experts()) se->on_experts_moved();
  return bytes;
}

}  // namespace xpert
