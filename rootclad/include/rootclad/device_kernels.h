// rootclad/device_kernels.h — every op of the registry as device kernels (device.h).
//
// Each op is a function template over `On` (dev::Host or dev::Cuda) and T, written as one body
// per output element, with the CPU kernels' contract (kernels.h): <op>_forward writes its
// output, <op>_backward* add into the adjoints. Backward kernels are in gather form: the body
// for an element of an adjoint sums what flows into it, so no two indices write one place.
// The exceptions add with dev::add_to (an atomic on the GPU): the loss's sum, and the
// gradients that sum over the batch, whose sums are split into chunks (batch_chunks).
// Linear's products go to gemm (device_gemm.h: cuBLAS on the GPU) from GEMM_MIN_ROWS rows on.
//
// Fused activations: a producer (Linear, Conv2d, pooling, a binary op) may apply an activation
// whose derivative reads only its output (Relu, Tanh, Sigmoid) as it writes (`act`), so the
// pre-activation is never stored; its backward kernels then read the output adjoint through
// act_grad (dy * f'(y), element by element) wherever they read d_out. A backward kernel's
// `DY d_out` is a pointer or such an ActGrad.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "device.h"
#include "device_gemm.h"
#include "dropout_mask.h"
#include "ops/activations.h"
#include "optim_rule.h"

namespace rootclad {
namespace dev {

// A program's adjoints (d_act, rootclad/codegen/device.py) are planned, those alive at
// different times of the backward sharing memory, once they would take D_ACT_PLAN_MIN_VALUES
// values with a region each: a planned adjoint is zeroed where it takes over memory, one launch
// more for each such, which a small batch would feel and not gain from; unplanned, one zero
// at the start of the backward does for all. The host loops launch nothing: planned at any size
// (a test or a benchmark sets ROOTCLAD_D_ACT_PLAN_MIN_VALUES=ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES
// to lay d_act out as the GPU does).
#define ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES (1L << 24)
#ifndef ROOTCLAD_D_ACT_PLAN_MIN_VALUES
#if defined(__CUDACC__)
#define ROOTCLAD_D_ACT_PLAN_MIN_VALUES ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES
#else
#define ROOTCLAD_D_ACT_PLAN_MIN_VALUES 0L
#endif
#endif
constexpr long D_ACT_PLAN_MIN_VALUES = ROOTCLAD_D_ACT_PLAN_MIN_VALUES;

// p[0..n) = value (adjoints start at zero: the backward kernels add)
template <class On, class T> void fill(On on, T* p, long n, T value) {
  each_index(on, n, ROOTCLAD_BODY(long i) { p[i] = value; });
}

// a[0..na), b[0..nb) and c[0..nc) = 0, one launch (a training step's loss and adjoints)
template <class On, class T> void zero(On on, T* a, long na, T* b, long nb, T* c, long nc) {
  each_index(
      on, na + nb + nc, ROOTCLAD_BODY(long i) {
        if (i < na)
          a[i] = T(0);
        else if (i < na + nb)
          b[i - na] = T(0);
        else
          c[i - na - nb] = T(0);
      });
}

// The identity as an activation: what a producer applies when nothing is fused.
struct NoAct {
  template <class T> ROOTCLAD_HD T f(T x) const { return x; }
};

// The adjoint of a fused activation's input, dy[i] * f'(y[i]) (the functor's grad from y),
// indexed like a pointer.
template <class T, class Act> struct ActGrad {
  T* dy;
  const T* y;
  Act act;
  ROOTCLAD_HD T operator[](long i) const { return act.grad(dy[i], T(0), y[i]); }
  ROOTCLAD_HD ActGrad operator+(long k) const { return ActGrad{dy + k, y + k, act}; }
};

template <class T, class Act> ActGrad<T, Act> act_grad(T* dy, const T* y, Act act) {
  return ActGrad<T, Act>{dy, y, act};
}

// The adjoint as a matrix in memory, for a product that reads it so: a pointer as it is; an
// ActGrad turned in place (dy = dy f'(y): its activation's adjoint has no other reader then).
template <class On, class T> const T* as_matrix(On, const T* d, long) {
  return d;
}
template <class On, class T, class Act> const T* as_matrix(On on, ActGrad<T, Act> g, long n) {
  each_index(on, n, ROOTCLAD_BODY(long i) { g.dy[i] = g.act.grad(g.dy[i], T(0), g.y[i]); });
  return g.dy;
}

// A gradient that sums over the batch (a bias's, a convolution's weight) has few elements and
// long sums: each element's sum is split into this many chunks of the batch, one index each,
// whose partial sums meet through add_to, so that a GPU gets some 2^16 threads to run them.
inline long batch_chunks(long elements, long batch) {
  const long chunks = (1L << 16) / (elements > 0 ? elements : 1);
  return chunks < 1 ? 1 : (chunks > batch ? batch : chunks);
}

// d_bias[o] += sum over rows r and positions l of d_out[r, o, l] (d_out: rows x OC x L)
template <class On, class T, class DY>
void bias_backward(On on, T* d_bias, DY d_out, long rows, int OC, int L) {
  const long chunks = batch_chunks(OC, rows);
  each_index(
      on, OC * chunks, ROOTCLAD_BODY(long i) {
        const long o = i % OC, chunk = i / OC;
        T s = 0;
        for (long r = rows * chunk / chunks; r < rows * (chunk + 1) / chunks; ++r)
          for (int l = 0; l < L; ++l)
            s += d_out[(r * OC + o) * L + l];
        add_to(d_bias + o, s);
      });
}

// -- Linear: out(R, OC) = inp(R, C) @ weight(OC, C)^T + bias ----------------------------------
// From GEMM_MIN_ROWS rows on, the products go to gemm (cuBLAS on the GPU, device_gemm.h);
// fewer rows run as one loop kernel each, which costs less than a GEMM call there.
constexpr int GEMM_MIN_ROWS = 32;

// out = act(out + bias) (bias: null for none), after a product
template <class On, class T, class Act>
void bias_act(On on, T* out, const T* bias, long R, int OC, Act act) {
  each_index(
      on, R * OC, ROOTCLAD_BODY(long i) { out[i] = act.f(out[i] + (bias ? bias[i % OC] : T(0))); });
}

template <class On, class T, class Act = NoAct>
void linear_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int R, int C,
                    int OC, Act act = {}) {
  if (R >= GEMM_MIN_ROWS) {
    gemm(on, false, true, R, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
    if (bias || !std::is_same<Act, NoAct>::value)
      bias_act(on, out, bias, R, OC, act);
    return;
  }
  each_index(
      on, (long)R * OC, ROOTCLAD_BODY(long i) {
        const long r = i / OC;
        const int o = (int)(i % OC);
        T s = bias ? bias[o] : T(0);
        for (int c = 0; c < C; ++c)
          s += inp[r * C + c] * weight[(long)o * C + c];
        out[i] = act.f(s);
      });
}

// d_inp(R, C) += d_out @ weight, as loops
template <class On, class T, class DY>
void linear_backward_input(On on, T* d_inp, DY d_out, const T* weight, int R, int C, int OC) {
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

// d_weight(OC, C) += d_out^T @ inp;  d_bias(OC) += column sums of d_out (null: skipped), as
// loops
template <class On, class T, class DY>
void linear_backward_params(On on, T* d_weight, T* d_bias, DY d_out, const T* inp, int R, int C,
                            int OC) {
  if (d_weight) // null: not wanted (an input gradient)
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

// The whole pullback: d_inp (null: not wanted), d_weight and d_bias (null: skipped); from
// GEMM_MIN_ROWS rows on through gemm, which reads the adjoint as a matrix (as_matrix)
template <class On, class T, class DY>
void linear_backward(On on, T* d_inp, T* d_weight, T* d_bias, DY d_out, const T* inp,
                     const T* weight, int R, int C, int OC) {
  if (R < GEMM_MIN_ROWS) {
    linear_backward_params(on, d_weight, d_bias, d_out, inp, R, C, OC);
    if (d_inp)
      linear_backward_input(on, d_inp, d_out, weight, R, C, OC);
    return;
  }
  const T* dy = as_matrix(on, d_out, (long)R * OC);
  if (d_weight)
    gemm(on, true, false, OC, C, R, T(1), dy, OC, inp, C, T(1), d_weight, C);
  if (d_bias)
    bias_backward(on, d_bias, dy, R, OC, 1);
  if (d_inp)
    gemm(on, false, false, R, C, OC, T(1), dy, OC, weight, C, T(1), d_inp, C);
}

// -- elementwise ops: the functors of ops/activations.h, written once for every backend; those
// whose grad reads y alone (Relu, Tanh, Sigmoid) can be fused into their producer -------------
template <class On, class T, class Op>
void unary_forward(On on, T* out, const T* inp, long n, Op op) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = op.f(inp[i]); });
}

// d_inp += the functor's grad: d_out times f'(x), from x or y
template <class On, class T, class Op>
void unary_backward(On on, T* d_inp, const T* d_out, const T* inp, const T* out, long n, Op op) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_inp[i] += op.grad(d_out[i], inp[i], out[i]); });
}

