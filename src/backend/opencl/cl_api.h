// The OpenCL API as xpert calls it. libOpenCL.so.1 (the ICD loader) is opened at run time instead of being
// linked, so one binary starts on every machine and can say what to install where OpenCL is missing.
// Every call goes through XP_CL, which throws xpert::Error naming the call, the error and file:line.
#pragma once
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <string>
#include <utility>

namespace xpert::opencl {

// clang-format off
#define XP_CL_FUNCTIONS(X)                                                                                  \
  X(clGetPlatformIDs) X(clGetPlatformInfo) X(clGetDeviceIDs) X(clGetDeviceInfo) X(clCreateContext)          \
  X(clReleaseContext) X(clCreateCommandQueueWithProperties) X(clReleaseCommandQueue) X(clCreateBuffer)      \
  X(clReleaseMemObject) X(clEnqueueWriteBuffer) X(clEnqueueReadBuffer) X(clEnqueueMapBuffer)                \
  X(clEnqueueUnmapMemObject) X(clEnqueueFillBuffer) X(clEnqueueCopyBuffer) X(clCreateProgramWithSource)     \
  X(clCreateProgramWithBinary) X(clBuildProgram) X(clGetProgramInfo) X(clGetProgramBuildInfo)               \
  X(clReleaseProgram) X(clCreateKernel) X(clReleaseKernel) X(clSetKernelArg) X(clEnqueueNDRangeKernel)      \
  X(clGetKernelWorkGroupInfo) X(clFinish) X(clFlush) X(clWaitForEvents) X(clRetainEvent) X(clReleaseEvent)  \
  X(clGetEventInfo) X(clGetEventProfilingInfo) X(clGetKernelInfo)                                           \
  X(clSVMAlloc) X(clSVMFree) X(clEnqueueSVMFree) X(clSetKernelArgSVMPointer) X(clEnqueueSVMMemcpy) X(clEnqueueSVMMemFill) \
  X(clRetainKernel) X(clGetExtensionFunctionAddressForPlatform)
// clang-format on

struct Api {
#define XP_CL_POINTER(f) decltype(&::f) f = nullptr;
  XP_CL_FUNCTIONS(XP_CL_POINTER)
#undef XP_CL_POINTER
};

// The loaded API, or nullptr when libOpenCL.so.1 cannot be opened (then loader_error() says why).
const Api* try_api();
const std::string& loader_error();
// The loaded API; throws Error (with what to install) when there is none.
const Api& api();

const char* error_name(cl_int err);
[[noreturn]] void throw_cl_error(cl_int err, const char* call, const char* file, int line);

}  // namespace xpert::opencl

// XP_CL(clFoo, args...): calls clFoo through the loaded API and throws on any error code.
#define XP_CL(fn, ...)                                                                                  \
  do {                                                                                                  \
    const cl_int xp_cl_err_ = ::xpert::opencl::api().fn(__VA_ARGS__);                                   \
    if (xp_cl_err_ != CL_SUCCESS) ::xpert::opencl::throw_cl_error(xp_cl_err_, #fn, __FILE__, __LINE__); \
  } while (0)

namespace xpert::opencl {

// Owner of one OpenCL object (cl_mem, cl_kernel, ...): released once, movable, not copyable.
template <typename T, auto Api::*Release>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  ~Handle() { reset(); }
  void reset() {
    if (h_) (try_api()->*Release)(h_);
    h_ = nullptr;
  }
  T get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }

 private:
  T h_ = nullptr;
};

using Context = Handle<cl_context, &Api::clReleaseContext>;
using Queue = Handle<cl_command_queue, &Api::clReleaseCommandQueue>;
using Mem = Handle<cl_mem, &Api::clReleaseMemObject>;
using Program = Handle<cl_program, &Api::clReleaseProgram>;
using Kernel = Handle<cl_kernel, &Api::clReleaseKernel>;
using Event = Handle<cl_event, &Api::clReleaseEvent>;

}  // namespace xpert::opencl
