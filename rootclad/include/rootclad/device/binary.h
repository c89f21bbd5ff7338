// rootclad/device/binary.h — binary ops of two tensors as device kernels (device_kernels.h says how
// they are written).
#ifndef ROOTCLAD_DEVICE_BINARY_H
#define ROOTCLAD_DEVICE_BINARY_H

#include "core.h"

namespace rootclad {
namespace dev {

// -- a + sign * b of two same-shape tensors (residual additions), through act -----------------
template <class On, class T, class Act = NoAct>
void add_forward(On on, T* out, const T* a, const T* b, long n, T sign, Act act = {});

// d_x += scale * d_out (the adjoint of each operand; scale -1 for a subtracted one)
template <class On, class T, class DY> void add_backward(On on, T* d_x, DY d_out, long n, T scale);

// -- a (op) b with broadcasting: per sample, the output's element j = (j0, j1, j2) over dims
// reads a at sum j_k sa[k] and b at sum j_k sb[k] (stride 0: a broadcast axis); ops.py's
// broadcast_geometry merges the axes. kind: 0 add, 1 sub, 2 mul, 3 div, 4 and 5 attention's
// masks (ops/binary.h; cpu_ops.BINARY_KINDS).
struct Broadcast {
  int dims[3], sa[3], sb[3];
  long na, nb; // per-sample sizes of a and b
};

template <class On, class T, class Act = NoAct>
void binary_forward(On on, T* out, const T* a, const T* b, long B, Broadcast g, int kind,
                    Act act = {});

// d_x += the adjoint of operand `which` (0: a, 1: b), gathered: each of its elements sums the
// output elements that read it (over the axes where it is broadcast)
template <class On, class T, class DY>
void binary_backward(On on, T* d_x, DY d_out, const T* a, const T* b, long B, Broadcast g, int kind,
                     int which);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "binary_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_BINARY_H
