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

// A model with several outputs concatenates them per sample: the loss reads the columns
// [col, col + per) of rows of ld values (ld 0: rows of per, col 0); d_z's other columns are
// left alone (the caller zeroes them).
ROOTCLAD_HD inline long loss_at(long r, long c, long per, long ld, long col) {
  return r * (ld ? ld : per) + col + c;
}

// *loss += the mean loss, d_z = its gradient x scale, in one launch. w: each sample's weight
// (its `per` elements share it: the mean of w[b] * loss element, as kernels.h's
// weighted_loss), or null (every weight 1).
template <class On, class T, class L>
void loss_and_gradient(On on, T* loss, T* d_z, const T* z, const T* y, const T* w, long per, long n,
                       T scale, L l, long ld = 0, long col = 0) {
  each_index(
      on, n, ROOTCLAD_BODY(long i) {
        const T wi = w ? w[i / per] : T(1);
        const long at = loss_at(i / per, i % per, per, ld, col);
        add_to(loss, wi * l.loss(z[at], y[i]) / T(n));
        d_z[at] = scale * wi * l.grad(z[at], y[i]) / T(n);
      });
}

// Cross-entropy of logits z(R, C) with class indices y(R) (held as T), mean over rows.
template <class T> ROOTCLAD_HD inline T log_sum_exp(const T* z, int C, T& m) {
  m = z[0];
  for (int c = 1; c < C; ++c)
    m = z[c] > m ? z[c] : m;
  T e = 0;
  for (int c = 0; c < C; ++c)
    e += exp(z[c] - m);
  return m + log(e);
}

// w: each row's weight, or null (every weight 1)
template <class On, class T>
void cross_entropy_forward(On on, T* loss, const T* z, const T* y, const T* w, long R, int C,
                           long ld = 0, long col = 0) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        T m;
        const T wr = w ? w[r] : T(1);
        const T* zr = z + loss_at(r, 0, C, ld, col);
        add_to(loss, wr * (log_sum_exp(zr, C, m) - zr[(long)y[r]]) / T(R));
      });
}

// d_z[r, c] = scale * w_r * (softmax(z_r)_c - [c == y_r]) / R
template <class On, class T>
void cross_entropy_backward(On on, T* d_z, const T* z, const T* y, const T* w, long R, int C,
                            T scale, long ld = 0, long col = 0) {
  each_index(
      on, R * C, ROOTCLAD_BODY(long i) {
        const long r = i / C, at = loss_at(r, i % C, C, ld, col);
        T m;
        const T p = exp(z[at] - log_sum_exp(z + loss_at(r, 0, C, ld, col), C, m));
        const T wr = w ? w[r] : T(1);
        d_z[at] = scale * wr * (p - ((long)(i % C) == (long)y[r] ? T(1) : T(0))) / T(R);
      });
}

// Negative log-likelihood of log-probabilities z(R, C) (after LogSoftmax), mean over rows.
template <class On, class T>
void nll_forward(On on, T* loss, const T* z, const T* y, const T* w, long R, int C, long ld = 0,
                 long col = 0) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        add_to(loss, -(w ? w[r] : T(1)) * z[loss_at(r, (long)y[r], C, ld, col)] / T(R));
      });
}

template <class On, class T>
void nll_backward(On on, T* d_z, const T* y, const T* w, long R, int C, T scale, long ld = 0,
                  long col = 0) {
  each_index(
      on, R * C, ROOTCLAD_BODY(long i) {
        const long r = i / C;
        d_z[loss_at(r, i % C, C, ld, col)] =
            (long)(i % C) == (long)y[r] ? -scale * (w ? w[r] : T(1)) / T(R) : T(0);
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_LOSS_H
