// rootclad/device_kernels.h — the GW MLP's and CNN's ops as device kernels (device.h).
//
// Each op is a function template over `On` (dev::Host or dev::Cuda) and T, written as one body
// per output element, with the CPU kernels' contract (kernels.h): <op>_forward writes its
// output, <op>_backward_* add into the adjoints. Every backward is in gather form: the body
// for an element of an adjoint sums what flows into it, so no two indices write one place
// and no atomics are needed; only the loss's sum uses dev::add_to. The products are plain
// loops here, one body per output element: correct on both sides, and the reference the
// GEMM-library path of a later step is tested against.
#pragma once

#include <cmath>

#include "rootclad/device.h"

namespace rootclad {
namespace dev {

// p[0..n) = value (adjoints start at zero: the backward kernels add)
template <class On, class T> void fill(On on, T* p, long n, T value) {
  each_index(on, n, ROOTCLAD_BODY(long i) { p[i] = value; });
}

// d_bias[o] += sum over rows r and positions l of d_out[r, o, l] (d_out: rows x OC x L)
template <class On, class T>
void bias_backward(On on, T* d_bias, const T* d_out, long rows, int OC, int L) {
  each_index(
      on, (long)OC, ROOTCLAD_BODY(long o) {
        T s = 0;
        for (long r = 0; r < rows; ++r)
          for (int l = 0; l < L; ++l)
            s += d_out[(r * OC + o) * L + l];
        d_bias[o] += s;
      });
}

// -- Linear: out(R, OC) = inp(R, C) @ weight(OC, C)^T + bias ----------------------------------
template <class On, class T>
void linear_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int R, int C,
                    int OC) {
  each_index(
      on, (long)R * OC, ROOTCLAD_BODY(long i) {
        const long r = i / OC;
        const int o = (int)(i % OC);
        T s = bias ? bias[o] : T(0);
        for (int c = 0; c < C; ++c)
          s += inp[r * C + c] * weight[(long)o * C + c];
        out[i] = s;
      });
}

// d_inp(R, C) += d_out @ weight
template <class On, class T>
void linear_backward_input(On on, T* d_inp, const T* d_out, const T* weight, int R, int C, int OC) {
  each_index(
      on, (long)R * C, ROOTCLAD_BODY(long i) {
        const long r = i / C;
        const int c = (int)(i % C);
        T s = 0;
        for (int o = 0; o < OC; ++o)
          s += d_out[r * OC + o] * weight[(long)o * C + c];
        d_inp[i] += s;
      });
}

// d_weight(OC, C) += d_out^T @ inp;  d_bias(OC) += column sums of d_out (null: skipped)
template <class On, class T>
void linear_backward_params(On on, T* d_weight, T* d_bias, const T* d_out, const T* inp, int R,
                            int C, int OC) {
  each_index(
      on, (long)OC * C, ROOTCLAD_BODY(long i) {
        const int o = (int)(i / C);
        const int c = (int)(i % C);
        T s = 0;
        for (long r = 0; r < R; ++r)
          s += d_out[r * OC + o] * inp[r * C + c];
        d_weight[i] += s;
      });
  if (d_bias)
    bias_backward(on, d_bias, d_out, R, OC, 1);
}

// -- ReLU ------------------------------------------------------------------------------------
template <class On, class T> void relu_forward(On on, T* out, const T* inp, long n) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = inp[i] > T(0) ? inp[i] : T(0); });
}

// d_inp += d_out where the output is positive (torch: the gradient at 0 is 0)
template <class On, class T>
void relu_backward(On on, T* d_inp, const T* d_out, const T* out, long n) {
  each_index(
      on, n, ROOTCLAD_BODY(long i) {
        if (out[i] > T(0))
          d_inp[i] += d_out[i];
      });
}

