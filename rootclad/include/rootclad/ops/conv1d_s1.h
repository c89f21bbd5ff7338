// rootclad/ops/conv1d_s1.h — stride-1 Conv1d as register-blocked direct convolution.
//
// For stride 1 a convolution needs no im2col: output row o of one sample is
//   out[o, l] = bias[o] + sum_{c,k} w[o,c,k] * x[c, l + k*D]      (x zero-padded by P)
// and a block of OB output channels x LB vectors of positions is accumulated in registers
// while the C*K taps stream past: per tap, LB vector loads of x and OB broadcast weights
// feed OB*LB fused multiply-adds. Nothing of size C*K*LO is written, which is what made
// the im2col + BLAS path memory-bound on conv layers with few channels. The backward pass
// has the same two shapes:
//   d_x = full correlation of d_out with the flipped, transposed kernel (the forward
//         kernel again, on d_out zero-padded by (K-1)*D);
//   d_w[o,c,k] = sum_{b,l} d_out[b,o,l] * x[b,c,l+k*D]: OB x KB accumulators, vectors
//         along l, summed across lanes once per block.
// Row tails are handled by one more block that ends at the last position and overlaps the
// previous one; lanes already written are skipped (or, in d_w, zeroed in the loaded vector).
// Rows shorter than one vector return false: the caller then uses the scalar loops.
#ifndef ROOTCLAD_OPS_CONV1D_S1_H
#define ROOTCLAD_OPS_CONV1D_S1_H

#include <vector>

#include "../simd.h"

