// rootclad/ops/conv2d_direct.h — the paths of conv2d_impl.h that write no im2col columns, and
// the layout of a chunk's samples side by side that the im2col path shares: stride 1 with few
// taps (conv2d_s1), pointwise (conv2d_pw), depthwise (conv2d_dw). Not a header of its own:
// conv2d_impl.h includes it after Conv2dShape, with pullbacks only (Clad differentiating the
// kernels sees the plain loops); rootclad/codegen/cpu_ops.py gives these paths no columns by the
// same tests (tests/ops/test_ops.py checks they agree).
#ifndef ROOTCLAD_OPS_CONV2D_DIRECT_H
#define ROOTCLAD_OPS_CONV2D_DIRECT_H

#include <algorithm>
#include <cstring>

#include "../blas.h"
#include "conv1d_s1.h"

namespace rootclad {

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

// -- small maps: the chunk's samples side by side ------------------------------------------------
// With small maps (fewer than BATCH_COLS_BELOW outputs per channel) one sample's product has
// too few columns for the GEMM's efficient shapes (resnet18 at 64x64 ends on 2x2 maps: 4
// columns), so the chunk's samples are put side by side: cols_g(taps, B*OH*OW), one product per
// group over the whole chunk into (OC, B*OH*OW), then laid out as (B, OC, OH, OW); the
// backward's two products likewise, from d_out laid out as (OC, B*OH*OW). The layout of cols
// and d_cols is the kernel's own (forward and backward agree on it; the size is the same).
// On resnet18 at batch 32 (64x64, two threads of 16 samples) this with issue 45's other
// changes took the train step from 0.58x torch eager's speed to 0.97x
// (docs/benchmarks/zoo_speed.md, the runs of 2026-11-27 and -30); taking the stem's 32x32 maps
// too gained nothing measurable here, and costs a pass over the output.
constexpr long BATCH_COLS_BELOW = 1024;
inline bool batch_cols(const Conv2dShape& s) {
  return s.B > 1 && (long)s.OH() * s.OW() < BATCH_COLS_BELOW;
}

// dst(R, B*L) = src(B, R, L) rows side by side; with sums, sums[r] += the row's total
template <typename T>
void side_by_side(T* dst, const T* src, int B, int R, long L, T* sums = nullptr) {
  const long N = (long)B * L;
  for (int r = 0; r < R; ++r) {
    T t = 0;
    for (int b = 0; b < B; ++b) {
      const T* x = src + ((long)b * R + r) * L;
      T* d = dst + (long)r * N + (long)b * L;
      for (long i = 0; i < L; ++i) {
        d[i] = x[i];
        t += x[i];
      }
    }
    if (sums)
      sums[r] += t;
  }
}

// dst(B, R, L) = src(R, B*L) (+ bias[r]), or += with add
template <typename T>
void from_side_by_side(T* dst, const T* src, int B, int R, long L, const T* bias, bool add) {
  const long N = (long)B * L;
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < R; ++r) {
      T* y = dst + ((long)b * R + r) * L;
      const T* s = src + (long)r * N + (long)b * L;
      const T c = bias ? bias[r] : T(0);
      if (add)
        for (long i = 0; i < L; ++i)
          y[i] += s[i];
      else
        for (long i = 0; i < L; ++i)
          y[i] = s[i] + c;
    }
}

