// rootclad/ops/conv1d_sparse.h — the Conv1d backward pass over the nonzero output gradients only.
//
// A Conv1d followed by a max-pool receives a gradient at one position per pool window (the
// window's maximum), and a ReLU zeroes some of those: in the GW CNN (pools of 4), at most 1
// output gradient in 4 is nonzero. The dense backward (conv1d_s1.h, or im2col + GEMM) does C*K
// multiply-adds per output position, zero or not; this one visits only the nonzero ones:
//   d_w[o, c, k]             += g[b, o, l] * x[b, c, l*S - P + k*D]
//   d_x[b, c, l*S - P + k*D] += g[b, o, l] * w[o, c, k]
// It works on transposed copies, x^T(L, C), d_x^T(L, C), w^T(OC, K, C) and d_w^T(OC, K, C),
// in which the K x C block one nonzero touches is contiguous (dilation 1): each nonzero is
// then one axpy of K*C elements into d_w^T[o] (accumulated in registers while the row's
// nonzeros stream past) and one into d_x^T. The nonzeros of each row (b, o) are first
// compacted into a list. Taps that fall into the padding, and dilations, take a loop per tap.
//
// backward() first counts the nonzeros, and returns false, doing nothing, when a dense
// kernel is expected to be faster: more than 1 in DENSE_RATIO nonzero, or fewer than
// MIN_TAPS = C*K multiply-adds per output position to save (conv1d_s1.h handles those at
// full vector width, and the list costs a few cycles per position).
//
// Results differ from the dense kernels only in rounding (another summation order), with
// one exception: where g is 0 and the input is inf or NaN, a dense product adds 0*inf = NaN
// to d_w, while this pass adds nothing.
#ifndef ROOTCLAD_OPS_CONV1D_SPARSE_H
#define ROOTCLAD_OPS_CONV1D_SPARSE_H

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

#include "../simd.h"

namespace rootclad {
namespace conv_sparse {

// Measured on the GW CNN's layers, one core (benchmarks/core/bench_conv_kernels.py).
constexpr long DENSE_RATIO = 3;
constexpr int MIN_TAPS = 64;

// The nonzero output gradients of one row: values g[j] and the input index i0[j] of their
// first tap, j < n, in order of position.
template <typename T> struct Nonzeros {
  T* g;
  int* i0;
};

// Per-thread list, grown on first use (no allocation in steady state), with room for one
// whole vector past the end: the vector compaction below stores whole vectors.
template <typename T> Nonzeros<T> list(int n) {
  static thread_local std::vector<T> g;
  static thread_local std::vector<int> i0;
  if ((int)g.size() < n + 64) {
    g.resize(n + 64);
    i0.resize(n + 64);
  }
  return {g.data(), i0.data()};
}

// Scratch starts on a 64-byte boundary: the rows of C channels the kernels load and store
// whole then do not straddle cache lines (when C*sizeof(T) is a multiple of 64).
template <typename T> T* scratch(int slot, long n) {
  static thread_local std::vector<T> bufs[4];
  std::vector<T>& b = bufs[slot];
  const long pad = 64 / (long)sizeof(T);
  if ((long)b.size() < n + pad)
    b.resize(n + pad);
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(b.data());
  return b.data() + ((64 - a % 64) % 64) / sizeof(T);
}

// The nonzeros of g[0, LO) in order, as (g[l], l*S - P); a NaN counts as nonzero. Returns
// their number. With AVX-512, 16 (8) positions at a time: a compare gives the mask of
// nonzeros, and vcompress packs their values and indices to the front of a register.
// Otherwise each position is written and the count advanced only past nonzeros: no branch
// to mispredict either way.
template <typename T> int compact(Nonzeros<T> e, const T* g, int LO, int S, int P) {
  int n = 0, l = 0;
#if defined(__AVX512F__) && defined(__AVX512VL__)
  if constexpr (sizeof(T) == 4) {
    const __m512i step = _mm512_set1_epi32(16 * S);
    __m512i idx = _mm512_sub_epi32(
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(S)),
        _mm512_set1_epi32(P));
    for (; l + 16 <= LO; l += 16, idx = _mm512_add_epi32(idx, step)) {
      const __m512 v = _mm512_loadu_ps(reinterpret_cast<const float*>(g + l));
      const __mmask16 m = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
      _mm512_storeu_ps(reinterpret_cast<float*>(e.g + n), _mm512_maskz_compress_ps(m, v));
      _mm512_storeu_si512(e.i0 + n, _mm512_maskz_compress_epi32(m, idx));
      n += __builtin_popcount((unsigned)m);
    }
  } else {
    const __m256i step = _mm256_set1_epi32(8 * S);
    __m256i idx = _mm256_sub_epi32(
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(S)),
        _mm256_set1_epi32(P));
    for (; l + 8 <= LO; l += 8, idx = _mm256_add_epi32(idx, step)) {
      const __m512d v = _mm512_loadu_pd(reinterpret_cast<const double*>(g + l));
      const __mmask8 m = _mm512_cmp_pd_mask(v, _mm512_setzero_pd(), _CMP_NEQ_UQ);
      _mm512_storeu_pd(reinterpret_cast<double*>(e.g + n), _mm512_maskz_compress_pd(m, v));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(e.i0 + n),
                          _mm256_maskz_compress_epi32(m, idx));
      n += __builtin_popcount((unsigned)m);
    }
  }
