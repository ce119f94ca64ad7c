// OpenCL C of the whole-model backend's probes (XPERT_OPENCL_OPTS probe, diagnostics.cpp): what an enqueue, a
// barrier across a launch's groups, a work-group's dependent steps and a kernel's code fetch cost on this
// device. Nothing a model runs.
//
// kProbeSource (appended to the ops program, after kFusedOpsSource):
//   empty_kernel(16), empty_kernel_int
//                       nothing (with 1 or 16 arguments, an int alone): what one enqueue costs.
//   grid_sync_probe     rounds of a barrier across every group of one launch (grid_sync), and whether plain
//                       loads after it see what other groups wrote before it.
//   floor_chain, floor_fence, floor_gbarrier, floor_lbarrier, floor_atomic
//                       n steps of one dependent chain in one work-group.
// kProbeCodeSource (a program of its own): floor_code0..7, floor_loop0..7, below.
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kProbeSource = R"CLC(
// A barrier across every work-group of a launch whose groups are all resident at once (a persistent launch):
// cnt[0] counts arrivals, cnt[1] is the generation. A group that waits more than 1 << 22 polls gives up and
// sets cnt[2], after which no group waits (a launch of more groups than fit at once would otherwise hang
// the device). Only the probe uses it: moe_gate_up and moe_down_add as two phases of one persistent launch
// lost on an H100 (qwen3 tg128 -10 % at 2 groups an SM, -2 % at 4; 6 were not all resident; 2026-12-06,
// docs/perf-history/opencl.md): the phases need more warps in flight than a launch can count on resident.
void grid_sync(volatile global int* cnt, int groups) {
  mem_fence(CLK_GLOBAL_MEM_FENCE);
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  if (get_local_id(0) == 0 && get_local_id(1) == 0) {
    const int gen = cnt[1];
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    if (atomic_inc(cnt) == groups - 1) {
      atomic_xchg(cnt, 0);
      mem_fence(CLK_GLOBAL_MEM_FENCE);
      atomic_inc(cnt + 1);
    } else {
      int polls = 0;
      while (cnt[1] == gen && !cnt[2] && ++polls < (1 << 22)) {}
      if (polls >= (1 << 22)) cnt[2] = 1;
    }
    mem_fence(CLK_GLOBAL_MEM_FENCE);
  }
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
}

// XPERT_OPENCL_OPTS probe: `rounds` rounds of (each group writes data[g], grid_sync, reads its neighbour's
// with a plain load, grid_sync); bad[g]: the reads that saw a value from before the barrier.
kernel void grid_sync_probe(volatile global int* cnt, global int* data, global int* bad, int rounds) {
  const int g = get_group_id(0), G = get_num_groups(0), lid = get_local_id(0);
  int errs = 0;
  for (int r = 0; r < rounds; ++r) {
    if (lid == 0) data[g] = r * G + g;
    grid_sync(cnt, G);
    const int o = (g + 1) % G;
    if (lid == 0 && data[o] != r * G + o) ++errs;
    grid_sync(cnt, G);
  }
  if (lid == 0) bad[g] = errs;
}

// XPERT_OPENCL_OPTS probe, the floors of a work-group's dependent chains (probe_floors): n steps of each, one
// kernel per kind (PoCL wants no barrier under a branch).
//   floor_chain     one work-item's dependent loads (p[i] the next index, from p[start] on)
//   floor_fence     a global store, then a global fence
//   floor_gbarrier  a global store, then a barrier of the group's 64 with a global fence
//   floor_lbarrier  a local store, a barrier, a neighbour's value read, a barrier
//   floor_atomic    one work-item's atomic adds, each waiting for the last one's result
kernel void floor_chain(global const int* p, int start, int n, global int* out) {
  int i = start;
  for (int j = 0; j < n; ++j) i = p[i];
  out[0] = i;
}
kernel void floor_fence(volatile global int* x, int n) {
  const int lid = get_local_id(0);
  for (int j = 0; j < n; ++j) {
    x[lid] = j;
    mem_fence(CLK_GLOBAL_MEM_FENCE);
  }
}
kernel void floor_gbarrier(volatile global int* x, int n) {
  const int lid = get_local_id(0);
  for (int j = 0; j < n; ++j) {
    x[lid] = j;
    barrier(CLK_GLOBAL_MEM_FENCE);
  }
}
kernel void floor_lbarrier(global int* out, int n) {
  local int l[64];
  const int lid = get_local_id(0);
  int v = 0;
  for (int j = 0; j < n; ++j) {
    l[lid] = v + j;
    barrier(CLK_LOCAL_MEM_FENCE);
    v += l[(lid + 1) % 64];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  out[lid] = v;
}
kernel void floor_atomic(volatile global int* c, int n, global int* out) {
  int v = 0;
  for (int j = 0; j < n; ++j) v = atomic_add(c, (v & 1) + 1);
  out[0] = v;
}

kernel void empty_kernel(global float* x) {}
kernel void empty_kernel_int(int i) {}
kernel void empty_kernel16(global float* a, global float* b, global float* c, global float* d, global float* e,
                           global float* f, global float* g, global float* h, int i0, int i1, int i2, int i3, int i4,
                           int i5, int i6, float x) {}
)CLC";

// XPERT_OPENCL_OPTS probe alone builds this program (probe_code): what fetching a kernel's code costs. The
// decode kernels are tens of KB of mostly straight-line code each (their loads unrolled to be in flight
// together), run once a launch by a few warps an SM.
//   floor_code0..7  2,048 multiply-adds a work-item (512 rounds of a float4's), unrolled: ~32 KB of
//                   straight-line code; eight copies, so a launch need not find its code where the last left
//                   it
//   floor_loop0..7  the same arithmetic as a loop over n rounds of 8 (n = 64): a few hundred bytes of code
inline constexpr std::string_view kProbeCodeSource = R"CLC(
#define FC1 x = fma(x, a, b);
#define FC8 FC1 FC1 FC1 FC1 FC1 FC1 FC1 FC1
#define FC64 FC8 FC8 FC8 FC8 FC8 FC8 FC8 FC8
#define FC512 FC64 FC64 FC64 FC64 FC64 FC64 FC64 FC64
#define FLOOR_CODE(N)                                                        \
  kernel void floor_code##N(global float4* o, float a, float b, int n) {     \
    float4 x = o[get_global_id(0)] + (float)N;                               \
    FC512                                                                    \
    o[get_global_id(0)] = x;                                                 \
  }                                                                          \
  kernel void floor_loop##N(global float4* o, float a, float b, int n) {     \
    float4 x = o[get_global_id(0)] + (float)N;                               \
    for (int i = 0; i < n; ++i) {                                            \
      FC8                                                                    \
    }                                                                        \
    o[get_global_id(0)] = x;                                                 \
  }
FLOOR_CODE(0) FLOOR_CODE(1) FLOOR_CODE(2) FLOOR_CODE(3) FLOOR_CODE(4) FLOOR_CODE(5) FLOOR_CODE(6) FLOOR_CODE(7)
)CLC";

}  // namespace xpert::opencl
