// rootclad/ops/conv2d_impl.h — the definitions of the kernels conv2d.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_CONV2D_IMPL_H
#define ROOTCLAD_OPS_CONV2D_IMPL_H

#include "core.h"
#include "pool_geometry.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#ifndef ROOTCLAD_NO_PULLBACKS
#include "conv1d_s1.h"
#endif
#include "conv2d.h"

namespace rootclad {

struct Conv2dShape {
  int B, C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G;
  int OH() const { return (H + 2 * PH - DH * (KH - 1) - 1) / SH + 1; }
  int OW() const { return (W + 2 * PW - DW * (KW - 1) - 1) / SW + 1; }
  int Cg() const { return C / G; }
  int OCg() const { return OC / G; }
  int taps() const { return Cg() * KH * KW; } // rows of one group's cols
};

// cols of sample b, group g (see the top of this file)
template <typename T> void conv2d_im2col(T* cols, const T* inp, const Conv2dShape& s, int g) {
  const int OH = s.OH(), OW = s.OW(), Cg = s.Cg();
  for (int c = 0; c < Cg; ++c)
    for (int kh = 0; kh < s.KH; ++kh)
      for (int kw = 0; kw < s.KW; ++kw) {
        T* row = cols + ((long)(c * s.KH + kh) * s.KW + kw) * OH * OW;
        const T* x = inp + (long)(g * Cg + c) * s.H * s.W;
        for (int oh = 0; oh < OH; ++oh) {
          const int ih = oh * s.SH - s.PH + kh * s.DH;
          for (int ow = 0; ow < OW; ++ow) {
            const int iw = ow * s.SW - s.PW + kw * s.DW;
            row[oh * OW + ow] =
                ih >= 0 && ih < s.H && iw >= 0 && iw < s.W ? x[(long)ih * s.W + iw] : T(0);
          }
        }
      }
}

// d_inp += the scatter of d_cols (the adjoint of conv2d_im2col)
template <typename T> void conv2d_col2im(T* d_inp, const T* d_cols, const Conv2dShape& s, int g) {
  const int OH = s.OH(), OW = s.OW(), Cg = s.Cg();
  for (int c = 0; c < Cg; ++c)
    for (int kh = 0; kh < s.KH; ++kh)
      for (int kw = 0; kw < s.KW; ++kw) {
        const T* row = d_cols + ((long)(c * s.KH + kh) * s.KW + kw) * OH * OW;
        T* dx = d_inp + (long)(g * Cg + c) * s.H * s.W;
        for (int oh = 0; oh < OH; ++oh) {
          const int ih = oh * s.SH - s.PH + kh * s.DH;
          if (ih < 0 || ih >= s.H)
            continue;
          for (int ow = 0; ow < OW; ++ow) {
            const int iw = ow * s.SW - s.PW + kw * s.DW;
            if (iw >= 0 && iw < s.W)
              dx[(long)ih * s.W + iw] += row[oh * OW + ow];
          }
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
// -- stride 1, one group: direct convolution over the flattened, zero-padded image ------------
// With the image padded to Hp x Wp and each channel laid out as one row, output (oh, ow) sits
// at p = oh*Wp + ow and tap (kh, kw) reads p + kh*DH*Wp + kw*DW: a 1-D convolution whose taps
// are a table, which conv1d_s1.h's register-blocked kernels run (positions with ow >= OW are
// computed and dropped, Wp/OW of the work). No im2col is written; the backward forms d_inp
// the same way (d_out padded, the kernel flipped) and d_weight from the padded input.
namespace conv2d_s1 {

struct Flat {
  int Hp, Wp, OH, OW, K;
  long Lx;   // a channel's padded row, with (KW-1)*DW zeros after the image for the last taps
  long LO;   // flattened outputs, OH*Wp
  int* offs; // K = KH*KW tap offsets (per-thread scratch)
};

inline Flat flat(int H, int W, int KH, int KW, int PH, int PW, int DH, int DW) {
  Flat f;
  f.Hp = H + 2 * PH;
  f.Wp = W + 2 * PW;
  f.OH = f.Hp - (KH - 1) * DH;
  f.OW = f.Wp - (KW - 1) * DW;
  f.K = KH * KW;
  f.Lx = (long)f.Hp * f.Wp + (long)(KW - 1) * DW;
  f.LO = (long)f.OH * f.Wp;
  f.offs = conv_s1::scratch<int>(0, f.K);
  for (int kh = 0; kh < KH; ++kh)
    for (int kw = 0; kw < KW; ++kw)
      f.offs[kh * KW + kw] = kh * DH * f.Wp + kw * DW;
  return f;
}

// rows of H x W images into rows of Lx: zero-padded by PH, PW around each image
template <typename T>
void pad(T* dst, const T* src, long rows, int H, int W, int PH, int PW, const Flat& f) {
  for (long r = 0; r < rows; ++r) {
    T* d = dst + r * f.Lx;
    const T* x = src + r * H * W;
    std::fill(d, d + f.Lx, T(0));
    for (int h = 0; h < H; ++h)
      std::memcpy(d + (long)(h + PH) * f.Wp + PW, x + (long)h * W, sizeof(T) * W);
  }
}

// dst(R, OH', OW') (=, or += with add) the flattened rows' positions (i + r0, j + c0)
template <typename T>
void unflatten(T* dst, const T* src, int R, int OHc, int OWc, int Wp, long LO, int r0, int c0,
               bool add) {
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < OHc; ++i) {
      T* d = dst + ((long)r * OHc + i) * OWc;
      const T* s = src + r * LO + (long)(i + r0) * Wp + c0;
      if (add)
        for (int j = 0; j < OWc; ++j)
          d[j] += s[j];
      else
        std::memcpy(d, s, sizeof(T) * OWc);
    }
}

// Whether the direct kernels take this convolution: stride 1, one group, flattened rows of at
// least one vector (else conv1d_s1's rows() declines), and few taps. Measured on one core
// (a batch of 128 or 32, 3x3, float32), direct against im2col + OpenBLAS, forward / backward:
// 1->8 channels 28x28 x1.6 / x0.95, 8->16 14x14 x2.6 / x1.2, 32->32 32x32 x1.4 / x1.2,
// 64->64 16x16 x0.96 / x0.53: with C*KH*KW above 288 the GEMM path stays. MIN_ROW is at least
// the widest vector (AVX-512: 16 floats). rootclad/codegen/cpu_ops.py mirrors this test to give
// the direct path no cols (tests/ops/test_ops.py checks the constants agree).
constexpr int MAX_TAPS = 288;
constexpr int MIN_ROW = 16;
template <typename T> bool applies(const Conv2dShape& s) {
  static_assert(MIN_ROW >= simd::lanes<T>(), "rows() needs a row of at least one vector");
  const long LO = (long)s.OH() * (s.W + 2 * s.PW);
  return s.SH == 1 && s.SW == 1 && s.G == 1 && s.C * s.KH * s.KW <= MAX_TAPS && LO >= MIN_ROW;
}

// out(B, OC, OH, OW) = conv2d(inp(B, C, H, W)) + bias
template <typename T>
void forward(T* out, const T* inp, const T* weight, const T* bias, const Conv2dShape& s) {
  const Flat f = flat(s.H, s.W, s.KH, s.KW, s.PH, s.PW, s.DH, s.DW);
  T* xp = conv_s1::scratch<T>(0, (long)s.C * f.Lx);
  T* yf = conv_s1::scratch<T>(1, (long)s.OC * f.LO);
  for (int b = 0; b < s.B; ++b) {
    pad(xp, inp + (long)b * s.C * s.H * s.W, s.C, s.H, s.W, s.PH, s.PW, f);
    conv_s1::rows<T, false>(yf, xp, weight, bias, s.C, (int)f.Lx, s.OC, f.K,
                            conv_s1::TapTable{f.offs}, (int)f.LO);
    unflatten(out + (long)b * s.OC * f.OH * f.OW, yf, s.OC, f.OH, f.OW, f.Wp, f.LO, 0, 0, false);
  }
}

// d_inp, d_weight, d_bias (each may be null) += the pullback of forward()
template <typename T>
void backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp, const T* weight,
              const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW(), K = s.KH * s.KW;
  const long OHW = (long)OH * OW;
  if (d_bias)
    for (int b = 0; b < s.B; ++b)
      for (int o = 0; o < s.OC; ++o) {
        const T* g = d_out + ((long)b * s.OC + o) * OHW;
        T t = 0;
        for (long i = 0; i < OHW; ++i)
          t += g[i];
        d_bias[o] += t;
      }
  if (d_weight) { // d_w[o,c,k] = sum_b sum_p g_flat[b,o,p] x_flat[b,c,p + offs[k]]
    const Flat f = flat(s.H, s.W, s.KH, s.KW, s.PH, s.PW, s.DH, s.DW);
    T* xs = conv_s1::scratch<T>(0, (long)s.B * s.C * f.Lx);
    T* gf = conv_s1::scratch<T>(1, (long)s.B * s.OC * f.LO);
    pad(xs, inp, (long)s.B * s.C, s.H, s.W, s.PH, s.PW, f);
    for (long r = 0; r < (long)s.B * s.OC; ++r) // d_out's rows, zeros at the dropped columns
      for (int i = 0; i < OH; ++i) {
        T* d = gf + r * f.LO + (long)i * f.Wp;
        std::memcpy(d, d_out + r * OHW + (long)i * OW, sizeof(T) * OW);
        std::fill(d + OW, d + f.Wp, T(0));
      }
    conv_s1::dweight(d_weight, gf, xs, s.B, s.C, (int)f.Lx, s.OC, K, conv_s1::TapTable{f.offs},
                     (int)f.LO);
  }
  if (!d_inp)
    return;
  // d_x = d_out padded by the kernel's extent less one, convolved with the flipped,
  // transposed kernel wt[c, o, KH-1-kh, KW-1-kw]: an output over the padded input
  const int EH = (s.KH - 1) * s.DH, EW = (s.KW - 1) * s.DW;
  const Flat f = flat(OH, OW, s.KH, s.KW, EH, EW, s.DH, s.DW);
  T* wt = conv_s1::scratch<T>(2, (long)s.C * s.OC * K);
  for (int o = 0; o < s.OC; ++o)
    for (int c = 0; c < s.C; ++c)
      for (int k = 0; k < K; ++k)
        wt[((long)c * s.OC + o) * K + (K - 1 - k)] = weight[((long)o * s.C + c) * K + k];
  T* gp = conv_s1::scratch<T>(3, (long)s.OC * f.Lx);
  T* dxf = conv_s1::scratch<T>(4, (long)s.C * f.LO);
  for (int b = 0; b < s.B; ++b) {
    pad(gp, d_out + (long)b * s.OC * OHW, s.OC, OH, OW, EH, EW, f);
    conv_s1::rows<T, false>(dxf, gp, wt, (const T*)nullptr, s.OC, (int)f.Lx, s.C, K,
                            conv_s1::TapTable{f.offs}, (int)f.LO);
    unflatten(d_inp + (long)b * s.C * s.H * s.W, dxf, s.C, s.H, s.W, f.Wp, f.LO, s.PH, s.PW, true);
  }
}

} // namespace conv2d_s1

template <typename T>
void conv2d_forward(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B, int C,
                    int H, int W, int OC, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                    int DW, int G) {
  ROOTCLAD_REPLAY_SKIP;
  const Conv2dShape s{B, C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G};
  if (conv2d_s1::applies<T>(s))
    return conv2d_s1::forward(out, inp, weight, bias, s);
  const int OHW = s.OH() * s.OW(), taps = s.taps(), OCg = s.OCg();
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
  if (conv2d_s1::applies<T>(s)) // the forward wrote no cols
    return conv2d_s1::backward(d_inp, d_weight, d_bias, d_out, inp, weight, s);
  const int OHW = s.OH() * s.OW(), taps = s.taps(), OCg = s.OCg();
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