// -- Conv2d (Conv1d: H = KH = 1): out(B, OC, OH, OW) from inp(B, C, H, W) and
// weight(OC, C/G, KH, KW), any stride, zero padding, dilation and G groups -----------------------
struct Conv {
  int C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G, OH, OW;
};

inline ROOTCLAD_HD int conv_out_len(int L, int K, int S, int P, int D) {
  return (L + 2 * P - D * (K - 1) - 1) / S + 1;
}

inline Conv conv2d_shape(int C, int H, int W, int OC, int KH, int KW, int SH, int SW, int PH,
                         int PW, int DH, int DW, int G) {
  return Conv{C,
              H,
              W,
              OC,
              KH,
              KW,
              SH,
              SW,
              PH,
              PW,
              DH,
              DW,
              G,
              conv_out_len(H, KH, SH, PH, DH),
              conv_out_len(W, KW, SW, PW, DW)};
}

inline Conv conv1d_shape(int C, int L, int OC, int K, int S, int P, int D, int G = 1) {
  return conv2d_shape(C, 1, L, OC, 1, K, 1, S, 0, P, 1, D, G);
}

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

// -- Conv2d as products (one group): the columns col(CK, N) hold, for each of the N = Bc x OH x OW
// output positions of a chunk of Bc samples (sample-major) and each of the CK = C x KH x KW taps,
// the input element it reads (im2col); then out = weight(OC, CK) @ col, d_weight += d_out @
// col^T and d_col = weight^T @ d_out, whose columns are summed back onto the input (col2im), each
// a single gemm (cuBLAS on the GPU) per chunk. The products are (OC, N), channel-major, so the
// output and its adjoint pass through a reordering copy in the workspace, which the bias, the
// fused activation and its derivative ride along with. Taken from CONV_GEMM_MIN_COLUMNS output
// positions over the batch on; fewer run as the direct kernels (fewer launches: 3 forward and up
// to 6 backward against 1 and 3). A chunk holds at most CONV_GEMM_MAX_COLUMNS output positions
// (whole samples, at least one), so the workspace stays bounded at any batch size. The program
// gives a layer a workspace only where its depth makes products pay (ops.CONV_GEMM_MIN_DEPTH).
constexpr long CONV_GEMM_MIN_COLUMNS = 4096;
#ifndef ROOTCLAD_CONV_GEMM_MAX_COLUMNS // a test sets it low to run many chunks
#define ROOTCLAD_CONV_GEMM_MAX_COLUMNS (1L << 17)
#endif
constexpr long CONV_GEMM_MAX_COLUMNS = ROOTCLAD_CONV_GEMM_MAX_COLUMNS;

