// rootclad/ops/conv1d_impl.h — the definitions of the kernels conv1d.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_CONV1D_IMPL_H
#define ROOTCLAD_OPS_CONV1D_IMPL_H

#include "../simd.h"
#include "core.h"
#ifndef ROOTCLAD_NO_PULLBACKS
#include "conv1d_s1.h"
#include "conv1d_sparse.h"
#endif
#include "conv1d.h"

namespace rootclad {

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
          } else if (S == 2) { // a stride the compiler knows: two loads and a shuffle a vector
            for (int l = l0; l < l1; ++l)
              dst[l] += w * src[2L * l];
          } else {
            for (int l = l0; l < l1; ++l)
              dst[l] += w * src[(long)l * S];
          }
        }
    }
}

// dw[k] += sum_l g[l] * x[l*S - P + (k0 + k)*D] for the nk taps k0..k0+nk-1 of one (o, c) row
// pair. For every output position the taps are accumulated as one short vector (the loop over
// l stays sequential), which keeps the reduction out of a single dependency chain. NK > 0 is nk
// known to the compiler: undilated, a whole number of vectors of taps is then held in
// registers (an array of nk at run time lived on the stack, stored and reloaded every
// position: the GW ResNet's 16-tap strided stem spent 7-9% of its train step there).
template <int NK, typename T>
void conv1d_tap_sums(T* dw, const T* g, const T* x, int L, int LO, int S, int P, int D, int k0,
                     int nk) {
  const int n = NK ? NK : nk;
  T acc[CONV1D_DIRECT_MAX_TAPS];
  for (int k = 0; k < n; ++k)
    acc[k] = 0;
  // [la, lb): the positions whose n taps all lie inside the input
  int la, lb, fa, fb;
  conv1d_valid_range(L, LO, S, k0 * D - P, la, lb);
  conv1d_valid_range(L, LO, S, (k0 + n - 1) * D - P, fa, fb);
  la = la > fa ? la : fa;
  lb = lb < fb ? lb : fb;
  if (lb <= la)
    la = lb = LO; // none: every position goes the checked way
  for (int l = 0; l < LO; ++l) {
    if (l == la) { // the inside
      const T* xs = x + (long)la * S - P + k0 * D;
      constexpr int VL = simd::lanes<T>();
      if (NK > 0 && NK % VL == 0 && D == 1) {
        constexpr int NV = NK > 0 && NK % VL == 0 ? NK / VL : 1; // 1: the branch is not taken
        simd::V<T> va[NV];
        for (int v = 0; v < NV; ++v)
          va[v] = simd::V<T>{};
        for (int i = 0; i < lb - la; ++i, xs += S) {
          const simd::V<T> gv = simd::splat<T>(g[la + i]);
          for (int v = 0; v < NV; ++v)
            va[v] += gv * simd::load(xs + v * VL);
        }
        for (int v = 0; v < NV; ++v)
          for (int j = 0; j < VL; ++j)
            acc[v * VL + j] += va[v][j];
      } else {
        for (int i = 0; i < lb - la; ++i, xs += S) {
          const T gl = g[la + i];
          ROOTCLAD_SIMD
          for (int k = 0; k < n; ++k)
            acc[k] += gl * xs[k * D];
        }
      }
      l = lb - 1;
      continue;
    }
    const T gl = g[l];
    const int i0 = l * S - P + k0 * D;
    for (int k = 0; k < n; ++k) {
      int i = i0 + k * D;
      if (i >= 0 && i < L)
        acc[k] += gl * x[i];
    }
  }
  for (int k = 0; k < n; ++k)
    dw[k] += acc[k];
}

// d_bias(OC) += sums of d_out;  d_weight[o,c,k] += sum_{b,l} d_out[b,o,l] * inp[b,c,l*S+k*D-P];
// d_inp[b,c,l*S+k*D-P] += weight[o,c,k] * d_out[b,o,l].
template <typename T>
void conv1d_direct_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                            const T* weight, int B, int C, int L, int OC, int K, int S, int P,
                            int D, int LO) {
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
          T* dw = d_weight + (o * C + c) * K + k0;
          if (nk == 16)
            conv1d_tap_sums<16>(dw, g, x, L, LO, S, P, D, k0, nk);
          else if (nk == 8)
            conv1d_tap_sums<8>(dw, g, x, L, LO, S, P, D, k0, nk);
          else
            conv1d_tap_sums<0>(dw, g, x, L, LO, S, P, D, k0, nk);
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

} // namespace rootclad

#endif // ROOTCLAD_OPS_CONV1D_IMPL_H