namespace rootclad {
namespace conv_s1 {

using simd::V;

// Where tap k of a channel's row is read, relative to the output position: k*D for a 1-D
// convolution; for a 2-D one over a flattened zero-padded image, a table (conv2d_s1 below).
// `taps`: the kernel's length when the compiler knows it (0: the K passed at run time).
struct Dilated {
  static constexpr int taps = 0;
  int D;
  int operator()(int k) const { return k * D; }
};
struct TapTable {
  static constexpr int taps = 0;
  const int* offs;
  int operator()(int k) const { return offs[k]; }
};
// Undilated taps, KC of them when KC > 0. The runtime is built once for every shape, so the
// common 1-D kernel lengths get these instances: with K and the tap offsets known, the tap
// loop of rows_block unrolls and its weight offsets become constants (what the per-model
// builds got from constant shapes; the GW ResNet's 7-tap blocks were 25% of its train step).
template <int KC> struct Unit {
  static constexpr int taps = KC;
  int operator()(int k) const { return k; }
};

// f(tap) with the tap policy for kernel length K and dilation D.
template <class F> void with_taps(int K, int D, F&& f) {
  if (D != 1)
    return f(Dilated{D});
  switch (K) {
  case 3:
    return f(Unit<3>{});
  case 5:
    return f(Unit<5>{});
  case 7:
    return f(Unit<7>{});
  case 8:
    return f(Unit<8>{});
  case 16:
    return f(Unit<16>{});
  default:
    return f(Unit<0>{});
  }
}

// Per-thread scratch, grown on first use and then reused: no allocation in steady state.
template <typename T> T* scratch(int slot, long n) {
  static thread_local std::vector<T> bufs[6];
  std::vector<T>& b = bufs[slot];
  if ((long)b.size() < n)
    b.resize(n);
  return b.data();
}

// Rows of length L copied into rows of length L + 2*P, zeros on both sides.
template <typename T> void pad_rows(T* dst, const T* src, long rows, int L, int P) {
  const int Lp = L + 2 * P;
  for (long r = 0; r < rows; ++r) {
    T* d = dst + r * Lp;
    for (int i = 0; i < P; ++i)
      d[i] = d[P + L + i] = T(0);
    std::memcpy(d + P, src + r * L, sizeof(T) * L);
  }
}

// out[o, l0 + j] for o in [o0, o0 + OB), j in [skip, LB*lanes): assigned (= bias + sum) or,
// with ACC, added to. x has C rows of stride Lx; w is (OC, C, K); out has rows of stride LO.
template <typename T, int OB, int LB, bool ACC, class Tap>
inline void rows_block(T* out, const T* x, const T* w, const T* bias, int C, int Lx, int K, Tap tap,
                       int LO, int o0, int l0, int skip) {
  using VT = V<T>;
  constexpr int VL = simd::lanes<T>();
  const int CK = C * (Tap::taps ? Tap::taps : K);
  VT acc[OB][LB];
  ROOTCLAD_UNROLL
  for (int o = 0; o < OB; ++o) {
    const VT b = simd::splat<T>(!ACC && bias ? bias[o0 + o] : T(0));
    ROOTCLAD_UNROLL
    for (int j = 0; j < LB; ++j)
      acc[o][j] = b;
  }
  const T* wo = w + (long)o0 * CK;
  const int KK = Tap::taps ? Tap::taps : K;
  for (int c = 0; c < C; ++c) {
    const T* xr = x + (long)c * Lx + l0;
    const T* wc = wo + c * KK;
    for (int k = 0; k < KK; ++k) {
      VT xv[LB];
      ROOTCLAD_UNROLL
      for (int j = 0; j < LB; ++j)
        xv[j] = simd::load(xr + tap(k) + j * VL);
      ROOTCLAD_UNROLL
      for (int o = 0; o < OB; ++o) {
        const VT wv = simd::splat<T>(wc[o * CK + k]);
        ROOTCLAD_UNROLL
        for (int j = 0; j < LB; ++j)
          acc[o][j] += wv * xv[j];
      }
    }
  }
  ROOTCLAD_UNROLL
  for (int o = 0; o < OB; ++o) {
    T* dst = out + (long)(o0 + o) * LO + l0;
    ROOTCLAD_UNROLL
    for (int j = 0; j < LB; ++j) {
      if (!ACC) { // overlapping lanes get the same values again
        simd::store(dst + j * VL, acc[o][j]);
      } else if (skip <= j * VL) {
        simd::store(dst + j * VL, simd::load(dst + j * VL) + acc[o][j]);
      } else {
        for (int i = skip - j * VL; i < VL; ++i)
          dst[j * VL + i] += acc[o][j][i];
      }
    }
  }
}

template <typename T, int LB, bool ACC, class Tap>
void rows_lb(T* out, const T* x, const T* w, const T* bias, int C, int Lx, int OC, int K, Tap tap,
             int LO) {
  constexpr int OB = ROOTCLAD_VEC_REGS / 4;
  constexpr int W = LB * simd::lanes<T>();
  int o0 = 0;
  for (; o0 + OB <= OC; o0 += OB)
    for (int l0 = 0; l0 < LO; l0 += W) {
      const int start = l0 + W <= LO ? l0 : LO - W;
      rows_block<T, OB, LB, ACC>(out, x, w, bias, C, Lx, K, tap, LO, o0, start, l0 - start);
    }
  for (; o0 < OC; ++o0)
    for (int l0 = 0; l0 < LO; l0 += W) {
      const int start = l0 + W <= LO ? l0 : LO - W;
      rows_block<T, 1, LB, ACC>(out, x, w, bias, C, Lx, K, tap, LO, o0, start, l0 - start);
    }
}

// One sample: out(OC, LO) (=, or += with ACC) bias + conv of x(C, Lx) with w(OC, C, K),
// tap k read at tap(k) (Dilated: no padding, LO = Lx - (K-1)*D). False when LO is shorter
// than a vector.
template <typename T, bool ACC, class Tap = Dilated>
bool rows(T* out, const T* x, const T* w, const T* bias, int C, int Lx, int OC, int K, Tap tap,
          int LO) {
  constexpr int VL = simd::lanes<T>();
  if (LO >= 2 * VL)
    rows_lb<T, 2, ACC>(out, x, w, bias, C, Lx, OC, K, tap, LO);
  else if (LO >= VL)
    rows_lb<T, 1, ACC>(out, x, w, bias, C, Lx, OC, K, tap, LO);
  else
    return false;
  return true;
}

// out(B, OC, LO) = conv1d(inp(B, C, L), weight, bias), stride 1, padding P, dilation D.
template <typename T>
bool forward(T* out, const T* inp, const T* weight, const T* bias, int B, int C, int L, int OC,
             int K, int P, int D, int LO) {
  if (LO < simd::lanes<T>())
    return false;
  const int Lx = L + 2 * P;
  T* xp = P > 0 ? scratch<T>(0, (long)C * Lx) : nullptr;
  for (int b = 0; b < B; ++b) {
    const T* x = inp + (long)b * C * L;
    if (P > 0) {
      pad_rows(xp, x, C, L, P);
      x = xp;
    }
    with_taps(K, D, [&](auto tap) {
      rows<T, false>(out + (long)b * OC * LO, x, weight, bias, C, Lx, OC, K, tap, LO);
    });
  }
  return true;
}

// dw[o, c, k0 + kk] += sum_b sum_l g[b, o, l] * x[b, c, l + tap(k0 + kk)], o in [o0, o0 + OB).
template <typename T, int OB, int KB, class Tap>
inline void dweight_block(T* dw, const T* g, const T* x, int B, int C, int Lx, int OC, int K,
                          Tap tap, int LO, int o0, int c, int k0) {
  using VT = V<T>;
  constexpr int VL = simd::lanes<T>();
  VT acc[OB][KB];
  ROOTCLAD_UNROLL
  for (int o = 0; o < OB; ++o)
    ROOTCLAD_UNROLL
  for (int k = 0; k < KB; ++k)
    acc[o][k] = VT{};
  for (int b = 0; b < B; ++b) {
    const T* gb = g + ((long)b * OC + o0) * LO;
    const T* xb = x + ((long)b * C + c) * Lx;
    int l = 0;
    for (; l + VL <= LO; l += VL) {
      VT gv[OB], xv[KB];
      ROOTCLAD_UNROLL
      for (int o = 0; o < OB; ++o) {
        gv[o] = simd::load(gb + (long)o * LO + l);
        simd::in_register<T>(gv[o]);
      }
      ROOTCLAD_UNROLL
      for (int k = 0; k < KB; ++k) {
        xv[k] = simd::load(xb + tap(k0 + k) + l);
        simd::in_register<T>(xv[k]);
      }
      ROOTCLAD_UNROLL
      for (int o = 0; o < OB; ++o)
        ROOTCLAD_UNROLL
      for (int k = 0; k < KB; ++k)
        acc[o][k] += gv[o] * xv[k];
    }
    if (l < LO) { // last vector ends at LO; lanes before l were counted already
      const int start = LO - VL, skip = l - start;
      VT gv[OB], xv[KB];
      ROOTCLAD_UNROLL
      for (int o = 0; o < OB; ++o) {
        gv[o] = simd::zero_head<T>(simd::load(gb + (long)o * LO + start), skip);
      }
      ROOTCLAD_UNROLL
      for (int k = 0; k < KB; ++k)
        xv[k] = simd::load(xb + tap(k0 + k) + start);
      ROOTCLAD_UNROLL
      for (int o = 0; o < OB; ++o)
        ROOTCLAD_UNROLL
      for (int k = 0; k < KB; ++k)
        acc[o][k] += gv[o] * xv[k];
    }
  }
  for (int o = 0; o < OB; ++o)
    for (int k = 0; k < KB; ++k)
      dw[((long)(o0 + o) * C + c) * K + k0 + k] += simd::hsum<T>(acc[o][k]);
}

template <typename T, int OB, class Tap>
void dweight_rows(T* dw, const T* g, const T* x, int B, int C, int Lx, int OC, int K, Tap tap,
                  int LO, int o0) {
  constexpr int KB = 4;
  for (int c = 0; c < C; ++c) {
    int k0 = 0;
    for (; k0 + KB <= K; k0 += KB)
      dweight_block<T, OB, KB>(dw, g, x, B, C, Lx, OC, K, tap, LO, o0, c, k0);
    if (K - k0 == 3)
      dweight_block<T, OB, 3>(dw, g, x, B, C, Lx, OC, K, tap, LO, o0, c, k0);
    else if (K - k0 == 2)
      dweight_block<T, OB, 2>(dw, g, x, B, C, Lx, OC, K, tap, LO, o0, c, k0);
    else if (K - k0 == 1)
      dweight_block<T, OB, 1>(dw, g, x, B, C, Lx, OC, K, tap, LO, o0, c, k0);
  }
}

// All of d_w, a group of samples at a time: the OB rows of d_out a block reads are read
// again for every (c, k) block, so a group's rows should stay in cache across them. Groups
// of about 128 KiB of those rows did best among 16-512 KiB on the GW CNN (whole batches,
// one thread); the micro-batched head passes fewer samples than that anyway.
constexpr long DWEIGHT_GROUP_BYTES = 131072;
template <typename T, class Tap = Dilated>
void dweight(T* dw, const T* g, const T* x, int B, int C, int Lx, int OC, int K, Tap tap, int LO) {
  constexpr int OB = ROOTCLAD_VEC_REGS / 8;
  const long per_sample = (long)OB * LO * sizeof(T);
  const int G = per_sample >= DWEIGHT_GROUP_BYTES ? 1 : (int)(DWEIGHT_GROUP_BYTES / per_sample);
  for (int b0 = 0; b0 < B; b0 += G) {
    const int nb = B - b0 < G ? B - b0 : G;
    const T* gb = g + (long)b0 * OC * LO;
    const T* xb = x + (long)b0 * C * Lx;
    int o0 = 0;
    for (; o0 + OB <= OC; o0 += OB)
      dweight_rows<T, OB>(dw, gb, xb, nb, C, Lx, OC, K, tap, LO, o0);
    for (; o0 < OC; ++o0)
      dweight_rows<T, 1>(dw, gb, xb, nb, C, Lx, OC, K, tap, LO, o0);
  }
}

// The pullback of forward(): d_inp, d_weight, d_bias (each may be null) += ...
template <typename T>
bool backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp, const T* weight,
              int B, int C, int L, int OC, int K, int P, int D, int LO) {
  constexpr int VL = simd::lanes<T>();
  if (LO < VL)
    return false;
  const int Lx = L + 2 * P;
  const T* x = inp;
  if (P > 0) {
    T* xp = scratch<T>(0, (long)B * C * Lx);
    pad_rows(xp, inp, (long)B * C, L, P);
    x = xp;
  }
  if (d_bias)
    for (int b = 0; b < B; ++b)
      for (int o = 0; o < OC; ++o) {
        const T* g = d_out + ((long)b * OC + o) * LO;
        V<T> s{};
        int l = 0;
        for (; l + VL <= LO; l += VL)
          s += simd::load(g + l);
        T t = simd::hsum<T>(s);
        for (; l < LO; ++l)
          t += g[l];
        d_bias[o] += t;
      }
  if (d_weight)
    dweight(d_weight, d_out, x, B, C, Lx, OC, K, Dilated{D}, LO);
  if (!d_inp)
    return true;
  // d_x = d_out, zero-padded by E = (K-1)*D on both sides, convolved with wt[c,o,k] =
  // w[o,c,K-1-k]: an output of length LO + E = Lx.
  const int E = (K - 1) * D, Lg = LO + 2 * E;
  T* wt = scratch<T>(1, (long)C * OC * K);
  for (int o = 0; o < OC; ++o)
    for (int c = 0; c < C; ++c)
      for (int k = 0; k < K; ++k)
        wt[((long)c * OC + o) * K + (K - 1 - k)] = weight[((long)o * C + c) * K + k];
  T* gp = scratch<T>(2, (long)OC * Lg);
  T* dxp = P > 0 ? scratch<T>(3, (long)C * Lx) : nullptr;
  for (int b = 0; b < B; ++b) {
    pad_rows(gp, d_out + (long)b * OC * LO, OC, LO, E);
    T* dx = d_inp + (long)b * C * L;
    if (P == 0) {
      with_taps(K, D, [&](auto tap) {
        rows<T, true>(dx, gp, wt, (const T*)nullptr, OC, Lg, C, K, tap, L);
      });
    } else {
      with_taps(K, D, [&](auto tap) {
        rows<T, false>(dxp, gp, wt, (const T*)nullptr, OC, Lg, C, K, tap, Lx);
      });
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < L; ++i)
          dx[(long)c * L + i] += dxp[(long)c * Lx + P + i];
    }
  }
  return true;
}

} // namespace conv_s1
} // namespace rootclad

#endif // ROOTCLAD_OPS_CONV1D_S1_H