inline ROOTCLAD_HD long conv_depth(Conv g) {
  return (long)(g.C / g.G) * g.KH * g.KW;
}
inline bool conv_gemm_applies(int B, Conv g) {
  return g.G == 1 && (long)B * g.OH * g.OW >= CONV_GEMM_MIN_COLUMNS;
}
// the samples per chunk of products
inline int conv_gemm_chunk(int B, Conv g) {
  const long fit = CONV_GEMM_MAX_COLUMNS / ((long)g.OH * g.OW);
  return (int)(fit < 1 ? 1 : fit < B ? fit : B);
}
// the workspace (values) a layer uses at batch B: a chunk's columns (CK x N), then its
// channel-major output or output adjoint (OC x N); none where it runs directly
inline long conv_gemm_workspace(int B, Conv g) {
  if (!conv_gemm_applies(B, g))
    return 0;
  return (conv_depth(g) + g.OC) * g.OH * g.OW * conv_gemm_chunk(B, g);
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

// out = conv(inp) + bias, through act; with a workspace (`work`, conv_gemm_workspace(B, g)
// values) and enough output positions over the batch, as products (conv_gemm_applies)
template <class On, class T, class Act = NoAct>
void conv2d_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int B, Conv g,
                    Act act = {}, T* work = nullptr) {
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

// The whole pullback: d_inp (null: not wanted), d_weight and d_bias (null: skipped); through
// gemm where the forward went so (a workspace, conv_gemm_applies)
template <class On, class T, class DY>
void conv2d_backward(On on, T* d_inp, T* d_weight, T* d_bias, DY d_out, const T* inp,
                     const T* weight, int B, Conv g, T* work = nullptr) {
  if (work && conv_gemm_applies(B, g)) {
    conv2d_gemm_backward(on, d_inp, d_weight, d_bias, d_out, inp, weight, B, g, work);
    return;
  }
  conv2d_backward_params(on, d_weight, d_bias, d_out, inp, B, g);
  if (d_inp)
    conv2d_backward_input(on, d_inp, d_out, weight, B, g);
}

// -- pooling over windows of inp(R, H, W) -> out(R, OH, OW) (1-D: H = KH = 1); padding at most
// half the window, so every window holds an input element ---------------------------------------
struct Pool {
  int H, W, KH, KW, SH, SW, PH, PW, OH, OW;
};

inline Pool pool2d_shape(int H, int W, int KH, int KW, int SH, int SW, int PH, int PW) {
  return Pool{H, W, KH, KW, SH, SW, PH, PW, (H + 2 * PH - KH) / SH + 1, (W + 2 * PW - KW) / SW + 1};
}

// the windows [lo, hi] along one axis that hold input position `at`
inline ROOTCLAD_HD void pool_windows(int at, int K, int S, int P, int LO, int& lo, int& hi) {
  lo = at + P - K + 1;
  lo = lo <= 0 ? 0 : (lo + S - 1) / S;
  hi = (at + P) / S;
  if (hi > LO - 1)
    hi = LO - 1;
}

// MaxPool: the first maximum of a window (row-major) takes its gradient, as in torch.
template <class T>
ROOTCLAD_HD inline long maxpool_argmax(const T* x, const Pool& p, int oh, int ow) {
  long best = -1;
  for (int kh = 0; kh < p.KH; ++kh) {
    const int ih = oh * p.SH - p.PH + kh;
    if (ih < 0 || ih >= p.H)
      continue;
    for (int kw = 0; kw < p.KW; ++kw) {
      const int iw = ow * p.SW - p.PW + kw;
      const long at = (long)ih * p.W + iw;
      if (iw >= 0 && iw < p.W && (best < 0 || x[at] > x[best]))
        best = at;
    }
  }
  return best;
}

template <class On, class T, class Act = NoAct>
void maxpool2d_forward(On on, T* out, const T* inp, long R, Pool p, Act act = {}) {
  each_index(
      on, R * p.OH * p.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % p.OW), oh = (int)(i / p.OW % p.OH);
        const T* x = inp + i / ((long)p.OW * p.OH) * p.H * p.W;
        out[i] = act.f(x[maxpool_argmax(x, p, oh, ow)]);
      });
}

// The backward of a pooling, gathered: d_inp[r, at] += the share share(d_out, r, at, oh, ow)
// gives of d_out[r, oh, ow] for each window (oh, ow) that holds input position at.
template <class On, class T, class DY, class Share>
void pool2d_backward(On on, T* d_inp, DY d_out, long R, Pool p, Share share) {
  each_index(
      on, R * p.H * p.W, ROOTCLAD_BODY(long i) {
        const long r = i / ((long)p.H * p.W), at = i % ((long)p.H * p.W);
        int h0, h1, w0, w1;
        pool_windows((int)(at / p.W), p.KH, p.SH, p.PH, p.OH, h0, h1);
        pool_windows((int)(at % p.W), p.KW, p.SW, p.PW, p.OW, w0, w1);
        T s = 0;
        for (int oh = h0; oh <= h1; ++oh)
          for (int ow = w0; ow <= w1; ++ow)
            s += share(d_out[(r * p.OH + oh) * p.OW + ow], r, at, oh, ow);
        d_inp[i] += s;
      });
}

