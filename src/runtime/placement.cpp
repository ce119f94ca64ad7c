// Opening a device by name, whichever backends this build has, and planning where the layers and the
// experts go.
#include "runtime/placement.h"

#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>

#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/log.h"
#include "model/model.h"
#include "runtime/experts/executor_share.h"
#include "runtime/experts/routing_stats.h"

#ifdef XPERT_HAS_CUDA
#include "backend/cuda/device.h"
#endif
#include "backend/opencl/opencl_backend.h"
#ifdef XPERT_HAVE_OPENCL
#include "backend/opencl/discovery.h"
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

// --expert-device: "cpu", "opencl:N", or both separated by a comma.
struct ExpertDevices {
  int opencl = -1;  // N of opencl:N; -1: none
  bool cpu = false;
};

ExpertDevices parse_expert_devices(const std::string& list) {
  ExpertDevices r;
  size_t begin = 0;
  while (true) {
    const size_t comma = list.find(',', begin);
    const std::string item = list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const DeviceId d = DeviceId::parse(item);
    switch (d.kind) {
      case DeviceKind::cpu:
        if (r.cpu) fail("--expert-device {}: cpu is named twice", list);
        r.cpu = true;
        break;
      case DeviceKind::opencl:
#ifdef XPERT_HAVE_OPENCL
        if (r.opencl >= 0) fail("--expert-device {}: one OpenCL expert device at most", list);
        r.opencl = d.index;
        break;
#else
        fail("--expert-device {}: this xpert was built without OpenCL (install Debian's opencl-headers and "
             "rebuild)",
             d.str());
#endif
      case DeviceKind::cuda:
        fail("--expert-device {}: the expert device runs the experts that are not on the GPU (cpu, opencl:N, or "
             "opencl:N,cpu); the GPU's share is set by --num-gpu-experts or --gpu-expert-budget",
             d.str());
    }
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return r;
}

// --expert-device and --expert-share, checked together before anything is loaded.
ExpertDevices check_expert_devices(const PlacementOptions& o) {
  const ExpertDevices d = parse_expert_devices(o.expert_device);
  if (!o.expert_share.empty()) {
    if (!(d.cpu && d.opencl >= 0))
      fail("--expert-share {} shares the host experts between an OpenCL device and the CPU: it needs "
           "--expert-device opencl:N,cpu (now {})",
           o.expert_share, o.expert_device);
    parse_executor_share(o.expert_share);
  }
  return d;
}

#ifdef XPERT_HAVE_OPENCL
// "cuda:N (PCI ...)" when OpenCL device `ocl` is the CUDA GPU that runs some of m's layers (the same PCI
// address), else "". Its experts would then take turns on that GPU with the layers' kernels: a rate measured
// with the GPU idle (executor_share.h) does not see that. (H200, qwen3-30b-a3b: NVIDIA's OpenCL beside CUDA +
// CPU took a 0.71 share and decoded 34.9 t/s where CUDA + CPU alone did 55.3, 2026-12-03.)
std::string gpu_of_layers(const Model& m, const PlacementOptions& o, int ocl) {
#ifdef XPERT_HAS_CUDA
  if (!m.layer_device(m.config().n_layer - 1)) return "";  // no layer on a GPU (offload takes the last N)
  const std::optional<DeviceId> dev = gpu_of(o);
  if (!dev || dev->kind != DeviceKind::cuda) return "";
  const std::string pci = opencl::device_info(ocl).pci_bus_id;
  if (pci.empty()) return "";
  for (const cuda::DeviceInfo& g : cuda::list_devices())
    if (g.index == dev->index && g.pci_bus_id == pci) return fmt::format("{} (PCI {})", dev->str(), pci);
#else
  (void)m, (void)o, (void)ocl;
#endif
  return "";
}
#endif

// The OpenCL expert device of --expert-device, when there is one and the model has experts on the host: the
// host experts of every MoE layer (host layers and split GPU layers) go to it, shared with the CPU when both
// are named. After offload. With the CPU beside it and no --expert-share, a device that is the GPU of the
// layers is left out (gpu_of_layers).
void attach_expert_device(Model& m, const PlacementOptions& o) {
  const ExpertDevices d = check_expert_devices(o);
#ifdef XPERT_HAVE_OPENCL
  const ModelConfig& c = m.config();
  if (d.opencl < 0 || c.n_expert == 0) return;
  int64_t first = -1;  // the first MoE layer with host experts
  for (int64_t il = 0; il < c.n_layer && first < 0; ++il)
    if (m.host_weights().layers[il].ffn_gate_exps && (!m.layer_device(il) || m.expert_split(il))) first = il;
  if (first < 0) return;  // every expert is on the GPU
  if (const std::string same = gpu_of_layers(m, o, d.opencl); !same.empty()) {
    if (d.cpu && o.expert_share.empty()) {
      log::info("host experts on the CPU alone: opencl:{} is {}, the GPU that runs the layers, where its experts "
                "would take turns with them (--expert-share gives it a share anyway)",
                d.opencl, same);
      return;
    }
    log::warn("--expert-device opencl:{} is {}, the GPU that runs the layers: its experts take turns with them "
              "there (--expert-device cpu may be faster)",
              d.opencl, same);
  }
  std::shared_ptr<ExpertExecutor> exec = opencl::make_expert_executor(d.opencl);
  ExecutorShare share;  // the device alone
  std::string why = "the device alone";
  if (d.cpu && !o.expert_share.empty()) {
    share = parse_executor_share(o.expert_share);
    why = fmt::format("decode {:.2f}, prefill {:.2f} of the rows (--expert-share)", share.decode, share.prefill);
  } else if (d.cpu) {
    ThreadPool pool(ThreadPool::default_threads());
    const ShareMeasurement sm =
        measure_executor_share(moe_ffn_args(c, m.host_weights().layers[first], first, nullptr), *exec, pool);
    share = sm.share;
    why = sm.summary();
  }
  log::info("host experts on {}{}: {}", exec->name(), d.cpu ? " and the CPU" : "", why);
  m.attach_expert_executor(std::move(exec), share);
#else
  (void)m;
#endif
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
  check_expert_devices(o);
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
      po.gpu_weights_in_place = p.gpu->reads_host_weights();
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

bool native_gptq_experts(const PlacementOptions& o) {
  // --expert-device "cpu", "opencl:N", "opencl:N,cpu": all have native GPTQ kernels.
  if (o.expert_device != "cpu" && o.expert_device.rfind("opencl:", 0) != 0) return false;
  try {
    const std::optional<DeviceId> gpu = gpu_of(o);
    // CUDA reads them natively too (cuda/moe_gptq.cu), but its decode kernels take ~1.8x the Q4_0 ones' time
    // a MoE layer at one token (H200, 2026-12-04): a model wholly on the GPU (no -ngl, no expert count or
    // budget) keeps the repack; split layers or experts, whose host share bounds the step, read ~9 % fewer
    // bytes natively, and more experts fit the GPU.
    const bool whole_gpu = o.n_gpu_layers < 0 && o.num_gpu_experts < 0 && o.gpu_expert_budget.empty();
    return !gpu || o.n_gpu_layers == 0 || (gpu->kind == DeviceKind::cuda && !whole_gpu);
  } catch (const Error&) {
    return false;
  }
}

ExpertPlan place_model(Model& m, const PlacementOptions& o) {
  Placement p = plan(m, o);
  const int64_t n = p.plan.n_layer - p.plan.first_gpu_layer;
  std::string summary = p.plan.summary();
  if (!summary.empty() && summary.back() == '\n') summary.pop_back();
  if (n == 0) {
    log::debug("{}", summary);
    attach_expert_device(m, o);
    return std::move(p.plan);
  }
  log::info("{}", summary);
  // Split MoE layers: only the plan's experts go to the GPU; the others run on the expert device.
  if (o.stream_experts < -1) fail("--stream-experts {}: expected 0 or more tokens", o.stream_experts);
  if (o.stream_share != -1 && (o.stream_share < 0 || o.stream_share > 1))
    fail("--stream-share {}: expected a share from 0 to 1", o.stream_share);
  if (SplitExperts* se = p.gpu->split_experts()) se->set_expert_streaming(o.stream_experts, o.stream_share);
  if (p.plan.splits_experts()) m.offload(std::move(p.gpu), n, &p.plan.gpu_experts);
  else m.offload(std::move(p.gpu), n);
  attach_expert_device(m, o);
  return std::move(p.plan);
}

}  // namespace xpert
