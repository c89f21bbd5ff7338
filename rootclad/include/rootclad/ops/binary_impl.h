// rootclad/ops/binary_impl.h — the definitions of the kernels binary.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_BINARY_IMPL_H
#define ROOTCLAD_OPS_BINARY_IMPL_H

#include "binary.h"
#include "core.h"

namespace rootclad {

// whether mask kind 4..7 keeps a where the mask is nonzero (5 and 6) or where it is 0
inline bool binary_keeps_nonzero(int kind) {
  return kind == 5 || kind == 6;
}

template <typename T> inline T binary_apply(int kind, T x, T y) {
  if (kind == 0)
    return x + y;
  if (kind == 1)
    return x - y;
  if (kind == 2)
    return x * y;
  if (kind >= 4) // a mask: x where it keeps, else the fill (-inf for kinds 4 and 5, 0 after)
    return (y != T(0)) == binary_keeps_nonzero(kind) ? x : kind < 6 ? -T(INFINITY) : T(0);
  return x / y;
}

inline bool binary_is_flat(int n0, int n1, int n2, int sa2, int na, int sb2, int nb) {
  return n0 == 1 && n1 == 1 && sa2 == 1 && sb2 == 1 && na == n2 && nb == n2;
}

template <typename T>
void binary_forward(T* out, const T* a, const T* b, int kind, int B, int n0, int n1, int n2,
                    int sa0, int sa1, int sa2, int na, int sb0, int sb1, int sb2, int nb) {
  ROOTCLAD_REPLAY_SKIP;
  if (binary_is_flat(n0, n1, n2, sa2, na, sb2, nb)) {
    const long N = (long)B * n2;
    for (long i = 0; i < N; ++i)
      out[i] = binary_apply(kind, a[i], b[i]);
    return;
  }
  for (int s = 0; s < B; ++s)
    for (int i = 0; i < n0; ++i)
      for (int j = 0; j < n1; ++j)
        for (int k = 0; k < n2; ++k) {
          const long o = (((long)s * n0 + i) * n1 + j) * n2 + k;
          const long ia = (long)s * na + (long)i * sa0 + (long)j * sa1 + (long)k * sa2;
          const long ib = (long)s * nb + (long)i * sb0 + (long)j * sb1 + (long)k * sb2;
          out[o] = binary_apply(kind, a[ia], b[ib]);
        }
}

template <typename T> inline void binary_adjoint(int kind, T g, T x, T y, T& da, T& db) {
  if (kind == 0) {
    da += g;
    db += g;
  } else if (kind == 1) {
    da += g;
    db -= g;
  } else if (kind == 2) {
    da += g * y;
    db += g * x;
  } else if (kind >= 4) { // the mask takes no gradient
    if ((y != T(0)) == binary_keeps_nonzero(kind))
      da += g;
  } else {
    da += g / y;
    db -= g * x / (y * y);
  }
}

template <typename T>
void binary_backward(T* d_a, T* d_b, const T* d_out, const T* a, const T* b, int kind, int B,
                     int n0, int n1, int n2, int sa0, int sa1, int sa2, int na, int sb0, int sb1,
                     int sb2, int nb) {
  for (int s = 0; s < B; ++s)
    for (int i = 0; i < n0; ++i)
      for (int j = 0; j < n1; ++j)
        for (int k = 0; k < n2; ++k) {
          const long o = (((long)s * n0 + i) * n1 + j) * n2 + k;
          const long ia = (long)s * na + (long)i * sa0 + (long)j * sa1 + (long)k * sa2;
          const long ib = (long)s * nb + (long)i * sb0 + (long)j * sb1 + (long)k * sb2;
          binary_adjoint(kind, d_out[o], a[ia], b[ib], d_a[ia], d_b[ib]);
        }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_BINARY_IMPL_H
