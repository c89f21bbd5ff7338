// rootclad/device/core.h — what every family of device kernels shares: filling, fused
// activations' adjoints (ActGrad), and the chunked sums over the batch.
#ifndef ROOTCLAD_DEVICE_CORE_H
#define ROOTCLAD_DEVICE_CORE_H

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "../device.h"
#include "../device_gemm.h"
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
// to lay d_act out as the GPU does).
#define ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES (1L << 24)
#ifndef ROOTCLAD_D_ACT_PLAN_MIN_VALUES
#if defined(__CUDACC__)
#define ROOTCLAD_D_ACT_PLAN_MIN_VALUES ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES
#else
#define ROOTCLAD_D_ACT_PLAN_MIN_VALUES 0L
#endif
#endif
constexpr long D_ACT_PLAN_MIN_VALUES = ROOTCLAD_D_ACT_PLAN_MIN_VALUES;

// p[0..n) = value (adjoints start at zero: the backward kernels add)
template <class On, class T> void fill(On on, T* p, long n, T value) {
  each_index(on, n, ROOTCLAD_BODY(long i) { p[i] = value; });
}

// a[0..na), b[0..nb) and c[0..nc) = 0, one launch (a training step's loss and adjoints)
template <class On, class T> void zero(On on, T* a, long na, T* b, long nb, T* c, long nc) {
  each_index(
      on, na + nb + nc, ROOTCLAD_BODY(long i) {
        if (i < na)
          a[i] = T(0);
        else if (i < na + nb)
          b[i - na] = T(0);
        else
          c[i - na - nb] = T(0);
      });
}

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

// The adjoint as a matrix in memory, for a product that reads it so: a pointer as it is; an
// ActGrad turned in place (dy = dy f'(y): its activation's adjoint has no other reader then).
template <class On, class T> const T* as_matrix(On, const T* d, long) {
  return d;
}
template <class On, class T, class Act> const T* as_matrix(On on, ActGrad<T, Act> g, long n) {
  each_index(on, n, ROOTCLAD_BODY(long i) { g.dy[i] = g.act.grad(g.dy[i], T(0), g.y[i]); });
  return g.dy;
}

// A gradient that sums over the batch (a bias's, a convolution's weight) has few elements and
// long sums: each element's sum is split into this many chunks of the batch, one index each,
// whose partial sums meet through add_to, so that a GPU gets some 2^16 threads to run them.
inline long batch_chunks(long elements, long batch) {
  const long chunks = (1L << 16) / (elements > 0 ? elements : 1);
  return chunks < 1 ? 1 : (chunks > batch ? batch : chunks);
}

// d_bias[o] += sum over rows r and positions l of d_out[r, o, l] (d_out: rows x OC x L)
template <class On, class T, class DY>
void bias_backward(On on, T* d_bias, DY d_out, long rows, int OC, int L) {
  const long chunks = batch_chunks(OC, rows);
  each_index(
      on, OC * chunks, ROOTCLAD_BODY(long i) {
        const long o = i % OC, chunk = i / OC;
        T s = 0;
        for (long r = rows * chunk / chunks; r < rows * (chunk + 1) / chunks; ++r)
          for (int l = 0; l < L; ++l)
            s += d_out[(r * OC + o) * L + l];
        add_to(d_bias + o, s);
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_CORE_H
