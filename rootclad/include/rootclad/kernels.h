// rootclad/kernels.h — the layers and losses rootclad compiles models into.
//
// Every op is a pair of stateless functions on raw pointers into one arena:
//   <op>_forward   writes its output;
//   <op>_backward  ADDS into the gradients of its inputs and parameters (+=), so fan-out
//                  and parameter sharing accumulate; the caller zeroes gradient buffers.
// Shapes are in comments; B batch, C channels in, OC channels out, L length in, LO length
// out, K kernel size, N element count. All tensors are contiguous, row-major (torch layout).
// Clad adapters for each op (<op>_forward_pullback) are in rootclad/pullbacks.h. The ops
// that join and reshape values of a graph, normalisations and newer activations are in
// rootclad/graph_ops.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "blas.h"
#include "dropout_mask.h"
#include "ops/activations.h"

namespace rootclad {
// The clad engine (with custom pullbacks) runs the forward once, then executes the reverse
// sweep Clad generated for the model's forward function. While it does, the forward kernels
// return at once (the arena already holds their outputs; BatchNorm must not count the batch
// again) and Clad's sweep calls the pullbacks. Each forward kernel starts with
// ROOTCLAD_REPLAY_SKIP.
inline thread_local bool replaying = false;
} // namespace rootclad
#ifdef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves: never replaying
#define ROOTCLAD_REPLAY_SKIP
#else
#define ROOTCLAD_REPLAY_SKIP                                                                       \
  do {                                                                                             \
    if (::rootclad::replaying)                                                                     \
      return;                                                                                      \
  } while (0)
#endif

#include "conv2d.h"
#include "graph_ops.h"
// Vectorisation hints (-fopenmp-simd). Omitted when Clad differentiates the kernels itself:
// Clad 2.5 crashes on OpenMP directives.
#ifdef ROOTCLAD_NO_PULLBACKS
#define ROOTCLAD_SIMD
#define ROOTCLAD_SIMD_SUM(var)
#else
#define ROOTCLAD_PRAGMA(x) _Pragma(#x)
#define ROOTCLAD_SIMD ROOTCLAD_PRAGMA(omp simd)
#define ROOTCLAD_SIMD_SUM(var) ROOTCLAD_PRAGMA(omp simd reduction(+ : var))
#endif

#ifndef ROOTCLAD_NO_PULLBACKS
#include "conv1d_s1.h"
#include "conv1d_sparse.h"
#endif

namespace rootclad {

template <typename T> inline void zero(T* p, long n) {
  if (n > 0)
    std::memset(p, 0, sizeof(T) * n);
}

template <typename T> inline void copy(T* dst, const T* src, long n) {
  if (n > 0)
    std::memcpy(dst, src, sizeof(T) * n);
}

template <typename T> inline void fill(T* p, long n, T value) {
  for (long i = 0; i < n; ++i)
    p[i] = value;
}

// Where a value's last reader has run (the arena planner, codegen/cpu.py): nothing here; its
// pullback (pullbacks.h) zeroes the value's adjoint before the readers' pullbacks add into it.
template <typename T> inline void adjoint_start_forward(T*, long) {}

// ---------------------------------------------------------------------------------------
// Linear: out(R,OC) = inp(R,C) @ weight(OC,C)^T + bias(OC); R = product of leading dims.
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int R, int C, int OC) {
  ROOTCLAD_REPLAY_SKIP;
  if (bias) {
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < OC; ++o)
        out[r * OC + o] = bias[o];
  }
  gemm(false, true, R, OC, C, T(1), inp, C, weight, C, bias ? T(1) : T(0), out, OC);
}

