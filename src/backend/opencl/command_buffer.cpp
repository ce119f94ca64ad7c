#include "backend/opencl/command_buffer.h"

#include "base/error.h"

namespace xpert::opencl {

std::optional<CommandBufferApi> CommandBufferApi::load(const DeviceInfo& device,
                                                       cl_command_queue_properties queue_props,
                                                       std::string* why) {
  auto no = [&](std::string reason) -> std::optional<CommandBufferApi> {
    *why = std::move(reason);
    return std::nullopt;
  };
  if (!device.command_buffer) return no("no cl_khr_command_buffer");
  cl_command_queue_properties required = 0;
  if (api().clGetDeviceInfo(device.device, CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR,
                            sizeof required, &required, nullptr) != CL_SUCCESS)
    return no("cl_khr_command_buffer lists no required queue properties");
  if ((required & queue_props) != required)
    return no(fmt::format("cl_khr_command_buffer wants queue properties {:#x}", required));
  CommandBufferApi a;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
        api().clGetExtensionFunctionAddressForPlatform(device.platform, name));
    return fn != nullptr;
  };
  if (!get(a.create, "clCreateCommandBufferKHR") || !get(a.finalize, "clFinalizeCommandBufferKHR") ||
      !get(a.release, "clReleaseCommandBufferKHR") || !get(a.ndrange, "clCommandNDRangeKernelKHR") ||
      !get(a.enqueue, "clEnqueueCommandBufferKHR"))
    return no("the platform lists cl_khr_command_buffer without its entry points");
  return a;
}

CommandBuffer::CommandBuffer(const CommandBufferApi& api, cl_command_queue q) : api_(api), q_(q) {
  cl_int err = CL_SUCCESS;
  buf_ = api_.create(1, &q_, nullptr, &err);
  if (err != CL_SUCCESS || !buf_) throw_cl_error(err, "clCreateCommandBufferKHR", __FILE__, __LINE__);
}

CommandBuffer::~CommandBuffer() {
  if (buf_) api_.release(buf_);
}

void CommandBuffer::record(cl_kernel k, cl_uint dims, const size_t* global, const size_t* local) {
  // Commands of a buffer run in the order of their sync points, not of their recording: each waits for the
  // one before.
  cl_sync_point_khr point = 0;
  const cl_int err =
      api_.ndrange(buf_, nullptr, nullptr, k, dims, nullptr, global, local, kernels_.empty() ? 0 : 1,
                   kernels_.empty() ? nullptr : &last_, &point, nullptr);
  if (err != CL_SUCCESS) throw_cl_error(err, "clCommandNDRangeKernelKHR", __FILE__, __LINE__);
  last_ = point;
  XP_CL(clRetainKernel, k);
  kernels_.emplace_back(k);
}

void CommandBuffer::finalize() {
  const cl_int err = api_.finalize(buf_);
  if (err != CL_SUCCESS) throw_cl_error(err, "clFinalizeCommandBufferKHR", __FILE__, __LINE__);
}

void CommandBuffer::enqueue() {
  cl_int err = api_.enqueue(0, nullptr, buf_, 0, nullptr, nullptr);
  // Before the extension's version 0.9.8, a buffer still pending from its last enqueue may not be enqueued
  // again; the host read that run's output, but a driver may publish that before it retires the run.
  if (err == CL_INVALID_OPERATION) {
    XP_CL(clFinish, q_);
    err = api_.enqueue(0, nullptr, buf_, 0, nullptr, nullptr);
  }
  if (err != CL_SUCCESS) throw_cl_error(err, "clEnqueueCommandBufferKHR", __FILE__, __LINE__);
}

}  // namespace xpert::opencl
