// rootclad/device/conv_impl.h — the definitions of the device kernels device/conv.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_CONV_IMPL_H
#define ROOTCLAD_DEVICE_CONV_IMPL_H

#include "conv.h"

namespace rootclad {
namespace dev {

// sum over a < NA, b < NB of u[a, b] * x[h0 + a*sh, w0 + b*sw], x (H, W) zero outside: a
// convolution's output element (u: the kernel) and its weight gradient's (u: the output's)
template <class U, class T>
ROOTCLAD_HD inline T strided_dot(U u, int NA, int NB, const T* x, int H, int W, int h0, int sh,
                                 int w0, int sw) {
  T s = 0;
  for (int a = 0; a < NA; ++a) {
    const int h = h0 + a * sh;
    if (h < 0 || h >= H)
      continue;
    for (int b = 0; b < NB; ++b) {
      const int w = w0 + b * sw;
      if (w >= 0 && w < W)
        s += u[a * NB + b] * x[(long)h * W + w];
    }
  }
  return s;
}

// the output position along one axis that reads input position `at` through tap k (-1: none)
inline ROOTCLAD_HD int conv_reader(int at, int k, int S, int P, int D, int LO) {
  const int t = at + P - k * D; // = l*S
  return t < 0 || t % S != 0 || t / S >= LO ? -1 : t / S;
}

// f(kh, kw, oh, ow) for each tap and output position that reads input position (ih, iw)
template <class F> ROOTCLAD_HD inline void each_reader(int ih, int iw, Conv g, F f) {
  for (int kh = 0; kh < g.KH; ++kh) {
    const int oh = conv_reader(ih, kh, g.SH, g.PH, g.DH, g.OH);
    if (oh < 0)
      continue;
    for (int kw = 0; kw < g.KW; ++kw) {
      const int ow = conv_reader(iw, kw, g.SW, g.PW, g.DW, g.OW);
      if (ow >= 0)
        f(kh, kw, oh, ow);
    }
  }
}

// col[k, n] = the input element that tap k of output position n reads (0 in the padding)
template <class On, class T> void im2col(On on, T* col, const T* inp, int B, Conv g) {
  const long P = (long)g.OH * g.OW, N = B * P;
  each_index(
      on, conv_depth(g) * N, ROOTCLAD_BODY(long i) {
        const long n = i % N, k = i / N, b = n / P;
        const int p = (int)(n % P), kw = (int)(k % g.KW), kh = (int)(k / g.KW % g.KH);
        const int c = (int)(k / ((long)g.KW * g.KH));
        const int h = p / g.OW * g.SH - g.PH + kh * g.DH, w = p % g.OW * g.SW - g.PW + kw * g.DW;
        col[i] = h >= 0 && h < g.H && w >= 0 && w < g.W
                     ? inp[((b * g.C + c) * g.H + h) * (long)g.W + w]
                     : T(0);
      });
}

// d_inp[b, c, h, w] += the columns' entries that read it (the adjoint of im2col, gathered)
template <class On, class T> void col2im(On on, T* d_inp, const T* d_col, int B, Conv g) {
  const long P = (long)g.OH * g.OW, N = B * P;
  each_index(
      on, (long)B * g.C * g.H * g.W, ROOTCLAD_BODY(long i) {
        const int iw = (int)(i % g.W), ih = (int)(i / g.W % g.H);
        const int c = (int)(i / ((long)g.W * g.H) % g.C);
        const long b = i / ((long)g.W * g.H * g.C);
        T s = 0;
        each_reader(ih, iw, g, [&](int kh, int kw, int oh, int ow) {
          s += d_col[(((long)c * g.KH + kh) * g.KW + kw) * N + b * P + (long)oh * g.OW + ow];
        });
        d_inp[i] += s;
      });
}

template <class On, class T, class Act>
void conv2d_gemm_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int B, Conv g,
                         Act act, T* work) {
  const long P = (long)g.OH * g.OW, CK = conv_depth(g), in_size = (long)g.C * g.H * g.W;
  const int chunk = conv_gemm_chunk(B, g);
  for (int b0 = 0; b0 < B; b0 += chunk) {
    const int Bc = B - b0 < chunk ? B - b0 : chunk;
    const long N = Bc * P;
    T* const col = work;                     // (CK, N)
    T* const out_by_channel = work + CK * N; // (OC, N)
    T* const out_chunk = out + (long)b0 * g.OC * P;
    im2col(on, col, inp + b0 * in_size, Bc, g);
    gemm(on, false, false, g.OC, (int)N, (int)CK, T(1), weight, (int)CK, col, (int)N, T(0),
         out_by_channel, (int)N);
    each_index(
        on, (long)g.OC * N, ROOTCLAD_BODY(long i) { // i: the chunk's out index (b, o, p)
          const long p = i % P, o = i / P % g.OC, b = i / (P * g.OC);
          out_chunk[i] = act.f(out_by_channel[o * N + b * P + p] + (bias ? bias[o] : T(0)));
        });
  }
}

template <class On, class T, class DY>
void conv2d_gemm_backward(On on, T* d_inp, T* d_weight, T* d_bias, DY d_out, const T* inp,
                          const T* weight, int B, Conv g, T* work) {
  const long P = (long)g.OH * g.OW, CK = conv_depth(g), in_size = (long)g.C * g.H * g.W;
  if (d_bias)
    bias_backward(on, d_bias, d_out, B, g.OC, (int)P);
  if (!d_weight && !d_inp)
    return;
  const int chunk = conv_gemm_chunk(B, g);
  for (int b0 = 0; b0 < B; b0 += chunk) {
    const int Bc = B - b0 < chunk ? B - b0 : chunk;
    const long N = Bc * P, first = (long)b0 * g.OC * P; // the chunk's first index in d_out
    T* const col = work;
    T* const dy = work + CK * N; // d_out (through the fused activation), channel-major (OC, N)
    each_index(
        on, (long)g.OC * N, ROOTCLAD_BODY(long i) { // i: dy's index (o, b, p)
          const long n = i % N, o = i / N;
          dy[i] = d_out[first + (n / P * g.OC + o) * P + n % P];
        });
    if (d_weight) {
      im2col(on, col, inp + b0 * in_size, Bc, g); // the forward's columns, since overwritten
      gemm(on, false, true, g.OC, (int)CK, (int)N, T(1), dy, (int)N, col, (int)N, T(1), d_weight,
           (int)CK);
    }
    if (d_inp) {
      gemm(on, true, false, (int)CK, (int)N, g.OC, T(1), weight, (int)CK, dy, (int)N, T(0), col,
           (int)N);
      col2im(on, d_inp + b0 * in_size, col, Bc, g);
    }
  }
}

template <class On, class T, class Act>
void conv2d_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int B, Conv g,
                    Act act, T* work) {
  if (work && conv_gemm_applies(B, g)) {
    conv2d_gemm_forward(on, out, inp, weight, bias, B, g, act, work);
    return;
  }
  const int CG = g.C / g.G, OCG = g.OC / g.G;
  each_index(
      on, (long)B * g.OC * g.OH * g.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % g.OW), oh = (int)(i / g.OW % g.OH);
        const int o = (int)(i / ((long)g.OW * g.OH) % g.OC);
        const long b = i / ((long)g.OW * g.OH * g.OC);
        T s = bias ? bias[o] : T(0);
        for (int c = 0; c < CG; ++c)
          s += strided_dot(weight + ((long)o * CG + c) * g.KH * g.KW, g.KH, g.KW,
                           inp + (b * g.C + (o / OCG) * CG + c) * g.H * g.W, g.H, g.W,
                           oh * g.SH - g.PH, g.DH, ow * g.SW - g.PW, g.DW);
        out[i] = act.f(s);
      });
}

