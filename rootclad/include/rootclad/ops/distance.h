// rootclad/ops/distance.h — torch.cdist(a, b) (p = 2) on the CPU: per sample a(P, M) and
// b(R, M) give out(P, R), each distance from the differences (torch's own way for up to 25
// points; above, torch uses products, which round otherwise); the gradient g * (a - b) / d,
// none where d is 0, as torch's.
#ifndef ROOTCLAD_OPS_DISTANCE_H
#define ROOTCLAD_OPS_DISTANCE_H

#include "core.h"

namespace rootclad {

template <typename T>
void cdist_forward(T* out, const T* a, const T* b, int B, int P, int R, int M);

// d_a, d_b: null where not wanted
template <typename T>
void cdist_backward(T* d_a, T* d_b, const T* d_out, const T* out, const T* a, const T* b, int B,
                    int P, int R, int M);

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void cdist_forward_pullback(T* out, const T* a, const T* b, int B, int P, int R, int M, T* d_out,
                            T* d_a, T* d_b, int*, int*, int*, int*) {
  ::rootclad::cdist_backward(d_a, d_b, d_out, out, a, b, B, P, R, M);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "distance_impl.h"
#endif

#endif // ROOTCLAD_OPS_DISTANCE_H