// d_inp(R,C) += d_out(R,OC) @ weight(OC,C);  d_weight(OC,C) += d_out^T @ inp;
// d_bias(OC) += column sums of d_out. Null d_inp / d_bias are skipped.
template <typename T>
void linear_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                     const T* weight, int R, int C, int OC) {
  if (d_inp)
    gemm(false, false, R, C, OC, T(1), d_out, OC, weight, C, T(1), d_inp, C);
  if (d_weight) // null: an input gradient alone was asked for
    gemm(true, false, OC, C, R, T(1), d_out, OC, inp, C, T(1), d_weight, C);
  if (d_bias)
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < OC; ++o)
        d_bias[o] += d_out[r * OC + o];
}

// ---------------------------------------------------------------------------------------
// Conv1d (groups=1) as one GEMM over the whole batch (im2col):
//   cols(C*K, B*LO)[c*K+k, b*LO+l] = inp[b, c, l*S - P + k*D]   (0 outside the input)
//   tmp(OC, B*LO) = weight(OC, C*K) @ cols
//   out[b, o, l] = tmp[o, b*LO + l] + bias[o]
// One large product lets BLAS use all cores even for small layers; cols and tmp are kept in
// the activation arena (tmp's adjoint region is the backward pass's scratch). For B == 1 the
// two layouts coincide and tmp is not used.
inline int conv1d_out_len(int L, int K, int S, int P, int D) {
  return (L + 2 * P - D * (K - 1) - 1) / S + 1;
}

// The l-range [l0, l1) of output positions whose input index l*S - P + k*D lies in [0, L).
inline void conv1d_valid_range(int L, int LO, int S, int off, int& l0, int& l1) {
  l0 = off >= 0 ? 0 : (-off + S - 1) / S;
  l1 = L - off <= 0 ? 0 : (L - 1 - off) / S + 1;
  if (l1 > LO)
    l1 = LO;
  if (l0 > l1)
    l0 = l1;
}

template <typename T>
void conv1d_im2col(T* cols, const T* inp, int B, int C, int L, int K, int S, int P, int D, int LO) {
  const long NL = (long)B * LO;
  for (int c = 0; c < C; ++c)
    for (int k = 0; k < K; ++k) {
      int off = k * D - P, l0, l1;
      conv1d_valid_range(L, LO, S, off, l0, l1);
      for (int b = 0; b < B; ++b) {
        T* row = cols + (c * K + k) * NL + (long)b * LO;
        const T* src = inp + ((long)b * C + c) * L + off;
        for (int l = 0; l < l0; ++l)
          row[l] = T(0);
        if (S == 1)
          for (int l = l0; l < l1; ++l)
            row[l] = src[l];
        else
          for (int l = l0; l < l1; ++l)
            row[l] = src[(long)l * S];
        for (int l = l1; l < LO; ++l)
          row[l] = T(0);
      }
    }
}

// Direct convolution, for stride 1 (the register-blocked kernels of conv1d_s1.h, or these
// loops for rows shorter than a vector) and for layers with few input taps (C*K small, e.g. a
// strided first layer on raw strain): im2col there would copy the input K times to feed a
// GEMM too thin to be efficient. Each output row stays in L1 while the taps are added into it.
// Only the other layers need im2col's cols/tmp scratch (rootclad/codegen/cpu_ops.py mirrors this).
constexpr int CONV1D_DIRECT_MAX_TAPS = 32;
inline bool conv1d_is_direct(int C, int K, int S) {
  return S == 1 || C * K <= CONV1D_DIRECT_MAX_TAPS;
}

template <typename T>
void conv1d_direct_forward(T* out, const T* inp, const T* weight, const T* bias, int B, int C,
                           int L, int OC, int K, int S, int P, int D, int LO) {
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < OC; ++o) {
      T* dst = out + ((long)b * OC + o) * LO;
      T bo = bias ? bias[o] : T(0);
      for (int l = 0; l < LO; ++l)
        dst[l] = bo;
      for (int c = 0; c < C; ++c)
        for (int k = 0; k < K; ++k) {
          int off = k * D - P, l0, l1;
          conv1d_valid_range(L, LO, S, off, l0, l1);
          const T w = weight[(o * C + c) * K + k];
          const T* src = inp + ((long)b * C + c) * L + off;
          if (S == 1) {
            ROOTCLAD_SIMD
            for (int l = l0; l < l1; ++l)
              dst[l] += w * src[l];
          } else {
            for (int l = l0; l < l1; ++l)
              dst[l] += w * src[(long)l * S];
          }
        }
    }
}