// MaxPool: all of a window's gradient goes to its first maximum
template <class T> struct MaxPoolShare {
  const T* inp;
  Pool p;
  ROOTCLAD_HD T operator()(T dy, long r, long at, int oh, int ow) const {
    return maxpool_argmax(inp + r * p.H * p.W, p, oh, ow) == at ? dy : T(0);
  }
};

template <class On, class T, class DY>
void maxpool2d_backward(On on, T* d_inp, DY d_out, const T* inp, long R, Pool p) {
  pool2d_backward(on, d_inp, d_out, R, p, MaxPoolShare<T>{inp, p});
}

// AvgPool: with count_include_pad (torch's default) a window divides by KH*KW, otherwise by
// its elements inside the input.
inline ROOTCLAD_HD int avgpool_divisor(const Pool& p, int oh, int ow, int count_include_pad) {
  if (count_include_pad)
    return p.KH * p.KW;
  const int h0 = oh * p.SH - p.PH, w0 = ow * p.SW - p.PW;
  const int nh = (h0 + p.KH < p.H ? h0 + p.KH : p.H) - (h0 > 0 ? h0 : 0);
  const int nw = (w0 + p.KW < p.W ? w0 + p.KW : p.W) - (w0 > 0 ? w0 : 0);
  return nh * nw;
}

template <class On, class T, class Act = NoAct>
void avgpool2d_forward(On on, T* out, const T* inp, long R, Pool p, int count_include_pad,
                       Act act = {}) {
  each_index(
      on, R * p.OH * p.OW, ROOTCLAD_BODY(long i) {
        const int ow = (int)(i % p.OW), oh = (int)(i / p.OW % p.OH);
        const T* x = inp + i / ((long)p.OW * p.OH) * p.H * p.W;
        T s = 0;
        for (int kh = 0; kh < p.KH; ++kh) {
          const int ih = oh * p.SH - p.PH + kh;
          for (int kw = 0; kw < p.KW; ++kw) {
            const int iw = ow * p.SW - p.PW + kw;
            if (ih >= 0 && ih < p.H && iw >= 0 && iw < p.W)
              s += x[(long)ih * p.W + iw];
          }
        }
        out[i] = act.f(s / T(avgpool_divisor(p, oh, ow, count_include_pad)));
      });
}

// AvgPool: a window's gradient is shared evenly by its divisor
struct AvgPoolShare {
  Pool p;
  int count_include_pad;
  template <class T> ROOTCLAD_HD T operator()(T dy, long, long, int oh, int ow) const {
    return dy / T(avgpool_divisor(p, oh, ow, count_include_pad));
  }
};

template <class On, class T, class DY>
void avgpool2d_backward(On on, T* d_inp, DY d_out, long R, Pool p, int count_include_pad) {
  pool2d_backward(on, d_inp, d_out, R, p, AvgPoolShare{p, count_include_pad});
}

// -- a + sign * b of two same-shape tensors (residual additions), through act -----------------
template <class On, class T, class Act = NoAct>
void add_forward(On on, T* out, const T* a, const T* b, long n, T sign, Act act = {}) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = act.f(a[i] + sign * b[i]); });
}

// d_x += scale * d_out (the adjoint of each operand; scale -1 for a subtracted one)
template <class On, class T, class DY> void add_backward(On on, T* d_x, DY d_out, long n, T scale) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_x[i] += scale * d_out[i]; });
}

// -- a (op) b with broadcasting: per sample, the output's element j = (j0, j1, j2) over dims
// reads a at sum j_k sa[k] and b at sum j_k sb[k] (stride 0: a broadcast axis); ops.py's
// broadcast_geometry merges the axes. kind: 0 add, 1 sub, 2 mul, 3 div (ops.BINARY_KINDS).
struct Broadcast {
  int dims[3], sa[3], sb[3];
  long na, nb; // per-sample sizes of a and b
};

template <class T> ROOTCLAD_HD inline T binary_value(int kind, T a, T b) {
  return kind == 0 ? a + b : kind == 1 ? a - b : kind == 2 ? a * b : a / b;
}

// d (a op b) / d a (which = 0) or / d b (which = 1)
template <class T> ROOTCLAD_HD inline T binary_partial(int kind, int which, T a, T b) {
  if (kind == 0)
    return T(1);
  if (kind == 1)
    return which ? T(-1) : T(1);
  if (kind == 2)
    return which ? a : b;
  return which ? -a / (b * b) : T(1) / b;
}

template <class On, class T, class Act = NoAct>
void binary_forward(On on, T* out, const T* a, const T* b, long B, Broadcast g, int kind,
                    Act act = {}) {
  const long n = (long)g.dims[0] * g.dims[1] * g.dims[2];
  each_index(
      on, B * n, ROOTCLAD_BODY(long i) {
        const long s = i / n, j = i % n;
        const int j2 = (int)(j % g.dims[2]), j1 = (int)(j / g.dims[2] % g.dims[1]);
        const int j0 = (int)(j / ((long)g.dims[2] * g.dims[1]));
        const long ia = (long)j0 * g.sa[0] + (long)j1 * g.sa[1] + (long)j2 * g.sa[2];
        const long ib = (long)j0 * g.sb[0] + (long)j1 * g.sb[1] + (long)j2 * g.sb[2];
        out[i] = act.f(binary_value(kind, a[s * g.na + ia], b[s * g.nb + ib]));
      });
}

