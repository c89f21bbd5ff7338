// rootclad/ops/core.h — what the CPU kernels (ops/*.h) share.
//
// Every op is a pair of stateless functions on raw pointers into one arena:
//   <op>_forward   writes its output;
//   <op>_backward  ADDS into the gradients of its inputs and parameters (+=), so fan-out
//                  and parameter sharing accumulate; the caller zeroes gradient buffers;
// and, at the end of its family's header, its Clad-convention pullback
// (clad::custom_derivatives::rootclad::<op>_forward_pullback): the primal arguments, then one
// adjoint per argument, calling the readable backward. Clad's reverse pass (the clad engine)
// and rootclad's own sweep (the pullback engine) call the very same pullbacks, so both engines
// share one hand-written derivative per op. Built for Clad to differentiate the kernels
// themselves (pullbacks=False: ROOTCLAD_NO_PULLBACKS), the pullbacks, SIMD hints and the
// register-blocked convolutions are left out; the losses' pullbacks stay.
// Shapes are in comments; B batch, C channels in, OC channels out, L length in, LO length
// out, K kernel size, N element count. All tensors are contiguous, row-major (torch layout).
#ifndef ROOTCLAD_OPS_CORE_H
#define ROOTCLAD_OPS_CORE_H

#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef ROOTCLAD_DECLARATIONS_ONLY // what the kernels' definitions use
#include "../blas.h"
#include "../parallel.h"
#endif

// What the runtime library (runtime.cpp) exports, though it builds with -fvisibility=hidden.
#define ROOTCLAD_SHARED __attribute__((visibility("default")))

namespace rootclad {
// The clad engine (with custom pullbacks) runs the forward once, then executes the reverse
// sweep Clad generated for the model's forward function. While it does, the forward kernels
// return at once (the arena already holds their outputs; BatchNorm must not count the batch
// again) and Clad's sweep calls the pullbacks. Each forward kernel starts with
// ROOTCLAD_REPLAY_SKIP. One flag per thread for the whole process: the kernels in the runtime
// library read it, the model's library sets it (Replay, below), so it is defined once, in the
// runtime library (ROOTCLAD_RUNTIME_DEFINITIONS).
#ifdef ROOTCLAD_STANDALONE // one header, no runtime library (rootclad emit): defined here
inline thread_local bool replaying = false;
#else
ROOTCLAD_SHARED extern thread_local bool replaying;
#endif
} // namespace rootclad
#ifdef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves: never replaying
#define ROOTCLAD_REPLAY_SKIP
#else
#define ROOTCLAD_REPLAY_SKIP                                                                       \
  do {                                                                                             \
    if (::rootclad::replaying)                                                                     \
      return;                                                                                      \
  } while (0)
#endif

// Vectorisation hints (-fopenmp-simd). Omitted when Clad differentiates the kernels itself:
// Clad 2.5 crashes on OpenMP directives.
#ifdef ROOTCLAD_NO_PULLBACKS
#define ROOTCLAD_SIMD
#define ROOTCLAD_SIMD_SUM(var)
#else
#define ROOTCLAD_PRAGMA(x) _Pragma(#x)
#define ROOTCLAD_SIMD ROOTCLAD_PRAGMA(omp simd)
#define ROOTCLAD_SIMD_SUM(var) ROOTCLAD_PRAGMA(omp simd reduction(+ : var))
#endif

namespace rootclad {

template <typename T> inline void zero(T* p, long n) {
  if (n > 0)
    std::memset(p, 0, sizeof(T) * n);
}

template <typename T> inline void copy(T* dst, const T* src, long n) {
  if (n > 0)
    std::memcpy(dst, src, sizeof(T) * n);
}

template <typename T> inline void fill(T* p, long n, T value) {
  for (long i = 0; i < n; ++i)
    p[i] = value;
}

// Where a value's last reader has run (the arena planner, codegen/cpu.py): nothing here; its
// pullback zeroes the value's adjoint before the readers' pullbacks add into it, so that values
// whose adjoints live at different times can share memory.
template <typename T> inline void adjoint_start_forward(T*, long) {}

// Adjoints in [no_grad_lo, no_grad_hi) are not wanted: the model inputs' when no input
// gradient is asked for. The clad engine's sweep passes Clad's own adjoint pointers, so
// Linear and Conv skip their d_input half by this range (the pullback engine passes null).
#ifdef ROOTCLAD_STANDALONE
inline thread_local const void* no_grad_lo = nullptr;
inline thread_local const void* no_grad_hi = nullptr;
#else
ROOTCLAD_SHARED extern thread_local const void* no_grad_lo;
ROOTCLAD_SHARED extern thread_local const void* no_grad_hi;
#endif
template <typename T> inline T* wanted(T* d) {
  const auto p = reinterpret_cast<std::uintptr_t>(d); // unrelated pointers: compare addresses
  const auto lo = reinterpret_cast<std::uintptr_t>(no_grad_lo);
  const auto hi = reinterpret_cast<std::uintptr_t>(no_grad_hi);
  return p >= lo && p < hi ? (T*)nullptr : d;
}

// While one lives, the forward kernels replay and adjoints in [lo, hi) are not wanted: the
// clad engine's reverse sweeps run inside one (codegen/cpu.py names it at each).
struct Replay {
  Replay(const void* lo, const void* hi) {
    replaying = true;
    no_grad_lo = lo;
    no_grad_hi = hi;
  }
  ~Replay() {
    replaying = false;
    no_grad_lo = no_grad_hi = nullptr;
  }
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;
};

#ifdef ROOTCLAD_RUNTIME_DEFINITIONS // runtime.cpp: defined once
ROOTCLAD_SHARED thread_local bool replaying = false;
ROOTCLAD_SHARED thread_local const void* no_grad_lo = nullptr;
ROOTCLAD_SHARED thread_local const void* no_grad_hi = nullptr;
#endif

} // namespace rootclad

namespace clad {
namespace custom_derivatives {
namespace rootclad {
// The marker's pullback: zeroes the value's adjoint where it starts in the reverse sweep.
template <typename T> void adjoint_start_forward_pullback(T* x, long n, T* d_x, long* d_n) {
  ::rootclad::zero(d_x, n);
}
} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad

#endif // ROOTCLAD_OPS_CORE_H