// -- pointwise: 1x1, stride 1, no padding, one group ------------------------------------------
// A product on the activation itself, no columns (cpu_ops.py gives this path none): out_b(OC,
// HW) = W(OC, C) @ x_b(C, HW) per sample, or, for maps below BATCH_COLS_BELOW, over the chunk's
// samples side by side (x as (C, B*HW) in scratch, built again in the backward).
namespace conv2d_pw {

template <typename T> bool applies(const Conv2dShape& s) {
  return s.KH == 1 && s.KW == 1 && s.SH == 1 && s.SW == 1 && s.PH == 0 && s.PW == 0 && s.G == 1;
}

template <typename T>
void forward(T* out, const T* inp, const T* weight, const T* bias, const Conv2dShape& s) {
  const long HW = (long)s.H * s.W;
  if (batch_cols(s)) {
    const long N = s.B * HW;
    T* xt = conv_s1::scratch<T>(0, (long)s.C * N);
    T* yt = conv_s1::scratch<T>(1, (long)s.OC * N);
    side_by_side(xt, inp, s.B, s.C, HW);
    gemm(false, false, s.OC, (int)N, s.C, T(1), weight, s.C, xt, (int)N, T(0), yt, (int)N);
    return from_side_by_side(out, yt, s.B, s.OC, HW, bias, false);
  }
  for (int b = 0; b < s.B; ++b) {
    T* y = out + (long)b * s.OC * HW;
    if (bias)
      for (int o = 0; o < s.OC; ++o)
        std::fill(y + o * HW, y + (o + 1) * HW, bias[o]);
    gemm(false, false, s.OC, (int)HW, s.C, T(1), weight, s.C, inp + (long)b * s.C * HW, (int)HW,
         bias ? T(1) : T(0), y, (int)HW);
  }
}

// d_inp, d_weight, d_bias (each may be null) += the pullback of forward()
template <typename T>
void backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp, const T* weight,
              const Conv2dShape& s) {
  const long HW = (long)s.H * s.W;
  if (batch_cols(s)) {
    const long N = s.B * HW;
    T* gt = conv_s1::scratch<T>(1, (long)s.OC * N);
    side_by_side(gt, d_out, s.B, s.OC, HW, d_bias);
    if (d_weight) {
      T* xt = conv_s1::scratch<T>(0, (long)s.C * N);
      side_by_side(xt, inp, s.B, s.C, HW);
      gemm(false, true, s.OC, s.C, (int)N, T(1), gt, (int)N, xt, (int)N, T(1), d_weight, s.C);
    }
    if (d_inp) {
      T* dxt = conv_s1::scratch<T>(2, (long)s.C * N);
      gemm(true, false, s.C, (int)N, s.OC, T(1), weight, s.C, gt, (int)N, T(0), dxt, (int)N);
      from_side_by_side(d_inp, dxt, s.B, s.C, HW, (const T*)nullptr, true);
    }
    return;
  }
  for (int b = 0; b < s.B; ++b) {
    const T* dy = d_out + (long)b * s.OC * HW;
    if (d_bias)
      for (int o = 0; o < s.OC; ++o) {
        T t = 0;
        for (long i = 0; i < HW; ++i)
          t += dy[o * HW + i];
        d_bias[o] += t;
      }
    if (d_weight)
      gemm(false, true, s.OC, s.C, (int)HW, T(1), dy, (int)HW, inp + (long)b * s.C * HW, (int)HW,
           T(1), d_weight, s.C);
    if (d_inp)
      gemm(true, false, s.C, (int)HW, s.OC, T(1), weight, s.C, dy, (int)HW, T(1),
           d_inp + (long)b * s.C * HW, (int)HW);
  }
}

} // namespace conv2d_pw

