// rootclad/ops/binary.h — binary ops of two tensors with broadcasting.
#ifndef ROOTCLAD_OPS_BINARY_H
#define ROOTCLAD_OPS_BINARY_H

#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Binary ops with broadcasting. kind: 0 a + b, 1 a - b, 2 a * b, 3 a / b, and attention's
// masks, b a mask of 0s and 1s that takes no gradient: 4 -inf where b is nonzero, else a
// (masked_fill(b, -inf)); 5 a where b is nonzero, else -inf (a boolean attn_mask); 6 a where b
// is nonzero, else 0; 7 0 where b is nonzero, else a (torch.where as 6 + 7). Per sample
// the output is an (n0, n1, n2) loop nest; a's element of out[b, i, j, k] is
//   a[b*na + i*sa0 + j*sa1 + k*sa2]   (stride 0 on an axis a is broadcast along),
// and b's likewise with sb*, nb. Operands of equal shapes run as one flat loop.
template <typename T>
void binary_forward(T* out, const T* a, const T* b, int kind, int B, int n0, int n1, int n2,
                    int sa0, int sa1, int sa2, int na, int sb0, int sb1, int sb2, int nb);

// d_a += d_out * d(a op b)/da, d_b += d_out * d(a op b)/db, summed over broadcast axes.
// d_a and d_b may be the same buffer (x + x).
template <typename T>
void binary_backward(T* d_a, T* d_b, const T* d_out, const T* a, const T* b, int kind, int B,
                     int n0, int n1, int n2, int sa0, int sa1, int sa2, int na, int sb0, int sb1,
                     int sb2, int nb);

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void binary_forward_pullback(T* out, const T* a, const T* b, int kind, int B, int n0, int n1,
                             int n2, int sa0, int sa1, int sa2, int na, int sb0, int sb1, int sb2,
                             int nb, T* d_out, T* d_a, T* d_b, int*, int*, int*, int*, int*, int*,
                             int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::binary_backward(d_a, d_b, d_out, a, b, kind, B, n0, n1, n2, sa0, sa1, sa2, na, sb0,
                              sb1, sb2, nb);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "binary_impl.h"
#endif

#endif // ROOTCLAD_OPS_BINARY_H