// d_x += the adjoint of operand `which` (0: a, 1: b), gathered: each of its elements sums the
// output elements that read it (over the axes where it is broadcast)
template <class On, class T, class DY>
void binary_backward(On on, T* d_x, DY d_out, const T* a, const T* b, long B, Broadcast g, int kind,
                     int which) {
  const long n = (long)g.dims[0] * g.dims[1] * g.dims[2];
  const long nx = which ? g.nb : g.na;
  each_index(
      on, B * nx, ROOTCLAD_BODY(long i) {
        const long s = i / nx, k = i % nx;
        const int* st = which ? g.sb : g.sa;
        int lo[3], hi[3];
        for (int d = 0; d < 3; ++d) {
          lo[d] = st[d] ? (int)(k / st[d] % g.dims[d]) : 0;
          hi[d] = st[d] ? lo[d] + 1 : g.dims[d];
        }
        T sum = 0;
        for (int j0 = lo[0]; j0 < hi[0]; ++j0)
          for (int j1 = lo[1]; j1 < hi[1]; ++j1)
            for (int j2 = lo[2]; j2 < hi[2]; ++j2) {
              const long j = ((long)j0 * g.dims[1] + j1) * g.dims[2] + j2;
              const long ia = (long)j0 * g.sa[0] + (long)j1 * g.sa[1] + (long)j2 * g.sa[2];
              const long ib = (long)j0 * g.sb[0] + (long)j1 * g.sb[1] + (long)j2 * g.sb[2];
              sum += d_out[s * n + j] *
                     binary_partial(kind, which, a[s * g.na + ia], b[s * g.nb + ib]);
            }
        d_x[i] += sum;
      });
}

// -- Dropout: the CPU's mask (dropout_mask.h) for the element's index in the batch; p = 0 (eval
// mode) keeps every element -------------------------------------------------------------------
template <class On, class T>
void dropout_forward(On on, T* out, const T* inp, long n, T p, std::uint64_t seed) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = inp[i] * dropout_scale(seed, i, p); });
}

template <class On, class T>
void dropout_backward(On on, T* d_inp, const T* d_out, long n, T p, std::uint64_t seed) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_inp[i] += d_out[i] * dropout_scale(seed, i, p); });
}

// -- permute: per sample, out's element j = (j0..j3) over dims reads inp at sum j_k st[k] -------
struct Permute {
  int dims[4], st[4];
  long n; // values per sample
};

inline ROOTCLAD_HD long permute_source(const Permute& g, long j) {
  long src = 0;
  for (int d = 3; d >= 0; --d) {
    src += (j % g.dims[d]) * g.st[d];
    j /= g.dims[d];
  }
  return src;
}

template <class On, class T> void permute_forward(On on, T* out, const T* inp, long B, Permute g) {
  each_index(
      on, B * g.n,
      ROOTCLAD_BODY(long i) { out[i] = inp[i / g.n * g.n + permute_source(g, i % g.n)]; });
}

// a permutation: every input element is read once, so the scatter writes each place once
template <class On, class T>
void permute_backward(On on, T* d_inp, const T* d_out, long B, Permute g) {
  each_index(
      on, B * g.n,
      ROOTCLAD_BODY(long i) { d_inp[i / g.n * g.n + permute_source(g, i % g.n)] += d_out[i]; });
}

// -- cat: input part inp(R, n_in) goes to columns [off, off + n_in) of out(R, n_out) ----------
template <class On, class T>
void cat_part_forward(On on, T* out, const T* inp, long R, int n_in, int n_out, int off) {
  each_index(
      on, R * n_in, ROOTCLAD_BODY(long i) { out[i / n_in * n_out + off + i % n_in] = inp[i]; });
}

template <class On, class T>
void cat_part_backward(On on, T* d_inp, const T* d_out, long R, int n_in, int n_out, int off) {
  each_index(
      on, R * n_in,
      ROOTCLAD_BODY(long i) { d_inp[i] += d_out[i / n_in * n_out + off + i % n_in]; });
}

// -- softmax and log-softmax along the middle axis of inp(R, N, S): one line (r, s) per index --
template <class On, class T>
void softmax_forward(On on, T* out, const T* inp, long R, int N, int S, int log_form) {
  each_index(
      on, R * S, ROOTCLAD_BODY(long line) {
        const long base = line / S * N * S + line % S;
        T m = inp[base];
        for (int k = 1; k < N; ++k)
          m = inp[base + (long)k * S] > m ? inp[base + (long)k * S] : m;
        T sum = 0;
        for (int k = 0; k < N; ++k)
          sum += exp(inp[base + (long)k * S] - m);
        const T lse = m + log(sum);
        for (int k = 0; k < N; ++k) {
          const T z = inp[base + (long)k * S] - lse;
          out[base + (long)k * S] = log_form ? z : exp(z);
        }
      });
}

