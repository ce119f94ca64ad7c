// An OpenCL device as the ExpertExecutor of a model's host MoE layers (--expert-device opencl:N): the
// CPU routes and combines, the device runs the experts (opencl::ExpertDevice), with each layer's weights
// registered on first use (read in place on devices that share host memory).
#pragma once
#include <memory>

#include "backend/experts.h"

namespace xpert::opencl {

std::shared_ptr<ExpertExecutor> make_expert_executor(int opencl_index);

}  // namespace xpert::opencl
