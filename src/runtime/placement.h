// Where a model runs: device selection for the CLI and the server (--device, -ngl), and the placement of
// MoE experts between the GPU and the expert device (--num-gpu-experts, --gpu-expert-budget,
// --expert-device, --expert-profile; see runtime/experts/plan.h).
#pragma once
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "runtime/experts/plan.h"

namespace xpert {

class Model;

int cuda_device_count();  // 0 when the build has no CUDA or the machine no GPU

struct PlacementOptions {
  std::string device = "";   // "", "cpu", "cuda:N"; "": the first GPU when there is one, else the CPU
  int64_t n_gpu_layers = -1; // the last N layers on the GPU (llama.cpp's -ngl); -1: all
  // Heterogeneous experts. Neither count given: every expert of a GPU layer is on the GPU.
  int64_t num_gpu_experts = -1;      // per GPU MoE layer (KTransformers' --kt-num-gpu-experts); -1: not given
  std::string gpu_expert_budget = "";  // bytes of experts on the GPU over all its layers ("12GiB", "800MiB"); "": not given
  // Where the other experts run: "cpu", "opencl:N", or "opencl:N,cpu" (both, sharing each batch's host experts).
  std::string expert_device = "cpu";
  // With both: the OpenCL device's share of the host experts' rows ("0.4" or "decode,prefill"); "": measured
  // on this machine (runtime/experts/executor_share.h).
  std::string expert_share = "";
  // Routing profile choosing which experts go to the GPU: "" = <model>.xpert-profile.json when it exists
  // (ignored with a warning when it belongs to another model), "none" = index order, else a file that must
  // match the model.
  std::string expert_profile = "";
  // Batches of at least this many tokens copy a split layer's host experts to the GPU rather than
  // computing them on the CPU (prefill); 0: never; -1: the backend's default.
  int64_t stream_experts = -1;
  // Smaller batches copy this share of the host experts they use while the CPU computes the rest;
  // -1 (StreamShare::kAuto, the default): as many as balance the measured copy and CPU rates.
  double stream_share = -1;
  size_t gpu_extra_bytes = 0;  // what else the GPU will hold (KV cache, scratch): counted in the fit check
};

// The plan the options give for this model on this machine, without placing anything (the GPU is opened
// only to read its free memory). Throws Error for a device that does not exist, contradictory flags, or a
// plan that does not fit the GPU. For `xpert info`.
ExpertPlan plan_placement(const Model& m, const PlacementOptions& o);

// Whether every executor of the experts these options place reads GPTQ experts natively: the CPU, an OpenCL
// expert device and the CUDA backend's MoE kernels do; the OpenCL backend that runs whole layers
// (--device opencl:N with GPU layers) does not. A model wholly on a CUDA GPU (none of -ngl,
// --num-gpu-experts, --gpu-expert-budget) keeps the repack: CUDA's native decode is slower (placement.cpp). Then a GPTQ folder's experts load in their native types
// (Model::LoadOptions), else as the Q4_0 repack. False for options that plan_placement would refuse.
bool native_gptq_experts(const PlacementOptions& o);

// Plans as above, logs the plan, then offloads the model as it says; throws Error (before uploading
// anything) for a device that does not exist or a contradiction (-ngl with --device cpu, -ngl without a
// GPU), bad expert flags, or a plan that does not fit.
ExpertPlan place_model(Model& m, const PlacementOptions& o);

}  // namespace xpert