// -- other elementwise activations: f(x) and df/dx given x and y = f(x), as torch has them ---
struct Tanh {
  template <class T> ROOTCLAD_HD T f(T x) const { return tanh(x); }
  template <class T> ROOTCLAD_HD T df(T, T y) const { return T(1) - y * y; }
};
struct Sigmoid {
  template <class T> ROOTCLAD_HD T f(T x) const { return T(1) / (T(1) + exp(-x)); }
  template <class T> ROOTCLAD_HD T df(T, T y) const { return y * (T(1) - y); }
};
struct Silu {
  template <class T> ROOTCLAD_HD T f(T x) const { return x / (T(1) + exp(-x)); }
  template <class T> ROOTCLAD_HD T df(T x, T) const {
    const T s = T(1) / (T(1) + exp(-x));
    return s * (T(1) + x * (T(1) - s));
  }
};
struct LeakyRelu {
  double slope;
  template <class T> ROOTCLAD_HD T f(T x) const { return x > T(0) ? x : T(slope) * x; }
  template <class T> ROOTCLAD_HD T df(T x, T) const { return x > T(0) ? T(1) : T(slope); }
};
struct Elu {
  double alpha;
  template <class T> ROOTCLAD_HD T f(T x) const { return x > T(0) ? x : T(alpha) * expm1(x); }
  template <class T> ROOTCLAD_HD T df(T x, T) const { return x > T(0) ? T(1) : T(alpha) * exp(x); }
};
struct Softplus { // x itself where beta*x > threshold
  double beta, threshold;
  template <class T> ROOTCLAD_HD T f(T x) const {
    return x * T(beta) > T(threshold) ? x : log1p(exp(x * T(beta))) / T(beta);
  }
  template <class T> ROOTCLAD_HD T df(T x, T) const {
    if (x * T(beta) > T(threshold))
      return T(1);
    const T z = exp(x * T(beta));
    return z / (z + T(1));
  }
};
struct Gelu { // exact (erf) or, with tanh_form, torch's tanh approximation
  int tanh_form;
  template <class T> ROOTCLAD_HD T f(T x) const {
    if (tanh_form) {
      const T k = T(0.7978845608028654); // sqrt(2/pi)
      return T(0.5) * x * (T(1) + tanh(k * (x + T(0.044715) * x * x * x)));
    }
    return T(0.5) * x * (T(1) + erf(x * T(0.7071067811865476)));
  }
  template <class T> ROOTCLAD_HD T df(T x, T) const {
    if (tanh_form) {
      const T k = T(0.7978845608028654);
      const T t = tanh(k * (x + T(0.044715) * x * x * x));
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(0.134145) * x * x);
    }
    return T(0.5) * (T(1) + erf(x * T(0.7071067811865476))) +
           x * exp(T(-0.5) * x * x) * T(0.3989422804014327); // 1/sqrt(2 pi)
  }
};

template <class On, class T, class Op>
void unary_forward(On on, T* out, const T* inp, long n, Op op) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = op.f(inp[i]); });
}

// d_inp += d_out * f'(x)
template <class On, class T, class Op>
void unary_backward(On on, T* d_inp, const T* d_out, const T* inp, const T* out, long n, Op op) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_inp[i] += d_out[i] * op.df(inp[i], out[i]); });
}

// -- Conv1d: out(B, OC, LO) from inp(B, C, L), weight(OC, C, K), stride S, padding P, dilation D
inline ROOTCLAD_HD int conv1d_out_len(int L, int K, int S, int P, int D) {
  return (L + 2 * P - D * (K - 1) - 1) / S + 1;
}

template <class On, class T>
void conv1d_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int B, int C,
                    int L, int OC, int K, int S, int P, int D) {
  const int LO = conv1d_out_len(L, K, S, P, D);
  each_index(
      on, (long)B * OC * LO, ROOTCLAD_BODY(long i) {
        const int l = (int)(i % LO);
        const int o = (int)(i / LO % OC);
        const long b = i / ((long)LO * OC);
        T s = bias ? bias[o] : T(0);
        for (int c = 0; c < C; ++c) {
          const T* x = inp + (b * C + c) * L;
          const T* w = weight + ((long)o * C + c) * K;
          for (int k = 0; k < K; ++k) {
            const int at = l * S - P + k * D;
            if (at >= 0 && at < L)
              s += w[k] * x[at];
          }
        }
        out[i] = s;
      });
}

// d_inp[b, c, at] += sum over (o, k) and the output l that read it: l*S - P + k*D = at
template <class On, class T>
void conv1d_backward_input(On on, T* d_inp, const T* d_out, const T* weight, int B, int C, int L,
                           int OC, int K, int S, int P, int D) {
  const int LO = conv1d_out_len(L, K, S, P, D);
  each_index(
      on, (long)B * C * L, ROOTCLAD_BODY(long i) {
        const int at = (int)(i % L);
        const int c = (int)(i / L % C);
        const long b = i / ((long)L * C);
        T s = 0;
        for (int k = 0; k < K; ++k) {
          const int t = at + P - k * D; // = l*S
          if (t < 0 || t % S != 0 || t / S >= LO)
            continue;
          const int l = t / S;
          for (int o = 0; o < OC; ++o)
            s += weight[((long)o * C + c) * K + k] * d_out[(b * OC + o) * LO + l];
        }
        d_inp[i] += s;
      });
}

// d_weight[o, c, k] += sum_{b, l} d_out[b, o, l] * inp[b, c, l*S - P + k*D];
// d_bias[o] += sum_{b, l} d_out[b, o, l] (null: skipped)
template <class On, class T>
void conv1d_backward_params(On on, T* d_weight, T* d_bias, const T* d_out, const T* inp, int B,
                            int C, int L, int OC, int K, int S, int P, int D) {
  const int LO = conv1d_out_len(L, K, S, P, D);
  each_index(
      on, (long)OC * C * K, ROOTCLAD_BODY(long i) {
        const int k = (int)(i % K);
        const int c = (int)(i / K % C);
        const int o = (int)(i / ((long)K * C));
        T s = 0;
        for (long b = 0; b < B; ++b)
          for (int l = 0; l < LO; ++l) {
            const int at = l * S - P + k * D;
            if (at >= 0 && at < L)
              s += d_out[(b * OC + o) * LO + l] * inp[(b * C + c) * L + at];
          }
        d_weight[i] += s;
      });
  if (d_bias)
    bias_backward(on, d_bias, d_out, B, OC, LO);
}