// softmax: d_x += y (d_y - sum d_y y); log-softmax: d_x += d_y - exp(y) sum d_y
template <class On, class T>
void softmax_backward(On on, T* d_inp, const T* d_out, const T* out, long R, int N, int S,
                      int log_form) {
  each_index(
      on, R * S, ROOTCLAD_BODY(long line) {
        const long base = line / S * N * S + line % S;
        T sum = 0;
        for (int k = 0; k < N; ++k)
          sum += log_form ? d_out[base + (long)k * S]
                          : d_out[base + (long)k * S] * out[base + (long)k * S];
        for (int k = 0; k < N; ++k) {
          const long at = base + (long)k * S;
          d_inp[at] += log_form ? d_out[at] - exp(out[at]) * sum : out[at] * (d_out[at] - sum);
        }
      });
}

// -- LayerNorm over the rows of inp(R, M); stats (2R): each row's mean and 1/std --------------
template <class On, class T>
void layer_norm_forward(On on, T* out, T* stats, const T* inp, const T* weight, const T* bias,
                        long R, int M, T eps) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        const T* x = inp + r * M;
        T mean = 0, var = 0;
        for (int i = 0; i < M; ++i)
          mean += x[i];
        mean /= T(M);
        for (int i = 0; i < M; ++i)
          var += (x[i] - mean) * (x[i] - mean);
        const T rstd = T(1) / sqrt(var / T(M) + eps);
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
        for (int i = 0; i < M; ++i)
          out[r * M + i] =
              (x[i] - mean) * rstd * (weight ? weight[i] : T(1)) + (bias ? bias[i] : T(0));
      });
}

// d_weight[i] += sum over rows of d_out x_hat, d_bias[i] += sum of d_out (null: skipped)
template <class On, class T>
void layer_norm_backward_params(On on, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                                const T* stats, long R, int M) {
  if (!d_weight && !d_bias)
    return;
  each_index(
      on, (long)M, ROOTCLAD_BODY(long i) {
        T sw = 0, sb = 0;
        for (long r = 0; r < R; ++r) {
          sw += d_out[r * M + i] * (inp[r * M + i] - stats[2 * r]) * stats[2 * r + 1];
          sb += d_out[r * M + i];
        }
        if (d_weight)
          d_weight[i] += sw;
        if (d_bias)
          d_bias[i] += sb;
      });
}

// d_x += 1/std (g - mean(g) - x_hat mean(g x_hat)), g = d_out * weight, per row
template <class On, class T>
void layer_norm_backward_input(On on, T* d_inp, const T* d_out, const T* inp, const T* stats,
                               const T* weight, long R, int M) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        const T mean = stats[2 * r], rstd = stats[2 * r + 1];
        T sum_g = 0, sum_gx = 0;
        for (int i = 0; i < M; ++i) {
          const T g = d_out[r * M + i] * (weight ? weight[i] : T(1));
          sum_g += g;
          sum_gx += g * (inp[r * M + i] - mean) * rstd;
        }
        for (int i = 0; i < M; ++i) {
          const T g = d_out[r * M + i] * (weight ? weight[i] : T(1));
          const T xhat = (inp[r * M + i] - mean) * rstd;
          d_inp[r * M + i] += rstd * (g - sum_g / T(M) - xhat * sum_gx / T(M));
        }
      });
}

// -- global max pooling: out(R) = the maximum of each row of inp(R, L); its first maximum
// takes the gradient (as MaxPool's windows) ----------------------------------------------------
template <class T> ROOTCLAD_HD inline int row_argmax(const T* x, int L) {
  int best = 0;
  for (int l = 1; l < L; ++l)
    best = x[l] > x[best] ? l : best;
  return best;
}

template <class On, class T>
void global_maxpool_forward(On on, T* out, const T* inp, long R, int L) {
  each_index(on, R, ROOTCLAD_BODY(long r) { out[r] = inp[r * L + row_argmax(inp + r * L, L)]; });
}

// one index per row, which adds into one element of its own row
template <class On, class T>
void global_maxpool_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, int L) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) { d_inp[r * L + row_argmax(inp + r * L, L)] += d_out[r]; });
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

// -- BatchNorm over inp(B, C, S) per channel c ------------------------------------------------
// stats: mean and 1/std per channel at [2c, 2c + 1], the backward's sums at [2C + 2c, 2C + 2c +
// 1], then per channel and chunk of the batch (BN_CHUNKS at most) a partial result at
// 4C + 3 (c chunks + k). Training (or no running statistics): the batch's, each chunk's count,
// mean and squared deviations (two passes, in double) combined per channel as Chan et al.'s
// parallel variance, updating the running ones as torch (unbiased variance,
// num_batches_tracked + 1); eval: the running ones.
constexpr int BN_CHUNKS = 64;

inline ROOTCLAD_HD long bn_chunks(long B) {
  return B < BN_CHUNKS ? B : BN_CHUNKS;
}

