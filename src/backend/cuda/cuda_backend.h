// An NVIDIA GPU as a Backend: device memory, one stream, the kernels of this folder. Created for
// `--device cuda:N` / `-ngl`; a model's offloaded layers run here (Model::offload).
#pragma once
#include <map>
#include <memory>

#include "backend/backend.h"

namespace xpert {

// Throws Error when the build has no CUDA or the device does not exist.
std::shared_ptr<Backend> make_cuda_backend(int device);

}  // namespace xpert
