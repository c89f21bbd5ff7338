// rootclad/device/loss.h — the losses as device kernels (device_kernels.h says how they are
// written).
#ifndef ROOTCLAD_DEVICE_LOSS_H
#define ROOTCLAD_DEVICE_LOSS_H

#include "core.h"

namespace rootclad {
namespace dev {

// -- losses, the mean over the batch's elements (class-index losses: over its rows) -----------
// *loss += the mean loss (the caller zeroes it); d_z = scale * d loss / d z (written, not added).
// Elementwise losses are functors: loss(z, y) per element and its derivative grad(z, y).
struct BceWithLogits { // numerically stable: max(z, 0) - z y + log(1 + exp(-|z|))
  template <class T> ROOTCLAD_HD T loss(T z, T y) const {
    return (z > T(0) ? z : T(0)) - z * y + log1p(exp(-fabs(z)));
  }
  template <class T> ROOTCLAD_HD T grad(T z, T y) const { return T(1) / (T(1) + exp(-z)) - y; }
};

struct Mse {
  template <class T> ROOTCLAD_HD T loss(T z, T y) const { return (z - y) * (z - y); }
  template <class T> ROOTCLAD_HD T grad(T z, T y) const { return T(2) * (z - y); }
};

struct Huber { // torch's delta = 1: d^2 / 2 where |d| < 1, else |d| - 1/2
  template <class T> ROOTCLAD_HD T loss(T z, T y) const {
    const T d = fabs(z - y);
    return d < T(1) ? T(0.5) * d * d : d - T(0.5);
  }
  template <class T> ROOTCLAD_HD T grad(T z, T y) const {
    const T d = z - y;
    return d < T(-1) ? T(-1) : (d > T(1) ? T(1) : d);
  }
};

// *loss += the mean loss, d_z = its gradient x scale, in one launch. w: each sample's weight
// (its `per` elements share it: the mean of w[b] * loss element, as kernels.h's
// weighted_loss), or null (every weight 1).
template <class On, class T, class L>
void loss_and_gradient(On on, T* loss, T* d_z, const T* z, const T* y, const T* w, long per, long n,
                       T scale, L l, long ld = 0, long col = 0);

// w: each row's weight, or null (every weight 1)
template <class On, class T>
void cross_entropy_forward(On on, T* loss, const T* z, const T* y, const T* w, long R, int C,
                           long ld = 0, long col = 0);

// d_z[r, c] = scale * w_r * (softmax(z_r)_c - [c == y_r]) / R
template <class On, class T>
void cross_entropy_backward(On on, T* d_z, const T* z, const T* y, const T* w, long R, int C,
                            T scale, long ld = 0, long col = 0);

// Negative log-likelihood of log-probabilities z(R, C) (after LogSoftmax), mean over rows.
template <class On, class T>
void nll_forward(On on, T* loss, const T* z, const T* y, const T* w, long R, int C, long ld = 0,
                 long col = 0);

template <class On, class T>
void nll_backward(On on, T* d_z, const T* y, const T* w, long R, int C, T scale, long ld = 0,
                  long col = 0);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "loss_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_LOSS_H
