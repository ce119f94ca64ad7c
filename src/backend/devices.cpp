// Opening a device by name, whichever backends this build has.
#include "backend/devices.h"

#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/log.h"
#include "model/model.h"

#ifdef XPERT_HAS_CUDA
#include "backend/cuda/device.h"
#endif

namespace xpert {

#ifdef XPERT_HAS_CUDA
int cuda_device_count() { return (int)cuda::list_devices().size(); }
#else
int cuda_device_count() { return 0; }
std::shared_ptr<Backend> make_cuda_backend(int) {
  fail("this xpert was built without CUDA (no CUDA compiler was found at build time; install the CUDA toolkit "
       "and rebuild)");
}
#endif

void place_model(Model& m, const PlacementOptions& o) {
  DeviceId dev;
  if (o.device.empty()) {
    if (o.n_gpu_layers == 0 || cuda_device_count() == 0) {
      if (o.n_gpu_layers > 0) fail("-ngl {} asks for GPU layers, but there is no GPU (cuda devices: 0)", o.n_gpu_layers);
      return;
    }
    dev = {.kind = DeviceKind::cuda, .index = 0};
  } else {
    dev = DeviceId::parse(o.device);
  }
  switch (dev.kind) {
    case DeviceKind::cpu:
      if (o.n_gpu_layers > 0) fail("--device cpu and -ngl {} contradict each other", o.n_gpu_layers);
      return;
    case DeviceKind::opencl:
      fail("the whole model on {} is not supported yet; OpenCL devices run experts (--expert-device)", dev.str());
    case DeviceKind::cuda: break;
  }
  const int64_t n = o.n_gpu_layers < 0 ? m.config().n_layer : o.n_gpu_layers;
  if (n == 0) return;
  m.offload(make_cuda_backend(dev.index), n);
}

}  // namespace xpert
