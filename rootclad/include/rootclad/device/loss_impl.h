// rootclad/device/loss_impl.h — the definitions of the device kernels device/loss.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_LOSS_IMPL_H
#define ROOTCLAD_DEVICE_LOSS_IMPL_H

#include "loss.h"

namespace rootclad {
namespace dev {

// A model with several outputs concatenates them per sample: the loss reads the columns
// [col, col + per) of rows of ld values (ld 0: rows of per, col 0); d_z's other columns are
// left alone (the caller zeroes them).
ROOTCLAD_HD inline long loss_at(long r, long c, long per, long ld, long col) {
  return r * (ld ? ld : per) + col + c;
}

template <class On, class T, class L>
void loss_and_gradient(On on, T* loss, T* d_z, const T* z, const T* y, const T* w, long per, long n,
                       T scale, L l, long ld, long col) {
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

template <class On, class T>
void cross_entropy_forward(On on, T* loss, const T* z, const T* y, const T* w, long R, int C,
                           long ld, long col) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        T m;
        const T wr = w ? w[r] : T(1);
        const T* zr = z + loss_at(r, 0, C, ld, col);
        add_to(loss, wr * (log_sum_exp(zr, C, m) - zr[(long)y[r]]) / T(R));
      });
}

template <class On, class T>
void cross_entropy_backward(On on, T* d_z, const T* z, const T* y, const T* w, long R, int C,
                            T scale, long ld, long col) {
  each_index(
      on, R * C, ROOTCLAD_BODY(long i) {
        const long r = i / C, at = loss_at(r, i % C, C, ld, col);
        T m;
        const T p = exp(z[at] - log_sum_exp(z + loss_at(r, 0, C, ld, col), C, m));
        const T wr = w ? w[r] : T(1);
        d_z[at] = scale * wr * (p - ((long)(i % C) == (long)y[r] ? T(1) : T(0))) / T(R);
      });
}

template <class On, class T>
void nll_forward(On on, T* loss, const T* z, const T* y, const T* w, long R, int C, long ld,
                 long col) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        add_to(loss, -(w ? w[r] : T(1)) * z[loss_at(r, (long)y[r], C, ld, col)] / T(R));
      });
}

template <class On, class T>
void nll_backward(On on, T* d_z, const T* y, const T* w, long R, int C, T scale, long ld,
                  long col) {
  each_index(
      on, R * C, ROOTCLAD_BODY(long i) {
        const long r = i / C;
        d_z[loss_at(r, i % C, C, ld, col)] =
            (long)(i % C) == (long)y[r] ? -scale * (w ? w[r] : T(1)) / T(R) : T(0);
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_LOSS_IMPL_H
