// rootclad/dropout_mask.h — dropout's mask, the same on the CPU (kernels.h) and the device
// (device_kernels.h).
//
// Element i is kept with probability 1-p and scaled by 1/(1-p). The mask is a counter-based hash
// of (seed, i), so the backward pass recomputes it instead of storing it, and the same seed
// reproduces the same mask on any thread or device.
#ifndef ROOTCLAD_DROPOUT_MASK_H
#define ROOTCLAD_DROPOUT_MASK_H

#include <cmath>
#include <cstdint>

#include "device.h"

namespace rootclad {

ROOTCLAD_HD inline std::uint64_t dropout_hash(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1); // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// i: the element's index within the whole batch, so a batch split into chunks draws the same
// mask as the batch in one piece; p = 0 keeps every element.
template <typename T> ROOTCLAD_HD inline T dropout_scale(std::uint64_t seed, long i, T p) {
  double u = (double)(dropout_hash(seed, (std::uint64_t)i) >> 11) * (1.0 / 9007199254740992.0);
  return u < (double)p ? T(0) : T(1) / (T(1) - p);
}

// A standard normal draw for element i (Box-Muller on the hashes of (seed, 2i) and (seed, 2i+1):
// u1 in (0, 1], u2 in [0, 1)), the same on any thread or device.
template <typename T> ROOTCLAD_HD inline T normal_draw(std::uint64_t seed, long i) {
  const double scale = 1.0 / 9007199254740992.0;
  const std::uint64_t k = 2 * (std::uint64_t)i;
  const double u1 = ((double)(dropout_hash(seed, k) >> 11) + 1.0) * scale;
  const double u2 = (double)(dropout_hash(seed, k + 1) >> 11) * scale;
  return T(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// The seed of a model's `call`-th call (its dropout masks), from the model's seed: the same
// formula in every host (rootclad.torch.base.call_seed, rootclad::Model, the LibTorch function),
// so a model exported with seed s draws in C++ the masks it would draw in Python.
inline std::uint64_t call_seed(std::uint64_t seed, std::uint64_t call) {
  return seed * 0x9E3779B97F4A7C15ull + call;
}

} // namespace rootclad

#endif // ROOTCLAD_DROPOUT_MASK_H
