// An OpenCL device as the expert device of a MoE model (the KTransformers iGPU scenario): it holds the expert
// weights of some layers and runs "these rows of x through expert e" for a batch of (expert, rows) pairs,
// asynchronously, so the caller overlaps it with other work and waits on the result.
//
// Per expert (SwiGLU, as moe_ffn_reference): y[r] = down . (silu(gate . x[r]) * (up . x[r])), with x and the
// hidden state quantized to int8 per block as the CPU path does. Experts with few rows (decode) take the
// matrix-vector kernels with gate and up fused; experts with many rows (prefill) the tiled W4A8 kernels.
// Weight types: Q4_0 (and GPTQ-INT4 repacked to it), Q8_0, Q4_K, Q6_K, read in their GGUF block layout.
//
// Memory: on a device that shares host memory (iGPU, CPU) the weights are read in place from the caller's
// bytes (CL_MEM_USE_HOST_PTR over the mmap: the bytes must stay mapped while the device lives); on a
// discrete device the registered experts are copied once to device memory.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "backend/opencl/cl_api.h"
#include "backend/opencl/discovery.h"
#include "backend/opencl/program_cache.h"
#include "backend/tensor.h"

namespace xpert::opencl {

enum class KernelVariant {
  automatic,   // subgroup16 where the device offers it, else portable
  portable,    // core OpenCL C 1.2 (runs on Debian's PoCL, NVIDIA, any OpenCL 3.0 device)
  subgroup16,  // cl_intel_subgroups with a required subgroup size of 16 (Intel GPUs)
};
const char* variant_name(KernelVariant v);
// The expert kernels' program (kernels_expert.h) for weights of type t, as ExpertDevice builds it: LANES
// work-items a row, MV_NR rows a group.
ProgramText expert_program_text(DType t, KernelVariant variant, int lanes, int mv_features,
                                bool correctly_rounded_divide);
// What `automatic` picks on this device.
KernelVariant preferred_variant(const DeviceInfo& d);

struct ExpertDeviceOptions {
  KernelVariant variant = KernelVariant::automatic;
  bool zero_copy = true;      // read weights in place where the device shares host memory
  int tiled_min_rows = 8;     // an expert with at least this many rows in a batch uses the tiled kernels
};

// Rows [row0, row0 + n_rows) of a batch go through `expert`.
struct ExpertRows {
  int32_t expert = 0, row0 = 0, n_rows = 0;
};

// The completion of one ExpertDevice::submit. wait() returns once y is written (and throws if the device
// failed); destroying a Pending does not wait.
class Pending {
 public:
  Pending() = default;
  explicit Pending(Event e) : done_(std::move(e)) {}
  void wait();
  bool ready() const;

 private:
  Event done_;
};

class ExpertDevice {
 public:
  // opencl_index: N of `opencl:N` (DeviceId::index), the numbering of list_devices().
  explicit ExpertDevice(int opencl_index, const ExpertDeviceOptions& options = {});
  ~ExpertDevice();
  ExpertDevice(const ExpertDevice&) = delete;
  ExpertDevice& operator=(const ExpertDevice&) = delete;

  const DeviceInfo& info() const;
  KernelVariant variant() const;  // never automatic

  // Registers layer `layer`'s experts: 3-D tensors gate/up [n_embd, n_ff, n_expert], down [n_ff, n_embd,
  // n_expert] (MoeFfn::gate/up/down; expert e is expert_matrix(w, e)). `experts` lists those this device
  // runs (empty: all); only those are copied to a discrete device. Builds the kernels of the weight types on
  // first use (or loads them from the program cache). Throws Error on shapes or types it cannot run.
  void add_layer(int layer, const Weight& gate_exps, const Weight& up_exps, const Weight& down_exps,
                 std::span<const int32_t> experts = {});
  bool holds(int layer, int expert) const;

  size_t device_bytes() const;     // weight bytes copied to device memory
  size_t host_view_bytes() const;  // weight bytes read in place from host memory

  // Starts y[r] = expert(x[r]) for the rows of every task; x, y: [n_rows][n_embd] in host memory that must
  // stay valid (and y unread) until the returned Pending is waited for. One submission is in flight at a
  // time: a new submit first waits for the previous one.
  Pending submit(int layer, std::span<const ExpertRows> tasks, const float* x, int64_t n_rows, float* y);

  // One expert on m rows, blocking.
  void run(int layer, int expert, const float* x, int64_t m, float* y);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xpert::opencl
