#include "backend/opencl/cl_api.h"

#include <dlfcn.h>


#include "base/error.h"

namespace xpert::opencl {

namespace {

struct Loaded {
  Api api;
  bool ok = false;
  std::string error;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    void* lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      r.error = fmt::format(
          "no OpenCL loader (libOpenCL.so.1: {}); on Debian/Ubuntu install ocl-icd-libopencl1 and a driver: "
          "intel-opencl-icd for Intel GPUs, pocl-opencl-icd for the CPU",
          why ? why : "not found");
      return r;
    }
    // Never dlclose'd: OpenCL objects may be released from static destructors.
#define XP_CL_LOAD(f)                                                                                    \
  r.api.f = reinterpret_cast<decltype(&::f)>(dlsym(lib, #f));                                            \
  if (!r.api.f) {                                                                                        \
    r.error = fmt::format("the OpenCL loader libOpenCL.so.1 lacks {} (an OpenCL 2.0+ loader is needed; " \
                          "install a current ocl-icd-libopencl1)",                                       \
                          #f);                                                                           \
    return r;                                                                                            \
  }
    XP_CL_FUNCTIONS(XP_CL_LOAD)
#undef XP_CL_LOAD
    r.ok = true;
    return r;
  }();
  return l;
}

}  // namespace

const Api* try_api() { return loaded().ok ? &loaded().api : nullptr; }
const std::string& loader_error() { return loaded().error; }

const Api& api() {
  if (!loaded().ok) throw Error(loaded().error);
  return loaded().api;
}

const char* error_name(cl_int err) {
  switch (err) {
#define XP_CL_ERR(e) \
  case e: return #e;
    XP_CL_ERR(CL_SUCCESS)
    XP_CL_ERR(CL_DEVICE_NOT_FOUND)
    XP_CL_ERR(CL_DEVICE_NOT_AVAILABLE)
    XP_CL_ERR(CL_COMPILER_NOT_AVAILABLE)
    XP_CL_ERR(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    XP_CL_ERR(CL_OUT_OF_RESOURCES)
    XP_CL_ERR(CL_OUT_OF_HOST_MEMORY)
    XP_CL_ERR(CL_PROFILING_INFO_NOT_AVAILABLE)
    XP_CL_ERR(CL_MEM_COPY_OVERLAP)
    XP_CL_ERR(CL_IMAGE_FORMAT_MISMATCH)
    XP_CL_ERR(CL_IMAGE_FORMAT_NOT_SUPPORTED)
    XP_CL_ERR(CL_BUILD_PROGRAM_FAILURE)
    XP_CL_ERR(CL_MAP_FAILURE)
    XP_CL_ERR(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    XP_CL_ERR(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    XP_CL_ERR(CL_COMPILE_PROGRAM_FAILURE)
    XP_CL_ERR(CL_LINKER_NOT_AVAILABLE)
    XP_CL_ERR(CL_LINK_PROGRAM_FAILURE)
    XP_CL_ERR(CL_DEVICE_PARTITION_FAILED)
    XP_CL_ERR(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
    XP_CL_ERR(CL_INVALID_VALUE)
    XP_CL_ERR(CL_INVALID_DEVICE_TYPE)
    XP_CL_ERR(CL_INVALID_PLATFORM)
    XP_CL_ERR(CL_INVALID_DEVICE)
    XP_CL_ERR(CL_INVALID_CONTEXT)
    XP_CL_ERR(CL_INVALID_QUEUE_PROPERTIES)
    XP_CL_ERR(CL_INVALID_COMMAND_QUEUE)
    XP_CL_ERR(CL_INVALID_HOST_PTR)
    XP_CL_ERR(CL_INVALID_MEM_OBJECT)
    XP_CL_ERR(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)
    XP_CL_ERR(CL_INVALID_IMAGE_SIZE)
    XP_CL_ERR(CL_INVALID_SAMPLER)
    XP_CL_ERR(CL_INVALID_BINARY)
    XP_CL_ERR(CL_INVALID_BUILD_OPTIONS)
    XP_CL_ERR(CL_INVALID_PROGRAM)
    XP_CL_ERR(CL_INVALID_PROGRAM_EXECUTABLE)
    XP_CL_ERR(CL_INVALID_KERNEL_NAME)
    XP_CL_ERR(CL_INVALID_KERNEL_DEFINITION)
    XP_CL_ERR(CL_INVALID_KERNEL)
    XP_CL_ERR(CL_INVALID_ARG_INDEX)
    XP_CL_ERR(CL_INVALID_ARG_VALUE)
    XP_CL_ERR(CL_INVALID_ARG_SIZE)
    XP_CL_ERR(CL_INVALID_KERNEL_ARGS)
    XP_CL_ERR(CL_INVALID_WORK_DIMENSION)
    XP_CL_ERR(CL_INVALID_WORK_GROUP_SIZE)
    XP_CL_ERR(CL_INVALID_WORK_ITEM_SIZE)
    XP_CL_ERR(CL_INVALID_GLOBAL_OFFSET)
    XP_CL_ERR(CL_INVALID_EVENT_WAIT_LIST)
    XP_CL_ERR(CL_INVALID_EVENT)
    XP_CL_ERR(CL_INVALID_OPERATION)
    XP_CL_ERR(CL_INVALID_GL_OBJECT)
    XP_CL_ERR(CL_INVALID_BUFFER_SIZE)
    XP_CL_ERR(CL_INVALID_MIP_LEVEL)
    XP_CL_ERR(CL_INVALID_GLOBAL_WORK_SIZE)
    XP_CL_ERR(CL_INVALID_PROPERTY)
    XP_CL_ERR(CL_INVALID_IMAGE_DESCRIPTOR)
    XP_CL_ERR(CL_INVALID_COMPILER_OPTIONS)
    XP_CL_ERR(CL_INVALID_LINKER_OPTIONS)
    XP_CL_ERR(CL_INVALID_DEVICE_PARTITION_COUNT)
    XP_CL_ERR(CL_INVALID_PIPE_SIZE)
    XP_CL_ERR(CL_INVALID_DEVICE_QUEUE)
    XP_CL_ERR(CL_INVALID_SPEC_ID)
    XP_CL_ERR(CL_MAX_SIZE_RESTRICTION_EXCEEDED)
    XP_CL_ERR(CL_PLATFORM_NOT_FOUND_KHR)
#undef XP_CL_ERR
    default: return "unknown OpenCL error";
  }
}

void throw_cl_error(cl_int err, const char* call, const char* file, int line) {
  fail("OpenCL: {} failed: {} ({}) at {}:{}", call, error_name(err), err, file, line);
}

}  // namespace xpert::opencl
