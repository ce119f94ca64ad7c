#include "backend/opencl/expert_device.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "backend/opencl/kernels_expert.h"
#include "backend/opencl/program_cache.h"
#include "base/error.h"
#include "base/log.h"

namespace xpert::opencl {

namespace {

// Must match kernels_expert.h.
constexpr int kMvRows = 4, kTileRows = 16, kTileFeatures = 64;
constexpr size_t kPage = 4096;

// The activation quantizer a weight type is multiplied with, and the elements one work-item quantizes.
bool k_quant(DType t) { return t == DType::Q4_K || t == DType::Q6_K; }

const char* type_macro(DType t) {
  switch (t) {
    case DType::Q4_0: return "WT_Q4_0";
    case DType::Q8_0: return "WT_Q8_0";
    case DType::Q4_K: return "WT_Q4_K";
    case DType::Q6_K: return "WT_Q6_K";
    default: return nullptr;
  }
}

Kernel make_kernel(cl_program p, const char* name) {
  cl_int err = CL_SUCCESS;
  Kernel k(api().clCreateKernel(p, name, &err));
  if (err != CL_SUCCESS) throw_cl_error(err, "clCreateKernel", __FILE__, __LINE__);
  return k;
}

// Sets the arguments of k in order (buffers as cl_mem, numbers by value).
struct ArgSetter {
  cl_kernel k;
  cl_uint i = 0;
  template <typename T>
  ArgSetter& operator()(const T& v) {
    XP_CL(clSetKernelArg, k, i++, sizeof(T), &v);
    return *this;
  }
};

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// A device buffer that only grows.
struct Scratch {
  Mem mem;
  size_t bytes = 0;
  cl_mem ensure(cl_context ctx, size_t need) {
    if (need <= bytes && mem) return mem.get();
    const size_t n = std::max<size_t>(round_up(std::max(need, bytes * 3 / 2), 256), 256);
    cl_int err = CL_SUCCESS;
    Mem m(api().clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, nullptr, &err));
    if (err != CL_SUCCESS) throw_cl_error(err, "clCreateBuffer", __FILE__, __LINE__);
    mem = std::move(m);  // the old buffer is freed once the commands that use it are done
    bytes = n;
    return mem.get();
  }
};

// Int8 activations of rows x K (kernels_expert.h): quants, a scale per 32, a sum per 16.
struct Activations {
  Scratch q, d, s;
};

}  // namespace

ProgramText expert_program_text(DType t, KernelVariant variant, int lanes, int mv_features,
                                bool correctly_rounded_divide) {
  const char* macro = type_macro(t);
  if (!macro && !is_gptq(t))
    fail("the OpenCL expert kernels run Q4_0, Q8_0, Q4_K, Q6_K and native GPTQ-INT4 weights, not {}",
         dtype_name(t));
  const std::string type = macro ? fmt::format("-D{}", macro)
                                 : fmt::format("-DWT_GPTQ -DGPTQ_GROUP={}{}", gptq_group(t),
                                               gptq_has_zeros(t) ? " -DGPTQ_ZEROS" : "");
  std::string options = fmt::format("{} -DLANES={} -DMV_NR={}", type, lanes, mv_features);
  if (variant == KernelVariant::subgroup16) options += " -DSUBGROUP16";
  // Activation scales divide by amax: correctly rounded, they match the CPU's quantizer bit for bit.
  if (correctly_rounded_divide) options += " -cl-fp32-correctly-rounded-divide-sqrt";
  return {std::string(kExpertKernelSource), options};
}

const char* variant_name(KernelVariant v) {
  switch (v) {
    case KernelVariant::automatic: return "automatic";
    case KernelVariant::portable: return "portable";
    case KernelVariant::subgroup16: return "subgroup16";
  }
  return "?";
}

KernelVariant preferred_variant(const DeviceInfo& d) {
  const bool sg16 = d.intel_subgroups && d.intel_required_subgroup_size && d.has_sub_group_size(16);
  return sg16 ? KernelVariant::subgroup16 : KernelVariant::portable;
}

void Pending::wait() {
  if (!done_) return;
  const cl_event e = done_.get();
  const cl_int err = api().clWaitForEvents(1, &e);
  cl_int status = CL_COMPLETE;
  api().clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
  done_.reset();
  if (err != CL_SUCCESS || status < 0)
    fail("OpenCL: the expert kernels failed on the device ({})", error_name(err != CL_SUCCESS ? err : status));
}