// -- depthwise: one input channel per group (C = G, OC = G*m) -----------------------------------
// im2col + GEMM per group is a product of m rows by KH*KW taps: the wrong shape for a GEMM. Here
// each input plane is copied once into a zero-padded plane (Hp x Wp, scratch), and each output
// plane accumulates its taps over it with no bounds to test. With stride 1 the padded plane is
// one row (as conv2d_s1 reads it): output (oh, ow) sits at p = oh*Wp + ow, tap (kh, kw) reads
// p + kh*DH*Wp + kw*DW, so each tap is one long vectorised pass over OH*Wp positions (the
// Wp - OW extra ones per row dropped); with other strides, one pass per output row and tap.
// The backward reads the same windows. No columns are written (cpu_ops.py gives this path none).
namespace conv2d_dw {

template <typename T> bool applies(const Conv2dShape& s) {
  return s.G > 1 && s.C == s.G;
}

struct Plane {
  int OH, OW, Hp, Wp;
  long Lx;   // the padded plane and, for the flat reads of the last taps, (KW-1)*DW more zeros
  long LO;   // stride 1: the flat outputs, OH*Wp
  bool flat; // stride 1
};

inline Plane plane(const Conv2dShape& s) {
  Plane p;
  p.OH = s.OH();
  p.OW = s.OW();
  p.Hp = s.H + 2 * s.PH;
  p.Wp = s.W + 2 * s.PW;
  p.Lx = (long)p.Hp * p.Wp + (long)(s.KW - 1) * s.DW;
  p.LO = (long)p.OH * p.Wp;
  p.flat = s.SH == 1 && s.SW == 1;
  return p;
}

// the interior of the padded plane xp (whose border stays zero) from x(H, W)
template <typename T> void fill(T* xp, const T* x, const Conv2dShape& s, const Plane& p) {
  for (int h = 0; h < s.H; ++h)
    std::memcpy(xp + (long)(h + s.PH) * p.Wp + s.PW, x + (long)h * s.W, sizeof(T) * s.W);
}

template <typename T>
void forward(T* out, const T* inp, const T* weight, const T* bias, const Conv2dShape& s) {
  const Plane p = plane(s);
  const int m = s.OCg(), K = s.KH * s.KW;
  const long HW = (long)s.H * s.W, OHW = (long)p.OH * p.OW;
  T* xp = conv_s1::scratch<T>(0, p.Lx);
  T* yf = conv_s1::scratch<T>(1, p.LO);
  std::fill(xp, xp + p.Lx, T(0));
  for (int b = 0; b < s.B; ++b)
    for (int o = 0; o < s.OC; ++o) {
      if (o % m == 0)
        fill(xp, inp + ((long)b * s.C + o / m) * HW, s, p);
      T* y = out + ((long)b * s.OC + o) * OHW;
      const T* w = weight + (long)o * K;
      const T b0 = bias ? bias[o] : T(0);
      if (p.flat) {
        std::fill(yf, yf + p.LO, b0);
        for (int kh = 0; kh < s.KH; ++kh)
          for (int kw = 0; kw < s.KW; ++kw) {
            const T wk = w[kh * s.KW + kw];
            const T* xs = xp + (long)kh * s.DH * p.Wp + (long)kw * s.DW;
            ROOTCLAD_SIMD
            for (long i = 0; i < p.LO; ++i)
              yf[i] += wk * xs[i];
          }
        for (int oh = 0; oh < p.OH; ++oh)
          std::memcpy(y + (long)oh * p.OW, yf + (long)oh * p.Wp, sizeof(T) * p.OW);
        continue;
      }
      std::fill(y, y + OHW, b0);
      for (int oh = 0; oh < p.OH; ++oh) {
        T* yr = y + (long)oh * p.OW;
        for (int kh = 0; kh < s.KH; ++kh) {
          const T* xr = xp + (long)(oh * s.SH + kh * s.DH) * p.Wp;
          for (int kw = 0; kw < s.KW; ++kw) {
            const T wk = w[kh * s.KW + kw];
            const T* xs = xr + (long)kw * s.DW;
            for (int ow = 0; ow < p.OW; ++ow)
              yr[ow] += wk * xs[(long)ow * s.SW];
          }
        }
      }
    }
}

// d_inp, d_weight, d_bias (each may be null) += the pullback of forward()
template <typename T>
void backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp, const T* weight,
              const Conv2dShape& s) {
  const Plane p = plane(s);
  const int m = s.OCg(), K = s.KH * s.KW;
  const long HW = (long)s.H * s.W, OHW = (long)p.OH * p.OW;
  T* xp = conv_s1::scratch<T>(0, p.Lx);
  T* gf = conv_s1::scratch<T>(1, p.LO); // stride 1: d_out's plane in rows of Wp, zeros after OW
  T* dxp = conv_s1::scratch<T>(2, p.Lx);
  std::fill(xp, xp + p.Lx, T(0));
  if (p.flat)
    std::fill(gf, gf + p.LO, T(0));
  for (int b = 0; b < s.B; ++b)
    for (int o = 0; o < s.OC; ++o) {
      const int c = o / m;
      if (o % m == 0) {
        if (d_weight)
          fill(xp, inp + ((long)b * s.C + c) * HW, s, p);
        if (d_inp)
          std::fill(dxp, dxp + p.Lx, T(0));
      }
      const T* g = d_out + ((long)b * s.OC + o) * OHW;
      if (d_bias) {
        T t = 0;
        for (long i = 0; i < OHW; ++i)
          t += g[i];
        d_bias[o] += t;
      }
      T* dw = d_weight ? d_weight + (long)o * K : nullptr;
      const T* w = weight + (long)o * K;
      if (p.flat) {
        for (int oh = 0; oh < p.OH; ++oh)
          std::memcpy(gf + (long)oh * p.Wp, g + (long)oh * p.OW, sizeof(T) * p.OW);
        for (int kh = 0; kh < s.KH; ++kh)
          for (int kw = 0; kw < s.KW; ++kw) {
            const long off = (long)kh * s.DH * p.Wp + (long)kw * s.DW;
            if (dw) {
              const T* xs = xp + off;
              T t = 0;
              ROOTCLAD_SIMD_SUM(t)
              for (long i = 0; i < p.LO; ++i)
                t += gf[i] * xs[i];
              dw[kh * s.KW + kw] += t;
            }
            if (d_inp) {
              const T wk = w[kh * s.KW + kw];
              T* ds = dxp + off;
              ROOTCLAD_SIMD
              for (long i = 0; i < p.LO; ++i)
                ds[i] += wk * gf[i];
            }
          }
      } else
        for (int oh = 0; oh < p.OH; ++oh) {
          const T* gr = g + (long)oh * p.OW;
          for (int kh = 0; kh < s.KH; ++kh) {
            const long row = (long)(oh * s.SH + kh * s.DH) * p.Wp;
            for (int kw = 0; kw < s.KW; ++kw) {
              const long off = row + (long)kw * s.DW;
              if (dw) {
                const T* xs = xp + off;
                T t = 0;
                for (int ow = 0; ow < p.OW; ++ow)
                  t += gr[ow] * xs[(long)ow * s.SW];
                dw[kh * s.KW + kw] += t;
              }
              if (d_inp) {
                const T wk = w[kh * s.KW + kw];
                T* ds = dxp + off;
                for (int ow = 0; ow < p.OW; ++ow)
                  ds[(long)ow * s.SW] += wk * gr[ow];
              }
            }
          }
        }
      if (d_inp && o % m == m - 1) { // the channel's last output: its padded adjoint's interior
        T* dx = d_inp + ((long)b * s.C + c) * HW;
        for (int h = 0; h < s.H; ++h) {
          const T* r = dxp + (long)(h + s.PH) * p.Wp + s.PW;
          T* d = dx + (long)h * s.W;
          for (int i = 0; i < s.W; ++i)
            d[i] += r[i];
        }
      }
    }
}

} // namespace conv2d_dw

} // namespace rootclad

#endif // ROOTCLAD_OPS_CONV2D_DIRECT_H