// d_bias(OC) += sums of d_out;  d_weight[o,c,k] += sum_{b,l} d_out[b,o,l] * inp[b,c,l*S+k*D-P];
// d_inp[b,c,l*S+k*D-P] += weight[o,c,k] * d_out[b,o,l]. For every output position the K taps
// are accumulated as one short vector (the loop over l stays sequential), which keeps the
// reduction out of a single dependency chain.
template <typename T>
void conv1d_direct_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                            const T* weight, int B, int C, int L, int OC, int K, int S, int P,
                            int D, int LO) {
  T acc[CONV1D_DIRECT_MAX_TAPS];
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < OC; ++o) {
      const T* g = d_out + ((long)b * OC + o) * LO;
      if (d_bias) {
        T s = 0;
        ROOTCLAD_SIMD_SUM(s)
        for (int l = 0; l < LO; ++l)
          s += g[l];
        d_bias[o] += s;
      }
      for (int c = 0; c < C; ++c) {
        const T* x = inp + ((long)b * C + c) * L;
        for (int k0 = 0; d_weight && k0 < K; k0 += CONV1D_DIRECT_MAX_TAPS) { // taps k0..k0+nk-1
          const int nk = K - k0 < CONV1D_DIRECT_MAX_TAPS ? K - k0 : CONV1D_DIRECT_MAX_TAPS;
          for (int k = 0; k < nk; ++k)
            acc[k] = 0;
          for (int l = 0; l < LO; ++l) {
            const T gl = g[l];
            const int i0 = l * S - P + k0 * D;
            if (i0 >= 0 && i0 + (nk - 1) * D < L) { // all taps inside the input
              const T* xs = x + i0;
              if (D == 1) {
                ROOTCLAD_SIMD
                for (int k = 0; k < nk; ++k)
                  acc[k] += gl * xs[k];
              } else {
                for (int k = 0; k < nk; ++k)
                  acc[k] += gl * xs[k * D];
              }
            } else {
              for (int k = 0; k < nk; ++k) {
                int i = i0 + k * D;
                if (i >= 0 && i < L)
                  acc[k] += gl * x[i];
              }
            }
          }
          T* dw = d_weight + (o * C + c) * K + k0;
          for (int k = 0; k < nk; ++k)
            dw[k] += acc[k];
        }
        if (!d_inp)
          continue;
        const T* w = weight + (o * C + c) * K;
        T* dx = d_inp + ((long)b * C + c) * L;
        for (int k = 0; k < K; ++k) {
          int off = k * D - P, l0, l1;
          conv1d_valid_range(L, LO, S, off, l0, l1);
          const T wk = w[k];
          if (S == 1) {
            ROOTCLAD_SIMD
            for (int l = l0; l < l1; ++l)
              dx[off + l] += wk * g[l];
          } else {
            for (int l = l0; l < l1; ++l)
              dx[off + (long)l * S] += wk * g[l];
          }
        }
      }
    }
}