bool Pending::ready() const {
  if (!done_) return true;
  cl_int status = CL_COMPLETE;
  api().clGetEventInfo(done_.get(), CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
  return status <= CL_COMPLETE;
}

struct ExpertDevice::Impl {
  DeviceInfo info;
  ExpertDeviceOptions opt;
  KernelVariant variant = KernelVariant::portable;
  int lanes = 1, mv_features = 1;  // LANES and MV_NR of the matrix-vector kernels
  Context ctx;
  Queue queue;

  struct TypeKernels {
    Program program;
    Kernel quantize_q8_0, quantize_q8_k, mv_gate_up, mv_down, mm_gate_up, mm_down;
  };
  std::map<DType, TypeKernels> kernels;

  // One 3-D expert tensor as the device sees it: expert slot s at buffer offset off + s * stride.
  struct Matrix {
    Mem buf;
    size_t off = 0, stride = 0;
    DType type = DType::F32;
    int64_t k = 0, n = 0;
  };
  struct Layer {
    Matrix gate, up, down;
    std::vector<int32_t> slot;  // expert -> slot, -1: not on this device
  };
  std::map<int, Layer> layers;
  size_t device_bytes = 0, host_view_bytes = 0;

  Scratch x, h, y, chunks_mv, chunks_mm;
  Activations xq, hq;
  std::vector<cl_int4> host_mv, host_mm;  // staging of the chunk tables (read by the queue asynchronously)
  Event last;                             // completion of the previous submission

  explicit Impl(int index, const ExpertDeviceOptions& o) : info(device_info(index)), opt(o) {
    variant = o.variant == KernelVariant::automatic ? preferred_variant(info) : o.variant;
    if (variant == KernelVariant::subgroup16 && preferred_variant(info) != KernelVariant::subgroup16)
      fail("opencl:{} ({}) cannot run the subgroup16 kernels: they need cl_intel_subgroups and "
           "cl_intel_required_subgroup_size with subgroup size 16",
           index, info.name);
    // A CPU runs a work-group as one thread: a whole row per work-item beats splitting it over lanes.
    // Subgroup16 on a CPU (PoCL) runs one feature per work-group: the work-group is then the subgroup
    // whatever way the implementation groups work-items; Intel GPUs form subgroups from the x-rows.
    if (variant == KernelVariant::subgroup16) lanes = 16, mv_features = info.is_cpu() ? 1 : 4;
    else if (info.is_cpu()) lanes = 1, mv_features = 32;
    else lanes = 16, mv_features = 4;

    cl_int err = CL_SUCCESS;
    const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)info.platform, 0};
    ctx = Context(api().clCreateContext(props, 1, &info.device, nullptr, nullptr, &err));
    if (err != CL_SUCCESS) throw_cl_error(err, "clCreateContext", __FILE__, __LINE__);
    queue = Queue(api().clCreateCommandQueueWithProperties(ctx.get(), info.device, nullptr, &err));
    if (err != CL_SUCCESS) throw_cl_error(err, "clCreateCommandQueueWithProperties", __FILE__, __LINE__);
  }

  ~Impl() {
    if (queue) api().clFinish(queue.get());
  }

  const TypeKernels& type_kernels(DType t) {
    if (auto it = kernels.find(t); it != kernels.end()) return it->second;
    const ProgramText text =
        expert_program_text(t, variant, lanes, mv_features, info.correctly_rounded_divide);
    TypeKernels k;
    k.program = build_program(ctx.get(), info, text.source, text.options);
    const cl_program p = k.program.get();
    k.quantize_q8_0 = make_kernel(p, "quantize_q8_0");
    k.quantize_q8_k = make_kernel(p, "quantize_q8_k");
    k.mv_gate_up = make_kernel(p, "mv_gate_up");
    k.mv_down = make_kernel(p, "mv_down");
    k.mm_gate_up = make_kernel(p, "mm_gate_up");
    k.mm_down = make_kernel(p, "mm_down");
    return kernels.emplace(t, std::move(k)).first->second;
  }

  Matrix make_matrix(const Weight& w, std::span<const int32_t> experts, std::vector<int32_t>& slot) {
    Matrix m;
    m.type = w.type;
    m.k = w.ne[0];
    m.n = w.ne[1];
    m.stride = row_bytes(w.type, w.ne[0]) * (size_t)w.ne[1];
    const int64_t n_expert = w.ne[2];
    cl_int err = CL_SUCCESS;
    if (opt.zero_copy && info.shares_host_memory()) {
      // The buffer spans whole pages around the tensor (zero-copy wants page-aligned host memory); the
      // mapping covers those pages, so nothing outside it is touched.
      const uintptr_t base = reinterpret_cast<uintptr_t>(w.data);
      const uintptr_t first = base / kPage * kPage, end = round_up(base + m.stride * (size_t)n_expert, kPage);
      if (end - first > info.max_alloc_bytes)
        fail("opencl:{}: an expert tensor of {} MiB is larger than the device's largest buffer ({} MiB)", info.index,
             (end - first) >> 20, info.max_alloc_bytes >> 20);
      m.buf = Mem(api().clCreateBuffer(ctx.get(), CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR, end - first,
                                       reinterpret_cast<void*>(first), &err));
      if (err != CL_SUCCESS) throw_cl_error(err, "clCreateBuffer(CL_MEM_USE_HOST_PTR)", __FILE__, __LINE__);
      m.off = base - first;
      host_view_bytes += m.stride * (experts.empty() ? (size_t)n_expert : experts.size());
      if (slot.empty()) {
        slot.assign(n_expert, -1);
        if (experts.empty()) std::fill(slot.begin(), slot.end(), 0);
        for (int32_t e : experts) slot[e] = 0;
        for (int64_t e = 0; e < n_expert; ++e)
          if (slot[e] >= 0) slot[e] = (int32_t)e;
      }
      return m;
    }
    // Copied once: the listed experts back to back.
    std::vector<int32_t> list(experts.begin(), experts.end());
    if (list.empty())
      for (int64_t e = 0; e < n_expert; ++e) list.push_back((int32_t)e);
    const size_t bytes = m.stride * list.size();
    if (bytes > info.max_alloc_bytes)
      fail("opencl:{}: {} experts of {} MiB are larger than the device's largest buffer ({} MiB)", info.index,
           list.size(), bytes >> 20, info.max_alloc_bytes >> 20);
    m.buf = Mem(api().clCreateBuffer(ctx.get(), CL_MEM_READ_ONLY, bytes, nullptr, &err));
    if (err != CL_SUCCESS) throw_cl_error(err, "clCreateBuffer", __FILE__, __LINE__);
    for (size_t i = 0; i < list.size(); ++i) {
      const Weight e = expert_matrix(w, list[i]);
      XP_CL(clEnqueueWriteBuffer, queue.get(), m.buf.get(), CL_TRUE, i * m.stride, m.stride, e.data, 0, nullptr,
            nullptr);
    }
    device_bytes += bytes;
    if (slot.empty()) {
      slot.assign(n_expert, -1);
      for (size_t i = 0; i < list.size(); ++i) slot[list[i]] = (int32_t)i;
    }
    return m;
  }

  void quantize(const TypeKernels& k, DType w_type, cl_mem src, Activations& a, int64_t rows, int64_t n) {
    const size_t elems = (size_t)(rows * n);
    const cl_mem q = a.q.ensure(ctx.get(), elems), d = a.d.ensure(ctx.get(), elems / 32 * 4),
                 s = a.s.ensure(ctx.get(), elems / 16 * 4);
    const bool kq = k_quant(w_type);
    const cl_kernel kern = kq ? k.quantize_q8_k.get() : k.quantize_q8_0.get();
    const cl_int items = (cl_int)(elems / (kq ? 256 : 32));
    ArgSetter{kern}(src)(q)(d)(s)(items);
    const size_t global = round_up((size_t)items, 64);
    XP_CL(clEnqueueNDRangeKernel, queue.get(), kern, 1, nullptr, &global, nullptr, 0, nullptr, nullptr);
  }

  void launch_mv(cl_kernel kern, int64_t n_out, size_t n_chunks) {
    const size_t global[3] = {(size_t)lanes * (size_t)((n_out + mv_features - 1) / mv_features), (size_t)mv_features,
                              n_chunks};
    const size_t local[3] = {(size_t)lanes, (size_t)mv_features, 1};
    XP_CL(clEnqueueNDRangeKernel, queue.get(), kern, 3, nullptr, global, local, 0, nullptr, nullptr);
  }

  void launch_mm(cl_kernel kern, int64_t n_out, size_t n_chunks) {
    const size_t global[2] = {round_up((size_t)n_out, kTileFeatures), n_chunks};
    const size_t local[2] = {(size_t)kTileFeatures, 1};
    XP_CL(clEnqueueNDRangeKernel, queue.get(), kern, 2, nullptr, global, local, 0, nullptr, nullptr);
  }

  Pending submit(int layer_id, std::span<const ExpertRows> tasks, const float* x_host, int64_t n_rows,
                 float* y_host) {
    auto it = layers.find(layer_id);
    if (it == layers.end()) fail("opencl:{}: layer {} has no experts on this device", info.index, layer_id);
    const Layer& L = it->second;
    const int64_t D = L.gate.k, F = L.gate.n;
    if (last) Pending(std::move(last)).wait();  // the staging vectors below are reused

    host_mv.clear();
    host_mm.clear();
    for (const ExpertRows& t : tasks) {
      if (t.expert < 0 || t.expert >= (int32_t)L.slot.size() || L.slot[t.expert] < 0)
        fail("opencl:{}: expert {} of layer {} is not on this device", info.index, t.expert, layer_id);
      XP_ASSERT(t.row0 >= 0 && t.n_rows >= 0 && t.row0 + t.n_rows <= n_rows);
      const bool tiled = t.n_rows >= opt.tiled_min_rows;
      const int32_t step = tiled ? kTileRows : kMvRows;
      for (int32_t r = 0; r < t.n_rows; r += step)
        (tiled ? host_mm : host_mv).push_back({{L.slot[t.expert], t.row0 + r, std::min(step, t.n_rows - r), 0}});
    }
    if (n_rows == 0 || (host_mv.empty() && host_mm.empty())) return {};

    const cl_context c = ctx.get();
    const cl_command_queue qu = queue.get();
    const cl_mem xb = x.ensure(c, (size_t)(n_rows * D) * 4), hb = h.ensure(c, (size_t)(n_rows * F) * 4),
                 yb = y.ensure(c, (size_t)(n_rows * D) * 4);
    cl_mem mvb = nullptr, mmb = nullptr;
    XP_CL(clEnqueueWriteBuffer, qu, xb, CL_FALSE, 0, (size_t)(n_rows * D) * 4, x_host, 0, nullptr, nullptr);
    if (!host_mv.empty()) {
      mvb = chunks_mv.ensure(c, host_mv.size() * sizeof(cl_int4));
      XP_CL(clEnqueueWriteBuffer, qu, mvb, CL_FALSE, 0, host_mv.size() * sizeof(cl_int4), host_mv.data(), 0, nullptr,
            nullptr);
    }
    if (!host_mm.empty()) {
      mmb = chunks_mm.ensure(c, host_mm.size() * sizeof(cl_int4));
      XP_CL(clEnqueueWriteBuffer, qu, mmb, CL_FALSE, 0, host_mm.size() * sizeof(cl_int4), host_mm.data(), 0, nullptr,
            nullptr);
    }

    const TypeKernels& kg = type_kernels(L.gate.type);
    const TypeKernels& kd = type_kernels(L.down.type);
    const cl_int k_d = (cl_int)D, n_f = (cl_int)F;
    const cl_ulong off_g = L.gate.off, off_u = L.up.off, off_d = L.down.off;
    const cl_ulong st_g = L.gate.stride, st_u = L.up.stride, st_d = L.down.stride;

    quantize(kg, L.gate.type, xb, xq, n_rows, D);
    const cl_mem xq_q = xq.q.mem.get(), xq_d = xq.d.mem.get(), xq_s = xq.s.mem.get();
    for (auto [kern, chunks, n] : {std::tuple{kg.mv_gate_up.get(), mvb, host_mv.size()},
                                   std::tuple{kg.mm_gate_up.get(), mmb, host_mm.size()}}) {
      if (n == 0) continue;
      ArgSetter{kern}(L.gate.buf.get())(L.up.buf.get())(off_g)(off_u)(st_g)(st_u)(k_d)(n_f)(chunks)(xq_q)(xq_d)(xq_s)(hb);
      if (kern == kg.mv_gate_up.get()) launch_mv(kern, F, n);
      else launch_mm(kern, F, n);
    }

    quantize(kd, L.down.type, hb, hq, n_rows, F);
    const cl_mem hq_q = hq.q.mem.get(), hq_d = hq.d.mem.get(), hq_s = hq.s.mem.get();
    for (auto [kern, chunks, n] : {std::tuple{kd.mv_down.get(), mvb, host_mv.size()},
                                   std::tuple{kd.mm_down.get(), mmb, host_mm.size()}}) {
      if (n == 0) continue;
      ArgSetter{kern}(L.down.buf.get())(off_d)(st_d)(n_f)(k_d)(chunks)(hq_q)(hq_d)(hq_s)(yb);
      if (kern == kd.mv_down.get()) launch_mv(kern, D, n);
      else launch_mm(kern, D, n);
    }

    // Rows no task names are left as they were in y_host: read back only the rows the tasks wrote.
    cl_event done = nullptr;
    std::vector<std::pair<int32_t, int32_t>> spans;
    for (const ExpertRows& t : tasks)
      if (t.n_rows > 0) spans.push_back({t.row0, t.row0 + t.n_rows});
    std::sort(spans.begin(), spans.end());
    std::vector<std::pair<int32_t, int32_t>> merged;
    for (auto s : spans) {
      if (!merged.empty() && s.first <= merged.back().second) merged.back().second = std::max(merged.back().second, s.second);
      else merged.push_back(s);
    }
    for (size_t i = 0; i < merged.size(); ++i) {
      const size_t off = (size_t)merged[i].first * D * 4, len = (size_t)(merged[i].second - merged[i].first) * D * 4;
      const bool final_read = i + 1 == merged.size();
      XP_CL(clEnqueueReadBuffer, qu, yb, CL_FALSE, off, len, reinterpret_cast<char*>(y_host) + off, 0, nullptr,
            final_read ? &done : nullptr);
    }
    XP_CL(clFlush, qu);
    last = Event(done);
    // The caller's Pending and `last` both refer to the read: retain one reference for each.
    XP_CL(clRetainEvent, done);
    return Pending(Event(done));
  }
};