// d_inp[b, c, ih, iw] += sum over the taps and output positions that read it
template <class On, class T, class DY>
void conv2d_backward_input(On on, T* d_inp, DY d_out, const T* weight, int B, Conv g) {
  const int CG = g.C / g.G, OCG = g.OC / g.G;
  each_index(
      on, (long)B * g.C * g.H * g.W, ROOTCLAD_BODY(long i) {
        const int iw = (int)(i % g.W), ih = (int)(i / g.W % g.H);
        const int cin = (int)(i / ((long)g.W * g.H) % g.C);
        const long b = i / ((long)g.W * g.H * g.C);
        const int grp = cin / CG, c = cin % CG;
        T s = 0;
        each_reader(ih, iw, g, [&](int kh, int kw, int oh, int ow) {
          for (int o = grp * OCG; o < (grp + 1) * OCG; ++o)
            s += weight[(((long)o * CG + c) * g.KH + kh) * g.KW + kw] *
                 d_out[((b * g.OC + o) * g.OH + oh) * g.OW + ow];
        });
        d_inp[i] += s;
      });
}

// d_weight[o, c, kh, kw] += sum over b and the output positions of d_out * the input it read;
// d_bias[o] += sum of d_out[b, o, ...] (null: skipped)
template <class On, class T, class DY>
void conv2d_backward_params(On on, T* d_weight, T* d_bias, DY d_out, const T* inp, int B, Conv g) {
  const int CG = g.C / g.G, OCG = g.OC / g.G;
  const long n = (long)g.OC * CG * g.KH * g.KW, chunks = batch_chunks(n, B);
  if (d_weight) // null: not wanted (an input gradient)
    each_index(
        on, n * chunks, ROOTCLAD_BODY(long j) {
          const long i = j % n, chunk = j / n;
          const int kw = (int)(i % g.KW), kh = (int)(i / g.KW % g.KH);
          const int c = (int)(i / ((long)g.KW * g.KH) % CG);
          const int o = (int)(i / ((long)g.KW * g.KH * CG));
          const int cin = (o / OCG) * CG + c;
          T s = 0;
          for (long b = B * chunk / chunks; b < B * (chunk + 1) / chunks; ++b)
            s += strided_dot(d_out + (b * g.OC + o) * g.OH * g.OW, g.OH, g.OW,
                             inp + (b * g.C + cin) * g.H * g.W, g.H, g.W, kh * g.DH - g.PH, g.SH,
                             kw * g.DW - g.PW, g.SW);
          add_to(d_weight + i, s);
        });
  if (d_bias)
    bias_backward(on, d_bias, d_out, B, g.OC, g.OH * g.OW);
}

