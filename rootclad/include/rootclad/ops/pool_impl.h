// rootclad/ops/pool_impl.h — the definitions of the kernels pool.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_POOL_IMPL_H
#define ROOTCLAD_OPS_POOL_IMPL_H

#include "core.h"
#include "pool.h"
#include "pool_geometry.h"

namespace rootclad {

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
void maxpool1d_forward(T* out, const T* inp, int R, int L, int K, int S, int P, int ceil_mode) {
  ROOTCLAD_REPLAY_SKIP;
  int LO = pool_out(L, K, S, P, ceil_mode);
  // non-overlapping windows all inside the input (a ceil_mode window may run past its end)
  const bool tiled = S == K && P == 0 && (long)LO * K <= L;
#ifndef ROOTCLAD_NO_PULLBACKS
  if (tiled && (K == 2 || K == 3 || K == 4 || K == 8)) {
    if (K == 2)
      return maxpool1d_forward_windows<T, 2>(out, inp, R, L, LO);
    if (K == 3)
      return maxpool1d_forward_windows<T, 3>(out, inp, R, L, LO);
    if (K == 4)
      return maxpool1d_forward_windows<T, 4>(out, inp, R, L, LO);
    return maxpool1d_forward_windows<T, 8>(out, inp, R, L, LO);
  }
#endif
  if (tiled) { // non-overlapping windows inside the input: vectorised over windows
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
                        int S, int P, int ceil_mode) {
  int LO = pool_out(L, K, S, P, ceil_mode);
  if (S == K && P == 0 && (long)LO * K <= L) {
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

template <typename T>
void avgpool1d_forward(T* out, const T* inp, int R, int L, int K, int S, int P,
                       int count_include_pad, int ceil_mode) {
  ROOTCLAD_REPLAY_SKIP;
  int LO = pool_out(L, K, S, P, ceil_mode);
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < LO; ++o) {
      int start = o * S - P;
      T s = 0;
      for (int k = 0; k < K; ++k) {
        int i = start + k;
        if (i >= 0 && i < L)
          s += inp[(long)r * L + i];
      }
      int div = pool_span(start, K, L, P, count_include_pad);
      out[(long)r * LO + o] = div > 0 ? s / div : T(0);
    }
}

template <typename T>
void avgpool1d_backward(T* d_inp, const T* d_out, int R, int L, int K, int S, int P,
                        int count_include_pad, int ceil_mode) {
  int LO = pool_out(L, K, S, P, ceil_mode);
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < LO; ++o) {
      int start = o * S - P;
      int div = pool_span(start, K, L, P, count_include_pad);
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

template <typename T>
void adaptive_avgpool_forward(T* out, const T* inp, int R, int H, int W, int OH, int OW) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const int h0 = adaptive_start(oh, H, OH);
        const int h1 = adaptive_end(oh, H, OH);
        const int w0 = adaptive_start(ow, W, OW);
        const int w1 = adaptive_end(ow, W, OW);
        T s = 0;
        for (int h = h0; h < h1; ++h)
          for (int w = w0; w < w1; ++w)
            s += inp[((long)r * H + h) * W + w];
        out[((long)r * OH + oh) * OW + ow] = s / T((h1 - h0) * (w1 - w0));
      }
}
template <typename T>
void adaptive_avgpool_backward(T* d_inp, const T* d_out, int R, int H, int W, int OH, int OW) {
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const int h0 = adaptive_start(oh, H, OH);
        const int h1 = adaptive_end(oh, H, OH);
        const int w0 = adaptive_start(ow, W, OW);
        const int w1 = adaptive_end(ow, W, OW);
        const T g = d_out[((long)r * OH + oh) * OW + ow] / T((h1 - h0) * (w1 - w0));
        for (int h = h0; h < h1; ++h)
          for (int w = w0; w < w1; ++w)
            d_inp[((long)r * H + h) * W + w] += g;
      }
}

// the index (within the row) of window (oh, ow)'s maximum as torch picks it: its first maximum,
// or its last NaN (`v > max || isnan(v)` lets each later NaN take over)
template <typename T>
long adaptive_argmax(const T* x, int H, int W, int OH, int OW, int oh, int ow) {
  long at = -1;
  for (int h = adaptive_start(oh, H, OH); h < adaptive_end(oh, H, OH); ++h)
    for (int w = adaptive_start(ow, W, OW); w < adaptive_end(ow, W, OW); ++w) {
      const long i = (long)h * W + w;
      if (at < 0 || x[i] > x[at] || x[i] != x[i])
        at = i;
    }
  return at;
}

template <typename T>
void adaptive_maxpool_forward(T* out, const T* inp, int R, int H, int W, int OH, int OW) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        // (a window of -inf only gets no gradient when Clad differentiates these loops, as in
        // maxpool2d_forward; starting from the window's first element aborted Clad's sweep)
        T m = -INFINITY;
        for (int h = adaptive_start(oh, H, OH); h < adaptive_end(oh, H, OH); ++h)
          for (int w = adaptive_start(ow, W, OW); w < adaptive_end(ow, W, OW); ++w)
            if (inp[((long)r * H + h) * W + w] > m || std::isnan(inp[((long)r * H + h) * W + w]))
              m = inp[((long)r * H + h) * W + w];
        out[((long)r * OH + oh) * OW + ow] = m;
      }
}
template <typename T>
void adaptive_maxpool_backward(T* d_inp, const T* d_out, const T* inp, int R, int H, int W, int OH,
                               int OW) {
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow)
        d_inp[(long)r * H * W + adaptive_argmax(inp + (long)r * H * W, H, W, OH, OW, oh, ow)] +=
            d_out[((long)r * OH + oh) * OW + ow];
}