#ifdef ROOTCLAD_NO_PULLBACKS
// What Clad differentiates when it writes the whole backward itself: the definition of a
// convolution as plain loops (out[b,o,l] = bias[o] + sum_{c,k} w[o,c,k] inp[b,c,l*S-P+k*D]).
template <typename T>
void conv1d_forward(T* out, T* tmp, T* cols, const T* inp, const T* weight, const T* bias, int B,
                    int C, int L, int OC, int K, int S, int P, int D) {
  ROOTCLAD_REPLAY_SKIP;
  const int LO = conv1d_out_len(L, K, S, P, D);
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < OC; ++o)
      for (int l = 0; l < LO; ++l) {
        T s = bias ? bias[o] : T(0);
        for (int c = 0; c < C; ++c)
          for (int k = 0; k < K; ++k) {
            int i = l * S - P + k * D;
            if (i >= 0 && i < L)
              s += weight[(o * C + c) * K + k] * inp[((long)b * C + c) * L + i];
          }
        out[((long)b * OC + o) * LO + l] = s;
      }
}
#else
template <typename T>
void conv1d_forward(T* out, T* tmp, T* cols, const T* inp, const T* weight, const T* bias, int B,
                    int C, int L, int OC, int K, int S, int P, int D) {
  ROOTCLAD_REPLAY_SKIP;
  const int LO = conv1d_out_len(L, K, S, P, D);
  const int CK = C * K;
  const long NL = (long)B * LO;
  if (S == 1 && conv_s1::forward(out, inp, weight, bias, B, C, L, OC, K, P, D, LO))
    return;
  if (conv1d_is_direct(C, K, S))
    return conv1d_direct_forward(out, inp, weight, bias, B, C, L, OC, K, S, P, D, LO);
  conv1d_im2col(cols, inp, B, C, L, K, S, P, D, LO);
  T* prod = B == 1 ? out : tmp;
  gemm(false, false, OC, (int)NL, CK, T(1), weight, CK, cols, (int)NL, T(0), prod, (int)NL);
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < OC; ++o) {
      T* dst = out + ((long)b * OC + o) * LO;
      const T* src = prod + o * NL + (long)b * LO;
      T bo = bias ? bias[o] : T(0);
      for (int l = 0; l < LO; ++l)
        dst[l] = src[l] + bo;
    }
}
#endif

// With g(OC, B*LO) = d_out laid out like tmp (d_tmp is its scratch):
//   d_weight(OC, C*K) += g @ cols^T;   d_bias(OC) += row sums of g;
//   d_cols(C*K, B*LO) = weight^T @ g, scattered back into d_inp by the inverse of im2col.
// A null d_inp skips that half (the network input, when no input gradient is wanted).
template <typename T>
void conv1d_backward(T* d_inp, T* d_weight, T* d_bias, T* d_tmp, T* d_cols, const T* d_out,
                     const T* cols, const T* inp, const T* weight, int B, int C, int L, int OC,
                     int K, int S, int P, int D) {
  const int LO = conv1d_out_len(L, K, S, P, D);
  const int CK = C * K;
  const long NL = (long)B * LO;
#ifndef ROOTCLAD_NO_PULLBACKS
  // (the sparse pass forms d_weight and d_inp together: not for an input gradient alone)
  if (d_weight && conv_sparse::backward(d_inp, d_weight, d_bias, d_out, inp, weight, B, C, L, OC, K,
                                        S, P, D, LO))
    return;
  if (S == 1 &&
      conv_s1::backward(d_inp, d_weight, d_bias, d_out, inp, weight, B, C, L, OC, K, P, D, LO))
    return;
#endif
  if (conv1d_is_direct(C, K, S))
    return conv1d_direct_backward(d_inp, d_weight, d_bias, d_out, inp, weight, B, C, L, OC, K, S, P,
                                  D, LO);
  const T* g = d_out;
  if (B > 1) {
    for (int b = 0; b < B; ++b)
      for (int o = 0; o < OC; ++o)
        copy(d_tmp + o * NL + (long)b * LO, d_out + ((long)b * OC + o) * LO, LO);
    g = d_tmp;
  }
  if (d_weight)
    gemm(false, true, OC, CK, (int)NL, T(1), g, (int)NL, cols, (int)NL, T(1), d_weight, CK);
  if (d_bias)
    for (int o = 0; o < OC; ++o) {
      T s = 0;
      for (long i = 0; i < NL; ++i)
        s += g[o * NL + i];
      d_bias[o] += s;
    }
  if (!d_inp)
    return;
  gemm(true, false, CK, (int)NL, OC, T(1), weight, CK, g, (int)NL, T(0), d_cols, (int)NL);
  for (int c = 0; c < C; ++c)
    for (int k = 0; k < K; ++k) {
      int off = k * D - P, l0, l1;
      conv1d_valid_range(L, LO, S, off, l0, l1);
      for (int b = 0; b < B; ++b) {
        const T* row = d_cols + (c * K + k) * NL + (long)b * LO;
        T* dst = d_inp + ((long)b * C + c) * L + off;
        if (S == 1)
          for (int l = l0; l < l1; ++l)
            dst[l] += row[l];
        else
          for (int l = l0; l < l1; ++l)
            dst[(long)l * S] += row[l];
      }
    }
}

