// rootclad/device/distance.h — torch.cdist(a, b) (p = 2) on the device (ops/distance.h says
// what it is): one thread per distance, per element of each input's gradient.
#ifndef ROOTCLAD_DEVICE_DISTANCE_H
#define ROOTCLAD_DEVICE_DISTANCE_H

#include "core.h"

namespace rootclad {
namespace dev {

template <class On, class T>
void cdist_forward(On on, T* out, const T* a, const T* b, long B, int P, int R, int M);

// d_a(B, P, M) += sum over r of g * (a - b) / d (none where d is 0)
template <class On, class T>
void cdist_backward_a(On on, T* d_a, const T* d_out, const T* out, const T* a, const T* b, long B,
                      int P, int R, int M);

// d_b(B, R, M) -= sum over p of g * (a - b) / d
template <class On, class T>
void cdist_backward_b(On on, T* d_b, const T* d_out, const T* out, const T* a, const T* b, long B,
                      int P, int R, int M);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "distance_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_DISTANCE_H