template <class On, class T>
void batch_norm_stats(On on, T* stats, const T* inp, T* running_mean, T* running_var, T* tracked,
                      long B, int C, long S, T eps, T momentum, int training) {
  const long chunks = bn_chunks(B);
  T* part = stats + 4 * C;
  if (training || !running_mean)
    each_index(
        on, C * chunks, ROOTCLAD_BODY(long i) {
          const long c = i / chunks, k = i % chunks;
          const long b0 = B * k / chunks, b1 = B * (k + 1) / chunks;
          double sum = 0, m2 = 0;
          for (long b = b0; b < b1; ++b)
            for (long s = 0; s < S; ++s)
              sum += inp[(b * C + c) * S + s];
          const double mean = sum / ((b1 - b0) * S);
          for (long b = b0; b < b1; ++b)
            for (long s = 0; s < S; ++s) {
              const double d = inp[(b * C + c) * S + s] - mean;
              m2 += d * d;
            }
          part[3 * i] = T((b1 - b0) * S);
          part[3 * i + 1] = T(mean);
          part[3 * i + 2] = T(m2);
        });
  each_index(
      on, (long)C, ROOTCLAD_BODY(long c) {
        if (!training && running_mean) {
          stats[2 * c] = running_mean[c];
          stats[2 * c + 1] = T(1) / sqrt(running_var[c] + eps);
          return;
        }
        const T* pc = part + 3 * c * chunks;
        double n = 0, mean = 0;
        for (long k = 0; k < chunks; ++k) {
          n += pc[3 * k];
          mean += (double)pc[3 * k] * pc[3 * k + 1];
        }
        mean /= n;
        double var = 0;
        for (long k = 0; k < chunks; ++k) {
          const double d = pc[3 * k + 1] - mean;
          var += pc[3 * k + 2] + pc[3 * k] * d * d;
        }
        var /= n;
        if (training == 1 && running_mean) { // 2: the batch's, the running ones left alone
          running_mean[c] = (T(1) - momentum) * running_mean[c] + momentum * T(mean);
          const T unbiased = T(n > 1 ? var * n / (n - 1) : var);
          running_var[c] = (T(1) - momentum) * running_var[c] + momentum * unbiased;
          if (c == 0 && tracked)
            tracked[0] += T(1);
        }
        stats[2 * c] = T(mean);
        stats[2 * c + 1] = T(1) / sqrt(T(var) + eps);
      });
}

// out = (inp - mean) / std * weight + bias (weight, bias: null for 1 and 0)
template <class On, class T>
void batch_norm_apply(On on, T* out, const T* inp, const T* stats, const T* weight, const T* bias,
                      long B, int C, long S) {
  each_index(
      on, B * C * S, ROOTCLAD_BODY(long i) {
        const long c = i / S % C;
        const T y = (inp[i] - stats[2 * c]) * stats[2 * c + 1];
        out[i] = (weight ? weight[c] : T(1)) * y + (bias ? bias[c] : T(0));
      });
}

// per channel: sum d_out and sum d_out * x_hat into stats[2C + 2c, 2C + 2c + 1], which are
// d_bias and d_weight (added when not null); each chunk of the batch sums its part first
template <class On, class T>
void batch_norm_backward_reduce(On on, T* stats, T* d_weight, T* d_bias, const T* d_out,
                                const T* inp, long B, int C, long S) {
  const long chunks = bn_chunks(B);
  T* part = stats + 4 * C;
  each_index(
      on, C * chunks, ROOTCLAD_BODY(long i) {
        const long c = i / chunks, k = i % chunks;
        T sum_dy = 0, sum_dy_xhat = 0;
        for (long b = B * k / chunks; b < B * (k + 1) / chunks; ++b)
          for (long s = 0; s < S; ++s) {
            const long at = (b * C + c) * S + s;
            sum_dy += d_out[at];
            sum_dy_xhat += d_out[at] * (inp[at] - stats[2 * c]) * stats[2 * c + 1];
          }
        part[3 * i] = sum_dy;
        part[3 * i + 1] = sum_dy_xhat;
      });
  each_index(
      on, (long)C, ROOTCLAD_BODY(long c) {
        T sum_dy = 0, sum_dy_xhat = 0;
        for (long k = 0; k < chunks; ++k) {
          sum_dy += part[3 * (c * chunks + k)];
          sum_dy_xhat += part[3 * (c * chunks + k) + 1];
        }
        stats[2 * C + 2 * c] = sum_dy;
        stats[2 * C + 2 * c + 1] = sum_dy_xhat;
        if (d_bias)
          d_bias[c] += sum_dy;
        if (d_weight)
          d_weight[c] += sum_dy_xhat;
      });
}

// training: d_inp += w/std * (dy - mean(dy) - x_hat * mean(dy x_hat)), the means over the
// channel's B*S values (the statistics depend on the input); eval: d_inp += w/std * dy
template <class On, class T>
void batch_norm_backward_input(On on, T* d_inp, const T* d_out, const T* inp, const T* stats,
                               const T* weight, long B, int C, long S, int training) {
  const T n = T(B * S);
  each_index(
      on, B * C * S, ROOTCLAD_BODY(long i) {
        const long c = i / S % C;
        const T scale = (weight ? weight[c] : T(1)) * stats[2 * c + 1];
        T g = d_out[i];
        if (training) {
          const T xhat = (inp[i] - stats[2 * c]) * stats[2 * c + 1];
          g -= (stats[2 * C + 2 * c] + xhat * stats[2 * C + 2 * c + 1]) / n;
        }
        d_inp[i] += scale * g;
      });
}

// -- losses, the mean over the batch's elements (class-index losses: over its rows) -----------
// *loss += the mean loss (the caller zeroes it); d_z = scale * d loss / d z (written, not added).
// Elementwise losses are functors: loss(z, y) per element and its derivative grad(z, y).
struct BceWithLogits { // numerically stable: max(z, 0) - z y + log(1 + exp(-|z|))
  template <class T> ROOTCLAD_HD T loss(T z, T y) const {
    return (z > T(0) ? z : T(0)) - z * y + log1p(exp(-fabs(z)));
  }
  template <class T> ROOTCLAD_HD T grad(T z, T y) const { return T(1) / (T(1) + exp(-z)) - y; }
};

struct Mse {
  template <class T> ROOTCLAD_HD T loss(T z, T y) const { return (z - y) * (z - y); }
  template <class T> ROOTCLAD_HD T grad(T z, T y) const { return T(2) * (z - y); }
};

