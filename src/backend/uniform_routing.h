// Uniform routing (RouterParams::uniform_seed, `xpert bench --routing uniform`): the score that replaces
// expert e's router logit l. A hash of (seed, e, l's bits) mapped to [0, 1): for a token, the E scores are
// independent uniform draws, so its top k is a uniformly random k-subset of the experts; tokens with other
// logits draw anew. Deterministic (the same logits give the same choice on every backend), needs no state,
// so a recorded CUDA graph replays it. One definition for the host and the device.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define XP_HOST_DEVICE __host__ __device__
#else
#define XP_HOST_DEVICE
#endif

namespace xpert {

XP_HOST_DEVICE inline uint32_t uniform_route_mix(uint32_t h) {  // murmur3's finalizer
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

XP_HOST_DEVICE inline float uniform_route_score(float logit, int e, uint32_t seed) {
  uint32_t bits;
  memcpy(&bits, &logit, sizeof bits);
  const uint32_t h = uniform_route_mix(uniform_route_mix(bits ^ seed) ^ ((uint32_t)e * 0x9e3779b9u));
  return (float)(h >> 8) * (1.0f / 16777216.0f);  // 24 bits: exact in a float
}

}  // namespace xpert
