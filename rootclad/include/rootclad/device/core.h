// rootclad/device/core.h — what every family of device kernels shares: filling, fused
// activations' adjoints (ActGrad), and d_act's plan threshold. Each family header declares its
// kernels (what a device program calls) and the shapes they take; its _impl.h defines them,
// included unless ROOTCLAD_DECLARATIONS_ONLY (device_runtime.cpp instantiates them once).
#ifndef ROOTCLAD_DEVICE_CORE_H
#define ROOTCLAD_DEVICE_CORE_H

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../device.h"
#include "../dropout_mask.h"
#include "../ops/activations.h"
#include "../optim_rule.h"

namespace rootclad {
namespace dev {

// A program's adjoints (d_act, rootclad/codegen/cuda.py) are planned, those alive at
// different times of the backward sharing memory, once they would take D_ACT_PLAN_MIN_VALUES
// values with a region each: a planned adjoint is zeroed where it takes over memory, one launch
// more for each such, which a small batch would feel and not gain from; unplanned, one zero
// at the start of the backward does for all. The host loops launch nothing: planned at any size
// (a test or a benchmark sets ROOTCLAD_D_ACT_PLAN_MIN_VALUES=ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES
// to lay d_act out as the GPU does). A program's own choice: the kernels never read it.
#define ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES (1L << 24)
#ifndef ROOTCLAD_D_ACT_PLAN_MIN_VALUES
#if defined(__CUDACC__) || defined(ROOTCLAD_ON_CUDA)
#define ROOTCLAD_D_ACT_PLAN_MIN_VALUES ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES
#else
#define ROOTCLAD_D_ACT_PLAN_MIN_VALUES 0L
#endif
#endif
constexpr long D_ACT_PLAN_MIN_VALUES = ROOTCLAD_D_ACT_PLAN_MIN_VALUES;

// p[0..n) = value (adjoints start at zero: the backward kernels add)
template <class On, class T> void fill(On on, T* p, long n, T value);

// a[0..na), b[0..nb) and c[0..nc) = 0, one launch (a training step's loss and adjoints)
template <class On, class T> void zero(On on, T* a, long na, T* b, long nb, T* c, long nc);

// dst[0..n) = src[0..n) (input_grad's output adjoint)
template <class On, class T> void copy(On on, T* dst, const T* src, long n);

// The identity as an activation: what a producer applies when nothing is fused.
struct NoAct {
  template <class T> ROOTCLAD_HD T f(T x) const { return x; }
};

// The adjoint of a fused activation's input, dy[i] * f'(y[i]) (the functor's grad from y),
// indexed like a pointer.
template <class T, class Act> struct ActGrad {
  T* dy;
  const T* y;
  Act act;
  ROOTCLAD_HD T operator[](long i) const { return act.grad(dy[i], T(0), y[i]); }
  ROOTCLAD_HD ActGrad operator+(long k) const { return ActGrad{dy + k, y + k, act}; }
};

template <class T, class Act> ActGrad<T, Act> act_grad(T* dy, const T* y, Act act) {
  return ActGrad<T, Act>{dy, y, act};
}

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "core_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_CORE_H