struct Huber { // torch's delta = 1: d^2 / 2 where |d| < 1, else |d| - 1/2
  template <class T> ROOTCLAD_HD T loss(T z, T y) const {
    const T d = fabs(z - y);
    return d < T(1) ? T(0.5) * d * d : d - T(0.5);
  }
  template <class T> ROOTCLAD_HD T grad(T z, T y) const {
    const T d = z - y;
    return d < T(-1) ? T(-1) : (d > T(1) ? T(1) : d);
  }
};

// *loss += the mean loss, d_z = its gradient x scale, in one launch. w: each sample's weight
// (its `per` elements share it: the mean of w[b] * loss element, as kernels.h's
// weighted_loss), or null (every weight 1).
template <class On, class T, class L>
void loss_and_gradient(On on, T* loss, T* d_z, const T* z, const T* y, const T* w, long per, long n,
                       T scale, L l) {
  each_index(
      on, n, ROOTCLAD_BODY(long i) {
        const T wi = w ? w[i / per] : T(1);
        add_to(loss, wi * l.loss(z[i], y[i]) / T(n));
        d_z[i] = scale * wi * l.grad(z[i], y[i]) / T(n);
      });
}

// Cross-entropy of logits z(R, C) with class indices y(R) (held as T), mean over rows.
template <class T> ROOTCLAD_HD inline T log_sum_exp(const T* z, int C, T& m) {
  m = z[0];
  for (int c = 1; c < C; ++c)
    m = z[c] > m ? z[c] : m;
  T e = 0;
  for (int c = 0; c < C; ++c)
    e += exp(z[c] - m);
  return m + log(e);
}

// w: each row's weight, or null (every weight 1)
template <class On, class T>
void cross_entropy_forward(On on, T* loss, const T* z, const T* y, const T* w, long R, int C) {
  each_index(
      on, R, ROOTCLAD_BODY(long r) {
        T m;
        const T wr = w ? w[r] : T(1);
        add_to(loss, wr * (log_sum_exp(z + r * C, C, m) - z[r * C + (long)y[r]]) / T(R));
      });
}

// d_z[r, c] = scale * w_r * (softmax(z_r)_c - [c == y_r]) / R
template <class On, class T>
void cross_entropy_backward(On on, T* d_z, const T* z, const T* y, const T* w, long R, int C,
                            T scale) {
  each_index(
      on, R * C, ROOTCLAD_BODY(long i) {
        const long r = i / C;
        T m;
        const T p = exp(z[i] - log_sum_exp(z + r * C, C, m));
        const T wr = w ? w[r] : T(1);
        d_z[i] = scale * wr * (p - ((long)(i % C) == (long)y[r] ? T(1) : T(0))) / T(R);
      });
}

// Negative log-likelihood of log-probabilities z(R, C) (after LogSoftmax), mean over rows.
template <class On, class T>
void nll_forward(On on, T* loss, const T* z, const T* y, const T* w, long R, int C) {
  each_index(
      on, R,
      ROOTCLAD_BODY(long r) { add_to(loss, -(w ? w[r] : T(1)) * z[r * C + (long)y[r]] / T(R)); });
}

template <class On, class T>
void nll_backward(On on, T* d_z, const T* y, const T* w, long R, int C, T scale) {
  each_index(
      on, R * C, ROOTCLAD_BODY(long i) {
        const long r = i / C;
        d_z[i] = (long)(i % C) == (long)y[r] ? -scale * (w ? w[r] : T(1)) / T(R) : T(0);
      });
}

// -- optimizers: SGD, Adam, AdamW as torch.optim's (optim_rule.h), over n parameters; m holds
// SGD's momentum buffer or Adam's first moment, v Adam's second moment (as on the CPU).
template <class On, class T>
void optim_step(On on, T* param, const T* grad, T* m, T* v, long n, const OptimConfig& c,
                long step) {
  const OptimStep<T> s(c, step);
  if (s.kind == OPTIM_SGD)
    each_index(on, n, ROOTCLAD_BODY(long i) { sgd_element(param[i], grad[i], m[i], s); });
  else if (s.kind == OPTIM_ADAMW)
    each_index(
        on, n, ROOTCLAD_BODY(long i) { adam_element<true>(param[i], grad[i], m[i], v[i], s); });
  else
    each_index(
        on, n, ROOTCLAD_BODY(long i) { adam_element<false>(param[i], grad[i], m[i], v[i], s); });
}

// The same step with its configuration and count in memory (on the GPU, device memory): a
// first launch forms the step's constants into `s` and advances *step by one, the second
// updates the parameters. Nothing of the step is then a launch argument, so a captured CUDA
// graph replays it step after step (DeviceModel.cuda_graphs).
template <class On, class T>
void optim_step_in_memory(On on, T* param, const T* grad, T* m, T* v, long n, const OptimConfig* c,
                          long* step, OptimStep<T>* s) {
  each_index(
      on, 1, ROOTCLAD_BODY(long) {
        *s = OptimStep<T>(*c, *step);
        *step += 1;
      });
  each_index(
      on, n, ROOTCLAD_BODY(long i) {
        if (s->kind == OPTIM_SGD)
          sgd_element(param[i], grad[i], m[i], *s);
        else if (s->kind == OPTIM_ADAMW)
          adam_element<true>(param[i], grad[i], m[i], v[i], *s);
        else
          adam_element<false>(param[i], grad[i], m[i], v[i], *s);
      });
}

} // namespace dev
} // namespace rootclad
