// Host-side pieces of the CUDA op launchers that need the C++ compiler (fmt, through base/error.h).
#include "backend/cuda/ops_internal.h"

#include "base/error.h"

namespace xpert::cuda::detail {

void throw_error(const std::string& message) { throw Error(message); }

}  // namespace xpert::cuda::detail