#endif
  for (; l < LO; ++l) {
    e.g[n] = g[l];
    e.i0[n] = l * S - P;
    n += g[l] != T(0);
  }
  return n;
}

// dst(cols, rows) = src(rows, cols)^T
template <typename T> void transpose(T* dst, const T* src, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      dst[(long)c * rows + r] = src[(long)r * cols + c];
}

// acc[0, NV vectors) += sum_j g_j * x[i0_j * C, ...): NV x JU accumulators in registers;
// with few vectors per nonzero, JU sets take turns over the list, so that at least 8
// additions are independent of each other (an FMA waits 4 cycles for its last result).
template <typename T, int NV>
inline void gather_rows(T* acc, const T* x, int C, Nonzeros<T> e, int n) {
  using VT = simd::V<T>;
  constexpr int VL = simd::lanes<T>();
  constexpr int JU = NV >= 8 ? 1 : 8 / NV;
  VT a[JU][NV];
  ROOTCLAD_UNROLL
  for (int u = 0; u < JU; ++u) {
    ROOTCLAD_UNROLL
    for (int v = 0; v < NV; ++v)
      a[u][v] = VT{};
  }
  int j = 0;
  for (; j + JU <= n; j += JU) {
    ROOTCLAD_UNROLL
    for (int u = 0; u < JU; ++u) {
      const VT g = simd::splat<T>(e.g[j + u]);
      const T* xs = x + (long)e.i0[j + u] * C;
      ROOTCLAD_UNROLL
      for (int v = 0; v < NV; ++v)
        a[u][v] += g * simd::load(xs + v * VL);
    }
  }
  for (; j < n; ++j) {
    const VT g = simd::splat<T>(e.g[j]);
    const T* xs = x + (long)e.i0[j] * C;
    ROOTCLAD_UNROLL
    for (int v = 0; v < NV; ++v)
      a[0][v] += g * simd::load(xs + v * VL);
  }
  ROOTCLAD_UNROLL
  for (int v = 0; v < NV; ++v) {
    VT sum = a[0][v];
    ROOTCLAD_UNROLL
    for (int u = 1; u < JU; ++u)
      sum += a[u][v];
    simd::store(acc + v * VL, simd::load(acc + v * VL) + sum);
  }
}

// dwt[0, KC) += sum_j g_j * xt[i0_j * C + 0 .. KC): blocks of 16, 8, 4, 2, 1 vectors, each
// a pass over the list, then the elements past the last whole vector.
template <typename T>
void dweight_inside(T* dwt, const T* xt, int C, int KC, Nonzeros<T> e, int n) {
  constexpr int VL = simd::lanes<T>();
  int s = 0;
  for (; s + 16 * VL <= KC; s += 16 * VL)
    gather_rows<T, 16>(dwt + s, xt + s, C, e, n);
  if (s + 8 * VL <= KC)
    gather_rows<T, 8>(dwt + s, xt + s, C, e, n), s += 8 * VL;
  if (s + 4 * VL <= KC)
    gather_rows<T, 4>(dwt + s, xt + s, C, e, n), s += 4 * VL;
  if (s + 2 * VL <= KC)
    gather_rows<T, 2>(dwt + s, xt + s, C, e, n), s += 2 * VL;
  if (s + VL <= KC)
    gather_rows<T, 1>(dwt + s, xt + s, C, e, n), s += VL;
  for (; s < KC; ++s) {
    T a = 0;
    for (int j = 0; j < n; ++j)
      a += e.g[j] * xt[(long)e.i0[j] * C + s];
    dwt[s] += a;
  }
}

// dxt[i0_j * C + 0 .. KC) += g_j * wt[0, KC) for each j. Neighbouring nonzeros touch
// overlapping blocks, and an update that reads what the previous one has just stored waits
// for it; so the list is walked K entries apart (their first taps are at least K apart),
// in K passes.
template <typename T> void dinput_inside(T* dxt, const T* wt, int C, int K, Nonzeros<T> e, int n) {
  const int KC = K * C;
  for (int r = 0; r < K && r < n; ++r)
    for (int j = r; j < n; j += K) {
      T* d = dxt + (long)e.i0[j] * C;
      const T g = e.g[j];
      ROOTCLAD_SIMD
      for (int i = 0; i < KC; ++i)
        d[i] += g * wt[i];
    }
}

