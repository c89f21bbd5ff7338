// rootclad/device/core_impl.h — the definitions of what device/core.h declares, and what the
// kernels of every family use: the adjoint as a matrix, the chunked sums over the batch.
#ifndef ROOTCLAD_DEVICE_CORE_IMPL_H
#define ROOTCLAD_DEVICE_CORE_IMPL_H

#include <type_traits>

#include "../device_gemm.h"
#include "core.h"

namespace rootclad {
namespace dev {

template <class On, class T> void fill(On on, T* p, long n, T value) {
  each_index(on, n, ROOTCLAD_BODY(long i) { p[i] = value; });
}

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

template <class On, class T> void copy(On on, T* dst, const T* src, long n) {
  each_index(on, n, ROOTCLAD_BODY(long i) { dst[i] = src[i]; });
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

#endif // ROOTCLAD_DEVICE_CORE_IMPL_H
