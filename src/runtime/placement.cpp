// Opening a device by name, whichever backends this build has, and planning where the layers and the
// experts go.
#include "runtime/placement.h"

#include <filesystem>
#include <memory>
#include <optional>

#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/log.h"
#include "model/model.h"
#include "runtime/experts/routing_stats.h"

#ifdef XPERT_HAS_CUDA
#include "backend/cuda/device.h"
#endif
#include "backend/opencl/opencl_backend.h"
#ifdef XPERT_HAVE_OPENCL
#include "backend/opencl/expert_executor.h"
#else
namespace xpert {
std::shared_ptr<Backend> make_opencl_backend(int) {
  fail("this xpert was built without OpenCL (install Debian's opencl-headers and rebuild)");
}
}  // namespace xpert
#endif

namespace xpert {

#ifdef XPERT_HAS_CUDA
int cuda_device_count() { return (int)cuda::list_devices().size(); }
#else
int cuda_device_count() { return 0; }
std::shared_ptr<Backend> make_cuda_backend(int) {
  fail("this xpert was built without CUDA (no CUDA compiler was found at build time; install the CUDA toolkit "
       "and rebuild)");
}
#endif

namespace {

// The GPU the layers go to, or none (everything on the host).
std::optional<DeviceId> gpu_of(const PlacementOptions& o) {
  DeviceId dev;
  if (o.device.empty()) {
    if (o.n_gpu_layers == 0 || cuda_device_count() == 0) {
      if (o.n_gpu_layers > 0) fail("-ngl {} asks for GPU layers, but there is no GPU (cuda devices: 0)", o.n_gpu_layers);
      return std::nullopt;
    }
    dev = {.kind = DeviceKind::cuda, .index = 0};
  } else {
    dev = DeviceId::parse(o.device);
  }
  switch (dev.kind) {
    case DeviceKind::cpu:
      if (o.n_gpu_layers > 0) fail("--device cpu and -ngl {} contradict each other", o.n_gpu_layers);
      return std::nullopt;
    case DeviceKind::opencl:
    case DeviceKind::cuda: break;
  }
  return dev;
}

void check_expert_device(const std::string& s) {
  const DeviceId d = DeviceId::parse(s);
  switch (d.kind) {
    case DeviceKind::cpu: return;
    case DeviceKind::opencl:
#ifdef XPERT_HAVE_OPENCL
      return;
#else
      fail("--expert-device {}: this xpert was built without OpenCL (install Debian's opencl-headers and rebuild)",
           d.str());
#endif
    case DeviceKind::cuda:
      fail("--expert-device {}: the expert device runs the experts that are not on the GPU (cpu, later opencl:N); "
           "the GPU's share is set by --num-gpu-experts or --gpu-expert-budget",
           d.str());
  }
}

// The routing profile to place experts by, when the options split experts at all.
std::optional<RoutingStats> load_profile(const Model& m, const PlacementOptions& o, std::string& path) {
  if (o.expert_profile == "none") return std::nullopt;
  const ModelIdentity id = ModelIdentity::of(m);
  if (!o.expert_profile.empty()) {
    path = o.expert_profile;
    return RoutingStats::load(path, id);  // asked for by name: any problem is an error
  }
  path = RoutingStats::default_path(m.file().path());
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    return RoutingStats::load(path, id);
  } catch (const Error& e) {
    log::warn("ignoring the routing profile: {}; experts are placed by index", e.what());
    return std::nullopt;
  }
}

struct Placement {
  ExpertPlan plan;
  std::shared_ptr<Backend> gpu;  // opened when the plan has GPU layers
};

Placement plan(const Model& m, const PlacementOptions& o) {
  const ModelConfig& c = m.config();
  check_expert_device(o.expert_device);
  ExpertPlanOptions po;
  po.num_gpu_experts = o.num_gpu_experts;
  if (o.num_gpu_experts < -1) fail("--num-gpu-experts {}: expected 0 or more", o.num_gpu_experts);
  if (!o.gpu_expert_budget.empty()) po.gpu_expert_budget_bytes = (int64_t)parse_bytes(o.gpu_expert_budget, "--gpu-expert-budget");
  po.expert_device = o.expert_device;
  po.gpu_extra_bytes = o.gpu_extra_bytes;

  Placement p;
  const std::optional<DeviceId> dev = gpu_of(o);
  if (dev) {
    po.n_gpu_layers = o.n_gpu_layers < 0 ? c.n_layer : std::min(o.n_gpu_layers, c.n_layer);
    po.gpu = dev->str();
    if (po.n_gpu_layers > 0) {
      p.gpu = dev->kind == DeviceKind::opencl ? make_opencl_backend(dev->index) : make_cuda_backend(dev->index);
      po.gpu_free_bytes = p.gpu->free_memory();
    }
  }
  std::optional<RoutingStats> profile;
  if ((po.num_gpu_experts >= 0 || po.gpu_expert_budget_bytes >= 0) && c.n_expert > 0) {
    profile = load_profile(m, o, po.profile_path);
    if (profile) po.profile = &*profile;
  }
  p.plan = plan_experts(c, ModelBytes::of(m), po);
  return p;
}

}  // namespace

ExpertPlan plan_placement(const Model& m, const PlacementOptions& o) { return plan(m, o).plan; }

ExpertPlan place_model(Model& m, const PlacementOptions& o) {
  Placement p = plan(m, o);
  const int64_t n = p.plan.n_layer - p.plan.first_gpu_layer;
  std::string summary = p.plan.summary();
  if (!summary.empty() && summary.back() == '\n') summary.pop_back();
  const DeviceKind expert_kind = DeviceId::parse(o.expert_device).kind;
  if (n == 0) {
    log::debug("{}", summary);
#ifdef XPERT_HAVE_OPENCL
    if (expert_kind == DeviceKind::opencl && m.config().n_expert > 0) {
      auto exec = opencl::make_expert_executor(DeviceId::parse(o.expert_device).index);
      log::info("experts of every MoE layer on {}", exec->name());
      m.attach_expert_executor(std::move(exec));
    }
#endif
    return std::move(p.plan);
  }
  log::info("{}", summary);
  if (expert_kind == DeviceKind::opencl && m.config().n_expert > 0)
    fail("--expert-device {} with MoE layers on the GPU is not supported yet: the host's share of a GPU layer "
         "runs on the CPU; use --expert-device cpu, or -ngl 0 to run every MoE layer's experts on {}",
         o.expert_device, o.expert_device);
  // Split MoE layers: only the plan's experts go to the GPU; the others run on the host's threads.
  if (o.stream_experts < -1) fail("--stream-experts {}: expected 0 or more tokens", o.stream_experts);
  if (o.stream_share != -1 && (o.stream_share < 0 || o.stream_share > 1))
    fail("--stream-share {}: expected a share from 0 to 1", o.stream_share);
  if (SplitExperts* se = p.gpu->split_experts()) se->set_expert_streaming(o.stream_experts, o.stream_share);
  if (p.plan.splits_experts()) m.offload(std::move(p.gpu), n, &p.plan.gpu_experts);
  else m.offload(std::move(p.gpu), n);
  return std::move(p.plan);
}

}  // namespace xpert
