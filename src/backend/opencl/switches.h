// XPERT_OPENCL_OPTS: the OpenCL backend's measurement switches in one environment variable, a list of
// items separated by commas or colons (read when a backend is made), e.g. `fused=0:arg_cache=0:wide=0`:
//   fused=0      the plain ops instead of the fused decode forms (fused_ops.cpp)
//   tail=0       the MoE decode kernels' last work-groups neither route, round nor write the next norm
//   arg_cache=0  kernel arguments set before every launch (no kernel object per repeated argument set)
//   arg_sets=N   kernel objects kept per kernel (default 1024)
//   wide=0       K-quant blocks read a byte at a time, no block-at-a-time Q4_K / Q6_K matvec; the attention
//                kernels read the f16 cache with vload_halfN (not in 4- to 16-byte words)
//   mv_wg=N      work-items per matrix row in the matvecs (a power of two, 2..256; default 32 on a GPU,
//                4 on a CPU device)
//   mv_r=N       matrix rows per work-group of the fused matvecs (1, 2, 4, 8 or 16; default 4 on a GPU, 1 on
//                a CPU device)
//   subgroups=0  the matvecs' sums over a row's work-items through local memory even where those work-items
//                can be one subgroup (cl_intel_required_subgroup_size)
//   host_weights=0  weights copied to the device even where it reads host memory in place (a CPU
//                device, fine-grained system SVM)
//   graphs=0     decode steps enqueued kernel by kernel where the device offers command buffers
//                (cl_khr_command_buffer); XPERT_GRAPHS=0 turns off every backend's recorded steps
//   prefill=0    the earlier prefill products: the 64 x 32 gemm and the MoE routed on the host (prefill.cpp)
//   moe_bm=N     rows per tile of the grouped MoE prefill products (32 or 64; default 32)
//   ksplit=N     the dense prefill products' plan (backend_impl.h dense_plan, prefill.cpp gemm_tiled): 0
//                the device's (default: tiles that fill the compute units, split along k where they are too
//                few), 1 the earlier rule (never split), N > 1 32-row tiles in N slices of k (as far as k
//                has 256-element slices)
//   pt_bufs=N    the prefill tiles' steps in local memory: 1 (two barriers a step) or 2 (double buffered, one
//                barrier a step); default 2 for each form where the device has its local memory (the grouped
//                MoE tiles 40 KiB a work-group, the dense ones 48), else 1
//   nv_regs=N    the matmul programs' registers a work-item at most (-cl-nv-maxrregcount=N, 32..255; 0 the
//                compiler's choice) where the device offers NVIDIA's cl_nv_compiler_options (elsewhere an
//                error); default 128 there (decode kernels at higher occupancy: qwen3.5 tg128 +3 % on an
//                H100), nothing elsewhere
//   probe        log what an enqueue costs (at start; an SVM pointer, an int, a cl_mem argument)
//   stats        log enqueues and blocking calls per decode step, the step's host time in launches and its
//                wall time from read to read (at exit)
//   profile      log device time per kernel from profiling events (at exit)
// An unknown item or a bad value stops with a message naming it.
#pragma once

namespace xpert::opencl {

struct Switches {
  bool fused = true, tail = true, arg_cache = true, wide = true, prefill = true, graphs = true,
       host_weights = true, subgroups = true;
  int moe_bm = 32;
  int ksplit = 0;
  int pt_bufs = 0;   // 0: the device's (tile_bufs_for)
  int nv_regs = -1;  // -1: kNvRegs where offered; 0: the compiler's choice
  int arg_sets = 1024;
  int mv_wg = 0;  // 0: the device's default
  int mv_r = 0;   // 0: the device's default
  bool probe = false, stats = false, profile = false;
};

Switches read_switches();

}  // namespace xpert::opencl
