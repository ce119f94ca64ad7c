#include "runtime/experts/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>

#include "base/error.h"
#include "backend/experts.h"
#include "runtime/experts/routing_stats.h"

namespace xpert {

ModelBytes ModelBytes::of(const Model& m) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.host_weights();
  ModelBytes b;
  b.layers.resize(c.n_layer);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    LayerWeights l = w.layers[il];
    LayerBytes& lb = b.layers[il];
    for_each_weight(l, [&](const char* name, Weight& x) {
      const std::string_view n = name;
      if (n == "ffn_gate_exps" || n == "ffn_up_exps" || n == "ffn_down_exps") return;
      lb.dense += x.n_bytes;
    });
    if (l.ffn_gate_exps && l.ffn_up_exps && l.ffn_down_exps && c.n_expert > 0)
      lb.expert = expert_matrix(l.ffn_gate_exps, 0).n_bytes + expert_matrix(l.ffn_up_exps, 0).n_bytes +
                  expert_matrix(l.ffn_down_exps, 0).n_bytes;
  }
  b.embedding = w.tok_embd.n_bytes;
  b.output = w.output_norm.n_bytes + (w.output ? w.output.n_bytes : w.tok_embd.n_bytes);
  return b;
}

const char* expert_choice_name(ExpertChoice c) {
  switch (c) {
    case ExpertChoice::all:
      return "all";
    case ExpertChoice::index:
      return "index order";
    case ExpertChoice::frequency:
      return "routing frequency";
  }
  return "?";
}

int64_t ExpertPlan::n_gpu_experts(int64_t il) const {
  return std::count(gpu_experts[il].begin(), gpu_experts[il].end(), true);
}

bool ExpertPlan::splits_experts() const {
  for (int64_t il = first_gpu_layer; il < n_layer; ++il)
    if (moe_layer(il) && n_gpu_experts(il) < n_expert) return true;
  return false;
}

namespace {

// P(expert e is routed for a token) in layer il: measured on the profile, else uniform (k / n_expert).
struct RoutingOdds {
  const ModelConfig& c;
  const RoutingStats* profile;
  double operator()(int64_t il, int64_t e) const {
    if (profile) {
      const uint64_t total = profile->layer_total(il);
      if (total > 0) return (double)profile->count(il, e) * (double)c.n_expert_used / (double)total;
    }
    return (double)c.n_expert_used / (double)c.n_expert;
  }
  bool measured(int64_t il) const { return profile && profile->layer_total(il) > 0; }
};

}  // namespace

