// rootclad/ops/loss.h — the losses, mean over the batch, and their event-weighted form.
#ifndef ROOTCLAD_OPS_LOSS_H
#define ROOTCLAD_OPS_LOSS_H

#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Losses, mean over the batch. Each returns the loss; its backward adds d_loss * dL/dinput.
//
// bce_with_logits: L = mean_i [ max(z,0) - z*y + log(1 + exp(-|z|)) ]  (stable form)
template <typename T> T bce_with_logits_forward(const T* logits, const T* target, int N) {
  T s = 0;
  for (int i = 0; i < N; ++i) {
    T z = logits[i];
    T az = z > 0 ? z : -z;
    s += (z > 0 ? z : T(0)) - z * target[i] + std::log1p(std::exp(-az));
  }
  return s / N;
}
// dL/dz_i = (sigmoid(z_i) - y_i) / N
template <typename T>
void bce_with_logits_backward(T* d_logits, T d_loss, const T* logits, const T* target, int N) {
  for (int i = 0; i < N; ++i) {
    T z = logits[i];
    T sig = z >= 0 ? T(1) / (T(1) + std::exp(-z)) : std::exp(z) / (T(1) + std::exp(z));
    d_logits[i] += d_loss * (sig - target[i]) / N;
  }
}

// mse: L = mean_i (x_i - y_i)^2;  dL/dx_i = 2 (x_i - y_i) / N
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

// cross_entropy over logits(B, NC) with class indices target(B) (stored as T):
//   L = mean_b [ logsumexp(logits_b) - logits_b[target_b] ]
// The stable softmax denominator of one row: m = max_c z[c], returns sum_c exp(z[c] - m).
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
// dL/dz_bc = (softmax(z_b)_c - [c == target_b]) / B
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

// nll over log-probabilities logp(B, NC) (after LogSoftmax) with class indices target(B):
//   L = -mean_b logp_b[target_b];  dL/dlogp_bc = -[c == target_b] / B
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

// huber (torch's delta = 1): l(d) = d^2 / 2 where |d| < 1, else |d| - 1/2; d = x - y; mean.
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

// ---------------------------------------------------------------------------------------
// Per-sample weights (HEP event weights): the loss is the mean over all N = Bf * K elements of
// w_b * l(z_bk, y_bk) (cross_entropy: over the Bf samples of w_b * l_b), so that
// F.<loss>(z, y, reduction="none") weighted the same way and averaged gives the same number;
// weights of 1 give the unweighted loss. For rows [0, B) of a batch of Bf samples (z, y, w and
// d_z point at the chunk's first row), the loss reads the K outputs at columns [col, col + K)
// of rows of ld (a model with several outputs concatenates them per sample, and the loss
// takes one; a model with one has col 0 and ld K). Returns the chunk's share and, unless d_z
// is null, writes (not adds) whole rows of d_z = dL/dz, 0 outside the loss's columns. w null:
// every weight 1. kind: 0 bce_with_logits, 1 mse, 2 cross_entropy, 3 nll, 4 huber.
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

// A model with one output: every column of each row.
template <typename T>
T weighted_loss(int kind, const T* z, const T* y, const T* w, T* d_z, int Bf, int B, int K) {
  return column_loss(kind, z, y, w, d_z, Bf, B, 0, K, K);
}

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void bce_with_logits_forward_pullback(const T* logits, const T* target, int N, T d_loss,
                                      T* d_logits, int* d_N) {
  ::rootclad::bce_with_logits_backward(d_logits, d_loss, logits, target, N);
}

template <typename T>
void mse_forward_pullback(const T* inp, const T* target, int N, T d_loss, T* d_inp, int* d_N) {
  ::rootclad::mse_backward(d_inp, d_loss, inp, target, N);
}

template <typename T>
void cross_entropy_forward_pullback(const T* logits, const T* target, int B, int NC, T d_loss,
                                    T* d_logits, int* d_B, int* d_NC) {
  ::rootclad::cross_entropy_backward(d_logits, d_loss, logits, target, B, NC);
}

template <typename T>
void nll_forward_pullback(const T* logp, const T* target, int B, int NC, T d_loss, T* d_logp,
                          int* d_B, int* d_NC) {
  ::rootclad::nll_backward(d_logp, d_loss, logp, target, B, NC);
}

template <typename T>
void huber_forward_pullback(const T* inp, const T* target, int N, T d_loss, T* d_inp, int* d_N) {
  ::rootclad::huber_backward(d_inp, d_loss, inp, target, N);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad

#endif // ROOTCLAD_OPS_LOSS_H