template <typename T>
void upsample_forward(T* out, const T* inp, int R, int H, int W, int OH, int OW, int mode, T sh,
                      T sw) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const int h0 = upsample_i0(oh, H, OH, mode, sh);
        const int h1 = upsample_i1(h0, H, OH, mode);
        const int w0 = upsample_i0(ow, W, OW, mode, sw);
        const int w1 = upsample_i1(w0, W, OW, mode);
        const long o = ((long)r * OH + oh) * OW + ow;
        if (mode == 0 || mode == 3) { // a copy: no weights (a NaN beside it stays out)
          out[o] = inp[((long)r * H + h0) * W + w0];
          continue;
        }
        const T lh = upsample_lambda(oh, H, OH, mode, sh);
        const T lw = upsample_lambda(ow, W, OW, mode, sw);
        const T* x = inp + (long)r * H * W;
        out[o] = (T(1) - lh) * ((T(1) - lw) * x[(long)h0 * W + w0] + lw * x[(long)h0 * W + w1]) +
                 lh * ((T(1) - lw) * x[(long)h1 * W + w0] + lw * x[(long)h1 * W + w1]);
      }
}
template <typename T>
void upsample_backward(T* d_inp, const T* d_out, int R, int H, int W, int OH, int OW, int mode,
                       T sh, T sw) {
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const int h0 = upsample_i0(oh, H, OH, mode, sh);
        const int h1 = upsample_i1(h0, H, OH, mode);
        const int w0 = upsample_i0(ow, W, OW, mode, sw);
        const int w1 = upsample_i1(w0, W, OW, mode);
        const T lh = upsample_lambda(oh, H, OH, mode, sh);
        const T lw = upsample_lambda(ow, W, OW, mode, sw);
        const T g = d_out[((long)r * OH + oh) * OW + ow];
        T* dx = d_inp + (long)r * H * W;
        dx[(long)h0 * W + w0] += (T(1) - lh) * (T(1) - lw) * g;
        if (mode == 0 || mode == 3)
          continue;
        dx[(long)h0 * W + w1] += (T(1) - lh) * lw * g;
        dx[(long)h1 * W + w0] += lh * (T(1) - lw) * g;
        dx[(long)h1 * W + w1] += lh * lw * g;
      }
}

template <typename T> void amax_forward(T* out, const T* inp, int R, int L) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    out[r] = amax_row(inp + (long)r * L, L);
}
template <typename T> void amax_backward(T* d_inp, const T* d_out, const T* inp, int R, int L) {
  for (int r = 0; r < R; ++r)
    amax_row_backward(d_inp + (long)r * L, inp + (long)r * L, L, d_out[r]);
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_POOL_IMPL_H