// One nonzero, any dilation, taps outside [0, L) skipped: per tap a run of C channels.
template <typename T>
void entry_taps(T* dwt, T* dxt, const T* xt, const T* wt, T g, int i0, int C, int L, int K, int D) {
  for (int k = 0; k < K; ++k) {
    const int i = i0 + k * D;
    if (i < 0 || i >= L)
      continue;
    const T* xs = xt + (long)i * C;
    T* dw = dwt + (long)k * C;
    ROOTCLAD_SIMD
    for (int c = 0; c < C; ++c)
      dw[c] += g * xs[c];
    if (!dxt)
      continue;
    T* dx = dxt + (long)i * C;
    const T* w = wt + (long)k * C;
    ROOTCLAD_SIMD
    for (int c = 0; c < C; ++c)
      dx[c] += g * w[c];
  }
}

// The whole backward pass of conv1d_forward (see kernels.h for the shapes), however dense
// d_out is. Accumulates into d_inp (may be null), d_weight and d_bias (may be null).
template <typename T>
void backward_any(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp, const T* weight,
                  int B, int C, int L, int OC, int K, int S, int P, int D, int LO) {
  const int KC = K * C;
  const Nonzeros<T> e = list<T>(LO);
  T* xt = scratch<T>(0, (long)L * C);
  T* dxt = d_inp ? scratch<T>(1, (long)L * C) : nullptr;
  T* wt = scratch<T>(2, (long)OC * KC);
  T* dwt = scratch<T>(3, (long)OC * KC);
  for (int o = 0; o < OC; ++o)
    transpose(wt + (long)o * KC, weight + (long)o * KC, C, K);
  std::memset(dwt, 0, sizeof(T) * OC * KC);
  for (int b = 0; b < B; ++b) {
    transpose(xt, inp + (long)b * C * L, C, L);
    if (dxt)
      std::memset(dxt, 0, sizeof(T) * L * C);
    for (int o = 0; o < OC; ++o) {
      const int n = compact(e, d_out + ((long)b * OC + o) * LO, LO, S, P);
      if (d_bias) {
        T s = 0;
        for (int j = 0; j < n; ++j)
          s += e.g[j];
        d_bias[o] += s;
      }
      T* dw = dwt + (long)o * KC;
      const T* w = wt + (long)o * KC;
      // the entries with every tap inside the input are a contiguous run [lo, hi)
      int lo = 0, hi = n;
      if (D == 1) {
        while (lo < n && e.i0[lo] < 0)
          ++lo;
        while (hi > lo && e.i0[hi - 1] + K > L)
          --hi;
      } else {
        lo = hi = n;
      }
      for (int j = 0; j < lo; ++j)
        entry_taps(dw, dxt, xt, w, e.g[j], e.i0[j], C, L, K, D);
      for (int j = hi; j < n; ++j)
        entry_taps(dw, dxt, xt, w, e.g[j], e.i0[j], C, L, K, D);
      const Nonzeros<T> in{e.g + lo, e.i0 + lo};
      dweight_inside(dw, xt, C, KC, in, hi - lo);
      if (dxt)
        dinput_inside(dxt, w, C, K, in, hi - lo);
    }
    if (dxt) {
      T* dx = d_inp + (long)b * C * L;
      for (int c = 0; c < C; ++c)
        for (int i = 0; i < L; ++i)
          dx[(long)c * L + i] += dxt[(long)i * C + c];
    }
  }
  for (int o = 0; o < OC; ++o)
    for (int c = 0; c < C; ++c)
      for (int k = 0; k < K; ++k)
        d_weight[((long)o * C + c) * K + k] += dwt[(long)o * KC + (long)k * C + c];
}

// backward_any() when d_out is sparse enough for it to be the faster pass; otherwise
// returns false, having done nothing.
template <typename T>
bool backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp, const T* weight,
              int B, int C, int L, int OC, int K, int S, int P, int D, int LO) {
  if (K * C < MIN_TAPS)
    return false;
  // The buffers are sized whether or not this call turns out sparse enough: a layer whose
  // gradient is dense at first and sparse later must not allocate in a later step.
  list<T>(LO);
  for (int slot = 0; slot < 4; ++slot)
    scratch<T>(slot, slot < 2 ? (long)L * C : (long)OC * K * C);
  const long total = (long)B * OC * LO;
  long nnz = 0;
  for (long i = 0; i < total; ++i)
    nnz += d_out[i] != T(0);
  if (nnz * DENSE_RATIO > total)
    return false;
  backward_any(d_inp, d_weight, d_bias, d_out, inp, weight, B, C, L, OC, K, S, P, D, LO);
  return true;
}

} // namespace conv_sparse
} // namespace rootclad

#endif // ROOTCLAD_OPS_CONV1D_SPARSE_H