ExpertPlan plan_experts(const ModelConfig& c, const ModelBytes& bytes, const ExpertPlanOptions& o) {
  XP_ASSERT((int64_t)bytes.layers.size() == c.n_layer);
  XP_ASSERT(o.n_gpu_layers >= 0 && o.n_gpu_layers <= c.n_layer);
  const bool by_count = o.num_gpu_experts >= 0, by_budget = o.gpu_expert_budget_bytes >= 0;
  if (by_count && by_budget)
    fail(
        "--num-gpu-experts and --gpu-expert-budget both say how many experts go to the GPU; give one of "
        "them");
  if (by_count || by_budget) {
    const char* flag = by_count ? "--num-gpu-experts" : "--gpu-expert-budget";
    if (c.n_expert <= 0) fail("{}: the model ({}) has no routed experts", flag, c.arch);
    if (o.n_gpu_layers == 0)
      fail("{} places experts of GPU layers, but no layer runs on a GPU (-ngl 0 or no GPU)", flag);
    if (by_count && o.num_gpu_experts > c.n_expert)
      fail("--num-gpu-experts {} exceeds the model's {} experts per layer", o.num_gpu_experts, c.n_expert);
  }
  if (o.profile && (o.profile->n_layer() != c.n_layer || o.profile->n_expert() != c.n_expert))
    fail("the routing profile has {} layers x {} experts, the model {} x {}", o.profile->n_layer(),
         o.profile->n_expert(), c.n_layer, c.n_expert);

  ExpertPlan p;
  p.n_layer = c.n_layer;
  p.n_expert = c.n_expert;
  p.first_gpu_layer = c.n_layer - o.n_gpu_layers;
  p.gpu = o.gpu;
  p.expert_device = o.expert_device;
  p.gpu_free_bytes = o.gpu_free_bytes;
  p.gpu_weights_in_place = o.gpu_weights_in_place;
  p.gpu_extra_bytes = o.gpu_extra_bytes;
  const bool use_profile = o.profile && !o.profile->empty() && (by_count || by_budget);
  p.choice = !(by_count || by_budget) ? ExpertChoice::all
             : use_profile            ? ExpertChoice::frequency
                                      : ExpertChoice::index;
  if (use_profile) {
    p.profile_path = o.profile_path;
    p.profile_tokens = o.profile->max_tokens();
  }
  const RoutingOdds odds{c, use_profile ? o.profile : nullptr};
  p.gpu_experts.assign(c.n_layer, std::vector<bool>(std::max<int64_t>(c.n_expert, 0), false));
  p.expert_bytes.resize(c.n_layer);
  for (int64_t il = 0; il < c.n_layer; ++il)
    p.expert_bytes[il] = c.n_expert > 0 ? bytes.layers[il].expert : 0;

  auto moe_layer = [&](int64_t il) { return p.moe_layer(il); };
  if (!by_count && !by_budget) {
    for (int64_t il = p.first_gpu_layer; il < c.n_layer; ++il)
      if (moe_layer(il)) p.gpu_experts[il].assign(c.n_expert, true);
  } else if (by_count) {
    for (int64_t il = p.first_gpu_layer; il < c.n_layer; ++il) {
      if (!moe_layer(il)) continue;
      std::vector<int32_t> order(c.n_expert);
      std::iota(order.begin(), order.end(), 0);
      if (odds.measured(il)) order = o.profile->ranked(il);
      for (int64_t i = 0; i < o.num_gpu_experts; ++i) p.gpu_experts[il][order[i]] = true;
    }
  } else {
    struct Candidate {
      double score;  // P(routed) per byte
      int32_t e, il;
    };
    std::vector<Candidate> cand;
    for (int64_t il = p.first_gpu_layer; il < c.n_layer; ++il)
      if (moe_layer(il))
        for (int64_t e = 0; e < c.n_expert; ++e)
          cand.push_back({odds(il, e) / (double)bytes.layers[il].expert, (int32_t)e, (int32_t)il});
    // Without a profile the scores only differ by expert size; index order (round-robin over layers) is
    // the rule then, so the scores are not used.
    std::stable_sort(cand.begin(), cand.end(), [&](const Candidate& a, const Candidate& b) {
      if (use_profile && a.score != b.score) return a.score > b.score;
      return a.e != b.e ? a.e < b.e : a.il < b.il;
    });
    uint64_t used = 0;
    const uint64_t budget = (uint64_t)o.gpu_expert_budget_bytes;
    for (const Candidate& x : cand) {
      const size_t b = bytes.layers[x.il].expert;
      if (used + b > budget) continue;  // a smaller expert of another layer may still fit
      used += b;
      p.gpu_experts[x.il][x.e] = true;
    }
  }

  // Bytes per device and what the split is expected to save.
  p.host_bytes = bytes.embedding;
  double routed = 0, routed_gpu = 0;
  p.layer_gpu_share.assign(c.n_layer, -1.0);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerBytes& lb = bytes.layers[il];
    const bool gpu = p.layer_on_gpu(il);
    (gpu ? p.gpu_dense_bytes : p.host_bytes) += lb.dense;
    if (!moe_layer(il)) continue;
    double layer_routed = 0, layer_gpu = 0;
    for (int64_t e = 0; e < c.n_expert; ++e) {
      const double pe = odds(il, e);
      if (p.gpu_experts[il][e]) {
        p.gpu_expert_bytes += lb.expert;
        layer_gpu += pe;
      } else {
        p.host_expert_bytes += lb.expert;
        p.host_expert_bytes_per_token += pe * (double)lb.expert;
      }
      layer_routed += pe;
    }
    if (gpu && layer_gpu < layer_routed)
      p.gpu_stream_bytes = std::max(p.gpu_stream_bytes, (size_t)c.n_expert * lb.expert);
    if (gpu) {
      routed += layer_routed;
      routed_gpu += layer_gpu;
      if (odds.measured(il) || !use_profile) p.layer_gpu_share[il] = layer_gpu / layer_routed;
    }
  }
  p.host_bytes += p.host_expert_bytes;
  if (o.n_gpu_layers > 0)
    p.gpu_output_bytes = bytes.output;  // Model::offload takes the head along
  else
    p.host_bytes += bytes.output;
  if (routed > 0) p.gpu_routing_share = routed_gpu / routed;

  if (p.gpu_weights_in_place && o.gpu_free_bytes > 0 &&
      p.gpu_stream_bytes + p.gpu_extra_bytes > o.gpu_free_bytes)
    fail(
        "the placement needs {} on {} for its cache and scratch (its weights are read in place from host "
        "memory), but {} is free; lower -c or --parallel",
        format_bytes((double)(p.gpu_stream_bytes + p.gpu_extra_bytes)), p.gpu,
        format_bytes((double)o.gpu_free_bytes));
  if (!p.gpu_weights_in_place && o.gpu_free_bytes > 0 && p.gpu_bytes() > o.gpu_free_bytes) {
    const double fixed = (double)(p.gpu_dense_bytes + p.gpu_output_bytes + p.gpu_stream_bytes + p.gpu_extra_bytes);
    const double room = (double)o.gpu_free_bytes - fixed;
    std::string advice;
    if (room <= 0) {
      advice = fmt::format("even the dense weights of {} layers do not fit: lower -ngl", o.n_gpu_layers);
    } else if (p.gpu_expert_bytes > 0) {
      advice = fmt::format("room for {} of experts: try --gpu-expert-budget {}MiB, or lower -ngl",
                           format_bytes(room), (uint64_t)(room / 1048576.0));
    } else {
      advice = "lower -ngl";
    }
    fail("the placement needs {} on {} (dense {} + experts {} + output {}{}{}), but {} is free; {}",
         format_bytes((double)p.gpu_bytes()), p.gpu, format_bytes((double)p.gpu_dense_bytes),
         format_bytes((double)p.gpu_expert_bytes), format_bytes((double)p.gpu_output_bytes),
         p.gpu_stream_bytes ? fmt::format(" + expert staging {}", format_bytes((double)p.gpu_stream_bytes)) : "",
         p.gpu_extra_bytes ? fmt::format(" + cache and scratch {}", format_bytes((double)p.gpu_extra_bytes))
                           : "",
         format_bytes((double)o.gpu_free_bytes), advice);
  }
  return p;
}

