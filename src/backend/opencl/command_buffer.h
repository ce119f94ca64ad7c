// Recorded command buffers (cl_khr_command_buffer): the kernels of a decode step recorded once and run again
// with one enqueue, the OpenCL form of a CUDA graph (OpenclBackend's PassGraphs, pass_graphs.cpp). Only where
// the device lists the extension; elsewhere every kernel is enqueued on its own.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "backend/opencl/cl_api.h"
#include "backend/opencl/discovery.h"

namespace xpert::opencl {

// The extension's entry points, from the device's platform. Own pointer types (the ABI, every argument a
// pointer or an integer): the headers' names for them changed between the extension's provisional versions.
struct CommandBufferApi {
  using Create = cl_command_buffer_khr(CL_API_CALL*)(cl_uint, const cl_command_queue*, const void*, cl_int*);
  using Finalize = cl_int(CL_API_CALL*)(cl_command_buffer_khr);
  using Release = cl_int(CL_API_CALL*)(cl_command_buffer_khr);
  using NDRange = cl_int(CL_API_CALL*)(cl_command_buffer_khr, cl_command_queue, const void*, cl_kernel,
                                       cl_uint, const size_t*, const size_t*, const size_t*, cl_uint,
                                       const cl_sync_point_khr*, cl_sync_point_khr*, void*);
  using Enqueue = cl_int(CL_API_CALL*)(cl_uint, cl_command_queue*, cl_command_buffer_khr, cl_uint,
                                       const cl_event*, cl_event*);
  Create create = nullptr;
  Finalize finalize = nullptr;
  Release release = nullptr;
  NDRange ndrange = nullptr;
  Enqueue enqueue = nullptr;

  // Loaded when the device lists cl_khr_command_buffer (DeviceInfo::command_buffer), the platform gives every
  // entry point and a queue of queue_props may record
  // (CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR); otherwise nullopt and why not in *why.
  static std::optional<CommandBufferApi> load(const DeviceInfo& device,
                                              cl_command_queue_properties queue_props, std::string* why);
};

// One command buffer on one queue: kernels recorded in order (each waits for the one before it), with the
// arguments they hold when recorded; finalized, it runs by enqueue as often as wanted.
class CommandBuffer {
 public:
  CommandBuffer(const CommandBufferApi& api, cl_command_queue q);
  ~CommandBuffer();
  CommandBuffer(const CommandBuffer&) = delete;
  CommandBuffer& operator=(const CommandBuffer&) = delete;

  void record(cl_kernel k, cl_uint dims, const size_t* global, const size_t* local);
  void finalize();
  void enqueue();
  size_t commands() const { return kernels_.size(); }

 private:
  CommandBufferApi api_;  // a copy: the backend may drop its own when a driver fails (pass_graphs.cpp)
  cl_command_queue q_;
  cl_command_buffer_khr buf_ = nullptr;
  cl_sync_point_khr last_ = 0;
  std::vector<Kernel> kernels_;  // retained: the backend may drop a kernel object the buffer still runs
};

}  // namespace xpert::opencl
