// rootclad/ops/conv2d_impl.h — the definitions of the kernels conv2d.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_CONV2D_IMPL_H
#define ROOTCLAD_OPS_CONV2D_IMPL_H

#include "conv2d.h"
#include "core.h"
#include "pool_geometry.h"
#include <algorithm>
#include <cmath>
#include <cstring>

namespace rootclad {

struct Conv2dShape {
  int B, C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G;
  int OH() const { return (H + 2 * PH - DH * (KH - 1) - 1) / SH + 1; }
  int OW() const { return (W + 2 * PW - DW * (KW - 1) - 1) / SW + 1; }
  int Cg() const { return C / G; }
  int OCg() const { return OC / G; }
  int taps() const { return Cg() * KH * KW; } // rows of one group's cols
};

// the outputs ow in [lo, hi) whose tap reads inside a row of W (iw = ow*SW + off)
inline void conv_cover(int OW, int W, int SW, int off, int& lo, int& hi) {
  lo = off >= 0 ? 0 : (-off + SW - 1) / SW;
  hi = W - off <= 0 ? 0 : (W - 1 - off) / SW + 1;
  hi = std::min(hi, OW);
  lo = std::min(lo, hi);
}

// cols of sample b, group g (see the top of this file); a row of cols every ld values (OH*OW
// when the sample's columns are alone, B*OH*OW when the samples sit side by side). Each output
// row is copied as one run inside the input and zeros around it (no test per value).
template <typename T>
void conv2d_im2col(T* cols, const T* inp, const Conv2dShape& s, int g, long ld = 0) {
  const int OH = s.OH(), OW = s.OW(), Cg = s.Cg();
  if (ld == 0)
    ld = (long)OH * OW;
  for (int c = 0; c < Cg; ++c)
    for (int kh = 0; kh < s.KH; ++kh)
      for (int kw = 0; kw < s.KW; ++kw) {
        T* row = cols + ((long)(c * s.KH + kh) * s.KW + kw) * ld;
        const T* x = inp + (long)(g * Cg + c) * s.H * s.W;
        const int off = kw * s.DW - s.PW;
        int lo, hi;
        conv_cover(OW, s.W, s.SW, off, lo, hi);
        for (int oh = 0; oh < OH; ++oh) {
          const int ih = oh * s.SH - s.PH + kh * s.DH;
          T* r = row + (long)oh * OW;
          // loops, not memcpy/fill: rows are short (2 to 32 values in the models that matter)
          if (ih < 0 || ih >= s.H) {
            for (int ow = 0; ow < OW; ++ow)
              r[ow] = T(0);
            continue;
          }
          const T* xr = x + (long)ih * s.W; // read at ow*SW + off, inside the row
          for (int ow = 0; ow < lo; ++ow)
            r[ow] = T(0);
          if (s.SW == 1)
            for (int ow = lo; ow < hi; ++ow)
              r[ow] = xr[ow + off];
          else
            for (int ow = lo; ow < hi; ++ow)
              r[ow] = xr[(long)ow * s.SW + off];
          for (int ow = hi; ow < OW; ++ow)
            r[ow] = T(0);
        }
      }
}

// d_inp += the scatter of d_cols (the adjoint of conv2d_im2col, the same ld)
template <typename T>
void conv2d_col2im(T* d_inp, const T* d_cols, const Conv2dShape& s, int g, long ld = 0) {
  const int OH = s.OH(), OW = s.OW(), Cg = s.Cg();
  if (ld == 0)
    ld = (long)OH * OW;
  for (int c = 0; c < Cg; ++c)
    for (int kh = 0; kh < s.KH; ++kh)
      for (int kw = 0; kw < s.KW; ++kw) {
        const T* row = d_cols + ((long)(c * s.KH + kh) * s.KW + kw) * ld;
        T* dx = d_inp + (long)(g * Cg + c) * s.H * s.W;
        const int off = kw * s.DW - s.PW;
        int lo, hi;
        conv_cover(OW, s.W, s.SW, off, lo, hi);
        for (int oh = 0; oh < OH; ++oh) {
          const int ih = oh * s.SH - s.PH + kh * s.DH;
          if (ih < 0 || ih >= s.H)
            continue;
          const T* r = row + (long)oh * OW;
          T* d = dx + (long)ih * s.W;
          if (s.SW == 1)
            for (int ow = lo; ow < hi; ++ow)
              d[ow + off] += r[ow];
          else
            for (int ow = lo; ow < hi; ++ow)
              d[(long)ow * s.SW + off] += r[ow];
        }
      }
}

#ifdef ROOTCLAD_NO_PULLBACKS
template <typename T>
void conv2d_forward(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B, int C,
                    int H, int W, int OC, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                    int DW, int G) {
  ROOTCLAD_REPLAY_SKIP;
  const int OH = (H + 2 * PH - DH * (KH - 1) - 1) / SH + 1;
  const int OW = (W + 2 * PW - DW * (KW - 1) - 1) / SW + 1;
  const int Cg = C / G;
  const int OCg = OC / G;
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < OC; ++o)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          // one declarator per statement: Clad mis-differentiated "const int a = .., b = ..;"
          T s = bias ? bias[o] : T(0);
          int g = o / OCg;
          for (int c = 0; c < Cg; ++c)
            for (int kh = 0; kh < KH; ++kh)
              for (int kw = 0; kw < KW; ++kw) {
                int ih = oh * SH - PH + kh * DH;
                int iw = ow * SW - PW + kw * DW;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                  s += weight[((o * Cg + c) * KH + kh) * KW + kw] *
                       inp[(((long)b * C + g * Cg + c) * H + ih) * W + iw];
              }
          out[(((long)b * OC + o) * OH + oh) * OW + ow] = s;
        }
}
#else
// the paths without columns (after Conv2dShape, which they read)
} // namespace rootclad
#include "conv2d_direct.h"
namespace rootclad {

// -- the general path: im2col + GEMM (per sample, or the samples side by side) ------------------
// The direct paths first: pointwise, stride 1 with few taps, depthwise.
template <typename T>
void conv2d_forward(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B, int C,
                    int H, int W, int OC, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                    int DW, int G) {
  ROOTCLAD_REPLAY_SKIP;
  const Conv2dShape s{B, C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G};
  if (conv2d_pw::applies<T>(s))
    return conv2d_pw::forward(out, inp, weight, bias, s);
  if (conv2d_s1::applies<T>(s))
    return conv2d_s1::forward(out, inp, weight, bias, s);
  if (conv2d_dw::applies<T>(s))
    return conv2d_dw::forward(out, inp, weight, bias, s);
  const int OHW = s.OH() * s.OW(), taps = s.taps(), OCg = s.OCg();
  if (batch_cols(s)) {
    const long N = (long)B * OHW;
    T* yt = conv_s1::scratch<T>(0, (long)OC * N);
    for (int g = 0; g < G; ++g) {
      T* c = cols + (long)g * taps * N;
      for (int b = 0; b < B; ++b)
        conv2d_im2col(c + (long)b * OHW, inp + (long)b * C * H * W, s, g, N);
      gemm(false, false, OCg, (int)N, taps, T(1), weight + (long)g * OCg * taps, taps, c, (int)N,
           T(0), yt + (long)g * OCg * N, (int)N);
    }
    return from_side_by_side(out, yt, B, OC, (long)OHW, bias, false);
  }
  const long cols_per_sample = (long)C * KH * KW * OHW;
  for (int b = 0; b < B; ++b) {
    const T* x = inp + (long)b * C * H * W;
    T* y = out + (long)b * OC * OHW;
    if (bias)
      for (int o = 0; o < OC; ++o)
        for (int i = 0; i < OHW; ++i)
          y[(long)o * OHW + i] = bias[o];
    for (int g = 0; g < G; ++g) {
      T* c = cols + b * cols_per_sample + (long)g * taps * OHW;
      conv2d_im2col(c, x, s, g);
      gemm(false, false, OCg, OHW, taps, T(1), weight + (long)g * OCg * taps, taps, c, OHW,
           bias ? T(1) : T(0), y + (long)g * OCg * OHW, OHW);
    }
  }
}

template <typename T>
void conv2d_backward(T* d_inp, T* d_weight, T* d_bias, T* d_cols, const T* d_out, const T* cols,
                     const T* inp, const T* weight, int B, int C, int H, int W, int OC, int KH,
                     int KW, int SH, int SW, int PH, int PW, int DH, int DW, int G) {
  const Conv2dShape s{B, C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G};
  if (conv2d_pw::applies<T>(s)) // the forward wrote no cols
    return conv2d_pw::backward(d_inp, d_weight, d_bias, d_out, inp, weight, s);
  if (conv2d_s1::applies<T>(s)) // nor here
    return conv2d_s1::backward(d_inp, d_weight, d_bias, d_out, inp, weight, s);
  if (conv2d_dw::applies<T>(s)) // nor here
    return conv2d_dw::backward(d_inp, d_weight, d_bias, d_out, inp, weight, s);
  const int OHW = s.OH() * s.OW(), taps = s.taps(), OCg = s.OCg();
  if (batch_cols(s)) {
    const long N = (long)B * OHW;
    T* gt = conv_s1::scratch<T>(0, (long)OC * N); // d_out as (OC, B*OHW)
    side_by_side(gt, d_out, B, OC, (long)OHW, d_bias);
    for (int g = 0; g < G; ++g) {
      const T* c = cols + (long)g * taps * N;
      const T* gg = gt + (long)g * OCg * N;
      if (d_weight)
        gemm(false, true, OCg, taps, (int)N, T(1), gg, (int)N, c, (int)N, T(1),
             d_weight + (long)g * OCg * taps, taps);
      if (!d_inp)
        continue;
      T* dc = d_cols + (long)g * taps * N;
      gemm(true, false, taps, (int)N, OCg, T(1), weight + (long)g * OCg * taps, taps, gg, (int)N,
           T(0), dc, (int)N);
      for (int b = 0; b < B; ++b)
        conv2d_col2im(d_inp + (long)b * C * H * W, dc + (long)b * OHW, s, g, N);
    }
    return;
  }
  const long cols_per_sample = (long)C * KH * KW * OHW;
  for (int b = 0; b < B; ++b) {
    const T* dy = d_out + (long)b * OC * OHW;
    if (d_bias)
      for (int o = 0; o < OC; ++o)
        for (int i = 0; i < OHW; ++i)
          d_bias[o] += dy[(long)o * OHW + i];
    for (int g = 0; g < G; ++g) {
      const T* c = cols + b * cols_per_sample + (long)g * taps * OHW;
      const T* dyg = dy + (long)g * OCg * OHW;
      if (d_weight) // null: an input gradient alone was asked for
        gemm(false, true, OCg, taps, OHW, T(1), dyg, OHW, c, OHW, T(1),
             d_weight + (long)g * OCg * taps, taps);
      if (!d_inp)
        continue;
      T* dc = d_cols + b * cols_per_sample + (long)g * taps * OHW;
      gemm(true, false, taps, OHW, OCg, T(1), weight + (long)g * OCg * taps, taps, dyg, OHW, T(0),
           dc, OHW);
      conv2d_col2im(d_inp + (long)b * C * H * W, dc, s, g);
    }
  }
}
#endif

template <typename T>
void conv_transpose2d_forward(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B,
                              int C, int H, int W, int OC, int OH, int OW, int KH, int KW, int SH,
                              int SW, int PH, int PW, int DH, int DW, int G) {
  ROOTCLAD_REPLAY_SKIP;
  const Conv2dShape s{B, OC, OH, OW, C, KH, KW, SH, SW, PH, PW, DH, DW, G};
  const long HW = (long)H * W, OHW = (long)OH * OW;
  const int taps = s.taps(), Cg = C / G;
  for (int b = 0; b < B; ++b) {
    T* y = out + (long)b * OC * OHW;
    for (int o = 0; o < OC; ++o)
      for (long i = 0; i < OHW; ++i)
        y[o * OHW + i] = bias ? bias[o] : T(0);
    for (int g = 0; g < G; ++g) {
      T* c = cols + ((long)b * G + g) * taps * HW;
      gemm(true, false, taps, (int)HW, Cg, T(1), weight + (long)g * Cg * taps, taps,
           inp + ((long)b * C + (long)g * Cg) * HW, (int)HW, T(0), c, (int)HW);
      conv2d_col2im(y, c, s, g);
    }
  }
}

template <typename T>
void conv_transpose2d_backward(T* d_inp, T* d_weight, T* d_bias, T* d_cols, const T* d_out,
                               const T* inp, const T* weight, int B, int C, int H, int W, int OC,
                               int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW,
                               int DH, int DW, int G) {
  const Conv2dShape s{B, OC, OH, OW, C, KH, KW, SH, SW, PH, PW, DH, DW, G};
  const long HW = (long)H * W, OHW = (long)OH * OW;
  const int taps = s.taps(), Cg = C / G;
  for (int b = 0; b < B; ++b) {
    const T* dy = d_out + (long)b * OC * OHW;
    if (d_bias)
      for (int o = 0; o < OC; ++o)
        for (long i = 0; i < OHW; ++i)
          d_bias[o] += dy[o * OHW + i];
    for (int g = 0; g < G; ++g) {
      T* c = d_cols + ((long)b * G + g) * taps * HW;
      conv2d_im2col(c, dy, s, g);
      const long x0 = ((long)b * C + (long)g * Cg) * HW;
      if (d_weight)
        gemm(false, true, Cg, taps, (int)HW, T(1), inp + x0, (int)HW, c, (int)HW, T(1),
             d_weight + (long)g * Cg * taps, taps);
      if (d_inp)
        gemm(false, false, Cg, (int)HW, taps, T(1), weight + (long)g * Cg * taps, taps, c, (int)HW,
             T(1), d_inp + x0, (int)HW);
    }
  }
}

// ---------------------------------------------------------------------------------------
// 2-D pooling over inp(R, H, W) -> out(R, OH, OW), R = B*C; windows KH x KW, strides SH, SW,
// zero padding PH, PW (never more than half a window), OH and OW by pool_out (pool_geometry.h,
// with ceil_mode). MaxPool takes the first maximum in row-major window order (as torch does)
// and its backward finds it again; AvgPool divides by the product of the windows' pool_span
// along both axes (the window size, or with count_include_pad = 0 its elements inside the
// input).

template <typename T>
void maxpool2d_forward(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH, int SW,
                       int PH, int PW, int ceil_mode) {
  ROOTCLAD_REPLAY_SKIP;
  const int OH = pool_out(H, KH, SH, PH, ceil_mode);
  const int OW = pool_out(W, KW, SW, PW, ceil_mode);
#ifndef ROOTCLAD_NO_PULLBACKS
  // Row by row: each window tap updates a run of outputs whose reads lie inside the input
  // (conv_cover), in the same row-major tap order per output as the loops below, so the same
  // value wins (the first maximum; NaN propagates). Clad differentiates the loops below.
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh) {
      T* m = out + ((long)r * OH + oh) * OW;
      std::fill(m, m + OW, T(-INFINITY));
      for (int kh = 0; kh < KH; ++kh) {
        const int ih = oh * SH - PH + kh;
        if (ih < 0 || ih >= H)
          continue;
        const T* xr = inp + ((long)r * H + ih) * W;
        for (int kw = 0; kw < KW; ++kw) {
          const int off = kw - PW;
          int lo, hi;
          conv_cover(OW, W, SW, off, lo, hi);
          for (int ow = lo; ow < hi; ++ow) {
            const T v = xr[(long)ow * SW + off];
            m[ow] = (v > m[ow] || v != v) ? v : m[ow];
          }
        }
      }
    }
#else
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        // with pullbacks=False Clad differentiates these loops: one declarator per statement
        // (Clad mis-differentiated "const int a = .., b = ..;")
        T m = -INFINITY;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W &&
                (inp[((long)r * H + ih) * W + iw] > m ||
                 std::isnan(inp[((long)r * H + ih) * W + iw]))) // NaN propagates, as in torch
              m = inp[((long)r * H + ih) * W + iw];
          }
        out[((long)r * OH + oh) * OW + ow] = m;
      }