std::string ExpertPlan::summary(bool per_layer) const {
  std::string s;
  const int64_t n_gpu = n_layer - first_gpu_layer;
  if (n_gpu == 0) {
    s += fmt::format("placement: all {} layers on the host (cpu)\n", n_layer);
  } else {
    s += fmt::format("placement: {} of {} layers on {}", n_gpu, n_layer, gpu);
    if (first_gpu_layer > 0)
      s += fmt::format(" (layers {}..{}; 0..{} on the host)", first_gpu_layer, n_layer - 1,
                       first_gpu_layer - 1);
    s += gpu_output_bytes ? ", output head too\n" : "\n";
  }
  int64_t moe_layers = 0, min_n = n_expert, max_n = 0;
  for (int64_t il = first_gpu_layer; il < n_layer; ++il) {
    if (!moe_layer(il)) continue;
    ++moe_layers;
    min_n = std::min(min_n, n_gpu_experts(il));
    max_n = std::max(max_n, n_gpu_experts(il));
  }
  if (n_expert > 0 && n_gpu > 0 && moe_layers > 0) {
    const std::string count = min_n == max_n ? fmt::format("{}", min_n) : fmt::format("{}..{}", min_n, max_n);
    s += fmt::format("  experts: {} of {} per GPU layer on {}", count, n_expert, gpu);
    if (choice == ExpertChoice::frequency)
      s += fmt::format(", by routing frequency (profile {}, {} tokens)", profile_path, profile_tokens);
    else if (choice == ExpertChoice::index)
      s += ", by index (no routing profile: `xpert profile` records one)";
    if (splits_experts() || first_gpu_layer > 0) s += fmt::format("; the rest on {}", expert_device);
    s += "\n";
  } else if (n_expert > 0) {
    s += fmt::format("  experts: all {} per layer on {}\n", n_expert, expert_device);
  }
  if (n_gpu > 0) {
    s += fmt::format("  {}: {} = dense {} + experts {} + output {}", gpu, format_bytes((double)gpu_bytes()),
                     format_bytes((double)gpu_dense_bytes), format_bytes((double)gpu_expert_bytes),
                     format_bytes((double)gpu_output_bytes));
    if (gpu_stream_bytes) s += fmt::format(" + expert staging {}", format_bytes((double)gpu_stream_bytes));
    if (gpu_extra_bytes) s += fmt::format(" + cache and scratch {}", format_bytes((double)gpu_extra_bytes));
    if (gpu_free_bytes) s += fmt::format(" ({} free)", format_bytes((double)gpu_free_bytes));
    if (gpu_weights_in_place) s += "; its weights read in place from host memory";
    s += "\n";
  }
  s += fmt::format("  host: {} read in place from the file", format_bytes((double)host_bytes));
  s += n_expert > 0 ? fmt::format(" (experts {})\n", format_bytes((double)host_expert_bytes)) : "\n";
  if (n_expert > 0 && (gpu_routing_share >= 0 || host_expert_bytes > 0)) {
    s += "  ";
    if (gpu_routing_share >= 0)
      s +=
          fmt::format("{:.1f} % of the GPU layers' routings served on {}{}; ", 100.0 * gpu_routing_share, gpu,
                      choice == ExpertChoice::frequency ? " (on the profile)" : " (if routing is uniform)");
    s += fmt::format("host experts read ≈ {} per decoded token\n", format_bytes(host_expert_bytes_per_token));
  }
  if (per_layer && n_expert > 0 && moe_layers > 0 && choice != ExpertChoice::all) {
    s += "  per GPU layer (experts on the GPU, share of routings):";
    int col = 0;
    for (int64_t il = first_gpu_layer; il < n_layer; ++il) {
      if (!moe_layer(il)) continue;
      if (col++ % 6 == 0) s += "\n   ";
      s += fmt::format(" {:>3}: {:>3}", il, n_gpu_experts(il));
      if (layer_gpu_share[il] >= 0) s += fmt::format(" ({:4.1f} %)", 100.0 * layer_gpu_share[il]);
    }
    s += "\n";
  }
  return s;
}