// ---------------------------------------------------------------------------------------
// Pooling over the last axis of inp(R, L) -> out(R, LO), LO = (L + 2P - K)/S + 1.
// R = B*C rows. MaxPool takes the first maximum (as torch does); the backward finds it again.
#ifndef ROOTCLAD_NO_PULLBACKS
// Non-overlapping windows of a compile-time size K: the window loop unrolled, the compiler
// vectorises over windows, which it cannot do for the runtime-K loop below.
template <typename T, int K>
void maxpool1d_forward_windows(T* out, const T* inp, long R, int L, int LO) {
  for (long r = 0; r < R; ++r) {
    const T* x = inp + r * L;
    T* y = out + r * LO;
    for (int o = 0; o < LO; ++o) {
      T best = x[(long)o * K];
      ROOTCLAD_UNROLL
      for (int k = 1; k < K; ++k) {
        const T v = x[(long)o * K + k];
        best = (v > best || v != v) ? v : best; // v != v: NaN propagates, as in torch
      }
      y[o] = best;
    }
  }
}
#endif

template <typename T>
void maxpool1d_forward(T* out, const T* inp, int R, int L, int K, int S, int P) {
  ROOTCLAD_REPLAY_SKIP;
  int LO = (L + 2 * P - K) / S + 1;
#ifndef ROOTCLAD_NO_PULLBACKS
  if (S == K && P == 0 && (K == 2 || K == 3 || K == 4 || K == 8)) {
    if (K == 2)
      return maxpool1d_forward_windows<T, 2>(out, inp, R, L, LO);
    if (K == 3)
      return maxpool1d_forward_windows<T, 3>(out, inp, R, L, LO);
    if (K == 4)
      return maxpool1d_forward_windows<T, 4>(out, inp, R, L, LO);
    return maxpool1d_forward_windows<T, 8>(out, inp, R, L, LO);
  }
#endif
  if (S == K && P == 0) { // non-overlapping windows inside the input: vectorised over windows
    for (long r = 0; r < R; ++r) {
      const T* x = inp + r * L;
      T* y = out + r * LO;
      for (int o = 0; o < LO; ++o)
        y[o] = x[(long)o * K];
      for (int k = 1; k < K; ++k)
        for (int o = 0; o < LO; ++o) {
          T v = x[(long)o * K + k];
          y[o] = (v > y[o] || v != v) ? v : y[o]; // v != v: NaN propagates, as in torch
        }
    }
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < LO; ++o) {
      int start = o * S - P;
      T m = -INFINITY;
      for (int k = 0; k < K; ++k) {
        int i = start + k;
        if (i >= 0 && i < L && (inp[(long)r * L + i] > m || std::isnan(inp[(long)r * L + i])))
          m = inp[(long)r * L + i];
      }
      out[(long)r * LO + o] = m;
    }
}