template <class On, class T, class DY>
void conv2d_backward(On on, T* d_inp, T* d_weight, T* d_bias, DY d_out, const T* inp,
                     const T* weight, int B, Conv g, T* work) {
  if (work && conv_gemm_applies(B, g)) {
    conv2d_gemm_backward(on, d_inp, d_weight, d_bias, d_out, inp, weight, B, g, work);
    return;
  }
  conv2d_backward_params(on, d_weight, d_bias, d_out, inp, B, g);
  if (d_inp)
    conv2d_backward_input(on, d_inp, d_out, weight, B, g);
}

template <class On, class T>
void conv_transpose2d_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int B,
                              Conv g) {
  const long HW = (long)g.H * g.W;
  each_index(
      on, (long)B * g.C * HW, ROOTCLAD_BODY(long i) { out[i] = bias ? bias[i / HW % g.C] : T(0); });
  // (the adjoint as T*: the very kernel of Conv2d's backward, not another instance of it)
  conv2d_backward_input(on, out, const_cast<T*>(inp), weight, B, g);
}

template <class On, class T>
void conv_transpose2d_backward_input(On on, T* d_inp, const T* d_out, const T* weight, int B,
                                     Conv g) {
  const int CG = g.C / g.G, OCG = g.OC / g.G;
  each_index(
      on, (long)B * g.OC * g.OH * g.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % g.OW), oh = (int)(i / g.OW % g.OH);
        const int o = (int)(i / ((long)g.OW * g.OH) % g.OC);
        const long b = i / ((long)g.OW * g.OH * g.OC);
        T s = 0;
        for (int c = 0; c < CG; ++c)
          s += strided_dot(weight + ((long)o * CG + c) * g.KH * g.KW, g.KH, g.KW,
                           d_out + (b * g.C + (o / OCG) * CG + c) * g.H * g.W, g.H, g.W,
                           oh * g.SH - g.PH, g.DH, ow * g.SW - g.PW, g.DW);
        d_inp[i] += s;
      });
}

template <class On, class T>
void conv_transpose2d_backward_params(On on, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                                      int B, Conv g) {
  conv2d_backward_params(on, d_weight, (T*)nullptr, const_cast<T*>(inp), d_out, B, g);
  if (d_bias)
    bias_backward(on, d_bias, const_cast<T*>(d_out), B, g.C, g.H * g.W);
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_CONV_IMPL_H