RebalancePlan plan_rebalance(const std::vector<std::vector<bool>>& resident,
                             const std::vector<std::vector<double>>& counts, const RebalanceOptions& o) {
  RebalancePlan plan;
  double total = 0, before = 0, gained = 0;
  for (size_t il = 0; il < resident.size(); ++il) {
    const std::vector<bool>& on = resident[il];
    if (on.empty() || il >= counts.size() || counts[il].empty()) continue;
    const std::vector<double>& n = counts[il];
    XP_ASSERT(n.size() == on.size());
    const double layer_total = std::accumulate(n.begin(), n.end(), 0.0);
    if (layer_total <= 0) continue;
    std::vector<int32_t> host, gpu;
    for (size_t e = 0; e < on.size(); ++e) (on[e] ? gpu : host).push_back((int32_t)e);
    double resident_sum = 0;
    for (int32_t e : gpu) resident_sum += n[e];
    total += layer_total;
    before += resident_sum;
    // Host experts most routed first (lower index on ties); resident ones least routed first (higher
    // index on ties: index-order placements keep the low indices).
    std::stable_sort(host.begin(), host.end(), [&](int32_t a, int32_t b) { return n[a] > n[b]; });
    std::sort(gpu.begin(), gpu.end(), [&](int32_t a, int32_t b) { return n[a] != n[b] ? n[a] < n[b] : a > b; });
    const double min_diff = o.min_gain * layer_total / (double)on.size();
    const size_t pairs = std::min({host.size(), gpu.size(), (size_t)std::max<int64_t>(0, o.max_moves_per_layer)});
    size_t moved = 0;
    for (; moved < pairs; ++moved) {
      const double in = n[host[moved]], out = n[gpu[moved]], diff = in - out;
      if (diff <= 0 || diff < min_diff || diff < o.min_z * std::sqrt(in + out)) break;
      plan.moves.push_back({.layer = (int64_t)il, .evict = gpu[moved], .admit = host[moved]});
      gained += diff;
    }
    plan.n_layers += moved > 0;
  }
  if (total > 0) {
    plan.gpu_share_before = before / total;
    plan.gpu_share_after = (before + gained) / total;
  }
  return plan;
}

uint64_t parse_bytes(const std::string& s, const char* what) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '.')) ++i;
  const std::string num = s.substr(0, i);
  std::string unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (char& ch : unit) ch = (char)std::tolower((unsigned char)ch);
  double v = 0;
  size_t used = 0;
  try {
    if (num.empty() || std::count(num.begin(), num.end(), '.') > 1) throw std::invalid_argument("");
    v = std::stod(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != num.size() || num.empty())
    fail("{}: '{}' is not a size (expected bytes, or a number with a unit: 800MiB, 12GiB, 1.5G)", what, s);
  double mul = 0;
  if (unit.empty() || unit == "b")
    mul = 1;
  else if (unit == "k" || unit == "kib")
    mul = 1024.0;
  else if (unit == "m" || unit == "mib")
    mul = 1048576.0;
  else if (unit == "g" || unit == "gib")
    mul = 1073741824.0;
  else if (unit == "t" || unit == "tib")
    mul = 1099511627776.0;
  else if (unit == "kb")
    mul = 1e3;
  else if (unit == "mb")
    mul = 1e6;
  else if (unit == "gb")
    mul = 1e9;
  else if (unit == "tb")
    mul = 1e12;
  else
    fail("{}: unknown unit '{}' in '{}' (KiB MiB GiB TiB or K M G T = powers of 1024; KB MB GB TB = of 1000)",
         what, s.substr(i), s);
  const double bytes = v * mul;
  if (!std::isfinite(bytes) || bytes >= 9.2e18) fail("{}: '{}' is too large", what, s);
  if (unit.empty() && num.find('.') != std::string::npos)
    fail("{}: '{}' bytes is not a whole number", what, s);
  return (uint64_t)std::llround(bytes);
}

std::string format_bytes(double bytes) {
  if (bytes >= 1073741824.0) return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
  if (bytes >= 1048576.0) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  if (bytes >= 1024.0) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{:.0f} B", bytes);
}

}  // namespace xpert