// Non-overlapping windows (S == K, P == 0), given the forward's output m: the gradient of
// window o goes to its first element equal to m[o], the first maximum (as torch), or to its
// first NaN. With K a compile-time constant (the common sizes) the window loop is unrolled
// and branch-free; no argmax is kept between the passes.
template <typename T, int K>
void maxpool1d_backward_windows(T* d_inp, const T* d_out, const T* out, const T* inp, long R, int L,
                                int LO, int Kr) {
  const int KK = K > 0 ? K : Kr;
  for (long r = 0; r < R; ++r) {
    const T* x = inp + r * L;
    const T* m = out + r * LO;
    const T* g = d_out + r * LO;
    T* dx = d_inp + r * L;
    for (int o = 0; o < LO; ++o) {
      // the first element equal to the maximum (or the first NaN, when the maximum is NaN)
      // takes the gradient; branch-free: every element adds either it or zero
      const T mo = m[o];
      T rem = g[o];
      for (int k = 0; k < KK; ++k) {
        const T v = x[(long)o * KK + k];
        const bool hit = (v == mo) | (v != v);
        dx[(long)o * KK + k] += hit ? rem : T(0);
        rem = hit ? T(0) : rem;
      }
    }
  }
}

template <typename T>
void maxpool1d_backward(T* d_inp, const T* d_out, const T* out, const T* inp, int R, int L, int K,
                        int S, int P) {
  int LO = (L + 2 * P - K) / S + 1;
  if (S == K && P == 0) {
    switch (K) {
    case 2:
      return maxpool1d_backward_windows<T, 2>(d_inp, d_out, out, inp, R, L, LO, K);
    case 3:
      return maxpool1d_backward_windows<T, 3>(d_inp, d_out, out, inp, R, L, LO, K);
    case 4:
      return maxpool1d_backward_windows<T, 4>(d_inp, d_out, out, inp, R, L, LO, K);
    case 8:
      return maxpool1d_backward_windows<T, 8>(d_inp, d_out, out, inp, R, L, LO, K);
    default:
      return maxpool1d_backward_windows<T, 0>(d_inp, d_out, out, inp, R, L, LO, K);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < LO; ++o) {
      int start = o * S - P;
      int arg = -1;
      T m = -INFINITY;
      for (int k = 0; k < K; ++k) {
        int i = start + k;
        const T v = i >= 0 && i < L ? inp[(long)r * L + i] : T(0);
        // the first maximum, or the first NaN (the forward's output then), as the
        // non-overlapping path above
        if (i >= 0 && i < L && (arg < 0 || (m == m && (v > m || v != v)))) {
          m = v;
          arg = i;
        }
      }
      if (arg >= 0)
        d_inp[(long)r * L + arg] += d_out[(long)r * LO + o];
    }
}

// AvgPool: with count_include_pad (torch's default) every window divides by K, otherwise by
// the number of its elements inside the input.
template <typename T>
void avgpool1d_forward(T* out, const T* inp, int R, int L, int K, int S, int P,
                       int count_include_pad) {
  ROOTCLAD_REPLAY_SKIP;
  int LO = (L + 2 * P - K) / S + 1;
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < LO; ++o) {
      int start = o * S - P;
      T s = 0;
      int n = 0;
      for (int k = 0; k < K; ++k) {
        int i = start + k;
        if (i >= 0 && i < L) {
          s += inp[(long)r * L + i];
          ++n;
        }
      }
      int div = count_include_pad ? K : n;
      out[(long)r * LO + o] = div > 0 ? s / div : T(0);
    }
}

template <typename T>
void avgpool1d_backward(T* d_inp, const T* d_out, int R, int L, int K, int S, int P,
                        int count_include_pad) {
  int LO = (L + 2 * P - K) / S + 1;
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < LO; ++o) {
      int start = o * S - P;
      int n = 0;
      for (int k = 0; k < K; ++k)
        n += (start + k >= 0 && start + k < L);
      int div = count_include_pad ? K : n;
      if (div == 0)
        continue;
      T g = d_out[(long)r * LO + o] / div;
      for (int k = 0; k < K; ++k) {
        int i = start + k;
        if (i >= 0 && i < L)
          d_inp[(long)r * L + i] += g;
      }
    }
}

