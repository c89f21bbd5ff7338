// rootclad/ops/loss_impl.h — the definitions of the kernels loss.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_LOSS_IMPL_H
#define ROOTCLAD_OPS_LOSS_IMPL_H

#include "core.h"
#include "loss.h"

namespace rootclad {

template <typename T> T bce_with_logits_forward(const T* logits, const T* target, int N) {
  T s = 0;
  for (int i = 0; i < N; ++i) {
    T z = logits[i];
    T az = z > 0 ? z : -z;
    s += (z > 0 ? z : T(0)) - z * target[i] + std::log1p(std::exp(-az));
  }
  return s / N;
}
template <typename T>
void bce_with_logits_backward(T* d_logits, T d_loss, const T* logits, const T* target, int N) {
  for (int i = 0; i < N; ++i) {
    T z = logits[i];
    T sig = z >= 0 ? T(1) / (T(1) + std::exp(-z)) : std::exp(z) / (T(1) + std::exp(z));
    d_logits[i] += d_loss * (sig - target[i]) / N;
  }
}

template <typename T> T mse_forward(const T* inp, const T* target, int N) {
  T s = 0;
  for (int i = 0; i < N; ++i)
    s += (inp[i] - target[i]) * (inp[i] - target[i]);
  return s / N;
}
template <typename T> void mse_backward(T* d_inp, T d_loss, const T* inp, const T* target, int N) {
  for (int i = 0; i < N; ++i)
    d_inp[i] += d_loss * T(2) * (inp[i] - target[i]) / N;
}

template <typename T> inline T softmax_denominator(const T* z, int NC, T& m) {
  m = z[0];
  for (int c = 1; c < NC; ++c)
    m = z[c] > m ? z[c] : m;
  T e = 0;
  for (int c = 0; c < NC; ++c)
    e += std::exp(z[c] - m);
  return e;
}

template <typename T> T cross_entropy_forward(const T* logits, const T* target, int B, int NC) {
  T s = 0;
  for (int b = 0; b < B; ++b) {
    const T* z = logits + (long)b * NC;
    T m;
    const T e = softmax_denominator(z, NC, m);
    s += m + std::log(e) - z[(int)target[b]];
  }
  return s / B;
}
template <typename T>
void cross_entropy_backward(T* d_logits, T d_loss, const T* logits, const T* target, int B,
                            int NC) {
  for (int b = 0; b < B; ++b) {
    const T* z = logits + (long)b * NC;
    T m;
    const T e = softmax_denominator(z, NC, m);
    for (int c = 0; c < NC; ++c) {
      T p = std::exp(z[c] - m) / e;
      d_logits[(long)b * NC + c] += d_loss * (p - (c == (int)target[b] ? T(1) : T(0))) / B;
    }
  }
}

template <typename T> T nll_forward(const T* logp, const T* target, int B, int NC) {
  T s = 0;
  for (int b = 0; b < B; ++b)
    s -= logp[(long)b * NC + (int)target[b]];
  return s / B;
}
template <typename T>
void nll_backward(T* d_logp, T d_loss, const T* logp, const T* target, int B, int NC) {
  for (int b = 0; b < B; ++b)
    d_logp[(long)b * NC + (int)target[b]] -= d_loss / B;
}

template <typename T> inline T huber_term(T d) {
  const T a = d < 0 ? -d : d;
  return a < T(1) ? T(0.5) * d * d : a - T(0.5);
}
template <typename T> inline T huber_slope(T d) {
  return d < T(-1) ? T(-1) : (d > T(1) ? T(1) : d);
}
template <typename T> T huber_forward(const T* inp, const T* target, int N) {
  T s = 0;
  for (int i = 0; i < N; ++i)
    s += huber_term(inp[i] - target[i]);
  return s / N;
}
template <typename T>
void huber_backward(T* d_inp, T d_loss, const T* inp, const T* target, int N) {
  for (int i = 0; i < N; ++i)
    d_inp[i] += d_loss * huber_slope(inp[i] - target[i]) / N;
}

template <typename T>
T column_loss(int kind, const T* z, const T* y, const T* w, T* d_z, int Bf, int B, int col, int K,
              int ld) {
  T s = 0;
  const bool by_row = kind == 2 || kind == 3; // class indices: one target per row
  const T N = by_row ? T(Bf) : T(Bf) * T(K);
  for (int b = 0; b < B; ++b) {
    const T wb = w ? w[b] : T(1);
    const T* zb = z + (long)b * ld + col;
    T* db = nullptr;
    if (d_z) {
      for (int c = 0; c < ld; ++c)
        d_z[(long)b * ld + c] = T(0);
      db = d_z + (long)b * ld + col;
    }
    if (kind == 3) {
      const int t = (int)y[b];
      s -= wb * zb[t];
      if (db)
        db[t] = -wb / N;
    } else if (kind == 2) {
      T m;
      const T e = softmax_denominator(zb, K, m);
      const int t = (int)y[b];
      s += wb * (m + std::log(e) - zb[t]);
      if (db)
        for (int c = 0; c < K; ++c)
          db[c] = wb * (std::exp(zb[c] - m) / e - (c == t ? T(1) : T(0))) / N;
    } else {
      for (int k = 0; k < K; ++k) {
        const T zi = zb[k], yi = y[(long)b * K + k];
        T g;
        if (kind == 0) { // as bce_with_logits_forward / _backward
          const T az = zi > 0 ? zi : -zi;
          s += wb * ((zi > 0 ? zi : T(0)) - zi * yi + std::log1p(std::exp(-az)));
          g = zi >= 0 ? T(1) / (T(1) + std::exp(-zi)) - yi
                      : std::exp(zi) / (T(1) + std::exp(zi)) - yi;
        } else if (kind == 4) {
          s += wb * huber_term(zi - yi);
          g = huber_slope(zi - yi);
        } else {
          s += wb * (zi - yi) * (zi - yi);
          g = T(2) * (zi - yi);
        }
        if (db)
          db[k] = wb * g / N;
      }
    }
  }
  return s / N;
}

template <typename T>
T weighted_loss(int kind, const T* z, const T* y, const T* w, T* d_z, int Bf, int B, int K) {
  return column_loss(kind, z, y, w, d_z, Bf, B, 0, K, K);
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_LOSS_IMPL_H