ExpertDevice::ExpertDevice(int opencl_index, const ExpertDeviceOptions& options)
    : impl_(std::make_unique<Impl>(opencl_index, options)) {
  log::debug("opencl:{}: {} ({}), {} kernels, weights {}", opencl_index, impl_->info.name, impl_->info.driver_version,
             variant_name(impl_->variant),
             options.zero_copy && impl_->info.shares_host_memory() ? "read in place" : "copied to the device");
}

ExpertDevice::~ExpertDevice() = default;

const DeviceInfo& ExpertDevice::info() const { return impl_->info; }
KernelVariant ExpertDevice::variant() const { return impl_->variant; }
size_t ExpertDevice::device_bytes() const { return impl_->device_bytes; }
size_t ExpertDevice::host_view_bytes() const { return impl_->host_view_bytes; }

void ExpertDevice::add_layer(int layer, const Weight& gate, const Weight& up, const Weight& down,
                             std::span<const int32_t> experts) {
  const int64_t D = gate.ne[0], F = gate.ne[1], E = gate.ne[2];
  if (up.ne[0] != D || up.ne[1] != F || up.ne[2] != E || down.ne[0] != F || down.ne[1] != D || down.ne[2] != E)
    fail("opencl: layer {} expert shapes disagree: gate [{}, {}, {}], up [{}, {}, {}], down [{}, {}, {}] "
         "(expected up = gate, down = [n_ff, n_embd, n_expert])",
         layer, D, F, E, up.ne[0], up.ne[1], up.ne[2], down.ne[0], down.ne[1], down.ne[2]);
  if (gate.type != up.type)
    fail("opencl: layer {} has gate experts in {} but up experts in {} (the fused kernel needs one type)", layer,
         dtype_name(gate.type), dtype_name(up.type));
  for (int32_t e : experts)
    if (e < 0 || e >= E) fail("opencl: layer {} has no expert {} (it has {})", layer, e, E);
  impl_->type_kernels(gate.type);  // unsupported types fail here, before anything is copied
  impl_->type_kernels(down.type);
  Impl::Layer L;
  L.gate = impl_->make_matrix(gate, experts, L.slot);
  L.up = impl_->make_matrix(up, experts, L.slot);
  L.down = impl_->make_matrix(down, experts, L.slot);
  impl_->layers[layer] = std::move(L);
}

bool ExpertDevice::holds(int layer, int expert) const {
  auto it = impl_->layers.find(layer);
  return it != impl_->layers.end() && expert >= 0 && expert < (int)it->second.slot.size() &&
         it->second.slot[expert] >= 0;
}

Pending ExpertDevice::submit(int layer, std::span<const ExpertRows> tasks, const float* x, int64_t n_rows, float* y) {
  return impl_->submit(layer, tasks, x, n_rows, y);
}

void ExpertDevice::run(int layer, int expert, const float* x, int64_t m, float* y) {
  const ExpertRows t{.expert = expert, .row0 = 0, .n_rows = (int32_t)m};
  submit(layer, std::span(&t, 1), x, m, y).wait();
}

}  // namespace xpert::opencl