// ---------------------------------------------------------------------------------------
// Elementwise ops over N elements: the functor's value and derivative (ops/activations.h).
// out[i] = f(inp[i])
template <typename T, class F> void unary_forward(T* out, const T* inp, int N, F f) {
  ROOTCLAD_REPLAY_SKIP;
  for (int i = 0; i < N; ++i)
    out[i] = f.f(inp[i]);
}
// d_inp[i] += the functor's grad: d_out[i] times f'(inp[i]), from the input or the output
template <typename T, class F>
void unary_backward(T* d_inp, const T* d_out, const T* inp, const T* out, int N, F f) {
  for (int i = 0; i < N; ++i)
    d_inp[i] += f.grad(d_out[i], inp[i], out[i]);
}

// ---------------------------------------------------------------------------------------
// Dropout (training): the mask is dropout_mask.h's, recomputed by the backward pass.
template <typename T>
void dropout_forward(T* out, const T* inp, int N, T p, std::uint64_t seed, long i0) {
  ROOTCLAD_REPLAY_SKIP;
  for (int i = 0; i < N; ++i)
    out[i] = inp[i] * dropout_scale(seed, i0 + i, p);
}
template <typename T>
void dropout_backward(T* d_inp, const T* d_out, int N, T p, std::uint64_t seed, long i0) {
  for (int i = 0; i < N; ++i)
    d_inp[i] += d_out[i] * dropout_scale(seed, i0 + i, p);
}

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
// weights of 1 give the unweighted loss. For rows [0, B) of a batch of Bf samples with K
// outputs each (z, y, w and d_z point at the chunk's first row), returns the chunk's share
// and writes (not adds) d_z = dL/dz. kind: 0 bce_with_logits, 1 mse, 2 cross_entropy,
// 3 nll, 4 huber.
template <typename T>
T weighted_loss(int kind, const T* z, const T* y, const T* w, T* d_z, int Bf, int B, int K) {
  T s = 0;
  if (kind == 3) {
    for (int b = 0; b < B; ++b) {
      const int t = (int)y[b];
      s -= w[b] * z[(long)b * K + t];
      for (int c = 0; c < K; ++c)
        d_z[(long)b * K + c] = c == t ? -w[b] / Bf : T(0);
    }
    return s / Bf;
  }
  if (kind == 2) {
    for (int b = 0; b < B; ++b) {
      const T* zb = z + (long)b * K;
      T m;
      const T e = softmax_denominator(zb, K, m);
      const int t = (int)y[b];
      s += w[b] * (m + std::log(e) - zb[t]);
      for (int c = 0; c < K; ++c)
        d_z[(long)b * K + c] = w[b] * (std::exp(zb[c] - m) / e - (c == t ? T(1) : T(0))) / Bf;
    }
    return s / Bf;
  }
  const T N = T(Bf) * T(K);
  for (int b = 0; b < B; ++b)
    for (int k = 0; k < K; ++k) {
      const long i = (long)b * K + k;
      const T zi = z[i], yi = y[i];
      if (kind == 0) { // as bce_with_logits_forward / _backward
        const T az = zi > 0 ? zi : -zi;
        s += w[b] * ((zi > 0 ? zi : T(0)) - zi * yi + std::log1p(std::exp(-az)));
        const T sig =
            zi >= 0 ? T(1) / (T(1) + std::exp(-zi)) : std::exp(zi) / (T(1) + std::exp(zi));
        d_z[i] = w[b] * (sig - yi) / N;
      } else if (kind == 4) {
        s += w[b] * huber_term(zi - yi);
        d_z[i] = w[b] * huber_slope(zi - yi) / N;
      } else {
        s += w[b] * (zi - yi) * (zi - yi);
        d_z[i] = w[b] * T(2) * (zi - yi) / N;
      }
    }
  return s / N;
}

} // namespace rootclad
