// Where a model runs: device selection for the CLI and the server (--device, -ngl).
#pragma once
#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace xpert {

class Model;

int cuda_device_count();  // 0 when the build has no CUDA or the machine no GPU

struct PlacementOptions {
  std::string device;        // "", "cpu", "cuda:N"; "": the first GPU when there is one, else the CPU
  int64_t n_gpu_layers = -1; // the last N layers on the GPU (llama.cpp's -ngl); -1: all
};

// Offloads the model as the options say; throws Error for a device that does not exist or a
// contradiction (-ngl with --device cpu, -ngl without a GPU).
void place_model(Model& m, const PlacementOptions& o);

}  // namespace xpert