// -- MaxPool1d over inp(R, L) -> out(R, LO), window K, stride S, padding P (-inf outside) ------
// The first maximum of a window takes its gradient, as in torch.
template <class T>
ROOTCLAD_HD inline int maxpool1d_argmax(const T* x, int L, int l, int K, int S, int P) {
  int best = -1;
  for (int k = 0; k < K; ++k) {
    const int at = l * S - P + k;
    if (at >= 0 && at < L && (best < 0 || x[at] > x[best]))
      best = at;
  }
  return best;
}

template <class On, class T>
void maxpool1d_forward(On on, T* out, const T* inp, long R, int L, int K, int S, int P) {
  const int LO = (L + 2 * P - K) / S + 1;
  each_index(
      on, R * LO, ROOTCLAD_BODY(long i) {
        const T* x = inp + i / LO * L;
        out[i] = x[maxpool1d_argmax(x, L, (int)(i % LO), K, S, P)];
      });
}

// d_inp[r, at] += d_out[r, l] for each window l whose first maximum is at
template <class On, class T>
void maxpool1d_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, int L, int K, int S,
                        int P) {
  const int LO = (L + 2 * P - K) / S + 1;
  each_index(
      on, R * L, ROOTCLAD_BODY(long i) {
        const long r = i / L;
        const int at = (int)(i % L);
        const T* x = inp + r * L;
        // windows l with l*S - P <= at < l*S - P + K
        int lo = at + P - K + 1;
        lo = lo <= 0 ? 0 : (lo + S - 1) / S;
        int hi = (at + P) / S;
        if (hi > LO - 1)
          hi = LO - 1;
        T s = 0;
        for (int l = lo; l <= hi; ++l)
          if (maxpool1d_argmax(x, L, l, K, S, P) == at)
            s += d_out[r * LO + l];
        d_inp[i] += s;
      });
}

// -- a + sign * b of two same-shape tensors (residual additions) -------------------------------
template <class On, class T>
void add_forward(On on, T* out, const T* a, const T* b, long n, T sign) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = a[i] + sign * b[i]; });
}

// d_x += scale * d_out (the adjoint of each operand; scale -1 for a subtracted one)
template <class On, class T> void add_backward(On on, T* d_x, const T* d_out, long n, T scale) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_x[i] += scale * d_out[i]; });
}

// -- global average pooling: out(R) = the mean of each row of inp(R, L) ---------------------
template <class On, class T>
void global_avgpool_forward(On on, T* out, const T* inp, long R, int L) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        T s = 0;
        for (int l = 0; l < L; ++l)
          s += inp[r * L + l];
        out[r] = s / T(L);
      });
}

template <class On, class T>
void global_avgpool_backward(On on, T* d_inp, const T* d_out, long R, int L) {
  each_index(on, R * L, ROOTCLAD_BODY(long i) { d_inp[i] += d_out[i / L] / T(L); });
}

// -- BCE with logits, mean over n elements ----------------------------------------------------
// *loss += the mean loss (the caller zeroes it); d_z = scale * d loss / d z.
template <class T> ROOTCLAD_HD inline T bce_with_logits_term(T z, T y) {
  return (z > T(0) ? z : T(0)) - z * y + log1p(exp(-fabs(z)));
}

template <class On, class T>
void bce_with_logits_forward(On on, T* loss, const T* z, const T* y, long n) {
  each_index(
      on, n, ROOTCLAD_BODY(long i) { add_to(loss, bce_with_logits_term(z[i], y[i]) / T(n)); });
}

template <class On, class T>
void bce_with_logits_backward(On on, T* d_z, const T* z, const T* y, long n, T scale) {
  each_index(
      on, n,
      ROOTCLAD_BODY(long i) { d_z[i] = scale * (T(1) / (T(1) + exp(-z[i])) - y[i]) / T(n); });
}

// -- Adam, as torch.optim.Adam (no amsgrad): step t counts from 1 ------------------------------
template <class On, class T>
void adam_step(On on, T* param, const T* grad, T* m, T* v, long n, double lr, double beta1,
               double beta2, double eps, double weight_decay, long t) {
  const double c1 = 1 - std::pow(beta1, (double)t);
  const double c2 = std::sqrt(1 - std::pow(beta2, (double)t));
  each_index(
      on, n, ROOTCLAD_BODY(long i) {
        const T g = grad[i] + T(weight_decay) * param[i];
        m[i] = T(beta1) * m[i] + T(1 - beta1) * g;
        v[i] = T(beta2) * v[i] + T(1 - beta2) * g * g;
        param[i] -= T(lr / c1) * m[i] / (sqrt(v[i]) / T(c2) + T(eps));
      });
}

} // namespace dev
} // namespace rootclad