#endif
}

template <typename T>
void maxpool2d_backward(T* d_inp, const T* d_out, const T* out, const T* inp, int R, int H, int W,
                        int KH, int KW, int SH, int SW, int PH, int PW, int ceil_mode) {
  const int OH = pool_out(H, KH, SH, PH, ceil_mode);
  const int OW = pool_out(W, KW, SW, PW, ceil_mode);
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const long o = ((long)r * OH + oh) * OW + ow;
        const T m = out[o];
        // the first maximum, as torch; a NaN window's last NaN (torch's `v > max || isnan(v)`
        // lets each later NaN take over)
        long at = -1;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W)
              continue;
            const long i = ((long)r * H + ih) * W + iw;
            if (m != m ? inp[i] != inp[i] : (at < 0 && inp[i] == m))
              at = i;
          }
        if (at >= 0)
          d_inp[at] += d_out[o];
      }
}

template <typename T>
void avgpool2d_forward(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH, int SW,
                       int PH, int PW, int count_include_pad, int ceil_mode) {
  ROOTCLAD_REPLAY_SKIP;
  const int OH = pool_out(H, KH, SH, PH, ceil_mode);
  const int OW = pool_out(W, KW, SW, PW, ceil_mode);
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        T s = 0;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W)
              s += inp[((long)r * H + ih) * W + iw];
          }
        const int div = pool_span(oh * SH - PH, KH, H, PH, count_include_pad) *
                        pool_span(ow * SW - PW, KW, W, PW, count_include_pad);
        out[((long)r * OH + oh) * OW + ow] = div > 0 ? s / div : T(0);
      }
}
template <typename T>
void avgpool2d_backward(T* d_inp, const T* d_out, int R, int H, int W, int KH, int KW, int SH,
                        int SW, int PH, int PW, int count_include_pad, int ceil_mode) {
  const int OH = pool_out(H, KH, SH, PH, ceil_mode);
  const int OW = pool_out(W, KW, SW, PW, ceil_mode);
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const int div = pool_span(oh * SH - PH, KH, H, PH, count_include_pad) *
                        pool_span(ow * SW - PW, KW, W, PW, count_include_pad);
        if (div == 0)
          continue;
        const T g = d_out[((long)r * OH + oh) * OW + ow] / div;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W)
              d_inp[((long)r * H + ih) * W + iw] += g;
          }
      }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_CONV2D_IMPL_H
